import Foundation
import Testing

/// Runs in CI (fails there if the lab cannot run), and wherever the lab's needs are met.
private let labEnabled = NetLab.missingRequirement == nil || TestHost.daemonsRequired
private let labReason: Comment = "the namespace lab cannot run here: \(NetLab.missingRequirement ?? "?")"

@Suite("several hosts: the namespace lab (Hardware/netlab.sh)", .enabled(if: labEnabled, labReason))
struct MultiHostTests {
    @Test("a peer on host 1 is found from host 2 at host 1's address, and reported lost within 10 s of a cable cut", .timeLimit(.minutes(2)))
    func discoveryAndCut() async throws {
        if let missing = NetLab.missingRequirement { Issue.record("\(missing)"); return }
        let service = TestHost.uniqueServiceType("h")
        var prefix = ""
        try await withNetLab(hosts: 2) { lab in
            prefix = lab.prefix
            let host1 = try await lab.address(of: 1)
            #expect(host1.hasPrefix("10.99.0."), "lab addresses are 10.99.0.x, got \(host1)")

            let advertiser = try lab.start(
                on: 1, [TestHost.peerlinkBinary, "advertise", "--name", "H1", "--service", service],
                environment: ["XDG_CONFIG_HOME": TestHost.temporaryDirectory()])
            try await advertiser.waitForLine(containing: "Published as \"H1\"")

            // A one-shot scan from host 2.
            let scan = try await lab.run(
                on: 2, [TestHost.peerlinkBinary, "scan", "--lan", "--service", service, "--timeout", "3", "--json"],
                environment: ["XDG_CONFIG_HOME": TestHost.temporaryDirectory()])
            #expect(scan.status == 0, "stderr:\n\(scan.stderr)")
            let peers = try JSONDecoder().decode([ScannedPeer].self, from: Data(scan.stdout.utf8))
            #expect(peers.count == 1, "\(scan.stdout)")
            let peer = try #require(peers.first)
            #expect(peer.name == "H1")
            #expect(peer.endpoints.map(\.host) == [host1], "host 2 reaches H1 at host 1's address: \(peer.endpoints)")

            // A watching scan from host 2; then host 1's cable is pulled.
            let watch = try lab.start(
                on: 2, [TestHost.peerlinkBinary, "scan", "--lan", "--service", service, "--watch", "--json", "--timeout", "25"],
                environment: ["XDG_CONFIG_HOME": TestHost.temporaryDirectory()])
            try await watch.waitForLine(timeout: .seconds(10)) { WatchLine.parse($0).map { $0.event == "found" && $0.peerID == peer.id } ?? false }

            let cut = ContinuousClock.now
            try await lab.control("cut", "1")
            let lost = try await watch.waitForTimedLine(timeout: .seconds(20)) {
                WatchLine.parse($0).map { $0.event == "lost" && $0.peerID == peer.id } ?? false
            }
            let delay = cut.duration(to: lost.time)
            #expect(delay <= .seconds(10), "lost \(delay) after the cut")
            watch.terminate()
            advertiser.terminate()
        }
        #expect(!prefix.isEmpty)
        let left = NetLab.namespaces().filter { $0.hasPrefix(prefix + "-") }
        #expect(left.isEmpty, "namespaces left behind: \(left)")
    }
}
