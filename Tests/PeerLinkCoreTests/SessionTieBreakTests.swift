import PeerLinkCore
import Testing

@Suite("Session: the tie-break for duplicate links and crossed invitations", .ownThread)
struct SessionTieBreakTests {
    /// Two peers, ordered by fingerprint.
    static func pair() throws -> (small: PeerID, large: PeerID) {
        let (a, b) = (sessionPeer("first"), sessionPeer("second"))
        return a.fingerprint < b.fingerprint ? (a, b) : (b, a)
    }

    static func closed(_ actions: [SessionAction]) -> [(LinkID, GoAwayCode)] {
        actions.compactMap {
            if case .closeLink(let link, let code, _) = $0 { return (link, code) }
            return nil
        }
    }

    /// Both links of a pair established in every order on each side: each side closes the link
    /// dialled by the greater fingerprint, so both close the same link, without a message.
    @Test(arguments: [false, true])
    func bothSidesPickTheSameLinkWhateverTheOrder(ownLinkFirst: Bool) throws {
        let (small, large) = try Self.pair()
        // Physical link 1 is dialled by the smaller peer, physical link 2 by the greater one.
        // Each side names them its own way.
        var smallSide = try SessionStateMachine(localPeer: small, serviceType: sessionTestService)
        var largeSide = try SessionStateMachine(localPeer: large, serviceType: sessionTestService)
        let (small1, small2) = (LinkID(101), LinkID(102))
        let (large1, large2) = (LinkID(201), LinkID(202))

        var smallActions: [SessionAction] = []
        var largeActions: [SessionAction] = []
        if ownLinkFirst {
            smallActions += smallSide.linkEstablished(small1, peer: large, dialedLocally: true, at: .zero)
            smallActions += smallSide.linkEstablished(small2, peer: large, dialedLocally: false, at: .zero)
            largeActions += largeSide.linkEstablished(large2, peer: small, dialedLocally: true, at: .zero)
            largeActions += largeSide.linkEstablished(large1, peer: small, dialedLocally: false, at: .zero)
        } else {
            smallActions += smallSide.linkEstablished(small2, peer: large, dialedLocally: false, at: .zero)
            smallActions += smallSide.linkEstablished(small1, peer: large, dialedLocally: true, at: .zero)
            largeActions += largeSide.linkEstablished(large1, peer: small, dialedLocally: false, at: .zero)
            largeActions += largeSide.linkEstablished(large2, peer: small, dialedLocally: true, at: .zero)
        }
        #expect(Self.closed(smallActions).map(\.0) == [small2])
        #expect(Self.closed(largeActions).map(\.0) == [large2])
        #expect(Self.closed(smallActions + largeActions).allSatisfy { $0.1 == .duplicateLink })
        #expect(smallSide.links(to: large) == [small1])
        #expect(largeSide.links(to: small) == [large1])
        // Nothing else happened: no state was touched.
        #expect(smallActions.count == 1 && largeActions.count == 1)
    }

    /// A second link appears while the pair is connected — dialled by either side, established
    /// at the two ends in random orders: the pair stays connected throughout, one link is left,
    /// and messages go on.
    @Test(arguments: [(false, UInt64(1)), (false, 2), (false, 3), (true, 1), (true, 2), (true, 3)])
    func aDuplicateWhileConnectedNeverDropsThePair(invitedBySmaller: Bool, seed: UInt64) throws {
        var net = try SessionNet(["first", "second"], seed: seed)
        let (small, large) = net.peer(0).fingerprint < net.peer(1).fingerprint ? (0, 1) : (1, 0)
        let (inviter, invitee) = invitedBySmaller ? (small, large) : (large, small)
        _ = try net.invite(inviter, invitee)
        net.run()
        try net.respond(invitee, net.invitationsReceived(invitee)[0].id, accept: true)
        net.run()
        #expect(net.connected(small) == [large])

        // The invitee's owner dials too (say, over a second transport).
        net.openLink(from: invitee, to: inviter)
        net.run()
        #expect(net.liveLinks(between: small, and: large) == 1)
        let duplicateCloses = net.closes.filter { $0.code == .duplicateLink }
        #expect(!duplicateCloses.isEmpty && duplicateCloses.count == net.closes.count)
        // The kept link is the one the smaller fingerprint dialled.
        let live = try #require(net.connections.first { !$0.dialerClosed && !$0.listenerClosed })
        #expect(live.dialer.node == small)
        #expect(net.states(small, of: large).last == .connected && net.states(large, of: small).last == .connected)
        #expect(net.drops().isEmpty && net.notConnectedEvents(0) == 0 && net.notConnectedEvents(1) == 0)

        try net.send(small, [1, 2, 3], to: [large])
        try net.send(large, [4, 5, 6], to: [small])
        net.run()
        #expect(net.received(large).map(\.data) == [[1, 2, 3]])
        #expect(net.received(small).map(\.data) == [[4, 5, 6]])
    }

    /// Both apps invite each other at once; both dial. Whatever the order of events: one link,
    /// both connected, both invitations reported accepted, neither app asked.
    @Test func crossedInvitationsConnectOnceAndBothAreAccepted() throws {
        var sawCrossedDecline = false
        for seed in 1...24 as ClosedRange<UInt64> {
            var net = try SessionNet(["first", "second"], seed: seed)
            let (small, large) = net.peer(0).fingerprint < net.peer(1).fingerprint ? (0, 1) : (1, 0)
            let fromSmall = try net.invite(small, large)
            let fromLarge = try net.invite(large, small)
            net.run()
            #expect(net.results(small) == [fromSmall: .accepted], "seed \(seed)")
            #expect(net.results(large) == [fromLarge: .accepted], "seed \(seed)")
            #expect(net.invitationsReceived(small).isEmpty && net.invitationsReceived(large).isEmpty)
            #expect(net.connected(small) == [large] && net.connected(large) == [small])
            #expect(net.liveLinks(between: small, and: large) == 1)
            #expect(net.notConnectedEvents(small) == 0 && net.notConnectedEvents(large) == 0)
            #expect(net.machine(small).sessionID == net.machine(large).sessionID)
            for delivery in net.controlLog {
                if case .decline(let id, let reason) = delivery.message {
                    #expect(
                        delivery.from == small && id == fromLarge.rawValue && reason == .crossed,
                        "only the loser's INVITE is declined, as crossed")
                    sawCrossedDecline = true
                }
            }
        }
        #expect(sawCrossedDecline)
    }

    /// The crossing step by step on one link, so every message of the rule is seen.
    @Test func crossedInvitationsStepByStep() throws {
        let (small, large) = try Self.pair()
        var smallSide = try SessionStateMachine(localPeer: small, serviceType: sessionTestService)
        var largeSide = try SessionStateMachine(localPeer: large, serviceType: sessionTestService)
        let (fromSmall, _) = try smallSide.invite(large, at: .zero)
        let (fromLarge, _) = try largeSide.invite(small, at: .zero)
        let (smallLink, largeLink) = (LinkID(1), LinkID(2))
        // Only the smaller peer's dial gets through; the greater one's is still under way.
        _ = smallSide.linkEstablished(smallLink, peer: large, dialedLocally: true, at: .milliseconds(5))
        _ = largeSide.linkEstablished(largeLink, peer: small, dialedLocally: false, at: .milliseconds(5))
        let smallFrame = smallSide.nextFrame(for: smallLink)
        let largeFrame = largeSide.nextFrame(for: largeLink)
        let smallInvite = try #require(smallFrame)
        let largeInvite = try #require(largeFrame)
        #expect(smallInvite.type == .control && largeInvite.type == .control)

        // The loser gets the winner's INVITE: accepted without asking; its own counts as accepted.
        let loser = largeSide.frameReceived(smallInvite, on: largeLink, at: .milliseconds(10))
        #expect(loser.contains(.event(.invitationResult(fromLarge, peer: small, .accepted))))
        #expect(!loser.contains { if case .event(.invitationReceived) = $0 { return true } else { return false } })
        #expect(largeSide.connectedPeers == [small])
        // The winner gets the loser's INVITE: held back, not shown.
        let winner = smallSide.frameReceived(largeInvite, on: smallLink, at: .milliseconds(10))
        #expect(winner.allSatisfy { if case .event = $0 { return false } else { return true } })
        // The loser's ACCEPT settles both: the winner declines the loser's INVITE as crossed.
        let answer = largeSide.nextFrame(for: largeLink)
        let accept = try #require(answer)
        #expect(accept == .control(.accept(invitation: fromSmall.rawValue)))
        let settled = smallSide.frameReceived(accept, on: smallLink, at: .milliseconds(15))
        #expect(settled.contains(.event(.invitationResult(fromSmall, peer: large, .accepted))))
        var written: [Frame] = []
        while let frame = smallSide.nextFrame(for: smallLink) { written.append(frame) }
        #expect(written.first == .control(.decline(invitation: fromLarge.rawValue, reason: .crossed)))
        for frame in written { _ = largeSide.frameReceived(frame, on: largeLink, at: .milliseconds(20)) }
        // The greater peer's own dial fails: nothing changes, the link it has serves.
        let failed = largeSide.dialFailed(small, reason: "gave up", at: .milliseconds(30))
        #expect(failed.allSatisfy { if case .event = $0 { return false } else { return true } })
        #expect(smallSide.connectedPeers == [large] && largeSide.connectedPeers == [small])
    }

    /// An app that was shown a peer's invitation and invites that peer instead of answering:
    /// the two invitations crossed, and the tie-break settles them the same way.
    @Test(arguments: [true, false])
    func invitingAPeerWhoseInvitationIsShown(smallerIsShown: Bool) throws {
        var net = try SessionNet(["first", "second"])
        let (small, large) = net.peer(0).fingerprint < net.peer(1).fingerprint ? (0, 1) : (1, 0)
        let (shownTo, inviter) = smallerIsShown ? (small, large) : (large, small)
        let first = try net.invite(inviter, shownTo)
        net.run()
        let shown = try #require(net.invitationsReceived(shownTo).first)
        let second = try net.invite(shownTo, inviter)
        net.run()
        #expect(net.results(inviter) == [first: .accepted])
        #expect(net.results(shownTo) == [second: .accepted])
        #expect(net.events(shownTo).contains(.invitationCancelled(shown.id, from: net.peer(inviter), reason: .crossed)))
        #expect(throws: PeerLinkError.self) { try net.respond(shownTo, shown.id, accept: true) }
        #expect(net.connected(small) == [large] && net.connected(large) == [small])
        #expect(net.notConnectedEvents(small) == 0 && net.notConnectedEvents(large) == 0)
    }

    /// The loser of a crossing cannot accept the winner's invitation (it is in a session with
    /// another member): it declines, and the winner accepts the loser's invitation instead,
    /// joining the loser's session and its other member.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func whenTheLoserCannotMoveTheWinnerJoinsIt(seed: UInt64) throws {
        // Pick three names so that "winner" has the smallest fingerprint.
        var names = ["p", "q", "r"]
        names.sort { sessionPeer($0).fingerprint < sessionPeer($1).fingerprint }
        var net = try SessionNet(names, seed: seed)
        let (winner, loser, member) = (0, 1, 2)
        _ = try net.invite(loser, member)
        try SessionMeshTests.runAcceptingEverything(&net)
        #expect(net.connected(loser) == [member])

        let fromLoser = try net.invite(loser, winner)
        net.run()
        let shown = try #require(net.invitationsReceived(winner).first)
        let fromWinner = try net.invite(winner, loser)
        net.run()
        #expect(net.events(winner).contains(.invitationCancelled(shown.id, from: net.peer(loser), reason: .crossed)))
        #expect(net.events(loser).contains { if case .invitationRefused(_, .declined, _) = $0 { return true } else { return false } })
        #expect(net.results(winner) == [fromWinner: .accepted])
        #expect(net.results(loser)[fromLoser] == .accepted)
        for node in 0..<3 { #expect(net.connected(node) == Set(0..<3).subtracting([node]), "\(node): \(net.connected(node))") }
        #expect(net.machine(winner).sessionID == net.machine(loser).sessionID)
        #expect(net.drops().isEmpty)
    }
}
