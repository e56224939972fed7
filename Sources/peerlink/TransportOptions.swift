import ArgumentParser
import Foundation
import Logging
import PeerLink

extension TransportChoice: ExpressibleByArgument {
    public init?(argument: String) {
        guard let choice = try? TransportChoice(parsing: argument) else { return nil }
        self = choice
    }

    public static var allValueStrings: [String] { ["auto"] + StandardTransports.names }
    public var defaultValueDescription: String { description }
}

extension TransportRanking: ExpressibleByArgument {
    public init?(argument: String) {
        guard let ranking = try? TransportRanking(parsing: argument) else { return nil }
        self = ranking
    }

    public var defaultValueDescription: String { order.map(\.rawValue).joined(separator: ",") }
}

/// The transport options every command that runs a node shares: `--transport`, `--prefer`.
struct TransportOptions: ParsableArguments {
    @Option(help: ArgumentHelp(
        "The transports to use: auto (the LAN and Bluetooth; one that cannot run here is a line on standard error), lan, bluetooth, or several: lan,bluetooth.",
        valueName: "auto|lan|bluetooth"))
    var transport: TransportChoice = .auto

    @Option(help: ArgumentHelp(
        "The kinds of link to prefer, best first: a peer's endpoints are dialled in this order.", valueName: "kinds"))
    var prefer: TransportRanking = .standard
}

/// The Bluetooth settings a command's options give, as the Bluetooth module configured with them.
func bluetoothModule(adapter: String?, channel: RFCOMMChannel?, psm: L2CAPPSM?, logger: Logger) -> BluetoothTransportModule {
    BluetoothTransportModule(adapter: adapter, rfcommChannel: channel, l2capPSM: psm, logger: logger)
}

/// Checks an `--adapter` value.
func validateAdapter(_ adapter: String?) throws {
    if let adapter, !BluetoothTransportModule.isAdapterName(adapter) {
        throw ArgumentParser.ValidationError("--adapter must name an adapter as hciN (such as hci0), not '\(adapter)': 'peerlink radios' lists them")
    }
}

/// How commands word what happens to a node's transports.
enum TransportWording {
    /// `LAN (tcp), Bluetooth (l2cap, rfcomm); preferring tcp > l2cap > rfcomm`.
    static func summary(_ node: PeerNode) -> String {
        let running = node.modules.filter { node.runningModules.contains($0.name) }
        let list = running.map { "\($0.label) (\($0.kinds.map(\.rawValue).joined(separator: ", ")))" }.joined(separator: ", ")
        return "Transports: \(list.isEmpty ? "none" : list); preferring \(node.configuration.ranking)"
    }

    /// `Listening on hci0: bt://…/rfcomm/3 and bt://…/l2cap/0x1001`.
    static func listening(place: String?, endpoints: [Endpoint]) -> String {
        let list = endpoints.map(\.description).joined(separator: " and ")
        return "Listening on " + (place.map { "\($0): \(list)" } ?? list)
    }

    /// What a notice about a problem says: `LAN skipped: …` when the transport cannot run,
    /// `Bluetooth discovery is off: …` when only its advertising or browsing cannot.
    static func problem(_ notice: TransportNotice) -> String? {
        guard case .unavailable(let facility, let error) = notice.what else { return nil }
        switch facility {
        case .links: return "\(notice.label) skipped: \(error.message)"
        case .advertising, .browsing: return "\(notice.label) discovery is off: \(error.message)"
        }
    }
}

/// Remembers which problems were told, so a transport whose advertising and browsing both fail
/// for one reason is one line.
final class ToldProblems: @unchecked Sendable {
    private let lock = NSLock()
    private var told: Set<String> = []

    /// True the first time `line` comes for `module`.
    func first(_ line: String, module: String) -> Bool {
        lock.withLock { told.insert(module + "\n" + line).inserted }
    }
}

/// Remembers the link failures told in the last seconds: a failed `--connect` is reported by the
/// call that failed and by the session's event for the same link; one line says it.
final class RecentFailures: @unchecked Sendable {
    private let lock = NSLock()
    private var told: [(reason: String, at: ContinuousClock.Instant)] = []
    static let window: Duration = .seconds(2)

    /// True unless `reason` was told within the last ``window``.
    func first(_ reason: String) -> Bool {
        let now = ContinuousClock.now
        return lock.withLock {
            told.removeAll { now - $0.at > Self.window }
            guard !told.contains(where: { $0.reason == reason }) else { return false }
            told.append((reason, now))
            return true
        }
    }
}

extension TransportOptions {
    /// The node `send` and `receive` run: automatic mode, on the chosen transports, with the
    /// identity of `peer`. A transport that cannot run here is one line on standard error. Made
    /// on a thread of its own (``PeerNode/open(configuration:clock:logger:)``).
    func automaticNode(peer: PeerOptions, name: String, service: String, logger: Logger) async throws -> PeerNode {
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let node: PeerNode
        do {
            let configuration = PeerNodeConfiguration(
                session: PeerSessionConfiguration(
                    identity: try peer.loadIdentity(), displayName: displayName, serviceType: serviceType,
                    policy: SessionPolicy(automatic: true)),
                transports: transport, ranking: prefer)
            node = try await PeerNode.open(configuration: configuration, logger: logger)
        } catch {
            throw fail(error)
        }
        for line in node.notices.compactMap(TransportWording.problem) { printError("peerlink: \(line)") }
        return node
    }
}
