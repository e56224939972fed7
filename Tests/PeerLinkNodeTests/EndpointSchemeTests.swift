import PeerLink
import PeerLinkTestSupport
import Testing

/// An endpoint of a transport only this test knows: registering its scheme is all it takes for
/// `Endpoint(parsing:)` to read it.
struct CarrierPigeonEndpoint: EndpointAddress {
    var loft: String
    var kind: TransportKind { "pigeon" }
    var description: String { "pigeon://\(loft)" }
    var fields: [String: EndpointField] { ["loft": .text(loft)] }

    static let scheme = EndpointScheme(name: "pigeon", forms: ["pigeon://LOFT"]) { rest throws(EndpointSyntaxError) in
        guard !rest.isEmpty else { throw EndpointSyntaxError("the loft is missing") }
        return Endpoint(CarrierPigeonEndpoint(loft: String(rest)))
    }
}

@Suite("Endpoints keyed by scheme: each transport's texts, registered, parsed and printed")
struct EndpointSchemeTests {
    init() {
        for module in StandardTransports.modules() { module.registerEndpointSchemes() }
        EndpointScheme.register(.memory)
    }

    @Test("endpoints print and parse back", arguments: [
        "tcp://127.0.0.1:4000", "tcp://[::1]:4000", "tcp://[fe80::1%eth0]:9",
        "bt://00:AA:01:00:00:00/rfcomm/5", "bt://00:AA:01:01:00:01/l2cap/0x1001", "memory://bo",
    ])
    func endpointRoundTrip(text: String) throws {
        let endpoint = try Endpoint(parsing: text)
        #expect(endpoint.description == text)
        #expect(endpoint.isBluetooth == text.hasPrefix("bt://"))
        #expect((endpoint.tcp != nil) == text.hasPrefix("tcp://"))
    }

    @Test("each transport's typed accessors and kinds")
    func typedAccessors() throws {
        let address = try #require(BluetoothAddress("00:AA:01:00:00:00"))
        let l2cap = Endpoint.l2cap(address: address, psm: try #require(L2CAPPSM(0x1001)))
        #expect(l2cap.kind == .l2cap && l2cap.transport == "l2cap")
        #expect(l2cap.bluetooth?.address == address && l2cap.bluetooth?.socketKind == .l2cap && l2cap.bluetooth?.portNumber == 0x1001)
        #expect(l2cap.tcp == nil && l2cap.memory == nil)
        let tcp = Endpoint.tcp(host: "10.99.0.2", port: 7000)
        #expect(tcp.kind == .tcp && tcp.tcp?.host == "10.99.0.2" && tcp.tcp?.port == 7000 && tcp.bluetooth == nil)
        #expect(tcp.address.fields == ["host": .text("10.99.0.2"), "port": .number(7000)])
        #expect(Endpoint.rfcomm(address: address, channel: try #require(RFCOMMChannel(5))).address.fields == ["address": .text("00:AA:01:00:00:00"), "channel": .number(5)])
        #expect(Endpoint.memory(name: "bo").kind == .memory)
    }

    @Test("lower-case addresses and decimal PSMs are accepted")
    func endpointLenient() throws {
        #expect(try Endpoint(parsing: "bt://00:aa:01:00:00:00/l2cap/4097") == .l2cap(address: BluetoothAddress("00:AA:01:00:00:00")!, psm: L2CAPPSM(0x1001)!))
        #expect(try Endpoint(parsing: "bt://00:aa:01:00:00:00/RFCOMM/30").transport == "rfcomm")
        #expect(try Endpoint(parsing: "TCP://127.0.0.1:80") == .tcp(host: "127.0.0.1", port: 80), "the scheme is read in any case")
    }

    @Test("bad endpoints name what is wrong and show the registered forms", arguments: [
        ("bt://00:AA:01:00:00/rfcomm/5", "not a Bluetooth address"),
        ("bt://00:AA:01:00:00:00/rfcomm/31", "not an RFCOMM channel"),
        ("bt://00:AA:01:00:00:00/l2cap/0x1000", "not an L2CAP PSM"),
        ("bt://00:AA:01:00:00:00/sco/1", "not rfcomm or l2cap"),
        ("bt://00:AA:01:00:00:00/rfcomm", "has an address, a protocol"),
        ("tcp://127.0.0.1", "port is missing"),
        ("tcp://127.0.0.1:0", "not a port"),
        ("tcp://:80", "host is missing"),
        ("tcp://[::1:80", "in brackets"),
        ("udp://1.2.3.4:5", "unknown scheme 'udp'"),
        ("127.0.0.1:80", "no scheme"),
    ])
    func badEndpoints(text: String, why: String) {
        let error = #expect(throws: PeerLinkError.self) { try Endpoint(parsing: text) }
        #expect(error?.code == .invalidParameter)
        #expect(error?.message.contains(why) == true, "\(String(describing: error))")
        #expect(error?.message.contains("bt://AA:BB:CC:DD:EE:FF/l2cap/PSM") == true)
        #expect(error?.message.contains("tcp://HOST:PORT") == true)
    }

    @Test("a scheme nobody registered is not read; registering it is all a new transport needs")
    func aNewTransportRegistersItsScheme() throws {
        let error = #expect(throws: PeerLinkError.self) { try Endpoint(parsing: "pigeon://roof", schemes: [.tcp]) }
        #expect(error?.message.contains("unknown scheme 'pigeon'") == true)
        #expect(error?.message.contains("use tcp://HOST:PORT or tcp://[IPv6]:PORT") == true, "\(String(describing: error))")
        let none = #expect(throws: PeerLinkError.self) { try Endpoint(parsing: "tcp://127.0.0.1:80", schemes: []) }
        #expect(none?.message.contains("no transport that reads endpoints is registered") == true)

        EndpointScheme.register(CarrierPigeonEndpoint.scheme)
        let pigeon = try Endpoint(parsing: "pigeon://roof")
        #expect(pigeon.kind == "pigeon")
        #expect(pigeon.address(as: CarrierPigeonEndpoint.self)?.loft == "roof")
        #expect(pigeon.description == "pigeon://roof")
        #expect(EndpointScheme.registered.map(\.name).contains("pigeon"))
    }

    @Test("endpoints of different transports are different, even with the same text")
    func equalityAcrossTransports() {
        let memory = Endpoint.memory(name: "roof", kind: "pigeon")
        let pigeon = Endpoint(CarrierPigeonEndpoint(loft: "roof"))
        #expect(memory.description == pigeon.description)
        #expect(memory != pigeon)
        #expect(Set([memory, pigeon, Endpoint(CarrierPigeonEndpoint(loft: "roof"))]).count == 2)
    }

    @Test("an SDP record's endpoints: L2CAP first, then RFCOMM")
    func serviceRecordEndpoints() throws {
        let address = try #require(BluetoothAddress("00:AA:01:00:00:00"))
        let identity = Identity.generate()
        let record = PeerLinkServiceRecord(
            serviceType: .default, record: TXTRecord(fingerprint: identity.fingerprint, displayName: "Zoë", info: try DiscoveryInfo()),
            channel: RFCOMMChannel(5), psm: L2CAPPSM(0x1001))
        #expect(record.endpoints(at: address) == [.l2cap(address: address, psm: L2CAPPSM(0x1001)!), .rfcomm(address: address, channel: RFCOMMChannel(5)!)])
    }
}

@Suite("Transport ranking and choice: policy values, as users write them")
struct TransportPolicyTests {
    @Test func theStandardOrderIsTCPThenL2CAPThenRFCOMM() {
        #expect(TransportRanking.standard.order == [.tcp, .l2cap, .rfcomm])
        #expect(TransportRanking.standard.description == "tcp > l2cap > rfcomm")
        #expect(TransportRanking.standard.rank(of: .tcp) < TransportRanking.standard.rank(of: .rfcomm))
        #expect(TransportRanking.standard.rank(of: "pigeon") == 3, "kinds not named share the place after the last")
    }

    @Test func aRankingIsReadFromAList() throws {
        let ranking = try TransportRanking(parsing: "l2cap, tcp,l2cap")
        #expect(ranking.order == [.l2cap, .tcp], "each kind once")
        #expect(ranking.ranked([.tcp, .rfcomm, .l2cap]) == [.l2cap, .tcp, .rfcomm])
        #expect(throws: PeerLinkError.self) { try TransportRanking(parsing: "") }
        let bad = #expect(throws: PeerLinkError.self) { try TransportRanking(parsing: "tcp,Wi Fi!") }
        #expect(bad?.message.contains("'Wi' is not a transport kind") == true || bad?.message.contains("is not a transport kind") == true)
        // (a literal would be taken as one, and trap when invalid: read names from variables)
        let names = ["9lives", "wifi-direct", "Upper", ""]
        #expect(names.map { TransportKind($0) != nil } == [false, true, false, false])
    }

    @Test func aChoiceIsReadFromItsNames() throws {
        #expect(try TransportChoice(parsing: "auto").isAutomatic)
        #expect(try TransportChoice(parsing: "auto").modules().map(\.name) == ["lan", "bluetooth"])
        #expect(try TransportChoice(parsing: "bluetooth").modules().map(\.name) == ["bluetooth"])
        #expect(try TransportChoice(parsing: "bluetooth,lan").modules().map(\.name) == ["bluetooth", "lan"])
        #expect(try TransportChoice(parsing: "LAN").description == "lan")
        let bad = #expect(throws: PeerLinkError.self) { try TransportChoice(parsing: "wifi") }
        #expect(bad?.code == .invalidParameter)
        #expect(bad?.message.contains("'wifi' is not a transport: use lan, bluetooth, auto") == true, "\(String(describing: bad))")
        #expect(throws: PeerLinkError.self) { try TransportChoice(parsing: "lan,") }
    }

    @Test func configuringReplacesTheModuleOfTheSameName() throws {
        let choice = TransportChoice.auto.configuring(BluetoothTransportModule(adapter: "hci1"))
        let bluetooth = try #require(choice.modules().last as? BluetoothTransportModule)
        #expect(bluetooth.adapter == "hci1")
        #expect(TransportChoice.lan.configuring(BluetoothTransportModule(adapter: "hci1")).modules().map(\.name) == ["lan"])
        let network = MemoryNetwork()
        let custom = TransportChoice.modules([MemoryTransportModule(network: network, listenerName: "a", kind: "fast")])
        #expect(custom.modules().map(\.name) == ["fast"])
        #expect(custom.description == "fast")
    }
}
