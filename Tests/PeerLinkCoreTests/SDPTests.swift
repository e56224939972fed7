import PeerLinkCore
import Testing

@Suite("SDP: data elements, PeerLink's service record, the search transaction")
struct SDPTests {
    static let fingerprint = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)
    static let address = BluetoothAddress("00:AA:01:00:00:00")!

    static func record(channel: Int?, psm: Int?, info: [String: String] = ["room": "kitchen"]) throws -> PeerLinkServiceRecord {
        PeerLinkServiceRecord(
            serviceType: .default,
            record: TXTRecord(fingerprint: fingerprint, displayName: "Zoë's Pi", info: try DiscoveryInfo(info)),
            channel: channel.flatMap(RFCOMMChannel.init), psm: psm.flatMap(L2CAPPSM.init(_:) as (Int) -> L2CAPPSM?))
    }

    // Encodings written out in the Core specification's terms (Vol 3, Part B, §3.3).
    @Test(arguments: [
        (SDPElement.null, [0x00]),
        (.uint8(5), [0x08, 0x05]),
        (.uint16(0x1001), [0x09, 0x10, 0x01]),
        (.uint32(0x0000_FFFF), [0x0A, 0x00, 0x00, 0xFF, 0xFF]),
        (.int8(-1), [0x10, 0xFF]),
        (.uuid16(0x0100), [0x19, 0x01, 0x00]),
        (.bool(true), [0x28, 0x01]),
        (.text(Array("ab".utf8)), [0x25, 0x02, 0x61, 0x62]),
        (.sequence([.uuid16(0x0100)]), [0x35, 0x03, 0x19, 0x01, 0x00]),
        (.alternative([.uint8(1), .uint8(2)]), [0x3D, 0x04, 0x08, 0x01, 0x08, 0x02]),
    ] as [(SDPElement, [UInt8])])
    func knownEncodings(_ element: SDPElement, _ bytes: [UInt8]) throws {
        #expect(element.encoded() == bytes)
        #expect(try SDPElement(decoding: bytes) == element)
    }

    @Test func longTextTakesA16BitLength() throws {
        let element = SDPElement.text(Array(repeating: 0x41, count: 300))
        let bytes = element.encoded()
        #expect(Array(bytes.prefix(3)) == [0x26, 0x01, 0x2C])
        #expect(try SDPElement(decoding: bytes) == element)
    }

    @Test(arguments: [
        [0x35, 0x05, 0x19, 0x01],  // sequence longer than the bytes
        [0x09, 0x10],  // uint16 cut short
        [0x26, 0x01],  // 16-bit length cut short
    ] as [[UInt8]])
    func truncatedElementsAreRejected(_ bytes: [UInt8]) {
        #expect(throws: SDPElement.DecodingError.self) { try SDPElement(decoding: bytes) }
    }

    @Test func aUUIDWithABadSizeIsRejected() {
        #expect(throws: SDPElement.DecodingError.badSize(type: 3, sizeIndex: 0)) { try SDPElement(decoding: [0x18, 0x01]) }
        // Integers have fixed sizes: one written with a length is malformed (found by fuzzing:
        // it decoded as an unknown element that re-encoded as another integer).
        #expect(throws: SDPElement.DecodingError.badSize(type: 1, sizeIndex: 5)) { try SDPElement(decoding: [0x0D, 0x01, 0x05]) }
        #expect(throws: SDPElement.DecodingError.badSize(type: 2, sizeIndex: 6)) { try SDPElement(decoding: [0x16, 0x00, 0x01, 0x05]) }
    }

    // Expected values from Python's uuid.uuid5(uuid.NAMESPACE_URL, name), an independent implementation.
    @Test func serviceClassIsTheVersion5UUIDOfTheType() throws {
        #expect(ServiceType.default.bluetoothServiceClass.description == "dd2856df-0a46-51d0-8d71-15d5f8e44238")
        #expect(try ServiceType("chat").bluetoothServiceClass.description == "dd5a4963-8454-5bd2-9c12-d28389eec7e4")
        #expect(BluetoothUUID(version5Namespace: .urlNamespace, name: "http://example.com/").description == "0a300ee9-f9e4-5697-a51a-efc7fafaba67")
    }

    @Test func shortUUIDsLiveInTheBaseUUID() {
        #expect(BluetoothUUID(short: 0x1101).description == "00001101-0000-1000-8000-00805f9b34fb")
        #expect(SDPElement.uuid16(0x0100).uuid == SDPElement.uuid128(BluetoothUUID(short: 0x0100)).uuid)
    }

    @Test(arguments: [(5, 0x1001), (5, nil), (nil, 0x1001)] as [(Int?, Int?)])
    func recordRoundTripsThroughItsAttributes(_ channel: Int?, _ psm: Int?) throws {
        let record = try Self.record(channel: channel, psm: psm)
        // Through the wire form too: every attribute value encoded and decoded again.
        let wire = record.attributes.mapValues { element in (try? SDPElement(decoding: element.encoded())) ?? .null }
        let decoded = try PeerLinkServiceRecord(serviceType: .default, attributes: wire)
        #expect(decoded == record)
        #expect(decoded.record.displayName == "Zoë's Pi")
        #expect(decoded.record.info.entries == ["room": "kitchen"])
        #expect(decoded.channel == channel.flatMap(RFCOMMChannel.init))
        #expect(decoded.psm == psm.flatMap { L2CAPPSM($0) })
    }

    @Test func anRFCOMMRecordHasTheStandardProtocolList() throws {
        let attributes = try Self.record(channel: 5, psm: 0x1001).attributes
        #expect(attributes[0x0004] == .sequence([.sequence([.uuid16(0x0100)]), .sequence([.uuid16(0x0003), .uint8(5)])]))
        #expect(attributes[0x000D] == .sequence([.sequence([.sequence([.uuid16(0x0100), .uint16(0x1001)])])]))
        #expect(attributes[0x0100] == .text(Array("Zoë's Pi".utf8)))
    }

    @Test func recordsOfOtherServicesAreNotPeerLinks() throws {
        let attributes = try Self.record(channel: 5, psm: nil).attributes
        #expect(throws: PeerLinkServiceRecord.DecodingError.otherServiceClass) {
            try PeerLinkServiceRecord(serviceType: try ServiceType("other"), attributes: attributes)
        }
        var withoutTXT = attributes
        withoutTXT[0x0200] = nil
        #expect(throws: PeerLinkServiceRecord.DecodingError.noTXT) { try PeerLinkServiceRecord(serviceType: .default, attributes: withoutTXT) }
        var withoutEndpoint = attributes
        withoutEndpoint[0x0004] = nil
        #expect(throws: PeerLinkServiceRecord.DecodingError.noEndpoint) { try PeerLinkServiceRecord(serviceType: .default, attributes: withoutEndpoint) }
        var badTXT = attributes
        badTXT[0x0200] = .sequence([.text(Array("plv=1".utf8))])
        #expect(throws: PeerLinkServiceRecord.DecodingError.badTXT(.missingKey("plid"))) { try PeerLinkServiceRecord(serviceType: .default, attributes: badTXT) }
    }

    @Test func bluezXMLCarriesEveryAttribute() throws {
        let xml = try Self.record(channel: 5, psm: 0x1001).bluezXML
        #expect(xml.hasPrefix("<?xml version=\"1.0\" encoding=\"UTF-8\" ?>\n<record>\n"))
        #expect(xml.contains("<attribute id=\"0x0001\">\n    <sequence>\n      <uuid value=\"dd2856df-0a46-51d0-8d71-15d5f8e44238\" />"))
        #expect(xml.contains("<uint8 value=\"0x05\" />"))
        #expect(xml.contains("<uint16 value=\"0x1001\" />"))
        // "Zoë's Pi" in hex: no quoting problems whatever the name holds.
        #expect(xml.contains("<text encoding=\"hex\" value=\"5a6fc3ab2773205069\" />"))
        #expect(xml.components(separatedBy: "<attribute ").count - 1 == 8)
    }

    // MARK: The search transaction

    /// A response PDU carrying `lists` (a slice of the attribute lists) and a continuation state.
    static func response(_ lists: ArraySlice<UInt8>, continuation: [UInt8], transaction: UInt16) -> [UInt8] {
        let parameters = [UInt8(lists.count >> 8), UInt8(lists.count & 0xFF)] + lists + [UInt8(continuation.count)] + continuation
        return [0x07, UInt8(transaction >> 8), UInt8(transaction & 0xFF), UInt8(parameters.count >> 8), UInt8(parameters.count & 0xFF)] + parameters
    }

    static func attributeLists(_ records: [[UInt16: SDPElement]]) -> [UInt8] {
        SDPElement.sequence(records.map { record in
            .sequence(record.keys.sorted().flatMap { [SDPElement.uint16($0), record[$0]!] })
        }).encoded()
    }

    @Test func requestAsksForEveryAttributeOfTheClass() {
        let search = SDPServiceSearch(pattern: [ServiceType.default.bluetoothServiceClass], maximumAttributeBytes: 0x0400, transaction: 7)
        let request = search.nextRequest()
        let uuid = ServiceType.default.bluetoothServiceClass.bytes
        let parameters: [UInt8] = [0x35, 0x11, 0x1C] + uuid + [0x04, 0x00, 0x35, 0x05, 0x0A, 0x00, 0x00, 0xFF, 0xFF, 0x00]
        #expect(request == [0x06, 0x00, 0x07, 0x00, UInt8(parameters.count)] + parameters)
    }

    @Test func continuationsAreFollowedAndJoined() throws {
        let records = [try Self.record(channel: 5, psm: 0x1001).attributes, try Self.record(channel: 7, psm: nil).attributes]
        let lists = Self.attributeLists(records)
        var search = SDPServiceSearch(pattern: [ServiceType.default.bluetoothServiceClass])
        let cut = lists.count / 3
        #expect(try search.receive(Self.response(lists[..<cut], continuation: [0xAA, 0x01], transaction: 1)) == .continuing)
        #expect(Array(search.nextRequest().suffix(3)) == [0x02, 0xAA, 0x01])
        #expect(try search.receive(Self.response(lists[cut..<(2 * cut)], continuation: [0xAA, 0x02], transaction: 2)) == .continuing)
        let last = try search.receive(Self.response(lists[(2 * cut)...], continuation: [], transaction: 3))
        #expect(last == .finished(records))
        #expect(search.nextRequest()[1...2] == [0x00, 0x04])
    }

    @Test func noMatchingRecordIsAnEmptyList() throws {
        var search = SDPServiceSearch(pattern: [ServiceType.default.bluetoothServiceClass])
        #expect(try search.receive(Self.response([0x35, 0x00], continuation: [], transaction: 1)) == .finished([]))
    }

    @Test func serverErrorsAndMalformedResponsesThrow() {
        var search = SDPServiceSearch(pattern: [ServiceType.default.bluetoothServiceClass])
        #expect(throws: SDPServiceSearch.Failure.serverError(code: 0x0003)) { try search.receive([0x01, 0x00, 0x01, 0x00, 0x02, 0x00, 0x03]) }
        #expect(throws: SDPServiceSearch.Failure.self) { try search.receive([0x07, 0x00, 0x01, 0x00, 0x09, 0x00, 0x10]) }
        #expect(throws: SDPServiceSearch.Failure.self) { try search.receive(Self.response([0x35, 0x02, 0x09], continuation: [], transaction: 1)) }
    }
}
