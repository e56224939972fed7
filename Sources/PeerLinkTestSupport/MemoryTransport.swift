import PeerLinkCore

/// An in-memory network for deterministic tests: listeners register under a name, dials of
/// `memory://name` connect to them, and each connection is a pair of ``MemoryChannel``s —
/// ordered byte pipes with a bounded buffer per direction and back-pressure. Peers advertise
/// and browse on it too (``publish(_:serviceType:kind:)``, ``browse(serviceType:kind:excluding:)``), which
/// is how ``MemoryTransportModule`` plays a whole transport in a node's tests.
///
/// A listener may take another kind than `memory` (`listen(name:kind:)`): its endpoint is then
/// `KIND://name`, so tests can run several in-memory transports side by side.
///
/// No threads, no sleeps: everything happens when a task reads, writes or closes. Faults are
/// injected with ``cut(_:)`` or ``MemoryChannel/sever()``, which act like a pulled cable: both
/// ends go silent (reads wait, writes vanish) instead of seeing the end of the stream.
///
/// ```swift
/// let network = MemoryNetwork()
/// let listener = try network.listen(name: "bo")
/// let dialed = try await network.transport.dial(.memory(name: "bo"), timeout: .seconds(1))
/// let accepted = try await listener.accept()
/// ```
public final class MemoryNetwork: Sendable {
    /// How many bytes each direction of a connection holds before writers wait.
    public let bufferCapacity: Int
    /// The ``PeerLinkCore/LinkChannel/writeBatchLimit`` of its channels (nil: the default).
    public let writeBatchLimit: Int?

    private struct State {
        var listeners: [String: MemoryListener] = [:]
        var connections: [String: [MemoryConnection]] = [:]
        var dialCount = 0
        var directory = MemoryDirectory()
    }

    private let state = Locked(State())

    public init(bufferCapacity: Int = 64 * 1024, writeBatchLimit: Int? = nil) {
        self.bufferCapacity = max(1, bufferCapacity)
        self.writeBatchLimit = writeBatchLimit
    }

    /// A transport that dials this network's listeners.
    public var transport: MemoryTransport { MemoryTransport(network: self) }

    /// Starts a listener reachable as `KIND://name` (`memory://name` by default).
    ///
    /// - Throws: ``PeerLinkError`` (`invalidParameter`) when a listener already has that name.
    public func listen(name: String, kind: TransportKind = .memory) throws(PeerLinkError) -> MemoryListener {
        try state.withLock { state throws(PeerLinkError) -> MemoryListener in
            guard state.listeners[name] == nil else {
                throw PeerLinkError(.invalidParameter, "\(kind)://\(name) already has a listener: close it or pick another name")
            }
            let listener = MemoryListener(name: name, kind: kind, network: self)
            state.listeners[name] = listener
            return listener
        }
    }

    /// Publishes `peer` on the network for browsers of `serviceType` on links of `kind`, until
    /// the publication is stopped (browsers then report it lost).
    public func publish(_ peer: DiscoveredPeer, serviceType: ServiceType, kind: TransportKind = .memory) -> MemoryPublication {
        let scope = MemoryDirectory.Scope(serviceType: serviceType, kind: kind)
        let (id, deliveries) = state.withLock { $0.directory.publish(peer, scope: scope) }
        for (sink, event) in deliveries { sink.yield(event) }
        return MemoryPublication(network: self, id: id, peer: peer)
    }

    func withdraw(_ id: Int) {
        let deliveries = state.withLock { $0.directory.withdraw(id) }
        for (sink, event) in deliveries { sink.yield(event) }
    }

    /// What is published for `serviceType` on links of `kind` now, and what is published or
    /// withdrawn from now on: `found` for each peer published (the ones published already first),
    /// `lost` when its last publication stops. Peers in `excluding` are never reported. Browsing
    /// stops when the consumer stops iterating.
    public func browse(serviceType: ServiceType, kind: TransportKind = .memory, excluding: Set<Fingerprint> = []) -> AsyncStream<DiscoveryEvent> {
        let (events, sink) = AsyncStream.makeStream(of: DiscoveryEvent.self)
        let scope = MemoryDirectory.Scope(serviceType: serviceType, kind: kind)
        let (id, initial) = state.withLock { $0.directory.addBrowser(scope: scope, excluding: excluding, sink: sink) }
        for event in initial { sink.yield(event) }
        sink.onTermination = { [weak self] _ in self?.state.withLock { $0.directory.removeBrowser(id) } }
        return events
    }

    /// Severs every open connection to the listener `name`, as if its cable were pulled: see
    /// ``MemoryChannel/sever()``. Later dials still reach the listener.
    public func cut(_ name: String) {
        let connections = state.withLock { state -> [MemoryConnection] in
            let connections = state.connections[name] ?? []
            state.connections[name] = nil
            return connections
        }
        for connection in connections { connection.sever() }
    }

    /// Connects to the listener `name` of `kind`: the dialer's end, whose peer waits in the
    /// listener's accept queue.
    func dial(_ name: String, kind: TransportKind = .memory) throws(PeerLinkError) -> MemoryChannel {
        try state.withLock { state throws(PeerLinkError) -> MemoryChannel in
            guard let listener = state.listeners[name], listener.kind == kind else {
                throw PeerLinkError.nothingListens("nothing listens at \(kind)://\(name): is the peer still running?")
            }
            state.dialCount += 1
            let connection = MemoryConnection(capacity: bufferCapacity)
            state.connections[name, default: []].removeAll { $0.isFinished }
            state.connections[name, default: []].append(connection)
            let dialer = MemoryChannel(
                connection: connection, side: 0, kind: kind, remoteDescription: "\(kind)://\(name)",
                writeBatchLimit: writeBatchLimit)
            let accepted = MemoryChannel(
                connection: connection, side: 1, kind: kind, remoteDescription: "\(kind)://\(name)/dialer-\(state.dialCount)",
                writeBatchLimit: writeBatchLimit)
            guard listener.enqueue(accepted) else {
                throw PeerLinkError.nothingListens("nothing listens at \(kind)://\(name): is the peer still running?")
            }
            return dialer
        }
    }

    func remove(_ listener: MemoryListener) {
        state.withLock { state in
            if state.listeners[listener.name] === listener { state.listeners[listener.name] = nil }
        }
    }
}

/// Dials the ``MemoryEndpoint``s of one kind (`memory` by default) of one ``MemoryNetwork``;
/// other endpoints throw ``PeerLinkError`` with code `unsupported`. Dials complete at once (the
/// timeout is not used).
public struct MemoryTransport: Transport {
    public let network: MemoryNetwork
    /// The kind of the endpoints it dials.
    public let kind: TransportKind

    public init(network: MemoryNetwork, kind: TransportKind = .memory) {
        self.network = network
        self.kind = kind
    }

    public var name: String { kind.rawValue }
    public var kinds: Set<TransportKind> { [kind] }

    public func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel {
        guard let target = endpoint.memory, target.kind == kind else {
            throw PeerLinkError(.unsupported, "the \(kind) transport dials \(kind):// endpoints, not \(endpoint)")
        }
        return try network.dial(target.name, kind: kind)
    }
}

/// A listener of a ``MemoryNetwork``: dialled connections wait here until accepted.
public final class MemoryListener: TransportListener {
    public let name: String
    public let kind: TransportKind
    public var localEndpoints: [Endpoint] { [.memory(name: name, kind: kind)] }
    private let network: MemoryNetwork

    private struct State {
        var queue: [MemoryChannel] = []
        var waiters = WaiterList<any LinkChannel>()
        var closed = false
    }

    private let state = Locked(State())

    init(name: String, kind: TransportKind, network: MemoryNetwork) {
        self.name = name
        self.kind = kind
        self.network = network
    }

    public func accept() async throws -> any LinkChannel {
        let id = state.withLock { $0.waiters.makeID() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                state.withLock { state in
                    if !state.queue.isEmpty {
                        continuation.resume(returning: state.queue.removeFirst())
                    } else if state.closed {
                        continuation.resume(throwing: PeerLinkError(.notConnected, "the listener \(kind)://\(name) is closed"))
                    } else if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        state.waiters.add(id, continuation)
                    }
                }
            }
        } onCancel: {
            state.withLock { $0.waiters.remove(id) }?.resume(throwing: CancellationError())
        }
    }

    /// Hands a new connection to a waiting `accept`, or queues it. False once closed.
    func enqueue(_ channel: MemoryChannel) -> Bool {
        // Waiters are resumed with the lock released: a cancellation handler takes it.
        let (queued, waiter) = state.withLock { state -> (Bool, CheckedContinuation<any LinkChannel, any Error>?) in
            guard !state.closed else { return (false, nil) }
            if let waiter = state.waiters.removeFirst() { return (true, waiter) }
            state.queue.append(channel)
            return (true, nil)
        }
        waiter?.resume(returning: channel)
        return queued
    }

    /// Stops listening: pending and later accepts throw, connections not accepted yet are closed.
    public func close() {
        let (unaccepted, waiters) = state.withLock { state -> ([MemoryChannel], [CheckedContinuation<any LinkChannel, any Error>]) in
            guard !state.closed else { return ([], []) }
            state.closed = true
            defer { state.queue = [] }
            return (state.queue, state.waiters.removeAll())
        }
        for waiter in waiters {
            waiter.resume(throwing: PeerLinkError(.notConnected, "the listener \(kind)://\(name) is closed"))
        }
        for channel in unaccepted { channel.close() }
        network.remove(self)
    }
}

/// One end of an in-memory connection.
///
/// - `read()` returns what the peer wrote, in order; `[]` once the peer closed and everything
///   before was read; it throws after this end closed (also a read that was waiting).
/// - `write(_:)` waits while the peer's buffer is full (back-pressure); it throws after this end
///   closed, or once the peer closed (like `EPIPE`).
/// - ``sever()`` cuts the connection silently for both ends: reads wait until the task is
///   cancelled or this end is closed, writes are dropped.
public final class MemoryChannel: LinkChannel {
    public var transport: String { kind.rawValue }
    public let remoteDescription: String
    /// The kind of the listener it was dialled to.
    public let kind: TransportKind
    private let connection: MemoryConnection
    private let side: Int
    private let writes = Locked(0)
    private let batchLimit: Int?

    init(
        connection: MemoryConnection, side: Int, kind: TransportKind = .memory, remoteDescription: String,
        writeBatchLimit: Int? = nil
    ) {
        self.connection = connection
        self.side = side
        self.kind = kind
        self.remoteDescription = remoteDescription
        batchLimit = writeBatchLimit
    }

    /// The network's ``MemoryNetwork/writeBatchLimit``, else the default (32 KiB).
    public var writeBatchLimit: Int { batchLimit ?? 2 * WireFormat.maxFramePayload }

    /// As a real transport of its kind would: ``PeerLinkCore/WireFormat/maxFramePayload`` for the
    /// Bluetooth kinds (`rfcomm`, `l2cap`), ``PeerLinkCore/WireFormat/largeFramePayload`` for the others.
    public var largestFramePayload: Int {
        kind.rawValue == "rfcomm" || kind.rawValue == "l2cap" ? WireFormat.maxFramePayload : WireFormat.largeFramePayload
    }

    public func read() async throws -> [UInt8] {
        try await connection.read(side: side, description: remoteDescription)
    }

    public func write(_ bytes: [UInt8]) async throws {
        if !bytes.isEmpty { writes.withLock { $0 += 1 } }
        try await connection.write(bytes, side: side, description: remoteDescription)
    }

    public func writeNow(_ bytes: [UInt8]) throws -> Int {
        // Counted before the bytes can reach the reader (and taken back if none went): a reader
        // that has them sees the write in the count.
        writes.withLock { $0 += 1 }
        let taken: Int
        do {
            taken = try connection.writeNow(bytes, side: side, description: remoteDescription)
        } catch {
            writes.withLock { $0 -= 1 }
            throw error
        }
        if taken == 0 { writes.withLock { $0 -= 1 } }
        return taken
    }

    /// Writes to this end that took bytes (``write(_:)``, and ``writeNow(_:)`` when it took
    /// any): the system calls a socket would have seen.
    public var writeCount: Int { writes.withLock { $0 } }

    public func close() { connection.close(side: side) }

    /// Cuts the connection like a pulled cable: from now on neither end hears anything, and
    /// neither learns it (no end of stream). Only closing an end, or cancelling its task, ends
    /// a read that waits.
    public func sever() { connection.sever() }

    /// Whether this end was closed.
    public var isClosed: Bool { connection.isClosed(side: side) }

    /// Bytes written to this end and not read by the peer yet.
    public var bufferedByteCount: Int { connection.bufferedByteCount(towards: 1 - side) }
}

/// Lists of suspended callers, each under an id so a cancelled one can be found.
struct WaiterList<T: Sendable> {
    private var nextID = 0
    private var entries: [(id: Int, continuation: CheckedContinuation<T, any Error>)] = []

    var isEmpty: Bool { entries.isEmpty }

    mutating func makeID() -> Int {
        nextID += 1
        return nextID
    }

    mutating func add(_ id: Int, _ continuation: CheckedContinuation<T, any Error>) {
        entries.append((id, continuation))
    }

    mutating func remove(_ id: Int) -> CheckedContinuation<T, any Error>? {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return nil }
        return entries.remove(at: index).continuation
    }

    mutating func removeFirst() -> CheckedContinuation<T, any Error>? {
        entries.isEmpty ? nil : entries.removeFirst().continuation
    }

    mutating func removeAll() -> [CheckedContinuation<T, any Error>] {
        defer { entries = [] }
        return entries.map(\.continuation)
    }
}

/// Both directions of one in-memory connection, under one lock. Direction `d` carries bytes
/// towards side `d` (side 0 dialled, side 1 accepted).
///
/// Waiting reads and writes are resumed with the lock released (``locked(_:)``): their
/// cancellation handlers take the lock, on the cancelling thread, holding the cancelled task's
/// status lock, which a resume of that task takes too.
final class MemoryConnection: Sendable {
    private struct PendingWrite {
        let id: Int
        var remaining: ArraySlice<UInt8>
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct Direction {
        var buffer: [UInt8] = []
        /// The sending side closed: the end of the stream once the buffer is read.
        var senderClosed = false
        /// The receiving side closed: writes fail.
        var receiverClosed = false
        var reader: (id: Int, continuation: CheckedContinuation<[UInt8], any Error>)?
        var writers: [PendingWrite] = []
    }

    private struct State {
        var directions = [Direction(), Direction()]
        var closed = [false, false]
        var severed = false
        var nextID = 0
        /// Resumes to run once the lock is released.
        var wakeups: [@Sendable () -> Void] = []
    }

    let capacity: Int
    private let state = Locked(State())

    init(capacity: Int) {
        self.capacity = capacity
    }

    /// `withLock`, then the resumes `body` queued in `wakeups`, with the lock released.
    private func locked<R: Sendable>(_ body: (inout State) -> R) -> R {
        let (result, wakeups) = state.withLock { state -> (R, [@Sendable () -> Void]) in
            let result = body(&state)
            defer { state.wakeups = [] }
            return (result, state.wakeups)
        }
        for wakeup in wakeups { wakeup() }
        return result
    }

    var isFinished: Bool { state.withLock { ($0.closed[0] && $0.closed[1]) || $0.severed } }

    func isClosed(side: Int) -> Bool { state.withLock { $0.closed[side] } }

    func bufferedByteCount(towards side: Int) -> Int {
        state.withLock { state in
            state.directions[side].buffer.count + state.directions[side].writers.reduce(0) { $0 + $1.remaining.count }
        }
    }

    func read(side: Int, description: String) async throws -> [UInt8] {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                locked { state in
                    // Like a socket: what is there is returned even to a cancelled task; only
                    // waiting is cancelled. (This task's own continuation can be resumed under
                    // the lock: it has not suspended yet.)
                    if state.closed[side] {
                        continuation.resume(throwing: Self.closedHere(description))
                    } else if !state.severed, !state.directions[side].buffer.isEmpty {
                        let bytes = state.directions[side].buffer
                        state.directions[side].buffer = []
                        Self.pump(&state.directions[side], capacity: capacity, wakeups: &state.wakeups)
                        continuation.resume(returning: bytes)
                    } else if !state.severed, state.directions[side].senderClosed {
                        continuation.resume(returning: [])
                    } else if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        // Severed: a pulled cable, nothing will come.
                        state.directions[side].reader = (id, continuation)
                    }
                }
            }
        } onCancel: {
            let reader = state.withLock { state -> CheckedContinuation<[UInt8], any Error>? in
                guard let reader = state.directions[side].reader, reader.id == id else { return nil }
                state.directions[side].reader = nil
                return reader.continuation
            }
            reader?.resume(throwing: CancellationError())
        }
    }

    func write(_ bytes: [UInt8], side: Int, description: String) async throws {
        guard !bytes.isEmpty else { return }
        let target = 1 - side
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                locked { state in
                    if state.closed[side] {
                        continuation.resume(throwing: Self.closedHere(description))
                    } else if state.severed {
                        continuation.resume()  // into the void
                    } else if state.directions[target].receiverClosed {
                        continuation.resume(throwing: PeerLinkError(.notConnected, "the peer at \(description) closed the link"))
                    } else {
                        // Like a socket: what fits is taken even from a cancelled task; only
                        // waiting for room is cancelled (and leaves the write cut short).
                        state.directions[target].writers.append(PendingWrite(id: id, remaining: bytes[...], continuation: continuation))
                        Self.pump(&state.directions[target], capacity: capacity, wakeups: &state.wakeups)
                        if Task.isCancelled, let index = state.directions[target].writers.firstIndex(where: { $0.id == id }) {
                            state.directions[target].writers.remove(at: index).continuation.resume(throwing: CancellationError())
                        }
                    }
                }
            }
        } onCancel: {
            let writer = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.directions[target].writers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.directions[target].writers.remove(at: index).continuation
            }
            writer?.resume(throwing: CancellationError())
        }
    }

    /// What fits of `bytes` now, behind no waiting write: like a non-blocking socket.
    func writeNow(_ bytes: [UInt8], side: Int, description: String) throws(PeerLinkError) -> Int {
        let target = 1 - side
        let taken = locked { state -> Result<Int, PeerLinkError> in
            if state.closed[side] { return .failure(Self.closedHere(description)) }
            if state.severed { return .success(bytes.count) }  // into the void
            if state.directions[target].receiverClosed {
                return .failure(PeerLinkError(.notConnected, "the peer at \(description) closed the link"))
            }
            guard state.directions[target].writers.isEmpty else { return .success(0) }
            let count = min(bytes.count, max(0, capacity - state.directions[target].buffer.count))
            guard count > 0 else { return .success(0) }
            state.directions[target].buffer += bytes[..<count]
            Self.pump(&state.directions[target], capacity: capacity, wakeups: &state.wakeups)
            return .success(count)
        }
        return try taken.get()
    }

    func close(side: Int) {
        locked { state in
            guard !state.closed[side] else { return }
            state.closed[side] = true
            let closedHere = Self.closedHere("the peer")
            // This end's waiting read and writes fail.
            if let reader = state.directions[side].reader {
                state.directions[side].reader = nil
                state.wakeups.append { reader.continuation.resume(throwing: closedHere) }
            }
            let writers = state.directions[1 - side].writers
            state.wakeups.append { for writer in writers { writer.continuation.resume(throwing: closedHere) } }
            state.directions[1 - side].writers = []
            // A severed peer never learns.
            guard !state.severed else { return }
            // The peer reads the rest, then the end of the stream.
            state.directions[1 - side].senderClosed = true
            Self.pump(&state.directions[1 - side], capacity: capacity, wakeups: &state.wakeups)
            // The peer's writes fail from now on.
            state.directions[side].receiverClosed = true
            state.directions[side].buffer = []
            let gone = PeerLinkError(.notConnected, "the peer closed the link")
            let refused = state.directions[side].writers
            state.wakeups.append { for writer in refused { writer.continuation.resume(throwing: gone) } }
            state.directions[side].writers = []
        }
    }

    func sever() {
        locked { state in
            guard !state.severed else { return }
            state.severed = true
            for side in 0..<2 {
                state.directions[side].buffer = []
                // Waiting writes complete: the bytes are lost on the way.
                let writers = state.directions[side].writers
                state.wakeups.append { for writer in writers { writer.continuation.resume() } }
                state.directions[side].writers = []
            }
        }
    }

    /// Moves waiting writes into the buffer as room allows, handing the buffer to a waiting
    /// reader; at the end of the stream, the waiting reader gets `[]`. The resumes go to
    /// `wakeups`, for after the lock.
    private static func pump(_ direction: inout Direction, capacity: Int, wakeups: inout [@Sendable () -> Void]) {
        while true {
            while direction.buffer.count < capacity, !direction.writers.isEmpty {
                let room = capacity - direction.buffer.count
                let taken = direction.writers[0].remaining.prefix(room)
                direction.buffer += taken
                direction.writers[0].remaining = direction.writers[0].remaining.dropFirst(taken.count)
                if direction.writers[0].remaining.isEmpty {
                    let writer = direction.writers.removeFirst().continuation
                    wakeups.append { writer.resume() }
                }
            }
            guard let reader = direction.reader else { return }
            if !direction.buffer.isEmpty {
                direction.reader = nil
                let bytes = direction.buffer
                direction.buffer = []
                wakeups.append { reader.continuation.resume(returning: bytes) }
                continue
            }
            if direction.senderClosed {
                direction.reader = nil
                wakeups.append { reader.continuation.resume(returning: []) }
            }
            return
        }
    }

    private static func closedHere(_ description: String) -> PeerLinkError {
        PeerLinkError(.notConnected, "the link to \(description) was closed on this side")
    }
}
