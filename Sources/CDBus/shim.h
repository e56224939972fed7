// What Swift needs from libdbus-1, the reference D-Bus client library. Its type codes are macros
// with casts (`((int) 's')`), which Swift does not import: PeerLinkBluetooth spells them itself.
#ifndef PEERLINK_CDBUS_SHIM_H
#define PEERLINK_CDBUS_SHIM_H

#include <dbus/dbus.h>

#endif
