#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// Socket errors of RFCOMM and L2CAP links become ``PeerLinkError``s here, once, with messages
/// that say what to do.
extension BluetoothErrors {
    static func dial(
        _ error: any Error, endpoint: Endpoint, kind: BluetoothSocketKind, port: UInt16, adapter: BluetoothAddress,
        timeout: Duration
    ) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "the dial to \(endpoint)") }
        let address = endpoint.bluetoothAddress.map(\.description) ?? "the device"
        switch error.errno {
        case ECONNREFUSED:
            return .nothingListens(
                "nothing listens on \(kind.rawValue.uppercased()) \(kind.portName) \(kind.portDescription(port)) at \(address), or it did not accept the link's pairing: is the peer running, and on that \(kind.portName)? If a pairing prompt appeared on it, accept it")
        case ETIMEDOUT:
            return PeerLinkError(
                .timedOut,
                "\(endpoint) did not answer within \(DurationText.seconds(timeout)): the device is out of range, off, or not connectable")
        case EHOSTDOWN, EHOSTUNREACH:
            return PeerLinkError(
                .unavailable,
                "\(address) is not in range or not connectable (\(strerror(error))): bring it closer, switch its Bluetooth on and make it connectable (bluetoothctl: power on, pairable on)")
        case EACCES, EPERM:
            return PeerLinkError(
                .unavailable, "pairing with \(address) for \(endpoint) failed or was declined (\(strerror(error))): if a pairing prompt appeared on either machine, accept it (PeerLink pairs without keeping a bond); if this machine keeps an old bond with it, remove it (bluetoothctl remove \(address))")
        case ECONNRESET, ECONNABORTED:
            return PeerLinkError(
                .unavailable, "\(address) dropped the link to \(endpoint) while it was set up: try again, or check the device accepts links")
        default:
            return common(error, adapter: adapter) ?? PeerLinkError(.unknown, "the dial to \(endpoint) failed: \(error)")
        }
    }

    static func link(_ error: any Error, remote: String) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "the link to \(remote)") }
        switch error.errno {
        case EBADF:
            return PeerLinkError(.notConnected, "the link to \(remote) was closed on this side")
        case ECONNRESET, EPIPE, ENOTCONN:
            return PeerLinkError(.notConnected, "the peer at \(remote) closed or reset the link: it stopped, or moved out of range")
        case ECONNABORTED:
            return PeerLinkError(
                .notConnected,
                "the link to \(remote) was cut on this side: the local adapter went down or was reset (bring it back with 'bluetoothctl power on' or 'rfkill unblock bluetooth')")
        case ETIMEDOUT, EHOSTDOWN, EHOSTUNREACH:
            return PeerLinkError(
                .timedOut, "the peer at \(remote) stopped answering (\(strerror(error))): it moved out of range or its adapter went down")
        case ENODEV, ENETDOWN:
            return PeerLinkError(
                .notConnected, "the adapter of the link to \(remote) went down: bring it back with 'bluetoothctl power on' or 'rfkill unblock bluetooth'")
        case EMSGSIZE:
            return PeerLinkError(.unknown, "a packet for \(remote) was larger than the link's MTU: this is a bug in PeerLink, please report it")
        default:
            return PeerLinkError(.unknown, "the link to \(remote) failed: \(error)")
        }
    }

    static func listen(_ error: SystemError, kind: BluetoothSocketKind, adapter: BluetoothAddress, port: UInt16) -> PeerLinkError {
        let what = "\(kind.rawValue.uppercased()) \(kind.portName) \(kind.portDescription(port))"
        let place = adapter == .any ? "on any adapter" : "on \(adapterName(adapter))"
        switch error.errno {
        case EADDRINUSE, EBUSY:
            return PeerLinkError(
                .unavailable, "\(what) \(place) is already taken by another program: choose another \(kind.portName), or 0 for a free one")
        case EACCES, EPERM:
            return PeerLinkError(
                .unavailable,
                "\(what) is reserved: a PSM below 0x1001 needs CAP_NET_BIND_SERVICE; use a dynamic PSM (0x1001 and up, odd), or 0 for a free one")
        case EINVAL where kind == .rfcomm && port > 30:
            return PeerLinkError(.invalidParameter, "RFCOMM channel \(port) does not exist: channels are 1 to 30, or 0 for a free one")
        case EINVAL where kind == .l2cap:
            return PeerLinkError(
                .invalidParameter, "PSM \(kind.portDescription(port)) is not valid: a PSM is odd in its low byte and even in its high byte, such as 0x1001")
        case EADDRNOTAVAIL:
            return PeerLinkError(
                .invalidParameter, "\(adapter) is not the address of an adapter of this machine: list them with 'peerlink radios'")
        default:
            return common(error, adapter: adapter) ?? PeerLinkError(.unknown, "listening on \(what) \(place) failed: \(error)")
        }
    }

    static func accept(_ error: any Error, kind: BluetoothSocketKind, port: UInt16) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "accepting on \(kind.rawValue) \(kind.portDescription(port))") }
        switch error.errno {
        case EBADF, EINVAL:
            return PeerLinkError(.notConnected, "the \(kind.rawValue.uppercased()) listener on \(kind.portName) \(kind.portDescription(port)) is closed")
        default:
            return common(error, adapter: .any)
                ?? PeerLinkError(.unknown, "accepting a link on \(kind.rawValue) \(kind.portDescription(port)) failed: \(error)")
        }
    }

    /// Failures that mean the same whatever the call: no Bluetooth, adapter down, no descriptors.
    static func common(_ error: SystemError, adapter: BluetoothAddress) -> PeerLinkError? {
        switch error.errno {
        case EAFNOSUPPORT:
            return PeerLinkError(
                .unsupported,
                "this kernel has no Bluetooth (\(error.call): address family not supported): load the bluetooth module ('sudo modprobe bluetooth') or use a kernel built with Bluetooth")
        case EPROTONOSUPPORT:
            return PeerLinkError(
                .unsupported,
                "this kernel's Bluetooth lacks the protocol (\(error.call)): load it with 'sudo modprobe rfcomm' (RFCOMM) or 'sudo modprobe l2cap' where it is a module")
        case ENODEV, ENETDOWN:
            return PeerLinkError(
                .unavailable,
                "adapter \(adapterName(adapter)) is down: switch it on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth' if it is blocked)")
        case EMFILE, ENFILE:
            return PeerLinkError(
                .unavailable, "this process has too many open files: close links it no longer needs, or raise the limit (ulimit -n)")
        default:
            return nil
        }
    }

    /// Throws when `address` is not `any` and no adapter of this machine has it (the kernel
    /// binds to any address without complaint, and then nothing ever arrives).
    static func requireLocalAdapter(_ address: BluetoothAddress) throws(PeerLinkError) {
        guard address != .any else { return }
        _ = try localAdapter(address)
    }

    /// Throws unless the adapter with `address` (with `any`: some adapter) is up: a link or an
    /// SDP search from a powered-off adapter fails anyway, after a socket made and closed for
    /// nothing; this says why at once.
    static func requireAdapterUp(_ address: BluetoothAddress) throws(PeerLinkError) {
        if address == .any {
            let adapters = try BluetoothAdapter.brief()
            guard !adapters.isEmpty else {
                throw PeerLinkError(
                    .unavailable, "this machine has no Bluetooth adapter: plug one in, or check 'peerlink radios' and 'rfkill list'")
            }
            guard adapters.contains(where: \.isUp) else {
                throw PeerLinkError(
                    .unavailable,
                    "every Bluetooth adapter of this machine is down (\(adapters.map(\.name).joined(separator: ", "))): switch one on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth' if it is blocked)")
            }
            return
        }
        let adapter = try localAdapter(address)
        guard adapter.isUp else {
            throw PeerLinkError(
                .unavailable,
                "adapter \(adapter.name) (\(address)) is down: switch it on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth' if it is blocked)")
        }
    }

    /// The adapter with `address`, or an error listing those this machine has.
    private static func localAdapter(_ address: BluetoothAddress) throws(PeerLinkError) -> (name: String, isUp: Bool) {
        let adapters = try BluetoothAdapter.brief()
        guard let adapter = adapters.first(where: { $0.address == address }) else {
            let known = adapters.map { "\($0.name) \($0.address.map(\.description) ?? "?")" }.joined(separator: ", ")
            throw PeerLinkError(
                .invalidParameter,
                "\(address) is not the address of a Bluetooth adapter of this machine (it has \(known.isEmpty ? "none" : known)): list them with 'peerlink radios'")
        }
        return (adapter.name, adapter.isUp)
    }

    /// `hci0 (00:AA:01:00:00:00)` when the adapter is known, else its address or "the adapter".
    static func adapterName(_ address: BluetoothAddress) -> String {
        if address == .any {
            let up = (try? BluetoothAdapter.all())?.first
            return up.map { "\($0.name) (\($0.address))" } ?? "(none found)"
        }
        if let adapter = (try? BluetoothAdapter.all())?.first(where: { BluetoothAddress($0.address) == address }) {
            return "\(adapter.name) (\(adapter.address))"
        }
        return address.description
    }

    private static func other(_ error: any Error, _ what: String) -> PeerLinkError {
        if let error = error as? PeerLinkError { return error }
        if error is CancellationError { return PeerLinkError(.cancelled, "\(what) was cancelled") }
        return PeerLinkError(.unknown, "\(what) failed: \(error)")
    }

    private static func strerror(_ error: SystemError) -> String {
        String(cString: Glibc.strerror(error.errno))
    }
}
