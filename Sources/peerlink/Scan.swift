import ArgumentParser
import Foundation
import PeerLink

struct Scan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the peers found nearby within a time limit.",
        discussion: "With neither --lan nor --bluetooth, scans the LAN.")

    @Flag(help: "Scan the LAN (DNS-SD through avahi-daemon).")
    var lan = false

    @Flag(help: "Scan for Bluetooth devices.")
    var bluetooth = false

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

    func run() async throws {
        PeerLinkLogging.bootstrap(verbose: verbose)
        if bluetooth {
            var problem = PeerLinkError(.unsupported, "scanning for Bluetooth devices is not available in this version of peerlink; use 'peerlink scan --lan'")
            do {
                _ = try BluetoothAdapter.all()
            } catch {
                problem = error
            }
            // Asked for Bluetooth alone: that is the answer. Asked for both: say so and scan the LAN.
            guard lan else { throw fail(problem) }
            printError("peerlink: Bluetooth skipped: \(problem.message)")
        }
        let serviceType = try ServiceType(service)
        let browser = LANBrowser(serviceType: serviceType)
        let events: AsyncStream<DiscoveryEvent>
        do {
            events = try browser.events()
        } catch {
            throw fail(error)
        }
        if !json {
            printError("Scanning the LAN for \(serviceType.dnsSDType) for \(Self.seconds(timeout))...")
        }
        let watching = watch
        let jsonLines = json
        let collector = Task { () -> [Fingerprint: DiscoveredPeer] in
            var peers: [Fingerprint: DiscoveredPeer] = [:]
            for await event in events {
                switch event {
                case .found(let peer), .updated(let peer): peers[peer.id.fingerprint] = peer
                case .lost(let id): peers[id.fingerprint] = nil
                }
                if watching { Self.printWatched(event, json: jsonLines) }
            }
            return peers
        }
        try? await Task.sleep(for: .milliseconds(Int(timeout * 1000)))
        collector.cancel()
        let peers = await collector.value.values.sorted {
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
