import Logging
import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// Every event one session reported, with a way to wait for a condition on them.
final class EventLog: Sendable {
    private struct Waiter {
        let id: Int
        let condition: @Sendable ([PeerSessionEvent]) -> Bool
        let continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var events: [PeerSessionEvent] = []
        var waiters: [Waiter] = []
        var nextID = 0
    }

    private let state = Locked(State())

    var events: [PeerSessionEvent] { state.withLock { $0.events } }

    /// Consumes the session's events until the stream ends.
    func record(_ stream: some AsyncSequence<PeerSessionEvent, Never>) async {
        for await event in stream {
            state.withLock { state in
                state.events.append(event)
                let events = state.events
                state.waiters.removeAll { waiter in
                    guard waiter.condition(events) else { return false }
                    waiter.continuation.resume(returning: true)
                    return true
                }
            }
        }
    }

    /// Waits until `condition` holds for the events so far. Real time bounds the wait only when
    /// something is wrong: then it fails, naming `what`.
    func wait(
        _ what: String, within bound: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
        until condition: @escaping @Sendable ([PeerSessionEvent]) -> Bool
    ) async throws {
        let met = await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.satisfied(condition) }
            group.addTask {
                try? await Task.sleep(for: bound)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        if !met {
            let recent = events.suffix(12).map(\.description).joined(separator: "\n  ")
            Issue.record("timed out waiting for: \(what). Last events:\n  \(recent)", sourceLocation: sourceLocation)
            throw WaitTimedOut()
        }
    }

    private func satisfied(_ condition: @escaping @Sendable ([PeerSessionEvent]) -> Bool) async -> Bool {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                state.withLock { state in
                    if condition(state.events) {
                        continuation.resume(returning: true)
                    } else if Task.isCancelled {
                        continuation.resume(returning: false)
                    } else {
                        state.waiters.append(Waiter(id: id, condition: condition, continuation: continuation))
                    }
                }
            }
        } onCancel: {
            state.withLock { state in
                if let index = state.waiters.firstIndex(where: { $0.id == id }) {
                    state.waiters.remove(at: index).continuation.resume(returning: false)
                }
            }
        }
    }
}

struct WaitTimedOut: Error {}

extension [PeerSessionEvent] {
    /// The state the last `peerStateChanged` for `peer` reported.
    func state(of peer: PeerID) -> PeerState {
        for event in reversed() {
            if case .peerStateChanged(let changed, let state, _) = event, changed == peer { return state }
        }
        return .notConnected
    }

    /// The peers whose last reported state is connected.
    var connected: Set<PeerID> {
        var states: [PeerID: PeerState] = [:]
        for case .peerStateChanged(let peer, let state, _) in self { states[peer] = state }
        return Set(states.filter { $0.value == .connected }.keys)
    }

    func messages(from peer: PeerID) -> [[UInt8]] {
        compactMap { event in
            guard case .message(let from, let data, _) = event, from == peer else { return nil }
            return data
        }
    }

    var linkFailures: [(peer: PeerID?, reason: String)] {
        compactMap { event in
            guard case .linkFailed(let peer, let reason) = event else { return nil }
            return (peer, reason)
        }
    }

    func invitationResult(_ id: InvitationID) -> InvitationOutcome? {
        for case .invitationResult(let invitation, _, let outcome) in self where invitation == id { return outcome }
        return nil
    }

    var invitationsReceived: [(id: InvitationID, from: PeerID, context: [UInt8])] {
        compactMap { event in
            guard case .invitationReceived(let id, let from, let context) = event else { return nil }
            return (id, from, context)
        }
    }
}

/// One peer of a test: a session, the listener it accepts on, its event log.
struct SessionNode: Sendable {
    static let chat = try! ServiceType("chat")

    let session: PeerSession
    let listener: any TransportListener
    let log = EventLog()
    /// Opening it cancels the task running ``PeerSession/run()``, like killing the process.
    let kill = Latch()

    var peer: PeerID { session.localPeer }

    /// What discovery would report about this peer.
    var discovered: DiscoveredPeer {
        DiscoveredPeer(id: peer, protocolVersion: 1, endpoints: listener.localEndpoints, info: try! DiscoveryInfo())
    }

    /// A peer on the in-memory network, listening at `memory://name`.
    static func memory(
        _ name: String, on network: MemoryNetwork, automatic: Bool = false, encryption: EncryptionPreference = .optional,
        clock: ManualClock, log: TestLog, admit: (@Sendable (PeerID) -> Bool)? = nil
    ) throws -> SessionNode {
        let configuration = PeerSessionConfiguration(
            identity: .generate(), displayName: try DisplayName(name), serviceType: chat, encryption: encryption,
            policy: SessionPolicy(automatic: automatic), admit: admit)
        let listener = try network.listen(name: name)
        let session = PeerSession(
            configuration: configuration, transport: network.transport, listener: listener, clock: clock, logger: log.logger)
        return SessionNode(session: session, listener: listener)
    }

    /// Runs the session until it returns by itself (disconnect) or ``kill`` opens.
    func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await session.run() }
            group.addTask { await kill.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Tells this peer discovery found `others`.
    func find(_ others: [SessionNode]) {
        for other in others where other.peer != peer {
            session.discovered(.found(other.discovered))
        }
    }
}

/// Two automatic peers on the memory transport, running and connected to each other, for `body`;
/// their time is `clock`'s (it moves only when the test moves it).
func withConnectedPair(
    clock: ManualClock = ManualClock(), _ body: (_ ana: SessionNode, _ bo: SessionNode) async throws -> Void
) async throws {
    let network = MemoryNetwork()
    let log = TestLog()
    let ana = try SessionNode.memory("ana", on: network, automatic: true, clock: clock, log: log)
    let bo = try SessionNode.memory("bo", on: network, automatic: true, clock: clock, log: log)
    try await withRunning([ana, bo]) {
        ana.find([bo])
        bo.find([ana])
        try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
        try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
        try await body(ana, bo)
    }
}

/// Runs every node (session and event log) around `body`; then disconnects them all, waits
/// for every ``PeerSession/run()`` to return, and closes the listeners.
func withRunning(_ nodes: [SessionNode], _ body: () async throws -> Void) async throws {
    try await withThrowingTaskGroup(of: Void.self) { group in
        for node in nodes {
            group.addTask { await node.run() }
            group.addTask { await node.log.record(node.session.events) }
        }
        do {
            try await body()
        } catch {
            group.cancelAll()
            for node in nodes { node.listener.close() }
            throw error
        }
        for node in nodes { await node.session.disconnect() }
        try await group.waitForAll()
        for node in nodes { node.listener.close() }
    }
}
