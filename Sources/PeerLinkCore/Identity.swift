import Crypto
import Foundation

/// A short printable name for a public key: the first 80 bits of its SHA-256, in lowercase
/// RFC 4648 base32 (16 characters). This is what tools show and what DNS-SD and SDP records carry;
/// the secure channel later proves the peer holds the key behind it.
///
/// Held as two integers, not as its text: sessions look peers up by fingerprint for every frame,
/// and comparing, hashing or copying two integers costs a fraction of doing it to a 16-byte string
/// (which lives on the heap). ``value`` spells it out when asked; the order (``<``) is the text's.
public struct Fingerprint: Hashable, Sendable, Comparable, CustomStringConvertible, Codable {
    public static let length = 16
    static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567".utf8)

    /// The 16 digits, each as its character's rank among the alphabet's characters in byte order
    /// ("2"…"7" are 0…5, "a"…"z" 6…31), 5 bits each: digits 1–12 here, the first in the top bits…
    private let leading: UInt64
    /// …and digits 13–16 in the low 20 bits here. Comparing (leading, trailing) compares the text.
    private let trailing: UInt32

    /// The fingerprint of a raw 32-byte Curve25519 public key.
    public init(publicKey: some DataProtocol) {
        let digest = Array(SHA256.hash(data: Array(publicKey)))
        self.init(validText: Self.base32(digest.prefix(10)))
    }

    /// Parses a fingerprint as printed (16 base32 characters, case-insensitive; `-` and spaces,
    /// used for grouping, are ignored). Returns nil for anything else.
    public init?(_ text: String) {
        let cleaned = text.lowercased().filter { $0 != "-" && $0 != " " }
        guard cleaned.utf8.count == Self.length,
            cleaned.utf8.allSatisfy({ Self.alphabet.contains($0) })
        else { return nil }
        self.init(validText: Array(cleaned.utf8))
    }

    /// From 16 characters of the alphabet.
    private init(validText: [UInt8]) {
        var leading: UInt64 = 0
        var trailing: UInt32 = 0
        for (index, character) in validText.enumerated() {
            let rank = character >= UInt8(ascii: "a") ? character - UInt8(ascii: "a") + 6 : character - UInt8(ascii: "2")
            if index < 12 {
                leading = leading << 5 | UInt64(rank)
            } else {
                trailing = trailing << 5 | UInt32(rank)
            }
        }
        self.leading = leading
        self.trailing = trailing
    }

    /// The 16 characters, as printed.
    public var value: String {
        String(unsafeUninitializedCapacity: Self.length) { buffer in
            for index in 0..<Self.length {
                let rank =
                    index < 12
                    ? UInt8(truncatingIfNeeded: leading >> (5 * UInt64(11 - index)) & 31)
                    : UInt8(truncatingIfNeeded: trailing >> (5 * UInt32(15 - index)) & 31)
                buffer[index] = rank < 6 ? UInt8(ascii: "2") + rank : UInt8(ascii: "a") + rank - 6
            }
            return Self.length
        }
    }

    /// The fingerprint in groups of four for people to read aloud and compare: `abcd-efgh-ijkl-mnop`.
    public var grouped: String {
        let value = value
        return stride(from: 0, to: value.count, by: 4).map { offset in
            let start = value.index(value.startIndex, offsetBy: offset)
            return String(value[start..<value.index(start, offsetBy: 4)])
        }.joined(separator: "-")
    }

    public var description: String { value }

    public static func < (lhs: Fingerprint, rhs: Fingerprint) -> Bool {
        (lhs.leading, lhs.trailing) < (rhs.leading, rhs.trailing)
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let parsed = Fingerprint(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a fingerprint: \(text)"))
        }
        self = parsed
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(value)
    }

    private static func base32(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var output: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = (buffer << 8) | UInt32(byte)
            bits += 8
            while bits >= 5 {
                output.append(alphabet[Int((buffer >> UInt32(bits - 5)) & 31)])
                bits -= 5
            }
        }
        if bits > 0 { output.append(alphabet[Int((buffer << UInt32(5 - bits)) & 31)]) }
        return output
    }
}

/// A local peer's long-lived identity: a Curve25519 key pair. The public key is who the peer is;
/// the display name is only a label given at run time.
public struct Identity: Sendable {
    public let privateKey: Curve25519.KeyAgreement.PrivateKey

    public init(privateKey: Curve25519.KeyAgreement.PrivateKey) {
        self.privateKey = privateKey
    }

    /// A new random identity.
    public static func generate() -> Identity {
        Identity(privateKey: Curve25519.KeyAgreement.PrivateKey())
    }

    /// The raw 32-byte public key.
    public var publicKey: [UInt8] { Array(privateKey.publicKey.rawRepresentation) }

    public var fingerprint: Fingerprint { Fingerprint(publicKey: publicKey) }

    // MARK: The identity file

    /// The identity file's format: a small JSON object. The private key is base64 of its 32 raw bytes.
    struct File: Codable {
        var format: String
        var version: Int
        var privateKey: String
        var publicKey: String?
    }

    /// The members every version of the file has.
    struct Header: Codable {
        var format: String
        var version: Int
    }

    static let fileFormat = "peerlink-identity"

    /// The bytes of an identity file for this identity.
    public func fileContents() -> Data {
        let file = File(
            format: Self.fileFormat, version: 1,
            privateKey: privateKey.rawRepresentation.base64EncodedString(),
            publicKey: Data(publicKey).base64EncodedString())
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        var data = (try? encoder.encode(file)) ?? Data()
        data.append(0x0A)
        return data
    }

    /// Reads an identity file's bytes. Throws a reason (without the path, which the caller adds)
    /// when they are not a PeerLink identity.
    public init(fileContents data: Data) throws(IdentityFileProblem) {
        // Format and version first: another version may lay out the rest differently.
        guard let header = try? JSONDecoder().decode(Header.self, from: data), header.format == Self.fileFormat else {
            throw .notAnIdentityFile
        }
        guard header.version == 1 else { throw .unsupportedVersion(header.version) }
        guard let file = try? JSONDecoder().decode(File.self, from: data),
            let raw = Data(base64Encoded: file.privateKey), raw.count == 32,
            let key = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: raw)
        else { throw .badPrivateKey }
        self.init(privateKey: key)
        if let stored = file.publicKey, Data(base64Encoded: stored) != Data(publicKey) {
            throw .publicKeyMismatch
        }
    }
}

/// Why the bytes of an identity file are not a usable identity.
public enum IdentityFileProblem: Error, Hashable, Sendable, CustomStringConvertible {
    case notAnIdentityFile
    case unsupportedVersion(Int)
    case badPrivateKey
    case publicKeyMismatch

    public var description: String {
        switch self {
        case .notAnIdentityFile: return "it is not a PeerLink identity file (expected JSON with format \"peerlink-identity\")"
        case .unsupportedVersion(let version): return "it has version \(version), which this PeerLink does not read (it reads version 1)"
        case .badPrivateKey: return "its private key is not 32 bytes of base64"
        case .publicKeyMismatch: return "its public key does not belong to its private key"
        }
    }
}

/// A remote or local peer as the app sees it: an identity (by fingerprint) and a display name.
/// Equal when the fingerprints are equal, whatever the names: two peers with the same display name
/// are different peers.
public struct PeerID: Hashable, Sendable, CustomStringConvertible {
    public let fingerprint: Fingerprint
    public let displayName: String

    public init(fingerprint: Fingerprint, displayName: String) {
        self.fingerprint = fingerprint
        self.displayName = displayName
    }

    public init(identity: Identity, displayName: DisplayName) {
        self.init(fingerprint: identity.fingerprint, displayName: displayName.value)
    }

    public static func == (lhs: PeerID, rhs: PeerID) -> Bool { lhs.fingerprint == rhs.fingerprint }
    public func hash(into hasher: inout Hasher) { hasher.combine(fingerprint) }

    public var description: String { "\(displayName) [\(fingerprint)]" }
}
