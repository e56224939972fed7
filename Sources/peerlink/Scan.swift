import ArgumentParser
import Foundation
import Logging
import PeerLink

struct Scan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the peers found nearby within a time limit.",
        discussion: """
            With neither --lan nor --bluetooth (nor --transport), scans with every transport: the LAN \
            and Bluetooth; a transport that is unavailable is one line on standard error, the others' \
            results are still shown. A peer found on several transports is one peer with every \
            endpoint, best first (see --prefer); --json lists its transports and the preferred one.
            """)

    @Flag(help: "Scan the LAN (DNS-SD through avahi-daemon).")
    var lan = false

    @Flag(help: "Scan for Bluetooth devices (bluetoothd discovery, else HCI inquiry) and their PeerLink SDP records.")
    var bluetooth = false

    @Option(help: ArgumentHelp(
        "Which transports to scan: auto (every one), lan, bluetooth, or several: lan,bluetooth. The same as --lan, --bluetooth or neither.",
        valueName: "auto|lan|bluetooth"))
    var transport: TransportChoice?

    @Option(help: ArgumentHelp("The kinds of link to prefer, best first: the order endpoints are listed in.", valueName: "kinds"))
    var prefer: TransportRanking = .standard

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
        if transport != nil && (lan || bluetooth) {
            throw ArgumentParser.ValidationError("use --transport or --lan/--bluetooth, not both")
        }
        try validateAdapter(adapter)
        guard timeout > 0, timeout <= 3600 else {
            throw ArgumentParser.ValidationError("--timeout must be more than 0 and at most 3600 seconds")
        }
    }

    /// One peer as `--json` prints it.
    struct PeerJSON: Encodable {
        struct EndpointJSON: Encodable {
            var transport: String
            var endpoint: String
            var fields: [String: EndpointField]

            init(_ endpoint: Endpoint) {
                transport = endpoint.transport
                self.endpoint = endpoint.description
                fields = endpoint.address.fields
            }

            struct Key: CodingKey {
                var stringValue: String
                var intValue: Int? { nil }
                init(stringValue: String) { self.stringValue = stringValue }
                init?(intValue: Int) { nil }
            }

            /// `{"transport":"tcp","endpoint":"tcp://…","host":…,"port":…}`: the transport's own
            /// fields beside the kind and the text.
            func encode(to encoder: any Encoder) throws {
                var container = encoder.container(keyedBy: Key.self)
                try container.encode(transport, forKey: Key(stringValue: "transport"))
                try container.encode(endpoint, forKey: Key(stringValue: "endpoint"))
                for (name, value) in fields where name != "transport" && name != "endpoint" {
                    switch value {
                    case .text(let text): try container.encode(text, forKey: Key(stringValue: name))
                    case .number(let number): try container.encode(number, forKey: Key(stringValue: name))
                    }
                }
            }
        }
        var name: String
        var id: String
        var endpoints: [EndpointJSON]
        /// Every transport the peer was found on, best first.
        var transports: [String]
        /// The transport a session would use first.
        var preferred: String?
        var info: [String: String]

        init(_ peer: DiscoveredPeer) {
            name = peer.id.displayName
            id = peer.id.fingerprint.value
            endpoints = peer.endpoints.map(EndpointJSON.init)
            transports = peer.transports.map(\.rawValue)
            preferred = transports.first
            info = peer.info.entries
        }
    }

    /// What to scan, from --transport or the flags.
    var choice: TransportChoice {
        if let transport { return transport }
        if lan && !bluetooth { return .lan }
        if bluetooth && !lan { return .bluetooth }
        return .auto
    }

    func run() async throws {
        PeerLinkLogging.bootstrap(verbose: verbose)
        let logger = Logger(label: "peerlink.scan")
        let serviceType = try ServiceType(service)
        let duration = Duration.milliseconds(Int(timeout * 1000))
        let modules = choice.configuring(bluetoothModule(adapter: adapter, channel: nil, psm: nil, logger: logger)).modules(logger: logger)
        let discovery = PeerDiscovery(
            modules: modules, request: BrowseRequest(serviceType: serviceType, scanWindow: duration), ranking: prefer, logger: logger)
        let watching = watch
        let jsonLines = json
        let several = modules.count > 1
        if !json {
            let what = modules.map(\.label).joined(separator: " and ")
            printError("Scanning \(what) for \(serviceType.dnsSDType) peers for \(Self.seconds(timeout))...")
        }
        let progress = ScanProgress(total: modules.count)
        let browse = Task {
            await discovery.run { event in
                switch event {
                case .peer(let change):
                    progress.heard()
                    if watching { Self.printWatched(change, json: jsonLines) }
                case .browsing:
                    progress.settled(nil)
                case .unavailable(_, let label, let error):
                    progress.settled(error)
                    if several { printError("peerlink: \(label) skipped: \(error.message)") }
                }
            }
        }
        // Scan for the whole time, and until every browser started (a Bluetooth round ends
        // after its inquiry and SDP searches) or failed and what they found came in (nothing new
        // for a moment), within a bound.
        let start = ContinuousClock.now
        while ContinuousClock.now < start + duration + .seconds(60) {
            let (settled, failures) = progress.state
            if failures.count == modules.count { break }
            if settled == modules.count && ContinuousClock.now >= start + duration && progress.quietFor(.milliseconds(500)) { break }
            try? await Task.sleep(for: .milliseconds(50))
        }
        browse.cancel()
        await browse.value
        // Every transport failed: that is the answer.
        let failures = progress.state.failures
        if failures.count == modules.count, let last = failures.last {
            throw fail(several ? PeerLinkError(last.code, "no transport can scan here: see the lines above") : last)
        }
        if watch { return }
        let peers = discovery.peers.sorted {
            ($0.id.displayName, $0.id.fingerprint) < ($1.id.displayName, $1.id.fingerprint)
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            printLine(String(decoding: try encoder.encode(peers.map(PeerJSON.init)), as: UTF8.self))
            return
        }
        for report in discovery.scanReports() { Self.printReport(report) }
        if peers.isEmpty {
            printLine("No peers found.")
            return
        }
        let rows = peers.map { peer in
            [
                peer.id.displayName, peer.id.fingerprint.grouped, peer.transports.map(\.rawValue).joined(separator: ","),
                peer.endpoints.map(\.description).joined(separator: " "),
                peer.info.entries.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "),
            ]
        }
        Self.printTable(header: ["NAME", "ID", "TRANSPORTS", "ENDPOINTS", "INFO"], rows: rows, indent: "")
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

    /// A transport's own table (Bluetooth: every device seen, PeerLink peers marked).
    static func printReport(_ report: TransportScanReport) {
        printLine(report.title)
        guard !report.rows.isEmpty else { return }
        printTable(header: report.columns, rows: report.rows, indent: "  ")
    }

    /// Columns padded to their widest cell, the last one not.
    static func printTable(header: [String], rows: [[String]], indent: String) {
        let widths = header.indices.map { column in ([header] + rows).map { column < $0.count ? $0[column].count : 0 }.max() ?? 0 }
        for row in [header] + rows {
            let cells = row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }
            printLine(indent + cells.joined(separator: "  ").trimmingTrailingSpaces())
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

/// Which browsers of a scan have started or failed, and when the last report came.
final class ScanProgress: Sendable {
    private let counts = Locked<(settled: Int, failures: [PeerLinkError], last: ContinuousClock.Instant)>((0, [], .now))
    let total: Int

    init(total: Int) {
        self.total = total
    }

    func settled(_ failure: PeerLinkError?) {
        counts.withLock { counts in
            counts.settled += 1
            counts.last = .now
            if let failure { counts.failures.append(failure) }
        }
    }

    /// A peer was reported.
    func heard() {
        counts.withLock { $0.last = .now }
    }

    /// Whether nothing was reported for `duration`.
    func quietFor(_ duration: Duration) -> Bool {
        counts.withLock { $0.last + duration <= .now }
    }

    var state: (settled: Int, failures: [PeerLinkError]) { counts.withLock { ($0.settled, $0.failures) } }
}
