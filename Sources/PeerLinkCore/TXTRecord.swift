/// What a PeerLink advertiser publishes about itself in a DNS-SD TXT record (and, later, in an
/// SDP record): protocol version, identity fingerprint, display name, and the app's discovery info.
///
/// TXT strings are `key=value` byte strings (RFC 6763 §6). PeerLink's own keys:
///
/// | key      | value                                             |
/// |----------|---------------------------------------------------|
/// | `plv`    | protocol version, decimal (currently `1`)          |
/// | `plid`   | identity fingerprint (16 base32 characters)        |
/// | `plname` | display name, UTF-8, 1–63 bytes                    |
///
/// Every other key is the app's discovery info.
public struct TXTRecord: Hashable, Sendable {
    public static let protocolVersion = 1
    public static let versionKey = "plv"
    public static let fingerprintKey = "plid"
    public static let nameKey = "plname"
    public static let reservedKeys: Set<String> = [versionKey, fingerprintKey, nameKey]

    public var version: Int
    public var fingerprint: Fingerprint
    public var displayName: String
    public var info: DiscoveryInfo

    public init(version: Int = TXTRecord.protocolVersion, fingerprint: Fingerprint, displayName: String, info: DiscoveryInfo) {
        self.version = version
        self.fingerprint = fingerprint
        self.displayName = displayName
        self.info = info
    }

    public var peerID: PeerID { PeerID(fingerprint: fingerprint, displayName: displayName) }

    /// The TXT strings, PeerLink's keys first, then the app's in key order.
    public func encoded() -> [[UInt8]] {
        var strings: [[UInt8]] = [
            Array("\(Self.versionKey)=\(version)".utf8),
            Array("\(Self.fingerprintKey)=\(fingerprint.value)".utf8),
            Array("\(Self.nameKey)=\(displayName)".utf8),
        ]
        for key in info.entries.keys.sorted() {
            strings.append(Array("\(key)=\(info.entries[key]!)".utf8))
        }
        return strings
    }

    /// Why a TXT record is not a PeerLink record. Browsers ignore such records (with a debug log):
    /// they may come from other software publishing under the same type.
    public enum DecodingError: Error, Hashable, Sendable, CustomStringConvertible {
        case missingKey(String)
        case badVersion(String)
        case badFingerprint(String)
        case badUTF8(key: String)
        case badDisplayName(ValidationError)
        case oversizedString(bytes: Int)
        case badInfo(ValidationError)

        public var description: String {
            switch self {
            case .missingKey(let key): return "TXT record has no \(key)= entry"
            case .badVersion(let text): return "TXT record has protocol version '\(PeerText.sanitized(text, limit: 64))', not a positive number"
            case .badFingerprint(let text): return "TXT record has fingerprint '\(PeerText.sanitized(text, limit: 64))', not 16 base32 characters"
            case .badUTF8(let key): return "TXT record entry \(key) is not valid UTF-8"
            case .badDisplayName(let error): return "TXT record: \(error)"
            case .oversizedString(let bytes): return "TXT record has a \(bytes)-byte string; at most 255 are allowed"
            case .badInfo(let error): return "TXT record: \(error)"
            }
        }
    }

    /// Decodes TXT strings. Strings without `=` are boolean attributes (value ""); empty strings
    /// are skipped; of repeated keys (case-insensitive) the first counts (RFC 6763 §6.4).
    public init(decoding strings: [[UInt8]]) throws(DecodingError) {
        var own: [String: String] = [:]
        var app: [String: String] = [:]
        var seen: Set<String> = []
        for string in strings {
            if string.count > DiscoveryInfo.maximumEntryBytes { throw .oversizedString(bytes: string.count) }
            if string.isEmpty { continue }
            let equals = string.firstIndex(of: UInt8(ascii: "=")) ?? string.endIndex
            let keyBytes = string[..<equals]
            guard !keyBytes.isEmpty, keyBytes.allSatisfy({ $0 >= 0x20 && $0 <= 0x7E }) else { continue }
            let key = String(decoding: keyBytes, as: UTF8.self)
            guard seen.insert(key.lowercased()).inserted else { continue }
            let valueBytes = equals < string.endIndex ? Array(string[string.index(after: equals)...]) : []
            guard let value = String(validating: valueBytes, as: UTF8.self) else { throw .badUTF8(key: key) }
            if Self.reservedKeys.contains(key.lowercased()) {
                own[key.lowercased()] = value
            } else {
                app[key] = value
            }
        }
        guard let versionText = own[Self.versionKey] else { throw .missingKey(Self.versionKey) }
        guard versionText.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let version = Int(versionText), version > 0 else { throw .badVersion(versionText) }
        guard let fingerprintText = own[Self.fingerprintKey] else { throw .missingKey(Self.fingerprintKey) }
        guard let fingerprint = Fingerprint(fingerprintText) else { throw .badFingerprint(fingerprintText) }
        guard let name = own[Self.nameKey] else { throw .missingKey(Self.nameKey) }
        do {
            _ = try DisplayName(name)
        } catch {
            throw .badDisplayName(error)
        }
        let info: DiscoveryInfo
        do {
            info = try DiscoveryInfo(app)
        } catch {
            throw .badInfo(error)
        }
        self.init(version: version, fingerprint: fingerprint, displayName: name, info: info)
    }
}
