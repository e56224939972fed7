import PeerLinkCore

/// A named byte stream to one connected peer, with credit flow control. It belongs to the pair
/// of peers, not to a link: it goes on, nothing lost, when the link under it changes.
///
/// Open one with ``PeerSession/openStream(named:to:)``; streams peers open arrive on
/// ``PeerSession/incomingStreams``. Each direction is an ordered byte stream:
///
/// ```swift
/// let stream = try await session.openStream(named: "photo.jpg", to: bo)
/// try await stream.write(bytes)          // waits while the peer's window is used up
/// try await stream.finish()              // FIN: no more bytes from this side
/// for try await chunk in stream.chunks { … }   // the peer's bytes, until its FIN
/// ```
///
/// Behaviour worth knowing:
/// - **Back-pressure.** Each direction has a window of 256 KiB, which the receiver grows (up to
///   4 MiB) to what a fast reader takes in about 0.75 ms and shrinks again when it slows.
///   ``write(_:)`` returns once the bytes are queued, and waits while the window is used up: the
///   peer grants more only as its reader calls ``read()``. A stream nobody reads stops its
///   writer; it never grows memory.
/// - **Fairness.** Stream data goes out after control frames and messages, round-robin between
///   streams, so a large transfer never holds up a chat message.
/// - **Ends.** ``finish()`` ends this side's direction; ``read()`` returns nil after the peer's.
///   ``reset(reason:)`` aborts both ways: the peer's reads and writes throw `cancelled` with
///   "reset by the peer: REASON". A link that fails is replaced (while the peer stays in the
///   session) and the stream goes on; when the peer leaves, writes throw `notConnected` at once
///   and reads do after the bytes that arrived.
/// - One writer and one reader at a time: concurrent writes interleave their chunks.
/// - Equal only to itself.
public final class PeerStream: Sendable, Hashable, CustomStringConvertible {
    /// Chosen by the opener, 1–255 bytes of UTF-8; carried by the `SYN`.
    public let name: String
    /// The other side.
    public let peer: PeerID
    /// The stream's id between the two peers (odd when the peer with the smaller fingerprint
    /// opened it).
    public let id: UInt32
    /// This side opened it.
    public let isOutgoing: Bool
    let channel: PeerChannel

    init(channel: PeerChannel, id: UInt32, name: String, peer: PeerID, isOutgoing: Bool) {
        self.channel = channel
        self.id = id
        self.name = name
        self.peer = peer
        self.isOutgoing = isOutgoing
    }

    /// The app let go of the stream: its bookkeeping goes once the stream is over both ways.
    deinit {
        channel.streamReleased(id)
    }

    /// Queues `bytes` to the peer; suspends while the peer's receive window has no credit (or
    /// the queue of stream data waiting for a link is full). Returns once every byte is queued.
    ///
    /// - Throws: ``PeerLinkCore/PeerLinkError`` `notConnected` once the peer is gone, `cancelled`
    ///   after a reset (either side), `invalidParameter` after ``finish()``;
    ///   `CancellationError` when the task is cancelled (some bytes may have been queued).
    public func write(_ bytes: [UInt8]) async throws {
        try await channel.writeStream(id, bytes)
    }

    /// Half-closes this side's direction (`FIN`) after everything written; reading goes on.
    ///
    /// - Throws: ``PeerLinkCore/PeerLinkError`` as ``write(_:)``; `invalidParameter` when finished already.
    public func finish() async throws {
        try channel.finishStream(id)
    }

    /// Aborts both directions (`RST` with `reason`): bytes not yet sent are dropped, and the
    /// peer's reads and writes throw "reset by the peer: REASON". Does nothing once the stream
    /// was reset or the link is gone.
    public func reset(reason: String) {
        channel.resetStream(id, reason: reason)
    }

    /// The next chunk the peer sent, nil after its `FIN`. Reading is what grants the peer more
    /// credit (`WINDOW_UPDATE`): an unread stream stops the sender.
    ///
    /// - Throws: ``PeerLinkCore/PeerLinkError`` `cancelled` after a reset, `notConnected` when the
    ///   link closed (after the bytes that arrived before), `CancellationError`.
    public func read() async throws -> [UInt8]? {
        try await channel.readStream(id)
    }

    /// The peer's bytes as an asynchronous sequence of chunks, as ``read()`` returns them.
    public var chunks: Chunks { Chunks(stream: self) }

    public struct Chunks: AsyncSequence, Sendable {
        public typealias Element = [UInt8]
        let stream: PeerStream

        public struct AsyncIterator: AsyncIteratorProtocol {
            let stream: PeerStream

            public mutating func next() async throws -> [UInt8]? {
                try await stream.read()
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(stream: stream) }
    }

    public static func == (lhs: PeerStream, rhs: PeerStream) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    public var description: String {
        "stream \(id) \"\(name)\" \(isOutgoing ? "to" : "from") \(peer)"
    }
}

/// One peer's stream accounting (``PeerSession/streamStatistics(for:)``).
package struct StreamStatistics: Sendable, Hashable {
    /// Streams open on the link, both directions.
    package var openStreams: Int
    /// Bytes received on its streams that no reader took yet (at most a window per stream).
    package var unreadBytes: Int
    /// Bytes of stream data waiting to be written now.
    package var queuedDataBytes: Int
    /// The most bytes of stream data that ever waited at once.
    package var peakQueuedDataBytes: Int
    /// The bound on ``queuedDataBytes``.
    package var maxQueuedDataBytes: Int
}
