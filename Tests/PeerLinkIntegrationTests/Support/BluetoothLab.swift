import Crypto
import Foundation
import PeerLink
import Testing

/// The Bluetooth VM lab (Hardware/bluetooth-lab.sh): two virtual controllers, hci0 and hci1,
/// that see each other, in a kernel with Bluetooth. The lab script sets
/// `PEERLINK_BLUETOOTH_LAB=1`; the Bluetooth suites run only there.
enum BluetoothLab {
    /// Whether the environment says this is the lab.
    static let isLab = TestHost.environment["PEERLINK_BLUETOOTH_LAB"] == "1"

    /// Whether this kernel has Bluetooth sockets.
    static let kernelHasBluetooth: Bool = {
        let fd = socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue), 0 /* BTPROTO_L2CAP */)
        guard fd >= 0 else { return false }
        close(fd)
        return true
    }()

    /// The lab's suites run: the lab, with a Bluetooth kernel.
    static var enabled: Bool { isLab && kernelHasBluetooth }

    static let reason: Comment =
        "Bluetooth links need the VM lab (Hardware/bluetooth-lab.sh sets PEERLINK_BLUETOOTH_LAB=1, and its kernel has AF_BLUETOOTH)"

    /// The address of adapter `index` (the lab exports BTVM_HCIn_ADDR; else asked of the kernel).
    static func address(_ index: Int) throws -> BluetoothAddress {
        if let text = TestHost.environment["BTVM_HCI\(index)_ADDR"], let address = BluetoothAddress(text) { return address }
        guard let adapter = try BluetoothAdapter.all().first(where: { $0.index == index }),
            let address = BluetoothAddress(adapter.address)
        else { throw HarnessError("the lab has no adapter hci\(index)") }
        return address
    }

    /// Runs `hciconfig hciN ARGS` (the lab runs as root).
    static func hciconfig(_ index: Int, _ arguments: [String]) async throws {
        let tool = TestHost.which("hciconfig") ?? "/usr/bin/hciconfig"
        let result = try await runCommand(tool, ["hci\(index)"] + arguments, timeout: .seconds(20))
        guard result.status == 0 else {
            throw HarnessError("hciconfig hci\(index) \(arguments.joined(separator: " ")) failed: \(result.stderr)")
        }
    }

    /// Switches adapter `index` off or on the way a user does (`bluetoothctl power off|on`:
    /// bluetoothd's `Powered`), so bluetoothd closes the adapter's links and forgets their
    /// pairings as on a real machine; `hciconfig` where bluetoothd does not run.
    static func power(_ index: Int, on: Bool) async throws {
        let tool = TestHost.which("dbus-send") ?? "/usr/bin/dbus-send"
        let result = try await runCommand(
            tool,
            ["--system", "--print-reply", "--dest=org.bluez", "/org/bluez/hci\(index)", "org.freedesktop.DBus.Properties.Set",
             "string:org.bluez.Adapter1", "string:Powered", "variant:boolean:\(on)"], timeout: .seconds(20))
        if result.status != 0 { try await hciconfig(index, [on ? "up" : "down"]) }
    }

    /// Makes adapter `index` forget links whose other end was reset, as a real controller's link
    /// supervision timeout (about 20 s) does. The lab's virtual controllers (btvirt) never time
    /// a link out and refuse to disconnect one whose other end they dropped: after `hciconfig
    /// hci0 down`, hci1's kernel keeps the dead ACL connection, and new L2CAP or RFCOMM
    /// connects over it go nowhere (no answer, or `EBUSY` while the old RFCOMM session stays).
    /// Only a reset of `index` clears it, so this takes the adapter down and up again
    /// (bluetoothd sees it powered again; a PeerLink hold makes it discoverable again).
    static func forgetDeadLinks(_ index: Int) async throws {
        try await power(index, on: false)
        try await power(index, on: true)
        try await waitUntilNoLinks()
    }

    /// Gives a test that links the two controllers controllers that never paired: in the lab's
    /// main boots, `guest/renew-controllers.sh` creates them afresh (same addresses, no bonds).
    /// btvirt's emulated controllers pair faithfully only the first time: from the second
    /// pairing on, links between them are cut seconds after they open, or their pairing is
    /// refused — which real controllers never do. (The tests of ``BluetoothFreshLabTests`` run
    /// in a boot of their own and keep what they set up.)
    static func renewControllers() async throws {
        guard isLab, TestHost.environment["PEERLINK_BLUETOOTH_FRESH_BOOT"] != "1" else {
            try await waitUntilNoLinks()
            return
        }
        let home = TestHost.environment["BTVM_HOME"]
            ?? URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Hardware/btvm").path
        let result = try await runCommand("/bin/sh", [home + "/guest/renew-controllers.sh"], timeout: .seconds(90))
        guard result.status == 0 else { throw HarnessError("renewing the lab's controllers failed: \(result.stdout)\(result.stderr)") }
    }

    /// Waits (at most `timeout`) until adapter `index` is up again after ``power(_:on:)``
    /// (bluetoothd answers `Powered` before the controller is up), and a second more for it to
    /// take pages: a connect sent to it before then fails, and in the lab's kernel an RFCOMM
    /// connect sent right after such a failure can hang there for good.
    static func waitUntilUp(_ index: Int, timeout: Duration = .seconds(20)) async throws {
        let deadline = ContinuousClock.now + timeout
        while !((try? BluetoothAdapter.all())?.contains { $0.index == index && $0.isUp } ?? false) {
            guard ContinuousClock.now < deadline else { throw HarnessError("hci\(index) was not up within \(timeout)") }
            try await Task.sleep(for: .milliseconds(200))
        }
        try await Task.sleep(for: .seconds(1))
    }

    /// Waits (at most `timeout`) until neither lab adapter has an ACL link (`hcitool con`): the
    /// kernel drops an idle ACL link about 2 s after its last channel, and a test that starts
    /// while the previous one's link is going down can see its own new link cut with it.
    static func waitUntilNoLinks(timeout: Duration = .seconds(20)) async throws {
        let tool = TestHost.which("hcitool") ?? "/usr/bin/hcitool"
        let deadline = ContinuousClock.now + timeout
        var listing = ""
        while ContinuousClock.now < deadline {
            listing = try await runCommand(tool, ["con"], timeout: .seconds(10)).stdout
            if !listing.contains("ACL") { return }
            try await Task.sleep(for: .milliseconds(500))
        }
        throw HarnessError("ACL links still up after \(timeout): \(listing)")
    }

    /// The SHA-256 of `bytes` with their count, to compare what was sent with what arrived.
    static func digest(_ bytes: [UInt8]) -> String {
        "\(bytes.count) bytes, SHA-256 " + SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
    }

    /// `count` bytes of a seeded pseudo-random pattern.
    static func pattern(_ count: Int, seed: UInt64 = 0x5eed) -> [UInt8] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt8(truncatingIfNeeded: state >> 33)
        }
    }
}

/// Runs when the lab environment is set: the lab itself must have Bluetooth, so a broken lab
/// fails here instead of passing as "skipped".
@Suite("Bluetooth lab: the VM has what the suites need", .enabled(if: BluetoothLab.isLab, "not in the Bluetooth VM lab"))
struct BluetoothLabSelfTests {
    @Test func kernelHasBluetoothAndTwoAdapters() throws {
        #expect(BluetoothLab.kernelHasBluetooth, "socket(AF_BLUETOOTH) failed in the lab: is the bluetooth module loaded?")
        let adapters = try BluetoothAdapter.all()
        #expect(adapters.filter(\.isUp).count >= 2, "the lab should have hci0 and hci1 up: \(adapters)")
        #expect(try BluetoothLab.address(0) != BluetoothLab.address(1))
    }
}
