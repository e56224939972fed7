import Logging
import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// PeerSession over the in-memory transport, with a manual clock that never moves: nothing in
/// these tests waits for a timeout, and every wait is for an event.
@Suite("PeerSession over the memory transport", .timeLimit(.minutes(1)))
struct PeerSessionTests {
    static func text(_ string: String) -> [UInt8] { Array(string.utf8) }

    @Test("two automatic peers connect and exchange messages in order both ways")
    func twoAutomaticPeers() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let ana = try SessionNode.memory("ana", on: network, automatic: true, clock: clock, log: log)
        let bo = try SessionNode.memory("bo", on: network, automatic: true, clock: clock, log: log)
        try await withRunning([ana, bo]) {
            ana.find([bo])
            bo.find([ana])
            try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
            try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
            #expect(await ana.session.connectedPeers() == [bo.peer])
            #expect(await bo.session.connectedPeers() == [ana.peer])

            let count = 100
            for index in 1...count {
                try await ana.session.send(Self.text("from Ana \(index)"), to: [bo.peer])
                try await bo.session.send(Self.text("from Bo \(index)"), to: [ana.peer])
            }
            try await bo.log.wait("\(count) messages at Bo") { $0.messages(from: ana.peer).count == count }
            try await ana.log.wait("\(count) messages at Ana") { $0.messages(from: bo.peer).count == count }
            #expect(bo.log.events.messages(from: ana.peer) == (1...count).map { Self.text("from Ana \($0)") })
            #expect(ana.log.events.messages(from: bo.peer) == (1...count).map { Self.text("from Bo \($0)") })

            let atAna = try #require(await ana.session.info(for: bo.peer))
            let atBo = try #require(await bo.session.info(for: ana.peer))
            #expect(atAna.peer == bo.peer && atAna.transport == "memory" && atAna.encrypted)
            #expect(atAna.remote.hasPrefix("memory://"))
            #expect(atAna.verificationCode.count == 7)
            #expect(atAna.verificationCode == atBo.verificationCode)

            // Ana leaves and stops listening, as a PeerNode does. (Automatic mode may invite her
            // again at once if her fingerprint is the greater: then Bo sees her go when that
            // dial finds nobody listening.)
            await ana.session.disconnect()
            ana.listener.close()
            try await bo.log.wait("Bo sees Ana leave") { $0.state(of: ana.peer) == .notConnected }
            #expect(await bo.session.connectedPeers() == [])
            #expect(await ana.session.info(for: bo.peer) == nil)
            await #expect(throws: PeerLinkError.self) { try await ana.session.invite(bo.peer) }
        }
        #expect(ana.log.events.linkFailures.isEmpty)
        // Logs stay at info and below and carry the link's metadata.
        #expect(log.all.allSatisfy { $0.level <= .info })
        #expect(log.all.contains { $0.metadata["link.id"] != nil && $0.metadata["peer.id"] != nil && $0.metadata["transport"] == "memory" })
    }

    @Test("an accepted and a declined invitation reach the inviter as distinct results")
    func invitations() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let ana = try SessionNode.memory("ana", on: network, clock: clock, log: log)
        let bo = try SessionNode.memory("bo", on: network, clock: clock, log: log)
        let cy = try SessionNode.memory("cy", on: network, clock: clock, log: log)
        try await withRunning([ana, bo, cy]) {
            ana.find([bo, cy])

            let toBo = try await ana.session.invite(bo.peer, context: Self.text("join my chat"))
            try await bo.log.wait("Bo is invited") { !$0.invitationsReceived.isEmpty }
            let atBo = try #require(bo.log.events.invitationsReceived.first)
            #expect(atBo.from == ana.peer && atBo.context == Self.text("join my chat"))
            #expect(ana.log.events.state(of: bo.peer) == .connecting)
            try await bo.session.respond(to: atBo.id, accept: true)
            try await ana.log.wait("Ana learns Bo accepted") { $0.invitationResult(toBo) != nil }
            #expect(ana.log.events.invitationResult(toBo) == .accepted)
            try await ana.log.wait("Bo connected at Ana") { $0.state(of: bo.peer) == .connected }
            try await bo.log.wait("Ana connected at Bo") { $0.state(of: ana.peer) == .connected }

            let toCy = try await ana.session.invite(cy.peer)
            try await cy.log.wait("Cy is invited") { !$0.invitationsReceived.isEmpty }
            let atCy = try #require(cy.log.events.invitationsReceived.first)
            try await cy.session.respond(to: atCy.id, accept: false)
            try await ana.log.wait("Ana learns Cy declined") { $0.invitationResult(toCy) != nil }
            #expect(ana.log.events.invitationResult(toCy) == .declined)
            #expect(await ana.session.connectedPeers() == [bo.peer])
            #expect(await cy.session.connectedPeers() == [])
            await #expect(throws: PeerLinkError.self) { try await cy.session.respond(to: atCy.id, accept: true) }
        }
    }

    @Test("eight automatic peers form one full mesh; one dies and the others carry on")
    func eightPeers() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let nodes = try (1...8).map { try SessionNode.memory("peer-\($0)", on: network, automatic: true, clock: clock, log: log) }
        try await withRunning(nodes) {
            for node in nodes { node.find(nodes) }
            for node in nodes {
                let others = Set(nodes.map(\.peer)).subtracting([node.peer])
                try await node.log.wait("\(node.peer.displayName) connected to the 7 others") { $0.connected == others }
            }
            for node in nodes { #expect(await node.session.connectedPeers().count == 7) }

            // One peer dies: its listener goes, discovery loses it, its task is cancelled.
            let victim = nodes[3]
            let survivors = nodes.filter { $0.peer != victim.peer }
            victim.listener.close()
            for node in survivors { node.session.discovered(.lost(victim.peer)) }
            victim.kill.fire()
            for node in survivors {
                try await node.log.wait("\(node.peer.displayName) sees the victim gone") { $0.state(of: victim.peer) == .notConnected }
            }
            for node in survivors {
                let others = Set(survivors.map(\.peer)).subtracting([node.peer])
                #expect(node.log.events.connected == others)
                #expect(Set(await node.session.connectedPeers()) == others)
            }
            // Nobody of the survivors was ever dropped.
            for node in survivors {
                for other in survivors where other.peer != node.peer {
                    let drops = node.log.events.filter {
                        if case .peerStateChanged(other.peer, .notConnected, _) = $0 { true } else { false }
                    }
                    #expect(drops.isEmpty, "\(node.peer.displayName) dropped \(other.peer.displayName)")
                }
            }
        }
    }

    @Test("encryption required × none: both sides report the refusal and stay apart")
    func encryptionMismatch() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let strict = try SessionNode.memory("strict", on: network, encryption: .required, clock: clock, log: log)
        let plain = try SessionNode.memory("plain", on: network, encryption: .none, clock: clock, log: log)
        try await withRunning([strict, plain]) {
            strict.find([plain])
            let invitation = try await strict.session.invite(plain.peer)
            try await strict.log.wait("the inviter reports the refusal") { !$0.linkFailures.isEmpty }
            try await plain.log.wait("the invitee reports the refusal") { !$0.linkFailures.isEmpty }
            let atStrict = try #require(strict.log.events.linkFailures.first)
            let atPlain = try #require(plain.log.events.linkFailures.first)
            #expect(atStrict.peer == plain.peer)
            #expect(atStrict.reason.contains("encryption"), "\(atStrict.reason)")
            #expect(atPlain.peer == nil)
            #expect(atPlain.reason.contains("encryption"), "\(atPlain.reason)")
            try await strict.log.wait("the invitation fails") { $0.invitationResult(invitation) != nil }
            guard case .failed(let reason)? = strict.log.events.invitationResult(invitation) else {
                Issue.record("expected a failed invitation, got \(String(describing: strict.log.events.invitationResult(invitation)))")
                return
            }
            #expect(reason.contains("encryption"), "\(reason)")
            // Reported right after the result, in the same batch of events: the log may not
            // have taken it yet.
            try await strict.log.wait("the inviter reports the peer not connected") { $0.state(of: plain.peer) == .notConnected }
            #expect(await strict.session.connectedPeers() == [])
            #expect(await plain.session.connectedPeers() == [])
            #expect(plain.log.events.invitationsReceived.isEmpty)
        }
    }

    @Test("a peer nobody listens for is reported as a failed link and a failed invitation")
    func unreachable() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let ana = try SessionNode.memory("ana", on: network, clock: clock, log: log)
        let ghost = try SessionNode.memory("ghost", on: network, clock: clock, log: log)
        ghost.listener.close()
        try await withRunning([ana]) {
            ana.find([ghost])
            let invitation = try await ana.session.invite(ghost.peer)
            try await ana.log.wait("the invitation fails") { $0.invitationResult(invitation) != nil }
            let failure = try #require(ana.log.events.linkFailures.first)
            #expect(failure.peer == ghost.peer)
            #expect(failure.reason.contains("memory://ghost"), "\(failure.reason)")
            // Reported right after the result: the log may not have taken it yet.
            try await ana.log.wait("Ana reports the ghost not connected") { $0.state(of: ghost.peer) == .notConnected }
        }
    }

    @Test("a 1 MiB reliable message arrives intact, and small messages sent after it arrive too")
    func largeMessage() async throws {
        try await withConnectedPair { ana, bo in

            let big = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }
            let small = (1...5).map { Self.text("line \($0)") }
            try await ana.session.send(big, to: [bo.peer])
            for line in small { try await ana.session.send(line, to: [bo.peer]) }
            try await bo.log.wait("all six messages at Bo") { $0.messages(from: ana.peer).count == 6 }
            let received = bo.log.events.messages(from: ana.peer)
            #expect(received.filter { $0.count == big.count } == [big])
            #expect(received.filter { $0.count != big.count } == small)
        }
    }
}
