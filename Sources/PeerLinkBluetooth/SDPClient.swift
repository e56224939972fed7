internal import CBlueZ
#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// Asks a remote device's SDP server (L2CAP PSM 1) for its PeerLink records. Needs no
/// privilege and no bluetoothd: an L2CAP client socket is open to every user.
enum SDPClient {
    /// The PeerLink records of `serviceType` the device at `address` publishes, through the
    /// local adapter at `local` (``BluetoothAddress/any`` lets the kernel choose).
    static func peerLinkRecords(
        at address: BluetoothAddress, from local: BluetoothAddress = .any, serviceType: ServiceType, timeout: Duration = .seconds(10)
    ) throws(PeerLinkError) -> [PeerLinkServiceRecord] {
        let records = try search(at: address, from: local, pattern: [serviceType.bluetoothServiceClass], timeout: timeout)
        return records.compactMap { try? PeerLinkServiceRecord(serviceType: serviceType, attributes: $0) }
    }

    /// Every record matching `pattern`, as attribute maps.
    static func search(
        at address: BluetoothAddress, from local: BluetoothAddress, pattern: [BluetoothUUID], timeout: Duration
    ) throws(PeerLinkError) -> [[UInt16: SDPElement]] {
        let deadline = ContinuousClock.now + timeout
        try BluetoothErrors.requireAdapterUp(local)
        let fd: Int32
        do {
            fd = try BTSys.l2capConnect(to: address, psm: 1, from: local, deadline: deadline)
        } catch {
            throw SDPClient.map(error, address: address)
        }
        defer { BTSys.close(fd) }
        var search = SDPServiceSearch(pattern: pattern)
        do {
            while true {
                try BTSys.sendPacket(fd, search.nextRequest())
                let response = try BTSys.receivePacket(fd, deadline: deadline)
                switch try search.receive(response) {
                case .continuing: continue
                case .finished(let records): return records
                }
            }
        } catch let error as SystemError {
            throw SDPClient.map(error, address: address)
        } catch let error as SDPServiceSearch.Failure {
            throw PeerLinkError(.unknown, "SDP search of \(address) failed: \(error)")
        } catch {
            throw PeerLinkError(.unknown, "SDP search of \(address) failed: \(error)")
        }
    }

    static func map(_ error: SystemError, address: BluetoothAddress) -> PeerLinkError {
        switch error.errno {
        case ETIMEDOUT:
            return PeerLinkError(.timedOut, "\(address) did not answer an SDP search in time: it is out of range, off, or not connectable")
        case EHOSTDOWN, EHOSTUNREACH:
            return PeerLinkError(.unavailable, "\(address) cannot be reached (\(error.call): host down): it is out of range, off, or not connectable")
        case ECONNREFUSED:
            return PeerLinkError(.unavailable, "\(address) refused the SDP connection: its Bluetooth stack runs no SDP server")
        case ENETDOWN:
            return PeerLinkError(.unavailable, "the local Bluetooth adapter is down (\(error.call)): power it on with 'bluetoothctl power on' or 'sudo hciconfig hci0 up'")
        default:
            return BluetoothErrors.map(error)
        }
    }
}

extension BTSys {
    /// A connected L2CAP SEQPACKET socket to `psm` on `address`, bound to the local adapter
    /// `local`; the connect gives up at `deadline`.
    static func l2capConnect(to address: BluetoothAddress, psm: UInt16, from local: BluetoothAddress, deadline: ContinuousClock.Instant) throws(SystemError) -> Int32 {
        let fd = socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), BTPROTO_L2CAP)
        guard fd >= 0 else { throw SystemError("socket(AF_BLUETOOTH, L2CAP)", errno: errno) }
        var ok = false
        defer { if !ok { close(fd) } }
        var bound = sockaddr_l2()
        bound.l2_family = sa_family_t(AF_BLUETOOTH)
        bound.l2_bdaddr = bdaddr(local)
        let bindResult = withUnsafePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_l2>.size)) }
        }
        guard bindResult == 0 else { throw SystemError("bind(L2CAP \(local))", errno: errno) }
        var remote = sockaddr_l2()
        remote.l2_family = sa_family_t(AF_BLUETOOTH)
        remote.l2_psm = psm.littleEndian
        remote.l2_bdaddr = bdaddr(address)
        let connectResult = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_l2>.size)) }
        }
        if connectResult != 0 {
            guard errno == EINPROGRESS || errno == EAGAIN else { throw SystemError("connect(L2CAP \(address) psm \(psm))", errno: errno) }
            try waitFor(fd, events: Int16(POLLOUT), deadline: deadline, call: "connect(L2CAP \(address) psm \(psm))")
            var failure: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &length)
            guard failure == 0 else { throw SystemError("connect(L2CAP \(address) psm \(psm))", errno: failure) }
        }
        ok = true
        return fd
    }

    static func bdaddr(_ address: BluetoothAddress) -> bdaddr_t {
        let b = Array(address.bytes.reversed())
        return bdaddr_t(b: (b[0], b[1], b[2], b[3], b[4], b[5]))
    }

    /// Waits until `fd` is ready for `events`, or throws ETIMEDOUT at `deadline`.
    static func waitFor(_ fd: Int32, events: Int16, deadline: ContinuousClock.Instant, call: String) throws(SystemError) {
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { throw SystemError(call, errno: ETIMEDOUT) }
            var entry = pollfd(fd: fd, events: events, revents: 0)
            let milliseconds = Int32(clamping: left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1)
            let ready = poll(&entry, 1, milliseconds)
            if ready < 0 {
                if errno == EINTR { continue }
                throw SystemError("poll", errno: errno)
            }
            if ready > 0 { return }
        }
    }

    static func sendPacket(_ fd: Int32, _ bytes: [UInt8]) throws(SystemError) {
        while true {
            let sent = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent >= 0 { return }
            if errno == EINTR { continue }
            throw SystemError("send(L2CAP)", errno: errno)
        }
    }

    static func receivePacket(_ fd: Int32, deadline: ContinuousClock.Instant) throws(SystemError) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            try waitFor(fd, events: Int16(POLLIN), deadline: deadline, call: "recv(L2CAP)")
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count >= 0 { return Array(buffer.prefix(count)) }
            if errno == EINTR || errno == EAGAIN { continue }
            throw SystemError("recv(L2CAP)", errno: errno)
        }
    }
}
