/// Peers reported by several browsers (one per transport) merged by identity, with no I/O: a
/// peer found over the LAN and over Bluetooth is one ``DiscoveredPeer`` holding all its
/// endpoints, best first by a ``TransportRanking``.
///
/// Each browser's events go in with the browser's name (its transport module's: `lan`,
/// `bluetooth`); out come events about merged peers: `found` when the first browser reports a
/// peer, `updated` when what the merged peer looks like changes, `lost` when the last browser
/// lost it. Name, version and discovery info come from the browser that reported the peer most
/// recently.
public struct MergedDiscovery: Sendable {
    /// The order endpoints are listed in.
    public let ranking: TransportRanking
    /// The kinds of link kept (nil: every kind); endpoints of other kinds are dropped.
    public let allowed: Set<TransportKind>?
    private var bySource: [Fingerprint: [String: DiscoveredPeer]] = [:]
    private var latestSource: [Fingerprint: String] = [:]
    private var reported: [Fingerprint: DiscoveredPeer] = [:]

    public init(ranking: TransportRanking = .standard, allowing allowed: Set<TransportKind>? = nil) {
        self.ranking = ranking
        self.allowed = allowed
    }

    /// The peers currently found, by fingerprint order.
    public var peers: [DiscoveredPeer] {
        reported.values.sorted { $0.id.fingerprint < $1.id.fingerprint }
    }

    public func peer(_ fingerprint: Fingerprint) -> DiscoveredPeer? { reported[fingerprint] }

    /// The browsers that report `fingerprint` now, by name.
    public func sources(of fingerprint: Fingerprint) -> [String] {
        (bySource[fingerprint] ?? [:]).keys.sorted()
    }

    /// Takes one event of the browser called `source`; returns the merged events it causes.
    public mutating func apply(_ event: DiscoveryEvent, from source: String) -> [DiscoveryEvent] {
        let fingerprint: Fingerprint
        switch event {
        case .found(let peer), .updated(let peer):
            fingerprint = peer.id.fingerprint
            var peer = peer
            if let allowed { peer.endpoints = peer.endpoints.filter { allowed.contains($0.kind) } }
            if peer.endpoints.isEmpty {
                bySource[fingerprint]?[source] = nil
            } else {
                bySource[fingerprint, default: [:]][source] = peer
                latestSource[fingerprint] = source
            }
        case .lost(let id):
            fingerprint = id.fingerprint
            bySource[fingerprint]?[source] = nil
        }
        return refresh(fingerprint)
    }

    private mutating func refresh(_ fingerprint: Fingerprint) -> [DiscoveryEvent] {
        let sightings = bySource[fingerprint] ?? [:]
        guard !sightings.isEmpty else {
            bySource[fingerprint] = nil
            latestSource[fingerprint] = nil
            return reported.removeValue(forKey: fingerprint).map { [.lost($0.id)] } ?? []
        }
        let latestName = latestSource[fingerprint].flatMap { sightings[$0] != nil ? $0 : nil } ?? sightings.keys.sorted().last!
        let latest = sightings[latestName]!
        let endpoints = ranking.ranked(sightings.keys.sorted().flatMap { sightings[$0]!.endpoints })
        let merged = DiscoveredPeer(id: latest.id, protocolVersion: latest.protocolVersion, endpoints: endpoints, info: latest.info)
        guard let previous = reported[fingerprint] else {
            reported[fingerprint] = merged
            return [.found(merged)]
        }
        guard previous != merged || previous.id.displayName != merged.id.displayName else { return [] }
        reported[fingerprint] = merged
        return [.updated(merged)]
    }
}
