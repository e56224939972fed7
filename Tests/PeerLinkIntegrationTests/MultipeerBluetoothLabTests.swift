import Foundation
import PeerLink
import Testing

/// The MultipeerConnectivity-shaped API over Bluetooth only, in the VM lab: two processes (the
/// MPCChat example, a `MultipeerSession` with an advertiser and a browser), one per virtual
/// controller, with `--transport bluetooth` and no avahi-daemon. The code is the one that runs
/// over the LAN; only the transport choice differs.
@Suite(
    "MultipeerBluetooth: MultipeerSession between two processes over Bluetooth only", .serialized,
    .enabled(if: DiscoveryLab.enabled, "runs in the Bluetooth VM lab only (Hardware/bluetooth-lab.sh sets PEERLINK_BLUETOOTH_LAB=1)"))
struct MultipeerBluetoothLabTests {
    static func mpcchat(_ arguments: [String]) throws -> ChildProcess {
        try ChildProcess(
            TestHost.productsDirectory.appendingPathComponent("peerlink-example-mpcchat").path, arguments,
            environment: ["XDG_CONFIG_HOME": TestHost.temporaryDirectory("mpc-bt")], withInput: true)
    }

    @Test(
        "Bob's browser finds Ann over SDP, invites her, Ann's advertiser accepts: connected over Bluetooth, messages both ways, leaving is seen",
        .timeLimit(.minutes(4)))
    func browseInviteAcceptAndTalk() async throws {
        let service = TestHost.uniqueServiceType("m")
        let ann = try Self.mpcchat(
            ["--name", "Ann", "--service", service, "--transport", "bluetooth", "--adapter", DiscoveryLab.advertiserAdapter])
        defer { ann.terminate() }
        let bob = try Self.mpcchat(
            ["--name", "Bob", "--service", service, "--transport", "bluetooth", "--adapter", DiscoveryLab.scannerAdapter, "--invite", "Ann"])
        defer { bob.terminate() }
        do {
            _ = try await bob.waitForLine(containing: "+ Ann found", timeout: .seconds(120))
            _ = try await bob.waitForLine(containing: "* Ann connected", timeout: .seconds(90))
            _ = try await ann.waitForLine(containing: "* Bob connected", timeout: .seconds(60))
            ann.type("hello Bob, over Bluetooth\n")
            bob.type("hi Ann\n")
            _ = try await bob.waitForLine(containing: "Ann: hello Bob, over Bluetooth", timeout: .seconds(30))
            _ = try await ann.waitForLine(containing: "Bob: hi Ann", timeout: .seconds(30))
            #expect(!ann.stderr.contains("avahi") && !bob.stderr.contains("avahi"), "Bluetooth only: the LAN is never tried")
        } catch {
            Issue.record("Ann's stderr:\n\(ann.stderr)\nBob's stderr:\n\(bob.stderr)")
            throw error
        }
        bob.closeInput()
        #expect(try await bob.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(bob.stderr)")
        // Bob's goodbye went out before he exited: Ann sees him leave well within the 30 s she
        // would keep a peer whose link was lost.
        _ = try await ann.waitForLine(containing: "* Bob not connected", timeout: .seconds(20))
        ann.closeInput()
        #expect(try await ann.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(ann.stderr)")
    }
}
