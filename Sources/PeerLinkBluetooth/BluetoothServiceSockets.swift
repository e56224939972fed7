internal import CBlueZ
#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore
import PeerLinkPosix

/// A listening RFCOMM channel and L2CAP PSM that accept connections and close them at once:
/// what an advertisement points at when no session serves it (as `peerlink advertise` does
/// with its TCP port), so a record never names a channel nobody listens on.
///
/// Channel or PSM 0 lets the kernel pick a free one (RFCOMM: the first free channel; L2CAP:
/// the first free dynamic PSM from 0x1001).
public final class BluetoothServiceSockets: @unchecked Sendable {
    public let channel: RFCOMMChannel
    public let psm: L2CAPPSM
    private let descriptors: [Int32]
    private let lock = NSLock()
    private var closed = false

    public init(adapter: BluetoothAddress = .any, channel: UInt8 = 0, psm: UInt16 = 0) throws(PeerLinkError) {
        do {
            let rfcomm = try BTSys.listenRFCOMM(adapter: adapter, channel: channel)
            let l2cap: (fd: Int32, psm: UInt16)
            do {
                l2cap = try BTSys.listenL2CAP(adapter: adapter, psm: psm)
            } catch {
                BTSys.close(rfcomm.fd)
                throw error
            }
            descriptors = [rfcomm.fd, l2cap.fd]
            self.channel = RFCOMMChannel(Int(rfcomm.channel)) ?? RFCOMMChannel(1)!
            self.psm = L2CAPPSM(Int(l2cap.psm)) ?? L2CAPPSM(Int(L2CAPPSM.firstDynamic))!
        } catch let error as SystemError {
            switch error.errno {
            case EADDRINUSE:
                throw PeerLinkError(.unavailable, "\(error.call): already in use by another program: choose another with --channel / --psm, or 0 for a free one")
            case EACCES, EPERM:
                throw PeerLinkError(.unavailable, "\(error.call) was not permitted: PSMs below 0x1001 need CAP_NET_BIND_SERVICE; use a PSM of 0x1001 or more")
            default:
                throw BluetoothErrors.map(error)
            }
        } catch {
            throw PeerLinkError(.unknown, "\(error)")
        }
        for fd in descriptors {
            let thread = Thread { [self] in self.acceptLoop(fd) }
            thread.name = "peerlink.bt-accept"
            thread.start()
        }
    }

    private let finished = DispatchSemaphore(value: 0)

    /// Accepts and closes connections; looks at `closed` at least every 200 ms.
    private func acceptLoop(_ fd: Int32) {
        while !lock.withLock({ closed }) {
            var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&entry, 1, 200) > 0 else { continue }
            let connection = accept(fd, nil, nil)
            if connection >= 0 { BTSys.close(connection) }
        }
        finished.signal()
    }

    /// Stops listening. Idempotent.
    public func close() {
        guard lock.withLock({ () -> Bool in defer { closed = true }; return !closed }) else { return }
        for _ in descriptors { finished.wait() }
        for fd in descriptors { BTSys.close(fd) }
    }

    deinit { close() }
}

extension BTSys {
    static func listenRFCOMM(adapter: BluetoothAddress, channel: UInt8) throws(SystemError) -> (fd: Int32, channel: UInt8) {
        let fd = socket(AF_BLUETOOTH, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_RFCOMM)
        guard fd >= 0 else { throw SystemError("socket(AF_BLUETOOTH, RFCOMM)", errno: errno) }
        var address = sockaddr_rc()
        address.rc_family = sa_family_t(AF_BLUETOOTH)
        address.rc_bdaddr = bdaddr(adapter)
        address.rc_channel = channel
        var length = socklen_t(MemoryLayout<sockaddr_rc>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else {
            let failure = SystemError("bind(RFCOMM channel \(channel))", errno: errno)
            close(fd)
            throw failure
        }
        guard listen(fd, 4) == 0 else {
            let failure = SystemError("listen(RFCOMM channel \(channel))", errno: errno)
            close(fd)
            throw failure
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return (fd, address.rc_channel)
    }

    static func listenL2CAP(adapter: BluetoothAddress, psm: UInt16) throws(SystemError) -> (fd: Int32, psm: UInt16) {
        let fd = socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_L2CAP)
        guard fd >= 0 else { throw SystemError("socket(AF_BLUETOOTH, L2CAP)", errno: errno) }
        var address = sockaddr_l2()
        address.l2_family = sa_family_t(AF_BLUETOOTH)
        address.l2_bdaddr = bdaddr(adapter)
        address.l2_psm = psm.littleEndian
        var length = socklen_t(MemoryLayout<sockaddr_l2>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else {
            let failure = SystemError("bind(L2CAP PSM \(psm))", errno: errno)
            close(fd)
            throw failure
        }
        guard listen(fd, 4) == 0 else {
            let failure = SystemError("listen(L2CAP PSM \(psm))", errno: errno)
            close(fd)
            throw failure
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return (fd, UInt16(littleEndian: address.l2_psm))
    }
}
