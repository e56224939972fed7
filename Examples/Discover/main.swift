// Lists PeerLink peers nearby as they come and go — on the LAN and over Bluetooth, one line per
// peer whatever the number of transports it is found on: the smallest program built on
// PeerLink's discovery. Run two `peerlink advertise` processes (or machines) and watch them
// appear here.
import Foundation
import PeerLink
import Synchronization

let arguments = Array(CommandLine.arguments.dropFirst())
let service: ServiceType
let transports: TransportChoice
do {
    service = try ServiceType(arguments.first ?? ServiceType.default.value)
    transports = try TransportChoice(parsing: arguments.dropFirst().first ?? "auto")
} catch {
    FileHandle.standardError.write(Data("discover: \(error)\n".utf8))
    exit(64)
}

let discovery = PeerDiscovery(modules: transports.modules(), request: BrowseRequest(serviceType: service))
print("Looking for \(service.dnsSDType) peers on \(discovery.modules.joined(separator: " and ")); Ctrl-C to stop.")
let total = discovery.modules.count
let failures = Atomic(0)
await discovery.run { event in
    switch event {
    case .peer(.found(let peer)):
        print("+ \(peer.id.displayName) (\(peer.id.fingerprint.grouped)) at \(peer.endpoints.map(\.description).joined(separator: ", "))")
    case .peer(.updated(let peer)):
        print("~ \(peer.id.displayName) now at \(peer.endpoints.map(\.description).joined(separator: ", "))")
    case .peer(.lost(let id)):
        print("- \(id.displayName) (\(id.fingerprint.grouped))")
    case .browsing:
        break
    case .unavailable(_, let label, let error):
        FileHandle.standardError.write(Data("discover: \(label): \(error.message)\n".utf8))
        if failures.add(1, ordering: .relaxed).newValue == total { exit(69) }
    }
}
