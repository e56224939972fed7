#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// A listening TCP socket on all interfaces (IPv6 dual-stack when the kernel has IPv6, else IPv4).
public final class TCPListener: Sendable {
    public let port: UInt16
    private let descriptor: Descriptor
    private var fd: Int32 { descriptor.fd }

    /// Listens on `port` (0: a port the kernel picks).
    public init(port: UInt16 = 0) throws(SystemError) {
        var socket: Int32
        var address: IPSocketAddress
        do {
            socket = try Sys.socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
            try? Sys.setOption(socket, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 0)
            address = IPSocketAddress(host: "::", port: port)!
        } catch {
            socket = try Sys.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            address = IPSocketAddress(host: "0.0.0.0", port: port)!
        }
        do {
            try Sys.setOption(socket, SOL_SOCKET, SO_REUSEADDR, 1)
            try address.withSockAddr { pointer, length throws(SystemError) in try Sys.bind(socket, pointer, length) }
            try Sys.listen(socket, 64)
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
        self.descriptor = Descriptor(socket)
    }

    /// Waits for the next connection. Throws once the listener is closed.
    public func accept() async throws -> TCPConnection {
        let fd = self.fd
        let accepted = try await runBlocking("peerlink-accept") { () throws -> Int32 in
            try Sys.accept(fd)
        }
        if isClosed {
            Sys.close(accepted)
            throw SystemError("accept", errno: EBADF)
        }
        return TCPConnection(fd: accepted)
    }

    private var isClosed: Bool { descriptor.isClosed }

    /// Stops listening; a pending ``accept()`` throws.
    public func close() { descriptor.close() }
}

/// A connected TCP socket.
public final class TCPConnection: Sendable {
    private let descriptor: Descriptor
    var fd: Int32 { descriptor.fd }

    init(fd: Int32) {
        self.descriptor = Descriptor(fd)
    }

    /// The remote address.
    public var remote: IPSocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let ok = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) == 0 }
        }
        guard ok else { return nil }
        return withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { IPSocketAddress($0) } }
    }

    /// Shuts the connection down both ways and closes it; a blocked read or write returns.
    public func close() { descriptor.close() }

    /// Connects to `address`, giving up after `timeout`.
    public static func connect(to address: IPSocketAddress, timeout: Duration) async throws -> TCPConnection {
        let fd = try await runBlocking("peerlink-connect") { () throws -> Int32 in
            try connectBlocking(to: address, timeout: timeout)
        }
        return TCPConnection(fd: fd)
    }

    static func connectBlocking(to address: IPSocketAddress, timeout: Duration) throws -> Int32 {
        let fd = try Sys.socket(address.family == .ipv4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
        do {
            try Sys.setNonBlocking(fd, true)
            let done = try address.withSockAddr { pointer, length throws(SystemError) in
                try Sys.connectNonBlocking(fd, pointer, length)
            }
            if !done {
                let deadline = ContinuousClock.now + timeout
                while true {
                    let remaining = ContinuousClock.now.duration(to: deadline)
                    if remaining <= .zero { throw SystemError("connect", errno: ETIMEDOUT) }
                    let milliseconds = Int32(max(1, remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000))
                    let events = try Sys.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: milliseconds)
                    if events != 0 { break }
                }
                let error = try Sys.getOption(fd, SOL_SOCKET, SO_ERROR)
                if error != 0 { throw SystemError("connect", errno: error) }
            }
            try Sys.setNonBlocking(fd, false)
            return fd
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

/// A socket descriptor closed exactly once: `close()` shuts it down first, so a thread blocked in
/// `accept`, `read` or `write` on it returns; deinit closes it if nobody did.
final class Descriptor: @unchecked Sendable {
    let fd: Int32
    private let lock = NSLock()
    private var closed = false

    init(_ fd: Int32) {
        self.fd = fd
    }

    var isClosed: Bool { lock.withLock { closed } }

    func close() {
        let wasOpen = lock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        guard wasOpen else { return }
        Sys.shutdown(fd, Int32(SHUT_RDWR))
        Sys.close(fd)
    }

    deinit { close() }
}
