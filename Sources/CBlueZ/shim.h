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

/// The number of connections (ACL, SCO, eSCO, LE) controller `dev_id` holds, through the
/// HCIGETCONNLIST ioctl on an HCI control socket (no privilege needed); -1 with errno set.
/// At most 16 are counted: enough to know whether there is one.
static inline int peerlink_hci_connection_count(int ctl, int dev_id) {
    struct {
        struct hci_conn_list_req request;
        struct hci_conn_info connections[16];
    } list;
    list.request.dev_id = (uint16_t)dev_id;
    list.request.conn_num = 16;
    if (ioctl(ctl, HCIGETCONNLIST, &list) < 0) return -1;
    return list.request.conn_num;
}

/// hci_test_bit is a static inline with a non-const pointer in some header versions.
static inline int peerlink_hci_flag(uint32_t flags, int bit) { return (flags >> bit) & 1; }

#endif
