import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Synchronization
import Testing

/// Bytes that are not all the same, so a lost, repeated or reordered chunk shows.
func streamPattern(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 12 &+ Int(seed)) }
}

extension PeerStream {
    /// Everything the peer sends until its FIN.
    func readAll() async throws -> [UInt8] {
        var bytes: [UInt8] = []
        for try await chunk in chunks { bytes += chunk }
        return bytes
    }

    /// Writes `bytes` in pieces of `piece`, counting what was queued in `progress`.
    func write(_ bytes: [UInt8], pieces piece: Int, progress: ByteCounter? = nil) async throws {
        var offset = 0
        while offset < bytes.count {
            let end = min(offset + piece, bytes.count)
            try await write(Array(bytes[offset..<end]))
            progress?.add(end - offset)
            offset = end
        }
    }
}

/// Bytes counted from one task, read from another.
final class ByteCounter: Sendable {
    private let count = Atomic(0)
    func add(_ bytes: Int) { count.add(bytes, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

extension SessionNode {
    /// The next stream a peer opened to this one.
    func nextIncomingStream(sourceLocation: SourceLocation = #_sourceLocation) async throws -> PeerStream {
        var iterator = session.incomingStreams.makeAsyncIterator()
        return try #require(await iterator.next(), "the session ended before a stream arrived", sourceLocation: sourceLocation)
    }
}

/// Waits (in real time, bounded) until `condition` holds; fails naming `what` otherwise.
func eventually(
    _ what: String, within bound: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: @Sendable () async -> Bool
) async throws {
    let deadline = ContinuousClock.now + bound
    while ContinuousClock.now < deadline {
        if await condition() { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    Issue.record("timed out waiting for: \(what)", sourceLocation: sourceLocation)
    throw WaitTimedOut()
}

func expectError(
    _ code: PeerLinkError.Code, containing text: String? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("expected a \(code) error, got none", sourceLocation: sourceLocation)
    } catch let error as PeerLinkError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        if let text { #expect(error.message.contains(text), "\(error.message)", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("expected a PeerLinkError \(code), got \(error)", sourceLocation: sourceLocation)
    }
}

@Suite("Streams over the memory transport", .timeLimit(.minutes(1)))
struct PeerStreamTests {
    @Test("a stream opens, echoes 1 MiB back, and both FINs end it")
    func echo() async throws {
        try await withConnectedPair { ana, bo in
            let payload = streamPattern(1 << 20)
            async let echoed: Void = {
                let stream = try await bo.nextIncomingStream()
                #expect(stream.name == "echo ✓" && stream.peer == ana.peer && !stream.isOutgoing)
                for try await chunk in stream.chunks { try await stream.write(chunk) }
                try await stream.finish()
            }()
            let stream = try await ana.session.openStream(named: "echo ✓", to: bo.peer)
            #expect(stream.isOutgoing && stream.peer == bo.peer && stream.name == "echo ✓")
            async let back = stream.readAll()
            try await stream.write(payload, pieces: 50_000)
            try await stream.finish()
            let received = try await back
            try await echoed
            #expect(received.count == payload.count)
            #expect(received == payload)
            // Finished both ways: the stream is gone from the link's table on both sides.
            try await eventually("the stream closed at both ends") {
                ana.session.streamStatistics(for: bo.peer)?.openStreams == 0
                    && bo.session.streamStatistics(for: ana.peer)?.openStreams == 0
            }
        }
    }

    @Test("a long-lived pair keeps no trace of 300 streams once they ended and the app let go of them")
    func endedStreamsAreForgotten() async throws {
        try await withConnectedPair { ana, bo in
            async let served: Void = {
                for _ in 0..<300 {
                    let stream = try await bo.nextIncomingStream()
                    for try await chunk in stream.chunks { try await stream.write(chunk) }
                    try await stream.finish()
                }
            }()
            for index in 0..<300 {
                let stream = try await ana.session.openStream(named: "s\(index)", to: bo.peer)
                try await stream.write([UInt8(index & 0xFF)])
                try await stream.finish()
                #expect(try await stream.readAll() == [UInt8(index & 0xFF)])
            }
            try await served
            try await eventually("every stream forgotten at both ends") {
                ana.session.trackedStreamCount(for: bo.peer) == 0 && bo.session.trackedStreamCount(for: ana.peer) == 0
            }
        }
    }

    @Test("after FIN reads end with nil, writes are refused, and the other direction goes on")
    func halfClose() async throws {
        try await withConnectedPair { ana, bo in
            let stream = try await ana.session.openStream(named: "half", to: bo.peer)
            let incoming = try await bo.nextIncomingStream()
            try await stream.write(Array("question".utf8))
            try await stream.finish()
            await expectError(.invalidParameter, containing: "finished") { try await stream.write([1]) }
            await expectError(.invalidParameter) { try await stream.finish() }
            #expect(try await incoming.readAll() == Array("question".utf8))
            #expect(try await incoming.read() == nil)
            try await incoming.write(Array("answer".utf8))
            try await incoming.finish()
            #expect(try await stream.readAll() == Array("answer".utf8))
        }
    }

    @Test("a reset by the opener ends the acceptor's reads with its reason")
    func resetByOpener() async throws {
        try await withConnectedPair { ana, bo in
            let stream = try await ana.session.openStream(named: "doomed", to: bo.peer)
            let incoming = try await bo.nextIncomingStream()
            try await stream.write(streamPattern(1000))
            stream.reset(reason: "the user cancelled")
            await expectError(.cancelled, containing: "reset on this side: the user cancelled") { try await stream.write([1]) }
            await expectError(.cancelled, containing: "reset by the peer: the user cancelled") {
                while try await incoming.read() != nil {}
            }
            await expectError(.cancelled, containing: "reset by the peer") { try await incoming.write([1]) }
        }
    }

    @Test("a reset by the acceptor stops a writer blocked on credit")
    func resetByAcceptor() async throws {
        try await withConnectedPair { ana, bo in
            let stream = try await ana.session.openStream(named: "too big", to: bo.peer)
            let incoming = try await bo.nextIncomingStream()
            let queued = ByteCounter()
            let writer = Task { try await stream.write(streamPattern(4 << 20), pieces: 16384, progress: queued) }
            // Nobody reads at Bo: the writer stops once the window and the link's queue are full.
            try await eventually("Bo holds a full window") {
                bo.session.streamStatistics(for: ana.peer)?.unreadBytes == WireFormat.initialStreamWindow
            }
            incoming.reset(reason: "disk full")
            await expectError(.cancelled, containing: "reset by the peer: disk full") { try await writer.value }
            #expect(queued.value < 4 << 20)
            await expectError(.cancelled, containing: "reset on this side") { _ = try await incoming.read() }
        }
    }

    @Test("the sender never runs ahead of a slow reader's window; reading lets it finish")
    func windowWithSlowReader() async throws {
        let clock = ManualClock()
        try await withConnectedPair(clock: clock) { ana, bo in
            let total = 3 << 20
            let payload = streamPattern(total, seed: 7)
            let stream = try await ana.session.openStream(named: "slow", to: bo.peer)
            let incoming = try await bo.nextIncomingStream()
            let queued = ByteCounter()
            async let writer: Void = {
                try await stream.write(payload, pieces: 10_000, progress: queued)
                try await stream.finish()
            }()
            try await eventually("Bo holds a full window") {
                bo.session.streamStatistics(for: ana.peer)?.unreadBytes == WireFormat.initialStreamWindow
            }
            let atAna = try #require(ana.session.streamStatistics(for: bo.peer))
            // What the writer got queued: the window, at most the link's data queue, one piece.
            // Every byte queued took credit, and Bo granted none: exactly one window went out.
            #expect(queued.value <= WireFormat.initialStreamWindow)
            #expect(queued.value > WireFormat.initialStreamWindow - 10_000)
            #expect(atAna.peakQueuedDataBytes <= atAna.maxQueuedDataBytes)
            // Bo reads slowly: a chunk at a time, a millisecond of the sessions' clock after each
            // (about 10 MB/s), and the writer gets through it all. With the clock standing still
            // the reader would look infinitely fast, and its window would grow, as it should for
            // a fast reader.
            var received: [UInt8] = []
            while let chunk = try await incoming.read() {
                received += chunk
                #expect(bo.session.streamStatistics(for: ana.peer)!.unreadBytes <= WireFormat.initialStreamWindow)
                clock.advance(by: .milliseconds(1))
            }
            try await writer
            #expect(received == payload)
            #expect(ana.session.streamStatistics(for: bo.peer)!.peakQueuedDataBytes <= atAna.maxQueuedDataBytes)
        }
    }

    /// Streams belong to the pair, not to a link (a failover keeps them): losing the peer ends them.
    @Test("losing the peer ends every stream: writes at once, reads after what arrived")
    func linkLossEndsStreams() async throws {
        try await withConnectedPair { ana, bo in
            let stream = try await ana.session.openStream(named: "lost", to: bo.peer)
            let incoming = try await bo.nextIncomingStream()
            try await incoming.write(Array("last words".utf8))
            try await eventually("Ana got Bo's bytes") {
                ana.session.streamStatistics(for: bo.peer)?.unreadBytes == 10
            }
            bo.kill.fire()
            #expect(try await stream.read() == Array("last words".utf8))
            await expectError(.notConnected, containing: "ended") { _ = try await stream.read() }
            await expectError(.notConnected) { try await stream.write([1]) }
            await expectError(.notConnected, containing: "is not connected") {
                _ = try await ana.session.openStream(named: "again", to: bo.peer)
            }
        }
    }

    @Test("32 streams at once, both directions, each arrives intact")
    func manyStreams() async throws {
        try await withConnectedPair { ana, bo in
            let count = 32
            try await withThrowingTaskGroup(of: Void.self) { group in
                // Bo echoes every stream it gets.
                group.addTask {
                    var iterator = bo.session.incomingStreams.makeAsyncIterator()
                    try await withThrowingTaskGroup(of: Void.self) { echoes in
                        for _ in 0..<count {
                            guard let stream = await iterator.next() else { break }
                            echoes.addTask {
                                for try await chunk in stream.chunks { try await stream.write(chunk) }
                                try await stream.finish()
                            }
                        }
                        try await echoes.waitForAll()
                    }
                }
                for index in 0..<count {
                    group.addTask {
                        let payload = streamPattern(40_000 + index * 1000, seed: UInt8(index))
                        let stream = try await ana.session.openStream(named: "s\(index)", to: bo.peer)
                        async let back = stream.readAll()
                        try await stream.write(payload, pieces: 7000)
                        try await stream.finish()
                        let received = try await back
                        #expect(received == payload, "stream \(index)")
                    }
                }
                try await group.waitForAll()
            }
        }
    }

    @Test("at most 256 streams are open to a peer at once; finishing one makes room")
    func streamLimit() async throws {
        try await withConnectedPair { ana, bo in
            var streams: [PeerStream] = []
            for index in 0..<WireFormat.maxStreamsPerLink {
                streams.append(try await ana.session.openStream(named: "s\(index)", to: bo.peer))
            }
            await expectError(.unavailable, containing: "256 streams are open") {
                _ = try await ana.session.openStream(named: "one too many", to: bo.peer)
            }
            #expect(await ana.session.info(for: bo.peer)?.openStreams == WireFormat.maxStreamsPerLink)
            // Both sides finish the first: it is over, and a new one opens.
            var incoming = bo.session.incomingStreams.makeAsyncIterator()
            let first = try #require(await incoming.next())
            #expect(first.name == "s0")
            try await streams[0].finish()
            try await first.finish()
            #expect(try await first.read() == nil)
            #expect(try await streams[0].read() == nil)
            try await eventually("the first stream is over at Ana") {
                await ana.session.info(for: bo.peer)?.openStreams == WireFormat.maxStreamsPerLink - 1
            }
            let again = try await ana.session.openStream(named: "again", to: bo.peer)
            #expect(again.name == "again")
        }
    }

    @Test("opening: bad names, the local peer, and a peer that is not connected are refused")
    func openingErrors() async throws {
        try await withConnectedPair { ana, bo in
            await expectError(.invalidParameter) { _ = try await ana.session.openStream(named: "", to: bo.peer) }
            await expectError(.invalidParameter) {
                _ = try await ana.session.openStream(named: String(repeating: "n", count: 256), to: bo.peer)
            }
            await expectError(.invalidParameter) { _ = try await ana.session.openStream(named: "me", to: ana.peer) }
            let stranger = PeerID(identity: .generate(), displayName: try DisplayName("stranger"))
            await expectError(.notConnected) { _ = try await ana.session.openStream(named: "x", to: stranger) }
        }
    }
}
