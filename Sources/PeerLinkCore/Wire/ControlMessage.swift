/// Why an invitation was declined. Reasons this version does not know are kept as
/// ``other(_:)``, and mean *declined*.
public enum DeclineReason: Hashable, Sendable, CustomStringConvertible {
    case declined
    case sessionFull
    case timedOut
    /// Both peers invited each other at once; the tie-break declined this invitation.
    case crossed
    case other(UInt8)

    public init(rawValue: UInt8) {
        switch rawValue {
        case 0: self = .declined
        case 1: self = .sessionFull
        case 2: self = .timedOut
        case 3: self = .crossed
        default: self = .other(rawValue)
        }
    }

    public var rawValue: UInt8 {
        switch self {
        case .declined: 0
        case .sessionFull: 1
        case .timedOut: 2
        case .crossed: 3
        case .other(let value): value
        }
    }

    public static func == (lhs: DeclineReason, rhs: DeclineReason) -> Bool { lhs.rawValue == rhs.rawValue }
    public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

    public var description: String {
        switch self {
        case .declined: "declined"
        case .sessionFull: "session full"
        case .timedOut: "timed out"
        case .crossed: "crossed invitations"
        case .other(let value): "declined (reason \(value))"
        }
    }
}

/// The payload of a `CONTROL` frame: a 1-byte control type, then its fields.
public enum ControlMessage: Hashable, Sendable, CustomStringConvertible {
    /// An invitation into `session`, answered within `timeoutMilliseconds`, with the app's
    /// context (at most 8192 bytes).
    case invite(invitation: UInt32, session: SessionID, timeoutMilliseconds: UInt32, context: [UInt8])
    case accept(invitation: UInt32)
    case decline(invitation: UInt32, reason: DeclineReason)
    /// The members of `session` (at most 255 in the format).
    case members(session: SessionID, members: [Member])
    /// A new member connecting to an existing one after an `ACCEPT`.
    case join(session: SessionID)
    case leave(session: SessionID)

    /// One member in a `MEMBERS` message.
    public struct Member: Hashable, Sendable {
        public var fingerprint: Fingerprint
        public var displayName: DisplayName

        public init(fingerprint: Fingerprint, displayName: DisplayName) {
            self.fingerprint = fingerprint
            self.displayName = displayName
        }

        public var peerID: PeerID { PeerID(fingerprint: fingerprint, displayName: displayName.value) }
    }

    /// The control type byte.
    public enum Kind: UInt8, Hashable, Sendable, CaseIterable {
        case invite = 1
        case accept = 2
        case decline = 3
        case members = 4
        case join = 5
        case leave = 6
    }

    public var kind: Kind {
        switch self {
        case .invite: .invite
        case .accept: .accept
        case .decline: .decline
        case .members: .members
        case .join: .join
        case .leave: .leave
        }
    }

    public var description: String {
        switch self {
        case .invite(let invitation, let session, let timeout, let context):
            "INVITE \(invitation) session \(session) timeout \(timeout) ms context \(context.count) bytes"
        case .accept(let invitation): "ACCEPT \(invitation)"
        case .decline(let invitation, let reason): "DECLINE \(invitation) \(reason)"
        case .members(let session, let members):
            "MEMBERS session \(session): " + members.map { "\($0.peerID)" }.joined(separator: ", ")
        case .join(let session): "JOIN \(session)"
        case .leave(let session): "LEAVE \(session)"
        }
    }

    /// - Throws: a ``WireError`` (code 1) for a context over 8192 bytes or more than 255 members.
    public func encoded() throws(WireError) -> [UInt8] {
        var bytes: [UInt8] = [kind.rawValue]
        switch self {
        case .invite(let invitation, let session, let timeout, let context):
            guard context.count <= WireFormat.maxContextLength else {
                throw .malformed("an invitation's context is \(context.count) bytes, over the limit of \(WireFormat.maxContextLength)")
            }
            bytes.appendBigEndian(invitation)
            bytes += session.bytes
            bytes.appendBigEndian(timeout)
            bytes += context
        case .accept(let invitation):
            bytes.appendBigEndian(invitation)
        case .decline(let invitation, let reason):
            bytes.appendBigEndian(invitation)
            bytes.append(reason.rawValue)
        case .members(let session, let members):
            guard members.count <= 255 else { throw .malformed("MEMBERS lists at most 255 members, not \(members.count)") }
            bytes += session.bytes
            bytes.append(UInt8(members.count))
            for member in members {
                let name = Array(member.displayName.value.utf8)
                bytes += Array(member.fingerprint.value.utf8)
                bytes.append(UInt8(name.count))
                bytes += name
            }
        case .join(let session), .leave(let session):
            bytes += session.bytes
        }
        return bytes
    }

    /// Decodes a `CONTROL` frame's payload, checking every field's length.
    ///
    /// - Throws: a ``WireError`` (code 1): an unknown control type, a missing or extra byte, a
    ///   context over 8192 bytes, a fingerprint or display name that is not valid.
    public static func decode(_ payload: ArraySlice<UInt8>) throws(WireError) -> ControlMessage {
        var reader = WireReader(payload)
        guard let kindByte = reader.uint8() else { throw .malformed("a CONTROL frame has no control type") }
        guard let kind = Kind(rawValue: kindByte) else {
            throw .malformed("control type \(WireText.hex(kindByte)) is unknown")
        }
        let message: ControlMessage
        switch kind {
        case .invite:
            guard let invitation = reader.uint32(), let session = reader.session(), let timeout = reader.uint32() else {
                throw .malformed("an INVITE is at least 24 bytes after its type; it is \(payload.count - 1)")
            }
            let context = reader.rest()
            guard context.count <= WireFormat.maxContextLength else {
                throw .malformed("an INVITE's context is \(context.count) bytes, over the limit of \(WireFormat.maxContextLength)")
            }
            message = .invite(invitation: invitation, session: session, timeoutMilliseconds: timeout, context: Array(context))
        case .accept:
            guard let invitation = reader.uint32() else { throw truncated(kind, payload) }
            message = .accept(invitation: invitation)
        case .decline:
            guard let invitation = reader.uint32(), let reason = reader.uint8() else { throw truncated(kind, payload) }
            message = .decline(invitation: invitation, reason: DeclineReason(rawValue: reason))
        case .members:
            guard let session = reader.session(), let count = reader.uint8() else { throw truncated(kind, payload) }
            guard count <= SessionPolicy.largestSession else {
                throw .malformed("MEMBERS lists \(count) members; a session holds at most \(SessionPolicy.largestSession) peers")
            }
            var members: [Member] = []
            for index in 0..<Int(count) {
                guard let fingerprintBytes = reader.bytes(Fingerprint.length), let nameLength = reader.uint8(),
                    let nameBytes = reader.bytes(Int(nameLength))
                else { throw .malformed("MEMBERS says \(count) members but ends inside member \(index + 1)") }
                guard fingerprintBytes.allSatisfy({ Fingerprint.alphabet.contains($0) }),
                    let fingerprint = Fingerprint(String(decoding: fingerprintBytes, as: UTF8.self))
                else { throw .malformed("member \(index + 1)'s fingerprint is not 16 lowercase base32 characters") }
                guard let text = WireText.strict(nameBytes), let name = try? DisplayName(text) else {
                    throw .malformed("member \(index + 1)'s display name is not 1 to 63 bytes of printable UTF-8")
                }
                members.append(Member(fingerprint: fingerprint, displayName: name))
            }
            message = .members(session: session, members: members)
        case .join:
            guard let session = reader.session() else { throw truncated(kind, payload) }
            message = .join(session: session)
        case .leave:
            guard let session = reader.session() else { throw truncated(kind, payload) }
            message = .leave(session: session)
        }
        guard reader.isAtEnd else {
            throw .malformed("\(reader.count) bytes follow the \(kind.name) message")
        }
        return message
    }

    public static func decode(_ payload: [UInt8]) throws(WireError) -> ControlMessage {
        try decode(payload[...])
    }

    private static func truncated(_ kind: Kind, _ payload: ArraySlice<UInt8>) -> WireError {
        .malformed("the \(kind.name) message is truncated: \(payload.count - 1) bytes after its type")
    }
}

extension ControlMessage.Kind {
    var name: String {
        switch self {
        case .invite: "INVITE"
        case .accept: "ACCEPT"
        case .decline: "DECLINE"
        case .members: "MEMBERS"
        case .join: "JOIN"
        case .leave: "LEAVE"
        }
    }
}

extension WireReader {
    mutating func session() -> SessionID? {
        guard let bytes = bytes(SessionID.length) else { return nil }
        return SessionID(unchecked: Array(bytes))
    }
}
