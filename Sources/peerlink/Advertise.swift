import ArgumentParser
import Foundation
import PeerLink

struct Advertise: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish this peer on the LAN until interrupted.",
        discussion: "Runs until SIGINT (Ctrl-C) or SIGTERM, then withdraws the advertisement and exits 0.")

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8.")
    var name: String

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens (published as _TYPE._tcp).")
    var service: String = ServiceType.default.value

    @Option(parsing: .unconditionalSingleValue, help: ArgumentHelp("Discovery info to publish; repeat for more entries.", valueName: "key=value"))
    var info: [String] = []

    @OptionGroup var peer: PeerOptions

    func validate() throws {
        do {
            _ = try DisplayName(name)
            _ = try ServiceType(service)
            _ = try DiscoveryInfo(arguments: info)
        } catch {
            throw error.usageError
        }
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.advertise")
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let discoveryInfo = try DiscoveryInfo(arguments: info)
        let advertiser: LANAdvertiser
        let listener: TCPListener
        do {
            let identity = try peer.loadIdentity()
            do {
                listener = try TCPListener()
            } catch {
                throw PeerLinkError(.unavailable, "cannot listen for connections: \(error)")
            }
            advertiser = try LANAdvertiser(
                identity: identity, displayName: displayName, serviceType: serviceType, info: discoveryInfo,
                port: listener.port, logger: logger)
        } catch let error as PeerLinkError {
            throw fail(error)
        }
        printLine("Advertising \(displayName) (id \(advertiser.peer.fingerprint.grouped)) as \(serviceType.dnsSDType), port \(listener.port)")
        for (key, value) in discoveryInfo.entries.sorted(by: { $0.key < $1.key }) {
            printLine("  info \(key)=\(value)")
        }

        // Connections are accepted and closed: until sessions arrive, this port only answers
        // browsers' liveness probes.
        let acceptor = Task {
            while let connection = try? await listener.accept() {
                connection.close()
            }
        }
        let watcher = Task {
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
        advertiser.stop()
        listener.close()
        watcher.cancel()
        acceptor.cancel()
        printLine("Withdrawn (\(signal == SIGINT ? "interrupted" : "terminated")).")
    }
}
