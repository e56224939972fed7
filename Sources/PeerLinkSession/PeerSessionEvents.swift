import PeerLinkCore

/// Events for one consumer, in order, each counted as taken once the consumer is done with it
/// (the session holds back peers whose messages wait too long untaken; see
/// ``PeerSessionEvents``). Iterate it with `for await event in …`; it finishes when its source
/// is over, and for a consumer whose task is cancelled.
public struct EventSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never

    let queue: EventQueue<Element>
    /// Told of the events the consumer took, in order, a run at a time.
    let taken: @Sendable (ArraySlice<Element>) -> Void
    /// What an event weighs towards ``maxUntoldWeight`` (a message: its bytes).
    let weight: @Sendable (Element) -> Int

    /// Events handed out are told as taken when the consumer asks for one more (it is done with
    /// them) and none is left in the iterator's run: before it waits, so every event is told
    /// by the time the consumer waits for the next. Sooner once this many are untold…
    package static var maxUntoldEvents: Int { 32 }
    /// … or they weigh this much: a consumer busy with a run of large messages does not hold
    /// their bytes counted against it for long.
    package static var maxUntoldWeight: Int { 64 * 1024 }

    package init(
        queue: EventQueue<Element>, taken: @escaping @Sendable (ArraySlice<Element>) -> Void,
        weight: @escaping @Sendable (Element) -> Int = { _ in 0 }
    ) {
        self.queue = queue
        self.taken = taken
        self.weight = weight
    }

    /// Takes what waits in the queue at once and hands it out one by one: one lock and at most
    /// one wake-up for a run of events, not one per event; they are told as taken in runs too
    /// (see ``maxUntoldEvents``), one look-up for a run instead of one per event. Events taken
    /// from the queue but not handed out yet go back to its front when the iterator goes (a
    /// consumer that leaves its `for await` loop with `break` and iterates again later misses
    /// none); those handed out are told then.
    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Failure = Never

        let batch: Batch

        public mutating func next() async -> Element? {
            await next(isolation: nil)
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            if batch.position == batch.events.count {
                batch.tell()
                batch.events = []
                batch.position = 0
                batch.told = 0
                guard let more = await batch.queue.take() else { return nil }
                batch.events = more
            } else if batch.position - batch.told >= EventSequence.maxUntoldEvents || batch.untoldWeight >= EventSequence.maxUntoldWeight {
                batch.tell()
            }
            let event = batch.events[batch.position]
            batch.position += 1
            batch.untoldWeight += batch.weight(event)
            return event
        }
    }

    /// An iterator's run of events: its copies share it, and the last to go tells what was
    /// handed out and hands back the rest.
    final class Batch {
        let queue: EventQueue<Element>
        let taken: @Sendable (ArraySlice<Element>) -> Void
        let weight: @Sendable (Element) -> Int
        // Not checked for exclusive access at run time (a check per event handed out): one
        // iterator, which cannot leave its task, is all that touches a batch.
        @exclusivity(unchecked) var events: [Element] = []
        /// The next event to hand out.
        @exclusivity(unchecked) var position = 0
        /// Events before this one were told as taken.
        @exclusivity(unchecked) var told = 0
        /// What the events handed out and not told yet weigh.
        @exclusivity(unchecked) var untoldWeight = 0

        init(queue: EventQueue<Element>, taken: @escaping @Sendable (ArraySlice<Element>) -> Void, weight: @escaping @Sendable (Element) -> Int) {
            self.queue = queue
            self.taken = taken
            self.weight = weight
        }

        /// Tells the events handed out since the last time.
        func tell() {
            guard told < position else { return }
            let run = events[told..<position]
            told = position
            untoldWeight = 0
            taken(run)
        }

        deinit {
            tell()
            if position < events.count { queue.putBack(events[position...]) }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(batch: Batch(queue: queue, taken: taken, weight: weight))
    }

    /// The events as they come, not counted as taken when iterated: for a layer that passes them
    /// on (``markTaken(_:)`` is then its to call, as its own consumer takes them).
    package var uncounted: EventSequence<Element> { EventSequence(queue: queue, taken: { _ in }) }

    /// Counts `events` as taken by the consumer (see ``uncounted``).
    package func markTaken(_ events: ArraySlice<Element>) { taken(events) }

    /// What `event` weighs (see ``maxUntoldWeight``).
    package func weight(of event: Element) -> Int { weight(event) }
}

/// Where a producer puts events for one consumer (an ``EventSequence``), in order, unbounded:
/// ``yield(_:)`` appends under a lock and wakes the consumer only if it waits; the consumer takes
/// everything queued in one go. ``finish()`` ends it once what is queued has been taken; a
/// consumer whose task is cancelled ends it at once (what is queued is dropped, as are later
/// events).
package final class EventQueue<Element: Sendable>: Sendable {
    private struct State: Sendable {
        var items: [Element] = []
        var waiter: UnsafeContinuation<[Element]?, Never>?
        var finished = false
        /// The consumer is gone (its task was cancelled).
        var terminated = false
    }

    private let state = Locked(State())

    /// What is queued (`.some(events)`), the end (`.some(nil)`), or nil: nothing yet.
    private static func takeReady(_ state: inout State) -> [Element]?? {
        if state.terminated { return .some(nil) }
        if !state.items.isEmpty {
            defer { state.items = [] }
            return .some(state.items)
        }
        return state.finished ? .some(nil) : nil
    }

    package init() {}

    /// Whether the consumer waits for the next event (for tests that need it waiting).
    package var consumerWaits: Bool { state.withLock { $0.waiter != nil } }

    /// Queues `element` for the consumer; false if nobody will take it (finished, or the
    /// consumer is gone).
    @discardableResult
    package func yield(_ element: Element) -> Bool {
        let (accepted, waiter) = state.withLock { state -> (Bool, UnsafeContinuation<[Element]?, Never>?) in
            guard !state.finished, !state.terminated else { return (false, nil) }
            if let waiter = state.waiter {
                state.waiter = nil
                return (true, waiter)
            }
            state.items.append(element)
            return (true, nil)
        }
        waiter?.resume(returning: [element])
        return accepted
    }

    /// Queues `elements` for the consumer, in order, with one turn of the lock; false if nobody
    /// will take them.
    @discardableResult
    package func yield(contentsOf elements: [Element]) -> Bool {
        guard !elements.isEmpty else { return true }
        let (accepted, waiter) = state.withLock { state -> (Bool, UnsafeContinuation<[Element]?, Never>?) in
            guard !state.finished, !state.terminated else { return (false, nil) }
            if let waiter = state.waiter {
                state.waiter = nil
                return (true, waiter)
            }
            // Nothing waiting (the usual case): the array itself is kept, its events not copied.
            if state.items.isEmpty { state.items = elements } else { state.items.append(contentsOf: elements) }
            return (true, nil)
        }
        waiter?.resume(returning: elements)
        return accepted
    }

    /// Puts `events` (taken, not handed out: a consumer stopped iterating) back at the front,
    /// for the consumer's next iteration; dropped if the consumer is gone (cancelled).
    func putBack(_ events: ArraySlice<Element>) {
        // Another iterator that waits already takes them at once.
        let handOver = state.withLock { state -> (UnsafeContinuation<[Element]?, Never>, [Element])? in
            guard !state.terminated else { return nil }
            state.items.insert(contentsOf: events, at: 0)
            guard let waiter = state.waiter else { return nil }
            state.waiter = nil
            defer { state.items = [] }
            return (waiter, state.items)
        }
        if let (waiter, ready) = handOver { waiter.resume(returning: ready) }
    }

    /// No more events: the consumer takes what is queued, then its iteration ends.
    package func finish() {
        let waiter = state.withLock { state -> UnsafeContinuation<[Element]?, Never>? in
            state.finished = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
    }

    /// Everything queued, waiting for the first event if none is; nil at the end.
    func take(isolation: isolated (any Actor)? = #isolation) async -> [Element]? {
        // Most calls find events waiting, or the end: no continuation, no suspension. A
        // cancelled consumer's iteration ends, however many events keep coming.
        let cancelled = Task.isCancelled
        if let ready = state.withLock({ state -> [Element]?? in
            if cancelled {
                state.terminated = true
                state.items = []
            }
            return Self.takeReady(&state)
        }) {
            return ready
        }
        return await withTaskCancellationHandler {
            await withUnsafeContinuation(isolation: isolation) { (continuation: UnsafeContinuation<[Element]?, Never>) in
                let ready = state.withLock { state -> [Element]?? in
                    let ready = Self.takeReady(&state)
                    if ready == nil { state.waiter = continuation }
                    return ready
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> UnsafeContinuation<[Element]?, Never>? in
                state.terminated = true
                state.items = []
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume(returning: nil)
        }
    }
}

/// What a ``PeerSession`` tells the app, in order, for one consumer: iterate it with
/// `for await event in session.events`. It finishes when ``PeerSession/run()`` returns.
///
/// Events wait here until the app takes them. Messages are counted per peer while they wait:
/// over ``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer`` the session holds that
/// peer back (its reliable messages are no longer acknowledged, so it stops sending; its
/// unreliable ones are dropped) until the app has taken half of them. An app that stops
/// reading therefore holds up the peers that send to it, never its own memory.
public typealias PeerSessionEvents = EventSequence<PeerSessionEvent>

extension PeerSession {
    /// An unreliable message is about to wait for the app: counted on its peer's channel (which
    /// holds the peer back once it is over its limit). False when it is dropped instead, the peer
    /// being over the limit. (Reliable messages are counted in runs, ``MessageTally``.)
    func queueDatagram(from peer: PeerID, bytes: Int, in core: inout SessionCore) -> Bool {
        guard let channel = core.channels[peer.fingerprint] else { return true }
        guard channel.messageQueued(bytes: bytes, reliable: false) else {
            core.droppedIncomingDatagrams += 1
            return false
        }
        return true
    }

    /// Reliable messages from one peer reported in a row (a run from its link), counted on the
    /// peer's channel at once when the run ends: one look-up and one turn of the channel's lock
    /// for the run, not one for each message. Flushed before an unreliable message is counted
    /// (whether it is dropped depends on what came before) and before the actions are done.
    struct MessageTally {
        private var peer: Fingerprint?
        private var channel: PeerChannel?
        private var bytes = 0

        mutating func add(_ count: Int, from peer: PeerID, in core: SessionCore) {
            if peer.fingerprint != self.peer {
                flush()
                self.peer = peer.fingerprint
                channel = core.channels[peer.fingerprint]
            }
            bytes += count
        }

        /// Counts what was added on the channel (reliable messages are never dropped).
        mutating func flush() {
            if let channel, bytes > 0 { _ = channel.messageQueued(bytes: bytes, reliable: true) }
            peer = nil
            channel = nil
            bytes = 0
        }
    }

    /// The app took `events` from ``events``: their messages' bytes are uncounted on their
    /// peers' channels, with one look-up for the run and one call per peer.
    func eventsTaken(_ events: ArraySlice<PeerSessionEvent>) {
        // The bytes by peer, in a list: a run of events comes from a few peers at most (a
        // session has eight), and a table would hash a fingerprint for every message.
        var bytes: [(fingerprint: Fingerprint, count: Int)] = []
        for event in events {
            guard case .message(let peer, let data, _) = event else { continue }
            let fingerprint = peer.fingerprint
            if let index = bytes.firstIndex(where: { $0.fingerprint == fingerprint }) {
                bytes[index].count += data.count
            } else {
                bytes.append((fingerprint, data.count))
            }
        }
        guard !bytes.isEmpty else { return }
        let channels = core.withLock { core in bytes.compactMap { entry in core.channels[entry.fingerprint].map { ($0, entry.count) } } }
        for (channel, count) in channels { channel.messageBytesConsumed(count) }
    }

    /// What an event weighs towards how soon it is told as taken: a message, its bytes.
    static func weight(of event: PeerSessionEvent) -> Int {
        if case .message(_, let data, _) = event { data.count } else { 0 }
    }

    /// Bytes of `peer`'s messages not taken by the app yet: waiting in ``events``, or on their
    /// way there.
    public func queuedMessageBytes(from peer: PeerID) -> Int {
        core.withLock { $0.channels[peer.fingerprint] }?.unconsumedMessageBytes ?? 0
    }

    /// Unreliable messages dropped on arrival because their peer was over
    /// ``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer`` (the app was behind).
    public var droppedIncomingUnreliableMessages: Int {
        core.withLock { $0.droppedIncomingDatagrams }
    }
}
