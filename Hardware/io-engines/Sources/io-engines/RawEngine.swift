import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The baseline: blocking sockets, one thread per side, no event loop at all.
struct RawEngine: Engine {
    let name = "raw"

    func bulk(total: Int, chunk: Int) async throws -> Double {
        try await onThread("raw-bulk") {
            let (client, server) = try Self.pair()
            defer { close(client); close(server) }
            let start = ContinuousClock.now
            let reader = Joinable("raw-reader") { Self.drain(server, total: total) }
            let data = [UInt8](repeating: 0xA5, count: chunk)
            var sent = 0
            while sent < total {
                let count = min(chunk, total - sent)
                try Self.sendAll(client, data, count: count)
                sent += count
            }
            guard try reader.join() == total else { throw MeasureError("raw: bytes lost") }
            return seconds(ContinuousClock.now - start)
        }
    }

    func smallWrites(count: Int, size: Int) async throws -> Double {
        try await onThread("raw-small") {
            let (client, server) = try Self.pair()
            defer { close(client); close(server) }
            let start = ContinuousClock.now
            let reader = Joinable("raw-reader") { Self.drain(server, total: count * size) }
            let message = [UInt8](repeating: 0x5A, count: size)
            for _ in 0..<count { try Self.sendAll(client, message, count: size) }
            guard try reader.join() == count * size else { throw MeasureError("raw: bytes lost") }
            return seconds(ContinuousClock.now - start)
        }
    }

    func roundTrips(samples: Int, size: Int) async throws -> [Double] {
        try await onThread("raw-ping") {
            let (client, server) = try Self.pair()
            defer { close(client); close(server) }
            let echo = Joinable("raw-echo") { () throws -> Int in
                var buffer = [UInt8](repeating: 0, count: size)
                for _ in 0..<samples {
                    guard Self.receiveExactly(server, &buffer) else { return 0 }
                    try Self.sendAll(server, buffer, count: size)
                }
                return samples
            }
            let message = [UInt8](repeating: 0x5A, count: size)
            var reply = [UInt8](repeating: 0, count: size)
            var times: [Double] = []
            times.reserveCapacity(samples)
            for _ in 0..<samples {
                let start = ContinuousClock.now
                try Self.sendAll(client, message, count: size)
                guard Self.receiveExactly(client, &reply) else { throw MeasureError("raw: echo ended") }
                times.append(seconds(ContinuousClock.now - start))
            }
            _ = try echo.join()
            return times
        }
    }

    // MARK: Sockets

    /// A connected loopback pair, `TCP_NODELAY` on both ends.
    static func pair() throws -> (client: Int32, server: Int32) {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw MeasureError("socket: errno \(errno)") }
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard client >= 0 else { throw MeasureError("socket: errno \(errno)") }
        let connected = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                bind(listener, socketAddress, length) == 0 && listen(listener, 4) == 0
                    && getsockname(listener, socketAddress, &length) == 0
                    && connect(client, socketAddress, length) == 0
            }
        }
        guard connected else {
            close(client)
            throw MeasureError("loopback connect: errno \(errno)")
        }
        let server = accept(listener, nil, nil)
        guard server >= 0 else {
            close(client)
            throw MeasureError("accept: errno \(errno)")
        }
        var on: Int32 = 1
        setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(server, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        return (client, server)
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8], count: Int) throws {
        var offset = 0
        while offset < count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw MeasureError("send: errno \(errno)")
            }
            offset += n
        }
    }

    /// Reads until `total` bytes arrived or the stream ended; the bytes read.
    static func drain(_ fd: Int32, total: Int) -> Int {
        var buffer = [UInt8](repeating: 0, count: 65536)
        var got = 0
        while got < total {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            got += n
        }
        return got
    }

    static func receiveExactly(_ fd: Int32, _ buffer: inout [UInt8]) -> Bool {
        var got = 0
        let count = buffer.count
        while got < count {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + got, count - got, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            got += n
        }
        return true
    }
}
