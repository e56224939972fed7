import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// What ``PeerSession/disconnect()`` does with messages still queued.
@Suite("PeerSession disconnect", .timeLimit(.minutes(1)))
struct PeerSessionDisconnectTests {
    @Test("messages sent right before disconnect() still arrive, in order, before the peer sees the leave")
    func queuedMessagesGoOutFirst() async throws {
        try await withConnectedPair { ana, bo in

            // A script's last lines: sent, then leave at once (no await in between lets the
            // link's writer take them first).
            let big = [UInt8](repeating: 7, count: 200_000)
            let lines = (1...20).map { Array("line \($0)".utf8) }
            try await ana.session.send(big, to: [bo.peer])
            for line in lines { try await ana.session.send(line, to: [bo.peer]) }
            await ana.session.disconnect()
            ana.listener.close()

            try await bo.log.wait("Bo sees Ana leave") { $0.state(of: ana.peer) == .notConnected }
            let received = bo.log.events.messages(from: ana.peer)
            let texts = received.filter { $0.count != big.count }.map { String(decoding: $0, as: UTF8.self) }
            #expect(texts == (1...20).map { "line \($0)" })
            let bigOnes = received.filter { $0.count == big.count }
            #expect(bigOnes.count == 1 && bigOnes.allSatisfy { $0 == big }, "\(bigOnes.count) large messages")
            // Everything arrived before the leave.
            let leave = try #require(
                bo.log.events.lastIndex { if case .peerStateChanged(ana.peer, .notConnected, _) = $0 { true } else { false } })
            let lastMessage = try #require(bo.log.events.lastIndex { if case .message = $0 { true } else { false } })
            #expect(lastMessage < leave)
        }
    }
    @Test("once sessions have ended, nothing keeps them alive: neither their links nor the links' event handlers")
    func endedSessionsAreFreed() async throws {
        weak var ana: PeerSession?
        weak var bo: PeerSession?
        try await withConnectedPair { a, b in
            ana = a.session
            bo = b.session
            try await a.session.send(Array("hello".utf8), to: [b.peer])
            try await b.log.wait("Bo has Ana's message") { $0.messages(from: a.peer).count == 1 }
        }
        // Whatever of the links' last steps still runs (an outbox being carried out) lets go soon.
        for _ in 0..<200 where ana != nil || bo != nil { try await Task.sleep(for: .milliseconds(10)) }
        #expect(ana == nil, "Ana's session outlived its end")
        #expect(bo == nil, "Bo's session outlived its end")
    }
}
