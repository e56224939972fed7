import Logging
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// A session on several transports at once, and connecting to an explicit endpoint whose peer
/// nobody discovered. Real loopback TCP next to the in-memory transport.
@Suite("PeerSession on several transports", .timeLimit(.minutes(1)))
struct PeerSessionTransportsTests {
    /// A peer listening on both the memory network (`memory://name`) and loopback TCP.
    static func node(_ name: String, network: MemoryNetwork, log: TestLog) throws -> (SessionNode, TCPTransportListener) {
        let configuration = PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName(name), serviceType: SessionNode.chat, encryption: .required)
        let memory = try network.listen(name: name)
        let tcp = try TCPTransportListener(host: "127.0.0.1")
        let session = PeerSession(
            configuration: configuration, transports: [network.transport, TCPTransport()], listeners: [memory, tcp],
            logger: log.logger)
        return (SessionNode(session: session, listener: memory), tcp)
    }

    static func waitUntilRunning(_ sessions: [PeerSession]) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while sessions.contains(where: { !$0.isRunning }) {
            guard ContinuousClock.now < deadline else { throw PeerLinkError(.timedOut, "the sessions did not start") }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    @Test(arguments: ["tcp", "memory"])
    func connectToAnExplicitEndpointLearnsThePeerFromTheHandshake(_ kind: String) async throws {
        let network = MemoryNetwork()
        let log = TestLog()
        let (ana, anaTCP) = try Self.node("ana", network: network, log: log)
        let (bo, boTCP) = try Self.node("bo", network: network, log: log)
        defer {
            anaTCP.close()
            boTCP.close()
        }
        try await withRunning([ana, bo]) {
            try await Self.waitUntilRunning([ana.session, bo.session])
            let endpoint = kind == "tcp" ? try #require(boTCP.localEndpoints.first) : Endpoint.memory(name: "bo")
            // Bo answers invitations: accept the one that comes.
            let answered = Task {
                while !Task.isCancelled {
                    if let invitation = bo.log.events.invitationsReceived.first {
                        try? await bo.session.respond(to: invitation.id, accept: true)
                        return
                    }
                    try? await Task.sleep(for: .milliseconds(5))
                }
            }
            defer { answered.cancel() }
            let peer = try await ana.session.connect(to: endpoint)
            #expect(peer == bo.peer, "the handshake says who answered")
            try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
            try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
            let info = try #require(await ana.session.info(for: bo.peer))
            #expect(info.transport == kind, "dialled with the transport of the endpoint's kind")
            #expect(info.encrypted)
            try await ana.session.send(Array("hi".utf8), to: [bo.peer])
            try await bo.log.wait("the message at Bo") { $0.messages(from: ana.peer) == [Array("hi".utf8)] }
        }
    }

    @Test func anEndpointNoTransportDialsIsAClearError() async throws {
        let network = MemoryNetwork()
        let log = TestLog()
        let (ana, anaTCP) = try Self.node("ana", network: network, log: log)
        defer { anaTCP.close() }
        try await withRunning([ana]) {
            try await Self.waitUntilRunning([ana.session])
            // A kind neither of its transports (memory, tcp) dials.
            let endpoint = Endpoint.memory(name: "bo", kind: "faraway")
            let error = await #expect(throws: PeerLinkError.self) { _ = try await ana.session.connect(to: endpoint) }
            #expect(error?.code == .unsupported)
            #expect(error?.message.contains("no transport of this session dials") == true, "\(String(describing: error))")
        }
    }

    @Test func connectBeforeRunIsAClearError() async throws {
        let network = MemoryNetwork()
        let (ana, anaTCP) = try Self.node("ana", network: network, log: TestLog())
        defer {
            anaTCP.close()
            ana.listener.close()
        }
        let error = await #expect(throws: PeerLinkError.self) { _ = try await ana.session.connect(to: .memory(name: "bo")) }
        #expect(error?.code == .notConnected)
    }
}
