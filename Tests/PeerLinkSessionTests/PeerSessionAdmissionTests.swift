import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// The peers an admission hook lets in, filled in once the peers exist; it counts the questions.
final class Admissions: Sendable {
    private let state = Locked<(allowed: Set<Fingerprint>, asked: [PeerID])>(([], []))

    func allow(_ peer: PeerID) { state.withLock { _ = $0.allowed.insert(peer.fingerprint) } }

    var asked: [PeerID] { state.withLock { $0.asked } }

    var hook: @Sendable (PeerID) -> Bool {
        { peer in
            self.state.withLock { state in
                state.asked.append(peer)
                return state.allowed.contains(peer.fingerprint)
            }
        }
    }
}

/// ``PeerSessionConfiguration/admit``: a refused peer never reaches the session, and both sides
/// say why. The manual clock never moves, so no automatic retry muddies the picture.
@Suite("PeerSession admission (refusing unknown peers)", .timeLimit(.minutes(1)))
struct PeerSessionAdmissionTests {
    @Test("an unknown peer's invitation is refused after the handshake; both sides report it")
    func refusedInviter() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let admissions = Admissions()
        let guarded = try SessionNode.memory("guarded", on: network, clock: clock, log: log, admit: admissions.hook)
        let stranger = try SessionNode.memory("stranger", on: network, clock: clock, log: log)
        try await withRunning([guarded, stranger]) {
            stranger.find([guarded])
            let invitation = try await stranger.session.invite(guarded.peer)
            try await guarded.log.wait("the guarded side reports the refusal") { !$0.linkFailures.isEmpty }
            try await stranger.log.wait("the invitation fails") { $0.invitationResult(invitation) != nil }
            try await stranger.log.wait("the stranger reports the refusal") { !$0.linkFailures.isEmpty }

            let local = try #require(guarded.log.events.linkFailures.first)
            #expect(local.peer == stranger.peer)
            #expect(
                local.reason == "refused stranger (id \(stranger.peer.fingerprint.grouped)): not a known peer", "\(local.reason)")
            let remote = try #require(stranger.log.events.linkFailures.first)
            #expect(remote.peer == guarded.peer)
            #expect(remote.reason.contains("refused the link") && remote.reason.contains("not a known peer"), "\(remote.reason)")
            guard case .failed(let why)? = stranger.log.events.invitationResult(invitation) else {
                Issue.record("expected a failed invitation, got \(String(describing: stranger.log.events.invitationResult(invitation)))")
                return
            }
            #expect(why.contains("not a known peer") && why.contains("identity mismatch"), "\(why)")
            // The refused peer never got as far as the session: no invitation, no state change.
            #expect(guarded.log.events.invitationsReceived.isEmpty)
            #expect(!guarded.log.events.contains { if case .peerStateChanged = $0 { true } else { false } })
            #expect(await guarded.session.connectedPeers() == [])
            #expect(await stranger.session.connectedPeers() == [])
            #expect(admissions.asked == [stranger.peer])
        }
        #expect(log.all.contains { $0.message == "peer refused" && $0.metadata["peer.id"] == "\(stranger.peer.fingerprint)" })
    }

    @Test("inviting an unknown peer: the dialled link is refused and the invitation fails")
    func refusedInvitee() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let admissions = Admissions()
        let guarded = try SessionNode.memory("guarded", on: network, clock: clock, log: log, admit: admissions.hook)
        let stranger = try SessionNode.memory("stranger", on: network, clock: clock, log: log)
        try await withRunning([guarded, stranger]) {
            guarded.find([stranger])
            let invitation = try await guarded.session.invite(stranger.peer)
            try await guarded.log.wait("the invitation fails") { $0.invitationResult(invitation) != nil }
            try await stranger.log.wait("the stranger reports the refusal") { !$0.linkFailures.isEmpty }

            let local = guarded.log.events.linkFailures
            #expect(local.count == 1, "\(local.map(\.reason))")
            #expect(local.first?.peer == stranger.peer)
            #expect(local.first?.reason == "refused stranger (id \(stranger.peer.fingerprint.grouped)): not a known peer")
            guard case .failed(let why)? = guarded.log.events.invitationResult(invitation) else {
                Issue.record("expected a failed invitation, got \(String(describing: guarded.log.events.invitationResult(invitation)))")
                return
            }
            #expect(why.contains("not a known peer"), "\(why)")
            // Reported right after the result: the log may not have taken it yet.
            try await guarded.log.wait("the stranger is reported not connected") { $0.state(of: stranger.peer) == .notConnected }
            let remote = try #require(stranger.log.events.linkFailures.first)
            #expect(remote.reason.contains("not a known peer"), "\(remote.reason)")
            #expect(stranger.log.events.invitationsReceived.isEmpty)
            #expect(await stranger.session.connectedPeers() == [])
        }
    }

    @Test("a known peer is admitted; an unknown one in the same automatic mesh is not")
    func knownAdmitted() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let admissions = Admissions()
        let guarded = try SessionNode.memory("guarded", on: network, automatic: true, clock: clock, log: log, admit: admissions.hook)
        let friend = try SessionNode.memory("friend", on: network, automatic: true, clock: clock, log: log)
        let stranger = try SessionNode.memory("stranger", on: network, automatic: true, clock: clock, log: log)
        admissions.allow(friend.peer)
        try await withRunning([guarded, friend, stranger]) {
            guarded.find([friend, stranger])
            friend.find([guarded])
            stranger.find([guarded])
            try await guarded.log.wait("the friend joins") { $0.state(of: friend.peer) == .connected }
            try await friend.log.wait("the friend sees the guarded peer") { $0.state(of: guarded.peer) == .connected }
            try await guarded.log.wait("the stranger is refused") { events in
                events.linkFailures.contains { $0.peer == stranger.peer && $0.reason.contains("not a known peer") }
            }
            try await stranger.log.wait("the stranger hears why") { !$0.linkFailures.isEmpty }
            try await guarded.session.send(Array("hello friend".utf8), to: [friend.peer])
            try await friend.log.wait("the message arrives") { $0.messages(from: guarded.peer) == [Array("hello friend".utf8)] }
            #expect(await guarded.session.connectedPeers() == [friend.peer])
            #expect(guarded.log.events.state(of: stranger.peer) == .notConnected)
            #expect(!guarded.log.events.linkFailures.contains { $0.peer == friend.peer })
            #expect(stranger.log.events.state(of: guarded.peer) != .connected)
        }
    }
}
