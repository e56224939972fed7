// RawBluetooth.swift imports CBlueZ, whose headers then own <sys/socket.h>'s constants in this
// module: without this import SOCK_STREAM and MSG_NOSIGNAL are not found here.
internal import CBlueZ
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The baseline: plain blocking TCP sockets on 127.0.0.1, one thread per side, no framing
/// beyond what the session measurement sends (the same message sizes, each with a 4-byte length).
enum RawTCP {
    /// Seconds to move `total` bytes as messages of `size` bytes (plus a 4-byte length each)
    /// from one socket to another.
    static func throughput(messageSize size: Int, total: Int) throws -> Double {
        let (client, server) = try connectedPair()
        defer {
            close(client)
            close(server)
        }
        let count = max(1, total / size)
        let expected = count * (size + 4)
        let start = ContinuousClock.now
        let reader = Thread.detachedResult {
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            var got = 0
            while got < expected {
                let n = buffer.withUnsafeMutableBytes { recv(server, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                got += n
            }
            return got
        }
        // Batch small messages into one send, as the session's writer batches frames.
        var message = [UInt8](repeating: 0xA5, count: size + 4)
        message[0] = UInt8(size >> 24 & 0xFF); message[1] = UInt8(size >> 16 & 0xFF)
        message[2] = UInt8(size >> 8 & 0xFF); message[3] = UInt8(size & 0xFF)
        let perBatch = max(1, 65536 / (size + 4))
        var batch: [UInt8] = []
        batch.reserveCapacity(perBatch * (size + 4))
        for _ in 0..<perBatch { batch.append(contentsOf: message) }
        var sent = 0
        while sent < count {
            let n = min(perBatch, count - sent)
            try sendAll(client, batch, count: n * (size + 4))
            sent += n
        }
        guard reader.wait() == expected else { throw BenchError("raw TCP lost bytes") }
        return seconds(ContinuousClock.now - start)
    }

    /// Round trips of `size`-byte messages: `samples` of them, each a send and an echo.
    static func roundTrips(size: Int, samples: Int) throws -> [Double] {
        let (client, server) = try connectedPair()
        defer {
            close(client)
            close(server)
        }
        let echo = Thread.detachedResult {
            var buffer = [UInt8](repeating: 0, count: size)
            for _ in 0..<samples {
                guard (try? receiveAll(server, &buffer)) != nil, (try? sendAll(server, buffer, count: size)) != nil else { return false }
            }
            return true
        }
        var buffer = [UInt8](repeating: 0x50, count: size)
        var times: [Double] = []
        for _ in 0..<samples {
            let start = ContinuousClock.now
            try sendAll(client, buffer, count: size)
            try receiveAll(client, &buffer)
            times.append(seconds(ContinuousClock.now - start))
        }
        _ = echo.wait()
        return times
    }

    static func connectedPair() throws -> (Int32, Int32) {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw BenchError("socket: errno \(errno)") }
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &address) { pointer in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                guard bind(listener, raw, length) == 0, listen(listener, 1) == 0, getsockname(listener, raw, &length) == 0 else {
                    throw BenchError("bind/listen: errno \(errno)")
                }
            }
        }
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, length) }
        }
        guard connected == 0 else { throw BenchError("connect: errno \(errno)") }
        let server = accept(listener, nil, nil)
        guard server >= 0 else { throw BenchError("accept: errno \(errno)") }
        var one: Int32 = 1
        for fd in [client, server] {
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        }
        return (client, server)
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8], count: Int) throws {
        var offset = 0
        while offset < count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw BenchError("send: errno \(errno)") }
            offset += n
        }
    }

    static func receiveAll(_ fd: Int32, _ bytes: inout [UInt8]) throws {
        var offset = 0
        let count = bytes.count
        while offset < count {
            let n = bytes.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + offset, count - offset, 0) }
            guard n > 0 else { throw BenchError("recv: errno \(errno)") }
            offset += n
        }
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func seconds(_ duration: Duration) -> Double { durationSeconds(duration) }

func durationSeconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

extension Thread {
    /// Runs `body` on a new thread; `wait()` returns its result.
    static func detachedResult<T: Sendable>(_ body: @escaping @Sendable () -> T) -> ThreadResult<T> {
        let result = ThreadResult<T>()
        let thread = Thread {
            result.set(body())
        }
        thread.start()
        return result
    }
}

final class ThreadResult<T: Sendable>: @unchecked Sendable {
    private let condition = NSCondition()
    private var value: T?

    func set(_ value: T) {
        condition.lock()
        self.value = value
        condition.broadcast()
        condition.unlock()
    }

    func wait() -> T {
        condition.lock()
        defer { condition.unlock() }
        while value == nil { condition.wait() }
        return value!
    }
}
