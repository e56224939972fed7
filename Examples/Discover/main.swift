// Lists PeerLink peers on the LAN as they come and go: the smallest program built on PeerLink's
// discovery. Run two `peerlink advertise` processes (or machines) and watch them appear here.
import Foundation
import PeerLink

let arguments = CommandLine.arguments.dropFirst()
let service: ServiceType
do {
    service = try ServiceType(arguments.first ?? ServiceType.default.value)
} catch {
    FileHandle.standardError.write(Data("discover: \(error)\n".utf8))
    exit(64)
}

let browser = LANBrowser(serviceType: service)
let events: AsyncStream<DiscoveryEvent>
do {
    events = try browser.events()
} catch {
    FileHandle.standardError.write(Data("discover: \(error.message)\n".utf8))
    exit(69)
}
print("Looking for \(service.dnsSDType) peers; Ctrl-C to stop.")
for await event in events {
    switch event {
    case .found(let peer):
        print("+ \(peer.id.displayName) (\(peer.id.fingerprint.grouped)) at \(peer.endpoints.map(\.description).joined(separator: ", "))")
    case .updated(let peer):
        print("~ \(peer.id.displayName) now at \(peer.endpoints.map(\.description).joined(separator: ", "))")
    case .lost(let id):
        print("- \(id.displayName) (\(id.fingerprint.grouped))")
    }
}
