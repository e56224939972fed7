/// A side's wish about encryption, as in MultipeerConnectivity.
public enum EncryptionPreference: UInt8, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    /// Refuses encryption.
    case none = 0
    /// Encrypts if the other side does not refuse.
    case optional = 1
    /// Refuses a link without encryption.
    case required = 2

    public var description: String {
        switch self {
        case .none: "none"
        case .optional: "optional"
        case .required: "required"
        }
    }

    /// Whether two preferences give an encrypted link, or nil when they are incompatible
    /// (*required* × *none*). Encryption is on unless both said *none*, or one said *none* and
    /// the other *optional*.
    public static func agreement(_ lhs: EncryptionPreference, _ rhs: EncryptionPreference) -> Bool? {
        switch (lhs, rhs) {
        case (.required, .none), (.none, .required): nil
        case (.none, _), (_, .none): false
        default: true
        }
    }
}

/// What each side sends first, in clear: the protocol versions it speaks, its encryption
/// preference and its service type.
public struct LinkPreface: Hashable, Sendable {
    /// The versions spoken, 1 to 255 of them, highest first.
    public let versions: [UInt8]
    public let encryption: EncryptionPreference
    public let service: ServiceType

    /// - Throws: a ``WireError`` (code 1) if `versions` is empty or has more than 255 entries.
    public init(
        versions: [UInt8] = WireFormat.supportedVersions,
        encryption: EncryptionPreference,
        service: ServiceType
    ) throws(WireError) {
        guard (1...255).contains(versions.count) else {
            throw .malformed("a preface lists 1 to 255 versions, not \(versions.count)")
        }
        self.versions = versions
        self.encryption = encryption
        self.service = service
    }

    /// The preface's bytes.
    public func encoded() -> [UInt8] {
        var bytes = WireFormat.magic
        bytes.append(UInt8(versions.count))
        bytes += versions
        bytes.append(encryption.rawValue)
        bytes.append(UInt8(service.value.utf8.count))
        bytes += Array(service.value.utf8)
        return bytes
    }

    /// Decodes exactly one preface.
    ///
    /// - Throws: a ``WireError`` (code 1) if the bytes are not one well-formed preface.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(WireError) -> LinkPreface {
        guard let (preface, consumed) = try parse(prefix: bytes) else {
            throw .malformed("the preface is truncated: \(bytes.count) bytes")
        }
        guard consumed == bytes.count else {
            throw .malformed("\(bytes.count - consumed) bytes follow the preface")
        }
        return preface
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> LinkPreface {
        try decode(bytes[...])
    }

    /// Decodes the preface at the start of `bytes`: the preface and its length, or nil when more
    /// bytes are needed. Fails as soon as the bytes so far cannot start a preface, so a peer
    /// that is not PeerLink is found out at its first wrong byte.
    public static func parse(prefix bytes: ArraySlice<UInt8>) throws(WireError) -> (LinkPreface, Int)? {
        var reader = WireReader(bytes)
        for (index, expected) in WireFormat.magic.enumerated() {
            guard let byte = reader.uint8() else { return nil }
            guard byte == expected else {
                throw .malformed(
                    "the preface does not start with PLNK (byte \(index) is \(WireText.hex(byte))): not a PeerLink peer")
            }
        }
        guard let count = reader.uint8() else { return nil }
        guard count > 0 else { throw .malformed("the preface lists no protocol version") }
        // Check the fields after the versions as soon as they arrive.
        if let byte = reader.peek(at: Int(count)), EncryptionPreference(rawValue: byte) == nil {
            throw .malformed("encryption preference \(byte) is unknown (0 none, 1 optional, 2 required)")
        }
        if let length = reader.peek(at: Int(count) + 1), length == 0 || Int(length) > ServiceType.maximumLength {
            throw .malformed("the service type is \(length) bytes; it must be 1 to \(ServiceType.maximumLength)")
        }
        guard let versions = reader.bytes(Int(count)),
            let encryptionByte = reader.uint8(),
            let encryption = EncryptionPreference(rawValue: encryptionByte),
            let serviceLength = reader.uint8(),
            let serviceBytes = reader.bytes(Int(serviceLength))
        else { return nil }
        guard serviceBytes.allSatisfy({ $0 < 0x80 }),
            let service = try? ServiceType(String(decoding: serviceBytes, as: UTF8.self))
        else {
            throw .malformed("the service type is not a valid service type (1 to 15 lowercase letters, digits, hyphens)")
        }
        let preface = LinkPreface(unchecked: Array(versions), encryption, service)
        return (preface, bytes.count - reader.count)
    }

    private init(unchecked versions: [UInt8], _ encryption: EncryptionPreference, _ service: ServiceType) {
        self.versions = versions
        self.encryption = encryption
        self.service = service
    }

    /// The outcome of comparing two prefaces.
    public enum Negotiation: Hashable, Sendable {
        /// The link goes on with this version, encrypted or not.
        case agreed(version: UInt8, encrypted: Bool)
        /// The link is refused; the reason is written from the refusing (local) side's view.
        case refused(code: GoAwayCode, reason: String)
    }

    /// What a side that sent `local` and read `remote` decides, checked in the spec's order:
    /// common version (else code 2), same service (else 3), compatible encryption (else 4);
    /// otherwise the highest common version, encrypted per the spec's table. Both sides reach
    /// the same decision, so a refusal is sent by both.
    public static func negotiate(local: LinkPreface, remote: LinkPreface) -> Negotiation {
        let common = Set(local.versions).intersection(remote.versions)
        guard let version = common.max() else {
            return .refused(
                code: .unsupportedVersion,
                reason: "this peer speaks PeerLink protocol versions \(list(local.versions)); "
                    + "the other speaks \(list(remote.versions))")
        }
        guard local.service == remote.service else {
            return .refused(
                code: .serviceMismatch,
                reason: "this peer serves '\(local.service)', the other '\(remote.service)'")
        }
        guard let encrypted = EncryptionPreference.agreement(local.encryption, remote.encryption) else {
            let reason =
                local.encryption == .required
                ? "this peer requires encryption and the other refuses it"
                : "this peer refuses encryption and the other requires it"
            return .refused(code: .encryptionMismatch, reason: reason)
        }
        return .agreed(version: version, encrypted: encrypted)
    }

    private static func list(_ versions: [UInt8]) -> String {
        versions.map(String.init).joined(separator: ", ")
    }
}

/// The one-byte answer to the other side's preface: go on, or a refusal with a code and reason.
public enum Verdict: Hashable, Sendable {
    case accept
    /// The code travels in one byte: codes 1–255. The reason is UTF-8 behind a 2-byte length.
    case refuse(code: GoAwayCode, reason: String)

    /// The verdict's bytes. A refusal with code 0 or a code above 255, which one byte cannot
    /// carry as a refusal, is sent as 10 (internal error); a reason over 65535 bytes is cut.
    public func encoded() -> [UInt8] {
        switch self {
        case .accept:
            return [0]
        case .refuse(let code, let reason):
            let raw = code.rawValue
            let byte = (1...255).contains(raw) ? UInt8(raw) : UInt8(GoAwayCode.internalError.rawValue)
            let text = WireText.utf8(reason, limit: Int(UInt16.max))
            var bytes: [UInt8] = [byte]
            bytes.appendBigEndian(UInt16(text.count))
            return bytes + text
        }
    }

    /// Decodes exactly one verdict.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(WireError) -> Verdict {
        guard let (verdict, consumed) = parse(prefix: bytes) else {
            throw .malformed("the verdict is truncated: \(bytes.count) bytes")
        }
        guard consumed == bytes.count else { throw .malformed("\(bytes.count - consumed) bytes follow the verdict") }
        return verdict
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> Verdict {
        try decode(bytes[...])
    }

    /// The verdict at the start of `bytes` and its length, or nil when more bytes are needed.
    /// Every byte string is the start of some verdict; the reason is read leniently (invalid
    /// UTF-8 becomes U+FFFD) so the code always gets through.
    public static func parse(prefix bytes: ArraySlice<UInt8>) -> (Verdict, Int)? {
        var reader = WireReader(bytes)
        guard let code = reader.uint8() else { return nil }
        if code == 0 { return (.accept, 1) }
        guard let length = reader.uint16(), let reason = reader.bytes(Int(length)) else { return nil }
        return (.refuse(code: GoAwayCode(rawValue: UInt32(code)), reason: WireText.lenient(reason)), 3 + Int(length))
    }
}
