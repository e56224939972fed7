import Foundation
import PeerLink
import Testing

/// Events recorded by a test, read by it while they arrive.
final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [PeerSessionEvent] = []

    func append(_ event: PeerSessionEvent) { lock.withLock { events.append(event) } }

    func withLock<R>(_ body: ([PeerSessionEvent]) -> R) -> R { lock.withLock { body(events) } }
}

/// Sessions over RFCOMM and L2CAP in the VM lab, and `peerlink chat` between the two controllers.
@Suite(
    "Bluetooth sessions in the VM lab", .serialized, .enabled(if: BluetoothLab.enabled, BluetoothLab.reason),
    .timeLimit(.minutes(3)))
struct BluetoothSessionTests {
    /// A running session: its events are recorded, invitations accepted.
    final class Running: Sendable {
        let session: PeerSession
        let task: Task<Void, Never>
        let consumer: Task<Void, Never>
        let events = EventLog()

        init(_ session: PeerSession) {
            self.session = session
            task = Task { await session.run() }
            let events = events
            consumer = Task {
                for await event in session.events {
                    events.append(event)
                    if case .invitationReceived(let invitation, _, _) = event {
                        try? await session.respond(to: invitation, accept: true)
                    }
                }
            }
        }

        /// Waits (bounded) until ``PeerSession/run()`` takes work.
        func started() async throws {
            let deadline = ContinuousClock.now + .seconds(30)
            while !session.isRunning {
                guard ContinuousClock.now < deadline else { throw HarnessError("\(session.localPeer.displayName) did not start") }
                try await Task.sleep(for: .milliseconds(10))
            }
        }

        func stop() async {
            await session.disconnect()
            await task.value
            await consumer.value
            for listener in session.listeners { listener.close() }
        }

        /// Waits (bounded) until `condition` holds over the events so far.
        func waitFor(_ what: String, within limit: Duration = .seconds(30), _ condition: ([PeerSessionEvent]) -> Bool) async throws {
            let deadline = ContinuousClock.now + limit
            while !events.withLock({ condition($0) }) {
                guard ContinuousClock.now < deadline else {
                    throw HarnessError("\(session.localPeer.displayName): no \(what) within \(limit); events: \(events.withLock { $0 })")
                }
                try await Task.sleep(for: .milliseconds(50))
            }
        }

        func waitForState(_ peer: PeerID, _ state: PeerState, within limit: Duration = .seconds(30)) async throws {
            let deadline = ContinuousClock.now + limit
            while await session.state(of: peer) != state {
                guard ContinuousClock.now < deadline else {
                    throw HarnessError("\(peer) did not become \(state) at \(session.localPeer.displayName) within \(limit); events: \(events.withLock { $0 })")
                }
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    static func configuration(_ name: String, reconnectGrace: Duration = SessionPolicy.default.reconnectGrace) throws
        -> PeerSessionConfiguration
    {
        PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName(name), serviceType: try ServiceType("bt-lab"),
            encryption: .required, policy: SessionPolicy(reconnectGrace: reconnectGrace), dialTimeout: .seconds(20))
    }

    /// hci0 listens on RFCOMM and L2CAP; hci1 only dials. `reconnectGrace` as in
    /// ``PeerLinkCore/SessionPolicy/reconnectGrace`` (zero: a lost link's peer leaves at once).
    static func pair(reconnectGrace: Duration = SessionPolicy.default.reconnectGrace) async throws -> (server: Running, client: Running) {
        try await BluetoothLab.renewControllers()
        let hci0 = try BluetoothLab.address(0)
        let hci1 = try BluetoothLab.address(1)
        let listeners: [any TransportListener] = [
            try BluetoothTransportListener(.rfcomm, adapter: hci0), try BluetoothTransportListener(.l2cap, adapter: hci0),
        ]
        let server = PeerSession(
            configuration: try configuration("on-hci0", reconnectGrace: reconnectGrace), transports: [BluetoothTransport(adapter: hci0)], listeners: listeners)
        let client = PeerSession(
            configuration: try configuration("on-hci1", reconnectGrace: reconnectGrace), transports: [TCPTransport(), BluetoothTransport(adapter: hci1)],
            listeners: [])
        let running = (server: Running(server), client: Running(client))
        try await running.server.started()
        try await running.client.started()
        return running
    }

    @Test(arguments: BluetoothSocketKind.allCases)
    func encryptedChatBetweenTwoSessions(_ kind: BluetoothSocketKind) async throws {
        let (server, client) = try await Self.pair()
        do {
            let endpoint = try #require(server.session.listeners.flatMap(\.localEndpoints).first { $0.transport == kind.rawValue })
            let peer = try await client.session.connect(to: endpoint)
            #expect(peer == server.session.localPeer)
            try await client.waitForState(peer, .connected)
            try await server.waitForState(client.session.localPeer, .connected)
            let info = try #require(await client.session.info(for: peer))
            #expect(info.transport == kind.rawValue)
            #expect(info.encrypted)
            #expect(info.remote == endpoint.description)
            // a record far larger than an L2CAP packet, both ways
            let big = BluetoothLab.pattern(100_000, seed: 9)
            try await client.session.send(Array("hello from hci1".utf8), to: [peer])
            try await server.session.send(big, to: [client.session.localPeer])
            try await server.waitFor("message from hci1") { events in
                events.contains { if case .message(_, let data, _) = $0 { return data == Array("hello from hci1".utf8) }; return false }
            }
            try await client.waitFor("100 kB message from hci0") { events in
                events.contains { if case .message(_, let data, _) = $0 { return data == big }; return false }
            }
        } catch {
            await client.stop()
            await server.stop()
            throw error
        }
        await client.stop()
        await server.stop()
    }

    @Test(arguments: BluetoothSocketKind.allCases)
    func twoChatProcessesOneControllerEach(_ kind: BluetoothSocketKind) async throws {
        try await BluetoothLab.renewControllers()
        let hci0 = try BluetoothLab.address(0)
        // fixed ports, as a user gives them, away from those the kernel hands out for 0
        let listen = kind == .rfcomm ? ["--rfcomm-channel", "27"] : ["--l2cap-psm", "0x2001"]
        let target = kind == .rfcomm ? "bt://\(hci0)/rfcomm/27" : "bt://\(hci0)/l2cap/0x2001"
        let a = try ChildProcess.peerlink(["chat", "--name", "alice", "--adapter", "hci0"] + listen, withInput: true)
        defer { a.terminate() }
        _ = try await a.waitForStderrLine(containing: "Listening on hci0", timeout: .seconds(30))
        let b = try ChildProcess.peerlink(
            ["chat", "--name", "bob", "--adapter", "hci1", "--connect", target], withInput: true)
        defer { b.terminate() }
        _ = try await b.waitForLine(containing: "* alice joined", timeout: .seconds(60))
        _ = try await a.waitForLine(containing: "* bob joined", timeout: .seconds(60))
        a.type("hi bob, this is alice over \(kind)\n")
        b.type("hi alice\n")
        _ = try await b.waitForLine(containing: "alice: hi bob, this is alice over \(kind)", timeout: .seconds(30))
        _ = try await a.waitForLine(containing: "bob: hi alice", timeout: .seconds(30))
        b.type("/peers\n")
        _ = try await b.waitForStderrLine(containing: "\(kind.rawValue) \(target)", timeout: .seconds(30))
        b.closeInput()
        #expect(try await b.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(b.stderr)")
        _ = try await a.waitForLine(containing: "* bob left", timeout: .seconds(30))
        a.closeInput()
        #expect(try await a.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(a.stderr)")
    }

    // Last: it takes hci0 down and up again.
    @Test func adapterTakenDownMidSessionEndsTheLinkWithAReason() async throws {
        let (server, client) = try await Self.pair()
        do {
            let endpoint = try #require(server.session.listeners.flatMap(\.localEndpoints).first { $0.transport == "l2cap" })
            let peer = try await client.session.connect(to: endpoint)
            try await client.waitForState(peer, .connected)
            try await BluetoothLab.hciconfig(0, ["down"])
            try await client.waitForState(peer, .notConnected, within: .seconds(60))
            try await server.waitForState(client.session.localPeer, .notConnected, within: .seconds(60))
            // the state is read before the event reaches the log: wait for the event itself
            try await client.waitFor("the not-connected report with its reason") { events in
                events.contains { event in
                    if case .peerStateChanged(peer, .notConnected, let reason?) = event { return !reason.isEmpty }
                    return false
                }
            }
        } catch {
            try? await BluetoothLab.hciconfig(0, ["up"])
            await client.stop()
            await server.stop()
            throw error
        }
        try await BluetoothLab.hciconfig(0, ["up"])
        await client.stop()
        await server.stop()
    }
}
