import PeerLinkCore
import Testing

// MARK: - Fixtures

private enum Fixture {
    static let a = Fingerprint(publicKey: [UInt8](repeating: 0x0A, count: 32))
    static let b = Fingerprint(publicKey: [UInt8](repeating: 0x0B, count: 32))
    static let v4 = Endpoint.tcp(host: "10.99.0.2", port: 7000)
    static let v6 = Endpoint.tcp(host: "fe80::2%eth0", port: 7000)
    static let v4b = Endpoint.tcp(host: "10.99.0.3", port: 7001)

    static func sighting(
        _ source: String, _ fingerprint: Fingerprint = a, name: String = "Ana", version: Int = 1,
        info: [String: String] = [:], endpoints: [Endpoint] = [v4]
    ) -> DiscoveryTable.Sighting {
        let record = TXTRecord(version: version, fingerprint: fingerprint, displayName: name, info: try! DiscoveryInfo(info))
        return DiscoveryTable.Sighting(source: source, record: record, endpoints: endpoints)
    }

    static func peer(
        _ fingerprint: Fingerprint = a, name: String = "Ana", version: Int = 1,
        info: [String: String] = [:], endpoints: [Endpoint] = [v4]
    ) -> DiscoveredPeer {
        DiscoveredPeer(
            id: PeerID(fingerprint: fingerprint, displayName: name), protocolVersion: version,
            endpoints: endpoints, info: try! DiscoveryInfo(info))
    }

    static func id(_ fingerprint: Fingerprint = a) -> PeerID { PeerID(fingerprint: fingerprint, displayName: "Ana") }
}

extension DiscoveryEvent {
    /// The peer of a `found` or `updated` event.
    fileprivate var peer: DiscoveredPeer? {
        switch self {
        case .found(let peer), .updated(let peer): return peer
        case .lost: return nil
        }
    }

    fileprivate var isLost: Bool {
        if case .lost = self { return true }
        return false
    }
}

/// Starts the probe of `fingerprint`, which must be due at `start`, and reports it finished at
/// `end` (default: at once).
private func probe(
    _ table: inout DiscoveryTable, _ fingerprint: Fingerprint = Fixture.a, reachable: Bool,
    start: Duration, end: Duration? = nil, sourceLocation: SourceLocation = #_sourceLocation
) -> [DiscoveryEvent] {
    guard let due = table.dueProbes(at: start).first(where: { $0.peer.fingerprint == fingerprint }) else {
        Issue.record("no probe of \(fingerprint) due at \(start)", sourceLocation: sourceLocation)
        return []
    }
    return table.probeFinished(due, reachable: reachable, at: end ?? start)
}

/// A table in which peer `a` (one source "s", endpoint v4) was found at time 0.
private func tableWithFoundPeer() -> DiscoveryTable {
    var table = DiscoveryTable()
    _ = table.sighted(Fixture.sighting("s"), at: .zero)
    let events = probe(&table, reachable: true, start: .zero)
    #expect(events == [.found(Fixture.peer())])
    return table
}

// MARK: - Reporting

@Suite("DiscoveryTable: found only once reachable, lost after failed probes")
struct DiscoveryTableTests {
    @Test func notReportedUntilAProbeSucceeds() throws {
        var table = DiscoveryTable()
        #expect(table.nextDeadline == nil)
        #expect(table.sighted(Fixture.sighting("s"), at: .zero).isEmpty)
        #expect(table.reachablePeers.isEmpty)
        #expect(table.nextDeadline == .zero)

        let probes = table.dueProbes(at: .zero)
        #expect(probes.count == 1)
        let due = try #require(probes.first)
        #expect(due.peer == Fixture.id())
        #expect(due.peer.displayName == "Ana")
        #expect(due.endpoints == [Fixture.v4])
        #expect(due.timeout == table.policy.probeTimeout)
        #expect(table.nextDeadline == nil)  // the only peer is being probed
        #expect(table.reachablePeers.isEmpty)

        let events = table.probeFinished(due, reachable: true, at: .milliseconds(30))
        #expect(events == [.found(Fixture.peer())])
        #expect(events.first?.peer?.id.displayName == "Ana")
        #expect(table.reachablePeers == [Fixture.peer()])
        #expect(table.nextDeadline == .seconds(2))  // probe start + interval

        // A result for a probe that is not running is ignored.
        #expect(table.probeFinished(due, reachable: false, at: .milliseconds(40)).isEmpty)
        #expect(table.probeFinished(DiscoveryTable.Probe(peer: Fixture.id(Fixture.b), endpoints: [], timeout: .seconds(2), sequence: 0), reachable: true, at: .milliseconds(40)).isEmpty)
        #expect(table.reachablePeers == [Fixture.peer()])
    }

    @Test func failedProbesBeforeFoundReportNothing() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("s"), at: .seconds(5))
        #expect(table.nextDeadline == .seconds(5))
        // A link cut: the attempt runs for the whole timeout.
        #expect(probe(&table, reachable: false, start: .seconds(5), end: .milliseconds(6_500)).isEmpty)
        #expect(table.nextDeadline == .seconds(7))  // start + interval
        #expect(table.dueProbes(at: .milliseconds(6_999)).isEmpty)
        // Many refusals in a row: still nothing, neither found nor lost.
        for step in 0..<10 {
            let start = Duration.seconds(7 + 2 * step)
            #expect(probe(&table, reachable: false, start: start).isEmpty)
            #expect(table.nextDeadline == start + .seconds(2))
        }
        #expect(table.reachablePeers.isEmpty)
        #expect(probe(&table, reachable: true, start: .seconds(27)) == [.found(Fixture.peer())])
    }

    @Test func lostExactlyAtTheSecondConsecutiveFailure() {
        var table = tableWithFoundPeer()
        #expect(probe(&table, reachable: false, start: .seconds(2), end: .seconds(4)).isEmpty)
        #expect(table.reachablePeers == [Fixture.peer()])
        #expect(probe(&table, reachable: false, start: .seconds(4), end: .seconds(6)) == [.lost(Fixture.id())])
        #expect(table.reachablePeers.isEmpty)
        // Still probed (the record is still published), but nothing more to report while it fails.
        #expect(table.nextDeadline == .seconds(6))
        #expect(probe(&table, reachable: false, start: .seconds(6)).isEmpty)
    }

    @Test func aSuccessInBetweenResetsTheCount() {
        var table = tableWithFoundPeer()
        #expect(probe(&table, reachable: false, start: .seconds(2)).isEmpty)
        #expect(probe(&table, reachable: true, start: .seconds(4)).isEmpty)
        #expect(probe(&table, reachable: false, start: .seconds(6)).isEmpty)
        #expect(probe(&table, reachable: true, start: .seconds(8)).isEmpty)
        #expect(probe(&table, reachable: false, start: .seconds(10)).isEmpty)
        #expect(probe(&table, reachable: false, start: .seconds(12)) == [.lost(Fixture.id())])
    }

    @Test func foundAgainAfterLost() {
        var table = tableWithFoundPeer()
        _ = probe(&table, reachable: false, start: .seconds(2))
        #expect(probe(&table, reachable: false, start: .seconds(4)) == [.lost(Fixture.id())])
        #expect(probe(&table, reachable: false, start: .seconds(6)).isEmpty)
        #expect(probe(&table, reachable: true, start: .seconds(8)) == [.found(Fixture.peer())])
        #expect(table.reachablePeers == [Fixture.peer()])
        // And the count starts afresh: one failure is not enough.
        #expect(probe(&table, reachable: false, start: .seconds(10)).isEmpty)
        #expect(probe(&table, reachable: false, start: .seconds(12)) == [.lost(Fixture.id())])
    }

    // MARK: Withdrawals

    @Test func removingTheOnlySourceOfAFoundPeer() {
        var table = tableWithFoundPeer()
        #expect(table.removed(source: "s") == [.lost(Fixture.id())])
        #expect(table.reachablePeers.isEmpty)
        #expect(table.nextDeadline == nil)
        #expect(table.dueProbes(at: .seconds(100)).isEmpty)
        #expect(table.removed(source: "s").isEmpty)
        // Sighted again: a new peer record, reported only once probed.
        #expect(table.sighted(Fixture.sighting("s"), at: .seconds(200)).isEmpty)
        #expect(probe(&table, reachable: true, start: .seconds(200)) == [.found(Fixture.peer())])
    }

    @Test func removingANeverFoundPeerReportsNothing() {
        var table = DiscoveryTable()
        #expect(table.removed(source: "unknown").isEmpty)
        _ = table.sighted(Fixture.sighting("s"), at: .zero)
        #expect(table.removed(source: "s").isEmpty)
        #expect(table.nextDeadline == nil)

        // Withdrawn while its probe runs: the late result is ignored.
        _ = table.sighted(Fixture.sighting("s"), at: .seconds(1))
        let due = table.dueProbes(at: .seconds(1))
        #expect(due.count == 1)
        #expect(table.removed(source: "s").isEmpty)
        #expect(table.probeFinished(DiscoveryTable.Probe(peer: Fixture.id(), endpoints: [], timeout: .seconds(2), sequence: 0), reachable: true, at: .seconds(2)).isEmpty)
        #expect(table.reachablePeers.isEmpty)
    }

    @Test func aLateResultOfAnEarlierProbeIsIgnored() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("s"), at: .zero)
        let first = table.dueProbes(at: .zero)[0]
        // Withdrawn and seen again while the first probe still runs; a second probe starts.
        _ = table.removed(source: "s")
        _ = table.sighted(Fixture.sighting("s"), at: .seconds(1))
        let second = table.dueProbes(at: .seconds(1))[0]
        #expect(first.sequence != second.sequence)
        #expect(table.probeFinished(first, reachable: true, at: .seconds(1)).isEmpty)
        #expect(table.reachablePeers.isEmpty)
        #expect(table.probeFinished(second, reachable: true, at: .seconds(1)).count == 1)
    }

    @Test func removingALostPeerReportsNothingMore() {
        var table = tableWithFoundPeer()
        _ = probe(&table, reachable: false, start: .seconds(2))
        #expect(probe(&table, reachable: false, start: .seconds(4)) == [.lost(Fixture.id())])
        #expect(table.removed(source: "s").isEmpty)
    }

    // MARK: Merging sources

    @Test func twoSourcesMergeIntoOnePeer() throws {
        var table = DiscoveryTable()
        #expect(table.sighted(Fixture.sighting("eth0 IPv4", endpoints: [Fixture.v4]), at: .zero).isEmpty)
        #expect(table.sighted(Fixture.sighting("eth0 IPv6", endpoints: [Fixture.v6]), at: .zero).isEmpty)

        let probes = table.dueProbes(at: .zero)
        #expect(probes.count == 1)
        let due = try #require(probes.first)
        #expect(Set(due.endpoints) == [Fixture.v4, Fixture.v6])
        #expect(due.endpoints.count == 2)

        let found = table.probeFinished(due, reachable: true, at: .zero)
        // The latest sighting's endpoints come first.
        #expect(found == [.found(Fixture.peer(endpoints: [Fixture.v6, Fixture.v4]))])
        #expect(table.reachablePeers.count == 1)

        #expect(table.removed(source: "eth0 IPv4") == [.updated(Fixture.peer(endpoints: [Fixture.v6]))])
        #expect(table.removed(source: "eth0 IPv6") == [.lost(Fixture.id())])
        #expect(table.reachablePeers.isEmpty)
    }

    @Test func unionOfEndpointsHasNoDuplicates() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("eth0 IPv4", endpoints: [Fixture.v4]), at: .zero)
        _ = table.sighted(Fixture.sighting("eth0 IPv6", endpoints: [Fixture.v6, Fixture.v4]), at: .zero)
        _ = table.sighted(Fixture.sighting("eth1 IPv4", endpoints: [Fixture.v4, Fixture.v4b]), at: .zero)
        let found = probe(&table, reachable: true, start: .zero)
        #expect(found == [.found(Fixture.peer(endpoints: [Fixture.v4, Fixture.v4b, Fixture.v6]))])
        // A source whose endpoints the others also carry changes nothing when it goes.
        #expect(table.removed(source: "eth0 IPv4").isEmpty)
        #expect(table.removed(source: "eth0 IPv6") == [.updated(Fixture.peer(endpoints: [Fixture.v4, Fixture.v4b]))])
    }

    @Test func aSecondSourceOfAFoundPeerIsAnUpdate() {
        var table = tableWithFoundPeer()
        #expect(table.sighted(Fixture.sighting("s6", endpoints: [Fixture.v6]), at: .seconds(1))
            == [.updated(Fixture.peer(endpoints: [Fixture.v6, Fixture.v4]))])
        // Only one probe for the merged peer, not one per source.
        #expect(table.dueProbes(at: .seconds(2)).count == 1)
    }

    @Test func reSightingAFoundPeer() {
        var table = tableWithFoundPeer()
        #expect(table.sighted(Fixture.sighting("s"), at: .seconds(1)).isEmpty)  // unchanged

        let newInfo = table.sighted(Fixture.sighting("s", info: ["color": "blue"]), at: .seconds(1))
        #expect(newInfo == [.updated(Fixture.peer(info: ["color": "blue"]))])
        #expect(newInfo.first?.peer?.info["color"] == "blue")

        let moved = table.sighted(Fixture.sighting("s", info: ["color": "blue"], endpoints: [Fixture.v4b]), at: .seconds(1))
        #expect(moved == [.updated(Fixture.peer(info: ["color": "blue"], endpoints: [Fixture.v4b]))])

        let newVersion = table.sighted(
            Fixture.sighting("s", version: 2, info: ["color": "blue"], endpoints: [Fixture.v4b]), at: .seconds(1))
        #expect(newVersion.first?.peer?.protocolVersion == 2)

        #expect(table.reachablePeers == [Fixture.peer(version: 2, info: ["color": "blue"], endpoints: [Fixture.v4b])])
    }

    /// `updated` is documented as "changed its endpoints, name or discovery info"; a peer's
    /// equality ignores its name (a PeerID is its fingerprint), so a new name alone must still count.
    @Test func aNewDisplayNameIsAnUpdate() throws {
        var table = tableWithFoundPeer()
        let events = table.sighted(Fixture.sighting("s", name: "Ana (work)"), at: .seconds(1))
        #expect(events.count == 1)
        let updated = try #require(events.first?.peer)
        #expect(updated.id.displayName == "Ana (work)")
        #expect(table.reachablePeers.first?.id.displayName == "Ana (work)")
        #expect(table.dueProbes(at: .seconds(2)).first?.peer.displayName == "Ana (work)")
    }

    @Test func aSourceNowCarryingAnotherIdentity() {
        var table = tableWithFoundPeer()
        // The service instance "s" now belongs to another peer (say the machine got a new identity).
        #expect(table.sighted(Fixture.sighting("s", Fixture.b, name: "Bob"), at: .seconds(1)) == [.lost(Fixture.id())])
        #expect(table.reachablePeers.isEmpty)
        let probes = table.dueProbes(at: .seconds(1))
        #expect(probes.map(\.peer.fingerprint) == [Fixture.b])
        #expect(table.probeFinished(probes[0], reachable: true, at: .seconds(1))
            == [.found(Fixture.peer(Fixture.b, name: "Bob"))])
        // Withdrawing "s" now concerns the new owner only.
        #expect(table.removed(source: "s") == [.lost(PeerID(fingerprint: Fixture.b, displayName: "Bob"))])
    }

    @Test func aSourceChangingIdentityBeforeFoundReportsNothing() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("s"), at: .zero)
        #expect(table.sighted(Fixture.sighting("s", Fixture.b, name: "Bob"), at: .zero).isEmpty)
        #expect(table.dueProbes(at: .zero).map(\.peer.fingerprint) == [Fixture.b])
    }

    @Test func aSourceChangingIdentityLeavesTheOldPeersOtherSources() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("s4", endpoints: [Fixture.v4]), at: .zero)
        _ = table.sighted(Fixture.sighting("s6", endpoints: [Fixture.v6]), at: .zero)
        _ = probe(&table, reachable: true, start: .zero)
        #expect(table.sighted(Fixture.sighting("s6", Fixture.b, name: "Bob", endpoints: [Fixture.v6]), at: .seconds(1))
            == [.updated(Fixture.peer(endpoints: [Fixture.v4]))])
    }

    // MARK: Probe scheduling

    @Test func dueProbesNeverReturnsAPeerBeingProbed() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("sa", Fixture.a), at: .zero)
        _ = table.sighted(Fixture.sighting("sb", Fixture.b, name: "Bob"), at: .seconds(1))
        let probeOfA = table.dueProbes(at: .zero)
        #expect(probeOfA.map(\.peer.fingerprint) == [Fixture.a])
        #expect(table.nextDeadline == .seconds(1))
        #expect(table.dueProbes(at: .seconds(1)).map(\.peer.fingerprint) == [Fixture.b])
        #expect(table.nextDeadline == nil)
        // However long a probe runs, there is never a second one for the same peer.
        #expect(table.dueProbes(at: .seconds(100)).isEmpty)
        #expect(table.dueProbes(at: .seconds(1_000)).isEmpty)
        // Re-sighting a peer being probed does not start another probe either.
        _ = table.sighted(Fixture.sighting("sa", Fixture.a, info: ["k": "v"]), at: .seconds(100))
        #expect(table.dueProbes(at: .seconds(100)).isEmpty)
        // Once a's probe ends (late), only a is due again.
        _ = table.probeFinished(probeOfA[0], reachable: true, at: .seconds(100))
        #expect(table.dueProbes(at: .seconds(100)).map(\.peer.fingerprint) == [Fixture.a])
    }

    @Test func probesOfSeveralPeersComeInFingerprintOrder() {
        var table = DiscoveryTable()
        _ = table.sighted(Fixture.sighting("sb", Fixture.b, name: "Bob"), at: .zero)
        _ = table.sighted(Fixture.sighting("sa", Fixture.a), at: .zero)
        let expected = [Fixture.a, Fixture.b].sorted()
        #expect(table.dueProbes(at: .zero).map(\.peer.fingerprint) == expected)
    }
}

// MARK: - Liveness policy

@Suite("LivenessPolicy: how soon a vanished peer is lost")
struct LivenessPolicyTests {
    @Test func defaultsFromATenSecondTimeout() {
        let policy = LivenessPolicy(timeout: .seconds(10))
        #expect(policy.probeInterval == .seconds(2))
        #expect(policy.probeTimeout == .seconds(2))
        #expect(policy.failuresBeforeLost == 2)
        #expect(policy.worstCaseDetection == .seconds(6))
        #expect(policy.worstCaseDetection <= .seconds(10))
        #expect(LivenessPolicy() == policy)
        #expect(DiscoveryTable().policy == policy)
    }

    @Test(arguments: [1, 5, 10, 30, 60])
    func worstCaseIsWithinTheTimeout(_ seconds: Int) {
        let policy = LivenessPolicy(timeout: .seconds(seconds))
        #expect(policy.probeInterval == .seconds(seconds) / 5)
        #expect(policy.worstCaseDetection <= .seconds(seconds))
    }

    @Test func explicitPolicy() {
        let policy = LivenessPolicy(probeInterval: .seconds(1), probeTimeout: .seconds(3), failuresBeforeLost: 3)
        #expect(policy.worstCaseDetection == .seconds(1 + 3 * 2 + 3))
        #expect(LivenessPolicy(probeInterval: .seconds(1), probeTimeout: .seconds(1), failuresBeforeLost: 0).failuresBeforeLost == 1)
        #expect(LivenessPolicy(probeInterval: .seconds(1), probeTimeout: .seconds(1), failuresBeforeLost: -5).failuresBeforeLost == 1)
    }
}

// MARK: - Simulation

/// How a probe of a vanished peer fails.
enum FailureMode: String, CaseIterable, Sendable {
    /// Link cut or power off: nothing answers, the attempt runs its whole timeout.
    case linkCut
    /// The host is up but the port is closed: the attempt fails at once.
    case refused
}

/// Drives a table as a browser would: starts due probes, finishes them, jumps to the next deadline.
/// The peer answers a probe iff the probe starts before `vanishAt`.
private struct ProbeLoop {
    var table: DiscoveryTable
    var now: Duration = .zero
    var events: [(at: Duration, event: DiscoveryEvent)] = []
    private var running: [(finish: Duration, probe: DiscoveryTable.Probe, reachable: Bool)] = []

    init(policy: LivenessPolicy) {
        table = DiscoveryTable(policy: policy)
        events += table.sighted(Fixture.sighting("s"), at: .zero).map { (at: Duration.zero, event: $0) }
    }

    mutating func runUntilLost(vanishAt t0: Duration, mode: FailureMode, limit: Duration) {
        var steps = 0
        while now <= limit, steps < 10_000 {
            steps += 1
            var progressed = true
            while progressed {
                progressed = false
                if let index = running.firstIndex(where: { $0.finish <= now }) {
                    let finished = running.remove(at: index)
                    events += table.probeFinished(finished.probe, reachable: finished.reachable, at: now).map { (at: now, event: $0) }
                    progressed = true
                    continue
                }
                for probe in table.dueProbes(at: now) {
                    let reachable = now < t0
                    let finish = reachable || mode == .refused ? now : now + probe.timeout
                    running.append((finish, probe, reachable))
                    progressed = true
                }
            }
            if events.contains(where: { $0.event.isLost }) { return }
            guard let next = (running.map(\.finish) + [table.nextDeadline].compactMap { $0 }).min() else { return }
            now = next
        }
    }

    /// When the peer was reported lost, after checking that it was found once before.
    func lostAt(sourceLocation: SourceLocation = #_sourceLocation) -> Duration? {
        #expect(events.first.map { $0.at == .zero && $0.event == .found(Fixture.peer()) } == true, sourceLocation: sourceLocation)
        let lost = events.filter { $0.event.isLost }
        #expect(lost.count == 1, sourceLocation: sourceLocation)
        #expect(events.count == 2, "\(events)", sourceLocation: sourceLocation)
        return lost.first?.at
    }
}

@Suite("A vanished peer is lost within the policy's worst case")
struct LivenessSimulationTests {
    /// Vanish times, in milliseconds after a probe at 60 s (a multiple of every interval used here).
    static let offsets = [0, 1, 250, 999, 1_000, 1_001, 1_500, 1_999, 2_000, 2_001, 2_500, 3_000, 3_999, 4_000]
    static let base = Duration.seconds(60)

    @Test(arguments: offsets, FailureMode.allCases)
    func defaultPolicy(offsetMilliseconds: Int, mode: FailureMode) throws {
        let policy = LivenessPolicy(timeout: .seconds(10))
        let t0 = Self.base + .milliseconds(offsetMilliseconds)
        var loop = ProbeLoop(policy: policy)
        loop.runUntilLost(vanishAt: t0, mode: mode, limit: t0 + .seconds(60))
        let lost = try #require(loop.lostAt())
        let delay = lost - t0
        #expect(delay > .zero)
        #expect(delay <= policy.worstCaseDetection)
        #expect(policy.worstCaseDetection <= .seconds(10))
        // The exact moment, from the probe cadence (probes start every 2 s from 0): the first probe
        // starting at or after t0 fails, and so does the next.
        let firstFailingStart = Duration.seconds(2) * Int((offsetMilliseconds + 1_999) / 2_000) + Self.base
        let expected = mode == .linkCut ? firstFailingStart + .seconds(4) : firstFailingStart + .seconds(2)
        #expect(lost == expected)
    }

    static let policies = [
        LivenessPolicy(timeout: .seconds(5)),
        LivenessPolicy(timeout: .seconds(10)),
        LivenessPolicy(timeout: .seconds(15)),
        LivenessPolicy(probeInterval: .seconds(1), probeTimeout: .seconds(3), failuresBeforeLost: 3),
        LivenessPolicy(probeInterval: .seconds(3), probeTimeout: .seconds(1), failuresBeforeLost: 2),
        LivenessPolicy(probeInterval: .seconds(2), probeTimeout: .seconds(2), failuresBeforeLost: 1),
    ]

    /// The bound holds for other policies too, and it is tight: a peer vanishing just after a
    /// successful probe, behind a link cut, is lost almost exactly `worstCaseDetection` later.
    @Test(arguments: policies)
    func boundHoldsAndIsTight(_ policy: LivenessPolicy) throws {
        var longest = Duration.zero
        for offset in Self.offsets {
            for mode in FailureMode.allCases {
                let t0 = Self.base + .milliseconds(offset)
                var loop = ProbeLoop(policy: policy)
                loop.runUntilLost(vanishAt: t0, mode: mode, limit: t0 + .seconds(120))
                let lost = try #require(loop.lostAt())
                // With one failure allowed, a refusal at the very moment of vanishing is lost at once.
                #expect(lost - t0 >= .zero)
                #expect(lost - t0 <= policy.worstCaseDetection, "vanished at \(t0), \(mode)")
                longest = max(longest, lost - t0)
            }
        }
        #expect(longest >= policy.worstCaseDetection - .milliseconds(1))
    }
}

@Suite("Endpoints that failed are dialled last")
struct EndpointPenaltiesTests {
    let a = Endpoint.tcp(host: "192.0.2.1", port: 1)
    let b = Endpoint.tcp(host: "192.0.2.2", port: 2)
    let c = Endpoint.tcp(host: "192.0.2.3", port: 3)

    @Test func failedEndpointsGoLastUntilTheyWorkOrAreForgotten() {
        var penalties = EndpointPenalties()
        #expect(penalties.ordered([a, b, c], at: .seconds(0)) == [a, b, c])
        penalties.failed(b, at: .seconds(10))
        penalties.failed(a, at: .seconds(20))
        // the others in their order, then the failed ones, the one that failed longest ago first
        #expect(penalties.ordered([a, b, c], at: .seconds(21)) == [c, b, a])
        penalties.worked(a)
        #expect(penalties.ordered([a, b, c], at: .seconds(22)) == [a, c, b])
        // a failure older than the memory no longer counts
        #expect(penalties.ordered([a, b, c], at: .seconds(10) + EndpointPenalties.memory) == [a, b, c])
    }

    @Test func boundedInNumber() {
        var penalties = EndpointPenalties()
        for index in 0..<(EndpointPenalties.capacity + 50) {
            penalties.failed(.tcp(host: "192.0.2.9", port: UInt16(1000 + index)), at: .seconds(Int64(index)))
        }
        #expect(penalties.count == EndpointPenalties.capacity)
        // the oldest were forgotten, the newest kept
        let oldest = Endpoint.tcp(host: "192.0.2.9", port: 1000)
        let newest = Endpoint.tcp(host: "192.0.2.9", port: UInt16(1000 + EndpointPenalties.capacity + 49))
        #expect(penalties.ordered([newest, oldest], at: .seconds(400)) == [oldest, newest])
    }
}
