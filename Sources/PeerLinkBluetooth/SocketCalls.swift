internal import CBlueZ
#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// The two Bluetooth Classic sockets PeerLink links run on.
public enum BluetoothSocketKind: String, Sendable, Hashable, CaseIterable {
    /// RFCOMM, `SOCK_STREAM`: an ordered, reliable byte stream on a channel 1–30.
    case rfcomm
    /// L2CAP, `SOCK_SEQPACKET`: ordered, reliable packets of at most the negotiated MTU, on a PSM.
    case l2cap

    /// How people name the port: `channel` or `PSM`.
    var portName: String { self == .rfcomm ? "channel" : "PSM" }

    /// The port as people write it: `5` or `0x1001`.
    func portDescription(_ port: UInt16) -> String {
        switch self {
        case .rfcomm: return String(port)
        case .l2cap: return L2CAPPSM(Int(port))?.description ?? String(port)
        }
    }

    /// The endpoint of `address` at `port`, when the port is a valid channel / PSM.
    func endpoint(_ address: BluetoothAddress, port: UInt16) -> Endpoint? {
        switch self {
        case .rfcomm: return RFCOMMChannel(Int(port)).map { Endpoint.rfcomm(address: address, channel: $0) }
        case .l2cap: return L2CAPPSM(Int(port)).map { Endpoint.l2cap(address: address, psm: $0) }
        }
    }
}

extension BluetoothAddress {
    /// The kernel's `bdaddr_t` holds the bytes least significant first.
    var bdaddr: bdaddr_t {
        let b = Array(bytes.reversed())
        return bdaddr_t(b: (b[0], b[1], b[2], b[3], b[4], b[5]))
    }

    init(_ address: bdaddr_t) {
        let written = withUnsafeBytes(of: address) { Array($0.reversed()) }
        self.init(bytes: written)!
    }
}

/// The socket calls of RFCOMM and L2CAP links (on top of PeerLinkPosix's `Sys`), each with its
/// `sockaddr_rc` / `sockaddr_l2` handling in one place.
enum BTSocket {
    /// The size of `sockaddr_rc` (family, bdaddr, channel: 2 + 6 + 1, padded to 10).
    static let rfcommAddressSize = MemoryLayout<sockaddr_rc>.size
    /// The size of `sockaddr_l2` (family, PSM, bdaddr, CID, address type: 2 + 2 + 6 + 2 + 1, padded to 14).
    static let l2capAddressSize = MemoryLayout<sockaddr_l2>.size

    /// A new socket of `kind` (close-on-exec), asking for security level *low*.
    ///
    /// Level low means an unauthenticated link key and no bonding: with Secure Simple Pairing
    /// the kernel pairs each new ACL link "Just Works" without an agent or a prompt (when both
    /// machines' agents can display and confirm, the agent of the machine being connected to
    /// asks its user to allow it), encrypts the link as SSP requires, and forgets the key when
    /// the link goes — no bond is stored. PeerLink authenticates and
    /// encrypts every link itself (Noise), so asking Bluetooth for more (medium: a bond; high:
    /// MITM protection, i.e. a PIN or a confirmation by the user) would only add prompts. It is
    /// also the kernel's default; it is set here so the choice is written down.
    static func open(_ kind: BluetoothSocketKind) throws(SystemError) -> Int32 {
        let fd: Int32
        switch kind {
        case .rfcomm: fd = try Sys.socket(AF_BLUETOOTH, Int32(SOCK_STREAM.rawValue), BTPROTO_RFCOMM)
        case .l2cap: fd = try Sys.socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue), BTPROTO_L2CAP)
        }
        var security = bt_security(level: UInt8(BT_SECURITY_LOW), key_size: 0)
        do {
            _ = try Sys.retrying("setsockopt(BT_SECURITY)") {
                setsockopt(fd, SOL_BLUETOOTH, BT_SECURITY, &security, socklen_t(MemoryLayout<bt_security>.size))
            }
        } catch {
            Sys.close(fd)
            throw error
        }
        return fd
    }

    /// Runs `body` with the socket address of `address` and `port` (channel or PSM).
    static func withAddress<R>(
        _ kind: BluetoothSocketKind, _ address: BluetoothAddress, port: UInt16,
        _ body: (UnsafePointer<sockaddr>, socklen_t) throws(SystemError) -> R
    ) throws(SystemError) -> R {
        switch kind {
        case .rfcomm:
            var rc = sockaddr_rc()
            rc.rc_family = sa_family_t(AF_BLUETOOTH)
            rc.rc_bdaddr = address.bdaddr
            rc.rc_channel = UInt8(truncatingIfNeeded: port)
            return try withUnsafePointer(to: &rc) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(SystemError) in
                    try body(address, socklen_t(rfcommAddressSize))
                }
            }
        case .l2cap:
            var l2 = sockaddr_l2()
            l2.l2_family = sa_family_t(AF_BLUETOOTH)
            l2.l2_psm = port.littleEndian
            l2.l2_bdaddr = address.bdaddr
            return try withUnsafePointer(to: &l2) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(SystemError) in
                    try body(address, socklen_t(l2capAddressSize))
                }
            }
        }
    }

    static func bind(_ fd: Int32, _ kind: BluetoothSocketKind, _ address: BluetoothAddress, port: UInt16) throws(SystemError) {
        try withAddress(kind, address, port: port) { pointer, length throws(SystemError) in
            try Sys.bind(fd, pointer, length)
        }
    }

    /// The local (`getsockname`) or remote (`getpeername`) address and channel / PSM.
    static func name(_ fd: Int32, _ kind: BluetoothSocketKind, peer: Bool) throws(SystemError) -> (BluetoothAddress, UInt16) {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        try withUnsafeMutablePointer(to: &storage) { pointer throws(SystemError) in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(SystemError) in
                if peer { try Sys.getpeername(fd, address, &length) } else { try Sys.getsockname(fd, address, &length) }
            }
        }
        return withUnsafePointer(to: &storage) { pointer in
            switch kind {
            case .rfcomm:
                return pointer.withMemoryRebound(to: sockaddr_rc.self, capacity: 1) {
                    (BluetoothAddress($0.pointee.rc_bdaddr), UInt16($0.pointee.rc_channel))
                }
            case .l2cap:
                return pointer.withMemoryRebound(to: sockaddr_l2.self, capacity: 1) {
                    (BluetoothAddress($0.pointee.l2_bdaddr), UInt16(littleEndian: $0.pointee.l2_psm))
                }
            }
        }
    }

    static func l2capOptions(_ fd: Int32) throws(SystemError) -> l2cap_options {
        var options = l2cap_options()
        var length = socklen_t(MemoryLayout<l2cap_options>.size)
        _ = try Sys.retrying("getsockopt(L2CAP_OPTIONS)") { getsockopt(fd, SOL_L2CAP, L2CAP_OPTIONS, &options, &length) }
        return options
    }

    /// Prepares an L2CAP socket before it connects or listens: Enhanced Retransmission Mode,
    /// and `incomingMTU` (nil: the kernel's default) as the largest packet this side accepts.
    ///
    /// Basic mode, the kernel's default, has no flow control of its own: a receiver whose
    /// socket buffer is full drops the packets that keep arriving, and a link carrying
    /// encrypted records then fails. ERTM retransmits and holds the sender back instead. A peer
    /// without ERTM gets Basic mode in the channel's negotiation; a kernel that has ERTM
    /// switched off (`disable_ertm`) keeps Basic mode here.
    static func prepareL2CAP(_ fd: Int32, incomingMTU: UInt16?) throws(SystemError) {
        var options = try l2capOptions(fd)
        if let incomingMTU { options.imtu = incomingMTU }
        options.mode = UInt8(L2CAP_MODE_ERTM)
        do throws(SystemError) {
            try setL2CAPOptions(fd, options)
        } catch where error.errno == EINVAL {
            options.mode = UInt8(L2CAP_MODE_BASIC)
            try setL2CAPOptions(fd, options)
        }
    }

    private static func setL2CAPOptions(_ fd: Int32, _ options: l2cap_options) throws(SystemError) {
        var options = options
        _ = try Sys.retrying("setsockopt(L2CAP_OPTIONS)") {
            setsockopt(fd, SOL_L2CAP, L2CAP_OPTIONS, &options, socklen_t(MemoryLayout<l2cap_options>.size))
        }
    }

    /// The MTUs of a connected L2CAP socket: what it may send (the peer's incoming MTU) and
    /// what it accepts; and whether the channel runs in Enhanced Retransmission Mode.
    static func channelOptions(_ fd: Int32) throws(SystemError) -> (outgoing: Int, incoming: Int, retransmission: Bool) {
        let options = try l2capOptions(fd)
        return (Int(options.omtu), Int(options.imtu), options.mode == UInt8(L2CAP_MODE_ERTM))
    }

}
