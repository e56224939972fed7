import Logging
@_spi(Runtime) import PeerLinkCore

/// One link to one peer, running: drives a ``LinkStateMachine`` over a ``LinkChannel``.
///
/// ``run()`` does the I/O until the link is over: it writes what the state machine sends (one
/// writer, in order, waiting for the channel), feeds it what the channel reads, and ticks it at
/// its deadlines on the injected clock. The rest of the API can be used from any task:
///
/// ```swift
/// let link = Link(channel: channel, role: .dialer, identity: me, preface: preface, hello: hello,
///                 expectedRemote: advertised, logger: logger)
/// try await withThrowingTaskGroup { group in
///     group.addTask { await link.run() }
///     let peer = try await link.established          // or the close reason
///     try await link.send(.message(id: 1, flags: [], chunk: FramePayload("hi".utf8)))
///     for await event in link.events { … }           // frames, then .closed once
///     link.close()                                    // GO_AWAY, then the channel closes
/// }
/// ```
///
/// Behaviour worth knowing:
/// - Cancelling the task in ``run()`` closes the link: a `GO_AWAY` goes out if the writer is
///   free, then the channel is closed without waiting for the peer.
/// - After this side sends a `GO_AWAY` on an established link, ``run()`` keeps reading (and
///   discarding) until the peer ends the stream or `closeTimeout` passes, so the `GO_AWAY` is
///   not lost to a reset; the link counts as closed from the moment it was sent. Once the
///   `GO_AWAY` is written the channel ends this side's direction where it can
///   (``PeerLinkCore/LinkChannel/finishWriting()``, TCP's half-close), and the wait also ends
///   at the peer's own `GO_AWAY` (``PeerLinkCore/LinkStateMachine/peerClosedToo``; RFCOMM and
///   L2CAP cannot half-close), so two sides that close at once each end at once instead of
///   waiting out `closeTimeout`.
/// - ``send(_:)`` waits for the handshake, and while more than `maxQueuedBytes` wait to be
///   written (back-pressure).
/// - The link's own frames (session control, datagrams) wait unsealed in a
///   ``PeerLinkCore/FrameScheduler`` and go first; then, once the link is attached to its
///   peer's ``PeerChannel`` (``attach(_:)``) and is the channel's active link, the channel's
///   sequenced frames (message chunks, stream data and credit), each numbered as it is sealed,
///   at most two maximum-size frames per write. Sequenced frames that arrive go to the channel,
///   which takes each once (a copy is dropped); those that arrive before the channel is attached
///   wait for it.
/// - Streams are the channel's, not the link's: they go on when the link closes and another
///   link to the same peer takes over.
/// - ``events`` is a single-consumer stream, buffered without limit: consume it. (A session's
///   links hand their events to the session instead, on the thread that read them: one
///   hand-over between tasks less for every frame.)
/// - The close reason is logged once, at info level, with the link's metadata (`peer.id`,
///   `transport`, `link.remote`, `link.role`).
public final class Link: Sendable {
    /// The outcome of a successful handshake.
    public struct Established: Hashable, Sendable {
        /// The authenticated peer (its key's fingerprint and display name).
        public var remote: PeerID
        public var hello: Hello
        public var encrypted: Bool
        public var version: UInt8
        /// The largest `DATA` or `MESSAGE` payload the link writes: what both sides take
        /// (``PeerLinkCore/Hello/framePayloadLimit(_:_:)``), within what the channel carries well
        /// (``PeerLinkCore/LinkChannel/largestFramePayload``). A session cuts messages into
        /// chunks of this size for the link.
        public var bulkFramePayload: Int = WireFormat.maxFramePayload
    }

    /// Why and by whom a link was closed.
    public struct Closure: Hashable, Sendable, CustomStringConvertible {
        public var code: GoAwayCode
        public var reason: String
        /// True when the peer ended it (its refusal, `GO_AWAY` or end of stream).
        public var byPeer: Bool
        /// True when the established link ended without a `GO_AWAY` either way: the end of its
        /// stream or an I/O error (a reset, an adapter or interface gone). The peer may still be
        /// there: a session dials it again (see ``PeerLinkCore/SessionPolicy/reconnectGrace``).
        public var lost = false
        /// The closure as the error that ``Link/established`` and ``Link/send(_:)`` throw.
        public var error: PeerLinkError

        public var description: String {
            "closed \(byPeer ? "by the peer" : "on this side"), code \(code): \(reason)"
        }
    }

    /// What arrives on a link: frames in order, then `.closed` exactly once, then the end.
    /// Sequenced frames reach ``events`` only once new to the link's channel, and only message
    /// chunks among them (stream frames are the channel's).
    public enum Event: Hashable, Sendable, CustomStringConvertible {
        case frame(Frame)
        case closed(code: GoAwayCode, reason: String, byPeer: Bool)

        public var description: String {
            switch self {
            case .frame(let frame): "frame \(frame)"
            case .closed(let code, let reason, let byPeer):
                "closed \(byPeer ? "by the peer" : "on this side"), code \(code): \(reason)"
            }
        }
    }

    public let channel: any LinkChannel
    public let role: LinkStateMachine.Role
    /// Frames from the peer, then `.closed` once. One consumer only.
    public let events: AsyncStream<Event>
    /// How long ``run()`` waits for the peer to end the stream after this side sent a `GO_AWAY`.
    public let closeTimeout: Duration
    /// How many bytes of the link's own frames may wait to be written before ``send(_:)`` waits.
    public let maxQueuedBytes: Int
    /// The most bytes the writer seals and writes at once: the channel's
    /// ``PeerLinkCore/LinkChannel/writeBatchLimit``, at least one full frame.
    let batchLimit: Int
    /// How long one write of at most ``batchLimit`` bytes may wait for the transport to take it
    /// (``ResourceLimits/writeProgressTimeout``) before the link is closed with code 11: a peer
    /// that stops reading cannot hold the link, its descriptor and its queue for ever.
    public let writeProgressTimeout: Duration

    let eventSink: AsyncStream<Event>.Continuation
    let clock: LinkClock
    private let logger: Logger
    let state: Locked<State>

    /// - Parameters:
    ///   - channel: the link's byte stream; the link owns it from now on and closes it.
    ///   - role, identity, preface, hello, policy, expectedRemote: as for ``LinkStateMachine``.
    ///   - clock: the time source for timeouts and keep-alive (a manual clock in tests).
    ///   - closeTimeout: see ``closeTimeout``.
    ///   - maxQueuedBytes: see ``maxQueuedBytes``.
    ///   - logger: where the link logs (info and below); its metadata is kept.
    public init(
        channel: any LinkChannel,
        role: LinkStateMachine.Role,
        identity: Identity,
        preface: LinkPreface,
        hello: Hello,
        policy: LinkPolicy = .default,
        expectedRemote: Fingerprint? = nil,
        clock: any Clock<Duration> = ContinuousClock(),
        closeTimeout: Duration = .seconds(2),
        maxQueuedBytes: Int = 256 * 1024,
        logger: Logger
    ) {
        self.channel = channel
        self.role = role
        self.closeTimeout = closeTimeout
        self.maxQueuedBytes = max(1, maxQueuedBytes)
        batchLimit = max(WireFormat.maxFramePayload, channel.writeBatchLimit)
        self.clock = LinkClock(clock)
        writeProgressTimeout = policy.limits.writeProgressTimeout
        var logger = logger
        logger[metadataKey: "transport"] = "\(channel.transport)"
        logger[metadataKey: "link.remote"] = "\(channel.remoteDescription)"
        logger[metadataKey: "link.role"] = "\(role)"
        if let expectedRemote { logger[metadataKey: "peer.id"] = "\(expectedRemote)" }
        self.logger = logger
        (events, eventSink) = AsyncStream.makeStream(of: Event.self, bufferingPolicy: .unbounded)
        state = Locked(
            State(
                machine: LinkStateMachine(
                    role: role, identity: identity, preface: preface, hello: hello, policy: policy,
                    expectedRemote: expectedRemote)))
    }

    // MARK: - Public API

    /// The handshake's outcome: waits for it.
    ///
    /// - Throws: the close reason as a ``PeerLinkError`` when the link closed first
    ///   (`Closure.error`), `CancellationError` when the waiting task is cancelled.
    public var established: Established {
        get async throws {
            let id = state.withLock { $0.establishedWaiters.makeID() }
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    state.withLock { state in
                        if let result = state.established {
                            continuation.resume(with: result)
                        } else if Task.isCancelled {
                            continuation.resume(throwing: CancellationError())
                        } else {
                            state.establishedWaiters.add(id, continuation)
                        }
                    }
                }
            } onCancel: {
                state.withLock { $0.establishedWaiters.remove(id) }?.resume(throwing: CancellationError())
            }
        }
    }

    /// How the link ended, once it has.
    public var closure: Closure? { state.withLock { $0.closure } }

    /// Input the state machine holds back because it is incomplete (at most
    /// ``WireFormat/maxBufferedBytes``).
    public var bufferedByteCount: Int { state.withLock { $0.machine.bufferedByteCount } }

    /// Bytes of the link's own frames waiting to be written, or being written (sealed
    /// sequenced frames included; the channel's frames waiting for their turn are not).
    public var queuedByteCount: Int { state.withLock { $0.queuedBytes + $0.scheduler.queuedPriorityBytes } }

    /// The channel this link carries frames for, once attached.
    public var peerChannel: PeerChannel? { state.withLock { $0.channel } }

    /// The round trip of the last answered keep-alive `PING`.
    public var roundTripTime: Duration? { state.withLock { $0.machine.roundTripTime } }

    /// The Noise handshake hash, the same on both sides (for a verification code).
    public var handshakeHash: [UInt8]? { state.withLock { $0.machine.handshakeHash } }

    /// Sends one frame, after the handshake. Returns once the frame is queued for the writer and
    /// the queue is under ``maxQueuedBytes``. A `GO_AWAY` frame closes the link like ``close(code:reason:)``.
    ///
    /// - Throws: ``PeerLinkError`` `notConnected` once the link is closed (or the close reason
    ///   if it closed during the handshake), `invalidParameter` for a frame the wire format
    ///   cannot carry, `CancellationError` when the task is cancelled while waiting.
    public func send(_ frame: Frame) async throws {
        _ = try await established
        if frame.type.isSequenced {
            if let closure = state.withLock({ $0.closure }) { throw Self.notConnected(closure, remote: channel.remoteDescription) }
            guard let channel = peerChannel else {
                throw PeerLinkError(.invalidParameter, "\(frame.type) frames belong to a peer's channel: attach one to the link first")
            }
            channel.enqueue([frame])
            channel.deliverPending()
            try await channel.waitUntilWritable()
            return
        }
        try enqueue(frame)
        try await waitForRoom()
    }

    /// Queues one frame for the writer at once, without waiting for the handshake or for room.
    ///
    /// For an owner that takes frames from a queue of its own under its own lock: a frame it
    /// took is a frame queued here, so a ``close(code:reason:)`` that follows goes out after it.
    /// Call ``waitUntilWritable()`` before queueing the next one, to keep back-pressure.
    ///
    /// - Throws: ``PeerLinkError`` `notConnected` before the handshake completed or once the
    ///   link is closed, `invalidParameter` for a frame the wire format cannot carry.
    public func enqueue(_ frame: Frame) throws(PeerLinkError) {
        defer { deliverPending() }
        try enqueueLeavingDelivery(frame)
    }

    /// ``enqueue(_:)`` for a caller that holds a lock of its own: what the frame wakes (the
    /// writer) is left in the outbox; call ``deliverPending()`` once that lock is released.
    func enqueueLeavingDelivery(_ frame: Frame) throws(PeerLinkError) {
        let logs = try state.withLock { state throws(PeerLinkError) -> [LogEntry] in
            if let closure = state.closure { throw Self.notConnected(closure, remote: channel.remoteDescription) }
            guard case .success? = state.established else {
                throw PeerLinkError(
                    .notConnected, "the link to \(channel.remoteDescription) is not established yet: wait for its handshake")
            }
            if case .goAway(let code, let reason) = frame {
                flushScheduler(&state)
                return apply(state.machine.close(code: code, reason: reason), to: &state, from: .send)
            }
            guard !frame.type.isSequenced else {
                throw PeerLinkError(.invalidParameter, "\(frame.type) frames go through the peer's channel, not the link")
            }
            do throws(WireError) {
                try Self.check(frame)
            } catch {
                throw PeerLinkError(.invalidParameter, "\(frame) cannot be sent: \(error.reason)")
            }
            state.scheduler.enqueue(frame)
            wakeWriter(&state)
            return []
        }
        emit(logs)
    }

    /// From now on frames and the closure are held for a handler (``handleEvents(_:)``) instead
    /// of going to ``events``, which yields nothing. Call it before ``run()``.
    func holdEventsForHandler() {
        state.withLock { $0.eventRoute = .held }
    }

    /// Hands `handler` the events held so far, then the ones that come, in order and in
    /// batches: frames, then `.closed` once. It runs where the link's outbox is carried out —
    /// usually the reader's task, right after a read — with no lock held, one batch at a time;
    /// a batch holds every event queued since the last one was taken (all the frames of a read,
    /// often). Once only, after ``holdEventsForHandler()``.
    func handleEvents(_ handler: @escaping @Sendable ([Event]) -> Void) {
        eventSink.finish()
        state.withLockThenDeliver { state in
            guard case .held = state.eventRoute else {
                preconditionFailure("handleEvents(_:) needs holdEventsForHandler() first, and only once")
            }
            // A handler that has had `.closed` is let go: it may hold the link's owner (and
            // the link), which would otherwise keep each other alive.
            let closed = state.handlerBatch.contains { if case .closed = $0 { true } else { false } }
            state.eventRoute = closed ? .done : .handler(handler)
            if !state.handlerBatch.isEmpty { state.outbox.add { handler(self.takeHandlerBatch()) } }
        }
    }

    /// The events queued for the handler since its last batch.
    private func takeHandlerBatch() -> [Event] {
        state.withLock { state in
            defer { state.handlerBatch = [] }
            return state.handlerBatch
        }
    }

    /// Queues `event` where it goes (under the lock).
    private func queueEvent(_ event: Event, in state: inout State) {
        switch state.eventRoute {
        case .stream: state.outbox.add { self.eventSink.yield(event) }
        case .held: state.handlerBatch.append(event)
        case .handler(let handler):
            // One hand-over per batch: the first event of a batch schedules it, and it takes
            // whatever has been queued by the time the outbox carries it out.
            if state.handlerBatch.isEmpty { state.outbox.add { handler(self.takeHandlerBatch()) } }
            state.handlerBatch.append(event)
            if case .closed = event { state.eventRoute = .done }
        case .done: break
        }
    }

    /// Carries out what waits in the outbox (resumes, events), unless another thread is at it.
    func deliverPending() {
        state.deliverPending()
    }

    /// Throws what encoding `frame` would, without encoding the bulk of it.
    private static func check(_ frame: Frame) throws(WireError) {
        switch frame {
        case .data(let id, _, let payload), .message(let id, _, let payload):
            guard id != 0 else { throw WireError(.protocolError, "a \(frame.type) frame needs a non-zero id") }
            // cut to the link's own limit where it is taken (FrameScheduler.next(maxPayload:))
            guard payload.count <= WireFormat.largeFramePayload else {
                throw WireError(
                    .protocolError, "a \(frame.type) frame of \(payload.count) bytes is over the limit of \(WireFormat.largeFramePayload)")
            }
        case .datagram(let payload):
            guard payload.count <= WireFormat.maxFramePayload else {
                throw WireError(
                    .protocolError, "a DATAGRAM frame of \(payload.count) bytes is over the limit of \(WireFormat.maxFramePayload)")
            }
        case .windowUpdate(let id, _, _):
            guard id != 0 else { throw WireError(.protocolError, "a WINDOW_UPDATE frame needs a non-zero id") }
        default:
            _ = try frame.encoded()
        }
    }

    /// Waits while more than ``maxQueuedBytes`` wait to be written (see ``enqueue(_:)``).
    ///
    /// - Throws: ``PeerLinkError`` `notConnected` once the link is closed and its writer stopped,
    ///   `CancellationError` when the task is cancelled while waiting.
    public func waitUntilWritable() async throws {
        try await waitForRoom()
    }

    /// Whether ``waitUntilWritable()`` would return at once: the queue is within its limit (or
    /// the writer is done, when queuing fails anyway).
    var hasRoom: Bool {
        state.withLock { state in
            state.queuedBytes + state.scheduler.queuedPriorityBytes <= maxQueuedBytes || state.writerDone
        }
    }

    /// Closes the link: a `GO_AWAY` with `code` and `reason` when established (nothing before),
    /// then the channel. Idempotent; ``run()`` returns soon after.
    ///
    /// - Parameter linger: whether ``run()`` waits (up to ``closeTimeout``) for the peer to end
    ///   the stream, or for its `GO_AWAY`, after this side's `GO_AWAY`. Pass false when the peer
    ///   closes the link at the same time (a duplicate both sides drop), where there is nothing
    ///   to wait for.
    public func close(code: GoAwayCode = .normal, reason: String = "closed", linger: Bool = true) {
        let (logs, closeNow) = state.withLockThenDeliver { state -> ([LogEntry], Bool) in
            if !linger { state.lingerAllowed = false }
            flushScheduler(&state)
            let logs = apply(state.machine.close(code: code, reason: reason), to: &state, from: .close)
            return (logs, state.phase != .running)
        }
        emit(logs)
        if closeNow { channel.close() }
    }

    /// Runs the link until it is over: the handshake, then frames both ways, then the close.
    /// Returns once the channel is closed. Cancelling the calling task closes the link.
    /// Calling it again, or after ``close(code:reason:)``, returns at once.
    public func run() async {
        let (started, logs) = state.withLockThenDeliver { state -> (Bool, [LogEntry]) in
            guard state.phase == .notStarted, state.closure == nil else { return (false, []) }
            state.phase = .running
            return (true, apply(state.machine.start(at: clock.now()), to: &state, from: .start))
        }
        guard started else { return }
        logger.debug("link starting")
        emit(logs)
        await withTaskCancellationHandler {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await self.readLoop() }
                group.addTask { await self.tickLoop() }
                await writeLoop()
                if state.withLock({ $0.lingers }), !Task.isCancelled {
                    // The GO_AWAY is written: the peer's reader may see the end now. Where
                    // both sides close at once, each lingers until the other's end, which
                    // otherwise comes only with the other's close timeout (channels without a
                    // half-close end the linger at the peer's GO_AWAY instead).
                    channel.finishWriting()
                    await lingerUntilPeerEnds()
                }
                channel.close()
                group.cancelAll()
            }
        } onCancel: {
            // At once, on the cancelling thread: the GO_AWAY goes out before the channel's
            // reads and writes (cancelled with this task) end the link without one. Safe since
            // nothing is resumed under `state`'s lock (see ``Outbox``).
            cancel()
        }
        finish()
    }

    // MARK: - The three loops

    /// Feeds the state machine what arrives, until the end of the stream or a failure. After
    /// the link closed, it keeps reading (the machine discards) until the channel ends.
    private func readLoop() async {
        // One buffer for every read: the machine reads what arrived where it lies and keeps a
        // copy of only an incomplete item, so nothing refers to the buffer between reads and
        // a channel that reads in place (TCP) reuses it.
        var buffer: [UInt8] = []
        while true {
            await waitForEarlyRoom()
            let count: Int
            do {
                count = try await channel.read(into: &buffer)
            } catch {
                channelFailed(error)
                break
            }
            let bytes = buffer[..<count]
            if bytes.isEmpty {
                let logs = state.withLockThenDeliver { state in
                    apply(state.machine.receiveEnd(at: clock.now()), to: &state, from: .endOfStream)
                }
                emit(logs)
                break
            }
            let logs = state.withLockThenDeliver { state in
                let now = clock.now()
                let logs = apply(state.machine.receive(bytes, at: now), to: &state, from: .read, at: now)
                // After both GO_AWAYs nothing more comes: a linger ends here rather than at the
                // end of a stream that cannot be half-closed (RFCOMM, L2CAP).
                if state.machine.peerClosedToo { wakeLingerer(&state) }
                return logs
            }
            emit(logs)
        }
        state.withLockThenDeliver { state in
            state.readerEnded = true
            wakeLingerer(&state)
        }
    }

    /// Called with the lock held: ends a wait for the peer's end (``lingerUntilPeerEnds()``).
    private func wakeLingerer(_ state: inout State) {
        guard let waiter = state.readerEndWaiter else { return }
        state.outbox.add { waiter.resume() }
        state.readerEndWaiter = nil
    }

    /// Returns once the link may read on: at once, unless ``maxEarlyBytes`` wait for a channel
    /// that is not attached yet; then when it is attached or the link closes.
    private func waitForEarlyRoom() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            state.withLock { state in
                if state.channel == nil, state.closure == nil, state.earlyBytes >= Self.maxEarlyBytes {
                    state.earlyRoomWaiter = continuation
                } else {
                    continuation.resume()
                }
            }
        }
    }

    /// Writes the queued bytes in order, joined, until the link is closed and the queue empty,
    /// or a write fails.
    private func writeLoop() async {
        while let batch = await nextBatch() {
            do {
                // Pieces of at most batchLimit bytes, each with its own write deadline: what was
                // sealed before a close may be more.
                var offset = batch.count > batchLimit ? 0 : batch.count
                while offset < batch.count {
                    let end = min(offset + batchLimit, batch.count)
                    try await channel.write(Array(batch[offset..<end]))
                    offset = end
                    if offset < batch.count { state.withLock { $0.writeStartedAt = clock.now() } }
                }
                if batch.count <= batchLimit { try await channel.write(batch) }
            } catch {
                channelFailed(error)
                break
            }
            state.withLockThenDeliver { state in wrote(batch, in: &state) }
        }
        state.withLockThenDeliver { state in
            state.writeStartedAt = nil
            state.writerDone = true
            state.queue = []
            state.queuedBytes = 0
            state.scheduler.removeAll()
            let error = state.closure.map { Self.notConnected($0, remote: channel.remoteDescription) }
            let waiters = state.roomWaiters.removeAll()
            if !waiters.isEmpty {
                state.outbox.add {
                    for waiter in waiters {
                        if let error { waiter.resume(throwing: error) } else { waiter.resume() }
                    }
                }
            }
        }
    }

    /// Ticks the state machine at its deadlines; wakes early when a deadline moves closer.
    private func tickLoop() async {
        while !Task.isCancelled {
            let next = state.withLock { state -> Duration?? in
                // After the close only a stalled write is left to watch (a GO_AWAY the peer
                // does not take).
                guard state.closure == nil || state.writeStartedAt != nil else { return .none }
                state.tickerArmed = true
                // A deadline the ticker was woken for stays until it comes, even if what it was
                // for went away meanwhile (an `ACK` owed that a reply carried off): otherwise
                // every message of a ping-pong, owing an `ACK` again, would wake the ticker and
                // set up a new sleep. A tick with nothing due does nothing.
                var deadline = nextTickerDeadline(state)
                if let kept = state.tickerDeadline, kept > clock.now() { deadline = deadline.map { min($0, kept) } ?? kept }
                state.tickerDeadline = deadline
                state.tickerWakePending = false
                return .some(state.tickerDeadline)
            }
            guard case .some(let deadline) = next else { return }
            await sleepOrWake(until: deadline)
            if Task.isCancelled { return }
            let (logs, stalled) = state.withLockThenDeliver { state -> ([LogEntry], Bool) in
                state.tickerArmed = false
                let now = clock.now()
                if let started = state.writeStartedAt, now - started >= writeProgressTimeout {
                    state.lingers = false
                    guard state.closure == nil else { return ([], true) }
                    let reason = "the peer took no data for \(writeProgressTimeout.components.seconds) s: it stopped reading"
                    return (apply(state.machine.close(code: .resourceLimit, reason: reason), to: &state, from: .tick), true)
                }
                guard state.closure == nil else { return ([], false) }
                return (apply(state.machine.tick(at: now), to: &state, from: .tick), false)
            }
            emit(logs)
            if stalled {
                // The stuck write ends with the channel; the writer then ends the link.
                channel.close()
                return
            }
        }
    }

    // MARK: - Waiting

    /// The next bytes to write, joined; nil once the link is closed and nothing is left.
    private func nextBatch() async -> [UInt8]? {
        await withCheckedContinuation { continuation in
            // Taking a batch can free room for stream writers: they are woken after the lock.
            state.withLockThenDeliver { state in
                if let batch = takeBatch(&state) {
                    continuation.resume(returning: batch)
                } else if state.closure != nil || state.writerDone {
                    continuation.resume(returning: nil)
                } else {
                    state.writerWaiter = continuation
                }
            }
        }
    }

    /// Waits while the queue is over the limit.
    private func waitForRoom() async throws {
        let id = state.withLock { $0.roomWaiters.makeID() }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                state.withLock { state in
                    if state.writerDone, let closure = state.closure {
                        continuation.resume(throwing: Self.notConnected(closure, remote: channel.remoteDescription))
                    } else if state.queuedBytes + state.scheduler.queuedPriorityBytes <= maxQueuedBytes || state.writerDone {
                        continuation.resume()
                    } else if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        state.roomWaiters.add(id, continuation)
                    }
                }
            }
        } onCancel: {
            state.withLock { $0.roomWaiters.remove(id) }?.resume(throwing: CancellationError())
        }
    }

    /// Sleeps until `deadline` (forever when nil), or until woken because the state machine's
    /// deadline moved closer or the link closed, or until cancelled.
    private func sleepOrWake(until deadline: Duration?) async {
        await withTaskGroup(of: Void.self) { group in
            if let deadline {
                group.addTask { try? await self.clock.sleep(until: deadline) }
            }
            group.addTask { await self.waitForTickerWake() }
            await group.next()
            group.cancelAll()
        }
    }

    private func waitForTickerWake() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                state.withLock { state in
                    if state.tickerWakePending || Task.isCancelled {
                        continuation.resume()
                    } else {
                        state.tickerWake = continuation
                    }
                }
            }
        } onCancel: {
            let wake = state.withLock { state -> CheckedContinuation<Void, Never>? in
                defer { state.tickerWake = nil }
                return state.tickerWake
            }
            wake?.resume()
        }
    }

    /// After sending a `GO_AWAY`: waits for the peer to end the stream, at most `closeTimeout`.
    private func lingerUntilPeerEnds() async {
        let deadline = clock.now() + closeTimeout
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await self.clock.sleep(until: deadline) }
            group.addTask {
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        self.state.withLock { state in
                            if state.readerEnded || state.machine.peerClosedToo || Task.isCancelled {
                                continuation.resume()
                            } else {
                                state.readerEndWaiter = continuation
                            }
                        }
                    }
                } onCancel: {
                    let waiter = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
                        defer { state.readerEndWaiter = nil }
                        return state.readerEndWaiter
                    }
                    waiter?.resume()
                }
            }
            await group.next()
            group.cancelAll()
        }
    }

    // MARK: - Ending

    /// The channel failed (or was closed here): the link is over, nothing more is written.
    private func channelFailed(_ error: any Error) {
        let logs = state.withLockThenDeliver { state -> [LogEntry] in
            // A read or write cancelled with the link's task says nothing about the channel: the
            // link closes as ``cancel()`` closes it — whichever of the two comes first — and the
            // writer still writes what the close queued (its GO_AWAY) before it ends the link.
            // (A reader that came first dropped the GO_AWAY now and then, and the peer saw the
            // link end without one.) The transports report a cancelled call as `PeerLinkError`
            // `cancelled`: taken for a failure of the channel, it dropped the GO_AWAY the
            // cancellation had queued.
            if PeerLinkError.isCancellation(error), !state.writerDone {
                return state.closure == nil ? closeForCancellation(&state) : []
            }
            state.writerDone = true
            state.queue = []
            state.scheduler.removeAll()
            guard state.closure == nil else { return [] }
            let failure =
                (error as? PeerLinkError)
                ?? (error is CancellationError
                    ? PeerLinkError(.cancelled, "the link to \(channel.remoteDescription) was cancelled")
                    : PeerLinkError(.unknown, "the link to \(channel.remoteDescription) failed: \(error)"))
            state.channelFailure = failure
            return apply(state.machine.receiveEnd(at: clock.now()), to: &state, from: .channelFailure(failure))
        }
        emit(logs)
    }

    /// The task running the link was cancelled: close with a `GO_AWAY`. The writer runs in the
    /// cancelled task, so it never waits for room again (``PeerLinkCore/LinkChannel/write(_:)``):
    /// a write under way ends at once, with what the transport took; then the `GO_AWAY` goes
    /// out if the transport takes it at once, and the link ends either way.
    private func cancel() {
        emit(state.withLockThenDeliver { state in closeForCancellation(&state) })
    }

    /// Called with the lock held: the close of a cancelled link (a `GO_AWAY`, code normal), after
    /// what was queued before it, as ``close(code:reason:linger:)`` does (the writer takes no
    /// frame once the link is closed: one still queued was lost).
    private func closeForCancellation(_ state: inout State) -> [LogEntry] {
        flushScheduler(&state)
        let logs = apply(state.machine.close(code: .normal, reason: "the link's task was cancelled"), to: &state, from: .cancel)
        wakeTicker(&state)
        return logs
    }

    /// After the loops: nothing is left waiting.
    private func finish() {
        let logs = state.withLockThenDeliver { state -> [LogEntry] in
            state.phase = .finished
            var logs: [LogEntry] = []
            if state.closure == nil {
                // Unreachable: the writer only stops once the link is closed.
                logs = apply(
                    state.machine.close(code: .internalError, reason: "the link stopped running"), to: &state, from: .close)
            }
            let error = state.closure.map { Self.notConnected($0, remote: channel.remoteDescription) }
                ?? PeerLinkError(.notConnected, "the link is closed")
            let waiters = state.roomWaiters.removeAll()
            // Through the outbox: after the events queued before.
            state.outbox.add {
                for waiter in waiters { waiter.resume(throwing: error) }
                self.eventSink.finish()
            }
            return logs
        }
        emit(logs)
    }

    // MARK: - Outputs

    /// Where a batch of outputs came from: decides how a closure is reported.
    enum Source {
        case start, read, tick, send, close, cancel
        /// The channel's stream ended (a read returned no bytes).
        case endOfStream
        case channelFailure(PeerLinkError)
    }

    struct LogEntry {
        var level: Logger.Level
        var message: Logger.Message
        var metadata: Logger.Metadata
    }

    /// Carries out the state machine's outputs (under the lock): queues sends, reports the
    /// handshake, yields frames, records the closure. Returns what to log. What wakes a task or
    /// reaches ``events`` goes through the outbox, in order.
    /// `now`: the time the outputs were made at, if the caller read the clock already.
    func apply(_ outputs: consuming [LinkOutput], to state: inout State, from source: Source, at now: Duration? = nil) -> [LogEntry] {
        var logs: [LogEntry] = []
        // One reading of the clock for the frames among them (they came in with one read).
        var arrival = now
        // One delivery of the channel's pending work for all of them.
        var channelDelivery = false
        // Each output is moved out of the array, not copied: its bytes or frame are not retained
        // once more here and released again when the array is freed.
        var pending = outputs
        for index in pending.indices {
            switch pending.take(at: index, leaving: .frame(.ack(receivedThrough: 0))) {
            case .send(let bytes):
                guard !state.writerDone else { continue }
                state.queue.append(bytes)
                state.queuedBytes += bytes.count
            case .established(let remote, let hello, let encrypted, let version):
                let established = Established(
                    remote: remote, hello: hello, encrypted: encrypted, version: version, bulkFramePayload: bulkFramePayload(&state))
                state.established = .success(established)
                let waiters = state.establishedWaiters.removeAll()
                if !waiters.isEmpty { state.outbox.add { for waiter in waiters { waiter.resume(returning: established) } } }
                state.peerMetadata = ["peer.id": "\(remote.fingerprint)", "peer.name": "\(remote.displayName)"]
                logs.append(
                    LogEntry(
                        level: .info, message: "link established",
                        metadata: state.peerMetadata.merging(
                            ["link.encrypted": "\(encrypted)", "link.version": "\(version)"], uniquingKeysWith: { $1 })))
            case .frame(.ack(let through)):
                logs += route(.acknowledgment(through), at: .zero, in: &state, deliveryQueued: &channelDelivery)
            case .frame(let frame):
                queueEvent(.frame(frame), in: &state)
            case .sequenced(let frame, let sequence):
                let now = arrival ?? clock.now()
                arrival = now
                logs += route(.sequenced(frame, sequence), at: now, in: &state, deliveryQueued: &channelDelivery)
            case .closed(let code, let reason, let byPeer):
                let closure = makeClosure(code: code, reason: reason, byPeer: byPeer, source: source, state: state)
                state.closure = closure
                state.lingers =
                    state.lingerAllowed && !byPeer && state.machine.remotePeer != nil && code != .keepAliveTimeout
                    && state.channelFailure == nil && state.phase == .running
                if state.established == nil {
                    state.established = .failure(closure.error)
                    let waiters = state.establishedWaiters.removeAll()
                    if !waiters.isEmpty { state.outbox.add { for waiter in waiters { waiter.resume(throwing: closure.error) } } }
                }
                if let channel = state.channel {
                    channel.detach(self)
                    state.outbox.add { channel.deliverPending() }
                }
                state.early = []
                if let waiter = state.earlyRoomWaiter {
                    state.earlyRoomWaiter = nil
                    state.outbox.add { waiter.resume() }
                }
                queueEvent(.closed(code: closure.code, reason: closure.reason, byPeer: closure.byPeer), in: &state)
                state.outbox.add { self.eventSink.finish() }
                logs.append(
                    LogEntry(
                        level: .info, message: "link closed",
                        metadata: state.peerMetadata.merging(
                            [
                                "link.close.code": "\(code.rawValue)",
                                "link.close.reason": "\(closure.reason)",
                                "link.close.byPeer": "\(byPeer)",
                            ], uniquingKeysWith: { $1 })))
            }
        }
        wakeWriter(&state)
        // Wake the ticker when its deadline moved closer or the link closed.
        if state.tickerArmed {
            let next = nextTickerDeadline(state)
            let closer: Bool =
                if let next { state.tickerDeadline.map { next < $0 } ?? true } else { false }
            if closer { state.tickerDeadline = next }  // what the ticker now sleeps until
            if state.closure != nil || closer { wakeTicker(&state) }
        }
        return logs
    }

    private func makeClosure(code: GoAwayCode, reason: String, byPeer: Bool, source: Source, state: State) -> Closure {
        let remote = channel.remoteDescription
        let established = state.established.map { (try? $0.get()) != nil } ?? false
        switch source {
        case .channelFailure(let failure):
            // The transport's message says more than "the stream ended".
            return Closure(code: code, reason: failure.message, byPeer: true, lost: established, error: failure)
        case .cancel:
            return Closure(
                code: code, reason: reason, byPeer: false,
                error: PeerLinkError(.cancelled, "the link to \(remote) was closed: its task was cancelled"))
        default:
            break
        }
        let errorCode: PeerLinkError.Code =
            switch code {
            case .normal: .notConnected
            case .unsupportedVersion, .serviceMismatch, .encryptionMismatch: .unsupported
            case .sessionFull, .identityMismatch, .resourceLimit: .unavailable
            case .keepAliveTimeout: .timedOut
            case .handshakeFailed:
                if case .tick = source { .timedOut } else { .notConnected }
            case .duplicateLink: .cancelled
            case .protocolError, .internalError, .other: .unknown
            }
        let who = byPeer ? "the peer closed the link to \(remote)" : "the link to \(remote) was closed on this side"
        let when = state.established == nil ? " before the handshake completed" : ""
        let message = "\(who)\(when): \(reason) (code \(code))"
        var lost = false
        if case .endOfStream = source { lost = established }
        return Closure(code: code, reason: reason, byPeer: byPeer, lost: lost, error: PeerLinkError(errorCode, message))
    }

    private static func notConnected(_ closure: Closure, remote: String) -> PeerLinkError {
        PeerLinkError(.notConnected, "the link to \(remote) is closed (\(closure.reason)): dial the peer again")
    }

    func emit(_ logs: [LogEntry]) {
        for entry in logs {
            logger.log(level: entry.level, entry.message, metadata: entry.metadata)
        }
    }

    // MARK: - The channel

    /// Bytes of sequenced frames a link holds for its channel before the channel is attached
    /// (the session attaches it right after admitting the peer): beyond them it reads no more
    /// until then. A peer coming back on a new link writes again everything not acknowledged
    /// (up to its 4 MiB window) at once, so this is back pressure, not an error.
    static let maxEarlyBytes = 1024 * 1024
    /// … and what one read past that may bring: more than both together is a protocol error.
    static let maxEarlyOverrun = 1024 * 1024

    /// Input for the channel: a sequenced frame, or the peer's `ACK`.
    enum ChannelInput {
        case sequenced(Frame, UInt64)
        case acknowledgment(UInt64)
    }

    /// The peer's channel, once attached.
    var attachedChannel: PeerChannel? { state.withLock { $0.channel } }

    /// Attaches the peer's channel: sequenced frames are written for it (when it makes this link
    /// the active one) and those that arrive go to it, starting with those that came before.
    public func attach(_ channel: PeerChannel) {
        attachLeavingDelivery(channel)
        deliverPending()
    }

    /// ``attach(_:)`` for a caller holding a lock of its own (a session admitting the link):
    /// what attaching hands on (frames that came early go to the channel, whose deliveries can
    /// reach the session) waits for ``deliverPending()``, to be called once that lock is
    /// released. Delivered at once, it re-entered the session's lock on the same thread.
    func attachLeavingDelivery(_ channel: PeerChannel) {
        let logs = state.withLock { state -> [LogEntry] in
            guard state.channel == nil, state.closure == nil else { return [] }
            state.channel = channel
            channel.attach(self)
            let early = state.early
            state.early = []
            state.earlyBytes = 0
            if let waiter = state.earlyRoomWaiter {
                state.earlyRoomWaiter = nil
                state.outbox.add { waiter.resume() }
            }
            var logs: [LogEntry] = []
            let now = clock.now()
            // the channel's pending work is delivered once, after them (below)
            var deliveryQueued = true
            for input in early { logs += route(input, at: now, in: &state, deliveryQueued: &deliveryQueued) }
            state.outbox.add { channel.deliverPending() }
            wakeWriter(&state)
            return logs
        }
        emit(logs)
    }

    /// The channel has frames for this link, or an `ACK` became due: the writer and the ticker look.
    func wakeFromChannel() {
        state.withLockThenDeliver { state in
            wakeWriter(&state)
            wakeTicker(&state)
        }
    }

    /// The channel has new frames for this link to write: the writer looks (the ticker need
    /// not: the writer tells it when a write starts).
    func wakeWriterFromChannel() {
        state.withLockThenDeliver { state in
            wakeWriter(&state)
        }
    }

    /// Hands input to the channel (under the lock), or keeps it until one is attached. `now`:
    /// when a sequenced frame arrived (an acknowledgement needs no time). What the channel then
    /// has to deliver (wake-ups) is delivered once the lock is released, by one delivery queued
    /// for all the input of one read: `deliveryQueued` says whether it is queued already.
    private func route(_ input: ChannelInput, at now: Duration, in state: inout State, deliveryQueued: inout Bool) -> [LogEntry] {
        guard let channel = state.channel else {
            let size: Int
            switch input {
            case .sequenced(let frame, _): size = FrameScheduler.size(of: frame)
            case .acknowledgment: size = 8
            }
            state.earlyBytes += size
            guard state.earlyBytes <= Self.maxEarlyBytes + Self.maxEarlyOverrun else {
                return apply(
                    state.machine.close(
                        code: .protocolError,
                        reason: "over \(Self.maxEarlyBytes + Self.maxEarlyOverrun) bytes of frames arrived before the session admitted the peer"),
                    to: &state, from: .read)
            }
            state.early.append(input)
            return []
        }
        if !deliveryQueued {
            state.outbox.add { channel.deliverPending() }
            deliveryQueued = true
        }
        switch input {
        case .acknowledgment(let through):
            guard channel.acknowledge(through: through) else {
                // from a peer that kept the pair this side dropped (see PeerChannel.receive)
                let reason =
                    channel.hasSentNothing
                    ? "the peer acknowledged frame \(through) of an exchange this side had dropped and kept nothing of: both sides start over (what was not acknowledged is lost)"
                    : "the peer acknowledged frame \(through), which was never sent"
                return apply(state.machine.close(code: .protocolError, reason: reason), to: &state, from: .read)
            }
            return []
        case .sequenced(let frame, let sequence):
            switch channel.receive(frame, sequence: sequence, on: self, at: now) {
            case .deliver(let frame):
                queueEvent(.frame(frame), in: &state)
            case .handled, .dropped:
                break
            case .violation(let error):
                return apply(state.machine.close(code: error.code, reason: error.reason), to: &state, from: .read)
            }
            return []
        }
    }

    /// The ticker's next deadline: the state machine's, or an `ACK` the channel owes earlier.
    private func nextDeadline(_ state: State) -> Duration? {
        let own = state.machine.nextDeadline
        guard let acknowledgment = state.channel?.acknowledgmentDeadline(for: self) else { return own }
        return own.map { min($0, acknowledgment) } ?? acknowledgment
    }

    // MARK: - State

    enum Phase { case notStarted, running, finished }

    enum EventRoute {
        /// Yielded to ``Link/events``.
        case stream
        /// Held for a handler that is not there yet.
        case held
        /// Handed to the handler, from the link's outbox.
        case handler(@Sendable ([Event]) -> Void)
        /// The handler has had `.closed` and is let go.
        case done
    }

    struct State: OutboxOwner {
        var machine: LinkStateMachine
        var phase = Phase.notStarted

        /// Frames waiting for their turn, not sealed yet: they are sealed in the order the
        /// writer takes them, so the Noise nonces follow the order on the wire.
        var scheduler = FrameScheduler()
        /// The peer's channel, once the session attached it: it writes the sequenced frames and
        /// takes those that arrive.
        var channel: PeerChannel?
        /// What arrived for the channel before it was attached (at most ``Link/maxEarlyBytes``).
        var early: [ChannelInput] = []
        var earlyBytes = 0
        /// The reader, waiting for the channel (``Link/maxEarlyBytes`` arrived before it).
        var earlyRoomWaiter: CheckedContinuation<Void, Never>?

        /// Bytes for the writer, in order.
        var queue: [[UInt8]] = []
        /// Bytes queued or being written.
        var queuedBytes = 0
        var writerWaiter: CheckedContinuation<[UInt8]?, Never>?
        /// When the last write ended (see ``Link/writesNow(_:lastWriteEnded:)``).
        var lastWriteEnded: ContinuousClock.Instant?
        /// The writer stopped (or the channel failed): nothing more is written.
        var writerDone = false
        var roomWaiters = Waiters<Void>()

        var established: Result<Established, PeerLinkError>?
        var establishedWaiters = Waiters<Established>()
        var closure: Closure?
        var channelFailure: PeerLinkError?
        /// Wait for the peer's end of stream before closing the channel.
        var lingers = false
        /// False once ``Link/close(code:reason:linger:)`` was told not to linger.
        var lingerAllowed = true
        var peerMetadata: Logger.Metadata = [:]

        /// When the running write began (a piece of at most ``batchLimit`` bytes); nil between writes.
        var writeStartedAt: Duration?
        var tickerArmed = false
        var tickerDeadline: Duration?
        var tickerWakePending = false
        var tickerWake: CheckedContinuation<Void, Never>?

        var readerEnded = false
        var readerEndWaiter: CheckedContinuation<Void, Never>?

        /// Where frames and the closure go (see ``Link/handleEvents(_:)``).
        var eventRoute = EventRoute.stream
        /// Events for the handler that its next batch takes (held until ``Link/handleEvents(_:)``
        /// gives it).
        var handlerBatch: [Event] = []

        /// Resumes and events, carried out once the lock is released (see ``Outbox``).
        var outbox = Outbox()

        init(machine: LinkStateMachine) {
            self.machine = machine
        }
    }

    /// Wakes the writer for new bytes or the close (once the lock is released).
    func wakeWriter(_ state: inout State) {
        guard let writer = state.writerWaiter else { return }
        // Taken while the batch is made: sealing can close the link, which wakes the writer.
        state.writerWaiter = nil
        if let batch = takeBatch(&state) {
            if Self.writesNow(batch, lastWriteEnded: state.lastWriteEnded) {
                state.outbox.add { self.writeNowOrHandOver(batch, writer) }
            } else {
                state.outbox.add { writer.resume(returning: batch) }
            }
        } else if state.closure != nil {
            state.outbox.add { writer.resume(returning: nil) }
        } else {
            state.writerWaiter = writer
        }
    }

    /// With the lock released, on the thread that woke the waiting writer with `batch`: writes
    /// what the transport takes at once (``PeerLinkCore/LinkChannel/writeNow(_:)``), so a
    /// record that fits in the socket's buffer costs no hand-over to the writer's task. The
    /// writer stays suspended meanwhile (no other write can start); it gets what is left, or the
    /// failure to meet in its own write, or waits again for the next batch.
    private func writeNowOrHandOver(_ batch: [UInt8], _ writer: CheckedContinuation<[UInt8]?, Never>) {
        let written: Int
        do {
            written = try channel.writeNow(batch)
        } catch {
            // the writer's own write meets the failure and ends the link
            writer.resume(returning: batch)
            return
        }
        guard written == batch.count else {
            if written > 0 { state.withLock { $0.queuedBytes -= written } }
            writer.resume(returning: written == 0 ? batch : Array(batch[written...]))
            return
        }
        state.withLockThenDeliver { state in
            wrote(batch, in: &state)
            state.writerWaiter = writer
            // what was queued meanwhile (or the close) goes the same way
            wakeWriter(&state)
        }
    }

    /// Whether `batch` is written where the writer was woken (``writeNowOrHandOver(_:_:)``)
    /// rather than by the writer's task: when it is large, or the link wrote nothing for
    /// ``writeNowQuiet``. Small records in quick succession go to the task, whose wake-up lets
    /// the next ones gather into one write (written where they were sent, a flood of 64 B
    /// messages went at a fifth of the rate: a system call for each).
    package static func writesNow(_ batch: [UInt8], lastWriteEnded: ContinuousClock.Instant?) -> Bool {
        guard batch.count < writeNowMinimum, let lastWriteEnded else { return true }
        return ContinuousClock.now - lastWriteEnded >= writeNowQuiet
    }

    /// A batch at least this large is always written where the writer was woken.
    package static let writeNowMinimum = WireFormat.maxFramePayload
    /// How long the link must have written nothing for a smaller batch to be written there.
    package static let writeNowQuiet = Duration.microseconds(100)

    /// A write of `batch` ended: the writer is idle, waiters for room are woken when the queue
    /// is within its limit again, and the batch's storage goes back to the machine for the
    /// next records.
    private func wrote(_ batch: [UInt8], in state: inout State) {
        let count = batch.count
        state.machine.recycle(batch)
        state.lastWriteEnded = .now
        state.writeStartedAt = nil
        state.queuedBytes -= count
        if state.queuedBytes + state.scheduler.queuedPriorityBytes <= maxQueuedBytes {
            let waiters = state.roomWaiters.removeAll()
            if !waiters.isEmpty { state.outbox.add { for waiter in waiters { waiter.resume() } } }
        }
    }

    /// The ticker's next deadline: the state machine's (or the pair channel's acknowledgment),
    /// or the running write's, whichever is first.
    private func nextTickerDeadline(_ state: State) -> Duration? {
        let machine = state.closure == nil ? nextDeadline(state) : nil
        guard let started = state.writeStartedAt else { return machine }
        let write = started + writeProgressTimeout
        return machine.map { min($0, write) } ?? write
    }

    /// Wakes the ticker (once the lock is released).
    func wakeTicker(_ state: inout State) {
        state.tickerWakePending = true
        if let wake = state.tickerWake {
            state.tickerWake = nil
            state.outbox.add { wake.resume() }
        }
    }

    /// The next bytes for one write: what is sealed already, then frames from the scheduler in
    /// its order and the channel's, up to ``batchLimit``, sealed now into as few records as they
    /// fit (many small messages share a record). Marks the writer busy.
    private func takeBatch(_ state: inout State) -> [UInt8]? {
        guard !state.writerDone else { return nil }
        let now = clock.now()
        var size = state.queue.reduce(0) { $0 + $1.count }
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        let bulk = bulkFramePayload(&state)
        while size < batchLimit, state.closure == nil, let frame = state.scheduler.next(maxPayload: bulk) {
            size += FrameScheduler.size(of: frame)
            frames.append((frame, nil))
        }
        if let channel = state.channel, state.closure == nil, size < batchLimit {
            // Taken as they come when nothing came before them (the usual case): moved, not
            // copied one by one.
            let taken = channel.take(for: self, limit: batchLimit - size, maxPayload: bulk, at: now)
            if frames.isEmpty { frames = taken } else { frames += taken }
            state.outbox.add { channel.deliverPending() }
        }
        seal(frames, at: now, in: &state)
        guard !state.queue.isEmpty else { return nil }
        var batch: [UInt8]
        if state.queue.count == 1 {
            batch = state.queue[0]
        } else {
            // Appending whole arrays copies them in one go; `joined()` goes byte by byte.
            batch = []
            batch.reserveCapacity(state.queue.reduce(0) { $0 + $1.count })
            for bytes in state.queue { batch.append(contentsOf: bytes) }
        }
        state.queue = []
        state.writeStartedAt = now
        // the ticker watches this write from now on
        if state.tickerArmed, let armed = state.tickerDeadline, armed > state.writeStartedAt! + writeProgressTimeout {
            wakeTicker(&state)
        } else if state.tickerArmed, state.tickerDeadline == nil {
            wakeTicker(&state)
        }
        return batch
    }

    /// The largest `DATA` or `MESSAGE` payload this link writes: what both sides take
    /// (``PeerLinkCore/LinkStateMachine/framePayloadLimit``), within what the channel carries
    /// well (``PeerLinkCore/LinkChannel/largestFramePayload``).
    private func bulkFramePayload(_ state: inout State) -> Int {
        min(state.machine.framePayloadLimit, channel.largestFramePayload)
    }

    /// Seals frames (sequenced ones with their numbers) onto the queue, packed into records.
    private func seal(_ frames: consuming [(frame: Frame, sequence: UInt64?)], at now: Duration, in state: inout State) {
        let count = frames.count
        guard count > 0 else { return }
        do throws(WireError) {
            let logs = apply(try state.machine.send(frames, at: now), to: &state, from: .send)
            if !logs.isEmpty { state.outbox.add { self.emit(logs) } }
        } catch {
            // Unreachable: frames are taken only once the link is established.
            logger.error("frames could not be sealed", metadata: ["frames": "\(count)", "reason": "\(error.reason)"])
        }
    }

    /// Seals everything the scheduler holds, in its order: before a `GO_AWAY`, so what was
    /// queued before a close still goes out.
    private func flushScheduler(_ state: inout State) {
        guard state.closure == nil, !state.writerDone else { return }
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        let bulk = bulkFramePayload(&state)
        while let frame = state.scheduler.next(maxPayload: bulk) { frames.append((frame, nil)) }
        // and what the channel has for this link (when it is the active one), so what was sent
        // before a close goes out before it
        let now = clock.now()
        if let channel = state.channel {
            for (frame, sequence) in channel.take(for: self, limit: .max, maxPayload: bulk, at: now, final: true) {
                frames.append((frame, sequence))
            }
            state.outbox.add { channel.deliverPending() }
        }
        seal(frames, at: now, in: &state)
    }
}

/// Suspended callers, each under an id so a cancelled one can be found.
struct Waiters<T: Sendable> {
    private var nextID = 0
    private var entries: [Int: CheckedContinuation<T, any Error>] = [:]

    mutating func makeID() -> Int {
        nextID += 1
        return nextID
    }

    mutating func add(_ id: Int, _ continuation: CheckedContinuation<T, any Error>) {
        entries[id] = continuation
    }

    mutating func remove(_ id: Int) -> CheckedContinuation<T, any Error>? {
        entries.removeValue(forKey: id)
    }

    mutating func removeAll() -> [CheckedContinuation<T, any Error>] {
        defer { entries = [:] }
        return Array(entries.values)
    }
}

/// A clock as the link uses it: durations since the link was made.
struct LinkClock: Sendable {
    let now: @Sendable () -> Duration
    let sleepUntil: @Sendable (Duration) async throws -> Void

    init(_ clock: some Clock<Duration>) {
        if let continuous = clock as? ContinuousClock {
            // The real clock sleeps on the timer thread: a cancelled sleep leaves nothing armed.
            let origin = continuous.now
            now = { origin.duration(to: .now) }
            sleepUntil = { deadline in try await Timers.shared.sleep(until: origin.advanced(by: deadline)) }
            return
        }
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        sleepUntil = { deadline in try await clock.sleep(until: origin.advanced(by: deadline), tolerance: nil) }
    }

    func sleep(until deadline: Duration) async throws {
        try await sleepUntil(deadline)
    }
}
