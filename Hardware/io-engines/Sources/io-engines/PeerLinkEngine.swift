import PeerLink

/// PeerLink's own reactor: `TCPConnection`, whose reads and writes are tried at once on the
/// non-blocking socket and park on the I/O thread (`Readiness`, epoll) when they would block;
/// the callers are tasks on Swift concurrency's cooperative pool, as a link's reader and writer are.
struct PeerLinkEngine: Engine {
    let name = "peerlink"

    func bulk(total: Int, chunk: Int) async throws -> Double {
        let (client, server) = try await Self.pair()
        defer { client.close(); server.close() }
        let start = ContinuousClock.now
        let reader = Task { try await Self.drain(server, total: total) }
        let data = [UInt8](repeating: 0xA5, count: chunk)
        var sent = 0
        while sent < total {
            let count = min(chunk, total - sent)
            try await client.write(count == chunk ? data : Array(data.prefix(count)))
            sent += count
        }
        guard try await reader.value == total else { throw MeasureError("peerlink: bytes lost") }
        return seconds(ContinuousClock.now - start)
    }

    func smallWrites(count: Int, size: Int) async throws -> Double {
        let (client, server) = try await Self.pair()
        defer { client.close(); server.close() }
        let start = ContinuousClock.now
        let reader = Task { try await Self.drain(server, total: count * size) }
        let message = [UInt8](repeating: 0x5A, count: size)
        for _ in 0..<count { try await client.write(message) }
        guard try await reader.value == count * size else { throw MeasureError("peerlink: bytes lost") }
        return seconds(ContinuousClock.now - start)
    }

    func roundTrips(samples: Int, size: Int) async throws -> [Double] {
        let (client, server) = try await Self.pair()
        defer { client.close(); server.close() }
        let echo = Task {
            for _ in 0..<samples {
                guard let bytes = try await Self.receiveExactly(server, size) else { return }
                try await server.write(bytes)
            }
        }
        let message = [UInt8](repeating: 0x5A, count: size)
        var times: [Double] = []
        times.reserveCapacity(samples)
        for _ in 0..<samples {
            let start = ContinuousClock.now
            try await client.write(message)
            guard try await Self.receiveExactly(client, size) != nil else { throw MeasureError("peerlink: echo ended") }
            times.append(seconds(ContinuousClock.now - start))
        }
        try await echo.value
        return times
    }

    static func pair() async throws -> (client: TCPConnection, server: TCPConnection) {
        let listener = try TCPListener(host: "127.0.0.1", port: 0)
        defer { listener.close() }
        guard let address = IPSocketAddress(host: "127.0.0.1", port: listener.port) else {
            throw MeasureError("no loopback address")
        }
        async let accepted = listener.accept()
        let client = try await TCPConnection.connect(to: address, timeout: .seconds(5))
        return (client, try await accepted)
    }

    static func drain(_ connection: TCPConnection, total: Int) async throws -> Int {
        var got = 0
        while got < total {
            let bytes = try await connection.read(maxCount: 65536)
            if bytes.isEmpty { break }
            got += bytes.count
        }
        return got
    }

    static func receiveExactly(_ connection: TCPConnection, _ count: Int) async throws -> [UInt8]? {
        var bytes = try await connection.read(maxCount: count)
        while bytes.count < count {
            let more = try await connection.read(maxCount: count - bytes.count)
            if more.isEmpty { return nil }
            bytes += more
        }
        return bytes.isEmpty ? nil : bytes
    }
}
