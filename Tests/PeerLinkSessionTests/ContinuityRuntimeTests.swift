import Foundation
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// A session across link changes, for real: two automatic peers on the in-memory transport and
/// loopback TCP (ranked above it), messages and a stream flowing while their link is upgraded,
/// cut and replaced.
@Suite("Sessions across link changes: upgrade, failover, reconnect", .timeLimit(.minutes(1)))
struct ContinuityRuntimeTests {
    struct Node {
        let node: SessionNode
        let tcp: TCPTransportListener
        var memoryEndpoints: [Endpoint] { node.listener.localEndpoints }
        var allEndpoints: [Endpoint] { tcp.localEndpoints + node.listener.localEndpoints }
    }

    /// `name` is the listener's too, unless `listening` names another (a restarted run listens
    /// elsewhere); `identity` is new unless given (a restarted run keeps its own).
    static func node(
        _ name: String, network: MemoryNetwork, log: TestLog, reconnectGrace: Duration = .seconds(30), identity: Identity = .generate(),
        listening: String? = nil, tcpDialer: any Transport = TCPTransport()
    ) throws -> Node {
        let configuration = PeerSessionConfiguration(
            identity: identity, displayName: try DisplayName(name), serviceType: SessionNode.chat, encryption: .required,
            policy: SessionPolicy(automatic: true, automaticFallback: .seconds(2), reconnectGrace: reconnectGrace))
        let memory = try network.listen(name: listening ?? name)
        let tcp = try TCPTransportListener(host: "127.0.0.1")
        let session = PeerSession(
            configuration: configuration, transports: [network.transport, tcpDialer], listeners: [memory, tcp],
            logger: log.logger)
        return Node(node: SessionNode(session: session, listener: memory), tcp: tcp)
    }

    /// Tells `node` discovery found `other` at `endpoints`.
    static func find(_ node: Node, _ other: Node, at endpoints: [Endpoint]) {
        node.node.session.discovered(
            .found(DiscoveredPeer(id: other.node.peer, protocolVersion: 1, endpoints: endpoints, info: try! DiscoveryInfo())))
    }

    /// Tells `node` discovery now has `other` at `endpoints` (another transport found it).
    static func update(_ node: Node, _ other: Node, at endpoints: [Endpoint]) {
        node.node.session.discovered(
            .updated(DiscoveredPeer(id: other.node.peer, protocolVersion: 1, endpoints: endpoints, info: try! DiscoveryInfo())))
    }

    /// Ana and Bo, automatic, on the memory transport and loopback TCP, running for `body`
    /// (with their network and log); Ana's reconnect grace is `anaGrace`.
    static func withAnaAndBo(
        anaGrace: Duration = .seconds(30), _ body: (MemoryNetwork, TestLog, Node, Node) async throws -> Void
    ) async throws {
        let network = MemoryNetwork()
        let log = TestLog()
        let ana = try node("ana", network: network, log: log, reconnectGrace: anaGrace)
        let bo = try node("bo", network: network, log: log)
        defer {
            ana.tcp.close()
            bo.tcp.close()
        }
        try await withRunning([ana.node, bo.node]) { try await body(network, log, ana, bo) }
    }

    /// Ana and Bo find each other on the memory transport, and wait until each sees the other
    /// connected.
    static func meet(_ ana: Node, _ bo: Node) async throws {
        find(ana, bo, at: bo.memoryEndpoints)
        find(bo, ana, at: ana.memoryEndpoints)
        try await ana.node.log.wait("Ana sees Bo connected") { $0.state(of: bo.node.peer) == .connected }
        try await bo.node.log.wait("Bo sees Ana connected") { $0.state(of: ana.node.peer) == .connected }
    }

    static func transportChanges(_ events: [PeerSessionEvent], about peer: PeerID) -> [String] {
        events.compactMap { event in
            if case .peerTransportChanged(peer, let transport, _) = event { return transport }
            return nil
        }
    }

    /// Each peer seen leaving in `events`, with why.
    static func leaves(_ events: [PeerSessionEvent]) -> [String] {
        events.compactMap { event in
            if case .peerStateChanged(let peer, .notConnected, let reason) = event { return "\(peer): \(reason ?? "no reason")" }
            return nil
        }
    }

    @Test(
        "a pair on a slower transport moves to TCP once it finds it (upgrade), then back when TCP fails (failover): every message once, in order; a stream goes on; nobody leaves"
    )
    func upgradeThenFailover() async throws {
        try await Self.withAnaAndBo{ network, log, ana, bo in
            // They meet on the memory transport only.
            try await Self.meet(ana, bo)
            #expect(await ana.node.session.info(for: bo.node.peer)?.transport == "memory")

            // Messages and a stream, both flowing through everything below.
            let count = 400
            let sender = Task {
                for index in 1...count {
                    try await ana.node.session.send(Array("m\(index)".utf8), to: [bo.node.peer])
                    if index % 20 == 0 { try await Task.sleep(for: .milliseconds(10)) }
                }
            }
            let payload = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 9) }
            let stream = try await ana.node.session.openStream(named: "bulk", to: bo.node.peer)
            let writer = Task {
                var offset = 0
                while offset < payload.count {
                    let end = min(offset + 16 * 1024, payload.count)
                    try await stream.write(Array(payload[offset..<end]))
                    offset = end
                    if offset % (256 * 1024) == 0 { try await Task.sleep(for: .milliseconds(20)) }
                }
                try await stream.finish()
            }
            let reader = Task { () -> [UInt8] in
                var incoming = bo.node.session.incomingStreams.makeAsyncIterator()
                guard let accepted = await incoming.next() else { return [] }
                var bytes: [UInt8] = []
                while let chunk = try await accepted.read() { bytes += chunk }
                return bytes
            }

            // Upgrade: discovery finds the peer on TCP too. Both are on it soon (a dial and a
            // handshake: well under a second here; the bounds leave room for a sanitizer build).
            try await Task.sleep(for: .milliseconds(300))
            let foundAt = ContinuousClock.now
            Self.update(ana, bo, at: bo.allEndpoints)
            Self.update(bo, ana, at: ana.allEndpoints)
            try await ana.node.log.wait("Ana: Bo now on TCP", within: .seconds(30)) { events in
                Self.transportChanges(events, about: bo.node.peer).contains("tcp")
            }
            try await bo.node.log.wait("Bo: Ana now on TCP", within: .seconds(30)) { events in
                Self.transportChanges(events, about: ana.node.peer).contains("tcp")
            }
            #expect(ContinuousClock.now - foundAt < .seconds(15), "upgraded \(ContinuousClock.now - foundAt) after TCP was found")
            #expect(await ana.node.session.info(for: bo.node.peer)?.transport == "tcp")

            // Failover: TCP goes away under them (listeners closed, the link's socket shut): the
            // pair is back on the memory transport within 10 s.
            try await Task.sleep(for: .milliseconds(300))
            ana.tcp.close()
            bo.tcp.close()
            let link = try #require(ana.node.session.channel(for: bo.node.peer)?.activeLink)
            #expect(link.channel.transport == "tcp")
            let cutAt = ContinuousClock.now
            link.channel.close()
            try await ana.node.log.wait("Ana: Bo back on memory", within: .seconds(15)) { events in
                Self.transportChanges(events, about: bo.node.peer).last == "memory"
            }
            try await bo.node.log.wait("Bo: Ana back on memory", within: .seconds(15)) { events in
                Self.transportChanges(events, about: ana.node.peer).last == "memory"
            }
            #expect(ContinuousClock.now - cutAt < .seconds(10), "failed over \(ContinuousClock.now - cutAt) after the cut")

            // Everything arrived: each message once, in order; the stream whole.
            try await sender.value
            try await writer.value
            let received = try await reader.value
            #expect(received.count == payload.count && received == payload, "\(received.count) of \(payload.count) stream bytes")
            try await bo.node.log.wait("all messages at Bo", within: .seconds(20)) { $0.messages(from: ana.node.peer).count >= count }
            let texts = bo.node.log.events.messages(from: ana.node.peer).map { String(decoding: $0, as: UTF8.self) }
            #expect(texts == (1...count).map { "m\($0)" })
            #expect(Self.leaves(ana.node.log.events).isEmpty, "\(Self.leaves(ana.node.log.events))\n\(log.transcript(last: 200))")
            #expect(Self.leaves(bo.node.log.events).isEmpty, "\(Self.leaves(bo.node.log.events))\n\(log.transcript(last: 200))")
        }
    }

    /// A LAN the test switches off and on: while it is down, TCP dials fail (nothing answers)
    /// and every TCP link dialled through it (a pair's TCP links were all dialled by one of
    /// its two sides) is cut.
    final class SwitchableTCP: Transport {
        private let state = Locked((down: false, dialled: [any LinkChannel]()))
        var name: String { "tcp" }
        var kinds: Set<TransportKind> { [.tcp] }

        func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel {
            if state.withLock({ $0.down }) { throw PeerLinkError(.unavailable, "\(endpoint) is not reachable (the test's LAN is down)") }
            let channel = try await TCPTransport().dial(endpoint, timeout: timeout)
            // a dial under way when the LAN went is cut too
            let cut = state.withLock { state in
                if !state.down { state.dialled.append(channel) }
                return state.down
            }
            if cut {
                channel.close()
                throw PeerLinkError(.unavailable, "\(endpoint) is not reachable (the test's LAN went down during the dial)")
            }
            return channel
        }

        /// The LAN goes: later dials fail, the links dialled so far are cut.
        func goDown() {
            let dialled = state.withLock { state in
                state.down = true
                defer { state.dialled = [] }
                return state.dialled
            }
            for channel in dialled { channel.close() }
        }

        func comeBack() { state.withLock { $0.down = false } }
    }

    @Test(
        "a pair that failed over from TCP, whose TCP dials failed meanwhile, moves back to TCP as soon as TCP is found working again"
    )
    func backToTCPAfterItsDialsFailed() async throws {
        let network = MemoryNetwork()
        let log = TestLog()
        let anaTCP = SwitchableTCP()
        let boTCP = SwitchableTCP()
        let ana = try Self.node("ana", network: network, log: log, tcpDialer: anaTCP)
        let bo = try Self.node("bo", network: network, log: log, tcpDialer: boTCP)
        defer {
            ana.tcp.close()
            bo.tcp.close()
        }
        try await withRunning([ana.node, bo.node]) {
            try await Self.meet(ana, bo)
            Self.update(ana, bo, at: bo.allEndpoints)
            Self.update(bo, ana, at: ana.allEndpoints)
            try await ana.node.log.wait("Ana: Bo on TCP", within: .seconds(30)) { Self.transportChanges($0, about: bo.node.peer).contains("tcp") }

            // The LAN goes: TCP dials fail (and are remembered as failed), every TCP link is cut
            // (both sides may have dialled one); the pair fails over to the memory transport.
            anaTCP.goDown()
            boTCP.goDown()
            try await ana.node.log.wait("Ana: Bo back on memory", within: .seconds(15)) {
                Self.transportChanges($0, about: bo.node.peer).last == "memory"
            }
            try await bo.node.log.wait("Bo: Ana back on memory", within: .seconds(15)) {
                Self.transportChanges($0, about: ana.node.peer).last == "memory"
            }
            // Each side tries TCP again while it is down (a redial, or an upgrade to the
            // endpoints it still knows), and remembers that it failed.
            let failedTowards = { (name: String) in
                log.all.contains { $0.message == "dial failed" && $0.metadata["transport"] == "tcp" && $0.metadata["peer.name"] == "\(name)" }
            }
            let outage = ContinuousClock.now + .seconds(20)
            while !(failedTowards("bo") && failedTowards("ana")), ContinuousClock.now < outage {
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(failedTowards("bo") && failedTowards("ana"), "both sides dialled TCP while it was down, and failed")

            // The LAN is back and discovery says so: the pair is on TCP again within seconds,
            // not once the failed dials are forgotten (5 minutes).
            anaTCP.comeBack()
            boTCP.comeBack()
            let backAt = ContinuousClock.now
            Self.update(ana, bo, at: bo.allEndpoints)
            Self.update(bo, ana, at: ana.allEndpoints)
            try await ana.node.log.wait("Ana: Bo on TCP again", within: .seconds(20)) {
                Self.transportChanges($0, about: bo.node.peer).last == "tcp"
            }
            #expect(ContinuousClock.now - backAt < .seconds(15), "back on TCP \(ContinuousClock.now - backAt) after it was found again")
            #expect(await ana.node.session.info(for: bo.node.peer)?.transport == "tcp")
        }
    }

    @Test("a member whose link is cut and whose process is gone leaves at once, not at the end of the grace")
    func aDeadPeerLeavesAtOnce() async throws {
        try await Self.withAnaAndBo{ network, log, ana, bo in
            Self.find(ana, bo, at: bo.memoryEndpoints)
            Self.find(bo, ana, at: ana.memoryEndpoints)
            try await ana.node.log.wait("Ana sees Bo connected") { $0.state(of: bo.node.peer) == .connected }
            // the pair's channel writes on the link (a loaded machine may get here first)
            let deadline = ContinuousClock.now + .seconds(10)
            while ana.node.session.channel(for: bo.node.peer)?.activeLink == nil, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            // Bo's process "dies": its listeners go, nothing it writes arrives any more (no
            // GO_AWAY), it dials nobody again, and Ana's end of the link ends without a word.
            bo.node.listener.close()
            bo.tcp.close()
            // whichever side dialled the link: nothing of Bo's reaches Ana any more
            network.cut("bo")
            network.cut("ana")
            // A session still running would dial Ana again once its own end of the cut link
            // timed out, and come back (seen once on a loaded machine, 2026-11-25).
            bo.node.kill.fire()
            let cutAt = ContinuousClock.now
            // A process that dies ends every one of its sockets: each of Ana's links to Bo ends,
            // not only the one writing (a duplicate still being closed, or a link just replacing
            // it on a loaded machine, would otherwise stay open and silent until the keep-alive).
            for link in ana.node.session.links(to: bo.node.peer) { link.channel.close() }
            do {
                try await ana.node.log.wait("Ana sees Bo leave", within: .seconds(30)) { $0.state(of: bo.node.peer) == .notConnected }
            } catch {
                Issue.record("the sessions' log:\n\(log.transcript(last: 80))")
                throw error
            }
            // at once: well before the 30 s grace would have ended (a few seconds under a sanitizer;
            // up to the 8 s keep-alive where a link Ana admitted just after the cut, so not closed
            // above, carried Bo)
            #expect(ContinuousClock.now - cutAt < .seconds(15), "left \(ContinuousClock.now - cutAt) after the cut")
        }
    }

    @Test("a link severed without a word is found dead by the keep-alive; the pair comes back on a new link within the grace and what was sent meanwhile arrives")
    func reconnectAfterASilentCut() async throws {
        try await Self.withAnaAndBo{ network, log, ana, bo in
            try await Self.meet(ana, bo)
            try await ana.node.session.send(Array("before".utf8), to: [bo.node.peer])
            try await bo.node.log.wait("the first line at Bo") { $0.messages(from: ana.node.peer).count == 1 }
            #expect(await ana.node.session.waitUntilDelivered(within: .seconds(5)), "Bo acknowledges the first line")
            // The cable is pulled: nothing arrives either way, nobody is told. Lines sent now wait.
            network.cut("bo")
            network.cut("ana")
            for index in 1...5 { try await ana.node.session.send(Array("during \(index)".utf8), to: [bo.node.peer]) }
            // A program that sends and leaves can wait for them: not delivered while the link is
            // dead, delivered once Bo is back on a new one.
            #expect(await !ana.node.session.waitUntilDelivered(within: .milliseconds(300)))
            #expect(await ana.node.session.waitUntilDelivered(within: .seconds(25)), "the lines reach Bo once the pair is back")
            try await ana.node.log.wait("Ana: Bo on a new link", within: .seconds(5)) { events in
                !Self.transportChanges(events, about: bo.node.peer).isEmpty
            }
            try await bo.node.log.wait("every line at Bo", within: .seconds(10)) { $0.messages(from: ana.node.peer).count >= 6 }
            let texts = bo.node.log.events.messages(from: ana.node.peer).map { String(decoding: $0, as: UTF8.self) }
            #expect(texts == ["before"] + (1...5).map { "during \($0)" })
            #expect(Self.leaves(ana.node.log.events).isEmpty, "\(Self.leaves(ana.node.log.events))\n\(log.transcript(last: 200))")
            #expect(Self.leaves(bo.node.log.events).isEmpty, "\(Self.leaves(bo.node.log.events))\n\(log.transcript(last: 200))")
        }
    }

    @Test(
        "a pair one side dropped (its grace is off) while the other kept it and dials back: the stale numbering is seen and the pair starts over, so messages flow again both ways instead of vanishing for good"
    )
    func aPairDroppedOnOneSideStartsOverOnBoth() async throws {
        try await Self.withAnaAndBo(anaGrace: .zero) { network, log, ana, bo in
            try await Self.meet(ana, bo)
            // (Bo's line alone: Bo then acknowledges nothing of Ana's, so no acknowledgement of
            // frames Ana never sent gives the mismatch away; only the numbering can.)
            try await bo.node.session.send(Array("before".utf8), to: [ana.node.peer])
            #expect(await bo.node.session.waitUntilDelivered(within: .seconds(5)), "Ana acknowledges Bo's first line")
            // The link fails without a word. Ana notices at once and drops Bo (no grace); Bo
            // notices only by its keep-alive, keeps Ana, holds a line for her and dials her
            // again: a pair only Bo still has, numbered past what Ana now knows.
            let mark = ana.node.log.events.count
            network.cut("ana")
            network.cut("bo")
            for link in ana.node.session.links(to: bo.node.peer) { link.channel.close() }
            try await bo.node.session.send(Array("held".utf8), to: [ana.node.peer])
            try await ana.node.log.wait("Ana drops Bo") { events in
                events.dropFirst(mark).contains { if case .peerStateChanged(bo.node.peer, let state, _) = $0 { state != .connected } else { false } }
            }
            // Lines both ways until one arrives each way: with the pair out of step they would
            // vanish for good; once it started over they flow (a line sent while it was still out
            // of step may be lost, and its sender told).
            let deadline = ContinuousClock.now + .seconds(30)
            var attempt = 0
            func arrived(_ text: String, at node: Node, from other: Node) -> Bool {
                node.node.log.events.messages(from: other.node.peer).contains { String(decoding: $0, as: UTF8.self).hasPrefix(text) }
            }
            while !(arrived("again", at: ana, from: bo) && arrived("back", at: bo, from: ana)), ContinuousClock.now < deadline {
                attempt += 1
                try? await bo.node.session.send(Array("again \(attempt)".utf8), to: [ana.node.peer])
                try? await ana.node.session.send(Array("back \(attempt)".utf8), to: [bo.node.peer])
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(arrived("again", at: ana, from: bo), "Bo's lines never reached Ana again: \(log.transcript(last: 60))")
            #expect(arrived("back", at: bo, from: ana), "Ana's lines never reached Bo again: \(log.transcript(last: 60))")
            let atAna = ana.node.log.events.messages(from: bo.node.peer).map { String(decoding: $0, as: UTF8.self) }
            #expect(atAna.first == "before" && atAna.filter { $0 == "before" }.count == 1, "\(atAna)")
            // What Bo sent while the pair was out of step either arrived, or Bo's app heard
            // that its line to Ana was lost.
            let boLeft = bo.node.log.events.contains { if case .peerStateChanged(ana.node.peer, let state, _) = $0 { state != .connected } else { false } }
            #expect(atAna.contains("held") || boLeft, "Bo's held line vanished and Bo was never told: \(log.transcript(last: 80))")
        }
    }

    @Test(
        "a member restarted just before its link was cut, whose new address this side's discovery has not seen: nothing listening at the old run's address does not end it; it dials back within the grace and what it sent meanwhile arrives"
    )
    func aRestartedMemberIsNotEndedByItsOldAddress() async throws {
        let network = MemoryNetwork()
        let log = TestLog()
        let ana = try Self.node("ana", network: network, log: log)
        let identity = Identity.generate()
        let first = try Self.node("bo", network: network, log: log, identity: identity, listening: "bo-run-1")
        let second = try Self.node("bo", network: network, log: log, identity: identity, listening: "bo-run-2")
        let bo = first.node.peer
        defer {
            ana.tcp.close()
            first.tcp.close()
            second.tcp.close()
        }
        try await withRunning([ana.node]) {
            // Bo's first run: Ana's discovery finds it at memory://bo-run-1, and never learns more.
            let firstRun = Task { await first.node.run() }
            let firstLog = Task { await first.node.log.record(first.node.session.events) }
            Self.find(ana, first, at: first.memoryEndpoints)
            Self.find(first, ana, at: ana.memoryEndpoints)
            try await ana.node.log.wait("Ana sees Bo's first run") { $0.state(of: bo) == .connected }
            await first.node.session.disconnect()
            await firstRun.value
            firstLog.cancel()
            first.node.listener.close()
            try await ana.node.log.wait("the first run left") { $0.state(of: bo) == .notConnected }

            // The second run listens elsewhere and comes to Ana by its own dial.
            let secondRun = Task { await second.node.run() }  // until `kill` below
            let secondLog = Task { await second.node.log.record(second.node.session.events) }
            defer {
                second.node.kill.fire()
                secondLog.cancel()
            }
            Self.find(second, ana, at: ana.memoryEndpoints)
            try await ana.node.log.wait("Ana sees Bo's second run", within: .seconds(20)) { $0.state(of: bo) == .connected }
            try await second.node.log.wait("Bo's second run sees Ana") { $0.state(of: ana.node.peer) == .connected }
            let leavesBefore = ana.node.log.events.filter { if case .peerStateChanged(bo, .notConnected, _) = $0 { true } else { false } }.count
            try await second.node.session.send(Array("before".utf8), to: [ana.node.peer])
            #expect(await second.node.session.waitUntilDelivered(within: .seconds(5)))

            // The cut: nothing arrives either way; Ana notices at once and dials the only address
            // she knows, where nothing listens any more; Bo's keep-alive notices a few seconds later.
            network.cut("ana")
            network.cut("bo-run-2")
            for link in ana.node.session.links(to: bo) { link.channel.close() }
            try await second.node.session.send(Array("during".utf8), to: [ana.node.peer])
            #expect(await second.node.session.waitUntilDelivered(within: .seconds(25)), "the line reaches Ana once Bo dialled back")
            try await ana.node.log.wait("both lines at Ana", within: .seconds(5)) { $0.messages(from: bo).count >= 2 }
            let texts = ana.node.log.events.messages(from: bo).map { String(decoding: $0, as: UTF8.self) }
            #expect(texts == ["before", "during"])
            let leaves = ana.node.log.events.filter { if case .peerStateChanged(bo, .notConnected, _) = $0 { true } else { false } }.count
            #expect(leaves == leavesBefore, "Ana saw Bo leave: \(log.transcript(last: 40))")
            // The run ends, its links with it, before the test does (ahead of the defer's kill).
            second.node.kill.fire()
            await secondRun.value
            second.node.listener.close()
        }
    }
}
