/// A rule broken by a display name, service type or discovery info.
///
/// Each case names the rule, so the message tells the user exactly what to change.
public enum ValidationError: Error, Hashable, Sendable, CustomStringConvertible {
    // Display names (MPC: 1–63 bytes of UTF-8).
    case displayNameEmpty
    case displayNameTooLong(bytes: Int)
    case displayNameControlCharacter

    // Service types (RFC 6335 service names, as MPC uses them).
    case serviceTypeEmpty
    case serviceTypeTooLong(characters: Int)
    case serviceTypeInvalidCharacter(Character)
    case serviceTypeNoLetter
    case serviceTypeHyphenAtEdge
    case serviceTypeDoubleHyphen
    /// The type written as DNS-SD writes it (`_chat._tcp`, the value given): the name alone
    /// (`chat`) is what to give instead.
    case serviceTypeDNSSDForm(String)

    // Discovery info (one DNS-SD TXT record).
    case infoKeyEmpty
    case infoKeyContainsEquals(key: String)
    case infoKeyNotPrintableASCII(key: String)
    case infoKeyReserved(key: String)
    case infoKeyDuplicate(key: String)
    case infoEntryTooLong(key: String, bytes: Int)
    case infoTooLarge(bytes: Int)
    case infoArgumentMalformed(String)

    public var description: String {
        switch self {
        case .displayNameEmpty:
            return "display name is empty: it must be 1 to \(DisplayName.maximumBytes) bytes of UTF-8"
        case .displayNameTooLong(let bytes):
            return "display name is \(bytes) bytes long: it must be 1 to \(DisplayName.maximumBytes) bytes of UTF-8"
        case .displayNameControlCharacter:
            return "display name contains a control, line-break or text-direction character: use printable characters only"
        case .serviceTypeEmpty:
            return "service type is empty: it must be 1 to 15 characters (lowercase letters, digits, hyphens)"
        case .serviceTypeTooLong(let characters):
            return "service type is \(characters) characters long: it must be 1 to 15 characters (lowercase letters, digits, hyphens)"
        case .serviceTypeInvalidCharacter(let character):
            return "service type contains \(Self.quote(character)): only lowercase ASCII letters, digits and hyphens are allowed"
        case .serviceTypeNoLetter:
            return "service type has no letter: it must contain at least one lowercase letter"
        case .serviceTypeHyphenAtEdge:
            return "service type starts or ends with a hyphen: hyphens are allowed only between letters or digits"
        case .serviceTypeDoubleHyphen:
            return "service type contains two hyphens in a row: use single hyphens"
        case .serviceTypeDNSSDForm(let given):
            let name = ServiceType.nameInDNSSDForm(given) ?? given
            return "service type \(Self.quote(given)) is written as DNS-SD writes it: give the name alone, \(Self.quote(name)) (on the LAN it is advertised as _\(name)._tcp)"
        case .infoKeyEmpty:
            return "discovery info has an empty key: keys must be 1 or more printable ASCII characters"
        case .infoKeyContainsEquals(let key):
            return "discovery info key \(Self.quote(key)) contains '=': keys must not contain '='"
        case .infoKeyNotPrintableASCII(let key):
            return "discovery info key \(Self.quote(key)) is not printable ASCII: keys may use the characters from space to '~' only"
        case .infoKeyReserved(let key):
            return "discovery info key \(Self.quote(key)) is reserved by PeerLink: choose another key"
        case .infoKeyDuplicate(let key):
            return "discovery info key \(Self.quote(key)) appears twice (keys are case-insensitive): keep one"
        case .infoEntryTooLong(let key, let bytes):
            return "discovery info entry \(Self.quote(key)) is \(bytes) bytes as key=value: each entry must be at most \(DiscoveryInfo.maximumEntryBytes) bytes"
        case .infoTooLarge(let bytes):
            return "discovery info is \(bytes) bytes: the whole set must be at most \(DiscoveryInfo.maximumTotalBytes) bytes (each entry counts key=value plus one length byte)"
        case .infoArgumentMalformed(let argument):
            return "discovery info \(Self.quote(argument)) is not KEY=VALUE: write it as key=value"
        }
    }

    private static func quote(_ value: some StringProtocol) -> String {
        "'" + value.unicodeScalars.map { $0.properties.generalCategory == .control ? $0.escaped(asASCII: true) : String($0) }.joined() + "'"
    }

    private static func quote(_ character: Character) -> String {
        quote(String(character))
    }

    /// The same error as a ``PeerLinkError`` with code `invalidParameter`.
    public var peerLinkError: PeerLinkError { PeerLinkError(.invalidParameter, description) }
}

/// A peer's human-readable label: 1–63 bytes of UTF-8 (the length of one DNS label), no control
/// characters. It is only a label: two peers with the same display name are different peers.
public struct DisplayName: Hashable, Sendable, CustomStringConvertible {
    public static let maximumBytes = 63

    public let value: String

    public init(_ value: String) throws(ValidationError) {
        let bytes = value.utf8.count
        if bytes == 0 { throw .displayNameEmpty }
        if bytes > Self.maximumBytes { throw .displayNameTooLong(bytes: bytes) }
        if value.unicodeScalars.contains(where: Self.isDisallowed) {
            throw .displayNameControlCharacter
        }
        self.value = value
    }

    public var description: String { value }

    /// Control characters, line and paragraph separators, and the bidirectional embedding,
    /// override and isolate characters (which can make a name display as another).
    static func isDisallowed(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .lineSeparator, .paragraphSeparator: return true
        default: return (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value)
        }
    }
}

/// A DNS-SD service type in the rules MPC uses (RFC 6335 service names): 1–15 characters,
/// lowercase ASCII letters, digits and hyphens, at least one letter, no hyphen at either end and
/// no two hyphens in a row. On the LAN it becomes `_<type>._tcp`.
public struct ServiceType: Hashable, Sendable, CustomStringConvertible {
    public static let maximumLength = 15

    public let value: String

    public init(_ value: String) throws(ValidationError) {
        if let name = Self.nameInDNSSDForm(value) {
            // the name's own rule, if it breaks one; else the hint to give the name alone
            try Self.check(name)
            throw .serviceTypeDNSSDForm(value)
        }
        try Self.check(value)
        self.value = value
    }

    /// Throws the first rule `value` breaks.
    private static func check(_ value: String) throws(ValidationError) {
        if value.isEmpty { throw .serviceTypeEmpty }
        for character in value {
            let isLower = character >= "a" && character <= "z"
            let isDigit = character >= "0" && character <= "9"
            if !(isLower || isDigit || character == "-") || !character.isASCII {
                throw .serviceTypeInvalidCharacter(character)
            }
        }
        if value.count > maximumLength { throw .serviceTypeTooLong(characters: value.count) }
        if !value.contains(where: { $0 >= "a" && $0 <= "z" }) { throw .serviceTypeNoLetter }
        if value.hasPrefix("-") || value.hasSuffix("-") { throw .serviceTypeHyphenAtEdge }
        if value.contains("--") { throw .serviceTypeDoubleHyphen }
    }

    /// `chat` of `_chat._tcp`, `_chat._udp` or either with a final dot; nil for anything else.
    static func nameInDNSSDForm(_ value: String) -> String? {
        var text = Substring(value)
        if text.hasSuffix(".") { text = text.dropLast() }
        guard text.hasPrefix("_") else { return nil }
        for suffix in ["._tcp", "._udp"] where text.hasSuffix(suffix) {
            let name = text.dropFirst().dropLast(suffix.count)
            return name.isEmpty ? nil : String(name)
        }
        return nil
    }

    /// The DNS-SD type on a LAN: `_<type>._tcp`.
    public var dnsSDType: String { "_\(value)._tcp" }

    public var description: String { value }

    /// The service type PeerLink uses when the app names none.
    public static let `default` = try! ServiceType("peerlink")
}

/// The app's discovery info: string keys and values published with the peer (MPC's
/// `discoveryInfo`), carried in one DNS-SD TXT record on a LAN.
///
/// Rules: a key is 1 or more printable ASCII characters without `=` (RFC 6763 §6.4), keys are
/// unique ignoring case; each `key=value` is at most 255 bytes; the whole set is at most 400 bytes,
/// counting each entry as one length byte plus `key=value`. Keys PeerLink uses itself are reserved.
public struct DiscoveryInfo: Hashable, Sendable, Sequence {
    public static let maximumEntryBytes = 255
    public static let maximumTotalBytes = 400

    public private(set) var entries: [String: String]

    public init(_ entries: [String: String] = [:]) throws(ValidationError) {
        var seen: Set<String> = []
        var total = 0
        for key in entries.keys.sorted() {
            let value = entries[key]!
            try Self.validate(key: key)
            if TXTRecord.reservedKeys.contains(key.lowercased()) { throw .infoKeyReserved(key: key) }
            if !seen.insert(key.lowercased()).inserted { throw .infoKeyDuplicate(key: key) }
            let entryBytes = key.utf8.count + 1 + value.utf8.count
            if entryBytes > Self.maximumEntryBytes { throw .infoEntryTooLong(key: key, bytes: entryBytes) }
            total += 1 + entryBytes
        }
        if total > Self.maximumTotalBytes { throw .infoTooLarge(bytes: total) }
        self.entries = entries
    }

    /// Parses command line arguments of the form `key=value` (the value may contain `=`).
    public init(arguments: [String]) throws(ValidationError) {
        var entries: [String: String] = [:]
        for argument in arguments {
            guard let equals = argument.firstIndex(of: "=") else { throw .infoArgumentMalformed(argument) }
            let key = String(argument[..<equals])
            if key.isEmpty { throw .infoKeyEmpty }
            if entries[key] != nil { throw .infoKeyDuplicate(key: key) }
            entries[key] = String(argument[argument.index(after: equals)...])
        }
        try self.init(entries)
    }

    static func validate(key: String) throws(ValidationError) {
        if key.isEmpty { throw .infoKeyEmpty }
        if key.contains("=") { throw .infoKeyContainsEquals(key: key) }
        if !key.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value <= 0x7E }) {
            throw .infoKeyNotPrintableASCII(key: key)
        }
    }

    public subscript(key: String) -> String? { entries[key] }
    public var isEmpty: Bool { entries.isEmpty }
    public var count: Int { entries.count }

    public func makeIterator() -> Dictionary<String, String>.Iterator { entries.makeIterator() }
}
