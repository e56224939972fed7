import Crypto
import Foundation

/// Peers this user has met before, by fingerprint, with the display name each used: trust on first
/// use. A display name known under one key that arrives with another key is flagged, loudly — it
/// may be a different device of the same person, or somebody pretending to be them.
///
/// The list is capped (``ResourceLimits/maximumKnownPeers``): beyond it the peers seen least
/// recently are forgotten first, except those marked ``Entry/trusted``. So peers joining with
/// throwaway keys cannot grow it without bound.
public struct KnownPeers: Hashable, Sendable {
    public struct Entry: Hashable, Sendable, Codable {
        public var fingerprint: Fingerprint
        public var displayName: String
        /// Seconds since 1970 when first seen.
        public var firstSeen: Double
        /// Seconds since 1970 when last seen, to the ``KnownPeers/lastSeenResolution`` (a file
        /// without it: when first seen).
        public var lastSeen: Double
        /// Kept whatever the cap: a peer the user vouched for (`"trusted": true` in the file).
        public var trusted: Bool

        public init(fingerprint: Fingerprint, displayName: String, firstSeen: Double, lastSeen: Double? = nil, trusted: Bool = false) {
            self.fingerprint = fingerprint
            self.displayName = displayName
            self.firstSeen = firstSeen
            self.lastSeen = lastSeen ?? firstSeen
            self.trusted = trusted
        }

        enum CodingKeys: String, CodingKey {
            case fingerprint, displayName, firstSeen, lastSeen, trusted
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            fingerprint = try container.decode(Fingerprint.self, forKey: .fingerprint)
            displayName = try container.decode(String.self, forKey: .displayName)
            firstSeen = try container.decode(Double.self, forKey: .firstSeen)
            lastSeen = try container.decodeIfPresent(Double.self, forKey: .lastSeen) ?? firstSeen
            trusted = try container.decodeIfPresent(Bool.self, forKey: .trusted) ?? false
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(fingerprint, forKey: .fingerprint)
            try container.encode(displayName, forKey: .displayName)
            try container.encode(firstSeen, forKey: .firstSeen)
            try container.encode(lastSeen, forKey: .lastSeen)
            if trusted { try container.encode(true, forKey: .trusted) }
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

    /// The outcome of ``record(_:at:limit:)``.
    public struct Meeting: Hashable, Sendable {
        public var verdict: Verdict
        /// Whether the list changed (a new peer, a new name, a last-seen day, peers forgotten):
        /// only then is there anything to save.
        public var changed: Bool
        /// Peers forgotten to keep to the cap, least recently seen first.
        public var forgotten: [Fingerprint]
    }

    /// Last-seen times move in steps of this many seconds (a day), so meeting a known peer again
    /// changes nothing to save most of the time.
    public static let lastSeenResolution: Double = 86_400

    public private(set) var entries: [Fingerprint: Entry] = [:]

    public init(entries: [Entry] = []) {
        for entry in entries { self.entries[entry.fingerprint] = entry }
    }

    /// Judges a peer and remembers it. A peer with a known key is `known` whatever name it uses now
    /// (its name is updated); a new key whose name another key used is a `nameConflict`. The list
    /// keeps to ``ResourceLimits/maximumKnownPeers`` of the default limits.
    public mutating func meet(_ peer: PeerID, at time: Double) -> Verdict {
        record(peer, at: time, limit: ResourceLimits.default.maximumKnownPeers).verdict
    }

    /// ``meet(_:at:)``, saying whether anything changed, and keeping to `limit` peers: beyond it
    /// the peers seen least recently are forgotten (never a trusted one, never the one met now).
    public mutating func record(_ peer: PeerID, at time: Double, limit: Int) -> Meeting {
        let day = (time / Self.lastSeenResolution).rounded(.down) * Self.lastSeenResolution
        if var entry = entries[peer.fingerprint] {
            let before = entry
            entry.displayName = peer.displayName
            entry.lastSeen = max(entry.lastSeen, day)
            entries[peer.fingerprint] = entry
            let forgotten = prune(to: limit, keeping: peer.fingerprint)
            return Meeting(verdict: .known, changed: entry != before || !forgotten.isEmpty, forgotten: forgotten)
        }
        let others = entries.values.filter { $0.displayName == peer.displayName }.map(\.fingerprint).sorted()
        entries[peer.fingerprint] = Entry(fingerprint: peer.fingerprint, displayName: peer.displayName, firstSeen: time, lastSeen: day)
        let forgotten = prune(to: limit, keeping: peer.fingerprint)
        return Meeting(verdict: others.isEmpty ? .new : .nameConflict(knownFingerprints: others), changed: true, forgotten: forgotten)
    }

    /// Whether a peer's key has been met before (without remembering it).
    public func isKnown(_ fingerprint: Fingerprint) -> Bool { entries[fingerprint] != nil }

    /// Forgets untrusted peers, least recently seen first, until at most `limit` are left (or
    /// only trusted ones and `kept`).
    private mutating func prune(to limit: Int, keeping kept: Fingerprint) -> [Fingerprint] {
        guard entries.count > limit else { return [] }
        let candidates = entries.values
            .filter { !$0.trusted && $0.fingerprint != kept }
            .sorted { ($0.lastSeen, $0.firstSeen, $0.fingerprint) < ($1.lastSeen, $1.firstSeen, $1.fingerprint) }
        let forgotten = candidates.prefix(entries.count - max(limit, 0)).map(\.fingerprint)
        for fingerprint in forgotten { entries[fingerprint] = nil }
        return forgotten
    }

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
