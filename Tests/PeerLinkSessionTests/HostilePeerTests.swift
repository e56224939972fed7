import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Waits until `condition` holds, looking every 20 ms; fails naming `what` after `bound`.
func eventually(
    _ what: @autoclosure () -> String, within bound: Duration, sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () -> Bool
) async throws {
    let deadline = ContinuousClock.now + bound
    while !condition() {
        guard ContinuousClock.now < deadline else {
            Issue.record("timed out waiting for: \(what())", sourceLocation: sourceLocation)
            throw WaitTimedOut()
        }
        try await Task.sleep(for: .milliseconds(20))
    }
}

/// A listener that fails its first accepts as a process out of descriptors would, then works.
final class FailingListener: TransportListener {
    let inner: any TransportListener
    private let failuresLeft: Locked<Int>
    var localEndpoints: [Endpoint] { inner.localEndpoints }

    init(_ inner: any TransportListener, failures: Int) {
        self.inner = inner
        failuresLeft = Locked(failures)
    }

    var failuresLeftCount: Int { failuresLeft.withLock { $0 } }

    func accept() async throws -> any LinkChannel {
        let fail = failuresLeft.withLock { left -> Bool in
            guard left > 0 else { return false }
            left -= 1
            return true
        }
        if fail {
            throw PeerLinkError(.unavailable, "this process has too many open files: close links it no longer needs, or raise the limit (ulimit -n)")
        }
        return try await inner.accept()
    }

    func close() { inner.close() }
}

/// Peers that attack a session over loopback before (or instead of) authenticating: the session
/// survives, keeps accepting, keeps its link caps, and an honest peer's messages still arrive.
@Suite("Hostile peers against a session", .timeLimit(.minutes(2)))
struct HostilePeerTests {
    static let loopback = "127.0.0.1"

    static func node(
        _ name: String, log: TestLog, limits: ResourceLimits = .default, linkPolicy: LinkPolicy = LinkPolicy()
    ) throws -> SessionNode {
        var configuration = PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName(name), serviceType: SessionNode.chat,
            policy: SessionPolicy(automatic: true), linkPolicy: linkPolicy)
        configuration.limits = limits
        let listener = try TCPTransportListener(host: loopback, limits: limits)
        let session = PeerSession(configuration: configuration, transport: TCPTransport(), listener: listener, logger: log.logger)
        return SessionNode(session: session, listener: listener)
    }

    static func port(of node: SessionNode) throws -> UInt16 {
        guard let port = node.listener.localEndpoints.first?.tcp?.port else { throw AttackError("not a TCP listener") }
        return port
    }

    /// The honest pair connects and exchanges `count` messages each way.
    static func honestExchange(_ victim: SessionNode, _ honest: SessionNode, count: Int = 50, tag: String) async throws {
        victim.find([honest])
        honest.find([victim])
        try await honest.log.wait("the honest peer connected (\(tag))", within: .seconds(60)) { $0.state(of: victim.peer) == .connected }
        try await victim.log.wait("the victim sees the honest peer (\(tag))", within: .seconds(60)) { $0.state(of: honest.peer) == .connected }
        let before = victim.log.events.messages(from: honest.peer).count
        for index in 1...count {
            try await honest.session.send(Array("\(tag) \(index)".utf8), to: [victim.peer])
            try await victim.session.send(Array("\(tag) back \(index)".utf8), to: [honest.peer])
        }
        try await victim.log.wait("\(count) messages at the victim (\(tag))", within: .seconds(60)) {
            $0.messages(from: honest.peer).count >= before + count
        }
        try await honest.log.wait("\(count) answers at the honest peer (\(tag))", within: .seconds(60)) {
            $0.messages(from: victim.peer).filter { String(decoding: $0, as: UTF8.self).hasPrefix("\(tag) back") }.count >= count
        }
    }

    /// The victim's "link closed" log entries for the peer named `name`.
    static func closings(of name: String, in log: TestLog) -> [TestLog.Entry] {
        log.all.filter { $0.message == "link closed" && "\($0.metadata["peer.name"] ?? "")" == name }
    }

    /// Samples the victim's links in their handshake while `body` runs; the largest count seen.
    static func sampleHandshaking(_ victim: SessionNode, during body: () async throws -> Void) async throws -> Int {
        final class Highest: Sendable { let value = Locked(0) }
        let highest = Highest()
        let done = Latch()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for _ in 0..<6000 {
                    if done.isFired { break }
                    let now = victim.session.resourceUsage().handshaking
                    highest.value.withLock { $0 = max($0, now) }
                    try? await Task.sleep(for: .milliseconds(10))
                }
            }
            defer { done.fire() }
            try await body()
            done.fire()
            try await group.waitForAll()
        }
        return highest.value.withLock { $0 }
    }

    @Test("an accept loop that fails for lack of descriptors pauses and accepts again")
    func acceptLoopOutlivesFailures() async throws {
        let log = TestLog()
        let network = MemoryNetwork()
        var limits = ResourceLimits.default
        limits.acceptBackoff = .milliseconds(1) ... .milliseconds(20)
        let failing = FailingListener(try network.listen(name: "victim"), failures: 25)
        var configuration = PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName("victim"), serviceType: SessionNode.chat, encryption: .optional,
            policy: SessionPolicy(automatic: true))
        configuration.limits = limits
        let victim = SessionNode(
            session: PeerSession(configuration: configuration, transport: network.transport, listener: failing, logger: log.logger),
            listener: failing)
        try await withRunning([victim]) {
            // The accept loop goes through every failure, pausing, and does not give up.
            for _ in 0..<500 where failing.failuresLeftCount > 0 { try await Task.sleep(for: .milliseconds(20)) }
            #expect(failing.failuresLeftCount == 0)
            // An incoming link still gets in.
            let channel = try await network.transport.dial(.memory(name: "victim"), timeout: .seconds(5))
            var raw = RawPeer(channel, name: "Honest", expecting: nil)
            #expect(try await raw.handshake(), "the victim no longer accepts links")
            channel.close()
        }
        #expect(!victim.log.events.linkFailures.contains { $0.reason.contains("no longer accepting") })
        let retries = log.all.filter { $0.message.hasPrefix("accepting a link failed") }
        #expect(!retries.isEmpty && retries.count <= 3, "logged \(retries.count) times for 25 failures")
    }

    @Test("slow-loris handshakes are held to the handshake caps and closed by the 10 s handshake timeout, while an honest peer connects")
    func slowLoris() async throws {
        let log = TestLog()
        var limits = ResourceLimits.default
        limits.maximumHandshakingLinks = 8
        limits.maximumHandshakingLinksPerAddress = 4
        limits.maximumLinks = 16
        limits.maximumLinksPerAddress = 16
        let victim = try Self.node("victim", log: log, limits: limits)
        let honest = try Self.node("honest", log: TestLog())
        let port = try Self.port(of: victim)
        let sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
        var sockets: [AttackerSocket] = []
        defer { for socket in sockets { socket.close() } }
        try await withRunning([victim, honest]) {
            let highest = try await Self.sampleHandshaking(victim) {
                // Six held handshakes from one address: two over its cap.
                for _ in 0..<6 {
                    sockets.append(try await Attack.launch(.slowLoris, port: port, from: "127.0.0.6", service: SessionNode.chat))
                }
                try await eventually("the address's cap reached", within: .seconds(10)) {
                    victim.session.resourceUsage().refused == 2
                }
                // Six held handshakes from each of four more addresses: more than the session's cap.
                for round in 0..<6 {
                    for source in sources {
                        sockets.append(try await Attack.launch(.slowLoris, port: port, from: source, service: SessionNode.chat))
                    }
                    if round == 2 { try await Self.honestExchange(victim, honest, tag: "during the attack") }
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            #expect(highest <= limits.maximumHandshakingLinks, "\(highest) links in their handshake at once")
            let usage = victim.session.resourceUsage()
            #expect(usage.refused >= 2, "\(usage)")
            #expect(usage.evicted > 0, "\(usage)")
            // Every held handshake ends: refused or evicted at once, the rest at the 10 s timeout.
            for socket in sockets {
                let (_, ended) = await socket.readToEnd(timeout: .seconds(20))
                #expect(ended, "a slow-loris connection outlived the handshake timeout")
            }
            try await eventually("only the honest link left: \(victim.session.resourceUsage())", within: .seconds(20)) {
                victim.session.resourceUsage().links == 1
            }
            try await Self.honestExchange(victim, honest, tag: "after the attack")
        }
        // Refusals are summarised at info, not logged one by one.
        let summaries = log.all.filter { $0.level == .info && $0.message.hasPrefix("incoming links over the resource limits") }
        #expect(summaries.count >= 1 && summaries.count <= 3, "\(summaries.count) summaries")
    }

    @Test("discovery poisoned with the honest peer's id at an address that never answers and at one that answers as somebody else: one dial goes past both to the honest peer")
    func discoveryPoisoning() async throws {
        var linkPolicy = LinkPolicy()
        linkPolicy.handshakeTimeout = .seconds(3)
        let victimLog = TestLog()
        let victim = try Self.node("victim", log: victimLog, linkPolicy: linkPolicy)
        let honest = try Self.node("honest", log: TestLog())
        let impostor = try Self.node("impostor", log: TestLog())
        // Accepts connections (the kernel completes them) and never says a word.
        let silent = try TCPTransportListener(host: "127.0.0.40")
        defer { silent.close() }
        let trap = try #require(silent.localEndpoints.first)
        let impostorAddress = try #require(impostor.listener.localEndpoints.first)
        try await withRunning([victim, honest, impostor]) {
            // Only the victim dials: the poisoned record lists the traps first.
            victim.session.discovered(
                .found(
                    DiscoveredPeer(
                        id: honest.peer, protocolVersion: 1, endpoints: [trap, impostorAddress] + honest.listener.localEndpoints,
                        info: try DiscoveryInfo())))
            try await victim.log.wait("the victim reaches the honest peer past the traps", within: .seconds(60)) {
                $0.state(of: honest.peer) == .connected
            }
            // One dial went through the three endpoints in turn: a handshake timeout at the silent
            // address, the impostor's key refused, then the honest peer. Before, the first address
            // that accepted was all a dial tried, and the pair never met.
            let dials = victimLog.all.filter { $0.message == "dialling" }.map { "\($0.metadata["link.remote"] ?? "")" }
            let expected = ([trap, impostorAddress] + honest.listener.localEndpoints).map(\.description)
            #expect(Array(dials.prefix(3)) == Array(expected.prefix(3)), "\(dials)")
            #expect(!victimLog.all.contains { $0.message == "dial failed" || $0.message.hasPrefix("could not reach") }, "a dial gave up")
            #expect(
                !victim.log.events.contains {
                    if case .peerStateChanged(let peer, .connected, _) = $0 { peer == impostor.peer } else { false }
                })
            try await Self.honestExchange(victim, honest, count: 10, tag: "past the traps")
        }
    }

    @Test("a peer that floods pings and never reads has its link and its socket closed within the limits, while an honest peer talks")
    func pingFloodWithoutReading() async throws {
        var limits = ResourceLimits.default
        limits.writeProgressTimeout = .seconds(2)
        let log = TestLog()
        let victim = try Self.node("victim", log: log, limits: limits)
        let honest = try Self.node("honest", log: TestLog())
        let port = try Self.port(of: victim)
        try await withRunning([victim, honest]) {
            let channel = try await TCPTransport().dial(.tcp(host: Self.loopback, port: port), timeout: .seconds(5))
            defer { channel.close() }
            var attacker = RawPeer(channel, name: "Flooder", expecting: nil)
            #expect(try await attacker.handshake())
            // Pings, each answered, never read: the answers fill the kernel's buffers, then the
            // victim's writes stall. Bounded in count and time.
            let deadline = ContinuousClock.now + .seconds(30)
            var sent = 0
            while sent < 400_000, ContinuousClock.now < deadline {
                do {
                    try await attacker.send(.ping(flags: [], opaque: UInt64(sent)))
                } catch {
                    break  // the victim closed the connection
                }
                sent += 1
                // a breath now and then, so the flood does not starve the other suites' tests
                if sent % 200 == 0 { try await Task.sleep(for: .milliseconds(2)) }
                if sent == 2000 { try await Self.honestExchange(victim, honest, count: 10, tag: "during the flood") }
            }
            try await eventually("only the honest peer's link left", within: .seconds(30)) { victim.session.resourceUsage().links == 1 }
            // The victim ends it by a limit: its writes stalled (code 11), it had no session
            // business (0), or (on a slow sanitizer build) its keep-alive went unanswered (8).
            let closings = Self.closings(of: "Flooder", in: log)
            #expect(
                closings.contains { "\($0.metadata["link.close.byPeer"] ?? "")" == "false" },
                "after \(sent) pings: \(closings.map(\.metadata))")
            // The victim closed the socket, not only the link: after what it had written, the end.
            #expect(await readsToTheEnd(channel, within: .seconds(20)), "the victim kept the socket open")
            try await Self.honestExchange(victim, honest, count: 10, tag: "after the flood")
        }
    }

    @Test("a peer that sends many messages in part is closed at the partial-message limit (code 11), while an honest peer talks")
    func partialMessages() async throws {
        let log = TestLog()
        let victim = try Self.node("victim", log: log)
        let honest = try Self.node("honest", log: TestLog())
        let port = try Self.port(of: victim)
        try await withRunning([victim, honest]) {
            try await Self.honestExchange(victim, honest, count: 10, tag: "before")
            let channel = try await TCPTransport().dial(.tcp(host: Self.loopback, port: port), timeout: .seconds(5))
            defer { channel.close() }
            var attacker = RawPeer(channel, name: "Hoarder", expecting: nil)
            #expect(try await attacker.handshake())
            try await eventually("the hoarder admitted", within: .seconds(10)) {
                log.all.contains { $0.message == "link admitted to the session" && "\($0.metadata["peer.id"] ?? "")" != "\(honest.peer.fingerprint)" }
            }
            // 40 messages, each started and never finished: 16 KiB chunks round-robin, up to
            // 48 MiB in all (the per-link limit is 32 MiB). Bounded in count and time.
            let chunk = [UInt8](repeating: 0x5A, count: WireFormat.maxFramePayload)
            let deadline = ContinuousClock.now + .seconds(30)
            var sent = 0
            sending: for _ in 0..<80 {
                for id in 1...40 {
                    guard ContinuousClock.now < deadline else { break sending }
                    do {
                        try await attacker.send(.message(id: UInt32(id), flags: .more, chunk: FramePayload(chunk)))
                    } catch {
                        break sending  // the victim closed the connection
                    }
                    sent += chunk.count
                }
            }
            try await eventually("the hoarder's link closed", within: .seconds(30)) { !Self.closings(of: "Hoarder", in: log).isEmpty }
            let closing = Self.closings(of: "Hoarder", in: log).first
            // Closed by a limit: the partial-message limit (11); on a slow (sanitizer) build the
            // 10 s a peer may stay without session business (0) may come first.
            #expect(["11", "0"].contains("\(closing?.metadata["link.close.code"] ?? "")"), "after \(sent >> 20) MiB: \(closing?.metadata ?? [:])")
            try await Self.honestExchange(victim, honest, count: 10, tag: "after")
        }
    }

    @Test("a refusing verdict cannot reach the victim's terminal or log raw")
    func terminalInjection() async throws {
        let log = TestLog()
        let victim = try Self.node("victim", log: log)
        let port = try Self.port(of: victim)
        try await withRunning([victim]) {
            let reason = InjectionText.reason + String(repeating: "\u{1B}[A", count: 20_000)
            let socket = try await Attack.launch(.refusingVerdict(reason: reason), port: port, from: "127.0.0.7", service: SessionNode.chat)
            defer { socket.close() }
            try await victim.log.wait("the refusal reported", within: .seconds(20)) { !$0.linkFailures.isEmpty }
            let failure = try #require(victim.log.events.linkFailures.first)
            #expect(!InjectionText.isRaw(failure.reason), "\(failure.reason)")
            #expect(failure.reason.contains("\\r* mallory joined\\n\\u{1B}]0;owned"))
            #expect(failure.reason.utf8.count < ResourceLimits.default.maximumReasonBytes + 200)
        }
        for entry in log.all {
            #expect(!InjectionText.isRaw(entry.message), "logged raw: \(entry.message)")
            for (key, value) in entry.metadata {
                #expect(!InjectionText.isRaw("\(value)"), "logged raw in \(key): \(value)")
            }
        }
    }

    @Test("floods and oversized fields before authentication end their links; an honest peer is not held up")
    func floodsBeforeAuthentication() async throws {
        let log = TestLog()
        let victim = try Self.node("victim", log: log)
        let honest = try Self.node("honest", log: TestLog())
        let port = try Self.port(of: victim)
        let attacks: [Attack] = [.recordFlood(count: 2000), .oversizedRecord, .prefaceOnly, .silent, .recordFlood(count: 20)]
        try await withRunning([victim, honest]) {
            var sockets: [(Attack, AttackerSocket)] = []
            defer { for (_, socket) in sockets { socket.close() } }
            for (index, attack) in attacks.enumerated() {
                sockets.append((attack, try await Attack.launch(attack, port: port, from: "127.0.0.\(20 + index)", service: SessionNode.chat)))
            }
            // A Noise-speaking attacker whose hello carries a 60000-byte display name.
            let crafted = try await Attack.launch(
                .throwawayKey(hello: [1, 0xEA, 0x60] + [UInt8](repeating: 0x41, count: 60000)), port: port, from: "127.0.0.30",
                service: SessionNode.chat)
            defer { crafted.close() }
            try await Self.honestExchange(victim, honest, tag: "during the floods")
            for (attack, socket) in sockets {
                let (_, ended) = await socket.readToEnd(timeout: .seconds(20))
                #expect(ended, "\(attack): the victim kept the link")
            }
            #expect(await crafted.readToEnd(timeout: .seconds(20)).ended, "crafted hello: the victim kept the link")
            try await eventually("only the honest link left: \(victim.session.resourceUsage())", within: .seconds(20)) {
                victim.session.resourceUsage().links == 1
            }
            try await Self.honestExchange(victim, honest, tag: "after the floods")
        }
        let closings = log.all.filter { $0.message == "link closed" }
        #expect(closings.contains { "\($0.metadata["link.close.reason"] ?? "")".contains("hello is malformed") })
    }
}

@Suite("Accepting when descriptors run out")
struct AcceptGuardTests {
    /// A fake `accept`: each call takes the next result.
    final class Script: @unchecked Sendable {
        enum Result { case fail(Int32), descriptor, nothing }
        var results: [Result]
        var opened: [Int32] = []
        init(_ results: [Result]) { self.results = results }

        func accept(_ fd: Int32) throws(SystemError) -> Int32? {
            guard !results.isEmpty else { return nil }
            switch results.removeFirst() {
            case .fail(let code): throw SystemError("accept", errno: code)
            case .nothing: return nil
            case .descriptor:
                let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
                opened.append(fd)
                return fd
            }
        }

        /// Whether `fd` is still open (it was handed out and not closed).
        static func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) >= 0 }
    }

    static let limits = ResourceLimits(reservedDescriptors: 4, acceptBackoff: .milliseconds(10) ... .milliseconds(80))

    @Test("EMFILE sheds the oldest pending connection with the spare descriptor, and pauses longer each time up to the bound")
    func exhausted() throws {
        let guardian = AcceptGuard(limits: Self.limits, descriptorLimit: 1 << 20)
        let script = Script([
            .fail(EMFILE), .descriptor, .fail(EMFILE), .descriptor, .fail(ENFILE), .nothing, .fail(ENOBUFS), .fail(ENOMEM),
            .fail(EMFILE), .nothing, .descriptor,
        ])
        var steps: [AcceptGuard.Step?] = []
        for _ in 0..<7 { steps.append(try guardian.step(listening: -1, accept: script.accept)) }
        let pauses = steps.compactMap { step -> Duration? in if case .pause(let pause)? = step { pause } else { nil } }
        #expect(pauses == [.milliseconds(10), .milliseconds(20), .milliseconds(40), .milliseconds(80), .milliseconds(80), .milliseconds(80)])
        guard case .accepted(let fd)? = steps.last else {
            Issue.record("no connection accepted: \(steps)")
            return
        }
        // The two connections taken while exhausted were closed; the accepted one is open.
        #expect(guardian.statistics.shedWhileExhausted == 2)
        #expect(guardian.statistics.failures == 6)
        #expect(Script.isOpen(fd))
        close(fd)
        // A success resets the pauses.
        let again = Script([.fail(EMFILE), .nothing])
        #expect(try guardian.step(listening: -1, accept: again.accept) == .pause(.milliseconds(10)))
    }

    @Test("a connection that would eat into the reserve is closed at once")
    func reserve() throws {
        // With the limit at the reserve itself, every descriptor is in the reserve.
        let shedding = AcceptGuard(limits: Self.limits, descriptorLimit: 4)
        let script = Script([.descriptor])
        #expect(try shedding.step(listening: -1, accept: script.accept) == .again)
        #expect(shedding.statistics.shedForReserve == 1)

        let roomy = AcceptGuard(limits: Self.limits, descriptorLimit: 1 << 20)
        let more = Script([.descriptor])
        guard case .accepted(let fd)? = try roomy.step(listening: -1, accept: more.accept) else {
            Issue.record("refused with room to spare")
            return
        }
        close(fd)
    }

    @Test("raising the soft descriptor limit reaches the hard limit")
    func raise() throws {
        let before = try #require(DescriptorLimit.current())
        let after = try #require(DescriptorLimit.raiseSoftLimit())
        #expect(after >= before.soft)
        #expect(after == before.hard || before.hard == Int.max)
        #expect((DescriptorLimit.openCount() ?? 0) > 2)
    }
}
