import Logging
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import Testing

/// PeerSession over real sockets: 127.0.0.1 only, the system clock, bounded waits.
@Suite("PeerSession over loopback TCP", .timeLimit(.minutes(1)))
struct PeerSessionTCPTests {
    static let loopback = "127.0.0.1"

    static func node(_ name: String, log: TestLog) throws -> SessionNode {
        let configuration = PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName(name), serviceType: SessionNode.chat,
            policy: SessionPolicy(automatic: true))
        let listener = try TCPTransportListener(host: loopback)
        let session = PeerSession(configuration: configuration, transport: TCPTransport(), listener: listener, logger: log.logger)
        return SessionNode(session: session, listener: listener)
    }

    @Test("two sessions find each other by hand, connect and exchange messages")
    func twoSessions() async throws {
        let log = TestLog()
        let ana = try Self.node("ana", log: log)
        let bo = try Self.node("bo", log: log)
        for node in [ana, bo] {
            guard let tcp = try #require(node.listener.localEndpoints.first).tcp else {
                Issue.record("a TCP listener with a non-TCP endpoint")
                return
            }
            #expect(tcp.host == Self.loopback && tcp.port != 0)
        }
        try await withRunning([ana, bo]) {
            ana.find([bo])
            bo.find([ana])
            try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
            try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }

            let count = 200
            for index in 1...count {
                try await ana.session.send(Array("ana \(index)".utf8), to: [bo.peer])
                try await bo.session.send(Array("bo \(index)".utf8), to: [ana.peer], reliable: index % 2 == 0)
            }
            try await bo.log.wait("\(count) messages at Bo") { $0.messages(from: ana.peer).count == count }
            #expect(bo.log.events.messages(from: ana.peer) == (1...count).map { Array("ana \($0)".utf8) })
            // Every reliable one arrives; unreliable ones may be dropped when their lane is full.
            try await ana.log.wait("Bo's reliable messages at Ana") {
                $0.messages(from: bo.peer).filter { String(decoding: $0, as: UTF8.self).hasSuffix("\(count)") }.count == 1
            }
            let reliable = ana.log.events.compactMap { event -> [UInt8]? in
                guard case .message(bo.peer, let data, true) = event else { return nil }
                return data
            }
            #expect(reliable == stride(from: 2, through: count, by: 2).map { Array("bo \($0)".utf8) })

            let atAna = try #require(await ana.session.info(for: bo.peer))
            let atBo = try #require(await bo.session.info(for: ana.peer))
            #expect(atAna.transport == "tcp" && atAna.encrypted)
            #expect(atAna.remote.hasPrefix("tcp://127.0.0.1:"), "\(atAna.remote)")
            #expect(atAna.verificationCode == atBo.verificationCode)
        }
        #expect(ana.log.events.linkFailures.isEmpty, "\(ana.log.events.linkFailures)")
        #expect(bo.log.events.linkFailures.isEmpty, "\(bo.log.events.linkFailures)")
    }
}
