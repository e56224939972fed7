#if canImport(Glibc)
import Glibc
#endif

/// The link caps of ``ResourceLimits``, as a pure bookkeeper: which links a session holds, which
/// of them are still in their handshake and where incoming ones come from, and whether one more
/// incoming link may come in.
///
/// Its owner (a session) records every link it runs, keyed by any hashable value that stays
/// unique while the link lives, and asks ``admit(_:from:limits:at:)`` before it runs an incoming
/// link. The answer:
///
/// - over the links-per-address cap (in their handshake, or in all): refused;
/// - at the handshake cap (or the total cap) while incoming links are in their handshake: admitted,
///   and the oldest incoming link in its handshake from the address holding the most of them
///   makes room (the owner closes it). A flood of connections that never finish their
///   handshake keeps at most the cap busy, each of them for a short while: an honest peer's
///   handshake, which takes milliseconds, gets through;
/// - at the total cap with no incoming link in its handshake: refused.
///
/// Refusals are counted; ``Decision/logSummary`` says when a summary is due at info level (at
/// most once per ``summaryInterval``), so a flood never floods the log.
public struct LinkAdmission<Key: Hashable & Sendable>: Sendable {
    /// What becomes of an incoming link.
    public enum Verdict: Hashable, Sendable {
        /// Run it.
        case admit
        /// Run it, and close `key`'s link (in its handshake) to make room.
        case admitEvicting(Key)
        /// Close it at once, for `reason`.
        case refuse(reason: String)
    }

    /// An answer of ``admit(_:from:limits:at:)``.
    public struct Decision: Hashable, Sendable {
        public var verdict: Verdict
        /// Set when an info-level summary is due: links refused or evicted since the last one.
        public var logSummary: Usage?
    }

    /// What the caps have done and what the session holds now.
    public struct Usage: Hashable, Sendable {
        /// Links recorded and not yet removed.
        public var links = 0
        /// Of those, links in their handshake.
        public var handshaking = 0
        /// Incoming links refused since the start (or since the last summary, in a summary).
        public var refused = 0
        /// Incoming links in their handshake closed to make room for a newer one.
        public var evicted = 0

        public init(links: Int = 0, handshaking: Int = 0, refused: Int = 0, evicted: Int = 0) {
            self.links = links
            self.handshaking = handshaking
            self.refused = refused
            self.evicted = evicted
        }
    }

    private struct Entry {
        let origin: String?
        let incoming: Bool
        var handshaking: Bool
        let order: UInt64
    }

    /// At most one info-level summary of refusals per this much time.
    public static var summaryInterval: Duration { .seconds(10) }

    private var entries: [Key: Entry] = [:]
    private var nextOrder: UInt64 = 0
    private var totals = Usage()
    private var sinceSummary = Usage()
    private var lastSummary: Duration?

    public init() {}

    /// Counts now (links, in their handshake) and since the start (refused, evicted).
    public var usage: Usage {
        var usage = totals
        usage.links = entries.count
        usage.handshaking = entries.values.count { $0.handshaking }
        return usage
    }

    /// Decides about a new incoming link `key` from `origin` (see ``origin(ofRemote:)``); an
    /// admitted link is recorded, in its handshake.
    public mutating func admit(_ key: Key, from origin: String?, limits: ResourceLimits, at now: Duration) -> Decision {
        let verdict = decide(origin: origin, limits: limits)
        switch verdict {
        case .admit:
            record(key, origin: origin, incoming: true)
        case .admitEvicting(let victim):
            entries[victim] = nil
            totals.evicted += 1
            sinceSummary.evicted += 1
            record(key, origin: origin, incoming: true)
        case .refuse:
            totals.refused += 1
            sinceSummary.refused += 1
        }
        var summary: Usage?
        if verdict != .admit, lastSummary.map({ now - $0 >= Self.summaryInterval }) ?? true {
            summary = sinceSummary
            summary?.links = entries.count
            summary?.handshaking = entries.values.count { $0.handshaking }
            sinceSummary = Usage()
            lastSummary = now
        }
        return Decision(verdict: verdict, logSummary: summary)
    }

    /// Records a link the owner runs without asking (one it dialled): it counts towards the
    /// caps and is never evicted. When it brings the links in their handshake (or all links)
    /// over a cap, the oldest incoming link still in its handshake makes room: the returned key,
    /// which the owner closes. Recording a key again changes nothing.
    @discardableResult
    public mutating func opened(_ key: Key, from origin: String?, limits: ResourceLimits = .default) -> Key? {
        guard entries[key] == nil else { return nil }
        record(key, origin: origin, incoming: false)
        let overHandshakeCap = entries.values.count { $0.handshaking } > limits.maximumHandshakingLinks
        let overTotalCap = entries.count > limits.maximumLinks
        guard overHandshakeCap || overTotalCap, let victim = oldestEvictable() else { return nil }
        entries[victim] = nil
        totals.evicted += 1
        sinceSummary.evicted += 1
        return victim
    }

    /// The link finished its handshake.
    public mutating func established(_ key: Key) {
        entries[key]?.handshaking = false
    }

    /// The link is gone (or never ran).
    public mutating func removed(_ key: Key) {
        entries[key] = nil
    }

    /// Whether `key` is recorded (and not evicted).
    public func contains(_ key: Key) -> Bool { entries[key] != nil }

    private mutating func record(_ key: Key, origin: String?, incoming: Bool) {
        entries[key] = Entry(origin: origin, incoming: incoming, handshaking: true, order: nextOrder)
        nextOrder += 1
    }

    private func decide(origin: String?, limits: ResourceLimits) -> Verdict {
        let here = entries.values.filter { origin != nil && $0.origin == origin }
        if let origin {
            let handshakingHere = here.count { $0.handshaking && $0.incoming }
            if handshakingHere >= limits.maximumHandshakingLinksPerAddress {
                return .refuse(
                    reason: "too many links from \(origin) in their handshake (\(limits.maximumHandshakingLinksPerAddress))")
            }
            if here.count >= limits.maximumLinksPerAddress {
                return .refuse(reason: "too many links from \(origin) (\(limits.maximumLinksPerAddress))")
            }
        }
        let handshaking = entries.values.count { $0.handshaking }
        let atHandshakeCap = handshaking >= limits.maximumHandshakingLinks
        let atTotalCap = entries.count >= limits.maximumLinks
        guard atHandshakeCap || atTotalCap else { return .admit }
        if let victim = oldestEvictable() { return .admitEvicting(victim) }
        return .refuse(
            reason: atTotalCap
                ? "too many links (\(limits.maximumLinks))"
                : "too many links in their handshake (\(limits.maximumHandshakingLinks))")
    }

    /// The oldest incoming link in its handshake from the origin holding the most of them.
    private func oldestEvictable() -> Key? {
        var perOrigin: [String: Int] = [:]
        for entry in entries.values where entry.incoming && entry.handshaking {
            perOrigin[entry.origin ?? "", default: 0] += 1
        }
        guard let most = perOrigin.values.max() else { return nil }
        return entries
            .filter { $0.value.incoming && $0.value.handshaking && perOrigin[$0.value.origin ?? ""] == most }
            .min { $0.value.order < $1.value.order }?
            .key
    }

    /// Where an incoming link comes from, for the per-address caps: the origin of its endpoint
    /// (``EndpointAddress/origin``: the host of a `tcp://HOST:PORT` description, the device
    /// address of a `bt://…` one) when a registered scheme reads the description, else the
    /// authority of a `SCHEME://AUTHORITY/…` text without its port (a session may run without
    /// any scheme registered); nil when the description says nothing usable (then only the
    /// session-wide caps apply).
    public static func origin(ofRemote description: String) -> String? {
        if let endpoint = try? Endpoint(parsing: description), let origin = endpoint.address.origin { return origin }
        guard let separator = description.range(of: "://") else { return nil }
        let authority = description[separator.upperBound...].prefix { $0 != "/" }
        if authority.hasPrefix("[") {
            // [IPv6]:PORT
            guard let close = authority.firstIndex(of: "]") else { return nil }
            let host = authority[authority.index(after: authority.startIndex)..<close]
            return host.isEmpty ? nil : String(host)
        }
        // HOST:PORT has one colon; a device address (00:AA:01:00:00:00) has five and no port
        let host = authority.count(where: { $0 == ":" }) == 1 ? authority.prefix { $0 != ":" } : authority
        return isMachineAddress(host) ? String(host) : nil
    }

    /// A numeric IP address (the zone of a link-local IPv6 one included) or a Bluetooth device
    /// address: something that names one machine.
    static func isMachineAddress(_ text: Substring) -> Bool {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        if parts.count == 6, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isHexDigit) }) { return true }
        let address = text.prefix { $0 != "%" }
        var v4 = in_addr(), v6 = in6_addr()
        return inet_pton(AF_INET, String(address), &v4) == 1 || inet_pton(AF_INET6, String(address), &v6) == 1
    }
}
