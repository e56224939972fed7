// What Swift needs from libbluetooth, plus shims for macros and compound literals.
#ifndef PEERLINK_CBLUEZ_SHIM_H
#define PEERLINK_CBLUEZ_SHIM_H

#include <sys/ioctl.h>
#include <sys/socket.h>
#include <bluetooth/bluetooth.h>
#include <bluetooth/hci.h>
#include <bluetooth/hci_lib.h>
#include <bluetooth/l2cap.h>
#include <bluetooth/rfcomm.h>

/// BDADDR_ANY is a compound literal macro.
static inline bdaddr_t peerlink_bdaddr_any(void) {
    bdaddr_t a = {{0, 0, 0, 0, 0, 0}};
    return a;
}

/// HCI ioctl request numbers are _IOR/_IOW macros.
static inline unsigned long peerlink_hcigetdevlist(void) { return HCIGETDEVLIST; }
static inline unsigned long peerlink_hcigetdevinfo(void) { return HCIGETDEVINFO; }

/// hci_test_bit is a static inline with a non-const pointer in some header versions.
static inline int peerlink_hci_flag(uint32_t flags, int bit) { return (flags >> bit) & 1; }

#endif
