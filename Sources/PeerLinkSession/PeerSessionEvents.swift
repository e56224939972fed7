import PeerLinkCore

/// Events for one consumer, in order, each counted as taken when the consumer takes it (the
/// session holds back peers whose messages wait too long untaken; see ``PeerSessionEvents``).
/// Iterate it with `for await event in …`; it finishes when its source is over, and for a
/// consumer whose task is cancelled.
public struct EventSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never

    let queue: EventQueue<Element>
    /// Told of each event as the consumer takes it.
    let taken: @Sendable (Element) -> Void

    package init(queue: EventQueue<Element>, taken: @escaping @Sendable (Element) -> Void) {
        self.queue = queue
        self.taken = taken
    }

    /// Takes what waits in the queue at once and hands it out one by one: one lock and at most
    /// one wake-up for a run of events, not one per event. Events taken from the queue but not
    /// handed out yet go back to its front when the iterator goes (a consumer that leaves its
    /// `for await` loop with `break` and iterates again later misses none).
    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Failure = Never

        let taken: @Sendable (Element) -> Void
        let batch: Batch

        public mutating func next() async -> Element? {
            await next(isolation: nil)
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            if batch.position == batch.events.count {
                batch.events = []
                batch.position = 0
                guard let more = await batch.queue.take() else { return nil }
                batch.events = more
            }
            let event = batch.events[batch.position]
            batch.position += 1
            taken(event)
            return event
        }
    }

    /// An iterator's run of events: its copies share it, and the last to go hands back the rest.
    final class Batch {
        let queue: EventQueue<Element>
        var events: [Element] = []
        var position = 0

        init(queue: EventQueue<Element>) { self.queue = queue }

        deinit {
            if position < events.count { queue.putBack(events[position...]) }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(taken: taken, batch: Batch(queue: queue))
    }

    /// The events as they come, not counted as taken when iterated: for a layer that passes them
    /// on (``markTaken(_:)`` is then its to call, as its own consumer takes each).
    package var uncounted: EventSequence<Element> { EventSequence(queue: queue, taken: { _ in }) }

    /// Counts `event` as taken by the consumer (see ``uncounted``).
    package func markTaken(_ event: Element) { taken(event) }
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
    /// A message event is about to wait for the app: counted on its peer's channel (which holds
    /// the peer back once it is over its limit). False for an unreliable message dropped instead.
    func queueMessage(from peer: PeerID, bytes: Int, reliable: Bool, in core: inout SessionCore) -> Bool {
        guard let channel = core.channels[peer.fingerprint] else { return true }
        guard channel.messageQueued(bytes: bytes, reliable: reliable) else {
            core.droppedIncomingDatagrams += 1
            return false
        }
        return true
    }

    /// The app took `event` from ``events``.
    func eventTaken(_ event: PeerSessionEvent) {
        guard case .message(let peer, let data, _) = event else { return }
        core.withLock { $0.channels[peer.fingerprint] }?.messageBytesConsumed(data.count)
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
