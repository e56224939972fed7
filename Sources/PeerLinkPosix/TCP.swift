#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore

/// A listening TCP socket: on all interfaces (IPv6 dual-stack when the kernel has IPv6, else
/// IPv4), or on one numeric address.
///
/// Accepting never gives up for lack of descriptors or memory, and keeps descriptors in reserve
/// (see ``AcceptGuard``). The first listener of a process raises its soft descriptor limit to
/// the hard one (``DescriptorLimit/raiseSoftLimit()``).
public final class TCPListener: Sendable {
    public let port: UInt16
    /// The address listened on: `::` or `0.0.0.0` for all interfaces, else the one given.
    public let host: String
    private let descriptor: Descriptor
    private let acceptGuard: AcceptGuard

    /// Listens on `port` (0: a port the kernel picks), on `host` (a numeric address such as
    /// `127.0.0.1` or `::1`; nil: all interfaces), keeping to `limits`' descriptor reserve and
    /// accept back-off.
    public convenience init(host: String? = nil, port: UInt16 = 0, limits: ResourceLimits = .default) throws(SystemError) {
        _ = DescriptorLimit.raisedOnce
        try self.init(host: host, port: port, acceptGuard: AcceptGuard(limits: limits))
    }

    package init(host: String?, port: UInt16, acceptGuard: AcceptGuard) throws(SystemError) {
        self.acceptGuard = acceptGuard
        var socket: Int32
        var address: IPSocketAddress
        if let host {
            guard let parsed = IPSocketAddress(host: host, port: port) else {
                throw SystemError("inet_pton", errno: EINVAL)
            }
            address = parsed
            socket = try Sys.socket(address.family == .ipv4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
        } else {
            do {
                socket = try Sys.socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
                try? Sys.setOption(socket, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 0)
                address = IPSocketAddress(host: "::", port: port)!
            } catch {
                socket = try Sys.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                address = IPSocketAddress(host: "0.0.0.0", port: port)!
            }
        }
        do {
            try Sys.setOption(socket, SOL_SOCKET, SO_REUSEADDR, 1)
            try address.withSockAddr { pointer, length throws(SystemError) in try Sys.bind(socket, pointer, length) }
            try Sys.listen(socket, 64)
            // Non-blocking, so a waiting accept can notice cancellation and close.
            try Sys.setNonBlocking(socket, true)
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            try withUnsafeMutablePointer(to: &storage) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socket_ throws(SystemError) in
                    try Sys.getsockname(socket, socket_, &length)
                }
            }
            self.port = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { IPSocketAddress($0).port }
            }
        } catch {
            Sys.close(socket)
            throw error
        }
        self.host = address.host
        self.descriptor = Descriptor(socket)
    }

    /// Waits for the next connection: tried at once, and while none is pending, parked on
    /// ``Readiness``'s thread (no thread of its own, no polling). Throws once the listener is
    /// closed, and `CancellationError` when the task is cancelled. A lack of descriptors or
    /// memory is waited out, never thrown (see ``AcceptGuard``).
    public func accept() async throws -> TCPConnection {
        while true {
            try Task.checkCancellation()
            let fd = try descriptor.acquire("accept")
            defer { descriptor.release() }
            let step = try acceptGuard.step(listening: fd) { fd throws(SystemError) in
                try Sys.wouldBlockAsNil { () throws(SystemError) in try Sys.accept(fd) }
            }
            switch step {
            case .accepted(let accepted):
                return TCPConnection(fd: accepted)
            case .again:
                continue
            case .pause(let pause):
                try await Task.sleep(for: pause)
            case nil:
                // Nothing pending: until a connection comes (or close() shuts the socket down).
                try await Readiness.shared.wait(for: fd, events: Int16(POLLIN))
            }
        }
    }

    /// Counts of what the accept path shed and waited out (see ``AcceptGuard``).
    package var acceptStatistics: AcceptGuard.Counts { acceptGuard.statistics }

    /// Connections closed at once: to keep descriptors in reserve, or while the process had none.
    public var shedConnections: Int {
        let counts = acceptGuard.statistics
        return counts.shedForReserve + counts.shedWhileExhausted
    }

    /// Stops listening; a pending ``accept()`` throws.
    public func close() { descriptor.close() }
}

/// How long a blocking call waits before it looks for cancellation again, in milliseconds.
package let pollSlice: Int32 = 100

/// Sleeps the calling (blocking) thread for `duration`, in slices, giving up once
/// `cancellation` is set.
func sleep(_ duration: Duration, cancellation: CancellationFlag) throws(CancellationError) {
    var left = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
    while left > 0 {
        try cancellation.check()
        let slice = Int32(min(left, Int64(pollSlice)))
        Sys.sleep(milliseconds: slice)
        left -= Int64(slice)
    }
}

/// A connected TCP socket (`TCP_NODELAY` on).
///
/// ``read(maxCount:)`` and ``write(_:)`` never block a thread: each tries the call at once and
/// parks on the process's I/O thread (``Readiness``) only when it would block. At most one read
/// and one write at a time.
public final class TCPConnection: Sendable {
    private let descriptor: Descriptor

    init(fd: Int32) {
        self.descriptor = Descriptor(fd)
        try? Sys.setNoDelay(fd)
    }

    /// The remote address.
    public var remote: IPSocketAddress? { address(of: "getpeername") }

    /// The local address.
    public var local: IPSocketAddress? { address(of: "getsockname") }

    private func address(of call: String) -> IPSocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let ok = (try? descriptor.withFD(call) { fd throws(SystemError) in
            try withUnsafeMutablePointer(to: &storage) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(SystemError) in
                    if call == "getpeername" {
                        try Sys.getpeername(fd, address, &length)
                    } else {
                        try Sys.getsockname(fd, address, &length)
                    }
                }
            }
        }) != nil
        guard ok else { return nil }
        return withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { IPSocketAddress($0) } }
    }

    /// Whether ``close()`` was called.
    public var isClosed: Bool { descriptor.isClosed }

    /// Shuts the connection down both ways and closes it; a blocked read or write returns.
    public func close() { descriptor.close() }

    /// Ends this side's direction (`shutdown(SHUT_WR)`): the peer reads the end of the stream
    /// after what was written, and reading here goes on. Nothing once the connection is closed.
    public func finishWriting() {
        try? descriptor.withFD("shutdown") { fd throws(SystemError) in Sys.shutdown(fd, Int32(SHUT_WR)) }
    }

    /// The next bytes that arrived, at most `maxCount`; an empty array at the end of the stream.
    ///
    /// - Throws: a ``SystemError`` when the connection failed (`ECONNRESET`, …) or was closed
    ///   on this side (`EBADF`, also for a read that was waiting), `CancellationError` when the
    ///   task is cancelled.
    public func read(maxCount: Int = 65536) async throws -> [UInt8] {
        try await descriptor.receive(maxCount: maxCount)
    }

    /// The next bytes that arrived, read into the front of `buffer` (made `maxCount` bytes long
    /// if it is shorter; its storage reused when nothing else refers to it): how many (0 at the
    /// end of the stream). Throws as ``read(maxCount:)`` does.
    public func read(into buffer: inout [UInt8], maxCount: Int = 65536) async throws -> Int {
        try await descriptor.receive(into: &buffer, maxCount: maxCount)
    }

    /// Writes all of `bytes`; returns once the kernel took the last of them.
    ///
    /// - Throws: a ``SystemError`` when the peer is gone (`EPIPE`, `ECONNRESET`; never a
    ///   `SIGPIPE`) or the connection was closed on this side, `CancellationError` when the
    ///   task is cancelled: then part of `bytes` may have been sent, so close the connection.
    public func write(_ bytes: [UInt8]) async throws {
        try await descriptor.send(bytes)
    }

    /// Writes what the kernel takes of `bytes` now, without waiting: how many bytes that was
    /// (0 when the socket buffer is full). Not while a ``write(_:)`` runs.
    ///
    /// - Throws: a ``SystemError`` as ``write(_:)`` does.
    public func writeNow(_ bytes: [UInt8]) throws(SystemError) -> Int {
        try descriptor.sendNow(bytes)
    }

    /// Connects to `address`, giving up after `timeout`.
    ///
    /// - Throws: a ``SystemError`` (`ETIMEDOUT` after `timeout`), `CancellationError` when the
    ///   task is cancelled.
    public static func connect(to address: IPSocketAddress, timeout: Duration) async throws -> TCPConnection {
        let fd = try Sys.socket(address.family == .ipv4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
        do {
            try Sys.setNonBlocking(fd, true)
            let done = try address.withSockAddr { pointer, length throws(SystemError) in
                try Sys.connectNonBlocking(fd, pointer, length)
            }
            if !done {
                // In progress: parked on Readiness's thread until the socket is writable (the
                // handshake ended, one way or the other), or the time is up.
                let finished = try await withThrowingTaskGroup(of: Bool.self) { group in
                    group.addTask {
                        try await Readiness.shared.wait(for: fd, events: Int16(POLLOUT))
                        return true
                    }
                    group.addTask {
                        // Cancelled when the connection is made: a timer that leaves nothing armed.
                        try await Timers.shared.sleep(for: timeout)
                        return false
                    }
                    defer { group.cancelAll() }
                    return try await group.next() ?? false
                }
                try Task.checkCancellation()
                guard finished else { throw SystemError("connect", errno: ETIMEDOUT) }
                let error = try Sys.getOption(fd, SOL_SOCKET, SO_ERROR)
                if error != 0 { throw SystemError("connect", errno: error) }
            }
            try Sys.setNonBlocking(fd, false)
            return TCPConnection(fd: fd)
        } catch {
            Sys.close(fd)
            throw error
        }
    }
}

/// Checks that something accepts TCP connections at an address within a time limit.
public enum TCPProbe {
    /// True when a connection to `host`:`port` completes within `timeout` (it is closed at once).
    public static func isReachable(host: String, port: UInt16, timeout: Duration) async -> Bool {
        guard let address = IPSocketAddress(host: host, port: port) else { return false }
        do {
            let connection = try await TCPConnection.connect(to: address, timeout: timeout)
            connection.close()
            return true
        } catch {
            return false
        }
    }
}

/// Set when the task waiting for a blocking call is cancelled; the call looks at it between
/// slices of waiting.
package final class CancellationFlag: Sendable {
    private let state = Locked(false)

    package func cancel() { state.withLock { $0 = true } }

    package var isCancelled: Bool { state.withLock { $0 } }

    package func check() throws(CancellationError) {
        if isCancelled { throw CancellationError() }
    }
}

/// Waits (in slices, on the calling thread) for a non-blocking `connect` that returned
/// `EINPROGRESS` to finish, and reports how it ended.
///
/// - Throws: a ``SystemError`` (`ETIMEDOUT` after `timeout`, or the connect's own error),
///   `CancellationError` once `cancellation` is set.
package func finishConnect(_ fd: Int32, timeout: Duration, cancellation: CancellationFlag?) throws {
    let deadline = ContinuousClock.now + timeout
    while true {
        try cancellation?.check()
        let remaining = ContinuousClock.now.duration(to: deadline)
        if remaining <= .zero { throw SystemError("connect", errno: ETIMEDOUT) }
        let milliseconds = Int32(
            clamping: max(1, remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000))
        let events = try Sys.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: min(milliseconds, pollSlice))
        if events != 0 { break }
    }
    let error = try Sys.getOption(fd, SOL_SOCKET, SO_ERROR)
    if error != 0 { throw SystemError("connect", errno: error) }
}

/// ``runBlocking(_:_:)`` for a call that waits in slices and gives up when the task is cancelled.
package func runBlockingCancellable<T: Sendable>(
    _ name: String, _ body: @escaping @Sendable (CancellationFlag) throws -> T
) async throws -> T {
    let flag = CancellationFlag()
    return try await withTaskCancellationHandler {
        try await runBlocking(name) { try body(flag) }
    } onCancel: {
        flag.cancel()
    }
}

/// A socket descriptor closed exactly once, and never while a call is using it.
///
/// `close()` shuts the socket down at once, so a thread waiting on it (in `poll`, `accept`,
/// `recv` or `send`) returns, and ends every wait parked on it in ``Readiness``; the descriptor itself is closed when the last call using it (through
/// ``withFD(_:_:)``) is done, so its number cannot be reused by another socket while a thread
/// still holds it. deinit closes it if nobody did.
package final class Descriptor: @unchecked Sendable {
    package let fd: Int32
    private let lock = NSLock()
    private var closed = false
    private var users = 0

    package init(_ fd: Int32) {
        self.fd = fd
    }

    package var isClosed: Bool { lock.withLock { closed } }

    /// Runs `body` with the descriptor, which stays open until `body` returns.
    ///
    /// - Throws: a ``SystemError`` with `EBADF` naming `call` once ``close()`` was called.
    package func withFD<R>(_ call: String, _ body: (Int32) throws(SystemError) -> R) throws(SystemError) -> R {
        let open = lock.withLock { () -> Bool in
            guard !closed else { return false }
            users += 1
            return true
        }
        guard open else { throw SystemError(call, errno: EBADF) }
        defer {
            let last = lock.withLock { () -> Bool in
                users -= 1
                return closed && users == 0
            }
            if last { closeNumber() }
        }
        return try body(fd)
    }

    /// Holds the descriptor open until the matching ``release()``, for a call that waits in
    /// between (an `await`); ``withFD(_:_:)`` is the same for a synchronous body.
    ///
    /// - Throws: a ``SystemError`` with `EBADF` naming `call` once ``close()`` was called.
    package func acquire(_ call: String) throws(SystemError) -> Int32 {
        let open = lock.withLock { () -> Bool in
            guard !closed else { return false }
            users += 1
            return true
        }
        guard open else { throw SystemError(call, errno: EBADF) }
        return fd
    }

    /// Ends an ``acquire(_:)``; the last user after ``close()`` closes the descriptor.
    package func release() {
        let last = lock.withLock { () -> Bool in
            users -= 1
            return closed && users == 0
        }
        if last { closeNumber() }
    }

    package func close() {
        // The close counts as a user until it has shut the socket down and ended its waits: a
        // call that returns meanwhile must not close the number first (the shutdown would hit
        // whatever socket took the number next, and `end` would mark that socket ended after
        // `forget`, so every wait on it would return at once: its reader would spin).
        let wasOpen = lock.withLock { () -> Bool in
            guard !closed else { return false }
            closed = true
            users += 1
            return true
        }
        guard wasOpen else { return }
        Sys.shutdown(fd, Int32(SHUT_RDWR))
        Readiness.shared.end(fd)
        release()
    }

    /// Closes the number itself, once nobody uses it.
    private func closeNumber() {
        Readiness.shared.forget(fd)
        Sys.close(fd)
    }

    deinit { close() }
}
