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

/// What a side says about itself inside the Noise handshake: its display name, and the session
/// it is in or joins (if any).
///
/// On the wire a list of fields `type (1) | length (2) | value`: 1 the display name (required,
/// 1–63 bytes, a valid ``DisplayName``), 2 the session (16 bytes). Unknown field types are
/// skipped; a known field twice, a field running past the end, or a missing name is malformed.
public struct Hello: Hashable, Sendable {
    enum Field: UInt8 {
        case displayName = 1
        case session = 2
    }

    public var displayName: DisplayName
    public var session: SessionID?

    public init(displayName: DisplayName, session: SessionID? = nil) {
        self.displayName = displayName
        self.session = session
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
        return bytes
    }

    /// - Throws: a ``WireError`` (code 1) naming what is wrong.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(WireError) -> Hello {
        var reader = WireReader(bytes)
        var name: DisplayName?
        var session: SessionID?
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
            case nil:
                continue  // a field a later version added
            }
        }
        guard let name else { throw .malformed("the hello has no display name") }
        return Hello(displayName: name, session: session)
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> Hello {
        try decode(bytes[...])
    }
}
