/// What a ``LinkStateMachine`` asks of its owner, in order.
public enum LinkOutput: Hashable, Sendable, CustomStringConvertible {
    /// Bytes to write to the link, in order, before anything that follows.
    case send([UInt8])
    /// The handshake is done: the peer is authenticated as `remote`; frames can be sent.
    case established(remote: PeerID, remoteHello: Hello, encrypted: Bool, version: UInt8)
    /// A frame from the peer. `PING` frames are never surfaced (requests are answered by the
    /// machine, replies only measure the round trip); a `GO_AWAY` becomes ``closed(code:reason:byPeer:)``.
    case frame(Frame)
    /// A sequenced frame from the peer (``FrameType/isSequenced``) with its sequence number:
    /// the owner's continuity decides whether it is new or a duplicate.
    case sequenced(Frame, sequence: UInt64)
    /// The link is over: write out every `send` before it, then shut the link down. Reported
    /// exactly once; afterwards every call returns nothing. `byPeer` tells whether the peer
    /// ended it (its refusal, `GO_AWAY`, or its end of the stream) or this side did.
    case closed(code: GoAwayCode, reason: String, byPeer: Bool)

    public var description: String {
        switch self {
        case .send(let bytes): "send \(bytes.count) bytes"
        case .established(let remote, _, let encrypted, let version):
            "established with \(remote), version \(version), \(encrypted ? "encrypted" : "not encrypted")"
        case .frame(let frame): "frame \(frame)"
        case .sequenced(let frame, let sequence): "frame \(frame) #\(sequence)"
        case .closed(let code, let reason, let byPeer): "closed \(byPeer ? "by the peer" : "locally"), code \(code): \(reason)"
        }
    }
}

/// One link's protocol, either side, as a pure state machine: preface and verdict, the Noise
/// `XX` handshake with the hellos, then records carrying frames, keep-alive and close.
///
/// It does no I/O and reads no clock: the owner feeds it the bytes that arrive and the time
/// (a `Duration` since any fixed start), and carries out the ``LinkOutput``s it returns.
///
/// ```swift
/// var link = LinkStateMachine(role: .dialer, identity: me, preface: preface, hello: hello,
///                             expectedRemote: advertisedFingerprint)
/// write(link.start(at: now))
/// // on bytes:     write(link.receive(bytes, at: now))
/// // on EOF:       write(link.receiveEnd(at: now))
/// // on a timer:   write(link.tick(at: now)); then sleep until link.nextDeadline
/// ```
///
/// Behaviour worth knowing:
/// - The dialer sends handshake message 1 right after its own verdict, without waiting for the
///   listener's; each side reads the peer's verdict before the peer's handshake messages.
/// - A refusal (no common version, other service, required × none encryption, malformed
///   preface) sends a refusing verdict, then closes.
/// - A side that gives up before it has transport keys (handshake timeout, failed Noise
///   message, malformed hello or wrong fingerprint seen by the dialer) closes without sending
///   anything more. Once it has them (the listener after message 3, either side once
///   established) it sends `GO_AWAY` first.
/// - Timeouts fire only in ``tick(at:)``. `PING` requests from the peer are answered at once
///   and not surfaced; replies update ``roundTripTime``.
/// - Input is held back only while incomplete, never more than ``WireFormat/maxBufferedBytes``.
/// - After its own `GO_AWAY` a side still opens the peer's records, drops their frames, and
///   sets ``peerClosedToo`` at the peer's `GO_AWAY`: both sides closed, the owner need not wait
///   for the peer's end of stream (channels without a half-close never show one until the peer
///   closes).
///
/// A value type holding Noise cipher states: keep exactly one live copy per link, since two
/// copies sealing records would reuse nonces.
public struct LinkStateMachine: Sendable {
    public enum Role: Hashable, Sendable, CustomStringConvertible {
        /// Opened the link; Noise initiator; odd stream ids.
        case dialer
        /// Accepted the link; Noise responder; even stream ids.
        case listener

        public var description: String { self == .dialer ? "dialer" : "listener" }
    }

    public enum State: Hashable, Sendable {
        /// ``start(at:)`` not called yet.
        case idle
        /// Preface sent, waiting for the peer's.
        case awaitingPreface
        /// Verdict 0 sent, waiting for the peer's verdict.
        case awaitingVerdict
        /// In the Noise handshake.
        case handshaking
        case established
        case closed
    }

    public let role: Role
    public let policy: LinkPolicy
    public let localPreface: LinkPreface
    public let localHello: Hello
    /// The fingerprint the peer must have (for a dialer: the one discovery found it under).
    public let expectedRemote: Fingerprint?
    private let identity: Identity
    private let localPrefaceBytes: [UInt8]

    public private(set) var state: State = .idle
    /// The peer's preface, once read.
    public private(set) var remotePreface: LinkPreface?
    /// The agreed version and encryption, once both prefaces are known.
    public private(set) var version: UInt8?
    public private(set) var isEncrypted: Bool?
    /// The authenticated peer and its hello, once established.
    public private(set) var remotePeer: PeerID?
    public private(set) var remoteHello: Hello?
    /// The largest `DATA` or `MESSAGE` payload on this link, both ways, once established:
    /// ``Hello/framePayloadLimit(_:_:)`` of the two hellos (``WireFormat/maxFramePayload``
    /// unless both sides take large frames).
    public private(set) var framePayloadLimit = WireFormat.maxFramePayload
    /// The Noise handshake hash, identical on both sides: for channel binding or a short
    /// verification code.
    public private(set) var handshakeHash: [UInt8]?
    /// The round trip of the last answered keep-alive `PING`.
    public private(set) var roundTripTime: Duration?
    /// Whether the peer's `GO_AWAY` arrived after this side had closed the link with its own:
    /// both sides are done, and the peer ends its side of the channel soon. An owner that waits
    /// for the peer's end of stream after its `GO_AWAY` (so the goodbye is not lost to a reset)
    /// stops waiting here: on a channel without a half-close (RFCOMM, L2CAP) two sides that
    /// close at once would otherwise each wait for the other's end until a timeout.
    public private(set) var peerClosedToo = false
    /// After this side's `GO_AWAY`: records are still opened, and their frames dropped, until
    /// the peer's `GO_AWAY` (``peerClosedToo``) or anything unexpected.
    private var awaitingPeerGoAway = false

    private var handshake: NoiseHandshakeState?
    private var transport: NoiseTransport?
    private var buffer = InputBuffer(capacity: WireFormat.maxBufferedBytes)
    private var now: Duration = .zero
    private var startedAt: Duration = .zero
    private var lastSent: Duration = .zero
    private var lastReceived: Duration = .zero
    private var nextPingOpaque: UInt64 = 1
    private var outstandingPing: (opaque: UInt64, sentAt: Duration)?
    private var output: [LinkOutput] = []
    /// A buffer written out before, kept for the next records (see ``recycle(_:)``).
    private var spareWire: [UInt8] = []
    /// Where a received record is opened, kept between records.
    private var openedScratch: [UInt8] = []

    /// - Parameters:
    ///   - role: which side of the link this is.
    ///   - identity: the local identity, the Noise static key.
    ///   - preface: what this side sends first. List only versions this implementation speaks
    ///     (``WireFormat/supportedVersions``).
    ///   - hello: what this side tells the peer about itself.
    ///   - policy: timeouts and keep-alive.
    ///   - expectedRemote: the fingerprint the peer must prove (code 7 otherwise); nil to take
    ///     any peer.
    public init(
        role: Role,
        identity: Identity,
        preface: LinkPreface,
        hello: Hello,
        policy: LinkPolicy = .default,
        expectedRemote: Fingerprint? = nil
    ) {
        self.role = role
        self.identity = identity
        localPreface = preface
        localPrefaceBytes = preface.encoded()
        localHello = hello
        self.policy = policy
        self.expectedRemote = expectedRemote
    }

    /// This side as the peer will see it.
    public var localPeer: PeerID { PeerID(identity: identity, displayName: localHello.displayName) }

    /// Input held back because it is not complete yet.
    public var bufferedByteCount: Int { buffer.count }

    /// When ``tick(at:)`` has something to do next (a timeout or a keep-alive ping), or nil.
    public var nextDeadline: Duration? {
        switch state {
        case .idle, .closed:
            return nil
        case .established:
            return min(lastSent + policy.keepAliveInterval, lastReceived + policy.keepAliveTimeout)
        case .awaitingPreface, .awaitingVerdict, .handshaking:
            return startedAt + policy.handshakeTimeout
        }
    }

    // MARK: - Inputs

    /// Opens the link: sends the preface and starts the handshake timer.
    public mutating func start(at now: Duration) -> [LinkOutput] {
        guard state == .idle else { return [] }
        begin(at: now)
        return flush()
    }

    /// Bytes from the peer, cut anywhere. Calling it before ``start(at:)`` starts the link first.
    public mutating func receive(_ bytes: ArraySlice<UInt8>, at now: Duration) -> [LinkOutput] {
        // Once closed, only the reading for the peer's GO_AWAY goes on (``peerClosedToo``); a
        // link closed on the way through `bytes` reads the rest of them that way, so that the
        // next call starts where a record starts.
        guard state != .closed || awaitingPeerGoAway else { return [] }
        if state == .idle { begin(at: now) }
        self.now = now
        if !bytes.isEmpty { lastReceived = now }
        var input = bytes
        while state != .closed || awaitingPeerGoAway {
            if step() { continue }
            if input.isEmpty { break }
            guard buffer.room > 0 else {
                // Unreachable: every item is shorter than the buffer and is consumed once whole.
                if state == .closed {
                    stopReadingForGoAway()
                } else {
                    finish(.internalError, "the input buffer is full", byPeer: false)
                }
                break
            }
            input = buffer.fill(from: input)
        }
        // Items were read where they lay in `bytes`; the start of one not yet complete is
        // copied, so the caller may reuse the storage of `bytes`.
        buffer.keepRest()
        return flush()
    }

    public mutating func receive(_ bytes: [UInt8], at now: Duration) -> [LinkOutput] {
        receive(bytes[...], at: now)
    }

    /// The peer ended its side of the link (end of stream) without this side closing.
    public mutating func receiveEnd(at now: Duration) -> [LinkOutput] {
        guard state != .closed else {
            stopReadingForGoAway()
            return []
        }
        self.now = now
        if state == .established {
            finish(.protocolError, "the peer closed the link without a GO_AWAY", byPeer: true)
        } else {
            finish(.handshakeFailed, "the peer closed the link before the handshake completed", byPeer: true)
        }
        return flush()
    }

    /// Sends one frame (sealed when encryption is on). A `GO_AWAY` frame closes the link, as
    /// ``close(code:reason:)`` does. After the link closed, returns nothing.
    ///
    /// - Parameter sequence: the sequence number of a sequenced frame (required there, and
    ///   only there: see ``Frame/encoded(sequence:)``).
    /// - Throws: a ``WireError`` before the link is established (code 10), or for a frame the
    ///   format cannot carry (code 1; see ``Frame/encoded(sequence:)``). Nothing is sent then and
    ///   the link stays as it was.
    public mutating func send(_ frame: Frame, sequence: UInt64? = nil, at now: Duration) throws(WireError) -> [LinkOutput] {
        guard state != .closed else { return [] }
        guard state == .established else {
            throw WireError(.internalError, "the link is not established yet: send frames after .established")
        }
        self.now = now
        if case .goAway(let code, let reason) = frame {
            finish(code, reason, byPeer: false)
            return flush()
        }
        sendRecord(try frame.encoded(sequence: sequence, payloadLimit: framePayloadLimit))
        return flush()
    }

    /// Sends `frames` in order, packed into as few records as they fit (each at most
    /// ``recordPayloadLimit`` bytes of frames; a record seals once, so many small frames cost
    /// one seal and one length prefix), except that a large frame never follows a small one in
    /// a record (``smallFrameLimit``). A `GO_AWAY` among them closes the link after what comes
    /// before it. After the link closed, returns nothing.
    ///
    /// - Throws: a ``WireError`` (code 10) before the link is established; nothing is sent then.
    ///   A frame the format cannot carry (see ``Frame/encoded(sequence:)``: callers check frames
    ///   when they are queued) closes the link with code 10 after the frames before it.
    public mutating func send(_ frames: consuming [(frame: Frame, sequence: UInt64?)], at now: Duration) throws(WireError) -> [LinkOutput] {
        guard state != .closed else { return [] }
        guard state == .established else {
            throw WireError(.internalError, "the link is not established yet: send frames after .established")
        }
        self.now = now
        let limit = recordPayloadLimit
        var remaining = frames.reduce(0) { $0 + FrameScheduler.size(of: $1.frame) }
        // Built in the buffers kept from before (moved, not copied: the builder must hold the
        // only reference for its appends to stay in their storage).
        var records = RecordBuilder(encrypted: isEncrypted == true, frameBytes: remaining, recordLimit: limit, wire: &spareWire)
        // Each frame moved out of the list, not copied (no retain and release of its payload).
        var pending = frames
        for index in pending.indices {
            let (frame, sequence) = pending.take(at: index, leaving: (.ack(receivedThrough: 0), nil))
            if case .goAway(let code, let reason) = frame {
                guard sendRecords(&records) else { break }
                finish(code, reason, byPeer: false)
                break
            }
            // A record ends where the next frame does not fit, and before a large frame that
            // would follow a small one: the peer opens a record only once all of it arrived,
            // so a message must not wait for bulk data packed behind it.
            let size = FrameScheduler.size(of: frame)
            let large = size > Self.smallFrameLimit
            if records.frameBytes > 0, records.frameBytes + size > limit || (large && records.holdsSmallFrame) {
                guard endRecord(&records) else { break }
            }
            if !large { records.holdsSmallFrame = true }
            do throws(WireError) {
                try records.append(frame, sequence: sequence, payloadLimit: framePayloadLimit)
            } catch {
                guard sendRecords(&records) else { break }
                finish(.internalError, "could not encode \(frame): \(error.reason)", byPeer: false)
                break
            }
            remaining -= size
        }
        if state == .established { _ = sendRecords(&records) }
        return flush()
    }

    /// Ends the record being built; false (and the link closed) when it could not be sealed.
    private mutating func endRecord(_ records: inout RecordBuilder) -> Bool {
        guard records.endRecord(sealingWith: &transport) else {
            finish(.internalError, "could not seal a record", byPeer: false, goAway: false)
            return false
        }
        return true
    }

    /// Ends the record being built and sends every record built, as one piece. False (and the
    /// link closed) when a record could not be sealed.
    private mutating func sendRecords(_ records: inout RecordBuilder) -> Bool {
        guard endRecord(&records) else { return false }
        if !records.wire.isEmpty { emit(records.wire) }
        records.wire = []
        return true
    }

    /// Hands back bytes this machine sent (a ``LinkOutput/send(_:)``) once they were written, so
    /// the next records are built in their storage instead of a new buffer. Kept only when
    /// larger than the one kept already and at most ``maxSpareCapacity``.
    public mutating func recycle(_ bytes: [UInt8]) {
        guard bytes.capacity > spareWire.capacity, bytes.capacity <= Self.maxSpareCapacity else { return }
        spareWire = bytes
    }

    /// The largest buffer ``recycle(_:)`` keeps.
    public static let maxSpareCapacity = 256 * 1024

    /// The capacity of the buffer kept for the next records (0: none): for tests.
    package var keptBufferCapacity: Int { spareWire.capacity }

    /// Frames up to this size (header included) are small: messages, control, credit. A large
    /// frame (stream data, a chunk of a big message) never follows a small one in a record.
    public static let smallFrameLimit = 1024

    /// The most bytes of frames one record carries: what fits beside the tag in the largest
    /// record (65519 bytes when encrypted: three full 16 KiB frames, or hundreds of small ones).
    public var recordPayloadLimit: Int {
        WireFormat.maxRecordLength(encrypted: isEncrypted == true) - (isEncrypted == true ? WireFormat.tagLength : 0)
    }

    /// Time passes: handshake timeout (code 6), keep-alive `PING` after the idle interval,
    /// dead link (code 8) after the keep-alive timeout.
    public mutating func tick(at now: Duration) -> [LinkOutput] {
        guard state != .idle, state != .closed else { return [] }
        self.now = now
        if state != .established {
            if now >= startedAt + policy.handshakeTimeout {
                finish(
                    .handshakeFailed,
                    "the handshake did not complete within \(WireText.seconds(policy.handshakeTimeout))",
                    byPeer: false)
            }
        } else if now >= lastReceived + policy.keepAliveTimeout {
            finish(
                .keepAliveTimeout,
                "nothing arrived from the peer for \(WireText.seconds(policy.keepAliveTimeout)): the link is dead",
                byPeer: false)
        } else if now >= lastSent + policy.keepAliveInterval {
            let opaque = nextPingOpaque
            nextPingOpaque &+= 1
            outstandingPing = (opaque, now)
            sendFrame(.ping(flags: .syn, opaque: opaque))
        }
        return flush()
    }

    /// Closes the link: with a `GO_AWAY` once established, silently before.
    public mutating func close(code: GoAwayCode = .normal, reason: String = "closed") -> [LinkOutput] {
        guard state != .closed else { return [] }
        finish(code, reason, byPeer: false)
        return flush()
    }

    // MARK: - Phases

    private mutating func begin(at now: Duration) {
        self.now = now
        startedAt = now
        lastSent = now
        lastReceived = now
        state = .awaitingPreface
        emit(localPrefaceBytes)
    }

    /// Handles one complete item at the front of the buffer. False when more bytes are needed.
    private mutating func step() -> Bool {
        switch state {
        case .awaitingPreface: readPreface()
        case .awaitingVerdict: readVerdict()
        case .handshaking: readHandshakeMessage()
        case .established: readRecord()
        case .closed: awaitingPeerGoAway && readRecordForGoAway()
        case .idle: false
        }
    }

    private mutating func readPreface() -> Bool {
        let readable = buffer.readable
        let preface: LinkPreface
        let length: Int
        do {
            guard let parsed = try LinkPreface.parse(prefix: readable) else { return false }
            (preface, length) = parsed
        } catch {
            emit(Verdict.refuse(code: error.code, reason: error.reason).encoded())
            finish(error.code, error.reason, byPeer: false)
            return true
        }
        let remoteBytes = Array(readable.prefix(length))
        buffer.consume(length)
        remotePreface = preface
        switch LinkPreface.negotiate(local: localPreface, remote: preface) {
        case .refused(let code, let reason):
            emit(Verdict.refuse(code: code, reason: reason).encoded())
            finish(code, reason, byPeer: false)
        case .agreed(let agreedVersion, let encrypted):
            version = agreedVersion
            isEncrypted = encrypted
            emit(Verdict.accept.encoded())
            let prologue =
                WireFormat.prologueLabel
                + (role == .dialer ? localPrefaceBytes + remoteBytes : remoteBytes + localPrefaceBytes)
            handshake = .xx(initiator: role == .dialer, prologue: prologue, staticKey: identity.privateKey)
            state = .awaitingVerdict
            if role == .dialer { writeHandshakeMessage(payload: []) }
        }
        return true
    }

    private mutating func readVerdict() -> Bool {
        guard let (verdict, length) = Verdict.parse(prefix: buffer.readable) else { return false }
        buffer.consume(length)
        switch verdict {
        case .accept:
            state = .handshaking
        case .refuse(let code, let reason):
            finish(code, reason, byPeer: true)
        }
        return true
    }

    private mutating func readHandshakeMessage() -> Bool {
        let message: [UInt8]
        do {
            guard let (body, length) = try Record.parse(prefix: buffer.readable, maxLength: WireFormat.maxHandshakeMessageLength)
            else { return false }
            message = Array(body)
            buffer.consume(length)
        } catch {
            finish(.handshakeFailed, error.reason, byPeer: false)
            return true
        }
        guard var noise = handshake else {
            finish(.internalError, "no handshake state in the handshake phase", byPeer: false)
            return true
        }
        let payload: [UInt8]
        do {
            payload = try noise.readMessage(message)
        } catch {
            finish(.handshakeFailed, "handshake message \(noise.nextMessageIndex + 1) failed: \(error)", byPeer: false)
            return true
        }
        handshake = noise
        switch (role, noise.nextMessageIndex) {
        case (.listener, 1):
            // Message 1 carries no hello; a payload from a later version is ignored.
            writeHandshakeMessage(payload: localHello.encoded())
        case (.dialer, 2):
            // The listener's hello and key. Checked before message 3, so a peer that is not the
            // expected one never learns who dialled.
            guard let (peer, hello) = authenticate(noise, helloPayload: payload) else { return true }
            writeHandshakeMessage(payload: localHello.encoded())
            guard state != .closed else { return true }
            establish(peer: peer, hello: hello)
        case (.listener, 3):
            // Keys first, so a failed check can be reported with a GO_AWAY.
            guard startRecords() else { return true }
            guard let (peer, hello) = authenticate(noise, helloPayload: payload) else { return true }
            establish(peer: peer, hello: hello)
        default:
            finish(.internalError, "handshake message \(noise.nextMessageIndex) arrived out of turn", byPeer: false)
        }
        return true
    }

    /// The peer's identity and hello after the message that carried them, or nil after closing.
    private mutating func authenticate(_ noise: NoiseHandshakeState, helloPayload: [UInt8]) -> (PeerID, Hello)? {
        guard let key = noise.remoteStaticKey else {
            finish(.handshakeFailed, "the handshake ended without the peer's key", byPeer: false)
            return nil
        }
        let fingerprint = Fingerprint(publicKey: key.rawRepresentation)
        if let expectedRemote, expectedRemote != fingerprint {
            finish(
                .identityMismatch,
                "the peer's key has fingerprint \(fingerprint.grouped), not \(expectedRemote.grouped) as expected",
                byPeer: false)
            return nil
        }
        let hello: Hello
        do {
            hello = try Hello.decode(helloPayload)
        } catch {
            finish(error.code, "the peer's hello is malformed: \(error.reason)", byPeer: false)
            return nil
        }
        return (PeerID(fingerprint: fingerprint, displayName: hello.displayName.value), hello)
    }

    private mutating func writeHandshakeMessage(payload: [UInt8]) {
        guard var noise = handshake else { return }
        do {
            let message = try noise.writeMessage(payload: payload)
            handshake = noise
            emit(Record.framed(message))
        } catch {
            finish(.handshakeFailed, "could not write handshake message \(noise.nextMessageIndex + 1): \(error)", byPeer: false)
        }
    }

    /// Derives the transport keys and enters the record phase (not yet reported). False after
    /// closing.
    private mutating func startRecords() -> Bool {
        guard var noise = handshake else { return false }
        do {
            let keys = try noise.transport()
            handshakeHash = keys.handshakeHash
            transport = isEncrypted == true ? keys : nil
        } catch {
            finish(.handshakeFailed, "could not derive the transport keys: \(error)", byPeer: false)
            return false
        }
        handshake = nil
        state = .established
        lastReceived = now
        return true
    }

    private mutating func establish(peer: PeerID, hello: Hello) {
        if state != .established {
            guard startRecords() else { return }
        }
        remotePeer = peer
        remoteHello = hello
        framePayloadLimit = Hello.framePayloadLimit(localHello, hello)
        output.append(
            .established(remote: peer, remoteHello: hello, encrypted: isEncrypted ?? true, version: version ?? WireFormat.version))
    }

    private mutating func readRecord() -> Bool {
        let frames: [(frame: Frame, sequence: UInt64?)]
        do {
            guard let decoded = try decodeRecord() else {
                // Only what completes this record is copied behind what is held of it.
                buffer.expect(Record.expectedLength(prefix: buffer.readable))
                return false
            }
            frames = decoded
        } catch {
            finish(error.code, error.reason, byPeer: false)
            return true
        }
        for (frame, sequence) in frames {
            guard state == .established else { break }
            if let sequence {
                output.append(.sequenced(frame, sequence: sequence))
            } else {
                handle(frame)
            }
        }
        return true
    }

    /// The frames of the record at the front of the buffer, consumed; nil while it is not
    /// complete. The record is read where it lies: opened from there when sealed, its frames
    /// decoded from there (each payload copied out) when not. Nothing refers to the caller's
    /// read buffer after; large message chunks may be parts of the storage the record was
    /// completed or opened in (``RecordPin``), which is then left to them, not reused.
    private mutating func decodeRecord() throws(WireError) -> [(frame: Frame, sequence: UInt64?)]? {
        let encrypted = isEncrypted == true
        let length: Int
        let frames: [(frame: Frame, sequence: UInt64?)]
        var pin: RecordPin?
        do {
            // `body` is a view of the buffer: it ends with this scope, before the buffer is
            // consumed, so the buffer's storage is not shared then (and is reused, not copied).
            guard
                let (body, recordLength) = try Record.parse(
                    prefix: buffer.readable,
                    maxLength: WireFormat.maxRecordLength(encrypted: encrypted),
                    minLength: WireFormat.minRecordLength(encrypted: encrypted))
            else { return nil }
            length = recordLength
            if encrypted {
                guard var keys = transport else {
                    throw WireError(.internalError, "no transport keys on an encrypted link")
                }
                // opened into the buffer the last record was opened into, unless chunks of
                // that one still share it (kept at its size: the cipher overwrites it, and an
                // emptied buffer would be zeroed again first)
                var plaintext = openedScratch
                openedScratch = []
                defer {
                    if pin == nil { openedScratch = plaintext }
                }
                do {
                    try keys.open(body, into: &plaintext)
                    transport = keys
                } catch {
                    throw WireError(.protocolError, "a record failed to decrypt: \(error)")
                }
                frames = try Frame.decodeRecord(
                    plaintext[...], payloadLimit: framePayloadLimit, pinnable: plaintext.capacity, pin: &pin)
            } else {
                frames = try Frame.decodeRecord(body, payloadLimit: framePayloadLimit, pinnable: buffer.ownedStorageSize, pin: &pin)
            }
        }
        buffer.consume(length, keepingParts: !encrypted && pin != nil)
        return frames
    }

    private mutating func handle(_ frame: Frame) {
        switch frame {
        case .ping(let flags, let opaque):
            if flags.contains(.syn) {
                sendFrame(.ping(flags: .ack, opaque: opaque))
            } else if flags.contains(.ack), let ping = outstandingPing, ping.opaque == opaque {
                roundTripTime = now - ping.sentAt
                outstandingPing = nil
            }
        case .goAway(let code, let reason):
            finish(code, reason, byPeer: true)
        default:
            output.append(.frame(frame))
        }
    }

    // MARK: - Output

    private mutating func emit(_ bytes: [UInt8]) {
        output.append(.send(bytes))
        lastSent = now
    }

    private mutating func sendFrame(_ frame: Frame) {
        do {
            sendRecord(try frame.encoded())
        } catch {
            finish(.internalError, "could not encode \(frame): \(error.reason)", byPeer: false)
        }
    }

    /// Seals (when encryption is on) and sends one frame's bytes as a record.
    private mutating func sendRecord(_ frameBytes: [UInt8]) {
        guard let record = seal(frameBytes) else {
            finish(.internalError, "could not seal a record", byPeer: false, goAway: false)
            return
        }
        emit(record)
    }

    /// The record that carries `frameBytes`: its length, then the frames sealed (or as they are).
    private mutating func seal(_ frameBytes: [UInt8]) -> [UInt8]? {
        guard isEncrypted == true else { return Record.framed(frameBytes) }
        var record: [UInt8] = []
        record.reserveCapacity(2 + frameBytes.count + WireFormat.tagLength)
        return RecordBuilder.appendSealed(frameBytes, to: &record, keys: &transport) ? record : nil
    }

    /// Ends the link: a `GO_AWAY` first when records can be sent and `goAway` allows, then
    /// `.closed`. Everything is dropped (but for what reads the peer's records on, after this
    /// side's `GO_AWAY`, for the peer's own: see ``peerClosedToo``); later calls return nothing.
    private mutating func finish(_ code: GoAwayCode, _ reason: String, byPeer: Bool, goAway: Bool = true) {
        guard state != .closed else { return }
        var sentGoAway = false
        if goAway, !byPeer, state == .established,
            let bytes = try? Frame.goAway(code: code, reason: reason).encoded(),
            let record = seal(bytes)
        {
            emit(record)
            sentGoAway = true
        }
        state = .closed
        handshake = nil
        if sentGoAway {
            // The peer's records are still read, for its GO_AWAY only (nothing is sealed any
            // more: ``send(_:sequence:at:)`` and ``tick(at:)`` do nothing once closed).
            awaitingPeerGoAway = true
        } else {
            buffer.removeAll()
            transport = nil
        }
        outstandingPing = nil
        // Resource limits (issue 11): a peer's reason, sanitised where it was decoded, is cut to
        // the configured length before it reaches a log or the app.
        let reason = byPeer ? PeerText.cut(reason, limit: policy.limits.maximumReasonBytes) : reason
        output.append(.closed(code: code, reason: reason, byPeer: byPeer))
    }

    /// After this side's `GO_AWAY`: the record at the front of the buffer, read for the peer's
    /// `GO_AWAY` only (every other frame is dropped). A malformed or unopenable record ends this
    /// reading, and the owner's wait for the peer's end of stream decides. False when more
    /// bytes are needed.
    private mutating func readRecordForGoAway() -> Bool {
        do {
            guard let frames = try decodeRecord() else {
                buffer.expect(Record.expectedLength(prefix: buffer.readable))
                return false
            }
            if frames.contains(where: { if case .goAway = $0.frame { true } else { false } }) {
                peerClosedToo = true
                stopReadingForGoAway()
            }
        } catch {
            stopReadingForGoAway()
        }
        return true
    }

    private mutating func stopReadingForGoAway() {
        awaitingPeerGoAway = false
        buffer.removeAll()
        transport = nil
    }

    /// The outputs of this call, adjacent sends joined into one write (each run copied once).
    private mutating func flush() -> [LinkOutput] {
        defer { output = [] }
        guard output.count > 1 else { return output }
        var joined: [LinkOutput] = []
        var run: [[UInt8]] = []
        func endRun() {
            guard !run.isEmpty else { return }
            if run.count == 1 {
                joined.append(.send(run[0]))
            } else {
                var bytes: [UInt8] = []
                bytes.reserveCapacity(run.reduce(0) { $0 + $1.count })
                for piece in run { bytes.append(contentsOf: piece) }
                joined.append(.send(bytes))
            }
            run = []
        }
        for item in output {
            if case .send(let bytes) = item {
                run.append(bytes)
            } else {
                endRun()
                joined.append(item)
            }
        }
        endRun()
        return joined
    }
}

/// Records built for one write, into one buffer: a link's frames are encoded straight into it
/// behind the record's length, and sealed where they lie when records are sealed (the tag
/// appended behind them). No array per record, no copy of the frames, no joining afterwards.
struct RecordBuilder {
    let encrypted: Bool
    /// The records ended so far.
    var wire: [UInt8] = []
    /// Bytes of frames in the record being built.
    private(set) var frameBytes = 0
    /// The record being built holds a small frame.
    var holdsSmallFrame = false
    /// Where the length of the record being built goes.
    private var lengthAt: Int?

    /// `frameBytes` frames to come, in records of at most `recordLimit` bytes of frames, built
    /// in the storage of `wire`, which is taken (left empty): a buffer used before, emptied
    /// here. Its storage is kept only if nothing else refers to it any more (the write that
    /// used it is over); otherwise the first append allocates anew.
    init(encrypted: Bool, frameBytes: Int, recordLimit: Int, wire: inout [UInt8]) {
        self.encrypted = encrypted
        swap(&self.wire, &wire)
        self.wire.removeAll(keepingCapacity: true)
        let overhead = 2 + (encrypted ? WireFormat.tagLength : 0)
        self.wire.reserveCapacity(frameBytes + overhead * (frameBytes / max(recordLimit, 1) + 2))
    }

    /// Appends `frame` to the record being built (starting one). Throws as
    /// ``Frame/encode(sequence:into:)``, and then appends nothing.
    mutating func append(_ frame: Frame, sequence: UInt64?, payloadLimit: Int) throws(WireError) {
        if lengthAt == nil {
            lengthAt = wire.count
            wire.append(0)
            wire.append(0)
        }
        let before = wire.count
        try frame.encode(sequence: sequence, payloadLimit: payloadLimit, into: &wire)
        frameBytes += wire.count - before
    }

    /// Ends the record being built, if any: its length written, and its frames sealed where
    /// they lie when records are sealed. False when sealing failed (nothing of that record is
    /// kept then).
    mutating func endRecord(sealingWith keys: inout NoiseTransport?) -> Bool {
        defer {
            frameBytes = 0
            holdsSmallFrame = false
            lengthAt = nil
        }
        guard let lengthAt else { return true }
        if frameBytes == 0 {
            wire.removeSubrange(lengthAt...)
            return true
        }
        let length = frameBytes + (encrypted ? WireFormat.tagLength : 0)
        guard length <= Int(UInt16.max) else {
            wire.removeSubrange(lengthAt...)
            return false
        }
        wire[lengthAt] = UInt8(truncatingIfNeeded: length >> 8)
        wire[lengthAt + 1] = UInt8(truncatingIfNeeded: length)
        guard encrypted else { return true }
        guard var sealing = keys else {
            wire.removeSubrange(lengthAt...)
            return false
        }
        do throws(NoiseError) {
            try sealing.seal(inPlace: &wire, from: lengthAt + 2)
        } catch {
            wire.removeSubrange(lengthAt...)
            return false
        }
        keys = sealing
        return true
    }

    /// Appends the sealed record of `plaintext` to `wire`: its length, then the frames sealed
    /// with `keys`. False, with nothing appended, when it cannot be sealed (no keys, too long,
    /// the cipher failed).
    static func appendSealed(_ plaintext: [UInt8], to wire: inout [UInt8], keys: inout NoiseTransport?) -> Bool {
        let length = plaintext.count + WireFormat.tagLength
        guard var sealing = keys, length <= Int(UInt16.max) else { return false }
        let start = wire.count
        wire.appendBigEndian(UInt16(length))
        do throws(NoiseError) {
            try sealing.seal(plaintext, appendingTo: &wire)
        } catch {
            wire.removeSubrange(start...)
            return false
        }
        keys = sealing
        return true
    }
}
