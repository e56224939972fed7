import ArgumentParser
import Foundation
import Logging
import PeerLink

struct Advertise: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish this peer on the LAN and over Bluetooth until interrupted.",
        discussion: "Runs until SIGINT (Ctrl-C) or SIGTERM, then withdraws the advertisements and exits 0. On the LAN the advertisement is a DNS-SD service through avahi-daemon, over Bluetooth an SDP record registered with bluetoothd; with --transport auto (the default) a transport that is unavailable is one line on standard error and the others still advertise. Peers can link to the advertised ports; invitations are declined.")

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8.")
    var name: String

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens (published as _TYPE._tcp).")
    var service: String = ServiceType.default.value

    @Option(parsing: .unconditionalSingleValue, help: ArgumentHelp("Discovery info to publish; repeat for more entries.", valueName: "key=value"))
    var info: [String] = []

    @Option(help: ArgumentHelp(
        "Where to advertise: auto (the LAN and Bluetooth, the default; one that cannot run here is a line on standard error), lan, bluetooth, or lan,bluetooth.",
        valueName: "auto|lan|bluetooth"))
    var transport: TransportChoice = .auto

    @Option(help: "The Bluetooth adapter to advertise on (hciN; default: the first powered one).")
    var adapter: String?

    @Option(help: "The RFCOMM channel to listen on and advertise (1-30; 0: the first free one).")
    var channel: Int = 0

    @Option(help: "The L2CAP PSM to listen on and advertise (odd, e.g. 0x1001; 0: the first free dynamic one).")
    var psm: String = "0"

    @OptionGroup var peer: PeerOptions

    func validate() throws {
        do {
            _ = try DisplayName(name)
            _ = try ServiceType(service)
            _ = try DiscoveryInfo(arguments: info)
        } catch {
            throw error.usageError
        }
        guard channel == 0 || RFCOMMChannel(channel) != nil else {
            throw ArgumentParser.ValidationError("--channel must be an RFCOMM channel from 1 to 30, or 0 for the first free one")
        }
        guard psm == "0" || L2CAPPSM(psm) != nil else {
            throw ArgumentParser.ValidationError("--psm must be a valid L2CAP PSM (odd low byte, even high byte, e.g. 0x1001), or 0 for the first free one")
        }
        try validateAdapter(adapter)
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.advertise")
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let discoveryInfo = try DiscoveryInfo(arguments: info)
        let node: PeerNode
        do {
            let configuration = PeerNodeConfiguration(
                session: PeerSessionConfiguration(identity: try peer.loadIdentity(), displayName: displayName, serviceType: serviceType),
                info: discoveryInfo,
                transports: transport.configuring(
                    bluetoothModule(adapter: adapter, channel: RFCOMMChannel(channel), psm: L2CAPPSM(psm), logger: logger)),
                browsing: false)
            node = try await PeerNode.open(configuration: configuration, logger: logger)
        } catch {
            throw fail(error)
        }
        let id = node.localPeer.fingerprint.grouped
        // What the node did while it was made: the advertisements, and the transports skipped.
        for notice in node.notices {
            switch notice.what {
            case .advertising(let summary): printLine("Advertising \(displayName) (id \(id)) \(summary)")
            case .unavailable: if let line = TransportWording.problem(notice) { printError("peerlink: \(line)") }
            default: break
            }
        }
        for (key, value) in discoveryInfo.entries.sorted(by: { $0.key < $1.key }) {
            printLine("  info \(key)=\(value)")
        }
        printLine("Press Ctrl-C to stop.")

        // The node's session answers on the advertised ports (browsers' liveness checks, links
        // from peers); this peer only publishes itself, so invitations are declined.
        let session = node.session
        let running = Task { await node.run() }
        let watcher = Task {
            for await event in node.events {
                switch event {
                case .transport(let notice):
                    switch notice.what {
                    case .advertisement(.published(let instance)): printLine("Published as \"\(instance)\".")
                    case .advertisement(.renamed(let from, let to)):
                        printLine("The name \"\(from)\" is taken on this network; publishing as \"\(to)\".")
                    case .advertisement(.daemonUnavailable(let daemon)):
                        printLine("\(daemon) went away; publishing again when it is back.")
                    case .advertisement(.failed(let error)): printError("peerlink: \(error.message)")
                    default: break
                    }
                case .session(.invitationReceived(let invitation, let from, _)):
                    printError("peerlink: declined an invitation from \(from.displayName): advertise only publishes this peer (use chat to join)")
                    try? await session.respond(to: invitation, accept: false)
                default:
                    break
                }
            }
        }
        let signal = await waitForTerminationSignal()
        await node.disconnect()
        await running.value
        watcher.cancel()
        printLine("Withdrawn (\(signal == SIGINT ? "interrupted" : "terminated")).")
    }
}
