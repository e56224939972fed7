import ArgumentParser
import Foundation
import Logging
import PeerLink

/// Chat's options for explicit endpoints and Bluetooth links: `--connect`, `--adapter`,
/// `--rfcomm-channel`, `--l2cap-psm`.
struct ChatLinkOptions: ParsableArguments {
    @Option(help: ArgumentHelp(
        "Connect to the peer at this endpoint, whoever it is: bt://ADDR/rfcomm/CHANNEL, bt://ADDR/l2cap/PSM or tcp://HOST:PORT.",
        valueName: "endpoint"))
    var connect: String?

    @Option(help: ArgumentHelp("The Bluetooth adapter to use, hciN (default: the first one that is up).", valueName: "hciN"))
    var adapter: String?

    @Option(help: ArgumentHelp("Listen for RFCOMM links on this channel, 1 to 30 (default: a free one).", valueName: "channel"))
    var rfcommChannel: Int?

    @Option(help: ArgumentHelp("Listen for L2CAP links on this PSM, 0x1001 and up, odd (default: a free one).", valueName: "psm"))
    var l2capPsm: String?

    @Option(help: ArgumentHelp(
        "Discovery: lan (the default), bluetooth (an SDP record through bluetoothd and Bluetooth scans), or auto (both; LAN endpoints are dialled first).",
        valueName: "lan|bluetooth|auto"))
    var transport: String?

    /// The transports to discover peers on.
    var selection: TransportSelection { transport.flatMap(TransportSelection.init(rawValue:)) ?? .lan }

    /// The endpoint of `--connect`, parsed.
    var endpoint: Endpoint? { connect.flatMap { try? Endpoint(parsing: $0) } }

    /// Whether any option asks for Bluetooth links.
    var wantsBluetooth: Bool {
        adapter != nil || rfcommChannel != nil || l2capPsm != nil || endpoint?.isBluetooth == true || selection.usesBluetooth
    }

    func validate() throws {
        if let transport, TransportSelection(rawValue: transport) == nil {
            throw ArgumentParser.ValidationError("--transport must be lan, bluetooth or auto, not '\(transport)'")
        }
        if let connect {
            do {
                _ = try Endpoint(parsing: connect)
            } catch {
                throw ArgumentParser.ValidationError("--connect: \(error.message)")
            }
        }
        if let adapter, Self.adapterIndex(adapter) == nil {
            throw ArgumentParser.ValidationError("--adapter must name an adapter as hciN (such as hci0), not '\(adapter)': list them with 'peerlink radios'")
        }
        if let rfcommChannel, RFCOMMChannel(rfcommChannel) == nil {
            throw ArgumentParser.ValidationError("--rfcomm-channel must be 1 to 30, not \(rfcommChannel)")
        }
        if let l2capPsm {
            guard let psm = L2CAPPSM(l2capPsm) else {
                throw ArgumentParser.ValidationError(
                    "--l2cap-psm must be a PSM such as 0x1001: odd in its low byte, even in its high byte; not '\(l2capPsm)'")
            }
            guard psm.isDynamic else {
                throw ArgumentParser.ValidationError(
                    "--l2cap-psm \(psm) is reserved (below 0x1001, needs CAP_NET_BIND_SERVICE): use a dynamic PSM such as 0x1001")
            }
        }
    }

    static func adapterIndex(_ name: String) -> Int? {
        guard name.hasPrefix("hci"), let index = Int(name.dropFirst(3)), index >= 0 else { return nil }
        return index
    }

    /// The adapter to use: the one named, else the first that is up.
    func chosenAdapter() throws(PeerLinkError) -> BluetoothAdapter {
        let adapters = try BluetoothAdapter.all()
        if let adapter {
            guard let found = adapters.first(where: { $0.name == adapter }) else {
                let names = adapters.map(\.name).joined(separator: ", ")
                throw PeerLinkError(
                    .unavailable, "there is no Bluetooth adapter \(adapter) (this machine has \(names.isEmpty ? "none" : names)): see 'peerlink radios'")
            }
            guard found.isUp else {
                throw PeerLinkError(
                    .unavailable,
                    "adapter \(found.name) is down: switch it on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth' if it is blocked)")
            }
            return found
        }
        guard let first = adapters.first(where: \.isUp) else {
            throw PeerLinkError(
                .unavailable,
                adapters.isEmpty
                    ? "this machine has no Bluetooth adapter: plug one in, or check 'rfkill list'"
                    : "no Bluetooth adapter is up: switch one on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth')")
        }
        return first
    }

    /// Bluetooth transport and listeners (RFCOMM and L2CAP) on the chosen adapter.
    func bluetoothLinks() throws(PeerLinkError) -> (adapter: BluetoothAdapter, transport: BluetoothTransport, listeners: [BluetoothTransportListener]) {
        let adapter = try chosenAdapter()
        guard let address = BluetoothAddress(adapter.address) else {
            throw PeerLinkError(.unknown, "adapter \(adapter.name) reports an address PeerLink cannot read: \(adapter.address)")
        }
        let rfcomm = try BluetoothTransportListener(.rfcomm, adapter: address, port: UInt16(rfcommChannel ?? 0))
        let l2cap: BluetoothTransportListener
        do {
            l2cap = try BluetoothTransportListener(.l2cap, adapter: address, port: l2capPsm.flatMap { L2CAPPSM($0)?.value } ?? 0)
        } catch {
            rfcomm.close()
            throw error
        }
        return (adapter, BluetoothTransport(adapter: address), [rfcomm, l2cap])
    }
}

/// What chat runs: a LAN peer (discovery through avahi-daemon) with any Bluetooth links added,
/// or, when avahi-daemon is not running but Bluetooth links were asked for, a session on those
/// links alone.
enum ChatNode: Sendable {
    case lan(LANPeer, ChatBluetoothDiscovery?)
    case links(PeerSession, ChatBluetoothDiscovery?)

    var session: PeerSession {
        switch self {
        case .lan(let node, _): return node.session
        case .links(let session, _): return session
        }
    }

    func run() async {
        switch self {
        case .lan(let node, let bluetooth):
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await node.run() }
                if let bluetooth { group.addTask { await bluetooth.run(feed: node.feed) } }
                await group.next()
                group.cancelAll()
            }
            bluetooth?.stop()
        case .links(let session, let bluetooth):
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await session.run() }
                if let bluetooth { group.addTask { await bluetooth.run(feed: DiscoveryFeed(session: session, selection: .bluetooth)) } }
                await group.next()
                group.cancelAll()
            }
            bluetooth?.stop()
            for listener in session.listeners { listener.close() }
        }
    }

    /// Makes the node; says on the console which Bluetooth endpoints it listens on.
    static func make(
        configuration: PeerSessionConfiguration, links: ChatLinkOptions, console: ChatConsole, logger: Logger
    ) throws(PeerLinkError) -> ChatNode {
        var transports: [any Transport] = []
        var listeners: [any TransportListener] = []
        var discovery: ChatBluetoothDiscovery?
        if links.wantsBluetooth {
            let bluetooth = try links.bluetoothLinks()
            transports = [bluetooth.transport]
            listeners = bluetooth.listeners
            let endpoints = bluetooth.listeners.flatMap(\.localEndpoints).map(\.description).joined(separator: " and ")
            console.status("Listening on \(bluetooth.adapter.name): \(endpoints)")
            if links.selection.usesBluetooth {
                do {
                    discovery = try ChatBluetoothDiscovery(
                        configuration: configuration, adapter: bluetooth.adapter.name, listeners: bluetooth.listeners, logger: logger)
                    console.status("Advertising over Bluetooth (SDP record through bluetoothd) and scanning for peers")
                } catch {
                    // The links still work: peers can connect with --connect.
                    console.warning("peerlink: Bluetooth discovery is off: \(error.message)")
                }
            }
        }
        do throws(PeerLinkError) {
            guard links.selection.usesLAN else { throw PeerLinkError(.unavailable, "--transport bluetooth") }
            return .lan(try LANPeer(configuration: configuration, transports: transports, listeners: listeners, logger: logger), discovery)
        } catch where error.code == .unavailable && !listeners.isEmpty {
            if links.selection.usesLAN { console.status("LAN discovery is off (\(error.message)); Bluetooth links only") }
            let session = PeerSession(
                configuration: configuration, transports: [TCPTransport()] + transports, listeners: listeners, logger: logger)
            return .links(session, discovery)
        } catch {
            discovery?.stop()
            for listener in listeners { listener.close() }
            throw error
        }
    }

    /// `--connect`: connects to the endpoint once the session runs; returns an exit status
    /// when that failed (nil: connected, or still trying through the session).
    static func connect(_ endpoint: Endpoint, session: PeerSession, console: ChatConsole) async -> Int32? {
        // run() is started by the same task group: wait until the session takes work.
        for _ in 0..<400 where !session.isRunning {
            try? await Task.sleep(for: .milliseconds(25))
        }
        if session.isRunning {
            do {
                let peer = try await session.connect(to: endpoint)
                console.status("connected to \(peer.displayName) (id \(peer.fingerprint.grouped)) at \(endpoint)")
                return nil
            } catch let error as PeerLinkError {
                console.warning("peerlink: cannot connect to \(endpoint): \(error.message)")
                return error.code == .invalidParameter ? 64 : 69
            } catch {
                console.warning("peerlink: cannot connect to \(endpoint): \(error)")
                return 1
            }
        }
        console.warning("peerlink: cannot connect to \(endpoint): the session did not start")
        return 1
    }
}

/// Chat's Bluetooth discovery: an SDP record for its RFCOMM and L2CAP listeners, and a
/// ``BluetoothBrowser`` whose peers go into the session's ``DiscoveryFeed`` as source `bluetooth`.
final class ChatBluetoothDiscovery: Sendable {
    let advertiser: BluetoothAdvertiser
    let browser: BluetoothBrowser
    private let logger: Logger

    init(configuration: PeerSessionConfiguration, adapter: String, listeners: [BluetoothTransportListener], logger: Logger) throws(PeerLinkError) {
        let channel = listeners.first { $0.kind == .rfcomm }.flatMap { RFCOMMChannel(Int($0.port)) }
        let psm = listeners.first { $0.kind == .l2cap }.flatMap { L2CAPPSM(Int($0.port)) }
        advertiser = try BluetoothAdvertiser(
            identity: configuration.identity, displayName: configuration.displayName, serviceType: configuration.serviceType,
            channel: channel, psm: psm, adapter: adapter, logger: logger)
        browser = BluetoothBrowser(
            serviceType: configuration.serviceType, adapter: adapter, excluding: [configuration.identity.fingerprint], logger: logger)
        self.logger = logger
    }

    /// Browses until cancelled, feeding the session.
    func run(feed: DiscoveryFeed) async {
        do {
            for await event in try await browser.events() {
                feed.apply(event, from: "bluetooth")
            }
        } catch {
            logger.warning("Bluetooth browsing stopped: \(error.message)")
        }
    }

    func stop() { advertiser.stop() }
}
