internal import CBlueZ
import Foundation
import PeerLink

#if canImport(Glibc)
import Glibc
#endif

/// The Bluetooth baseline: one plain RFCOMM (`SOCK_STREAM`) or L2CAP (`SOCK_SEQPACKET`) socket
/// pair between the same two adapters the sessions use, one thread per side, non-blocking with
/// `poll` (as PeerLink's links are). L2CAP is set up as PeerLink sets it up (Enhanced
/// Retransmission Mode, the kernel's default MTU) and sends packets of the outgoing MTU, as
/// PeerLink's link does.
struct RawBluetoothLink {
    let kind: BluetoothSocketKind
    /// The dialling end, on the `dialFrom` adapter.
    let dialer: Int32
    /// The accepted end, on the `listenOn` adapter.
    let acceptor: Int32
    /// L2CAP: the largest packet the dialler may send; nil for RFCOMM.
    let outgoingMTU: Int?
    /// L2CAP: whether the channel runs in Enhanced Retransmission Mode; nil for RFCOMM.
    let retransmissionMode: Bool?
    /// From `connect` called to the dialler's socket connected (paging, channel set-up).
    let connectTime: Duration

    /// No wait on a raw socket (connect, accept, a read or write that would block) lasts longer
    /// than this, in seconds: a stalled link fails the run instead of hanging it.
    static let callTimeout = 30

    /// Connects a socket on `dialFrom` to a listener on `listenOn` (channel / PSM picked by the kernel).
    static func connect(_ kind: BluetoothSocketKind, listenOn: BluetoothAddress, dialFrom: BluetoothAddress) throws -> RawBluetoothLink {
        let listener = try open(kind)
        defer { Glibc.close(listener) }
        try bind(listener, kind, listenOn, port: 0)
        if kind == .l2cap { try askForRetransmissionMode(listener) }
        guard listen(listener, 1) == 0 else { throw BenchError("raw \(kind): listen: \(errorText())") }
        let port = try localPort(listener, kind)
        let accepted = Thread.detachedResult { () -> Int32 in
            let fd = accept(listener, nil, nil)
            return fd >= 0 ? fd : -errno
        }
        let dialer = try open(kind)
        do {
            try bind(dialer, kind, dialFrom, port: 0)
            if kind == .l2cap { try askForRetransmissionMode(dialer) }
            let start = ContinuousClock.now
            let result = withAddress(kind, listenOn, port: port) { Glibc.connect(dialer, $0, $1) }
            guard result == 0 else {
                throw BenchError("raw \(kind): connect from \(dialFrom) to \(listenOn) \(kind.rawValue) \(port): \(errorText())")
            }
            let connectTime = ContinuousClock.now - start
            let acceptor = accepted.wait()
            guard acceptor >= 0 else { throw BenchError("raw \(kind): accept: \(String(cString: strerror(-acceptor)))") }
            try setNonBlocking(acceptor)
            try setNonBlocking(dialer)
            var outgoingMTU: Int?
            var retransmission: Bool?
            if kind == .l2cap {
                let options = try l2capOptions(dialer)
                outgoingMTU = Int(options.omtu)
                retransmission = options.mode == UInt8(L2CAP_MODE_ERTM)
            }
            return RawBluetoothLink(
                kind: kind, dialer: dialer, acceptor: acceptor, outgoingMTU: outgoingMTU, retransmissionMode: retransmission,
                connectTime: connectTime)
        } catch {
            Glibc.close(dialer)
            // the accepted socket, if any (a blocked accept returns after its receive timeout)
            let acceptor = accepted.wait()
            if acceptor >= 0 { Glibc.close(acceptor) }
            throw error
        }
    }

    func close() {
        Glibc.close(dialer)
        Glibc.close(acceptor)
    }

    /// The bytes sent: a pattern repeating every 65521 bytes (a prime, so no write or packet
    /// size lines up with it), so a lost, repeated or reordered piece shows as a mismatch at the
    /// receiver.
    static let pattern: [UInt8] = (0..<65521).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 8) }

    /// Seconds to move `total` bytes from the dialler to the acceptor (RFCOMM: 64 KiB writes;
    /// L2CAP: packets of the outgoing MTU). The receiver checks every byte against the pattern.
    func throughput(total: Int) throws -> Double {
        let acceptor = self.acceptor
        let start = ContinuousClock.now
        let reader = Thread.detachedResult { () -> Result<Int, BenchError> in
            var buffer = [UInt8](repeating: 0, count: 65536)
            var got = 0
            let pattern = Self.pattern
            while got < total {
                let n: Int
                do {
                    n = try buffer.withUnsafeMutableBytes { try Self.receive(acceptor, $0) }
                } catch {
                    return .failure(BenchError("raw receive after \(got) of \(total) bytes: \(error)"))
                }
                if n == 0 { return .failure(BenchError("raw link ended after \(got) of \(total) bytes")) }
                guard Self.matchesPattern(buffer, count: n, at: got, pattern) else {
                    return .failure(BenchError("raw link: the bytes from \(got) on differ from what was sent"))
                }
                got += n
            }
            return .success(got)
        }
        let piece = outgoingMTU ?? 65536
        var sent = 0
        var sendError: Error?
        while sent < total {
            let offset = sent % Self.pattern.count
            let n = min(piece, total - sent, Self.pattern.count - offset)
            do {
                // one L2CAP send is one packet: all of it or none
                try Self.pattern.withUnsafeBytes { try Self.sendAll(dialer, UnsafeRawBufferPointer(rebasing: $0[offset..<offset + n])) }
            } catch {
                sendError = BenchError("raw send after \(sent) of \(total) bytes: \(error)")
                break
            }
            sent += n
        }
        // (after a failed send, the reader gives up at its wait limit at the latest)
        switch (reader.wait(), sendError) {
        case (.success, nil): return seconds(ContinuousClock.now - start)
        case (.success, let sendError?): throw sendError
        case (.failure(let readError), nil): throw readError
        case (.failure(let readError), let sendError?): throw BenchError("\(sendError); \(readError)")
        }
    }

    /// Round trips of `size`-byte messages from the dialler, echoed by the acceptor.
    func roundTrips(size: Int, samples: Int) throws -> [Double] {
        let acceptor = self.acceptor
        let echo = Thread.detachedResult { () -> String? in
            var buffer = [UInt8](repeating: 0, count: size)
            do {
                for _ in 0..<samples {
                    try Self.receiveAll(acceptor, &buffer)
                    try buffer.withUnsafeBytes { try Self.sendAll(acceptor, $0) }
                }
            } catch {
                return "\(error)"
            }
            return nil
        }
        var buffer = [UInt8](repeating: 0x50, count: size)
        var times: [Double] = []
        do {
            for _ in 0..<samples {
                let start = ContinuousClock.now
                try buffer.withUnsafeBytes { try Self.sendAll(dialer, $0) }
                try Self.receiveAll(dialer, &buffer)
                times.append(seconds(ContinuousClock.now - start))
            }
        } catch {
            _ = echo.wait()
            throw BenchError("raw \(kind) round trip \(times.count + 1) of \(samples): \(error)")
        }
        if let failure = echo.wait() { throw BenchError("raw \(kind): the echo side failed: \(failure)") }
        return times
    }

    /// Whether the first `count` bytes of `buffer` are the pattern's from stream offset `offset` on.
    static func matchesPattern(_ buffer: [UInt8], count: Int, at offset: Int, _ pattern: [UInt8]) -> Bool {
        var done = 0
        while done < count {
            let start = (offset + done) % pattern.count
            let n = min(count - done, pattern.count - start)
            let same = buffer.withUnsafeBytes { received in
                pattern.withUnsafeBytes { expected in memcmp(received.baseAddress! + done, expected.baseAddress! + start, n) == 0 }
            }
            guard same else { return false }
            done += n
        }
        return true
    }

    // MARK: - Non-blocking transfers

    // The links' sockets are non-blocking, as PeerLink's are: on the lab's kernel (6.1) a
    // blocking RFCOMM write of 64 KiB stalls the link for good (the receiver never sees a
    // byte), and a non-blocking one does not. A call that would block polls, for at most `callTimeout`.

    /// Writes all of `bytes`.
    static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws {
        var offset = 0
        while offset < bytes.count {
            let n = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            if n > 0 {
                offset += n
            } else if n < 0, errno == EAGAIN || errno == EINTR {
                try wait(fd, for: Int16(POLLOUT))
            } else {
                throw BenchError("send: \(errorText())")
            }
        }
    }

    /// Reads what arrived (L2CAP: one packet), at most `buffer.count` bytes; 0 at the end.
    static func receive(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n >= 0 { return n }
            guard errno == EAGAIN || errno == EINTR else { throw BenchError("recv: \(errorText())") }
            try wait(fd, for: Int16(POLLIN))
        }
    }

    /// Reads exactly `bytes.count` bytes.
    static func receiveAll(_ fd: Int32, _ bytes: inout [UInt8]) throws {
        var offset = 0
        let count = bytes.count
        while offset < count {
            let n = try bytes.withUnsafeMutableBytes { try receive(fd, UnsafeMutableRawBufferPointer(rebasing: $0[offset...])) }
            guard n > 0 else { throw BenchError("the link ended") }
            offset += n
        }
    }

    private static func wait(_ fd: Int32, for events: Int16) throws {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        let ready = poll(&entry, 1, Int32(callTimeout * 1000))
        if ready == 0 { throw BenchError("nothing moved for \(callTimeout) s") }
        if ready < 0, errno != EINTR { throw BenchError("poll: \(errorText())") }
    }

    private static func setNonBlocking(_ fd: Int32) throws {
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else { throw BenchError("fcntl(O_NONBLOCK): \(errorText())") }
    }

    // MARK: - Socket calls

    private static func open(_ kind: BluetoothSocketKind) throws -> Int32 {
        let fd =
            kind == .rfcomm
            ? socket(AF_BLUETOOTH, Int32(SOCK_STREAM.rawValue), BTPROTO_RFCOMM)
            : socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue), BTPROTO_L2CAP)
        guard fd >= 0 else { throw BenchError("raw \(kind): socket: \(errorText())") }
        do {
            try setTimeouts(fd)
        } catch {
            Glibc.close(fd)
            throw error
        }
        return fd
    }

    /// Receive and send timeouts: Bluetooth sockets bound a blocking `accept` and `connect` by them.
    private static func setTimeouts(_ fd: Int32) throws {
        var limit = timeval(tv_sec: callTimeout, tv_usec: 0)
        for option in [SO_RCVTIMEO, SO_SNDTIMEO] {
            guard setsockopt(fd, SOL_SOCKET, option, &limit, socklen_t(MemoryLayout<timeval>.size)) == 0 else {
                throw BenchError("setsockopt(SO_RCVTIMEO/SO_SNDTIMEO): \(errorText())")
            }
        }
    }

    private static func bdaddr(_ address: BluetoothAddress) -> bdaddr_t {
        // the kernel holds the bytes least significant first
        let b = Array(address.bytes.reversed())
        return bdaddr_t(b: (b[0], b[1], b[2], b[3], b[4], b[5]))
    }

    private static func withAddress<R>(
        _ kind: BluetoothSocketKind, _ address: BluetoothAddress, port: UInt16, _ body: (UnsafePointer<sockaddr>, socklen_t) -> R
    ) -> R {
        switch kind {
        case .rfcomm:
            var rc = sockaddr_rc()
            rc.rc_family = sa_family_t(AF_BLUETOOTH)
            rc.rc_bdaddr = bdaddr(address)
            rc.rc_channel = UInt8(truncatingIfNeeded: port)
            return withUnsafePointer(to: &rc) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_rc>.size)) }
            }
        case .l2cap:
            var l2 = sockaddr_l2()
            l2.l2_family = sa_family_t(AF_BLUETOOTH)
            l2.l2_psm = port.littleEndian
            l2.l2_bdaddr = bdaddr(address)
            return withUnsafePointer(to: &l2) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_l2>.size)) }
            }
        }
    }

    private static func bind(_ fd: Int32, _ kind: BluetoothSocketKind, _ address: BluetoothAddress, port: UInt16) throws {
        guard withAddress(kind, address, port: port, { Glibc.bind(fd, $0, $1) }) == 0 else {
            throw BenchError("raw \(kind): bind to \(address): \(errorText()) (is the adapter up? 'hciconfig' lists them)")
        }
    }

    /// The channel (RFCOMM) or PSM (L2CAP) the kernel picked.
    private static func localPort(_ fd: Int32, _ kind: BluetoothSocketKind) throws -> UInt16 {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let result = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0 else { throw BenchError("raw \(kind): getsockname: \(errorText())") }
        return withUnsafePointer(to: &storage) { pointer in
            switch kind {
            case .rfcomm: pointer.withMemoryRebound(to: sockaddr_rc.self, capacity: 1) { UInt16($0.pointee.rc_channel) }
            case .l2cap: pointer.withMemoryRebound(to: sockaddr_l2.self, capacity: 1) { UInt16(littleEndian: $0.pointee.l2_psm) }
            }
        }
    }

    private static func l2capOptions(_ fd: Int32) throws -> l2cap_options {
        var options = l2cap_options()
        var length = socklen_t(MemoryLayout<l2cap_options>.size)
        guard getsockopt(fd, SOL_L2CAP, L2CAP_OPTIONS, &options, &length) == 0 else {
            throw BenchError("getsockopt(L2CAP_OPTIONS): \(errorText())")
        }
        return options
    }

    /// ERTM with the kernel's default MTU, as PeerLink asks (Basic mode where ERTM is off).
    private static func askForRetransmissionMode(_ fd: Int32) throws {
        var options = try l2capOptions(fd)
        options.mode = UInt8(L2CAP_MODE_ERTM)
        if setsockopt(fd, SOL_L2CAP, L2CAP_OPTIONS, &options, socklen_t(MemoryLayout<l2cap_options>.size)) == 0 { return }
        guard errno == EINVAL else { throw BenchError("setsockopt(L2CAP_OPTIONS): \(errorText())") }
        options.mode = UInt8(L2CAP_MODE_BASIC)
        guard setsockopt(fd, SOL_L2CAP, L2CAP_OPTIONS, &options, socklen_t(MemoryLayout<l2cap_options>.size)) == 0 else {
            throw BenchError("setsockopt(L2CAP_OPTIONS): \(errorText())")
        }
    }
}

/// The text of the current `errno`.
func errorText() -> String {
    let code = errno
    return "\(String(cString: strerror(code))) (errno \(code))"
}
