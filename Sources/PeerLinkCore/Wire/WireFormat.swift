/// The constants of PeerLink's link protocol, version 2 (the *Wire Format* article is the spec).
public enum WireFormat {
    /// The first four bytes of every preface: `P` `L` `N` `K`.
    public static let magic: [UInt8] = [0x50, 0x4C, 0x4E, 0x4B]
    /// The protocol version this implementation speaks. Version 2 added sequenced frames and
    /// `ACK` (a session survives a link change), records of several frames, and the hello's
    /// incarnation; a version 1 peer and this one share no version, and each refuses the other
    /// with code 2 naming the versions it speaks.
    public static let version: UInt8 = 2
    /// Every version this implementation speaks, highest first (what a preface lists by default).
    public static let supportedVersions: [UInt8] = [2]

    /// The largest preface: magic, count, 255 versions, encryption, service length, 15 bytes.
    public static let maxPrefaceLength = 4 + 1 + 255 + 1 + 1 + ServiceType.maximumLength
    /// The label at the start of the Noise prologue, followed by both prefaces.
    public static let prologueLabel: [UInt8] = Array("PeerLink link v1".utf8)
    /// The largest Noise handshake message (it travels behind a 2-byte length).
    public static let maxHandshakeMessageLength = 65535

    /// The size of a frame header's fixed part: version, type, flags, stream id, length (a
    /// sequenced frame's 8-byte sequence number follows it).
    public static let frameHeaderLength = 12
    /// The largest frame payload (the maximum frame size) every peer takes.
    public static let maxFramePayload = 16384
    /// The largest `DATA` or `MESSAGE` payload this implementation takes from a peer that asks
    /// for large frames too (the hello's field 4, ``Hello/maxFramePayload``), and sends to such
    /// a peer over a transport that carries them well (TCP). 60 KiB: with its header and a tag
    /// it fits one record. Every other frame stays within ``maxFramePayload``.
    public static let largeFramePayload = 61440
    /// The size of the authentication tag at the end of an encrypted record.
    public static let tagLength = 16
    /// The largest reliable message, reassembled from its chunks.
    public static let maxMessageLength = 16 * 1024 * 1024
    /// The largest context an `INVITE` carries.
    public static let maxContextLength = 8192
    /// The receive window every stream starts with.
    public static let initialStreamWindow = 256 * 1024
    /// The most streams each side may have open on one link; a `SYN` beyond it is answered
    /// with `RST`.
    public static let maxStreamsPerLink = 256
    /// The longest stream name a `SYN` carries, in UTF-8 bytes.
    public static let maxStreamNameLength = 255
    /// The longest reason an `RST` carries, in UTF-8 bytes (longer ones are cut).
    public static let maxResetReasonLength = 1024
    /// The largest send window a stream may reach through `WINDOW_UPDATE`s.
    public static let maxStreamWindow = Int(UInt32.max)

    /// The largest record body: what its 2-byte length allows. A record holds one or more whole
    /// frames (plus the tag when encryption is on).
    public static func maxRecordLength(encrypted: Bool) -> Int {
        Int(UInt16.max)
    }

    /// The smallest record body: a frame header, plus the tag when encryption is on.
    public static func minRecordLength(encrypted: Bool) -> Int {
        frameHeaderLength + (encrypted ? tagLength : 0)
    }

    /// The most bytes a ``LinkStateMachine`` ever holds back while waiting for the rest of
    /// something: a refusing verdict with the longest reason (1 + 2 + 65535 bytes), which is also
    /// more than the longest handshake message, record or preface.
    public static let maxBufferedBytes = 3 + 65535
}

/// The timing of a link: a policy value, not constants scattered through the code.
public struct LinkPolicy: Hashable, Sendable {
    /// A link whose handshake (preface, verdicts, Noise) is not done this long after it opened
    /// is closed with code 6.
    public var handshakeTimeout: Duration
    /// A side that has sent nothing for this long sends a `PING`.
    public var keepAliveInterval: Duration
    /// A link on which nothing arrived for this long is dead: closed with code 8.
    public var keepAliveTimeout: Duration
    /// The resource limits links and the session running them keep to (see ``ResourceLimits``);
    /// a link cuts the reasons its peer gives to ``ResourceLimits/maximumReasonBytes``.
    public var limits: ResourceLimits

    public init(
        handshakeTimeout: Duration = .seconds(10),
        keepAliveInterval: Duration = .seconds(2),
        keepAliveTimeout: Duration = .seconds(8),
        limits: ResourceLimits = .default
    ) {
        self.handshakeTimeout = handshakeTimeout
        self.keepAliveInterval = keepAliveInterval
        self.keepAliveTimeout = keepAliveTimeout
        self.limits = limits
    }

    /// The defaults: 10 s handshake, ping after 2 s idle, dead after 8 s of silence — so a peer
    /// that vanished (power cut, cable pulled) is reported gone within 10 s of its last word,
    /// with room for scheduling delays, and one lost ping of four does not end a link.
    public static let `default` = LinkPolicy()
}

/// Why a link is closed, as carried by a verdict or a `GO_AWAY` frame.
///
/// Codes this version does not know are kept as ``other(_:)``, so they can be logged and passed
/// on; `GoAwayCode(rawValue:)` never produces `.other` for a known number, and two codes are
/// equal when their numbers are.
public enum GoAwayCode: Hashable, Sendable, CustomStringConvertible {
    /// 0: normal close (the peer left).
    case normal
    /// 1: protocol error (malformed preface, frame or record).
    case protocolError
    /// 2: no common protocol version.
    case unsupportedVersion
    /// 3: the service types differ.
    case serviceMismatch
    /// 4: encryption required by one side and refused by the other.
    case encryptionMismatch
    /// 5: the session is full.
    case sessionFull
    /// 6: the handshake failed or timed out.
    case handshakeFailed
    /// 7: the peer's key is not the one it was advertised under.
    case identityMismatch
    /// 8: nothing arrived for the keep-alive timeout.
    case keepAliveTimeout
    /// 9: the pair already has a link.
    case duplicateLink
    /// 10: internal error.
    case internalError
    /// 11: the peer went over one of this side's resource limits (``ResourceLimits``: messages
    /// received in part, a write that made no progress).
    case resourceLimit
    /// A code this version does not know.
    case other(UInt32)

    public init(rawValue: UInt32) {
        switch rawValue {
        case 0: self = .normal
        case 1: self = .protocolError
        case 2: self = .unsupportedVersion
        case 3: self = .serviceMismatch
        case 4: self = .encryptionMismatch
        case 5: self = .sessionFull
        case 6: self = .handshakeFailed
        case 7: self = .identityMismatch
        case 8: self = .keepAliveTimeout
        case 9: self = .duplicateLink
        case 10: self = .internalError
        case 11: self = .resourceLimit
        default: self = .other(rawValue)
        }
    }

    public var rawValue: UInt32 {
        switch self {
        case .normal: 0
        case .protocolError: 1
        case .unsupportedVersion: 2
        case .serviceMismatch: 3
        case .encryptionMismatch: 4
        case .sessionFull: 5
        case .handshakeFailed: 6
        case .identityMismatch: 7
        case .keepAliveTimeout: 8
        case .duplicateLink: 9
        case .internalError: 10
        case .resourceLimit: 11
        case .other(let value): value
        }
    }

    public static func == (lhs: GoAwayCode, rhs: GoAwayCode) -> Bool { lhs.rawValue == rhs.rawValue }
    public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

    public var description: String {
        let meaning =
            switch self {
            case .normal: "normal close"
            case .protocolError: "protocol error"
            case .unsupportedVersion: "unsupported version"
            case .serviceMismatch: "service type mismatch"
            case .encryptionMismatch: "encryption mismatch"
            case .sessionFull: "session full"
            case .handshakeFailed: "handshake failed"
            case .identityMismatch: "identity mismatch"
            case .keepAliveTimeout: "keep-alive timeout"
            case .duplicateLink: "duplicate link"
            case .internalError: "internal error"
            case .resourceLimit: "resource limit"
            case .other: "unknown code"
            }
        return "\(rawValue) (\(meaning))"
    }
}

/// A violation of the wire format, found in bytes from the peer or in a value that cannot be
/// encoded: the go-away code to close the link with, and a reason a person can read
/// ("frame type 0x9 is unknown").
///
/// Decoders report every problem with hostile input as one of these; none of them traps.
public struct WireError: Error, Hashable, Sendable, CustomStringConvertible {
    public var code: GoAwayCode
    public var reason: String

    public init(_ code: GoAwayCode, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// A protocol error (code 1).
    static func malformed(_ reason: String) -> WireError { WireError(.protocolError, reason) }

    public var description: String { "\(reason) (go-away code \(code.rawValue))" }
}

// MARK: - Bytes

/// Reads big-endian fields front to back from untrusted bytes. Every read checks the length
/// first and returns nil when the bytes run out; nothing here can trap.
struct WireReader {
    private(set) var remaining: ArraySlice<UInt8>

    init(_ bytes: ArraySlice<UInt8>) {
        remaining = bytes
    }

    var count: Int { remaining.count }
    var isAtEnd: Bool { remaining.isEmpty }

    mutating func uint8() -> UInt8? {
        guard let byte = remaining.first else { return nil }
        remaining = remaining.dropFirst()
        return byte
    }

    mutating func uint16() -> UInt16? {
        guard let bytes = bytes(2) else { return nil }
        return bytes.reduce(0) { $0 << 8 | UInt16($1) }
    }

    mutating func uint32() -> UInt32? {
        guard let bytes = bytes(4) else { return nil }
        return bytes.reduce(0) { $0 << 8 | UInt32($1) }
    }

    mutating func uint64() -> UInt64? {
        guard let bytes = bytes(8) else { return nil }
        return bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }

    mutating func bytes(_ count: Int) -> ArraySlice<UInt8>? {
        guard count >= 0, remaining.count >= count else { return nil }
        let taken = remaining.prefix(count)
        remaining = remaining.dropFirst(count)
        return taken
    }

    mutating func rest() -> ArraySlice<UInt8> {
        let rest = remaining
        remaining = remaining.suffix(0)
        return rest
    }

    /// The byte at `offset` from the current position, if there is one (no consumption).
    func peek(at offset: Int) -> UInt8? {
        guard offset >= 0, offset < remaining.count else { return nil }
        return remaining[remaining.startIndex + offset]
    }
}

extension Array where Element == UInt8 {
    // Each appends the value's bytes in one go (one capacity check), not byte by byte.
    mutating func appendBigEndian(_ value: UInt16) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }

    mutating func appendBigEndian(_ value: UInt32) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }

    mutating func appendBigEndian(_ value: UInt64) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}

enum WireText {
    /// Text from the peer shown to people (reasons): invalid UTF-8 becomes U+FFFD rather than
    /// an error, so a badly encoded reason never hides the code that came with it; what could
    /// act on a terminal is escaped and the text cut (``PeerText``), so no reason leaves a
    /// decoder raw or longer than ``PeerText/decodedReasonBytes``.
    static func lenient(_ bytes: some Collection<UInt8>) -> String {
        PeerText.sanitized(bytes: bytes, limit: PeerText.decodedReasonBytes)
    }

    /// Strict UTF-8, or nil.
    static func strict(_ bytes: some Collection<UInt8>) -> String? {
        var iterator = bytes.makeIterator()
        var scalars = String.UnicodeScalarView()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue(let scalar): scalars.append(scalar)
            case .emptyInput: return String(scalars)
            case .error: return nil
            }
        }
    }

    /// The UTF-8 of `text`, cut at a character boundary to at most `limit` bytes.
    static func utf8(_ text: String, limit: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        for character in text {
            let encoded = Array(character.utf8)
            if bytes.count + encoded.count > limit { break }
            bytes += encoded
        }
        return bytes
    }

    /// A duration as people read it: `10 s`, `2.5 s`, `0.25 s`.
    static func seconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let milliseconds = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        let whole = milliseconds / 1000
        var fraction = String(abs(milliseconds % 1000))
        if fraction == "0" { return "\(whole) s" }
        while fraction.count < 3 { fraction = "0" + fraction }
        while fraction.hasSuffix("0") { fraction.removeLast() }
        return "\(whole).\(fraction) s"
    }

    static func hex(_ value: some BinaryInteger) -> String { "0x" + String(value, radix: 16) }
}
