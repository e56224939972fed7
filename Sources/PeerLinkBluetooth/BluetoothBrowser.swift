import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix

/// A device a Bluetooth scan found, with the PeerLink peer its SDP server publishes, if any.
public struct BluetoothScanEntry: Hashable, Sendable {
    public var device: BluetoothDevice
    /// The PeerLink peers behind the device's records of the service type (several when
    /// several peers share the device's bluetoothd; none when it has none, or the SDP search
    /// failed: see `sdpProblem`).
    public var peers: [DiscoveredPeer]
    public var sdpProblem: String?
}

extension BluetoothScanner {
    /// Scans for devices, then asks each one's SDP server for a PeerLink record of `serviceType`.
    public static func scanForPeers(
        serviceType: ServiceType, adapter: String? = nil, duration: Duration, excluding: Set<Fingerprint> = [],
        logger: Logger = Logger(label: "peerlink.bluetooth")
    ) async throws(PeerLinkError) -> (entries: [BluetoothScanEntry], method: Method) {
        let round = try await scanForPeers(
            serviceType: serviceType, adapter: adapter, duration: duration, excluding: excluding, logger: logger, searching: { _ in true })
        return (round.entries.map(\.entry), round.method)
    }

    /// ``scanForPeers(serviceType:adapter:duration:excluding:logger:)`` asking only the devices
    /// `searching` picks; each entry says whether the device was asked and whether it published
    /// a record of the service type (before `excluding`).
    static func scanForPeers(
        serviceType: ServiceType, adapter: String?, duration: Duration, excluding: Set<Fingerprint>, logger: Logger,
        searching: (BluetoothDevice) -> Bool
    ) async throws(PeerLinkError) -> (entries: [(entry: BluetoothScanEntry, searched: Bool, published: Bool)], method: Method, local: BluetoothAddress) {
        let (devices, method, local) = try await scan(adapter: adapter, duration: duration, logger: logger)
        // Browsing stopped during the scan: no SDP searches (a connection given up half-way can
        // leave the emulated controllers of the lab with a link that goes nowhere).
        if Task.isCancelled {
            return (devices.map { (BluetoothScanEntry(device: $0, peers: [], sdpProblem: "not searched: browsing stopped"), false, false) }, method, local)
        }
        var asked: [BluetoothDevice] = []
        var entries: [(entry: BluetoothScanEntry, searched: Bool, published: Bool)] = []
        for device in devices {
            if searching(device) {
                asked.append(device)
            } else {
                entries.append(
                    (BluetoothScanEntry(device: device, peers: [], sdpProblem: "not asked this round: it had no PeerLink record lately"),
                     false, false))
            }
        }
        entries += await withTaskGroup(of: (entry: BluetoothScanEntry, searched: Bool, published: Bool).self) { group in
            for device in asked {
                group.addTask {
                    let (entry, published) = await lookUp(device, serviceType: serviceType, local: local, excluding: excluding, logger: logger)
                    return (entry, true, published)
                }
            }
            var entries: [(entry: BluetoothScanEntry, searched: Bool, published: Bool)] = []
            for await entry in group { entries.append(entry) }
            return entries
        }
        return (entries.sorted { $0.entry.device.address < $1.entry.device.address }, method, local)
    }

    /// One device's PeerLink record, searched on a thread of its own: the SDP client's socket
    /// calls block until the device answers (up to 10 s), and a detached task would block a
    /// cooperative thread as much. `published`: whether it has a record of the service type,
    /// one of `excluding` or not.
    static func lookUp(
        _ device: BluetoothDevice, serviceType: ServiceType, local: BluetoothAddress, excluding: Set<Fingerprint>, logger: Logger
    ) async -> (entry: BluetoothScanEntry, published: Bool) {
        let result = await runBlocking("peerlink-sdp") {
            Result { () throws(PeerLinkError) -> [PeerLinkServiceRecord] in
                try SDPClient.peerLinkRecords(at: device.address, from: local, serviceType: serviceType)
            }
        }
        switch result {
        case .success(let records):
            let peers = records.filter { !excluding.contains($0.record.fingerprint) }.map { record in
                DiscoveredPeer(
                    id: record.record.peerID, protocolVersion: record.record.version,
                    endpoints: record.endpoints(at: device.address), info: record.record.info)
            }
            return (BluetoothScanEntry(device: device, peers: peers, sdpProblem: nil), !records.isEmpty)
        case .failure(let error):
            logger.debug("SDP search failed", metadata: ["address": "\(device.address)", "error": "\(error.message)"])
            return (BluetoothScanEntry(device: device, peers: [], sdpProblem: error.message), false)
        }
    }
}

/// Finds PeerLink peers over Bluetooth: scans in rounds (bluetoothd discovery, else HCI
/// inquiry), searches each device's SDP server for the service type's record, and reports
/// `found` / `updated` / `lost` like ``LANBrowser`` does, with `l2cap` and `rfcomm` endpoints.
///
/// An SDP answer proves the peer is there, so no further probe is made; a peer missing from
/// `roundsBeforeLost` rounds in a row (its record withdrawn or the device gone) is lost.
/// Devices that never published a PeerLink record are asked less and less often (at most
/// every 6 rounds, at once when their name or class changes), not every round: each search
/// pages the device (``SDPSearchSchedule``).
///
/// Rounds run back to back while the adapter holds no connection. An inquiry takes the radio
/// away from every link the adapter holds (PeerLink's, a headset's), slowing them and lengthening
/// their round trips, so while it holds one the browser rests between rounds, up to
/// `restWhileConnected` (by default three rounds' time: it inquires about a quarter of the time),
/// and starts the next round as soon as the adapter's last connection is gone.
public final class BluetoothBrowser: TransportBrowser {
    public let serviceType: ServiceType
    public let adapter: String?
    public let roundDuration: Duration
    public let roundsBeforeLost: Int
    /// The longest rest between two rounds while the adapter holds a connection.
    public let restWhileConnected: Duration
    private let excluding: Set<Fingerprint>
    private let logger: Logger
    /// The devices of the last round, for ``scanReport()``.
    private let lastRound = LastRound()

    /// The last round's result, shared with the task that scans.
    private final class LastRound: Sendable {
        private let round = Locked<(entries: [BluetoothScanEntry], method: BluetoothScanner.Method)?>(nil)

        func set(_ value: (entries: [BluetoothScanEntry], method: BluetoothScanner.Method)) { round.withLock { $0 = value } }
        func get() -> (entries: [BluetoothScanEntry], method: BluetoothScanner.Method)? { round.withLock { $0 } }
    }

    public init(
        serviceType: ServiceType, adapter: String? = nil, roundDuration: Duration = .seconds(5), roundsBeforeLost: Int = 2,
        restWhileConnected: Duration? = nil, excluding: Set<Fingerprint> = [], logger: Logger = Logger(label: "peerlink.bluetooth")
    ) {
        self.serviceType = serviceType
        self.adapter = adapter
        self.roundDuration = roundDuration
        self.roundsBeforeLost = max(1, roundsBeforeLost)
        self.restWhileConnected = max(.zero, restWhileConnected ?? roundDuration * 3)
        self.excluding = excluding
        var logger = logger
        logger[metadataKey: "transport"] = "bluetooth"
        self.logger = logger
    }

    /// Starts browsing. The first round runs before this returns, so a missing bluetoothd /
    /// Bluetooth stack throws here (`unavailable`) rather than ending the sequence silently.
    /// Browsing stops when the consumer stops iterating.
    public func events() async throws(PeerLinkError) -> AsyncStream<DiscoveryEvent> {
        let firstRound = try await BluetoothScanner.scanForPeers(
            serviceType: serviceType, adapter: adapter, duration: roundDuration, excluding: excluding, logger: logger,
            searching: { _ in true })
        var schedule = SDPSearchSchedule()
        schedule.took(firstRound.entries, round: 0)
        let first = (entries: firstRound.entries.map(\.entry), method: firstRound.method)
        lastRound.set(first)
        let (events, output) = AsyncStream<DiscoveryEvent>.makeStream()
        let serviceType = serviceType, adapter = adapter, roundDuration = roundDuration, restWhileConnected = restWhileConnected
        let roundsBeforeLost = roundsBeforeLost, excluding = excluding, logger = logger, lastRound = lastRound
        let firstLocal = firstRound.local
        // What the first round found is in the stream before it is returned.
        var known: [Fingerprint: (peer: DiscoveredPeer, missed: Int)] = [:]
        Self.report(first.entries, known: &known, roundsBeforeLost: roundsBeforeLost, to: output)
        let driver = Task { [known, schedule] in
            var known = known
            var schedule = schedule
            var number = 0
            // The adapter whose connections decide the rests: the one asked for, else the one
            // the rounds used (named by its address).
            var scanning = adapter ?? firstLocal.description
            while !Task.isCancelled {
                let adapterName = scanning
                let rested = await Self.rest(upTo: restWhileConnected) { BTSys.connectionCount(adapter: adapterName) }
                if rested > .zero { logger.debug("Bluetooth browsing rested while \(adapterName) held a connection", metadata: ["rest": "\(rested)"]) }
                if Task.isCancelled { break }
                number += 1
                let round: [BluetoothScanEntry]
                do {
                    let asOf = number, pick = schedule
                    let next = try await BluetoothScanner.scanForPeers(
                        serviceType: serviceType, adapter: adapter, duration: roundDuration, excluding: excluding, logger: logger,
                        searching: { pick.shouldSearch($0, round: asOf) })
                    if Task.isCancelled { break }
                    schedule.took(next.entries, round: number)
                    round = next.entries.map(\.entry)
                    lastRound.set((round, next.method))
                    if adapter == nil { scanning = next.local.description }
                } catch let error as PeerLinkError {
                    logger.warning("Bluetooth scan failed: \(error.message)")
                    try? await Task.sleep(for: roundDuration)
                    round = []
                } catch {
                    logger.warning("Bluetooth scan failed: \(error)")
                    try? await Task.sleep(for: roundDuration)
                    round = []
                }
                Self.report(round, known: &known, roundsBeforeLost: roundsBeforeLost, to: output)
            }
        }
        output.onTermination = { _ in driver.cancel() }
        return events
    }

    /// Waits while `connections()` (the adapter's) is more than zero, at most `limit`, looking
    /// again every `step`; returns how long it waited. A count that cannot be read is no
    /// connection: the next round runs.
    static func rest(upTo limit: Duration, step: Duration = .seconds(1), connections: () -> Int?) async -> Duration {
        var rested = Duration.zero
        while rested < limit, !Task.isCancelled, (connections() ?? 0) > 0 {
            let pause = min(step, limit - rested)
            try? await Task.sleep(for: pause)
            rested += pause
        }
        return rested
    }

    /// Yields what a round changed: peers found or updated, peers missing from
    /// `roundsBeforeLost` rounds in a row lost.
    private static func report(
        _ round: [BluetoothScanEntry], known: inout [Fingerprint: (peer: DiscoveredPeer, missed: Int)], roundsBeforeLost: Int,
        to output: AsyncStream<DiscoveryEvent>.Continuation
    ) {
        let present = Dictionary(round.flatMap(\.peers).map { ($0.id.fingerprint, $0) }, uniquingKeysWith: { a, _ in a })
        for (fingerprint, peer) in present {
            if let previous = known[fingerprint] {
                if previous.peer != peer || previous.peer.id.displayName != peer.id.displayName { output.yield(.updated(peer)) }
            } else {
                output.yield(.found(peer))
            }
            known[fingerprint] = (peer, 0)
        }
        for (fingerprint, entry) in known where present[fingerprint] == nil {
            if entry.missed + 1 >= roundsBeforeLost {
                known[fingerprint] = nil
                output.yield(.lost(entry.peer.id))
            } else {
                known[fingerprint] = (entry.peer, entry.missed + 1)
            }
        }
    }

    /// The devices the last round saw — address, name, class, RSSI — PeerLink peers marked with
    /// their name, id and endpoints.
    public func scanReport() -> TransportScanReport? {
        guard let round = lastRound.get() else { return nil }
        let (entries, method) = (round.entries, round.method)
        let rows = entries.map { entry -> [String] in
            let device = entry.device
            let peerLink = entry.peers.isEmpty
                ? nil
                : entry.peers.map { "PeerLink \($0.id.displayName) \($0.id.fingerprint.grouped) \($0.endpoints.map(\.description).joined(separator: " "))" }
                    .joined(separator: "; ")
            return [
                device.address.description, device.name ?? "-",
                device.deviceClass.map { "0x" + String($0, radix: 16) } ?? "-",
                device.rssi.map { "\($0) dBm" } ?? "-",
                peerLink ?? (entry.sdpProblem.map { "(SDP: \($0))" } ?? ""),
            ]
        }
        return TransportScanReport(
            title: "Bluetooth devices (\(method == .bluetoothd ? "bluetoothd discovery" : "HCI inquiry")): \(entries.count)",
            columns: ["ADDRESS", "NAME", "CLASS", "RSSI", "PEERLINK"], rows: rows)
    }
}
