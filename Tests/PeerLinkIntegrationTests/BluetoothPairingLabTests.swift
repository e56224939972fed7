import Foundation
import PeerLink
import Testing

/// Bluetooth as distributions ship it (the lab's bluetoothd is Debian's, started as its service
/// starts it; Secure Simple Pairing on; adapters powered, not discoverable, not pairable):
/// the adapter is held discoverable while PeerLink advertises. (Pairing itself — no bond left, a
/// stale bond, an unrelated pairing, a desktop's agent — is in ``BluetoothFreshLabTests``.)
@Suite(
    "Bluetooth pairing in the stock configuration", .serialized,
    .enabled(if: DiscoveryLab.enabled && DiscoveryLab.managed.count >= 2, "runs in the Bluetooth VM lab only, with bluetoothd"),
    .timeLimit(.minutes(5)))
struct BluetoothPairingLabTests {
    @Test("the lab runs bluetoothd as the distribution's service does, SSP on, adapters not discoverable")
    func stockConfiguration() async throws {
        let pid = try String(contentsOfFile: "/run/btvm/bluetoothd.pid", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let arguments = try String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8).split(separator: "\0").map(String.init)
        #expect(arguments.first == "/usr/libexec/bluetooth/bluetoothd", "\(arguments)")
        #expect(!arguments.contains("-C") && !arguments.contains("--compat") && !arguments.contains("-f"), "\(arguments)")
        for index in 0...1 {
            #expect(try await BluetoothLab.adapterProperty(index, "Powered") == true)
            #expect(try await BluetoothLab.adapterProperty(index, "Discoverable") == false, "hci\(index) discoverable with no PeerLink running")
            #expect(try await BluetoothLab.adapterProperty(index, "Pairable") == false)
            let ssp = try await runCommand(TestHost.which("hciconfig") ?? "/usr/bin/hciconfig", ["hci\(index)", "sspmode"])
            #expect(ssp.stdout.contains("Simple Pairing mode: Enabled"), "\(ssp.stdout)")
        }
    }

    @Test("advertising makes the adapter discoverable, a scan finds the peer, and stopping restores it")
    func advertisingHoldsTheAdapterDiscoverable() async throws {
        let adapter = DiscoveryLab.advertiserAdapter == "hci0" ? 0 : 1
        #expect(try await BluetoothLab.adapterProperty(adapter, "Discoverable") == false)
        let advertiser = try await DiscoveryLab.advertise(name: "Lab Vera")
        defer { advertiser.child.terminate() }
        #expect(try await BluetoothLab.adapterProperty(adapter, "Discoverable") == true)
        let scan = try await DiscoveryLab.scanJSON()
        #expect(scan.peers.contains { $0["id"] as? String == advertiser.id }, "\(scan.stderr)")
        advertiser.child.signal(SIGINT)
        #expect(try await advertiser.child.waitForExit(timeout: .seconds(30)) == 0)
        #expect(try await BluetoothLab.adapterProperty(adapter, "Discoverable") == false, "not restored after the advertiser stopped")
    }

    /// A pairing PeerLink did not start (a bonding `Pair()` from the other machine) is the user's
    /// business: on a machine without an agent the kernel refuses it because the adapter is not
    /// pairable, and PeerLink never makes it pairable. (btvirt's emulated controllers accept such
    /// a pairing anyway — they answer the IO capability exchange themselves — so the lab checks
    /// what PeerLink controls: the adapter stays not pairable while PeerLink listens and
    /// advertises on it, and afterwards. With a desktop's agent the pairing goes to the user:
    /// ``BluetoothFreshLabTests/desktopAgentConfirmsLinks()``.)
    @Test("PeerLink never makes the adapter pairable: it stays not pairable while a chat listens and advertises, and after")
    func adapterStaysNotPairable() async throws {
        #expect(try await BluetoothLab.adapterProperty(0, "Pairable") == false)
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "paula", "--transport", "bluetooth", "--adapter", "hci0"], withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForStderrLine(containing: "Advertising over Bluetooth", timeout: .seconds(60))
        #expect(try await BluetoothLab.adapterProperty(0, "Discoverable") == true)
        #expect(try await BluetoothLab.adapterProperty(0, "Pairable") == false, "PeerLink made the adapter pairable")
        // a scan from the other controller (SDP, no pairing) changes nothing
        _ = try await DiscoveryLab.scanJSON()
        #expect(try await BluetoothLab.adapterProperty(0, "Pairable") == false)
        chat.closeInput()
        #expect(try await chat.waitForExit(timeout: .seconds(30)) == 0)
        #expect(try await BluetoothLab.adapterProperty(0, "Pairable") == false)
    }

    /// Two `peerlink chat --transport bluetooth`, one per controller, find each other over SDP
    /// and exchange a line each way. Returns what both printed on standard error (with
    /// `--verbose`: which side dialled which channel, and when, for a failure's report).
    @discardableResult
    static func twoChatsTalk() async throws -> String {
        let a = try ChildProcess.peerlink(
            ["chat", "--name", "alma", "--transport", "bluetooth", "--adapter", "hci0", "--verbose"], withInput: true)
        defer { a.terminate() }
        // alma listens and advertises before bert starts, so neither side's first dial meets a
        // channel nobody listens on yet: the pair gets one ACL link and pairs once (a second
        // pairing between btvirt's controllers is not what real ones do; see the suite's note)
        _ = try await a.waitForStderrLine(containing: "Advertising over Bluetooth", timeout: .seconds(60))
        let b = try ChildProcess.peerlink(
            ["chat", "--name", "bert", "--transport", "bluetooth", "--adapter", "hci1", "--verbose"], withInput: true)
        defer { b.terminate() }
        do {
            // automatic mode's fallback (10 s) and a refused first dial fit in this
            _ = try await b.waitForLine(containing: "* alma joined", timeout: .seconds(120))
            _ = try await a.waitForLine(containing: "* bert joined", timeout: .seconds(60))
            a.type("hello bert\n")
            b.type("hello alma\n")
            _ = try await b.waitForLine(containing: "alma: hello bert", timeout: .seconds(30))
            _ = try await a.waitForLine(containing: "bert: hello alma", timeout: .seconds(30))
        } catch {
            Issue.record("alma's stderr:\n\(a.stderr)\nbert's stderr:\n\(b.stderr)")
            throw error
        }
        b.closeInput()
        #expect(try await b.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(b.stderr)")
        a.closeInput()
        #expect(try await a.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(a.stderr)")
        return "alma's stderr:\n\(a.stderr)\nbert's stderr:\n\(b.stderr)"
    }
}


/// Tests that must meet the lab's controllers before they ever paired: each runs in a VM boot of
/// its own (`Hardware/bluetooth-lab.sh` boots once per test, with
/// `PEERLINK_BLUETOOTH_FRESH_BOOT=1`).
///
/// Why: btvirt's emulated controllers (BlueZ 5.66, and upstream as of this writing) remember the
/// IO capability a host gave in one pairing and skip the other side's IO capability exchange in
/// every later pairing. The side that skipped it stores the key as a bond (the lab's main boot
/// removes such bonds as they appear: `Hardware/btvm/guest/forget-bonds.py`), and with a desktop
/// agent's capability (DisplayYesNo) it sees its peer as asking for MITM protection and asks the
/// user — which real controllers never make it do for PeerLink's pairings. So what is measured
/// about bonds and agents here is the controllers' first pairing, which btvirt emulates faithfully.
@Suite(
    "Bluetooth pairing, each test in a fresh lab", .serialized,
    .enabled(
        if: DiscoveryLab.enabled && DiscoveryLab.managed.count >= 2 && TestHost.environment["PEERLINK_BLUETOOTH_FRESH_BOOT"] == "1",
        "runs in a VM boot of its own (Hardware/bluetooth-lab.sh does that)"),
    .timeLimit(.minutes(5)))
struct BluetoothFreshLabTests {
    /// The chats of the discovery suite, after the two machines were paired (bonded) and one of
    /// them forgot the other: no `bluetoothctl` step makes them talk again. Whichever side
    /// dials first, the side that kept the bond ends up dialling (automatic mode's fallback),
    /// and pairs afresh without bonding.
    /// PeerLink pairs without bonding: once the link is gone, neither side keeps a key.
    @Test("PeerLink's links pair on their own and leave no bond behind")
    func linksLeaveNoBond() async throws {
        let said = try await BluetoothPairingLabTests.twoChatsTalk()
        let held = try await BluetoothLab.waitUntilNeitherIsPaired()
        #expect(!held.hci0, "hci0 kept a bond with hci1 after PeerLink's link\n\(said)")
        #expect(!held.hci1, "hci1 kept a bond with hci0 after PeerLink's link\n\(said)")
    }

    @Test("a bond the listening side removed (bluetoothctl remove on hci0) does not keep two chats apart")
    func staleBondRemovedOnHci0() async throws {
        try await staleBondHeals(removedOn: 0)
    }

    @Test("a bond the dialling side removed (bluetoothctl remove on hci1) does not keep two chats apart")
    func staleBondRemovedOnHci1() async throws {
        try await staleBondHeals(removedOn: 1)
    }

    func staleBondHeals(removedOn: Int) async throws {
        try await BluetoothLab.bond()
        try await BluetoothLab.bluetoothctlRemove(on: removedOn)
        #expect(try await BluetoothLab.isPaired(on: 1 - removedOn) == true, "the other side should still hold the bond")
        try await BluetoothPairingLabTests.twoChatsTalk()
    }

    /// A desktop runs a pairing agent that asks its user (here: one that records every request
    /// and answers as the test tells it). Between two machines whose agents can display and
    /// confirm, a PeerLink link is put to the user of the machine being connected to, once per
    /// link: a yes-or-no authorization (the lab's first pairing), or on some controllers a
    /// six-digit number to confirm. A machine without an agent (a Pi without a desktop) is never
    /// asked. Accepted, the chats talk and no bond is kept; a pairing somebody else starts goes
    /// to the agent too, and a "no" refuses it.
    @Test("with desktop pairing agents: a PeerLink link is a yes or no the user gives, no bond is kept, a declined pairing fails")
    func desktopAgentConfirmsLinks() async throws {
        let agent = try await BluetoothLab.RecordingAgent.start(accepting: true)
        defer { agent.stop() }
        try await BluetoothPairingLabTests.twoChatsTalk()
        // Authorize a pairing (yes / no) or confirm a number: nothing to type, no PIN, no passkey.
        #expect(
            agent.requests.allSatisfy { $0.hasPrefix("request RequestAuthorization") || $0.hasPrefix("request RequestConfirmation") },
            "PeerLink's links asked the agent for more than a yes or no: \(agent.requests)")
        let held = try await BluetoothLab.waitUntilNeitherIsPaired()
        #expect(!held.hci0, "a confirmed PeerLink link left a bond on hci0")
        #expect(!held.hci1, "a confirmed PeerLink link left a bond on hci1")

        // The user's agent makes the adapter pairable; an unrelated pairing is put to it, and declined.
        try agent.answer(accepting: false)
        let asked = agent.requests.count
        try await BluetoothLab.setAdapterProperty(0, "Pairable", true)
        defer { Task { try? await BluetoothLab.setAdapterProperty(0, "Pairable", false) } }
        let hold = try BluetoothVisibilityHold.acquire(adapter: "hci0")
        defer { hold?.release() }
        let result = try await BluetoothLab.pair(from: 1, to: 0)
        #expect(result.status != 0, "the agent declined it, so the pairing must fail:\n\(result.stdout)\(result.stderr)")
        #expect(agent.requests.count > asked, "the pairing never reached the user's agent")
        #expect(try await BluetoothLab.isPaired(on: 0) == false)
    }
}

extension BluetoothLab {
    static let dbusSend = TestHost.which("dbus-send") ?? "/usr/bin/dbus-send"

    /// A boolean property of adapter `hciN` as bluetoothd reports it.
    static func adapterProperty(_ index: Int, _ name: String) async throws -> Bool? {
        let result = try await runCommand(
            dbusSend,
            ["--system", "--print-reply", "--dest=org.bluez", "/org/bluez/hci\(index)", "org.freedesktop.DBus.Properties.Get",
             "string:org.bluez.Adapter1", "string:\(name)"], timeout: .seconds(20))
        guard result.status == 0 else { throw HarnessError("reading hci\(index) \(name): \(result.stderr)") }
        if result.stdout.contains("boolean true") { return true }
        if result.stdout.contains("boolean false") { return false }
        return nil
    }

    static func setAdapterProperty(_ index: Int, _ name: String, _ value: Bool) async throws {
        let result = try await runCommand(
            dbusSend,
            ["--system", "--print-reply", "--dest=org.bluez", "/org/bluez/hci\(index)", "org.freedesktop.DBus.Properties.Set",
             "string:org.bluez.Adapter1", "string:\(name)", "variant:boolean:\(value)"], timeout: .seconds(20))
        guard result.status == 0 else { throw HarnessError("setting hci\(index) \(name): \(result.stderr)") }
    }

    static func devicePath(on index: Int) throws -> String {
        "/org/bluez/hci\(index)/dev_" + (try address(1 - index)).description.replacingOccurrences(of: ":", with: "_")
    }

    /// Waits (up to 20 s) until neither lab adapter holds a bond with the other: a link's key
    /// goes with its ACL link, a few seconds after its last channel. Returns what each held last.
    static func waitUntilNeitherIsPaired() async throws -> (hci0: Bool, hci1: Bool) {
        var held = (hci0: true, hci1: true)
        for attempt in 0..<40 {
            held = (try await isPaired(on: 0), try await isPaired(on: 1))
            if !held.hci0, !held.hci1 { break }
            if attempt < 39 { try await Task.sleep(for: .milliseconds(500)) }
        }
        return held
    }

    /// Whether adapter `index` holds a bond with the other lab adapter (Paired while not connected).
    static func isPaired(on index: Int) async throws -> Bool {
        let result = try await runCommand(
            dbusSend,
            ["--system", "--print-reply", "--dest=org.bluez", try devicePath(on: index), "org.freedesktop.DBus.Properties.Get",
             "string:org.bluez.Device1", "string:Paired"], timeout: .seconds(20))
        return result.status == 0 && result.stdout.contains("boolean true")
    }

    /// Asks bluetoothd on adapter `from` to pair with (bond to) the other adapter, as
    /// `bluetoothctl pair` does: discovers it first so bluetoothd has the device.
    static func pair(from index: Int, to other: Int) async throws -> (status: Int32, stdout: String, stderr: String) {
        let scan = try await runPeerlink(["scan", "--bluetooth", "--adapter", "hci\(index)", "--timeout", "4"], timeout: .seconds(60))
        _ = scan
        return try await runCommand(
            dbusSend,
            ["--system", "--print-reply", "--reply-timeout=30000", "--dest=org.bluez", try devicePath(on: index), "org.bluez.Device1.Pair"],
            timeout: .seconds(45))
    }

    /// hci1 and hci0 bond as two users would pair their machines (both pairable for it; the
    /// lab's controllers have no input or output, so it is "Just Works").
    static func bond() async throws {
        try await setAdapterProperty(0, "Pairable", true)
        try await setAdapterProperty(1, "Pairable", true)
        let hold = try BluetoothVisibilityHold.acquire(adapter: "hci0")
        let result = try await pair(from: 1, to: 0)
        hold?.release()
        try await setAdapterProperty(0, "Pairable", false)
        try await setAdapterProperty(1, "Pairable", false)
        guard result.status == 0 else { throw HarnessError("bonding hci1 with hci0 failed: \(result.stdout)\(result.stderr)") }
        // both sides keep it once the link is gone
        for _ in 0..<40 {
            let both = try await isPaired(on: 0)
            if both, try await isPaired(on: 1) { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        guard try await isPaired(on: 0), try await isPaired(on: 1) else { throw HarnessError("the bond was not stored on both sides") }
    }

    /// `bluetoothctl remove` of the other lab adapter, on adapter `index` (scripted on stdin).
    static func bluetoothctlRemove(on index: Int) async throws {
        // bluetoothctl reads its commands as a user types them: one at a time, once it is connected
        let tool = TestHost.which("bluetoothctl") ?? "/usr/bin/bluetoothctl"
        let commands = "sleep 2; echo 'select \(try address(index))'; sleep 1; echo 'remove \(try address(1 - index))'; sleep 2; echo quit"
        let result = try await runCommand("/bin/sh", ["-c", "(\(commands)) | \(tool)"], timeout: .seconds(30))
        guard try await !isPaired(on: index) else {
            throw HarnessError("bluetoothctl remove left the bond on hci\(index): \(result.stdout)\(result.stderr)")
        }
    }

    /// A pairing agent like a desktop's (`DisplayYesNo`, the default agent), run by the lab's
    /// Python: it records every request and accepts or declines it as `answer(accepting:)` last said.
    final class RecordingAgent: @unchecked Sendable {
        let child: ChildProcess
        let decisionPath: String

        init(child: ChildProcess, decisionPath: String) {
            self.child = child
            self.decisionPath = decisionPath
        }

        static func start(accepting: Bool) async throws -> RecordingAgent {
            let directory = TestHost.temporaryDirectory("agent")
            let path = directory + "/agent.py", decisionPath = directory + "/decision"
            try script.write(toFile: path, atomically: true, encoding: .utf8)
            try (accepting ? "accept" : "decline").write(toFile: decisionPath, atomically: true, encoding: .utf8)
            let child = try ChildProcess("/usr/bin/python3", ["-u", path, decisionPath])
            _ = try await child.waitForLine(containing: "agent registered", timeout: .seconds(30))
            return RecordingAgent(child: child, decisionPath: decisionPath)
        }

        func answer(accepting: Bool) throws {
            try (accepting ? "accept" : "decline").write(toFile: decisionPath, atomically: true, encoding: .utf8)
        }

        /// The requests the agent got (`RequestConfirmation`, `RequestAuthorization`, …).
        var requests: [String] { child.stdout.split(separator: "\n").filter { $0.hasPrefix("request ") }.map(String.init) }

        func stop() { child.terminate() }

        static let script = """
            import sys, dbus, dbus.service, dbus.mainloop.glib
            from gi.repository import GLib
            dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
            bus = dbus.SystemBus()
            decision = sys.argv[1]
            class Agent(dbus.service.Object):
                def ask(self, what):
                    print("request " + what, flush=True)
                    if open(decision).read().strip() != "accept":
                        raise dbus.DBusException("org.bluez.Error.Rejected", "the user said no")
                @dbus.service.method("org.bluez.Agent1", in_signature="ou", out_signature="")
                def RequestConfirmation(self, device, passkey): self.ask("RequestConfirmation %s %06d" % (device, passkey))
                @dbus.service.method("org.bluez.Agent1", in_signature="o", out_signature="")
                def RequestAuthorization(self, device): self.ask("RequestAuthorization " + device)
                @dbus.service.method("org.bluez.Agent1", in_signature="os", out_signature="")
                def AuthorizeService(self, device, uuid): self.ask("AuthorizeService %s %s" % (device, uuid))
                @dbus.service.method("org.bluez.Agent1", in_signature="o", out_signature="s")
                def RequestPinCode(self, device):
                    self.ask("RequestPinCode " + device)
                    return "0000"
                @dbus.service.method("org.bluez.Agent1", in_signature="o", out_signature="u")
                def RequestPasskey(self, device):
                    self.ask("RequestPasskey " + device)
                    return dbus.UInt32(0)
                @dbus.service.method("org.bluez.Agent1", in_signature="ouq", out_signature="")
                def DisplayPasskey(self, device, passkey, entered): print("request DisplayPasskey", flush=True)
                @dbus.service.method("org.bluez.Agent1", in_signature="os", out_signature="")
                def DisplayPinCode(self, device, code): print("request DisplayPinCode", flush=True)
                @dbus.service.method("org.bluez.Agent1", in_signature="", out_signature="")
                def Cancel(self): print("cancel", flush=True)
                @dbus.service.method("org.bluez.Agent1", in_signature="", out_signature="")
                def Release(self): pass
            path = "/peerlink/test/agent"
            Agent(bus, path)
            manager = dbus.Interface(bus.get_object("org.bluez", "/org/bluez"), "org.bluez.AgentManager1")
            manager.RegisterAgent(path, "DisplayYesNo")
            manager.RequestDefaultAgent(path)
            print("agent registered", flush=True)
            GLib.MainLoop().run()
            """
    }
}
