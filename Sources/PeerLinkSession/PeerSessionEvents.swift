import PeerLinkCore

/// Events for one consumer, in order, each counted as taken when the consumer takes it (the
/// session holds back peers whose messages wait too long untaken; see ``PeerSessionEvents``).
/// Iterate it with `for await event in …`; it finishes when its source is over.
public struct EventSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never

    let base: AsyncStream<Element>
    /// Told of each event as the consumer takes it.
    let taken: @Sendable (Element) -> Void

    package init(base: AsyncStream<Element>, taken: @escaping @Sendable (Element) -> Void) {
        self.base = base
        self.taken = taken
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Failure = Never

        var base: AsyncStream<Element>.Iterator
        let taken: @Sendable (Element) -> Void

        public mutating func next() async -> Element? {
            guard let event = await base.next() else { return nil }
            taken(event)
            return event
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            guard let event = await base.next(isolation: actor) else { return nil }
            taken(event)
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), taken: taken)
    }

    /// The events as they come, not counted as taken when iterated: for a layer that passes them
    /// on (``markTaken(_:)`` is then its to call, as its own consumer takes each).
    package var uncounted: AsyncStream<Element> { base }

    /// Counts `event` as taken by the consumer (see ``uncounted``).
    package func markTaken(_ event: Element) { taken(event) }
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
