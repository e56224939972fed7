/// How quickly a browser notices a peer that vanished without saying goodbye (power cut, link cut,
/// `kill -9`). DNS-SD caches keep such a peer for its record's TTL (Avahi: 20 s and more), so
/// PeerLink checks reachability itself: it starts a connection attempt to the peer every
/// `probeInterval` (never two at once), giving each `probeTimeout`; after `failuresBeforeLost`
/// failures in a row the peer is lost.
///
/// With the defaults derived from a 10 s `timeout` (interval and attempt 2 s each, 2 failures) a
/// peer is reported lost at most 6 s after it vanished, and always within `timeout`.
public struct LivenessPolicy: Hashable, Sendable {
    public var probeInterval: Duration
    public var probeTimeout: Duration
    public var failuresBeforeLost: Int

    /// Probing tuned so a vanished peer is reported lost within `timeout`.
    public init(timeout: Duration = .seconds(10)) {
        let step = timeout / 5
        self.probeInterval = step
        self.probeTimeout = step
        self.failuresBeforeLost = 2
    }

    public init(probeInterval: Duration, probeTimeout: Duration, failuresBeforeLost: Int) {
        self.probeInterval = probeInterval
        self.probeTimeout = probeTimeout
        self.failuresBeforeLost = max(1, failuresBeforeLost)
    }

    /// The longest time between a peer vanishing and its `lost` event.
    public var worstCaseDetection: Duration {
        probeInterval + max(probeInterval, probeTimeout) * (failuresBeforeLost - 1) + probeTimeout
    }
}

/// The browser's memory, with no I/O: service records reported by discovery, merged by identity
/// into peers, and each peer's reachability from probes. Time is a `Duration` since any fixed
/// start, passed in by the caller, so tests drive it without sleeping.
///
/// A peer is reported `found` only once a probe reached it, so a stale cache entry of a peer that
/// died before the browser started is never reported at all.
public struct DiscoveryTable: Sendable {
    /// One published record as discovery reported it. `source` names it uniquely for the
    /// discovery mechanism (e.g. interface, protocol and instance name for DNS-SD).
    public struct Sighting: Hashable, Sendable {
        public var source: String
        public var record: TXTRecord
        public var endpoints: [Endpoint]

        public init(source: String, record: TXTRecord, endpoints: [Endpoint]) {
            self.source = source
            self.record = record
            self.endpoints = endpoints
        }
    }

    /// A reachability check the caller must run, then report with ``probeFinished(_:reachable:at:)``.
    public struct Probe: Hashable, Sendable {
        public var peer: PeerID
        public var endpoints: [Endpoint]
        public var timeout: Duration
        /// Tells this probe's result from a late result of an earlier probe of the same peer.
        public var sequence: Int

        public init(peer: PeerID, endpoints: [Endpoint], timeout: Duration, sequence: Int) {
            self.peer = peer
            self.endpoints = endpoints
            self.timeout = timeout
            self.sequence = sequence
        }
    }

    struct Entry {
        var sightings: [String: Sighting] = [:]
        var latest: String = ""
        var reported: DiscoveredPeer?
        var probing = false
        var probeSequence = 0
        var nextProbe: Duration = .zero
        var probeStarted: Duration = .zero
        var failures = 0
    }

    public let policy: LivenessPolicy
    private var entries: [Fingerprint: Entry] = [:]
    private var sourceOwner: [String: Fingerprint] = [:]
    private var probeCounter = 0

    public init(policy: LivenessPolicy = LivenessPolicy()) {
        self.policy = policy
    }

    /// Peers currently reported as found.
    public var reachablePeers: [DiscoveredPeer] {
        entries.values.compactMap(\.reported).sorted { $0.id.fingerprint < $1.id.fingerprint }
    }

    /// Discovery resolved (or re-resolved) a record.
    public mutating func sighted(_ sighting: Sighting, at now: Duration) -> [DiscoveryEvent] {
        var events: [DiscoveryEvent] = []
        let fingerprint = sighting.record.fingerprint
        // A source that now carries another identity no longer speaks for the old one.
        if let previous = sourceOwner[sighting.source], previous != fingerprint {
            events += removed(source: sighting.source)
        }
        sourceOwner[sighting.source] = fingerprint
        var entry = entries[fingerprint] ?? Entry()
        let isNew = entry.sightings.isEmpty
        entry.sightings[sighting.source] = sighting
        entry.latest = sighting.source
        if isNew {
            entry.nextProbe = now
        }
        events += Self.refreshReported(&entry)
        entries[fingerprint] = entry
        return events
    }

    /// Discovery says a record is gone (goodbye packet, withdrawal, cache expiry).
    public mutating func removed(source: String) -> [DiscoveryEvent] {
        guard let fingerprint = sourceOwner.removeValue(forKey: source), var entry = entries[fingerprint] else { return [] }
        entry.sightings[source] = nil
        if entry.sightings.isEmpty {
            entries[fingerprint] = nil
            return entry.reported.map { [.lost($0.id)] } ?? []
        }
        if entry.latest == source { entry.latest = entry.sightings.keys.sorted().last ?? "" }
        let events = Self.refreshReported(&entry)
        entries[fingerprint] = entry
        return events
    }

    /// After the sightings of a reported peer changed: an `updated` event if what it looks like changed.
    private static func refreshReported(_ entry: inout Entry) -> [DiscoveryEvent] {
        guard let reported = entry.reported else { return [] }
        let merged = merge(entry)
        guard changed(merged, from: reported) else { return [] }
        entry.reported = merged
        return [.updated(merged)]
    }

    /// The probes due at `now`. Each is marked as running until its result is reported.
    public mutating func dueProbes(at now: Duration) -> [Probe] {
        var probes: [Probe] = []
        for (fingerprint, var entry) in entries where !entry.probing && entry.nextProbe <= now {
            entry.probing = true
            probeCounter += 1
            entry.probeSequence = probeCounter
            entry.probeStarted = now
            entries[fingerprint] = entry
            let merged = Self.merge(entry)
            probes.append(Probe(peer: merged.id, endpoints: merged.endpoints, timeout: policy.probeTimeout, sequence: entry.probeSequence))
        }
        return probes.sorted { $0.peer.fingerprint < $1.peer.fingerprint }
    }

    /// The earliest time a probe falls due, if any peer is known and not being probed.
    public var nextDeadline: Duration? {
        entries.values.filter { !$0.probing }.map(\.nextProbe).min()
    }

    /// A probe finished.
    public mutating func probeFinished(_ probe: Probe, reachable: Bool, at now: Duration) -> [DiscoveryEvent] {
        guard var entry = entries[probe.peer.fingerprint], entry.probing, entry.probeSequence == probe.sequence else { return [] }
        entry.probing = false
        entry.nextProbe = entry.probeStarted + policy.probeInterval
        var events: [DiscoveryEvent] = []
        if reachable {
            entry.failures = 0
            if entry.reported == nil {
                let merged = Self.merge(entry)
                entry.reported = merged
                events.append(.found(merged))
            }
        } else {
            entry.failures += 1
            // A peer never found stays unreported; a found one is lost after enough failures in a row.
            if entry.reported != nil, entry.failures >= policy.failuresBeforeLost {
                events.append(.lost(entry.reported!.id))
                entry.reported = nil
            }
        }
        entries[probe.peer.fingerprint] = entry
        return events
    }

    /// Whether a peer differs from what was reported, its display name included (`PeerID`
    /// equality, and so `DiscoveredPeer` equality, ignores the name).
    private static func changed(_ merged: DiscoveredPeer, from reported: DiscoveredPeer) -> Bool {
        merged != reported || merged.id.displayName != reported.id.displayName
    }

    private static func merge(_ entry: Entry) -> DiscoveredPeer {
        let latest = entry.sightings[entry.latest] ?? entry.sightings.values.first!
        var endpoints: [Endpoint] = []
        // The latest sighting's endpoints first, then the others', each once, in a stable order.
        for source in [entry.latest] + entry.sightings.keys.sorted() where source != entry.latest || endpoints.isEmpty {
            for endpoint in entry.sightings[source]?.endpoints ?? [] where !endpoints.contains(endpoint) {
                endpoints.append(endpoint)
            }
        }
        return DiscoveredPeer(
            id: latest.record.peerID, protocolVersion: latest.record.version,
            endpoints: endpoints, info: latest.record.info)
    }
}
