import ArgumentParser
import Foundation
import Logging
import PeerLink

struct Advertise: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish this peer on the LAN and over Bluetooth until interrupted.",
        discussion: "Runs until SIGINT (Ctrl-C) or SIGTERM, then withdraws the advertisements and exits 0. Over Bluetooth the advertisement is an SDP record registered with bluetoothd; with --transport auto (the default) a transport that is unavailable is one line on standard error and the other still advertises.")

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8.")
    var name: String

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens (published as _TYPE._tcp).")
    var service: String = ServiceType.default.value

    @Option(parsing: .unconditionalSingleValue, help: ArgumentHelp("Discovery info to publish; repeat for more entries.", valueName: "key=value"))
    var info: [String] = []

    @Option(help: "Where to advertise: lan, bluetooth or auto (both).")
    var transport: String = TransportSelection.auto.rawValue

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
        guard TransportSelection(rawValue: transport) != nil else {
            throw ArgumentParser.ValidationError("--transport must be lan, bluetooth or auto")
        }
        guard channel == 0 || RFCOMMChannel(channel) != nil else {
            throw ArgumentParser.ValidationError("--channel must be an RFCOMM channel from 1 to 30, or 0 for the first free one")
        }
        guard psm == "0" || L2CAPPSM(psm) != nil else {
            throw ArgumentParser.ValidationError("--psm must be a valid L2CAP PSM (odd low byte, even high byte, e.g. 0x1001), or 0 for the first free one")
        }
        if let adapter, !(adapter.hasPrefix("hci") && adapter.count > 3 && adapter.dropFirst(3).allSatisfy(\.isNumber)) {
            throw ArgumentParser.ValidationError("--adapter must name an adapter as hciN (e.g. hci0); 'peerlink radios' lists them")
        }
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.advertise")
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let discoveryInfo = try DiscoveryInfo(arguments: info)
        let selection = TransportSelection(rawValue: transport)!
        let identity: Identity
        do {
            identity = try peer.loadIdentity()
        } catch {
            throw fail(error)
        }
        var problems: [PeerLinkError] = []

        var lan: (advertiser: LANAdvertiser, listener: TCPListener)?
        if selection.usesLAN {
            do {
                let listener: TCPListener
                do {
                    listener = try TCPListener()
                } catch {
                    throw PeerLinkError(.unavailable, "cannot listen for connections: \(error)")
                }
                let advertiser = try LANAdvertiser(
                    identity: identity, displayName: displayName, serviceType: serviceType, info: discoveryInfo,
                    port: listener.port, logger: logger)
                lan = (advertiser, listener)
                printLine("Advertising \(displayName) (id \(advertiser.peer.fingerprint.grouped)) as \(serviceType.dnsSDType), port \(listener.port)")
            } catch let error as PeerLinkError {
                problems.append(error)
                if selection == .auto { printError("peerlink: LAN skipped: \(error.message)") }
            }
        }
        var bluetooth: (advertiser: BluetoothAdvertiser, listeners: [BluetoothTransportListener])?
        if selection.usesBluetooth {
            do {
                let started = try startBluetooth(identity: identity, displayName: displayName, serviceType: serviceType, info: discoveryInfo, logger: logger)
                bluetooth = started
                printLine("Advertising \(displayName) (id \(started.advertiser.peer.fingerprint.grouped)) over Bluetooth on \(started.advertiser.adapter) \(started.advertiser.adapterAddress): SDP service class \(serviceType.bluetoothServiceClass), RFCOMM channel \(started.advertiser.record.channel.map(\.description) ?? "-"), L2CAP PSM \(started.advertiser.record.psm.map(\.description) ?? "-")")
            } catch {
                problems.append(error)
                if selection == .auto { printError("peerlink: Bluetooth skipped: \(error.message)") }
            }
        }
        if lan == nil && bluetooth == nil, let problem = problems.last {
            throw fail(problem)
        }
        for (key, value) in discoveryInfo.entries.sorted(by: { $0.key < $1.key }) {
            printLine("  info \(key)=\(value)")
        }
        if bluetooth != nil && lan == nil {
            printLine("Registered with bluetoothd. Press Ctrl-C to stop.")
        }

        // Connections are accepted and closed: until sessions arrive, this port only answers
        // browsers' liveness probes.
        let lanListener = lan?.listener
        let lanAdvertiser = lan?.advertiser
        let acceptor = Task {
            guard let listener = lanListener else { return }
            while let connection = try? await listener.accept() {
                connection.close()
            }
        }
        let watcher = Task {
            guard let advertiser = lanAdvertiser else { return }
            for await event in advertiser.events {
                switch event {
                case .published(let instance):
                    printLine("Published as \"\(instance)\". Press Ctrl-C to stop.")
                case .renamed(let from, let to):
                    printLine("The name \"\(from)\" is taken on this network; publishing as \"\(to)\".")
                case .daemonUnavailable:
                    printLine("avahi-daemon went away; publishing again when it is back.")
                case .failed(let error):
                    printError("peerlink: \(error.message)")
                }
            }
        }
        let signal = await waitForTerminationSignal()
        lan?.advertiser.stop()
        lan?.listener.close()
        bluetooth?.advertiser.stop()
        for listener in bluetooth?.listeners ?? [] { listener.close() }
        watcher.cancel()
        acceptor.cancel()
        printLine("Withdrawn (\(signal == SIGINT ? "interrupted" : "terminated")).")
    }

    /// Listeners on the channel and PSM (the kernel's pick for 0), each connection accepted and
    /// closed like the TCP port's, and the SDP record pointing at them.
    private func startBluetooth(
        identity: Identity, displayName: DisplayName, serviceType: ServiceType, info: DiscoveryInfo, logger: Logger
    ) throws(PeerLinkError) -> (advertiser: BluetoothAdvertiser, listeners: [BluetoothTransportListener]) {
        let rfcomm = try BluetoothTransportListener(.rfcomm, port: UInt16(channel))
        var listeners = [rfcomm]
        do throws(PeerLinkError) {
            let l2cap = try BluetoothTransportListener(.l2cap, port: L2CAPPSM(psm)?.value ?? 0)
            listeners.append(l2cap)
            let advertiser = try BluetoothAdvertiser(
                identity: identity, displayName: displayName, serviceType: serviceType, info: info,
                channel: RFCOMMChannel(Int(rfcomm.port)), psm: L2CAPPSM(Int(l2cap.port)), adapter: adapter, logger: logger)
            for listener in listeners {
                Task {
                    while let link = try? await listener.accept() { link.close() }
                }
            }
            return (advertiser, listeners)
        } catch {
            for listener in listeners { listener.close() }
            throw error
        }
    }
}
