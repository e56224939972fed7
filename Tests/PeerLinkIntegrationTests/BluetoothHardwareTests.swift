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
}
