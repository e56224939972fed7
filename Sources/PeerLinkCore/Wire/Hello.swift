/// A session's identifier on the wire: 16 random bytes.
public struct SessionID: Hashable, Sendable, CustomStringConvertible {
    public static let length = 16

    public let bytes: [UInt8]

    /// A session id from exactly 16 bytes, or nil.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.length else { return nil }
        self.bytes = Array(bytes)
    }

    /// A new random session id.
    public static func random() -> SessionID {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }

    public static func random(using generator: inout some RandomNumberGenerator) -> SessionID {
        SessionID(unchecked: (0..<length).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    init(unchecked bytes: [UInt8]) {
        self.bytes = bytes
    }

    /// Lowercase hex.
    public var description: String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

/// One run of a peer: a random number a session draws when it starts. A peer whose links
/// come and go within one incarnation resumes where it was (its sequenced frames continue); a
/// new incarnation (the process restarted) starts afresh.
public struct Incarnation: Hashable, Sendable, CustomStringConvertible {
    public let value: UInt64

    public init(_ value: UInt64) { self.value = value }

    /// A new random incarnation.
    public static func random() -> Incarnation {
        var generator = SystemRandomNumberGenerator()
        return Incarnation(UInt64.random(in: 1 ... .max, using: &generator))
    }

    public var description: String { WireText.hex(value) }
}

/// What a side says about itself inside the Noise handshake: its display name, the session it is
/// in or joins (if any), and its incarnation.
///
/// On the wire a list of fields `type (1) | length (2) | value`: 1 the display name (required,
/// 1–63 bytes, a valid ``DisplayName``), 2 the session (16 bytes), 3 the incarnation (8
/// bytes), 4 the largest `DATA` or `MESSAGE` payload the sender takes (4 bytes, at least
/// 16384). Unknown field types are skipped; a known field twice, a field running past the end,
/// or a missing name is malformed.
public struct Hello: Hashable, Sendable {
    enum Field: UInt8 {
        case displayName = 1
        case session = 2
        case incarnation = 3
        case maxFramePayload = 4
    }

    public var displayName: DisplayName
    public var session: SessionID?
    /// The sender's incarnation; nil from a side that does not resume links (it never keeps
    /// frames for a next link).
    public var incarnation: Incarnation?
    /// The largest `DATA` or `MESSAGE` payload the sender takes, when it takes frames larger
    /// than ``WireFormat/maxFramePayload``; nil from a side that does not (then neither side
    /// sends it large frames on the link, nor takes them from it).
    public var maxFramePayload: Int?

    public init(
        displayName: DisplayName, session: SessionID? = nil, incarnation: Incarnation? = nil, maxFramePayload: Int? = nil
    ) {
        self.displayName = displayName
        self.session = session
        self.incarnation = incarnation
        self.maxFramePayload = maxFramePayload
    }

    /// The largest `DATA` or `MESSAGE` payload on a link between a side that said `local` and
    /// one that said `remote`: the smaller of the two when both take large frames (at most what
    /// one record carries beside a sequenced header and a tag, 65499), else
    /// ``WireFormat/maxFramePayload``. The same in both directions and on both sides.
    public static func framePayloadLimit(_ local: Hello, _ remote: Hello) -> Int {
        guard let mine = local.maxFramePayload, let theirs = remote.maxFramePayload else { return WireFormat.maxFramePayload }
        let inOneRecord =
            WireFormat.maxRecordLength(encrypted: true) - WireFormat.tagLength - WireFormat.frameHeaderLength - FrameHeader.sequenceLength
        return max(WireFormat.maxFramePayload, min(mine, theirs, inOneRecord))
    }

    public func encoded() -> [UInt8] {
        var bytes: [UInt8] = []
        let name = Array(displayName.value.utf8)
        bytes.append(Field.displayName.rawValue)
        bytes.appendBigEndian(UInt16(name.count))
        bytes += name
        if let session {
            bytes.append(Field.session.rawValue)
            bytes.appendBigEndian(UInt16(SessionID.length))
            bytes += session.bytes
        }
        if let incarnation {
            bytes.append(Field.incarnation.rawValue)
            bytes.appendBigEndian(UInt16(8))
            bytes.appendBigEndian(incarnation.value)
        }
        if let maxFramePayload {
            bytes.append(Field.maxFramePayload.rawValue)
            bytes.appendBigEndian(UInt16(4))
            bytes.appendBigEndian(UInt32(clamping: maxFramePayload))
        }
        return bytes
    }

    /// - Throws: a ``WireError`` (code 1) naming what is wrong.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(WireError) -> Hello {
        var reader = WireReader(bytes)
        var name: DisplayName?
        var session: SessionID?
        var incarnation: Incarnation?
        var maxFramePayload: Int?
        while !reader.isAtEnd {
            guard let type = reader.uint8(), let length = reader.uint16() else {
                throw .malformed("the hello ends inside a field header")
            }
            guard let value = reader.bytes(Int(length)) else {
                throw .malformed("hello field \(type) says \(length) bytes, but only \(reader.count) follow")
            }
            switch Field(rawValue: type) {
            case .displayName:
                guard name == nil else { throw .malformed("the hello has two display names") }
                guard let text = WireText.strict(value) else { throw .malformed("the display name is not UTF-8") }
                do {
                    name = try DisplayName(text)
                } catch {
                    throw .malformed("the peer's \(error)")
                }
            case .session:
                guard session == nil else { throw .malformed("the hello has two sessions") }
                guard let id = SessionID(bytes: value) else {
                    throw .malformed("the hello's session is \(length) bytes, not \(SessionID.length)")
                }
                session = id
            case .incarnation:
                guard incarnation == nil else { throw .malformed("the hello has two incarnations") }
                var field = WireReader(value)
                guard length == 8, let number = field.uint64() else {
                    throw .malformed("the hello's incarnation is \(length) bytes, not 8")
                }
                guard number != 0 else { throw .malformed("the hello's incarnation is 0, which no run of a session draws") }
                incarnation = Incarnation(number)
            case .maxFramePayload:
                guard maxFramePayload == nil else { throw .malformed("the hello has two frame payload limits") }
                var field = WireReader(value)
                guard length == 4, let limit = field.uint32() else {
                    throw .malformed("the hello's frame payload limit is \(length) bytes, not 4")
                }
                guard limit >= WireFormat.maxFramePayload else {
                    throw .malformed("the hello's frame payload limit is \(limit), below the \(WireFormat.maxFramePayload) every peer takes")
                }
                maxFramePayload = Int(limit)
            case nil:
                continue  // a field a later version added
            }
        }
        guard let name else { throw .malformed("the hello has no display name") }
        return Hello(displayName: name, session: session, incarnation: incarnation, maxFramePayload: maxFramePayload)
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> Hello {
        try decode(bytes[...])
    }
}
