import PeerLinkCore
import Testing

@Suite("Session: full mesh through MEMBERS and JOIN, and the limit of 8 peers", .ownThread)
struct SessionMeshTests {
    /// Accepts every invitation shown to any node's app, until nothing is left to do.
    static func runAcceptingEverything(_ net: inout SessionNet) throws {
        while true {
            net.run()
            var acted = false
            for node in net.nodes.indices {
                for waiting in net.machine(node).invitationsAwaitingAnswer {
                    try net.respond(node, waiting, accept: true)
                    acted = true
                }
            }
            if !acted { return }
        }
    }

    @Test(arguments: Array(1...8) as [UInt64])
    func aThirdPeerJoinsEveryMember(seed: UInt64) throws {
        var net = try SessionNet(["alice", "bob", "carol"], seed: seed)
        let toBob = try net.invite(0, 1)
        try Self.runAcceptingEverything(&net)
        let toCarol = try net.invite(0, 2)
        try Self.runAcceptingEverything(&net)

        #expect(net.results(0) == [toBob: .accepted, toCarol: .accepted])
        for node in 0..<3 { #expect(net.connected(node) == Set(0..<3).subtracting([node])) }
        // Bob and carol were never asked about each other: carol joined bob.
        #expect(net.invitationsReceived(1).count == 1 && net.invitationsReceived(2).count == 1)
        let session = net.machine(0).sessionID
        #expect(net.machine(1).sessionID == session && net.machine(2).sessionID == session)
        let roster = ControlMessage.members(session: session, members: [Self.member(net.peer(1))])
        let announcement = ControlMessage.members(session: session, members: [Self.member(net.peer(2))])
        #expect(net.controlLog.contains { $0.from == 0 && $0.to == 2 && $0.message == roster })
        #expect(net.controlLog.contains { $0.from == 0 && $0.to == 1 && $0.message == announcement })
        #expect(net.controlLog.contains { $0.from == 2 && $0.to == 1 && $0.message == .join(session: session) })
        #expect(
            net.controlLog.contains { $0.from == 1 && $0.to == 2 && $0.message == .join(session: session) },
            "bob answers carol's JOIN with his own")
        #expect(net.states(1, of: 2) == [.connecting, .connected], "bob saw carol announced, then joined")
        #expect(net.states(2, of: 1) == [.connecting, .connected])
        #expect(net.liveLinks(between: 1, and: 2) == 1)
        #expect(net.drops().isEmpty && (0..<3).allSatisfy { net.notConnectedEvents($0) == 0 })

        // The mesh carries messages between the two who were never invited to each other.
        try net.send(2, Array("hi bob".utf8), to: [1])
        net.run()
        #expect(net.received(1).map(\.data) == [Array("hi bob".utf8)])
    }

    static func member(_ peer: PeerID) -> ControlMessage.Member {
        ControlMessage.Member(fingerprint: peer.fingerprint, displayName: try! DisplayName(peer.displayName))
    }

    @Test(arguments: [1, 2, 3] as [UInt64])
    func aHostInvitingSevenAtOnceGetsEightPeersFullyMeshed(seed: UInt64) throws {
        var net = try SessionNet((0..<9).map { "guest\($0)" }, seed: seed)
        var invitations: [InvitationID] = []
        for guest in 1...7 { invitations.append(try net.invite(0, guest)) }
        try Self.runAcceptingEverything(&net)
        #expect(Set(net.results(0).values) == [.accepted])
        for node in 0...7 { #expect(net.connected(node) == Set(0...7).subtracting([node]), "\(node): \(net.connected(node))") }
        #expect(net.drops().isEmpty)

        // The ninth: the host cannot invite it…
        let error = #expect(throws: PeerLinkError.self) { try net.invite(0, 8) }
        #expect(error?.code == .unavailable)
        #expect(error?.message.contains("session is full") == true)
        #expect(error?.message.contains("8 peers") == true)
        // …and its own invitations to the host or to a member are declined "session full".
        let toHost = try net.invite(8, 0)
        let toMember = try net.invite(8, 3)
        net.run()
        #expect(net.results(8) == [toHost: .sessionFull, toMember: .sessionFull])
        #expect(net.invitationsReceived(0).isEmpty && net.invitationsReceived(3).count == 1, "members' apps are not asked")
        #expect(net.events(0).contains { if case .invitationRefused(_, .sessionFull, _) = $0 { return true } else { return false } })
        #expect(net.connected(8).isEmpty)
        for node in 0...7 { #expect(net.connected(node).count == 7) }
    }

    @Test func aJoinIntoAFullSessionClosesTheLinkWithSessionFull() throws {
        var net = try SessionNet(["host", "a", "b", "late"], policy: SessionPolicy(maximumPeers: 3))
        _ = try net.invite(0, 1)
        _ = try net.invite(0, 2)
        try Self.runAcceptingEverything(&net)
        #expect(net.connected(0) == [1, 2])
        #expect(throws: PeerLinkError.self) { try net.invite(0, 3) }

        // "late" opens a link to the host and asks to JOIN its session.
        net.openLink(from: 3, to: 0)
        net.run()
        let link = try #require(net.machine(0).links(to: net.peer(3)).first)
        let actions = net.nodes[0].machine.frameReceived(.control(.join(session: net.machine(0).sessionID)), on: link, at: net.now)
        #expect(actions.contains { if case .closeLink(link, .sessionFull, _) = $0 { return true } else { return false } })
        #expect(net.machine(0).connectedPeers.count == 2)
    }

    /// A member whose own limit is smaller than the inviter's refuses the newcomer's JOIN: the
    /// newcomer is told (a diagnostic), and stays connected to the inviter.
    @Test func aMemberWithoutRoomRefusesTheJoin() throws {
        var net = try SessionNet(["host", "solo", "newcomer"], policies: [1: SessionPolicy(maximumPeers: 2)])
        _ = try net.invite(0, 1)
        try Self.runAcceptingEverything(&net)
        _ = try net.invite(0, 2)
        try Self.runAcceptingEverything(&net)
        #expect(net.connected(0) == [1, 2])
        #expect(net.connected(1) == [0])
        #expect(net.connected(2) == [0])
        #expect(net.closes.contains { $0.node == 1 && $0.peer == 2 && $0.code == .sessionFull })
        #expect(net.events(2).contains { if case .joinRefused(net.peer(1), .sessionFull, _) = $0 { return true } else { return false } })
        #expect(net.states(2, of: 1) == [.connecting, .notConnected])
        #expect(net.drops().isEmpty)
    }

    @Test func aJoinFromAPeerNobodyAnnouncedWaitsThenIsRefused() throws {
        var net = try SessionNet(["host", "stranger"], policy: SessionPolicy(joinTimeout: .seconds(5)))
        net.openLink(from: 1, to: 0)
        net.run()
        let link = try #require(net.machine(0).links(to: net.peer(1)).first)
        net.apply(0, net.nodes[0].machine.frameReceived(.control(.join(session: net.machine(0).sessionID)), on: link, at: net.now))
        #expect(net.machine(0).state(of: net.peer(1)) == .connecting, "waits for a member's announcement")
        net.advance(by: .seconds(6))
        #expect(net.closes.contains { $0.node == 0 && $0.code == .protocolError })
        #expect(net.connected(0).isEmpty)

        // A JOIN for another session is refused at once.
        net.openLink(from: 1, to: 0)
        net.run()
        let second = try #require(net.machine(0).links(to: net.peer(1)).first)
        let actions = net.nodes[0].machine.frameReceived(
            .control(.join(session: SessionID(bytes: [UInt8](repeating: 0xEE, count: 16))!)), on: second, at: net.now)
        #expect(actions.contains { if case .closeLink(second, .protocolError, _) = $0 { return true } else { return false } })
    }

    /// A member's `JOIN` on a link of its own is answered (it joins again on a new link), but
    /// one for another session is a protocol error, as from anybody else.
    @Test func aMembersJoinForAnotherSessionClosesItsLink() throws {
        var net = try SessionNet(["host", "member"])
        _ = try net.invite(0, 1)
        try Self.runAcceptingEverything(&net)
        #expect(net.connected(0) == [1])
        let link = try #require(net.machine(0).links(to: net.peer(1)).first)
        let again = net.nodes[0].machine.frameReceived(.control(.join(session: net.machine(0).sessionID)), on: link, at: net.now)
        #expect(!again.contains { if case .closeLink = $0 { return true } else { return false } })
        let other = net.nodes[0].machine.frameReceived(
            .control(.join(session: SessionID(bytes: [UInt8](repeating: 0xEE, count: 16))!)), on: link, at: net.now)
        #expect(other.contains { if case .closeLink(link, .protocolError, _) = $0 { return true } else { return false } })
    }

    @Test func invitationsIntoAnotherSessionAreRefusedWhileInOne() throws {
        var net = try SessionNet(["a", "b", "c", "d"])
        _ = try net.invite(0, 1)
        _ = try net.invite(2, 3)
        try Self.runAcceptingEverything(&net)
        #expect(net.connected(0) == [1] && net.connected(2) == [3])
        let crossSession = try net.invite(0, 2)
        net.run()
        #expect(net.results(0)[crossSession] == .declined)
        #expect(net.events(2).contains { if case .invitationRefused(_, .declined, _) = $0 { return true } else { return false } })
        #expect(net.connected(2) == [3])
    }
}
