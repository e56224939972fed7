/// Which transports a peer uses: `lan` (TCP found through DNS-SD), `bluetooth` (L2CAP and
/// RFCOMM found through SDP), or `auto` — both, LAN first, Bluetooth as the fallback.
public enum TransportSelection: String, Hashable, Sendable, CaseIterable {
    case lan
    case bluetooth
    case auto

    public var usesLAN: Bool { self != .bluetooth }
    public var usesBluetooth: Bool { self != .lan }

    /// Whether an endpoint is on a transport of this selection (memory endpoints always are).
    public func allows(_ endpoint: Endpoint) -> Bool {
        switch endpoint {
        case .tcp: return usesLAN
        case .rfcomm, .l2cap: return usesBluetooth
        case .memory: return true
        }
    }

    /// The allowed endpoints in the order to dial them: TCP (fastest), then L2CAP (packets with a
    /// negotiated MTU), then RFCOMM; the order among endpoints of one kind is kept.
    public func ranked(_ endpoints: [Endpoint]) -> [Endpoint] {
        func rank(_ endpoint: Endpoint) -> Int {
            switch endpoint {
            case .tcp: return 0
            case .memory: return 1
            case .l2cap: return 2
            case .rfcomm: return 3
            }
        }
        var seen: Set<Endpoint> = []
        let unique = endpoints.filter { allows($0) && seen.insert($0).inserted }
        return unique.enumerated().sorted { (rank($0.element), $0.offset) < (rank($1.element), $1.offset) }.map(\.element)
    }
}

/// Peers reported by several browsers (one per transport) merged by identity, with no I/O: a
/// peer found over the LAN and over Bluetooth is one ``DiscoveredPeer`` holding all its
/// endpoints, ranked by ``TransportSelection/ranked(_:)``.
///
/// Each browser's events go in with the browser's name; out come events about merged peers:
/// `found` when the first browser reports a peer, `updated` when what the merged peer looks
/// like changes, `lost` when the last browser lost it. Name, version and discovery info come
/// from the browser that reported the peer most recently.
public struct MergedDiscovery: Sendable {
    public let selection: TransportSelection
    private var bySource: [Fingerprint: [String: DiscoveredPeer]] = [:]
    private var latestSource: [Fingerprint: String] = [:]
    private var reported: [Fingerprint: DiscoveredPeer] = [:]

    public init(selection: TransportSelection = .auto) {
        self.selection = selection
    }

    /// The peers currently found, by fingerprint order.
    public var peers: [DiscoveredPeer] {
        reported.values.sorted { $0.id.fingerprint < $1.id.fingerprint }
    }

    public func peer(_ fingerprint: Fingerprint) -> DiscoveredPeer? { reported[fingerprint] }

    /// Takes one event of the browser called `source`; returns the merged events it causes.
    public mutating func apply(_ event: DiscoveryEvent, from source: String) -> [DiscoveryEvent] {
        let fingerprint: Fingerprint
        switch event {
        case .found(let peer), .updated(let peer):
            fingerprint = peer.id.fingerprint
            var peer = peer
            peer.endpoints = peer.endpoints.filter(selection.allows)
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
        let endpoints = selection.ranked(sightings.keys.sorted().flatMap { sightings[$0]!.endpoints })
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
