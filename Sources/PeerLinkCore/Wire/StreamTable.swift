/// The streams of one link and their credit, as a pure value: ids by role, opening and
/// accepting, the windows in both directions, `FIN` and `RST`, and the frames these produce.
///
/// It does no I/O and holds no bytes: its owner passes it the stream frames that arrive
/// (``receive(_:)``), asks it for credit before sending (``takeCredit(_:upTo:)``), tells it what
/// the reader consumed (``consumed(_:count:)``), and sends the frames it returns.
///
/// ```swift
/// var table = StreamTable(role: .dialer)
/// let (id, syn) = try table.open(name: "photo.jpg")      // send syn
/// let credit = table.takeCredit(id, upTo: chunk.count)    // send that many bytes as DATA
/// let outcome = try table.receive(frame)                  // events, and frames to send
/// if let update = table.consumed(id, count: n, at: now) { … }  // a WINDOW_UPDATE, now and then
/// ```
///
/// The rules (the *Wire Format* article has them in full):
/// - The side in ``LinkStateMachine/Role/dialer``'s role opens odd ids (1, 3, …), the other even
///   ones (2, 4, …), each side counting up. A session gives the dialer's role to the peer whose
///   fingerprint sorts first, whichever side dialled the link, so the ids stay the same on every
///   link between two peers.
/// - A stream opens with a `DATA` frame carrying `SYN` and the stream's name (1–255 bytes of
///   UTF-8) as its payload; the name does not count against the window. The other side accepts
///   with a `WINDOW_UPDATE` carrying `ACK` (credit 0), or refuses with `RST`.
/// - Each direction starts with ``WireFormat/initialStreamWindow`` of credit. The receiver grants
///   what its reader consumed once that is at least half the stream's window.
/// - The receiver sizes each stream's window to what its reader takes in
///   ``WindowTuning/targetDelay`` (see ``WindowTuning``): a fast reader's window grows (credit
///   beyond what it consumed), never below the initial window; the peer only sees credit.
/// - `FIN` ends one direction; a stream is gone once both directions ended, or after `RST`
///   (a `DATA` frame whose payload is the reason).
/// - Protocol errors (thrown as ``WireError``, code 1): bytes over the window, bytes after `FIN`,
///   a `SYN` with an id of the wrong parity or not above the peer's last one, or a malformed name,
///   a `SYN` on a `WINDOW_UPDATE`, a window grown past ``WireFormat/maxStreamWindow``.
/// - Frames for a stream that is not open (reset or closed while they were on their way) are
///   ignored.
public struct StreamTable: Sendable {
    /// One open stream's accounting.
    public struct Entry: Hashable, Sendable {
        public let name: String
        /// Opened by this side.
        public let isOutgoing: Bool
        /// The peer accepted it (always true for a stream the peer opened).
        public internal(set) var isAccepted: Bool
        /// Bytes this side may still send.
        public internal(set) var sendWindow: Int
        /// Bytes the peer may still send.
        public internal(set) var receiveWindow: Int
        /// Bytes the reader consumed that were not granted back yet.
        public internal(set) var unacknowledged = 0
        /// The stream's receive window: what the peer may have sent and the reader not consumed
        /// yet, once every consumed byte is granted back. The initial window until
        /// ``WindowTuning`` sizes it to the reader's pace.
        public internal(set) var receiveLimit: Int
        /// When the reader's pace is measured from (nil: not yet, or granted without a time),
        /// and what it consumed since, counted at each grant.
        var paceStart: Duration?
        var paceBytes = 0
        /// This side sent `FIN`.
        public internal(set) var localFinished = false
        /// The peer sent `FIN`.
        public internal(set) var remoteFinished = false
    }

    /// What a received frame means for the owner.
    public enum Event: Hashable, Sendable {
        /// The peer opened a stream; it is accepted already (the `ACK` is among the frames).
        case opened(id: UInt32, name: String)
        /// The peer accepted a stream this side opened.
        case accepted(id: UInt32)
        /// Stream bytes, within the window.
        case data(id: UInt32, bytes: [UInt8])
        /// The peer finished its direction: no bytes follow.
        case finished(id: UInt32)
        /// The peer reset the stream (or refused to open it); it is gone.
        case reset(id: UInt32, reason: String)
        /// The stream's send window grew.
        case credit(id: UInt32)
    }

    /// What ``receive(_:)`` produced: events for the owner, frames to send back.
    public struct Outcome: Hashable, Sendable {
        public var events: [Event] = []
        public var frames: [Frame] = []

        public init(events: [Event] = [], frames: [Frame] = []) {
            self.events = events
            self.frames = frames
        }
    }

    /// How the receive windows follow their readers' pace.
    ///
    /// A stream's bytes in flight are bounded by its window, and so is its throughput: at most a
    /// window per turn of the credit loop (the peer sends, this side reads, the credit goes
    /// back). A bigger window lets more through, and makes anything sent behind the stream's
    /// bytes on the same link (a message, a ping) wait longer: about the window over the rate
    /// at which the receiving side drains it. So once a stream's reader has consumed a whole
    /// window since the last look (or eight times ``targetDelay`` passed), the receiver takes its
    /// pace over that span and sizes the window to what the reader takes in ``targetDelay`` —
    /// between the initial window and ``maximumWindow``, growing at most twofold at a time and
    /// shrinking by at most half the credit due (the difference rides on the grant). A slow
    /// reader (a Bluetooth link, an app that reads now and then) keeps the initial window, and so
    /// does a table given no times.
    public struct WindowTuning: Hashable, Sendable {
        /// What the window should take to drain at the reader's measured pace. 0: windows stay at
        /// the initial size.
        public var targetDelay: Duration
        /// The largest receive window a stream reaches.
        public var maximumWindow: Int
        /// The most bytes all streams' windows together may grow past the initial window: what
        /// fast readers can make a table's peer hold in flight beyond the initial windows.
        public var maximumGrowth: Int

        public init(targetDelay: Duration, maximumWindow: Int, maximumGrowth: Int) {
            self.targetDelay = targetDelay
            self.maximumWindow = maximumWindow
            self.maximumGrowth = maximumGrowth
        }

        /// A window of 0.75 ms of reading, up to 4 MiB a stream and 16 MiB of growth for all.
        public static let `default` = WindowTuning(
            targetDelay: .microseconds(750), maximumWindow: 4 * 1024 * 1024, maximumGrowth: 16 * 1024 * 1024)
        /// Windows stay at the initial size.
        public static let fixed = WindowTuning(targetDelay: .zero, maximumWindow: 0, maximumGrowth: 0)
    }

    public let role: LinkStateMachine.Role
    public let initialWindow: Int
    public let maxStreams: Int
    public let tuning: WindowTuning
    public private(set) var entries: [UInt32: Entry] = [:]
    private var nextLocalID: UInt32
    /// The highest id the peer opened so far (0: none yet).
    private var lastRemoteID: UInt32 = 0

    /// - Parameters:
    ///   - role: `.dialer` opens odd ids, `.listener` even ones (a session passes `.dialer` to the
    ///     peer whose fingerprint sorts first).
    ///   - initialWindow: the window every stream starts with in each direction.
    ///   - maxStreams: how many streams each side may have open at once.
    ///   - tuning: how receive windows follow their readers (``WindowTuning``).
    public init(
        role: LinkStateMachine.Role, initialWindow: Int = WireFormat.initialStreamWindow,
        maxStreams: Int = WireFormat.maxStreamsPerLink, tuning: WindowTuning = .default
    ) {
        self.role = role
        self.initialWindow = max(1, initialWindow)
        self.maxStreams = max(1, maxStreams)
        self.tuning = tuning
        nextLocalID = role == .dialer ? 1 : 2
    }

    /// The stream `id`, while it is open.
    public subscript(id: UInt32) -> Entry? { entries[id] }

    /// Streams open that this side opened, and that the peer opened.
    public var openCounts: (outgoing: Int, incoming: Int) {
        let outgoing = entries.values.count(where: \.isOutgoing)
        return (outgoing, entries.count - outgoing)
    }

    // MARK: - This side

    /// Opens a stream: its id and the `SYN` frame to send.
    ///
    /// - Throws: ``PeerLinkError`` `invalidParameter` for a name that is empty or over 255 bytes,
    ///   `unavailable` when this side has ``maxStreams`` open or the link's ids are used up.
    public mutating func open(name: String) throws(PeerLinkError) -> (id: UInt32, frame: Frame) {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= WireFormat.maxStreamNameLength else {
            throw PeerLinkError(
                .invalidParameter,
                "a stream name is 1 to \(WireFormat.maxStreamNameLength) bytes of UTF-8; \"\(name.prefix(40))\" is \(bytes.count)")
        }
        guard openCounts.outgoing < maxStreams else {
            throw PeerLinkError(
                .unavailable, "\(maxStreams) streams are open to this peer already: finish or reset one before opening another")
        }
        guard nextLocalID <= UInt32.max - 1 else {
            throw PeerLinkError(.unavailable, "this link has used up its stream ids: disconnect and connect again")
        }
        let id = nextLocalID
        nextLocalID += 2
        entries[id] = Entry(
            name: name, isOutgoing: true, isAccepted: false, sendWindow: initialWindow, receiveWindow: initialWindow,
            receiveLimit: initialWindow)
        return (id, .data(stream: id, flags: .syn, payload: FramePayload(bytes)))
    }

    /// Takes up to `count` bytes of the stream's send credit: how many may be sent now (0 when
    /// the window is used up or the stream cannot send: unknown, finished).
    public mutating func takeCredit(_ id: UInt32, upTo count: Int) -> Int {
        guard var entry = entries[id], !entry.localFinished else { return 0 }
        let granted = max(0, min(count, entry.sendWindow))
        entry.sendWindow -= granted
        entries[id] = entry
        return granted
    }

    /// The reader consumed `count` bytes of the stream, at `now` (nil: no time, so the window
    /// keeps its size): a `WINDOW_UPDATE` once at least half the stream's window is waiting to
    /// be granted, else nil. The credit is what was consumed, adjusted by the window's change
    /// (``WindowTuning``).
    public mutating func consumed(_ id: UInt32, count: Int, at now: Duration? = nil) -> Frame? {
        guard var entry = entries[id], count > 0 else { return nil }
        entry.unacknowledged += count
        var update: Frame?
        if !entry.remoteFinished, entry.unacknowledged >= entry.receiveLimit / 2 {
            var credit = entry.unacknowledged
            if let now {
                // The pace over a whole window's worth of reading (over one grant's, reads of
                // what piled up and waits for what is on its way alternate), or over what was
                // read in the time a window should take eight times over: a reader that slowed
                // (the pair moved to a slower link) gets its window back down within grants.
                if let start = entry.paceStart {
                    entry.paceBytes += entry.unacknowledged
                    if entry.paceBytes >= entry.receiveLimit || now - start >= tuning.targetDelay * 8 {
                        let limit = tunedLimit(of: id, entry, consumed: entry.paceBytes, over: now - start, due: credit)
                        credit += limit - entry.receiveLimit
                        entry.receiveLimit = limit
                        entry.paceStart = now
                        entry.paceBytes = 0
                    }
                } else {
                    entry.paceStart = now
                }
            }
            update = .windowUpdate(stream: id, flags: [], credit: UInt32(clamping: credit))
            entry.receiveWindow += credit
            entry.unacknowledged = 0
        }
        entries[id] = entry
        return update
    }

    /// The window for `entry` after its reader consumed `consumed` bytes in `elapsed`: what the
    /// reader takes in the target delay at that pace, within the bounds ``WindowTuning`` sets
    /// (`due`: the credit this grant gives back before the change).
    private func tunedLimit(of id: UInt32, _ entry: Entry, consumed: Int, over elapsed: Duration, due: Int) -> Int {
        let current = entry.receiveLimit
        var target = current * 2
        if elapsed > .zero {
            let paced = Double(consumed) * (tuning.targetDelay / elapsed)
            if paced < Double(target) { target = Int(paced) }
        }
        target = min(target, tuning.maximumWindow)
        // the growth the other streams hold (this one's own is given back first)
        let others = entries.reduce(0) { sum, item in item.key == id ? sum : sum + max(0, item.value.receiveLimit - initialWindow) }
        target = min(target, initialWindow + max(0, tuning.maximumGrowth - others))
        // never below the initial window; shrinking keeps at least half the credit due
        return max(target, initialWindow, current - due / 2)
    }

    /// Ends this side's direction: the `FIN` frame to send (after every byte sent before).
    ///
    /// - Throws: ``PeerLinkError`` `invalidParameter` when this side finished already,
    ///   `notConnected` when the stream is not open.
    public mutating func finish(_ id: UInt32) throws(PeerLinkError) -> Frame {
        guard var entry = entries[id] else {
            throw PeerLinkError(.notConnected, "stream \(id) is not open")
        }
        guard !entry.localFinished else {
            throw PeerLinkError(.invalidParameter, "stream \(id) (\(entry.name)) was finished already")
        }
        entry.localFinished = true
        entries[id] = entry
        removeIfDone(id)
        return .data(stream: id, flags: .fin, payload: [])
    }

    /// Aborts the stream both ways: the `RST` frame to send (the reason cut to
    /// ``WireFormat/maxResetReasonLength`` bytes), or nil when it is not open.
    public mutating func reset(_ id: UInt32, reason: String) -> Frame? {
        guard entries.removeValue(forKey: id) != nil else { return nil }
        return Self.resetFrame(id, reason: reason)
    }

    /// Forgets every stream (the link is gone); returns their ids.
    public mutating func removeAll() -> [UInt32] {
        defer { entries = [:] }
        return entries.keys.sorted()
    }

    // MARK: - The peer

    /// A `DATA` or `WINDOW_UPDATE` frame from the peer. Other frames are ignored.
    ///
    /// - Throws: a ``WireError`` (code 1) for a protocol error; close the link with it.
    public mutating func receive(_ frame: Frame) throws(WireError) -> Outcome {
        var outcome = Outcome()
        switch frame {
        case .data(let id, let flags, let payload):
            if flags.contains(.syn) {
                try acceptSYN(id, flags: flags, name: payload.array, into: &outcome)
                return outcome
            }
            guard var entry = entries[id] else { return outcome }
            if flags.contains(.rst) {
                entries[id] = nil
                let reason = WireText.lenient(payload.array)
                outcome.events.append(.reset(id: id, reason: reason.isEmpty ? "no reason given" : reason))
                return outcome
            }
            if flags.contains(.ack), !entry.isAccepted {
                entry.isAccepted = true
                outcome.events.append(.accepted(id: id))
            }
            if !payload.isEmpty {
                guard !entry.remoteFinished else {
                    throw WireError(.protocolError, "stream \(id) got \(payload.count) bytes after its FIN")
                }
                guard payload.count <= entry.receiveWindow else {
                    throw WireError(
                        .protocolError,
                        "stream \(id) got \(payload.count) bytes with only \(entry.receiveWindow) bytes of window left")
                }
                if !entry.isAccepted {
                    // Bytes can only follow an accept; take them as one.
                    entry.isAccepted = true
                    outcome.events.append(.accepted(id: id))
                }
                entry.receiveWindow -= payload.count
                // a decoded frame's own array: no copy
                outcome.events.append(.data(id: id, bytes: payload.array))
            }
            entries[id] = entry
            if flags.contains(.fin), !entry.remoteFinished {
                entries[id]!.remoteFinished = true
                outcome.events.append(.finished(id: id))
                removeIfDone(id)
            }
        case .windowUpdate(let id, let flags, let credit):
            if flags.contains(.syn) {
                throw WireError(.protocolError, "stream \(id) opens with a WINDOW_UPDATE; a stream opens with a DATA frame carrying its name")
            }
            guard var entry = entries[id] else { return outcome }
            if flags.contains(.rst) {
                entries[id] = nil
                outcome.events.append(.reset(id: id, reason: "no reason given"))
                return outcome
            }
            if flags.contains(.ack), !entry.isAccepted {
                entry.isAccepted = true
                outcome.events.append(.accepted(id: id))
            }
            if credit > 0 {
                guard entry.sendWindow + Int(credit) <= WireFormat.maxStreamWindow else {
                    throw WireError(
                        .protocolError, "stream \(id)'s window would grow past \(WireFormat.maxStreamWindow) bytes")
                }
                entry.sendWindow += Int(credit)
                outcome.events.append(.credit(id: id))
            }
            entries[id] = entry
            if flags.contains(.fin), !entry.remoteFinished {
                entries[id]!.remoteFinished = true
                outcome.events.append(.finished(id: id))
                removeIfDone(id)
            }
        default:
            break
        }
        return outcome
    }

    // MARK: - Helpers

    private mutating func acceptSYN(_ id: UInt32, flags: FrameFlags, name bytes: [UInt8], into outcome: inout Outcome) throws(WireError) {
        let peerParity: UInt32 = role == .dialer ? 0 : 1
        guard id % 2 == peerParity else {
            throw WireError(
                .protocolError,
                "a SYN for stream \(id): the peer opens \(role == .dialer ? "even" : "odd") stream ids (its fingerprint sorts \(role == .dialer ? "after" : "before") this side's)")
        }
        guard id > lastRemoteID else {
            throw WireError(.protocolError, "a SYN for stream \(id), not above the last stream the peer opened (\(lastRemoteID))")
        }
        guard !bytes.isEmpty, bytes.count <= WireFormat.maxStreamNameLength, let name = WireText.strict(bytes) else {
            throw WireError(
                .protocolError,
                "the SYN of stream \(id) carries a name of \(bytes.count) bytes; a name is 1 to \(WireFormat.maxStreamNameLength) bytes of UTF-8")
        }
        lastRemoteID = id
        guard openCounts.incoming < maxStreams else {
            outcome.frames.append(
                Self.resetFrame(id, reason: "too many streams: at most \(maxStreams) may be open at once on one link"))
            return
        }
        entries[id] = Entry(
            name: name, isOutgoing: false, isAccepted: true, sendWindow: initialWindow, receiveWindow: initialWindow,
            receiveLimit: initialWindow)
        outcome.frames.append(.windowUpdate(stream: id, flags: .ack, credit: 0))
        outcome.events.append(.opened(id: id, name: name))
        if flags.contains(.fin) {
            entries[id]!.remoteFinished = true
            outcome.events.append(.finished(id: id))
        }
    }

    private mutating func removeIfDone(_ id: UInt32) {
        if let entry = entries[id], entry.localFinished, entry.remoteFinished { entries[id] = nil }
    }

    static func resetFrame(_ id: UInt32, reason: String) -> Frame {
        .data(stream: id, flags: .rst, payload: FramePayload(WireText.utf8(reason, limit: WireFormat.maxResetReasonLength)))
    }
}
