import ArgumentParser
import Foundation
import PeerLink

struct Scan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the peers found nearby within a time limit.",
        discussion: "With neither --lan nor --bluetooth (nor --transport), scans the LAN and Bluetooth; a transport that is unavailable is one line on standard error, the other's results are still shown.")

    @Flag(help: "Scan the LAN (DNS-SD through avahi-daemon).")
    var lan = false

    @Flag(help: "Scan for Bluetooth devices (bluetoothd discovery, else HCI inquiry) and their PeerLink SDP records.")
    var bluetooth = false

    @Option(help: "Which transports to scan: lan, bluetooth or auto (both). The same as --lan, --bluetooth or neither.")
    var transport: String?

    @Option(help: "The Bluetooth adapter to scan with (hciN; default: the first powered one).")
    var adapter: String?

    @Option(parsing: .unconditional, help: "The service type to look for.")
    var service: String = ServiceType.default.value

    @Option(help: "How long to scan, in seconds.")
    var timeout: Double = 5

    @Flag(help: "Print one JSON array of peers instead of text (with --watch: one JSON object per line).")
    var json = false

    @Flag(help: "Print each peer found, changed or lost as it happens, until the timeout.")
    var watch = false

    @Flag(name: .shortAndLong, help: "Log what happens underneath, to standard error.")
    var verbose = false

    func validate() throws {
        do {
            _ = try ServiceType(service)
        } catch {
            throw error.usageError
        }
        if let transport, TransportSelection(rawValue: transport) == nil {
            throw ArgumentParser.ValidationError("--transport must be lan, bluetooth or auto")
        }
        if transport != nil && (lan || bluetooth) {
            throw ArgumentParser.ValidationError("use --transport or --lan/--bluetooth, not both")
        }
        if let adapter, !(adapter.hasPrefix("hci") && adapter.count > 3 && adapter.dropFirst(3).allSatisfy(\.isNumber)) {
            throw ArgumentParser.ValidationError("--adapter must name an adapter as hciN (e.g. hci0); 'peerlink radios' lists them")
        }
        guard timeout > 0, timeout <= 3600 else {
            throw ArgumentParser.ValidationError("--timeout must be more than 0 and at most 3600 seconds")
        }
    }

    struct PeerJSON: Encodable {
        struct EndpointJSON: Encodable {
            var transport: String
            var host: String?
            var port: UInt16?
            var name: String?
            var address: String?
            var channel: UInt8?
            var psm: UInt16?
        }
        var name: String
        var id: String
        var endpoints: [EndpointJSON]
        var info: [String: String]

        init(_ peer: DiscoveredPeer) {
            name = peer.id.displayName
            id = peer.id.fingerprint.value
            endpoints = peer.endpoints.map { endpoint in
                switch endpoint {
                case .tcp(let host, let port): return EndpointJSON(transport: "tcp", host: host, port: port)
                case .rfcomm(let address, let channel):
                    return EndpointJSON(transport: "rfcomm", address: address.description, channel: channel.value)
                case .l2cap(let address, let psm):
                    return EndpointJSON(transport: "l2cap", address: address.description, psm: psm.value)
                case .memory(let name): return EndpointJSON(transport: "memory", name: name)
                }
            }
            info = peer.info.entries
        }
    }

    /// What to scan, from --transport or the flags.
    var selection: TransportSelection {
        if let transport, let selection = TransportSelection(rawValue: transport) { return selection }
        if lan && !bluetooth { return .lan }
        if bluetooth && !lan { return .bluetooth }
        return .auto
    }

    func run() async throws {
        PeerLinkLogging.bootstrap(verbose: verbose)
        let selection = selection
        let serviceType = try ServiceType(service)
        let duration = Duration.milliseconds(Int(timeout * 1000))
        let watching = watch
        let jsonLines = json
        let merged = MergedPeers(selection: selection, watching: watching, json: jsonLines)

        var lanEvents: AsyncStream<DiscoveryEvent>?
        var problems: [PeerLinkError] = []
        if selection.usesLAN {
            do {
                lanEvents = try LANBrowser(serviceType: serviceType).events()
            } catch {
                problems.append(error)
                if selection == .auto { printError("peerlink: LAN skipped: \(error.message)") }
            }
        }
        if !json {
            let what = [selection.usesLAN && lanEvents != nil ? "the LAN for \(serviceType.dnsSDType)" : nil, selection.usesBluetooth ? "Bluetooth" : nil]
                .compactMap { $0 }.joined(separator: " and ")
            printError("Scanning \(what) for \(Self.seconds(timeout))...")
        }
        let lanStream = lanEvents
        let lanTask = Task {
            guard let lanStream else { return }
            for await event in lanStream { merged.apply(event, from: "lan") }
        }
        var bluetoothEntries: [BluetoothScanEntry] = []
        var bluetoothMethod: BluetoothScanner.Method?
        if selection.usesBluetooth {
            do {
                let result = try await BluetoothScanner.scanForPeers(serviceType: serviceType, adapter: adapter, duration: duration)
                bluetoothEntries = result.entries
                bluetoothMethod = result.method
                for peer in result.entries.flatMap(\.peers) { merged.apply(.found(peer), from: "bluetooth") }
            } catch {
                problems.append(error)
                if selection == .auto { printError("peerlink: Bluetooth skipped: \(error.message)") }
            }
        }
        // Asked for one transport alone, or both failed: that is the answer.
        if problems.count == (selection == .auto ? 2 : 1), let problem = problems.last {
            lanTask.cancel()
            throw fail(problem)
        }
        if lanEvents != nil {
            // The LAN browse runs for the whole timeout (the Bluetooth scan took about as long).
            if !selection.usesBluetooth || bluetoothMethod == nil { try? await Task.sleep(for: duration) }
        }
        lanTask.cancel()
        let peers = merged.peers.sorted {
            ($0.id.displayName, $0.id.fingerprint) < ($1.id.displayName, $1.id.fingerprint)
        }
        if watch { return }
        if json {
            let objects = peers.map(PeerJSON.init)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            printLine(String(decoding: try encoder.encode(objects), as: UTF8.self))
            return
        }
        if let bluetoothMethod {
            Self.printDevices(bluetoothEntries, method: bluetoothMethod)
        }
        if peers.isEmpty {
            printLine("No peers found.")
            return
        }
        let rows = peers.map { peer in
            [
                peer.id.displayName, peer.id.fingerprint.grouped,
                peer.endpoints.map(\.description).joined(separator: " "),
                peer.info.entries.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "),
            ]
        }
        let header = ["NAME", "ID", "ENDPOINTS", "INFO"]
        let widths = (0..<4).map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        for row in [header] + rows {
            let cells = row.enumerated().map { index, cell in
                index == 3 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }
            printLine(cells.joined(separator: "  ").trimmingTrailingSpaces())
        }
        printLine("\(peers.count) peer\(peers.count == 1 ? "" : "s") found.")
    }

    struct WatchJSON: Encodable {
        var event: String
        var peer: PeerJSON?
        var name: String?
        var id: String?
    }

    static func printWatched(_ event: DiscoveryEvent, json: Bool) {
        if json {
            let line: WatchJSON
            switch event {
            case .found(let peer): line = WatchJSON(event: "found", peer: PeerJSON(peer))
            case .updated(let peer): line = WatchJSON(event: "updated", peer: PeerJSON(peer))
            case .lost(let id): line = WatchJSON(event: "lost", name: id.displayName, id: id.fingerprint.value)
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            if let data = try? encoder.encode(line) { printLine(String(decoding: data, as: UTF8.self)) }
            return
        }
        switch event {
        case .found(let peer):
            printLine("found \(peer.id.displayName) \(peer.id.fingerprint.grouped) \(peer.endpoints.map(\.description).joined(separator: " "))")
        case .updated(let peer):
            printLine("changed \(peer.id.displayName) \(peer.id.fingerprint.grouped) \(peer.endpoints.map(\.description).joined(separator: " "))")
        case .lost(let id):
            printLine("lost \(id.displayName) \(id.fingerprint.grouped)")
        }
    }

    /// The Bluetooth devices seen, PeerLink peers marked with their name and id.
    static func printDevices(_ entries: [BluetoothScanEntry], method: BluetoothScanner.Method) {
        printLine("Bluetooth devices (\(method == .bluetoothd ? "bluetoothd discovery" : "HCI inquiry")): \(entries.count)")
        let rows = entries.map { entry -> [String] in
            let device = entry.device
            let peerLink = entry.peers.isEmpty ? nil : entry.peers.map { "PeerLink \($0.id.displayName) \($0.id.fingerprint.grouped) \($0.endpoints.map(\.description).joined(separator: " "))" }.joined(separator: "; ")
            return [
                device.address.description, device.name ?? "-",
                device.deviceClass.map { "0x" + String($0, radix: 16) } ?? "-",
                device.rssi.map { "\($0) dBm" } ?? "-",
                peerLink ?? (entry.sdpProblem.map { "(SDP: \($0))" } ?? ""),
            ]
        }
        guard !rows.isEmpty else { return }
        let header = ["ADDRESS", "NAME", "CLASS", "RSSI", "PEERLINK"]
        let widths = (0..<5).map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        for row in [header] + rows {
            let cells = row.enumerated().map { index, cell in
                index == 4 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }
            printLine("  " + cells.joined(separator: "  ").trimmingTrailingSpaces())
        }
    }

    static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value)) s" : "\(value) s"
    }
}

extension String {
    func trimmingTrailingSpaces() -> String {
        var text = self
        while text.last == " " { text.removeLast() }
        return text
    }
}

/// The scan's merged view of both transports, fed from the LAN task and the Bluetooth scan.
final class MergedPeers: @unchecked Sendable {
    private let lock = NSLock()
    private var discovery: MergedDiscovery
    private let watching: Bool
    private let json: Bool

    init(selection: TransportSelection, watching: Bool, json: Bool) {
        discovery = MergedDiscovery(selection: selection)
        self.watching = watching
        self.json = json
    }

    func apply(_ event: DiscoveryEvent, from source: String) {
        let events = lock.withLock { discovery.apply(event, from: source) }
        if watching { for event in events { Scan.printWatched(event, json: json) } }
    }

    var peers: [DiscoveredPeer] { lock.withLock { discovery.peers } }
}
