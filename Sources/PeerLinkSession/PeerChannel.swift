import Logging
@_spi(Runtime) import PeerLinkCore

/// Everything between the local peer and one remote peer that outlives a link: the sequenced
/// frames (reliable message chunks, stream data and credit) waiting to go out, their
/// ``PeerLinkCore/Continuity`` (numbers, what is kept until acknowledged, what arrived), and the
/// streams. One per remote peer and incarnation (``PeerLinkCore/Incarnation``).
///
/// Links come and go underneath (a failover, an upgrade, a reconnect): one of them is
/// **active** (``activate(_:)``) and writes the channel's frames — first every frame kept and
/// not acknowledged yet, then new ones — while every attached link delivers what arrives. A
/// frame that arrives twice (written again on a new link while the old one still delivered it)
/// is taken once. So reliable messages and stream bytes are delivered exactly once, in order,
/// whatever links carry them; a stream lives as long as the channel, not its link.
///
/// Lock order: a ``Link`` may call the channel while holding its own lock; the channel never
/// calls a link while holding its lock (wake-ups go through its ``Outbox``).
public final class PeerChannel: Sendable {
    /// The remote peer.
    public let peer: PeerID
    /// The remote peer's incarnation (nil: it does not resume links).
    public let incarnation: Incarnation?
    /// How many bytes of sequenced frames other than stream data may wait for a link before a
    /// sender of messages waits.
    public let maxQueuedBytes: Int
    /// How many bytes of stream data may wait for a link, all streams together, before a
    /// stream's writer waits (besides its credit).
    public let maxQueuedDataBytes: Int

    let state: Locked<State>
    /// Streams whose `PeerStream` went away, not yet looked at under ``state``'s lock: a
    /// `PeerStream` may be freed while that lock is held (a waiter holding the last reference),
    /// so its `deinit` only notes it here.
    let releasedStreams = Locked<[UInt32]>([])
    let logger: Logger
    let clock: LinkClock
    /// Where streams the peer opens are handed (the session's `incomingStreams`).
    let streamOpened: @Sendable (PeerStream) -> Void

    /// A channel on `clock` (tests drive one by hand).
    package convenience init(
        peer: PeerID, incarnation: Incarnation?, localPeer: PeerID, policy: Continuity.Policy = .default,
        clock: any Clock<Duration>, logger: Logger, streamOpened: @escaping @Sendable (PeerStream) -> Void
    ) {
        self.init(
            peer: peer, incarnation: incarnation, localPeer: localPeer, policy: policy, clock: LinkClock(clock), logger: logger,
            streamOpened: streamOpened)
    }

    /// - Parameters:
    ///   - localPeer: the local peer: its fingerprint and the peer's decide which stream ids
    ///     each side opens (the smaller fingerprint odd ones), the same on every link.
    ///   - streamOpened: called (with no lock held) for each stream the peer opens.
    init(
        peer: PeerID, incarnation: Incarnation?, localPeer: PeerID, policy: Continuity.Policy = .default,
        maxQueuedBytes: Int = 256 * 1024, maxQueuedDataBytes: Int = 256 * 1024,
        maxUnconsumedMessageBytes: Int = ResourceLimits.default.maximumQueuedMessageBytesPerPeer, clock: LinkClock, logger: Logger,
        keepsDeliveryOrder: Bool = false, streamOpened: @escaping @Sendable (PeerStream) -> Void
    ) {
        self.keepsDeliveryOrder = keepsDeliveryOrder
        self.maxUnconsumedMessageBytes = max(1, maxUnconsumedMessageBytes)
        self.peer = peer
        self.incarnation = incarnation
        self.maxQueuedBytes = max(1, maxQueuedBytes)
        self.maxQueuedDataBytes = max(1, maxQueuedDataBytes)
        self.clock = clock
        var logger = logger
        logger[metadataKey: "peer.id"] = "\(peer.fingerprint)"
        self.logger = logger
        self.streamOpened = streamOpened
        let role: LinkStateMachine.Role = localPeer.fingerprint < peer.fingerprint ? .dialer : .listener
        state = Locked(State(continuity: Continuity(policy: policy), streams: StreamTable(role: role)))
    }

    /// Whether message chunks handed to the links' events are also kept, in the order this
    /// channel accepted them, for ``takeDelivered(upTo:)``: the session's way. Each link of the pair
    /// hands over what it read on a task of its own, so right after a link change the old
    /// link's last chunks and the new link's first ones reach the session on two tasks; taking
    /// them from here, one per event, keeps the order whichever event comes first.
    let keepsDeliveryOrder: Bool

    /// Over this many ``State/unconsumedMessageBytes`` the channel stops acknowledging
    /// (``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer``).
    let maxUnconsumedMessageBytes: Int

    struct State: OutboxOwner {
        var continuity: Continuity
        /// Bytes of the peer's messages the app has not taken yet: chunks handed to the session
        /// and not yet through its state machine, and messages waiting in its events.
        var unconsumedMessageBytes = 0
        /// Bytes of the peer's messages the session's state machine holds in part (the sender
        /// may interleave the chunks of many messages), as it last said.
        var partialMessageBytes = 0
        /// Message chunks accepted and not yet taken by ``PeerChannel/takeDelivered(upTo:)``, oldest
        /// first (only when ``PeerChannel/keepsDeliveryOrder``).
        var delivered = FIFO<Frame>()
        /// Everything above: what holds the peer back past the limit.
        var heldMessageBytes: Int { unconsumedMessageBytes + partialMessageBytes }
        /// Sequenced frames not written yet, in their lanes (credit and resets, messages, data).
        var scheduler = FrameScheduler()
        var streams: StreamTable
        /// The runtime side of every stream (kept, small, once it ended, so a late reader still
        /// learns how it ended).
        var slots: [UInt32: StreamSlot] = [:]
        var streamWaiters: [Int: StreamWaiter] = [:]
        var nextStreamWaiter = 0
        var peakQueuedDataBytes = 0
        var roomWaiters = Waiters<Void>()

        /// The links attached (carrying the pair), and the one that writes.
        var links: [ObjectIdentifier: Link] = [:]
        var active: Link?
        /// The highest sequence number written on each attached link (for draining a link
        /// before it closes).
        var lastWritten: [ObjectIdentifier: UInt64] = [:]
        var drainWaiters: [Int: (link: ObjectIdentifier, through: UInt64, waiter: CheckedContinuation<Void, Never>)] = [:]
        var nextDrainWaiter = 0

        /// Set once the channel is over (the peer left): every stream ends with it.
        var closure: PeerLinkError?
        var outbox = Outbox()
    }

    // MARK: - Links

    // Calls made under another lock (a link's, the session's) leave what they wake in the
    // channel's outbox: the caller runs ``deliverPending()`` once its lock is released.

    /// Attaches an established link: what it delivers is the channel's from now on.
    func attach(_ link: Link) {
        state.withLock { state in
            guard state.closure == nil else { return }
            state.links[ObjectIdentifier(link)] = link
        }
    }

    /// The link ended: it writes no more. When it was the active one, frames wait for the next.
    func detach(_ link: Link) {
        state.withLock { state in
            let id = ObjectIdentifier(link)
            state.links[id] = nil
            state.lastWritten[id] = nil
            if state.active === link { state.active = nil }
            // a drain waiting for this link ends: it writes no more
            for (key, entry) in state.drainWaiters where entry.link == id {
                state.drainWaiters[key] = nil
                state.outbox.add { entry.waiter.resume() }
            }
        }
    }

    /// Makes `link` (attached) the one that writes the channel's frames (nil: none for now):
    /// it writes again every frame kept and not acknowledged, then new ones.
    package func activate(_ link: Link?) {
        state.withLock { state in
            guard state.active !== link else { return }
            guard let link, state.closure == nil, state.links[ObjectIdentifier(link)] != nil else {
                state.active = nil
                return
            }
            state.active = link
            state.continuity.linkStarted()
            let kept = state.continuity.retainedCount
            if kept > 0 {
                logger.debug(
                    "writing kept frames again on the new link",
                    metadata: ["frames": "\(kept)", "bytes": "\(state.continuity.retainedBytes)"])
            }
            state.outbox.add { link.wakeFromChannel() }
        }
    }

    /// Whether messages or stream bytes still wait here for a link, or were written and are not
    /// yet acknowledged by the peer.
    var hasUndeliveredFrames: Bool {
        state.withLock { $0.continuity.retainedCount > 0 || $0.scheduler.hasPayloadFrames }
    }

    /// The link the channel's frames go out on now.
    public var activeLink: Link? { state.withLock { $0.active } }

    /// Waits until every frame written on `link` is acknowledged (it can close without any
    /// being written again), at most `timeout`; also returns when the link ends.
    func drained(_ link: Link, within timeout: Duration) async {
        let key = state.withLock { state -> Int? in
            let id = ObjectIdentifier(link)
            guard let written = state.lastWritten[id], written > state.continuity.acknowledged, state.links[id] != nil else {
                return nil
            }
            state.nextDrainWaiter += 1
            return state.nextDrainWaiter
        }
        guard let key else { return }
        let deadline = clock.now() + timeout
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    self.state.withLockThenDeliver { state in
                        let id = ObjectIdentifier(link)
                        if let written = state.lastWritten[id], written > state.continuity.acknowledged, state.links[id] != nil {
                            state.drainWaiters[key] = (id, written, continuation)
                        } else {
                            state.outbox.add { continuation.resume() }
                        }
                    }
                }
            }
            group.addTask { try? await self.clock.sleep(until: deadline) }
            await group.next()
            group.cancelAll()
            self.state.withLockThenDeliver { state in
                if let entry = state.drainWaiters.removeValue(forKey: key) { state.outbox.add { entry.waiter.resume() } }
            }
        }
    }

    // MARK: - Writing (called by the active link, under its lock)

    /// What `link` writes next: an `ACK` if one is due, then (when `link` is the active one)
    /// kept frames again, then new sequenced frames, up to `limit` bytes and as the
    /// unacknowledged-bytes limit allows, new ones in at most `maxPayload` bytes each (the link's
    /// ``Link/bulkFramePayload``). Each sequenced frame comes with its number.
    /// `final`: the link is closing (its `GO_AWAY` follows): everything queued goes, past the
    /// unacknowledged-bytes limit, since no acknowledgement will come on it.
    func take(
        for link: Link, limit: Int, maxPayload: Int = .max, at now: Duration, final: Bool = false
    ) -> [(frame: Frame, sequence: UInt64?)] {
        state.withLock { state -> [(frame: Frame, sequence: UInt64?)] in
            guard state.closure == nil, state.links[ObjectIdentifier(link)] != nil else { return [] }
            let isActive = state.active === link
            var taken: [(frame: Frame, sequence: UInt64?)] = []
            if isActive {
                let dataBefore = state.scheduler.queuedDataBytes
                let priorityBefore = state.scheduler.queuedPriorityBytes
                taken = state.continuity.nextFrames(from: &state.scheduler, limit: limit, maxPayload: maxPayload, final: final)
                noteWritten(link, in: &state)
                if state.scheduler.queuedDataBytes < dataBefore { wakeStreamWaiters(&state, stream: nil) }
                if state.scheduler.queuedPriorityBytes < priorityBefore, state.scheduler.queuedPriorityBytes <= maxQueuedBytes {
                    let waiters = state.roomWaiters.removeAll()
                    if !waiters.isEmpty { state.outbox.add { for waiter in waiters { waiter.resume() } } }
                }
            }
            // ACK on the active link (or on any while none writes), first; one owed soon goes
            // with frames written now rather than in a record of its own.
            if isActive || state.active == nil, let through = state.continuity.acknowledgment(at: now, piggyback: !taken.isEmpty) {
                taken.insert((.ack(receivedThrough: through), nil), at: 0)
            }
            return taken
        }
    }

    private func noteWritten(_ link: Link, in state: inout State) {
        if state.continuity.nextSequence > 1 {
            state.lastWritten[ObjectIdentifier(link)] = state.continuity.nextSequence - 1
        }
    }

    /// Whether `link` has something to write now (so its writer should look).
    func hasWork(for link: Link, at now: Duration) -> Bool {
        state.withLock { state in
            guard state.closure == nil else { return false }
            let isActive = state.active === link
            if (isActive || state.active == nil), state.continuity.acknowledgmentPending
                || (state.continuity.acknowledgmentDeadline.map { now >= $0 } ?? false)
            {
                return true
            }
            guard isActive else { return false }
            return state.continuity.hasFramesToResend || (!state.scheduler.isEmpty && state.continuity.canSend)
        }
    }

    /// When an `ACK` is due on `link` (for its ticker), if it writes them.
    func acknowledgmentDeadline(for link: Link) -> Duration? {
        state.withLock { state in
            guard state.active === link || state.active == nil else { return nil }
            return state.continuity.acknowledgmentDeadline
        }
    }

    // MARK: - Receiving (called by a link, under its lock)

    enum Receipt {
        /// New: a message chunk for the session.
        case deliver(Frame)
        /// New, handled here (stream data or credit).
        case handled
        /// A copy, or after a gap: dropped.
        case dropped
        /// The peer broke the stream rules: close the link with this error.
        case violation(WireError)
    }

    /// A sequenced frame arrived on one of the channel's links.
    /// `link` is the link it arrived on: that link looks at its writer and ticker after each
    /// record anyway, so only another (the active one) is woken for an `ACK` now owed.
    func receive(_ frame: Frame, sequence: UInt64, on link: Link, at now: Duration) -> Receipt {
        state.withLock { state -> Receipt in
            guard state.closure == nil else { return .dropped }
            // Nothing taken from the peer yet, and it numbers past 1: it goes on with an exchange
            // this side no longer has (this side dropped the pair, its grace over or its dial
            // refused, while the peer kept it). Taking what follows would silently lose what lies
            // between, both ways: the link ends instead, and both sides start the pair over.
            if state.continuity.received == 0, sequence > 1 {
                return .violation(WireError(.protocolError, Self.stalePairReason(sequence: sequence)))
            }
            let hadDeadline = state.continuity.acknowledgmentDeadline != nil
            let wasPending = state.continuity.acknowledgmentPending
            let arrival = state.continuity.receive(sequence, size: FrameScheduler.size(of: frame), at: now)
            if (state.continuity.acknowledgmentPending && !wasPending) || (!hadDeadline && state.continuity.acknowledgmentDeadline != nil),
                let active = state.active, active !== link
            {
                state.outbox.add { active.wakeFromChannel() }
            }
            guard arrival == .accepted else { return .dropped }
            if state.continuity.bytesPastHold > state.continuity.policy.maxRetainedBytes + Self.heldAllowance {
                return .violation(
                    WireError(
                        .resourceLimit,
                        "over \(state.continuity.bytesPastHold) bytes sent past the last acknowledgement while the app was behind (the limit is \(state.continuity.policy.maxRetainedBytes) unacknowledged bytes)"
                    ))
            }
            switch frame {
            case .data, .windowUpdate:
                if let error = receiveStreamFrame(frame, in: &state) { return .violation(error) }
                return .handled
            case .message(_, _, let chunk):
                state.unconsumedMessageBytes += chunk.count
                holdIfOver(&state)
                if keepsDeliveryOrder { state.delivered.append(frame) }
                return .deliver(frame)
            default:
                return .deliver(frame)
            }
        }
    }

    /// Why a link ends when the peer goes on with an exchange this side no longer has.
    static func stalePairReason(sequence: UInt64) -> String {
        "the peer resumed its messages at frame \(sequence), but this side had dropped the pair and kept nothing of it: both sides start over (what was not acknowledged is lost)"
    }

    /// Whether this side has never sent the peer a sequenced frame (so an acknowledgement of
    /// one is about an exchange this side no longer has).
    var hasSentNothing: Bool { state.withLock { $0.continuity.nextSequence == 1 } }

    /// What a held peer may still send past its unacknowledged-bytes limit before its link is
    /// closed (code 11): what an honest peer flushes as its session ends.
    static let heldAllowance = 16 << 20

    /// The oldest message chunks accepted and not taken yet, up to `count` (see
    /// ``keepsDeliveryOrder``): the session takes one for each chunk event a link hands it,
    /// whichever link that is, a run of them under one turn of the lock.
    func takeDelivered(upTo count: Int) -> [Frame] {
        state.withLock { state in
            var frames: [Frame] = []
            frames.reserveCapacity(count)
            while frames.count < count, let frame = state.delivered.removeFirst() { frames.append(frame) }
            return frames
        }
    }

    /// Over the limit of unconsumed message bytes: acknowledgements stop, so the peer stops
    /// sending soon (``PeerLinkCore/Continuity/hold()``). Not while what the app has to take is
    /// under half the limit (``releaseIfUnder(_:)`` would release it at once): messages held in
    /// part alone are bounded by the partial-message limits instead.
    private func holdIfOver(_ state: inout State) {
        guard state.heldMessageBytes > maxUnconsumedMessageBytes, state.unconsumedMessageBytes > maxUnconsumedMessageBytes / 2,
            state.continuity.heldAt == nil
        else { return }
        state.continuity.hold()
        let queued = state.heldMessageBytes
        state.outbox.add {
            self.logger.info(
                "the app is behind with this peer's messages: holding it back",
                metadata: ["bytes.unconsumed": "\(queued)", "bytes.limit": "\(self.maxUnconsumedMessageBytes)"])
        }
    }

    /// A message of `bytes` from the peer waits for the app (its chunks, counted as they
    /// arrived, are uncounted as the session's state machine takes them). False, for an
    /// unreliable message, when the peer is over the limit: drop it.
    func messageQueued(bytes: Int, reliable: Bool) -> Bool {
        state.withLockThenDeliver { state -> Bool in
            if !reliable, state.heldMessageBytes >= maxUnconsumedMessageBytes { return false }
            state.unconsumedMessageBytes += bytes
            holdIfOver(&state)
            return true
        }
    }

    /// A chunk of `bytes` went through the session's state machine, which now holds
    /// `partialMessageBytes` of the peer's messages in part (a complete message was counted again
    /// by ``messageQueued(bytes:reliable:)``).
    func chunkProcessed(_ bytes: Int, partialMessageBytes: Int) {
        state.withLockThenDeliver { state in
            state.partialMessageBytes = partialMessageBytes
            state.unconsumedMessageBytes = max(0, state.unconsumedMessageBytes - bytes)
            holdIfOver(&state)
            releaseIfUnder(&state)
        }
    }

    /// The app took a message of `bytes` from the peer. Back under half the limit, what arrived
    /// is acknowledged again.
    func messageBytesConsumed(_ bytes: Int) {
        state.withLockThenDeliver { state in
            state.unconsumedMessageBytes = max(0, state.unconsumedMessageBytes - bytes)
            releaseIfUnder(&state)
        }
    }

    /// Releases a hold once what the app has to take is back under half the limit. Messages
    /// held in part do not count here: only more frames can complete them (the sender bounds
    /// them: its outbox starts 16 MiB of messages at most at once).
    private func releaseIfUnder(_ state: inout State) {
        guard state.continuity.heldAt != nil, state.unconsumedMessageBytes <= maxUnconsumedMessageBytes / 2 else { return }
        state.continuity.release()
        if let active = state.active { state.outbox.add { active.wakeFromChannel() } }
        state.outbox.add { self.logger.debug("the app caught up with this peer's messages: acknowledging them again") }
    }

    /// Bytes of the peer's messages the app has not taken yet (received in part included).
    var unconsumedMessageBytes: Int { state.withLock { $0.heldMessageBytes } }

    /// The peer acknowledged every frame up to `through`. False when it acknowledged frames
    /// never sent (a protocol error).
    func acknowledge(through: UInt64) -> Bool {
        state.withLock { state -> Bool in
            guard state.continuity.acknowledge(through: through) else { return false }
            for (key, entry) in state.drainWaiters where entry.through <= state.continuity.acknowledged {
                state.drainWaiters[key] = nil
                state.outbox.add { entry.waiter.resume() }
            }
            // the unacknowledged-bytes limit may have held frames back
            if let active = state.active, !state.scheduler.isEmpty { state.outbox.add { active.wakeWriterFromChannel() } }
            return true
        }
    }

    /// An ACK became due or its deadline moved: the active link's writer or ticker looks.
    /// Carries out what link calls queued (resumes, wake-ups), with no lock held.
    package func deliverPending() {
        state.deliverPending()
    }

    // MARK: - Messages

    /// Queues a sequenced frame the session took for the peer (a message chunk): written on
    /// the active link, now or once there is one. Leaves the wake-up for ``deliverPending()``.
    package func enqueue(_ frames: [Frame]) {
        state.withLock { state in
            guard state.closure == nil else { return }
            for frame in frames { state.scheduler.enqueue(frame) }
            if let active = state.active { state.outbox.add { active.wakeWriterFromChannel() } }
        }
    }

    /// Whether the channel is open with no message waiting to be written: what is handed to
    /// it now goes to its link's writer at once.
    var isIdle: Bool {
        state.withLock { state in state.closure == nil && state.scheduler.queuedPriorityBytes == 0 }
    }

    /// Waits while more than ``maxQueuedBytes`` of messages wait to be written.
    func waitUntilWritable() async throws {
        // the usual case, on every message: room already
        let room = state.withLock { state -> Bool in
            state.closure == nil && state.scheduler.queuedPriorityBytes <= maxQueuedBytes
        }
        if room { return }
        let id = state.withLock { $0.roomWaiters.makeID() }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                state.withLock { state in
                    if let closure = state.closure {
                        continuation.resume(throwing: closure)
                    } else if state.scheduler.queuedPriorityBytes <= maxQueuedBytes {
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

    // MARK: - The end

    /// The channel is over (the peer left, or the session stopped): every stream still going
    /// ends with `error` (bytes that arrived can still be read), waiters wake, frames are dropped.
    package func close(_ error: PeerLinkError) {
        state.withLock { state in
            guard state.closure == nil else { return }
            state.closure = error
            state.active = nil
            state.links = [:]
            state.scheduler.removeAll()
            endStreams(in: &state, error: error)
            let waiters = state.roomWaiters.removeAll()
            let drains = state.drainWaiters.values.map(\.waiter)
            state.drainWaiters = [:]
            state.outbox.add {
                for waiter in waiters { waiter.resume(throwing: error) }
                for drain in drains { drain.resume() }
            }
        }
    }

    /// Stream data waiting for a link now, and the most that ever waited.
    package var dataQueueCounts: (queued: Int, peak: Int) {
        state.withLock { ($0.scheduler.queuedDataBytes, $0.peakQueuedDataBytes) }
    }

    /// Whether the channel is over.
    public var isClosed: Bool { state.withLock { $0.closure != nil } }

    /// Sequenced frames kept for the peer, not acknowledged yet (for tests and diagnostics).
    public var retainedFrameCount: Int { state.withLock { $0.continuity.retainedCount } }
}
