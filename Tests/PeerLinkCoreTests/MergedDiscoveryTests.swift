import PeerLinkCore
import Testing

@Suite("MergedDiscovery: one peer per identity across LAN and Bluetooth")
struct MergedDiscoveryTests {
    static let alice = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)
    static let address = BluetoothAddress("00:AA:01:00:00:00")!
    static let tcp = Endpoint.tcp(host: "10.99.0.11", port: 4000)
    static let l2cap = Endpoint.l2cap(address: address, psm: L2CAPPSM(0x1001)!)
    static let rfcomm = Endpoint.rfcomm(address: address, channel: RFCOMMChannel(5)!)

    static func peer(name: String = "Alice", _ endpoints: [Endpoint], info: [String: String] = [:]) -> DiscoveredPeer {
        DiscoveredPeer(id: PeerID(fingerprint: alice, displayName: name), protocolVersion: 1, endpoints: endpoints, info: try! DiscoveryInfo(info))
    }

    @Test func aPeerOnBothTransportsIsOnePeerWithLANFirst() {
        var merged = MergedDiscovery()
        #expect(merged.apply(.found(Self.peer([Self.rfcomm, Self.l2cap])), from: "bluetooth") == [.found(Self.peer([Self.l2cap, Self.rfcomm]))])
        let events = merged.apply(.found(Self.peer([Self.tcp])), from: "lan")
        #expect(events == [.updated(Self.peer([Self.tcp, Self.l2cap, Self.rfcomm]))])
        #expect(merged.peers.count == 1)
        #expect(merged.peers.first?.endpoints == [Self.tcp, Self.l2cap, Self.rfcomm])
    }

    @Test func lostOnlyWhenTheLastTransportLostIt() {
        var merged = MergedDiscovery()
        _ = merged.apply(.found(Self.peer([Self.tcp])), from: "lan")
        _ = merged.apply(.found(Self.peer([Self.l2cap])), from: "bluetooth")
        // Leaving the LAN: still reachable over Bluetooth, so an update, not a loss.
        #expect(merged.apply(.lost(Self.peer([]).id), from: "lan") == [.updated(Self.peer([Self.l2cap]))])
        #expect(merged.apply(.lost(Self.peer([]).id), from: "bluetooth") == [.lost(Self.peer([]).id)])
        #expect(merged.peers.isEmpty)
        // A second loss says nothing.
        #expect(merged.apply(.lost(Self.peer([]).id), from: "bluetooth") == [])
    }

    @Test func theAllowedKindsFilterEndpoints() {
        var lanOnly = MergedDiscovery(allowing: ["tcp"])
        #expect(lanOnly.apply(.found(Self.peer([Self.l2cap])), from: "bluetooth") == [])
        #expect(lanOnly.apply(.found(Self.peer([Self.tcp])), from: "lan") == [.found(Self.peer([Self.tcp]))])
        var bluetoothOnly = MergedDiscovery(allowing: ["l2cap", "rfcomm"])
        #expect(bluetoothOnly.apply(.found(Self.peer([Self.tcp])), from: "lan") == [])
        #expect(bluetoothOnly.apply(.found(Self.peer([Self.rfcomm])), from: "bluetooth") == [.found(Self.peer([Self.rfcomm]))])
    }

    @Test func anotherRankingOrdersTheMergedEndpoints() {
        var merged = MergedDiscovery(ranking: TransportRanking(["rfcomm", "l2cap", "tcp"]))
        _ = merged.apply(.found(Self.peer([Self.tcp])), from: "lan")
        #expect(merged.apply(.found(Self.peer([Self.l2cap, Self.rfcomm])), from: "bluetooth") == [.updated(Self.peer([Self.rfcomm, Self.l2cap, Self.tcp]))])
        #expect(merged.sources(of: Self.alice) == ["bluetooth", "lan"])
        #expect(merged.peers.first?.transports == ["rfcomm", "l2cap", "tcp"])
    }

    @Test func nameAndInfoComeFromTheLatestReport() {
        var merged = MergedDiscovery()
        _ = merged.apply(.found(Self.peer(name: "Alice", [Self.tcp], info: ["room": "a"])), from: "lan")
        let events = merged.apply(.found(Self.peer(name: "Alice's Pi", [Self.l2cap], info: ["room": "b"])), from: "bluetooth")
        guard case .updated(let peer) = events.first else {
            Issue.record("expected an update, got \(events)")
            return
        }
        #expect(peer.id.displayName == "Alice's Pi")
        #expect(peer.info.entries == ["room": "b"])
        #expect(peer.endpoints == [Self.tcp, Self.l2cap])
    }

    @Test func aRenameAloneIsAnUpdate() {
        var merged = MergedDiscovery()
        _ = merged.apply(.found(Self.peer(name: "Alice", [Self.tcp])), from: "lan")
        let events = merged.apply(.updated(Self.peer(name: "Alicia", [Self.tcp])), from: "lan")
        #expect(events.count == 1)
        if case .updated(let peer) = events.first { #expect(peer.id.displayName == "Alicia") } else { Issue.record("no update: \(events)") }
        #expect(merged.apply(.updated(Self.peer(name: "Alicia", [Self.tcp])), from: "lan") == [])
    }

    @Test func rankingKeepsOrderWithinAKindAndDropsDuplicates() {
        let other = Endpoint.tcp(host: "10.99.0.12", port: 4000)
        #expect(TransportRanking.standard.ranked([Self.rfcomm, other, Self.l2cap, Self.tcp, other]) == [other, Self.tcp, Self.l2cap, Self.rfcomm])
        #expect(TransportRanking(["l2cap"]).ranked([Self.rfcomm, Self.tcp, Self.l2cap]) == [Self.l2cap, Self.rfcomm, Self.tcp], "kinds not named keep their order, after the named")
    }
}
