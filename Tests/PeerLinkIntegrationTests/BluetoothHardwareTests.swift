import Foundation
import Testing

/// Tests against real Bluetooth adapters (a laptop and a Raspberry Pi, see Hardware/README.md),
/// switched on by `PEERLINK_HW_PEER`: the remote's address (`AA:BB:CC:DD:EE:FF`) or display name,
/// where `peerlink advertise --transport bluetooth --name NAME` runs. `PEERLINK_HW_ADAPTER`
/// (`hciN`) picks the local adapter.
enum HardwarePeer {
    static let peer = TestHost.environment["PEERLINK_HW_PEER"].flatMap { $0.isEmpty ? nil : $0 }
    static let adapter = TestHost.environment["PEERLINK_HW_ADAPTER"]
    static var enabled: Bool { peer != nil }

    static func matches(_ object: [String: Any]) -> Bool {
        guard let peer else { return false }
        if (object["name"] as? String) == peer { return true }
        let endpoints = object["endpoints"] as? [[String: Any]] ?? []
        return endpoints.contains { ($0["address"] as? String)?.uppercased() == peer.uppercased() }
    }

    static var adapterArguments: [String] { adapter.map { ["--adapter", $0] } ?? [] }
}

@Suite(
    "Bluetooth hardware: a real remote peer (PEERLINK_HW_PEER)", .serialized,
    .enabled(if: HardwarePeer.enabled, "set PEERLINK_HW_PEER to the address or name of a peer running 'peerlink advertise --transport bluetooth' (Hardware/README.md)"))
struct BluetoothHardwareTests {
    @Test("radios: the local adapter is up and bluetoothd runs", .timeLimit(.minutes(1)))
    func localAdapterReady() async throws {
        let result = try await runPeerlink(["radios", "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let bluetooth = try #require(object["bluetooth"] as? [String: Any])
        #expect(bluetooth["available"] as? Bool == true, "\(bluetooth)")
        #expect(bluetooth["bluetoothd"] as? Bool == true, "bluetoothd does not answer: \(bluetooth["bluetoothdProblem"] ?? "")")
        let adapters = try #require(bluetooth["adapters"] as? [[String: Any]])
        let chosen = adapters.first { $0["name"] as? String == (HardwarePeer.adapter ?? "hci0") }
        #expect(chosen?["isUp"] as? Bool == true, "\(adapters)")
        #expect(chosen?["powered"] as? Bool == true, "\(adapters)")
    }

    @Test("scan --bluetooth finds the remote peer over the air and reads its PeerLink record", .timeLimit(.minutes(2)))
    func scanFindsThePeer() async throws {
        let result = try await runPeerlink(["scan", "--bluetooth", "--timeout", "10", "--json"] + HardwarePeer.adapterArguments, timeout: .seconds(90))
        #expect(result.status == 0, "\(result.stderr)")
        let peers = (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [[String: Any]]) ?? []
        let peer = try #require(peers.first(where: HardwarePeer.matches), "not found; scan printed:\n\(result.stdout)\n\(result.stderr)")
        let endpoints = try #require(peer["endpoints"] as? [[String: Any]])
        #expect(endpoints.contains { $0["transport"] as? String == "rfcomm" && ($0["channel"] as? Int).map { (1...30).contains($0) } == true }, "\(endpoints)")
        #expect(endpoints.contains { $0["transport"] as? String == "l2cap" && (($0["psm"] as? Int) ?? 0) & 0x0101 == 1 }, "\(endpoints)")
        #expect((peer["id"] as? String)?.count == 16, "\(peer)")
    }

    @Test("the human scan lists the device with its name, class and RSSI and marks it as PeerLink", .timeLimit(.minutes(2)))
    func humanScanMarksThePeer() async throws {
        let result = try await runPeerlink(["scan", "--bluetooth", "--timeout", "10"] + HardwarePeer.adapterArguments, timeout: .seconds(90))
        #expect(result.status == 0, "\(result.stderr)")
        let wanted = try #require(HardwarePeer.peer).uppercased()
        // A device row: ADDRESS NAME CLASS RSSI "PeerLink <name> <id> <endpoints>".
        let line = result.stdout.split(separator: "\n").first { $0.contains("PeerLink ") && $0.uppercased().contains(wanted) }
        #expect(line != nil, "\(result.stdout)")
        #expect(line?.contains("dBm") == true, "no RSSI: \(line ?? "")")
    }

    /// The remote runs `peerlink chat --transport bluetooth --accept-all` (Hardware/README.md):
    /// the scan gives its endpoints, and a chat here reaches it at each with `--connect`.
    @Test(
        "chat reaches the remote peer at its RFCOMM and its L2CAP endpoint, encrypted, and leaves cleanly",
        .timeLimit(.minutes(3)), arguments: ["rfcomm", "l2cap"])
    func chatOverEachLinkKind(_ transport: String) async throws {
        let scan = try await runPeerlink(["scan", "--bluetooth", "--timeout", "10", "--json"] + HardwarePeer.adapterArguments, timeout: .seconds(90))
        #expect(scan.status == 0, "\(scan.stderr)")
        let peers = (try? JSONSerialization.jsonObject(with: Data(scan.stdout.utf8)) as? [[String: Any]]) ?? []
        let peer = try #require(peers.first(where: HardwarePeer.matches), "not found; scan printed:\n\(scan.stdout)\n\(scan.stderr)")
        let endpoints = try #require(peer["endpoints"] as? [[String: Any]])
        let endpoint = try #require(endpoints.first { $0["transport"] as? String == transport }, "no \(transport) endpoint: \(endpoints)")
        let address = try #require(endpoint["address"] as? String)
        let target =
            transport == "rfcomm"
            ? "bt://\(address)/rfcomm/\(try #require(endpoint["channel"] as? Int))"
            : "bt://\(address)/l2cap/\(try #require(endpoint["psm"] as? Int))"
        let name = try #require(peer["name"] as? String)

        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "hw-laptop", "--connect", target] + HardwarePeer.adapterArguments, withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForLine(containing: "* \(name) joined", timeout: .seconds(60))
        chat.type("/peers\n")
        let line = try await chat.waitForStderrLine(containing: "\(transport) ", timeout: .seconds(30))
        #expect(line.contains("encrypted") && !line.contains("NOT encrypted"), "\(line)")
        chat.type("hello from the PeerLink hardware suite over \(transport)\n")
        chat.closeInput()
        #expect(try await chat.waitForExit(timeout: .seconds(30)) == 0, "stderr: \(chat.stderr)")
    }
}
