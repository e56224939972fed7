// PeerLink: peer-to-peer sessions for Linux over the LAN (DNS-SD through avahi-daemon, TCP) and
// Bluetooth Classic (BlueZ). This module is the public façade; it re-exports the building blocks.
@_exported import PeerLinkBluetooth
@_exported import PeerLinkCore
@_exported import PeerLinkFiles
@_exported import PeerLinkLAN
@_exported import PeerLinkPosix
@_exported import PeerLinkSession
