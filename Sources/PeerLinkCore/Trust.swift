import Crypto
import Foundation

/// Peers this user has met before, by fingerprint, with the display name each used: trust on first
/// use. A display name known under one key that arrives with another key is flagged, loudly — it
/// may be a different device of the same person, or somebody pretending to be them.
public struct KnownPeers: Hashable, Sendable {
    public struct Entry: Hashable, Sendable, Codable {
        public var fingerprint: Fingerprint
        public var displayName: String
        /// Seconds since 1970 when first seen.
        public var firstSeen: Double

        public init(fingerprint: Fingerprint, displayName: String, firstSeen: Double) {
            self.fingerprint = fingerprint
            self.displayName = displayName
            self.firstSeen = firstSeen
        }
    }

    /// What meeting a peer means.
    public enum Verdict: Hashable, Sendable {
        /// Seen before with this key.
        case known
        /// Never seen: remembered from now on (trust on first use).
        case new
        /// Its display name belongs to other keys this user has met: possibly an impostor.
        case nameConflict(knownFingerprints: [Fingerprint])
    }

    public private(set) var entries: [Fingerprint: Entry] = [:]

    public init(entries: [Entry] = []) {
        for entry in entries { self.entries[entry.fingerprint] = entry }
    }

    /// Judges a peer and remembers it. A peer with a known key is `known` whatever name it uses now
    /// (its name is updated); a new key whose name another key used is a `nameConflict`.
    public mutating func meet(_ peer: PeerID, at time: Double) -> Verdict {
        if var entry = entries[peer.fingerprint] {
            entry.displayName = peer.displayName
            entries[peer.fingerprint] = entry
            return .known
        }
        let others = entries.values.filter { $0.displayName == peer.displayName }.map(\.fingerprint).sorted()
        entries[peer.fingerprint] = Entry(fingerprint: peer.fingerprint, displayName: peer.displayName, firstSeen: time)
        return others.isEmpty ? .new : .nameConflict(knownFingerprints: others)
    }

    /// Whether a peer's key has been met before (without remembering it).
    public func isKnown(_ fingerprint: Fingerprint) -> Bool { entries[fingerprint] != nil }

    // MARK: File

    struct File: Codable {
        var format: String
        var version: Int
        var peers: [Entry]
    }

    static let fileFormat = "peerlink-known-peers"

    public func fileContents() -> Data {
        let file = File(format: Self.fileFormat, version: 1, peers: entries.values.sorted { $0.fingerprint < $1.fingerprint })
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        var data = (try? encoder.encode(file)) ?? Data()
        data.append(0x0A)
        return data
    }

    /// Reads a known-peers file; nil when it is not one.
    public init?(fileContents data: Data) {
        guard let file = try? JSONDecoder().decode(File.self, from: data), file.format == Self.fileFormat, file.version == 1 else {
            return nil
        }
        self.init(entries: file.peers)
    }
}

/// A short code both users read out to check they talk to each other and nobody sits between:
/// six digits taken from the secure channel's handshake hash, which is the same on both sides of
/// one link and different on every link a man in the middle would have to run.
public enum VerificationCode {
    public static func digits(handshakeHash: some DataProtocol) -> String {
        var hasher = SHA256()
        hasher.update(data: Array("PeerLink verification code".utf8))
        hasher.update(data: Array(handshakeHash))
        let digest = Array(hasher.finalize())
        let value = (UInt32(digest[0]) << 24 | UInt32(digest[1]) << 16 | UInt32(digest[2]) << 8 | UInt32(digest[3])) % 1_000_000
        let text = String(value)
        let padded = String(repeating: "0", count: 6 - text.count) + text
        return padded.prefix(3) + " " + padded.suffix(3)
    }
}
