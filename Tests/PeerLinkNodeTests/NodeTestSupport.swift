import Foundation
import Logging
import PeerLink
import PeerLinkTestSupport
import Testing

/// Every event one node reported, with a way to wait for a condition on them.
final class NodeLog: Sendable {
    private let state = Locked<[PeerNodeEvent]>([])

    var events: [PeerNodeEvent] { state.withLock { $0 } }

    /// Consumes the node's events until the stream ends.
    func record(_ stream: some AsyncSequence<PeerNodeEvent, Never>) async {
        for await event in stream {
            state.withLock { $0.append(event) }
        }
    }

    /// Waits (polling) until `condition` holds for the events so far; real time bounds the wait
    /// only when something is wrong: then it fails, naming `what`.
    func wait(
        _ what: String, within bound: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
        until condition: ([PeerNodeEvent]) -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + bound
        while !condition(events) {
            guard ContinuousClock.now < deadline else {
                let recent = events.suffix(15).map(\.description).joined(separator: "\n  ")
                Issue.record("timed out waiting for: \(what). Last events:\n  \(recent)", sourceLocation: sourceLocation)
                throw NodeWaitTimedOut()
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}

struct NodeWaitTimedOut: Error {}

extension [PeerNodeEvent] {
    /// The session events, in order.
    var sessionEvents: [PeerSessionEvent] {
        compactMap { if case .session(let event) = $0 { event } else { nil } }
    }

    func connected(_ peer: PeerID) -> Bool {
        var state = PeerState.notConnected
        for case .peerStateChanged(let changed, let now, _) in sessionEvents where changed == peer { state = now }
        return state == .connected
    }

    func verdict(for peer: PeerID) -> KnownPeers.Verdict? {
        for case .met(let met, let verdict, _) in self where met == peer { return verdict }
        return nil
    }

    var notices: [TransportNotice] {
        compactMap { if case .transport(let notice) = $0 { notice } else { nil } }
    }

    var linkFailures: [String] {
        sessionEvents.compactMap { if case .linkFailed(_, let reason) = $0 { reason } else { nil } }
    }

    var invitations: [(id: InvitationID, from: PeerID)] {
        sessionEvents.compactMap { if case .invitationReceived(let id, let from, _) = $0 { (id, from) } else { nil } }
    }

    /// The last merged discovery report about `peer`, nil when lost (or never found).
    func discovered(_ peer: PeerID) -> DiscoveredPeer? {
        var found: DiscoveredPeer?
        for case .discovery(let event) in self {
            switch event {
            case .found(let seen), .updated(let seen): if seen.id == peer { found = seen }
            case .lost(let lost): if lost == peer { found = nil }
            }
        }
        return found
    }
}

/// One node of a test, on in-memory transports, with its event log.
struct TestNode: Sendable {
    static let service = try! ServiceType("nodes")
    static let quiet = Logger(label: "peerlink.test") { _ in SwiftLogNoOpLogHandler() }

    let node: PeerNode
    let log = NodeLog()

    var peer: PeerID { node.localPeer }

    /// A node called `name` whose transports are in-memory modules of `kinds` (listeners
    /// `name-kind`), or `modules` when given.
    static func make(
        _ name: String, network: MemoryNetwork, kinds: [TransportKind] = [.memory], modules: [any TransportModule]? = nil,
        identity: Identity = .generate(), automatic: Bool = false, ranking: TransportRanking = .standard, advertising: Bool = true,
        discoveryRequired: Bool = true, knownPeersPath: String? = nil, admitOnlyKnownPeers: Bool = false, clock: ManualClock
    ) throws -> TestNode {
        let chosen = modules ?? kinds.map { MemoryTransportModule(network: network, listenerName: "\(name)-\($0)", kind: $0) }
        let configuration = PeerNodeConfiguration(
            session: PeerSessionConfiguration(
                identity: identity, displayName: try DisplayName(name), serviceType: service, encryption: .optional,
                policy: SessionPolicy(automatic: automatic)),
            transports: .modules(chosen), ranking: ranking, advertising: advertising, discoveryRequired: discoveryRequired,
            knownPeersPath: knownPeersPath, admitOnlyKnownPeers: admitOnlyKnownPeers)
        return TestNode(node: try PeerNode(configuration: configuration, clock: clock, logger: quiet))
    }

    /// Answers every invitation with `accept`, as long as the node runs.
    func answerInvitations(accept: Bool) -> Task<Void, Never> {
        Task {
            var answered: Set<InvitationID> = []
            while !Task.isCancelled {
                for invitation in log.events.invitations where answered.insert(invitation.id).inserted {
                    try? await node.session.respond(to: invitation.id, accept: accept)
                }
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
    }
}

/// Runs every node (and records its events) around `body`; then disconnects them all and waits
/// until each node's run and events are over.
func withRunning(_ nodes: [TestNode], _ body: () async throws -> Void) async throws {
    try await withThrowingTaskGroup(of: Void.self) { group in
        for node in nodes {
            group.addTask { await node.node.run() }
            group.addTask { await node.log.record(node.node.events) }
        }
        do {
            try await body()
        } catch {
            for node in nodes { await node.node.disconnect() }
            try? await group.waitForAll()
            throw error
        }
        for node in nodes { await node.node.disconnect() }
        try await group.waitForAll()
    }
}

/// A fresh directory for a test's files.
func temporaryDirectory(_ label: String) -> String {
    let path = NSTemporaryDirectory() + "peerlink-node-\(label)-\(UUID().uuidString)"
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}
