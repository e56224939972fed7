/// The reliable delivery between the local peer and one remote peer, across links: the
/// sequence numbers of sequenced frames (``FrameType/isSequenced``: reliable message chunks,
/// stream data and stream credit), what was sent and not yet acknowledged, and what arrived.
///
/// It belongs to the pair of peers — one incarnation of each (``Incarnation``) — not to a link,
/// so it outlives the link that carried its frames:
///
/// - **Sending.** A sequenced frame gets the next number when it is written to a link
///   (``stamp(_:size:)``), in the order frames are written, whichever link carries them. It is
///   kept until the peer acknowledges it (``acknowledge(through:)``). When frames start going
///   out on another link, every kept frame is written there again first, in order
///   (``retained(after:)``).
/// - **Receiving.** A sequenced frame is taken only if its number is exactly one more than what
///   arrived so far (``receive(_:size:at:)``): a smaller one is a copy already taken (sent again
///   on a new link while the old one still delivered it), a larger one came after a gap (the
///   sender sends it again from the gap). Either way it is dropped. So every sequenced frame is
///   taken exactly once, in order, whatever links carried it.
/// - **Acknowledging.** The receiver answers with `ACK` (the highest number taken in order):
///   after ``Policy/ackEveryFrames`` frames or ``Policy/ackEveryBytes`` bytes, ``Policy/ackDelay``
///   after the first frame not yet acknowledged, and at once when a link starts carrying the
///   pair or a copy or gap arrives (``acknowledgment(at:)``).
///
/// Pure value: no I/O, no clock (the time is passed in).
public struct Continuity: Sendable {
    public struct Policy: Hashable, Sendable {
        /// An `ACK` goes out once this many sequenced frames arrived since the last one.
        public var ackEveryFrames: Int
        /// … or this many bytes of them.
        public var ackEveryBytes: Int
        /// … or this long after the first of them arrived.
        public var ackDelay: Duration
        /// The most bytes of sequenced frames kept for the peer, unacknowledged; the sender
        /// writes no new sequenced frame beyond it (``canSend``) until acknowledgements come.
        public var maxRetainedBytes: Int

        public init(
            ackEveryFrames: Int = 64, ackEveryBytes: Int = 256 * 1024, ackDelay: Duration = .milliseconds(20),
            maxRetainedBytes: Int = 4 * 1024 * 1024
        ) {
            self.ackEveryFrames = max(1, ackEveryFrames)
            self.ackEveryBytes = max(1, ackEveryBytes)
            self.ackDelay = ackDelay
            self.maxRetainedBytes = max(WireFormat.maxFramePayload + 64, maxRetainedBytes)
        }

        public static let `default` = Policy()
    }

    /// A sequenced frame kept until the peer acknowledges it.
    public struct Retained: Hashable, Sendable {
        public var sequence: UInt64
        public var frame: Frame
        /// Its size on the wire (header and payload), for the retained-bytes limit.
        public var size: Int
    }

    /// How an arriving sequenced frame is treated.
    public enum Arrival: Hashable, Sendable {
        /// The next one: take it.
        case accepted
        /// A copy of one taken before: drop it.
        case duplicate
        /// One after a gap: drop it (the sender sends it again, after the missing ones).
        case gap
    }

    public let policy: Policy

    // Sending.
    /// The number the next stamped frame gets.
    public private(set) var nextSequence: UInt64 = 1
    /// Every frame up to this number was acknowledged by the peer.
    public private(set) var acknowledged: UInt64 = 0
    private var kept = FIFO<Retained>()
    /// Bytes of the frames kept.
    public private(set) var retainedBytes = 0
    /// Kept frames numbered after this are written again (on the link now carrying the pair)
    /// before new ones.
    public private(set) var resendAfter: UInt64 = 0

    // Receiving.
    /// Every frame up to this number arrived, in order.
    public private(set) var received: UInt64 = 0
    /// What the last `ACK` sent said.
    public private(set) var lastAcknowledgmentSent: UInt64 = 0
    private var framesSinceAck = 0
    private var bytesSinceAck = 0
    /// When an `ACK` is due for frames that arrived (nil: none owed).
    public private(set) var acknowledgmentDeadline: Duration?
    /// An `ACK` is owed at once (a new link, a copy or a gap).
    private var acknowledgeNow = false
    /// A new link, a copy or a gap: the peer must hear the acknowledged number again, even held.
    private var announce = false
    /// While the app is behind with what arrived (``hold()``), acknowledgements stop here.
    public private(set) var heldAt: UInt64?
    /// Bytes of frames that arrived after ``heldAt`` (0 when not held). An honest peer writes at
    /// most its ``Policy/maxRetainedBytes`` past the last `ACK` it heard (and, as its session
    /// ends, what it had queued).
    public private(set) var bytesPastHold = 0

    public init(policy: Policy = .default) {
        self.policy = policy
    }

    // MARK: - Sending

    /// Whether a new sequenced frame may be written now: false while ``Policy/maxRetainedBytes``
    /// are kept unacknowledged (the peer is slow to acknowledge, or unreachable).
    public var canSend: Bool { retainedBytes < policy.maxRetainedBytes }

    /// Frames kept, unacknowledged.
    public var retainedCount: Int { kept.count }

    /// Gives `frame` the next sequence number and keeps it until acknowledged. `size` is its
    /// size on the wire.
    public mutating func stamp(_ frame: Frame, size: Int) -> UInt64 {
        let sequence = nextSequence
        nextSequence += 1
        kept.append(Retained(sequence: sequence, frame: frame, size: size))
        retainedBytes += size
        resendAfter = sequence
        return sequence
    }

    /// Whether kept frames wait to be written again on the link now carrying the pair.
    public var hasFramesToResend: Bool { resendAfter < nextSequence - 1 }

    /// What the link carrying the pair writes next, about `limit` bytes at most: kept frames
    /// again (after a link change), then new frames from `scheduler`, numbered, while the
    /// unacknowledged-bytes limit allows (`final`: the link is closing and no acknowledgement
    /// will come on it: everything queued goes). New frames are taken in at most `maxPayload`
    /// bytes each (``FrameScheduler/next(maxPayload:)``); kept ones go again as they were.
    /// Each frame comes with its number, as a link writes it.
    public mutating func nextFrames(
        from scheduler: inout FrameScheduler, limit: Int, maxPayload: Int = .max, final: Bool = false
    ) -> [(frame: Frame, sequence: UInt64?)] {
        var taken: [(frame: Frame, sequence: UInt64?)] = []
        var size = 0
        if hasFramesToResend, let first = kept.first?.sequence {
            // kept holds every number from `first` on, in order
            var next = max(resendAfter + 1, first)
            while next < nextSequence, size < limit {
                let item = kept[offset: Int(next - first)]
                taken.append((item.frame, item.sequence))
                size += item.size
                resendAfter = next
                next += 1
            }
            if hasFramesToResend { return taken }
        }
        while size < limit, final || canSend, let frame = scheduler.next(maxPayload: maxPayload) {
            let frameSize = FrameScheduler.size(of: frame)
            let sequence = stamp(frame, size: frameSize)
            taken.append((frame, sequence))
            size += frameSize
        }
        return taken
    }

    /// The peer acknowledged every frame up to `through`: they are no longer kept.
    ///
    /// - Returns: false when `through` is beyond every number given out (a peer that
    ///   acknowledges what was never sent breaks the protocol); true otherwise (an old or repeated
    ///   acknowledgement is fine and changes nothing).
    @discardableResult
    public mutating func acknowledge(through: UInt64) -> Bool {
        guard through < nextSequence else { return false }
        guard through > acknowledged else { return true }
        acknowledged = through
        resendAfter = max(resendAfter, through)
        kept.removeFirst(while: { $0.sequence <= through }) { retainedBytes -= $0.size }
        return true
    }

    /// The kept frames numbered after `sequence`, in order: what a link that starts carrying the
    /// pair writes again first (from `max(sequence, acknowledged)`).
    public func retained(after sequence: UInt64) -> [Retained] {
        kept.reduce(into: []) { result, item in
            if item.sequence > sequence { result.append(item) }
        }
    }

    // MARK: - Receiving

    /// A sequenced frame numbered `sequence` (of `size` bytes on the wire) arrived at `now`.
    public mutating func receive(_ sequence: UInt64, size: Int, at now: Duration) -> Arrival {
        guard sequence == received + 1 else {
            acknowledgeNow = true
            announce = true
            return sequence <= received ? .duplicate : .gap
        }
        received = sequence
        if heldAt != nil { bytesPastHold += size }
        framesSinceAck += 1
        bytesSinceAck += size
        if acknowledgmentDeadline == nil { acknowledgmentDeadline = now + policy.ackDelay }
        if framesSinceAck >= policy.ackEveryFrames || bytesSinceAck >= policy.ackEveryBytes { acknowledgeNow = true }
        return .accepted
    }

    /// A link starts carrying the pair: every kept frame is written on it again (from what the
    /// peer acknowledged), and the peer learns at once what arrived, so it writes again only
    /// what is missing.
    public mutating func linkStarted() {
        acknowledgeNow = true
        announce = true
        resendAfter = acknowledged
    }

    /// The app is behind with what arrived: frames keep being taken, but acknowledgements stop
    /// at what arrived so far, so the peer's unacknowledged-bytes limit stops it soon. Back
    /// pressure for a peer whose messages the app does not read; ``release()`` ends it.
    public mutating func hold() {
        guard heldAt == nil else { return }
        heldAt = received
        bytesPastHold = 0
    }

    /// The app caught up: what arrived is acknowledged again (an `ACK` is owed at once).
    public mutating func release() {
        guard heldAt != nil else { return }
        heldAt = nil
        bytesPastHold = 0
        if received > lastAcknowledgmentSent { acknowledgeNow = true }
    }

    /// The `ACK` to send at `now`, if one is due: its number (what arrived in order). Taking it
    /// counts it as sent. `piggyback`: other frames go out in the same record now, so an
    /// `ACK` owed later (``acknowledgmentDeadline``) goes with them instead of in a record of
    /// its own.
    public mutating func acknowledgment(at now: Duration, piggyback: Bool = false) -> UInt64? {
        let due =
            acknowledgeNow || (acknowledgmentDeadline.map { now >= $0 } ?? false)
            || (piggyback && received > lastAcknowledgmentSent)
        guard due else { return nil }
        acknowledgeNow = false
        acknowledgmentDeadline = nil
        if let heldAt {
            // held: nothing past the hold point; the hold point itself once, or again for a
            // new link, a copy or a gap
            defer { announce = false }
            guard announce || heldAt > lastAcknowledgmentSent else { return nil }
            lastAcknowledgmentSent = max(lastAcknowledgmentSent, heldAt)
            return heldAt
        }
        announce = false
        framesSinceAck = 0
        bytesSinceAck = 0
        lastAcknowledgmentSent = received
        return received
    }

    /// Whether an `ACK` is owed at once (without waiting for ``acknowledgmentDeadline``).
    public var acknowledgmentPending: Bool { acknowledgeNow }
}
