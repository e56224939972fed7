import PeerLinkCore
import Testing

@Suite("Session: disconnect and lost links", .ownThread)
struct SessionLivenessTests {
    /// alice invites bob and carol: a mesh of three.
    static func meshOfThree(seed: UInt64 = 1, policy: SessionPolicy = .default) throws -> SessionNet {
        var net = try SessionNet(["alice", "bob", "carol"], policy: policy, seed: seed)
        _ = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        _ = try net.invite(0, 2)
        try SessionMeshTests.runAcceptingEverything(&net)
        for node in 0..<3 { try #require(net.connected(node).count == 2) }
        return net
    }

    static func reason(_ net: SessionNet, _ node: Int, about other: Int) -> String? {
        for event in net.events(node).reversed() {
            if case .peerStateChanged(let peer, .notConnected, let reason) = event, peer == net.peer(other) { return reason }
        }
        return nil
    }

    @Test(arguments: [1, 2, 3] as [UInt64])
    func disconnectLeavesEveryoneElseConnected(seed: UInt64) throws {
        var net = try Self.meshOfThree(seed: seed)
        net.disconnect(0)
        #expect(net.closes.filter { $0.node == 0 }.map(\.code) == [.normal, .normal])
        #expect(net.machine(0).connectedPeers.isEmpty)
        #expect(net.states(0, of: 1).last == .notConnected && net.states(0, of: 2).last == .notConnected)
        net.run()
        for other in [1, 2] {
            #expect(net.connected(other) == Set([1, 2]).subtracting([other]))
            let reason = try #require(Self.reason(net, other, about: 0))
            #expect(reason.contains("code 0"))
            #expect(reason.contains("left the session"))
        }
        #expect(throws: PeerLinkError.self) { try net.send(0, [1], to: [1]) }
        try net.send(1, [7], to: [2])
        net.run()
        #expect(net.received(2).map(\.data) == [[7]])
        // Everything stays quiet.
        net.advance(by: .seconds(30), tickEvery: .seconds(1))
        #expect(net.connected(1) == [2] && net.connected(2) == [1])
    }

    /// Without a reconnect grace (``SessionPolicy/reconnectGrace`` zero) a lost link is a lost
    /// peer at once.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aLostLinkDropsOnlyThatPair(seed: UInt64) throws {
        var net = try Self.meshOfThree(seed: seed, policy: SessionPolicy(reconnectGrace: .zero))
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [2])
        #expect(net.connected(1) == [2])
        #expect(net.connected(2) == [0, 1])
        let reason = try #require(Self.reason(net, 0, about: 1))
        #expect(reason.contains("code 8"))
        #expect(Self.reason(net, 1, about: 0) != nil)
        #expect(net.states(2, of: 0).last == .connected && net.states(2, of: 1).last == .connected)

        // The rest of the session goes on…
        try net.send(0, [1], to: [2])
        try net.send(2, [2], to: [0, 1])
        net.run()
        #expect(net.received(2).map(\.data) == [[1]])
        #expect(net.received(0).map(\.data) == [[2]] && net.received(1).map(\.data) == [[2]])
        // …and alice can bring bob back in.
        let again = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        #expect(net.results(0)[again] == .accepted)
        for node in 0..<3 { #expect(net.connected(node).count == 2) }
    }

    @Test func aDuplicateCloseOnTheLastLinkWaitsForTheReplacement() throws {
        // The peer closes our only link as a duplicate: the replacement is on its way, so the pair
        // stays as it is; if it never comes, the peer is lost after the grace.
        var net = try SessionMessageTests.connectedPair()
        let link = try #require(net.machine(0).allLinks.first)
        net.apply(0, net.nodes[0].machine.linkClosed(link, code: .duplicateLink, reason: "kept the other", at: net.now))
        #expect(net.machine(0).state(of: net.peer(1)) == .connected)
        net.apply(0, net.nodes[0].machine.tick(at: net.now + .seconds(9)))
        #expect(net.machine(0).state(of: net.peer(1)) == .connected)
        net.apply(0, net.nodes[0].machine.tick(at: net.now + .seconds(10)))
        #expect(net.machine(0).state(of: net.peer(1)) == .notConnected)
        #expect(Self.reason(net, 0, about: 1)?.contains("duplicate") == true)
    }

    /// With the reconnect grace (30 s by default), a member whose link failed stays connected:
    /// both sides dial again at once, the new link takes over (``SessionEvent/linkChanged``),
    /// and nobody is told the peer left.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aLostLinkIsReplacedWithinTheGrace(seed: UInt64) throws {
        var net = try Self.meshOfThree(seed: seed)
        net.breakLinks(between: 0, and: 1)
        net.run()
        for node in 0..<3 { #expect(net.connected(node).count == 2, "node \(node): \(net.connected(node))") }
        #expect(!net.states(0, of: 1).contains(.notConnected) && !net.states(1, of: 0).contains(.notConnected))
        #expect(net.liveLinks(between: 0, and: 1) == 1)
        #expect(net.events(0).contains { if case .linkChanged(let peer, _) = $0 { peer == net.peer(1) } else { false } })
        // messages go over the new link
        try net.send(0, [5], to: [1])
        net.run()
        #expect(net.received(1).map(\.data) == [[5]])
    }

    /// A member nobody can reach any more is dialled again every ``SessionPolicy/redialInterval``
    /// and leaves when the grace ends.
    @Test func aMemberUnreachableForTheGraceLeaves() throws {
        var net = try Self.meshOfThree(policy: SessionPolicy(reconnectGrace: .seconds(10), redialInterval: .seconds(2)))
        net.failingDials = [[0, 1], [1, 0]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [1, 2], "still a member during the grace")
        net.advance(by: .seconds(8), tickEvery: .milliseconds(500))
        #expect(net.connected(0) == [1, 2])
        // dialled at once, then every 2 s
        #expect(net.dials.filter { $0 == [0, 1] }.count >= 4, "\(net.dials)")
        net.advance(by: .seconds(3), tickEvery: .milliseconds(500))
        #expect(net.connected(0) == [2])
        #expect(net.connected(1) == [2])
        #expect(net.connected(2) == [0, 1])
        let reason = try #require(Self.reason(net, 0, about: 1))
        #expect(reason.contains("within 10 s"), "\(reason)")
    }

    /// A member whose link failed and whose every endpoint answers that nothing listens there
    /// (its process died) leaves at once, not at the end of the grace.
    @Test func aMemberWhoseProcessDiedLeavesAtOnce() throws {
        var net = try Self.meshOfThree(policy: SessionPolicy(reconnectGrace: .seconds(30), redialInterval: .seconds(2)))
        net.failingDials = [[0, 1], [1, 0]]
        net.refusedDials = [[0, 1]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [2], "node 0 found nothing listening at node 1's address")
        let reason = try #require(Self.reason(net, 0, about: 1))
        #expect(reason.contains("nothing listens"), "\(reason)")
        // node 1's dials fail otherwise (unreachable): it waits for the grace
        #expect(net.connected(1) == [0, 2])
    }

    /// The endpoints of each dial to `peer` among `actions`.
    static func dials(in actions: [SessionAction], to peer: PeerID) -> [[Endpoint]] {
        actions.compactMap { action in
            if case .dial(peer, let endpoints) = action { return endpoints }
            return nil
        }
    }

    /// alice and bob, members of one session over a slow transport (`slow`, bob's endpoint);
    /// alice then finds bob on the LAN too (`lan`) and dials him there (an upgrade), and that
    /// dial is still out: the test answers it.
    static func pairWithAnUpgradeDialOut() throws -> (net: SessionNet, lan: Endpoint, slow: Endpoint) {
        let policy = SessionPolicy(reconnectGrace: .seconds(30), redialInterval: .seconds(2))
        var net = try SessionNet(["alice", "bob"], policy: policy)
        let slow = Endpoint.unranked("bob")
        let lan = Endpoint.tcp(host: "127.0.0.1", port: 4100)
        net.apply(0, net.nodes[0].machine.peerFound(net.peer(1), endpoints: [slow], at: net.now))
        _ = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        try #require(net.connected(0) == [1] && net.connected(1) == [0])

        net.apply(0, net.nodes[0].machine.peerUpdated(net.peer(1), endpoints: [lan, slow], at: net.now))
        net.now += policy.automaticFallback + .seconds(1)
        let actions = net.nodes[0].machine.tick(at: net.now)
        try #require(dials(in: actions, to: net.peer(1)) == [[lan]], "\(actions)")
        net.apply(0, actions.filter { if case .dial = $0 { false } else { true } })
        return (net, lan, slow)
    }

    /// A member whose link fails while an upgrade dial to it is out (a better transport was
    /// found): that dial tries the better transport only, so when it fails — even refused, the
    /// better transport's listener gone — the member is dialled at once on every transport it
    /// has, and stays in the session.
    @Test(arguments: [false, true])
    func aLinkLostDuringAnUpgradeDialIsRedialledEverywhere(refused: Bool) throws {
        // alice's upgrade dial to bob is out...
        var (net, lan, slow) = try Self.pairWithAnUpgradeDialOut()

        // ...when their link fails; bob cannot dial back
        net.failingDials = [[1, 0]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [1], "a member in its grace")
        #expect(net.nodes[0].machine.isReconnecting(net.peer(1)))

        // the upgrade dial fails: bob is dialled again on every transport, and comes back
        let redial = net.nodes[0].machine.dialFailed(net.peer(1), reason: "the LAN is down", refused: refused, at: net.now)
        #expect(Self.dials(in: redial, to: net.peer(1)) == [[lan, slow]], "\(redial)")
        net.apply(0, redial)
        net.run()
        #expect(net.liveLinks(between: 0, and: 1) == 1)
        #expect(net.connected(0) == [1] && net.connected(1) == [0])
        #expect(net.notConnectedEvents(0) == 0 && net.notConnectedEvents(1) == 0, "\(String(describing: Self.reason(net, 0, about: 1)))")
        #expect(!net.nodes[0].machine.isReconnecting(net.peer(1)))
    }

    /// A member whose last link the peer closed as a duplicate (the peer kept another one, still
    /// in its handshake on this side) while an upgrade dial to it is out: when that dial fails,
    /// the member still waits for the kept link, which arrives and carries the pair on.
    @Test func aDuplicateCloseDuringAFailedUpgradeDialWaitsForTheKeptLink() throws {
        // alice's upgrade dial to bob is out...
        var (net, _, _) = try Self.pairWithAnUpgradeDialOut()

        // ...when their link is closed as a duplicate (bob kept another one), and the upgrade
        // dial fails (its handshake cut short)
        net.breakLinks(between: 0, and: 1, code: .duplicateLink)
        net.run()
        net.apply(0, net.nodes[0].machine.dialFailed(net.peer(1), reason: "handshake cut short", at: net.now))
        #expect(net.connected(0) == [1], "\(String(describing: Self.reason(net, 0, about: 1)))")

        // the kept link arrives
        net.openLink(from: 1, to: 0)
        net.run()
        #expect(net.liveLinks(between: 0, and: 1) == 1)
        #expect(net.connected(0) == [1] && net.connected(1) == [0])
        #expect(net.notConnectedEvents(0) == 0 && net.notConnectedEvents(1) == 0, "\(String(describing: Self.reason(net, 0, about: 1)))")
        try net.send(0, [1, 2, 3], to: [1])
        net.run()
        #expect(net.received(1).last?.data == [1, 2, 3])
    }

    /// The app invites a peer whose previous run left: the link of the new run names another
    /// incarnation, and the invitation goes on with that run (it never went to the old one).
    @Test(arguments: [1, 2, 3] as [UInt64])
    func anInvitationToARestartedPeerReachesTheNewRun(seed: UInt64) throws {
        var net = try SessionNet(["alice", "bob"], seed: seed)
        net.incarnations = [0: .random(), 1: .random()]
        _ = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        try #require(net.connected(0) == [1])
        try net.restart(1, policy: .default)
        net.run()
        #expect(net.connected(0).isEmpty)
        let again = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        #expect(net.results(0)[again] == .accepted, "\(net.results(0))")
        #expect(net.connected(0) == [1] && net.connected(1) == [0])
    }

    /// A member that restarted and came back by its own dial, whose link is lost before
    /// discovery saw its new endpoints: nothing listening at the old run's endpoints says
    /// nothing about the new run, so it is waited for (and comes back) instead of leaving. Once
    /// discovery gives endpoints seen after the new run, a refusal there ends it at once again.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aRefusalAtAnEarlierRunsEndpointsDoesNotEndARestartedMember(seed: UInt64) throws {
        let policy = SessionPolicy(reconnectGrace: .seconds(30), redialInterval: .seconds(2))
        var net = try SessionNet(["alice", "bob", "carol"], policy: policy, seed: seed)
        net.incarnations = [0: .random(), 1: .random(), 2: .random()]
        let oldRun = Endpoint.unranked("bob-run-1")
        net.apply(0, net.nodes[0].machine.peerFound(net.peer(1), endpoints: [oldRun], at: net.now))
        _ = try net.invite(0, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        _ = try net.invite(0, 2)
        try SessionMeshTests.runAcceptingEverything(&net)
        try #require(net.connected(0) == [1, 2])

        // bob restarts (another incarnation); carol invites him and he joins alice by his own
        // dial: she never dials the new run
        try net.restart(1, policy: policy)
        net.run()
        _ = try net.invite(2, 1)
        try SessionMeshTests.runAcceptingEverything(&net)
        try #require(net.connected(0) == [1, 2] && net.connected(1) == [0, 2], "\(net.connected(0)) \(net.connected(1)) \(net.connected(2))")
        let leavesBefore = net.notConnectedEvents(0)

        // the cut: alice dials the old run's port (refused), bob's dials fail until it heals
        net.failingDials = [[0, 1], [1, 0]]
        net.refusedDials = [[0, 1]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [1, 2], "a refusal at the earlier run's endpoints does not end the new run")
        net.advance(by: .seconds(5), tickEvery: .milliseconds(500))
        #expect(net.connected(0) == [1, 2])
        net.failingDials = [[0, 1]]
        net.advance(by: .seconds(5), tickEvery: .milliseconds(500))
        #expect(net.liveLinks(between: 0, and: 1) == 1, "bob's dial brought the pair back")
        #expect(net.connected(0) == [1, 2] && net.connected(1) == [0, 2])
        #expect(net.notConnectedEvents(0) == leavesBefore, "\(String(describing: Self.reason(net, 0, about: 1)))")

        // discovery sees the new run's endpoints: a refusal there is the new run gone
        net.apply(0, net.nodes[0].machine.peerUpdated(net.peer(1), endpoints: [.unranked("bob-run-2")], at: net.now))
        net.failingDials = [[0, 1], [1, 0]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [2])
        let reason = try #require(Self.reason(net, 0, about: 1))
        #expect(reason.contains("nothing listens"), "\(reason)")
    }

    /// A full session whose member lost its link gives that member's place to a peer that is
    /// here and asks for it, rather than refusing it for the whole grace: peers that join and
    /// drop their links at once cannot keep newcomers out.
    @Test func anAbsentMemberGivesItsPlaceToAPeerThatIsHere() throws {
        let policy = SessionPolicy(maximumPeers: 3, automatic: true, reconnectGrace: .seconds(30), redialInterval: .seconds(2))
        var net = try SessionNet(["alice", "bob", "carol", "dave"], policy: policy, seed: 7)
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            net.found(a, b)
            net.found(b, a)
        }
        net.run()
        net.advance(by: .seconds(12), tickEvery: .milliseconds(250))
        #expect(net.connected(0) == [1, 2])
        net.failingDials = [[0, 1], [1, 0]]
        net.breakLinks(between: 0, and: 1)
        net.run()
        #expect(net.connected(0) == [1, 2], "bob is waited for")
        net.found(0, 3)
        net.found(3, 0)
        net.run()
        net.advance(by: .seconds(12), tickEvery: .milliseconds(250))
        #expect(net.connected(0) == [2, 3], "dave took bob's place")
        let reason = try #require(Self.reason(net, 0, about: 1))
        #expect(reason.contains("its place went to dave"), "\(reason)")
    }

    /// A peer that left on purpose (`GO_AWAY` 0) is not waited for.
    @Test func aPeerThatLeftIsNotWaitedFor() throws {
        var net = try Self.meshOfThree()
        net.breakLinks(between: 0, and: 1, code: .normal)
        net.run()
        #expect(net.connected(0) == [2])
    }
}
