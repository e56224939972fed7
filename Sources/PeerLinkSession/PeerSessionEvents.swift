import PeerLinkCore

/// What a ``PeerSession`` tells the app, in order, for one consumer: iterate it with
/// `for await event in session.events`. It finishes when ``PeerSession/run()`` returns.
///
/// Events wait here until the app takes them. Messages are counted per peer while they wait:
/// over ``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer`` the session holds that
/// peer back (its reliable messages are no longer acknowledged, so it stops sending; its
/// unreliable ones are dropped) until the app has taken half of them. An app that stops
/// reading therefore holds up the peers that send to it, never its own memory.
public struct PeerSessionEvents: AsyncSequence, Sendable {
    public typealias Element = PeerSessionEvent
    public typealias Failure = Never

    let base: AsyncStream<PeerSessionEvent>
    /// Told of each event as the app takes it.
    let taken: @Sendable (PeerSessionEvent) -> Void

    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Element = PeerSessionEvent
        public typealias Failure = Never

        var base: AsyncStream<PeerSessionEvent>.Iterator
        let taken: @Sendable (PeerSessionEvent) -> Void

        public mutating func next() async -> PeerSessionEvent? {
            guard let event = await base.next() else { return nil }
            taken(event)
            return event
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> PeerSessionEvent? {
            guard let event = await base.next(isolation: actor) else { return nil }
            taken(event)
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), taken: taken)
    }

    /// The events as they come, not counted as taken when iterated: for a layer that passes them
    /// on (``PeerSessionEvents/taken(_:)`` is then its to call, as its own consumer takes each).
    package var uncounted: AsyncStream<PeerSessionEvent> { base }

    /// Counts `event` as taken by the app (see ``uncounted``).
    package func markTaken(_ event: PeerSessionEvent) { taken(event) }
}

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
