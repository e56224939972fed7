import Foundation
import PeerLink
import PeerLinkTestSupport
import Testing

/// PeerNode over in-memory transports: modules started and reported, discovery merged by
/// identity across transports and ranked, the session fed and its events forwarded, trust on
/// first use, admission, invite by name, explicit endpoints, and publishing later. Time is a
/// manual clock: nothing here waits for a session timeout.
@Suite("PeerNode over in-memory transports", .timeLimit(.minutes(1)))
struct PeerNodeTests {
    @Test("two automatic nodes find each other, connect, and the node forwards every session event, then judges the peer")
    func twoNodesMeet() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let ana = try TestNode.make("ana", network: network, automatic: true, clock: clock)
        let bo = try TestNode.make("bo", network: network, automatic: true, clock: clock)
        #expect(ana.node.runningModules == ["memory"])
        #expect(ana.node.notices.map(\.description) == [
            "memory: listening at memory://ana-memory", "memory: advertising in memory at memory://ana-memory",
        ])
        try await withRunning([ana, bo]) {
            try await ana.log.wait("Ana meets Bo") { $0.verdict(for: bo.peer) != nil }
            try await bo.log.wait("Bo meets Ana") { $0.verdict(for: ana.peer) != nil }
            #expect(ana.log.events.verdict(for: bo.peer) == .new)
            // The connected report comes first, then the verdict with the link's code.
            let events = ana.log.events
            let connectedAt = try #require(events.firstIndex {
                if case .session(.peerStateChanged(bo.peer, .connected, _)) = $0 { true } else { false }
            })
            let metAt = try #require(events.firstIndex { if case .met = $0 { true } else { false } })
            #expect(connectedAt < metAt)
            guard case .met(_, _, let code?) = events[metAt] else { throw NodeWaitTimedOut() }
            guard case .met(_, _, let boCode?) = try #require(bo.log.events.first(where: { if case .met = $0 { true } else { false } })) else {
                throw NodeWaitTimedOut()
            }
            #expect(code == boCode, "both sides read the same verification code")
            #expect(events.notices.contains { if case .browsing = $0.what { true } else { false } })

            // Messages go through the node's session; they arrive as forwarded session events.
            try await ana.node.session.send(Array("hi".utf8), to: [bo.peer])
            try await bo.log.wait("Bo receives the message") { events in
                events.sessionEvents.contains { if case .message(ana.peer, Array("hi".utf8), true) = $0 { true } else { false } }
            }
            let status = await ana.node.status(of: bo.peer)
            #expect(status.link?.transport == "memory")
            #expect(status.endpoints == [.memory(name: "bo-memory")])
            #expect(status.transports == [.memory])
            #expect(await ana.node.connectedPeerStatuses().map(\.peer) == [bo.peer])
        }
    }

    @Test("a peer on two transports is one peer with every endpoint, best first; it is reached on the preferred one", arguments: [
        ["fast", "slow"], ["slow", "fast"],
    ] as [[TransportKind]])
    func onePeerOnTwoTransportsReachedOnThePreferredOne(_ order: [TransportKind]) async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let ranking = TransportRanking(order)
        let ana = try TestNode.make("ana", network: network, kinds: ["slow", "fast"], ranking: ranking, clock: clock)
        let bo = try TestNode.make("bo", network: network, kinds: ["slow", "fast"], ranking: ranking, clock: clock)
        let answering = bo.answerInvitations(accept: true)
        defer { answering.cancel() }
        try await withRunning([ana, bo]) {
            try await ana.log.wait("Ana finds Bo on both transports") { $0.discovered(bo.peer)?.endpoints.count == 2 }
            let merged = try #require(ana.node.discoveredPeers.first { $0.id == bo.peer })
            #expect(merged.endpoints == order.map { Endpoint.memory(name: "bo-\($0)", kind: $0) })
            #expect(merged.transports == order)
            #expect(ana.node.discoveredPeers.count == 1, "one peer, not one per transport")

            _ = try await ana.node.session.invite(bo.peer)
            try await ana.log.wait("Ana connected to Bo") { $0.connected(bo.peer) }
            let status = await ana.node.status(of: bo.peer)
            #expect(status.transportInUse == order[0], "dialled on the preferred transport")
            #expect(status.transports == order)
        }
    }

    @Test("a transport that cannot run is reported and the node goes on with the others")
    func aTransportThatCannotRunIsReported() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let noRadio = PeerLinkError(.unavailable, "this machine has no radio: plug one in")
        let ana = try TestNode.make(
            "ana", network: network,
            modules: [
                MemoryTransportModule(network: network, listenerName: "ana-radio", kind: "radio", faults: .init(links: noRadio)),
                MemoryTransportModule(network: network, listenerName: "ana-memory"),
            ], automatic: true, clock: clock)
        let bo = try TestNode.make("bo", network: network, automatic: true, clock: clock)
        #expect(ana.node.runningModules == ["memory"])
        let problem = try #require(ana.node.notices.first { $0.module == "radio" })
        guard case .unavailable(.links, let error) = problem.what else { throw NodeWaitTimedOut() }
        #expect(error == noRadio)
        try await withRunning([ana, bo]) {
            try await ana.log.wait("the problem is an event too") { $0.notices.contains { $0.module == "radio" } }
            try await ana.log.wait("Ana still meets Bo") { $0.connected(bo.peer) }

            // An endpoint of the transport that does not run: the error says why.
            let refused = await #expect(throws: PeerLinkError.self) {
                try await ana.node.connect(to: .memory(name: "bo-radio", kind: "radio"))
            }
            #expect(refused?.code == .unsupported)
            #expect(refused?.message.contains("its transport (radio) does not run here: this machine has no radio") == true, "\(String(describing: refused))")
            let unknown = await #expect(throws: PeerLinkError.self) { try await ana.node.connect(to: .memory(name: "x", kind: "pigeon")) }
            #expect(unknown?.message.contains("no transport of this node makes pigeon links (it runs memory)") == true, "\(String(describing: unknown))")
        }
    }

    @Test("no transport can run: making the node fails, naming each transport's reason")
    func noTransportCanRun() throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let modules: [any TransportModule] = [
            MemoryTransportModule(network: network, listenerName: "a", kind: "radio", faults: .init(links: PeerLinkError(.unsupported, "no radio"))),
            MemoryTransportModule(network: network, listenerName: "b", kind: "wire", faults: .init(links: PeerLinkError(.unavailable, "no wire"))),
        ]
        let both = #expect(throws: PeerLinkError.self) { try TestNode.make("ana", network: network, modules: modules, clock: clock) }
        #expect(both?.code == .unavailable)
        #expect(both?.message == "no transport can run here — radio: no radio; wire: no wire")
        let one = #expect(throws: PeerLinkError.self) { try TestNode.make("ana", network: network, modules: [modules[0]], clock: clock) }
        #expect(one == PeerLinkError(.unsupported, "no radio"), "one transport: its own error")
    }

    @Test("a node that must be found fails when no transport can advertise; one reached at endpoints runs without")
    func discoveryRequired() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let noDaemon = PeerLinkError(.unavailable, "the daemon is not running: start it")
        func module(_ name: String) -> MemoryTransportModule {
            MemoryTransportModule(network: network, listenerName: name, faults: .init(advertising: noDaemon))
        }
        let error = #expect(throws: PeerLinkError.self) { try TestNode.make("ana", network: network, modules: [module("ana")], clock: clock) }
        #expect(error == noDaemon)
        // Its listener was closed again: the name is free.
        let ana = try TestNode.make("ana", network: network, modules: [module("ana")], discoveryRequired: false, clock: clock)
        #expect(ana.node.notices.contains { if case .unavailable(.advertising, noDaemon) = $0.what { true } else { false } })
        ana.node.close()
    }

    @Test("a browser that cannot run is an event; the node goes on with the other transports")
    func aBrowserThatCannotRun() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let noScan = PeerLinkError(.unavailable, "scanning needs a daemon: start it")
        let ana = try TestNode.make(
            "ana", network: network,
            modules: [
                MemoryTransportModule(network: network, listenerName: "ana-radio", kind: "radio", faults: .init(browsing: noScan)),
                MemoryTransportModule(network: network, listenerName: "ana-memory"),
            ], automatic: true, clock: clock)
        let bo = try TestNode.make("bo", network: network, kinds: ["radio", .memory], automatic: true, clock: clock)
        try await withRunning([ana, bo]) {
            try await ana.log.wait("the radio's browser reports why") { events in
                events.notices.contains { if case .unavailable(.browsing, noScan) = $0.what { $0.module == "radio" } else { false } }
            }
            try await ana.log.wait("Ana meets Bo over the other transport") { $0.connected(bo.peer) }
            #expect(ana.node.discoveredPeers.first?.transports == [.memory], "found over memory only")
        }
    }

    @Test("trust on first use: peers met are remembered in the file; a known name with another key is a conflict")
    func trustOnFirstUse() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let path = temporaryDirectory("tofu") + "/known-peers.json"
        let impostorKey = Identity.generate().fingerprint
        try KnownPeersStore.save(KnownPeers(entries: [.init(fingerprint: impostorKey, displayName: "bo", firstSeen: 0)]), at: path)
        let ana = try TestNode.make("ana", network: network, automatic: true, knownPeersPath: path, clock: clock)
        let bo = try TestNode.make("bo", network: network, automatic: true, clock: clock)
        try await withRunning([ana, bo]) {
            try await ana.log.wait("Ana judges Bo") { $0.verdict(for: bo.peer) != nil }
            #expect(ana.log.events.verdict(for: bo.peer) == .nameConflict(knownFingerprints: [impostorKey]))
        }
        let saved = try KnownPeersStore.load(at: path)
        #expect(Set(saved.entries.keys) == [impostorKey, bo.peer.fingerprint])
        #expect(ana.node.knownPeers.isKnown(bo.peer.fingerprint))
    }

    @Test("admitting only known peers: a stranger is refused (both sides told), a peer in the file is admitted")
    func admitOnlyKnownPeers() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let path = temporaryDirectory("admit") + "/known-peers.json"
        let friendIdentity = Identity.generate()
        let friendPeer = PeerID(identity: friendIdentity, displayName: try DisplayName("friend"))
        var known = KnownPeers()
        _ = known.meet(friendPeer, at: 0)
        try KnownPeersStore.save(known, at: path)

        let guarded = try TestNode.make(
            "guarded", network: network, automatic: true, knownPeersPath: path, admitOnlyKnownPeers: true, clock: clock)
        let stranger = try TestNode.make("stranger", network: network, automatic: true, clock: clock)
        let friend = try TestNode.make("friend", network: network, identity: friendIdentity, automatic: true, clock: clock)
        try await withRunning([guarded, stranger, friend]) {
            try await guarded.log.wait("the friend is admitted") { $0.connected(friendPeer) }
            #expect(guarded.log.events.verdict(for: friendPeer) == .known)
            try await guarded.log.wait("the stranger is refused") { events in
                events.linkFailures.contains { $0.contains("refused stranger (id ") && $0.contains("not a known peer") }
            }
            try await stranger.log.wait("the stranger hears why") { $0.linkFailures.contains { $0.contains("not a known peer") } }
            #expect(!guarded.log.events.connected(stranger.peer))
        }
    }

    @Test("invite by name: every peer found with the name is invited once, on any transport; others are not")
    func inviteByName() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let ana = try TestNode.make("ana", network: network, clock: clock)
        let bo = try TestNode.make("bo", network: network, clock: clock)
        let cy = try TestNode.make("cy", network: network, clock: clock)
        let answering = bo.answerInvitations(accept: true)
        defer { answering.cancel() }
        try await withRunning([ana, bo, cy]) {
            await ana.node.invitePeers(named: "bo")
            try await ana.log.wait("Ana invites Bo") { events in
                events.contains { if case .invitedByName(bo.peer, .success) = $0 { true } else { false } }
            }
            try await ana.log.wait("Bo accepts") { $0.connected(bo.peer) }
            try await ana.log.wait("Cy is found too") { $0.discovered(cy.peer) != nil }
            await ana.node.invitePeers(named: "bo")
            let invited = ana.log.events.filter { if case .invitedByName = $0 { true } else { false } }
            #expect(invited.count == 1, "once per identity: \(invited)")
            #expect(cy.log.events.invitations.isEmpty)
        }
    }

    @Test("connecting to an endpoint reaches whoever is there, and adds the endpoint to the peer")
    func connectToAnEndpoint() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let ana = try TestNode.make("ana", network: network, advertising: false, clock: clock)
        let bo = try TestNode.make("bo", network: network, advertising: false, clock: clock)
        let answering = bo.answerInvitations(accept: true)
        defer { answering.cancel() }
        try await withRunning([ana, bo]) {
            let peer = try await ana.node.connect(to: .memory(name: "bo-memory"))
            #expect(peer == bo.peer)
            try await ana.log.wait("Ana connected to Bo") { $0.connected(bo.peer) }
            #expect(await ana.node.status(of: bo.peer).endpoints == [.memory(name: "bo-memory")])
        }
    }

    @Test("a node made without advertising publishes when asked, with its info, until the publication stops")
    func publishLater() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let ana = try TestNode.make("ana", network: network, advertising: false, clock: clock)
        let bo = try TestNode.make("bo", network: network, clock: clock)
        try await withRunning([ana, bo]) {
            try await bo.log.wait("Bo browses") { $0.notices.contains { if case .browsing = $0.what { true } else { false } } }
            #expect(bo.log.events.discovered(ana.peer) == nil)
            let publication = try ana.node.publish(info: try DiscoveryInfo(["room": "lab"]))
            #expect(publication.summaries == ["in memory at memory://ana-memory"])
            try await bo.log.wait("Bo finds Ana with her info") { $0.discovered(ana.peer)?.info.entries == ["room": "lab"] }
            publication.stop()
            try await bo.log.wait("Bo loses Ana") { events in
                events.contains { if case .discovery(.lost(ana.peer)) = $0 { true } else { false } }
            }
        }
        let after = #expect(throws: PeerLinkError.self) { try ana.node.publish(info: try DiscoveryInfo()) }
        #expect(after?.code == .unavailable, "a stopped node does not advertise")
    }
}
