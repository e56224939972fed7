#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import Synchronization
import Testing

/// Streams and unreliable messages over real sockets (127.0.0.1, encrypted), the system clock.
@Suite("Streams over loopback TCP", .timeLimit(.minutes(2)))
struct PeerStreamTCPTests {
    /// The bulk stream's size: large enough to hold the link busy for a while, small enough to
    /// keep the suite quick in a debug build: about 2 s there (256 MiB took 6.3 s, 50 MB RSS).
    static let bulkSize = 64 << 20
    static let blockSize = 1 << 20

    /// Block `index` of the bulk stream: one shared pattern, its first 8 bytes the index, so a
    /// lost, repeated or reordered block shows.
    static func block(_ index: Int, base: [UInt8]) -> [UInt8] {
        var block = base
        for shift in 0..<8 { block[shift] = UInt8(truncatingIfNeeded: index >> (shift * 8)) }
        return block
    }

    /// The first `count` bytes of both are equal (compared in one go: fast in a debug build too).
    static func sameBytes(_ lhs: [UInt8], _ rhs: [UInt8], count: Int) -> Bool {
        guard lhs.count >= count, rhs.count >= count else { return false }
        return lhs.withUnsafeBytes { left in rhs.withUnsafeBytes { right in memcmp(left.baseAddress!, right.baseAddress!, count) == 0 } }
    }

    static func connectedPair(_ body: (_ ana: SessionNode, _ bo: SessionNode) async throws -> Void) async throws {
        let log = TestLog()
        let ana = try PeerSessionTCPTests.node("ana", log: log)
        let bo = try PeerSessionTCPTests.node("bo", log: log)
        try await withRunning([ana, bo]) {
            ana.find([bo])
            bo.find([ana])
            try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
            try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
            try await body(ana, bo)
        }
    }

    @Test("a 64 MiB stream arrives intact while chat messages keep arriving, every one, in order")
    func bulkStreamWhileChatting() async throws {
        try await Self.connectedPair { ana, bo in
            let base = streamPattern(Self.blockSize, seed: 3)
            let blocks = Self.bulkSize / Self.blockSize
            let finished = Atomic(false)

            async let received: Int = {
                let incoming = try await bo.nextIncomingStream()
                var buffer: [UInt8] = []
                var index = 0
                while let chunk = try await incoming.read() {
                    buffer += chunk
                    if buffer.count >= Self.blockSize {
                        #expect(Self.sameBytes(buffer, Self.block(index, base: base), count: Self.blockSize), "block \(index)")
                        buffer.removeFirst(Self.blockSize)
                        index += 1
                    }
                }
                #expect(buffer.isEmpty)
                return index * Self.blockSize
            }()
            // Chat goes on during the transfer (and a little after, if the transfer is quick).
            async let chatted: Int = {
                var sent = 0
                while !finished.load(ordering: .relaxed) || sent < 50, sent < 2000 {
                    sent += 1
                    try await ana.session.send(Array("chat \(sent)".utf8), to: [bo.peer])
                    try await Task.sleep(for: .milliseconds(2))
                }
                return sent
            }()

            let stream = try await ana.session.openStream(named: "bulk", to: bo.peer)
            for index in 0..<blocks { try await stream.write(Self.block(index, base: base)) }
            try await stream.finish()
            finished.store(true, ordering: .relaxed)

            #expect(try await received == Self.bulkSize)
            let sent = try await chatted
            try await bo.log.wait("every chat message at Bo") { $0.messages(from: ana.peer).count >= sent }
            #expect(bo.log.events.messages(from: ana.peer) == (1...sent).map { Array("chat \($0)".utf8) })
            // The sender never queued more stream data than the link's bound, however large the stream.
            let statistics = try #require(ana.session.streamStatistics(for: bo.peer))
            #expect(statistics.peakQueuedDataBytes <= statistics.maxQueuedDataBytes)
            #expect(statistics.peakQueuedDataBytes > 0)
        }
    }

    @Test("an unreliable flood drops datagrams (counted) but every reliable message arrives, in order")
    func unreliableFlood() async throws {
        try await Self.connectedPair { ana, bo in
            let datagrams = 4000
            let reliableEvery = 20
            let datagram = streamPattern(8192, seed: 9)
            for index in 1...datagrams {
                try await ana.session.send(datagram, to: [bo.peer], reliable: false)
                if index % reliableEvery == 0 {
                    try await ana.session.send(Array("reliable \(index / reliableEvery)".utf8), to: [bo.peer])
                }
            }
            let reliableCount = datagrams / reliableEvery
            try await bo.log.wait("every reliable message at Bo") { events in
                events.filter { if case .message(_, _, true) = $0 { true } else { false } }.count == reliableCount
            }
            let reliable = bo.log.events.compactMap { event -> [UInt8]? in
                guard case .message(ana.peer, let data, true) = event else { return nil }
                return data
            }
            #expect(reliable == (1...reliableCount).map { Array("reliable \($0)".utf8) })
            // Every datagram is either delivered whole or dropped at the sender and counted.
            try await eventually("every datagram delivered or counted as dropped") {
                let dropped = await ana.session.info(for: bo.peer)?.droppedDatagrams ?? -1
                let delivered = bo.log.events.count(where: { if case .message(_, let data, false) = $0 { data == datagram } else { false } })
                return dropped + delivered == datagrams
            }
            let dropped = try #require(await ana.session.info(for: bo.peer)).droppedDatagrams
            #expect(dropped < datagrams, "some datagrams were delivered")
        }
    }
}
