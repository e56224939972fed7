import PeerLinkCore
import Testing

@Suite("Session: invitations, with injected time on both sides", .ownThread)
struct SessionInvitationTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func acceptedInvitationConnectsBothSides(seed: UInt64) throws {
        var net = try SessionNet(["alice", "bob"], seed: seed)
        let invitation = try net.invite(0, 1, context: Array("join my game".utf8))
        #expect(net.machine(0).state(of: net.peer(1)) == .connecting)
        net.run()

        let shown = net.invitationsReceived(1)
        try #require(shown.count == 1)
        #expect(shown[0].from == 0)
        #expect(shown[0].context == Array("join my game".utf8))
        #expect(net.machine(1).state(of: net.peer(0)) == .notConnected, "the invitee shows nothing until its app accepts")

        try net.respond(1, shown[0].id, accept: true)
        net.run()
        #expect(net.results(0) == [invitation: .accepted])
        #expect(net.connected(0) == [1])
        #expect(net.connected(1) == [0])
        #expect(net.states(0, of: 1) == [.connecting, .connected])
        #expect(net.states(1, of: 0) == [.connected])
        #expect(net.liveLinks(between: 0, and: 1) == 1)
        #expect(net.machine(0).sessionID == net.machine(1).sessionID, "the invitee adopts the inviter's session")
    }

    @Test func declinedInvitationIsDeclinedNotTimedOut() throws {
        var net = try SessionNet(["alice", "bob"])
        let invitation = try net.invite(0, 1)
        net.run()
        try net.respond(1, net.invitationsReceived(1)[0].id, accept: false)
        net.run()
        #expect(net.results(0) == [invitation: .declined])
        #expect(net.states(0, of: 1) == [.connecting, .notConnected])
        #expect(net.connected(0).isEmpty && net.connected(1).isEmpty)
        // Answering twice is an error.
        #expect(throws: PeerLinkError.self) { try net.respond(1, net.invitationsReceived(1)[0].id, accept: true) }
        // With no business left, the link is closed after the idle timeout.
        net.advance(by: .seconds(11))
        #expect(net.liveLinks(between: 0, and: 1) == 0)
        #expect(net.notConnectedEvents(1) == 0, "the invitee never showed the inviter as anything but not connected")
    }

    @Test func unansweredInvitationTimesOutOnBothSides() throws {
        var net = try SessionNet(["alice", "bob"])
        let invitation = try net.invite(0, 1, timeout: .seconds(30))
        net.run()
        let shown = try #require(net.invitationsReceived(1).first)

        net.advance(to: .seconds(29))
        #expect(net.results(0).isEmpty)
        #expect(net.machine(1).state(of: net.peer(0)) == .notConnected)

        net.advance(to: .seconds(31))
        // The invitee's own clock ended it: its app is told, the inviter hears DECLINE(timed out).
        #expect(net.events(1).contains(.invitationCancelled(shown.id, from: net.peer(0), reason: .timedOut)))
        #expect(net.results(0) == [invitation: .timedOut])
        #expect(net.controlLog.contains { $0.from == 1 && $0.message == .decline(invitation: invitation.rawValue, reason: .timedOut) })

        // Answering late is an error, and sends nothing.
        let before = net.controlLog.count
        let error = #expect(throws: PeerLinkError.self) { try net.respond(1, shown.id, accept: true) }
        #expect(error?.code == .timedOut)
        net.run()
        #expect(net.controlLog.count == before)
        #expect(net.connected(0).isEmpty && net.connected(1).isEmpty)
    }

    @Test func inviterTimesOutAloneWhenTheInviteeIsSilent() throws {
        var net = try SessionNet(["alice", "bob"])
        net.droppedFrames = [[1, 0]]  // nothing from bob reaches alice
        let invitation = try net.invite(0, 1, timeout: .seconds(30))
        net.advance(to: .seconds(31))
        #expect(net.results(0).isEmpty, "the inviter waits the timeout plus the response grace (2 s)")
        #expect(net.machine(0).state(of: net.peer(1)) == .connecting)
        net.advance(to: .seconds(32))
        #expect(net.results(0) == [invitation: .timedOut])
        #expect(net.states(0, of: 1) == [.connecting, .notConnected])
    }

    @Test func acceptanceArrivingAfterTheInviterGaveUpIsUndoneWithLeave() throws {
        var net = try SessionNet(["alice", "bob"])
        net.droppedFrames = [[1, 0]]
        let invitation = try net.invite(0, 1, timeout: .seconds(10))
        net.run()
        // Bob accepts at 9.9 s, but his answers are lost until alice gave up.
        net.advance(to: .milliseconds(9900))
        try net.respond(1, net.invitationsReceived(1)[0].id, accept: true)
        net.run()
        #expect(net.connected(1) == [0])
        net.advance(to: .seconds(13))
        #expect(net.results(0) == [invitation: .timedOut])
        // Bob's ACCEPT finally arrives (delivered here by hand, as if it had been delayed).
        net.droppedFrames = []
        let link = net.machine(0).links(to: net.peer(1))[0]
        net.apply(0, net.nodes[0].machine.frameReceived(.control(.accept(invitation: invitation.rawValue)), on: link, at: net.now))
        net.run()
        #expect(net.controlLog.contains { $0.from == 0 && $0.message == .leave(session: net.machine(0).sessionID) })
        #expect(net.connected(1).isEmpty, "bob is told he is not in after all")
        #expect(net.connected(0).isEmpty)
    }

    @Test func invitationErrors() throws {
        var net = try SessionNet(["alice", "bob"])
        var alice = net.machine(0)
        #expect(throws: PeerLinkError.self) { try alice.invite(net.peer(0), at: .zero) }
        let tooLong = #expect(throws: PeerLinkError.self) {
            try alice.invite(net.peer(1), context: [UInt8](repeating: 0, count: 8193), at: .zero)
        }
        #expect(tooLong?.code == .invalidParameter)
        _ = try alice.invite(net.peer(1), context: [UInt8](repeating: 7, count: 8192), at: .zero)
        let twice = #expect(throws: PeerLinkError.self) { try alice.invite(net.peer(1), at: .zero) }
        #expect(twice?.message.contains("already waiting") == true)
        let unknown = #expect(throws: PeerLinkError.self) { try alice.respond(to: InvitationID(99), accept: true, at: .zero) }
        #expect(unknown?.code == .invalidParameter)
        for maximumPeers in [1, 9] {
            #expect(throws: PeerLinkError.self) {
                try SessionStateMachine(
                    localPeer: net.peer(0), serviceType: sessionTestService, policy: SessionPolicy(maximumPeers: maximumPeers))
            }
        }
        net.nodes[0].machine = alice
    }

    @Test func unreachablePeerFailsTheInvitation() throws {
        var net = try SessionNet(["alice", "bob"])
        net.failingDials = [[0, 1]]
        let invitation = try net.invite(0, 1)
        net.run()
        guard case .failed(let reason) = net.results(0)[invitation] else {
            Issue.record("expected a failure, got \(String(describing: net.results(0)[invitation]))")
            return
        }
        #expect(reason.contains("could not reach"))
        #expect(net.states(0, of: 1) == [.connecting, .notConnected])
    }
}
