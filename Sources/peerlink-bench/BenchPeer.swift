import Foundation
import PeerLink
import Synchronization

/// One session of the benchmark, with its events consumed in a task of its own: it counts bulk
/// bytes, echoes pings, answers pongs, and records who is connected.
final class BenchPeer: Sendable {
    static let service = try! ServiceType("bench")
    static let ping: UInt8 = 0x50
    static let pong: UInt8 = 0x51

    let session: PeerSession
    let listeners: [any TransportListener]
    private let state = Locked(State())
    /// Bulk bytes received, counted without a lock: the sender's loop reads it before every
    /// message, and the consumer adds to it for every message. A lock for each (as until
    /// 2026-11-27) made the two threads hand it to each other, a cost the raw baselines, which
    /// count what one `recv` returned, do not pay.
    private let received = Atomic<Int>(0)
    /// The fewest bytes a caller of ``waitForBytes(_:)`` waits for (`Int.max`: none waits):
    /// adding bytes takes the lock only when the count reaches it. Until 2026-11-27 adding
    /// took the lock whenever anyone waited, and the sender waits for most of a small-message
    /// row (its window is full): 5 % of a 64 B row's CPU was the benchmark's own.
    private let wakeAt = Atomic<Int>(.max)

    private struct State {
        var connected: Set<PeerID> = []
        var waiters: [(check: @Sendable (State, _ bytes: Int) -> Bool, bytes: Int?, continuation: CheckedContinuation<Void, Never>)] = []
        var pong: CheckedContinuation<Void, Never>?
        /// A pong arrived before its ping's sender waited for it.
        var pongArrived = false
    }

    /// A session on 127.0.0.1 (TCP).
    convenience init(_ name: String, encryption: EncryptionPreference, automatic: Bool = true) throws {
        try self.init(
            name, encryption: encryption, automatic: automatic, transports: [TCPTransport()],
            listeners: [try TCPTransportListener(host: "127.0.0.1")])
    }

    /// A session over `transports`, reached at `listeners` (none: it only dials).
    init(
        _ name: String, encryption: EncryptionPreference, automatic: Bool = true, transports: [any Transport],
        listeners: [any TransportListener], dialTimeout: Duration = .seconds(5)
    ) throws {
        self.listeners = listeners
        session = PeerSession(
            configuration: PeerSessionConfiguration(
                identity: .generate(), displayName: try DisplayName(name), serviceType: Self.service,
                encryption: encryption, policy: SessionPolicy(automatic: automatic), dialTimeout: dialTimeout),
            transports: transports, listeners: listeners)
    }

    var peer: PeerID { session.localPeer }
    var endpoints: [Endpoint] { listeners.flatMap(\.localEndpoints) }
    var discovered: DiscoveredPeer {
        DiscoveredPeer(id: peer, protocolVersion: 1, endpoints: endpoints, info: try! DiscoveryInfo())
    }

    /// Runs the session and consumes its events until the session ends.
    func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.session.run() }
            group.addTask {
                for await event in self.session.events {
                    // Only a ping needs an `await` (its pong is sent): everything else is
                    // counted without the cost of an async call for each message, which the
                    // raw baselines do not pay either.
                    if case .message(let from, let data, _) = event, data.first == Self.ping {
                        var reply = data
                        reply[0] = Self.pong
                        try? await self.session.send(reply, to: [from])
                    } else {
                        self.handle(event)
                    }
                }
            }
            group.addTask {
                // Every incoming stream is read to its end; its bytes count as bulk bytes.
                await withTaskGroup(of: Void.self) { readers in
                    for await stream in self.session.incomingStreams {
                        readers.addTask {
                            while let chunk = try? await stream.read() { self.add(bytes: chunk.count) }
                        }
                    }
                }
            }
        }
        for listener in listeners { listener.close() }
    }

    /// Takes an event other than a ping (which `run` answers).
    private func handle(_ event: PeerSessionEvent) {
        switch event {
        case .peerStateChanged(let peer, let state, _):
            update { current in
                if state == .connected { current.connected.insert(peer) } else { current.connected.remove(peer) }
            }
        case .message(_, let data, _):
            switch data.first {
            case Self.pong:
                let waiting = state.withLock { state -> CheckedContinuation<Void, Never>? in
                    guard let pong = state.pong else {
                        state.pongArrived = true
                        return nil
                    }
                    state.pong = nil
                    return pong
                }
                waiting?.resume()
            default:
                add(bytes: data.count)
            }
        default:
            break
        }
    }

    /// Counts `bytes` of bulk data; looks at the waiters only when there are any. (Sequentially
    /// consistent on both sides: a waiter counts itself in and then reads the bytes, this adds
    /// the bytes and then reads the count, so one of the two sees the other.)
    private func add(bytes: Int) {
        let total = received.add(bytes, ordering: .sequentiallyConsistent).newValue
        if total >= wakeAt.load(ordering: .sequentiallyConsistent) { update { _ in } }
    }

    private func update(_ body: (inout State) -> Void) {
        let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            body(&state)
            let bytes = received.load(ordering: .sequentiallyConsistent)
            var waiters = state.waiters
            state.waiters = []
            var ready: [CheckedContinuation<Void, Never>] = []
            waiters.removeAll { waiter in
                guard waiter.check(state, bytes) else { return false }
                ready.append(waiter.continuation)
                return true
            }
            state.waiters = waiters
            wakeAt.store(waiters.compactMap(\.bytes).min() ?? .max, ordering: .sequentiallyConsistent)
            return ready
        }
        for continuation in ready { continuation.resume() }
    }

    /// Waits until `check` holds; `bytes`, when it waits for a count of bulk bytes (which adding
    /// bytes then looks for without the lock; other waits are looked at on state changes).
    private func wait(bytes: Int? = nil, until check: @escaping @Sendable (State, _ bytes: Int) -> Bool) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                // Counted in before the count is read; `add` adds before it reads the mark: one
                // of the two sees the other.
                if let bytes { wakeAt.store(min(bytes, wakeAt.load(ordering: .sequentiallyConsistent)), ordering: .sequentiallyConsistent) }
                if check(state, received.load(ordering: .sequentiallyConsistent)) {
                    wakeAt.store(state.waiters.compactMap(\.bytes).min() ?? .max, ordering: .sequentiallyConsistent)
                    return true
                }
                state.waiters.append((check, bytes, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Waits until at least `count` bulk bytes in all have arrived.
    func waitForBytes(_ count: Int) async { await wait(bytes: count) { _, bytes in bytes >= count } }
    var bytesReceived: Int { received.load(ordering: .sequentiallyConsistent) }

    /// Waits until `count` peers are connected.
    func waitForConnected(_ count: Int) async { await wait { state, _ in state.connected.count >= count } }

    /// One ping to `peer` and its pong: the round trip time. The ping is sent from the calling
    /// task, as an app would send it (no task of its own per ping, a cost the raw echo does not
    /// pay), and the pong may arrive before the call waits for it.
    func roundTrip(to peer: PeerID, size: Int = 64) async throws -> Duration {
        let clock = ContinuousClock()
        var message = [UInt8](repeating: 0, count: size)
        message[0] = Self.ping
        state.withLock { $0.pongArrived = false }
        let start = clock.now
        try await session.send(message, to: [peer])
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let arrived = state.withLock { state -> Bool in
                if state.pongArrived { return true }
                state.pong = continuation
                return false
            }
            if arrived { continuation.resume() }
        }
        return clock.now - start
    }
}

