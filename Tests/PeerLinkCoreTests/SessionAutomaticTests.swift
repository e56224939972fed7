import PeerLinkCore
import Testing

@Suite("Session: automatic mode converges to one full mesh", .ownThread)
struct SessionAutomaticTests {
    static let automatic = SessionPolicy(automatic: true)
    static let names = (1...9).map { "peer\($0)" }

    @Test(arguments: Array(1...12) as [UInt64])
    func eightPeersStartedAtOnceFormOneFullMeshAndStayInIt(seed: UInt64) throws {
        var net = try SessionNet(Array(Self.names.prefix(8)), policy: Self.automatic, seed: seed)
        net.discoverEveryone()
        net.run()

        for node in net.nodes.indices {
            #expect(net.connected(node) == Set(net.nodes.indices).subtracting([node]), "peer \(node): \(net.connected(node))")
            #expect(net.notConnectedEvents(node) == 0, "peer \(node) reported a peer not connected while converging")
            #expect(net.machine(node).sessionID == .automatic(for: sessionTestService))
            for other in net.nodes.indices where other > node {
                #expect(net.liveLinks(between: node, and: other) == 1, "peers \(node) and \(other) keep exactly one link")
            }
        }
        #expect(net.now < .seconds(10), "converged in \(net.now) of virtual time")

        // 30 s more, the owners ticking every second: nothing changes.
        let eventCounts = net.nodes.map(\.events.count)
        net.advance(by: .seconds(30), tickEvery: .seconds(1))
        for node in net.nodes.indices {
            #expect(net.connected(node).count == 7)
            #expect(net.notConnectedEvents(node) == 0)
            #expect(net.nodes[node].events.count == eventCounts[node], "peer \(node) reported something during the quiet 30 s")
        }
        #expect(net.drops().isEmpty)
    }

    /// A dial that fails (the peer is not listening yet) is tried again within seconds, not after
    /// the 30 s a declined or unanswered invitation waits.
    @Test func aFailedDialIsRetriedSoon() throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 3)
        net.failingDials = [[0, 1], [1, 0]]
        net.discoverEveryone()
        net.run()
        #expect(net.connected(0).isEmpty)
        net.failingDials = []
        net.advance(by: SessionPolicy.automaticRetryAfterFailure + .milliseconds(500), tickEvery: .milliseconds(250))
        net.run()
        #expect(net.connected(0) == [1] && net.connected(1) == [0])
    }

    /// A peer that stays unreachable (an address given by hand that is down, a peer whose
    /// record outlived it) is invited less and less often: the wait doubles after each failure,
    /// up to the invitation timeout, and it connects within that once it is back.
    @Test func repeatedFailuresBackOff() throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 5)
        net.failingDials = [[0, 1], [1, 0]]
        net.discoverEveryone()
        net.run()
        net.advance(by: .seconds(120), tickEvery: .milliseconds(250))
        net.run()
        // Every 2 s that would be about 60 dials each way; doubling to 30 s is 2+4+8+16+30+30+30.
        let fromAnn = net.dials.filter { $0 == [0, 1] }.count
        let fromBob = net.dials.filter { $0 == [1, 0] }.count
        #expect((1...10).contains(fromAnn), "ann dialled bob \(fromAnn) times in 120 s")
        #expect(fromBob <= 10, "bob dialled ann \(fromBob) times in 120 s")
        #expect(net.connected(0).isEmpty)
        net.failingDials = []
        net.advance(by: Self.automatic.invitationTimeout + .seconds(1), tickEvery: .milliseconds(250))
        net.run()
        #expect(net.connected(0) == [1] && net.connected(1) == [0])
        #expect(SessionPolicy.automaticRetryDelay(afterFailures: 1, invitationTimeout: .seconds(30)) == .seconds(2))
        #expect(SessionPolicy.automaticRetryDelay(afterFailures: 3, invitationTimeout: .seconds(30)) == .seconds(8))
        #expect(SessionPolicy.automaticRetryDelay(afterFailures: 100, invitationTimeout: .seconds(30)) == .seconds(30))
    }

    /// The smaller peer of a pair invites, but when its dials never get through (a firewall one
    /// way, a Bluetooth device that refuses its pairing), the greater one invites it after
    /// ``SessionPolicy/automaticFallback`` — and not before.
    @Test func theGreaterPeerInvitesWhenTheSmallerNeverComes() throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 11)
        let smaller = net.peer(0).fingerprint < net.peer(1).fingerprint ? 0 : 1
        let greater = 1 - smaller
        net.failingDials = [[smaller, greater]]
        net.discoverEveryone()
        net.run()
        net.advance(by: Self.automatic.automaticFallback - .seconds(1), tickEvery: .milliseconds(250))
        net.run()
        #expect(net.connected(greater).isEmpty, "the greater peer must leave the first move to the smaller one")
        net.advance(by: .seconds(2), tickEvery: .milliseconds(250))
        net.run()
        #expect(net.connected(greater) == [smaller] && net.connected(smaller) == [greater])
        #expect(net.liveLinks(between: 0, and: 1) == 1)
    }

    /// A peer that leaves on purpose (GO_AWAY code 0) is not dialled again by the peer that stays.
    @Test(arguments: [0, 1])
    func aPeerThatLeftIsNotCalledBackUntilFoundAgain(leaver: Int) throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 7)
        net.discoverEveryone()
        net.run()
        try #require(net.connected(0) == [1])
        net.disconnect(leaver)
        net.run()
        let stayer = 1 - leaver
        let connectionsAfterLeaving = net.connections.count
        net.advance(by: .seconds(30), tickEvery: .seconds(1))
        #expect(net.connections.count == connectionsAfterLeaving, "the remaining peer dialled the peer that left")
        #expect(net.connected(stayer).isEmpty)
    }

    /// A peer that left is called back once discovery finds it at another endpoint of the same
    /// transport, without losing it first: a new run of it (a restarted chat) listens elsewhere.
    /// Whichever of the pair restarts, they are together again well before the fallback (10 s)
    /// would bring them.
    @Test(arguments: [0, 1])
    func aPeerThatLeftIsCalledBackWhenFoundAtAnotherPort(leaver: Int) throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 7)
        net.incarnations = [0: .random(), 1: .random()]
        let stayer = 1 - leaver
        net.apply(stayer, net.nodes[stayer].machine.peerFound(net.peer(leaver), endpoints: [.unranked("leaver-run-1")], at: net.now))
        net.apply(leaver, net.nodes[leaver].machine.peerFound(net.peer(stayer), endpoints: [.unranked("stayer")], at: net.now))
        net.run()
        net.advance(by: .seconds(12), tickEvery: .seconds(1))
        try #require(net.connected(stayer) == [leaver])
        // (the smaller of the two invites at once when it is the one restarted; the greater
        // would wait for the fallback)
        try net.restart(leaver, policy: Self.automatic, rediscovered: false)
        net.run()
        net.apply(stayer, net.nodes[stayer].machine.peerUpdated(net.peer(leaver), endpoints: [.unranked("leaver-run-2")], at: net.now))
        net.run()
        net.advance(by: .seconds(3), tickEvery: .seconds(1))
        #expect(net.connected(stayer) == [leaver] && net.connected(leaver) == [stayer])
    }

    /// Found on another transport as well (an endpoint added, none replaced) is not a new run:
    /// a peer that left stays left.
    @Test func aPeerThatLeftIsNotCalledBackForAnAddedTransport() throws {
        var net = try SessionNet(["ann", "bob"], policy: Self.automatic, seed: 7)
        let lan = Endpoint.unranked("bob")
        net.apply(0, net.nodes[0].machine.peerFound(net.peer(1), endpoints: [lan], at: net.now))
        net.apply(1, net.nodes[1].machine.peerFound(net.peer(0), at: net.now))
        net.run()
        net.advance(by: .seconds(12), tickEvery: .seconds(1))
        try #require(net.connected(0) == [1])
        net.disconnect(1)
        net.run()
        let connectionsAfterLeaving = net.connections.count
        let other = Endpoint.unranked("bob", kind: "other")
        net.apply(0, net.nodes[0].machine.peerUpdated(net.peer(1), endpoints: [lan, other], at: net.now))
        net.advance(by: .seconds(30), tickEvery: .seconds(1))
        #expect(net.connections.count == connectionsAfterLeaving, "the remaining peer dialled the peer that left")
    }

    /// Over all seeds the simulation did make both peers of a pair dial each other at once (the
    /// duplicate-link tie-break ran), so convergence above is not luck of a gentle order.
    @Test func theConvergenceRunsDoExerciseDuplicateLinks() throws {
        var duplicates = 0
        for seed in 1...12 as ClosedRange<UInt64> {
            var net = try SessionNet(Array(Self.names.prefix(8)), policy: Self.automatic, seed: seed)
            net.discoverEveryone()
            net.run()
            duplicates += net.closes.filter { $0.code == .duplicateLink }.count
            #expect(net.closes.allSatisfy { $0.code == .duplicateLink }, "no other link was ever closed")
        }
        #expect(duplicates > 0)
    }

    /// Nine automatic peers, eight places per session: nobody exceeds 7 connected peers, every
    /// connection is mutual, nobody connected is ever dropped, somebody is refused with
    /// *session full*, and the result is maximal — two peers that are not connected cannot both
    /// have room. Since 9 × 7 is odd, at least one peer ends with fewer than 7.
    @Test(arguments: Array(1...12) as [UInt64])
    func ninePeersNeverOverfillAndTheOddOneOutIsRefused(seed: UInt64) throws {
        var net = try SessionNet(Self.names, policy: Self.automatic, seed: seed)
        net.discoverEveryone()
        net.run()
        net.advance(by: .seconds(120), tickEvery: .seconds(1))

        let counts = net.nodes.indices.map { net.connected($0).count }
        for node in net.nodes.indices {
            #expect(counts[node] <= 7)
            for other in net.connected(node) { #expect(net.connected(other).contains(node), "\(node)–\(other) is not mutual") }
            for other in net.nodes.indices where other > node && !net.connected(node).contains(other) {
                #expect(counts[node] == 7 || counts[other] == 7, "\(node) (\(counts[node])) and \(other) (\(counts[other])) both have room")
            }
        }
        #expect(counts.contains { $0 < 7 })
        let refusedFull =
            net.controlLog.contains { if case .decline(_, .sessionFull) = $0.message { return true } else { return false } }
            || net.closes.contains { $0.code == .sessionFull }
        #expect(refusedFull)
        #expect(net.drops().isEmpty, "drops: \(net.drops())")

        // And it stays that way.
        let before = net.nodes.indices.map(net.connected)
        net.advance(by: .seconds(60), tickEvery: .seconds(1))
        #expect(net.nodes.indices.map(net.connected) == before)
        #expect(net.drops().isEmpty)
    }

    @Test func automaticPeersInviteOnlyGreaterFingerprints() throws {
        var net = try SessionNet(["x", "y"], policy: Self.automatic)
        let (small, large) = net.peer(0).fingerprint < net.peer(1).fingerprint ? (0, 1) : (1, 0)
        net.found(large, small)
        net.run()
        #expect(net.connections.isEmpty, "the greater fingerprint never dials the smaller")
        net.found(small, large)
        net.run()
        #expect(net.connected(small) == [large])
        #expect(net.connected(large) == [small])
        #expect(net.invitationsReceived(large).isEmpty, "automatic invitations are accepted without asking")
        #expect(net.results(small).isEmpty, "automatic invitations report no result")
    }

    /// A peer whose process restarts again and again (a new incarnation each time) is a member
    /// on both sides each time, and what it sends arrives (found by the soak test: the second
    /// restart's invitation was answered from the record of the first one's).
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aPeerRestartedAgainAndAgainIsAMemberOnBothSides(seed: UInt64) throws {
        var net = try SessionNet(["ann", "bob", "cid"], policy: Self.automatic, seed: seed)
        for node in net.nodes.indices { net.incarnations[node] = .random() }
        net.discoverEveryone()
        net.run()
        for round in 1...3 {
            for node in net.nodes.indices {
                try net.restart(node, policy: Self.automatic)
                net.run()
                net.advance(by: .seconds(5), tickEvery: .milliseconds(250))
                net.run()
                let others = Set(net.nodes.indices).subtracting([node])
                #expect(net.connected(node) == others, "round \(round), node \(node) restarted: it sees \(net.connected(node))")
                for other in others {
                    #expect(net.connected(other).contains(node), "round \(round): node \(other) does not see node \(node) restarted")
                }
                let text = Array("round \(round) from \(node)".utf8)
                try net.send(node, text, to: Array(others))
                net.run()
                for other in others {
                    #expect(
                        net.received(other).contains { $0.from == node && $0.data == text },
                        "round \(round): node \(other) did not get the message of node \(node) restarted")
                }
            }
        }
    }
}
