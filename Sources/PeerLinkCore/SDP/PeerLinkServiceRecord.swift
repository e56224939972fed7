/// What a PeerLink peer publishes about itself over Bluetooth: an SDP service record with the
/// same facts as its DNS-SD TXT record, plus where to connect.
///
/// | attribute | name                              | value                                                    |
/// |-----------|-----------------------------------|----------------------------------------------------------|
/// | `0x0001`  | ServiceClassIDList                | ⟨ UUID128 ``ServiceType/bluetoothServiceClass`` ⟩         |
/// | `0x0004`  | ProtocolDescriptorList            | ⟨⟨L2CAP⟩ ⟨RFCOMM, channel⟩⟩, or ⟨⟨L2CAP, PSM⟩⟩ without RFCOMM |
/// | `0x0005`  | BrowseGroupList                   | ⟨ PublicBrowseRoot ⟩                                     |
/// | `0x0006`  | LanguageBaseAttributeIDList       | ⟨ "en", UTF-8 (106), 0x0100 ⟩                            |
/// | `0x000D`  | AdditionalProtocolDescriptorLists | ⟨⟨⟨L2CAP, PSM⟩⟩⟩ when there is both a channel and a PSM   |
/// | `0x0100`  | ServiceName                       | the display name                                         |
/// | `0x0101`  | ServiceDescription                | `PeerLink <service type>`                                |
/// | `0x0200`  | PeerLink TXT (service-specific)   | ⟨ text… ⟩: the ``TXTRecord`` strings, `plv`, `plid`, `plname`, then the app's |
public struct PeerLinkServiceRecord: Hashable, Sendable {
    public static let serviceClassIDList: UInt16 = 0x0001
    public static let protocolDescriptorList: UInt16 = 0x0004
    public static let browseGroupList: UInt16 = 0x0005
    public static let languageBaseAttributeIDList: UInt16 = 0x0006
    public static let additionalProtocolDescriptorLists: UInt16 = 0x000D
    public static let serviceName: UInt16 = 0x0100
    public static let serviceDescription: UInt16 = 0x0101
    public static let txtAttribute: UInt16 = 0x0200

    /// The L2CAP protocol's SDP UUID (every service reached over L2CAP lists it).
    public static let l2capUUID: UInt16 = 0x0100
    static let rfcommUUID: UInt16 = 0x0003
    static let publicBrowseRoot: UInt16 = 0x1002

    public var serviceType: ServiceType
    public var record: TXTRecord
    public var channel: RFCOMMChannel?
    public var psm: L2CAPPSM?

    public init(serviceType: ServiceType, record: TXTRecord, channel: RFCOMMChannel?, psm: L2CAPPSM?) {
        self.serviceType = serviceType
        self.record = record
        self.channel = channel
        self.psm = psm
    }

    /// The record's attributes, by attribute ID.
    public var attributes: [UInt16: SDPElement] {
        var attributes: [UInt16: SDPElement] = [
            Self.serviceClassIDList: .sequence([.uuid128(serviceType.bluetoothServiceClass)]),
            Self.browseGroupList: .sequence([.uuid16(Self.publicBrowseRoot)]),
            Self.languageBaseAttributeIDList: .sequence([.uint16(0x656E), .uint16(106), .uint16(Self.serviceName)]),
            Self.serviceName: .text(Array(record.displayName.utf8)),
            Self.serviceDescription: .text(Array("PeerLink \(serviceType.value)".utf8)),
            Self.txtAttribute: .sequence(record.encoded().map(SDPElement.text)),
        ]
        let l2capWithPSM = psm.map { SDPElement.sequence([.uuid16(Self.l2capUUID), .uint16($0.value)]) }
        if let channel {
            attributes[Self.protocolDescriptorList] = .sequence([
                .sequence([.uuid16(Self.l2capUUID)]), .sequence([.uuid16(Self.rfcommUUID), .uint8(channel.value)]),
            ])
            if let l2capWithPSM {
                attributes[Self.additionalProtocolDescriptorLists] = .sequence([.sequence([l2capWithPSM])])
            }
        } else if let l2capWithPSM {
            attributes[Self.protocolDescriptorList] = .sequence([l2capWithPSM])
        }
        return attributes
    }

    /// Why an SDP record is not a PeerLink record of the wanted service type.
    public enum DecodingError: Error, Hashable, Sendable, CustomStringConvertible {
        case otherServiceClass
        case noTXT
        case badTXT(TXTRecord.DecodingError)
        case noEndpoint

        public var description: String {
            switch self {
            case .otherServiceClass: return "SDP record is not of this service type's class"
            case .noTXT: return "SDP record has no PeerLink TXT attribute (0x0200)"
            case .badTXT(let error): return "SDP record's PeerLink attribute: \(error)"
            case .noEndpoint: return "SDP record has neither an RFCOMM channel nor an L2CAP PSM"
            }
        }
    }

    /// Reads a PeerLink record of `serviceType` out of an SDP record's attributes.
    public init(serviceType: ServiceType, attributes: [UInt16: SDPElement]) throws(DecodingError) {
        let classes = attributes[Self.serviceClassIDList]?.elements?.compactMap(\.uuid) ?? []
        guard classes.contains(serviceType.bluetoothServiceClass) else { throw .otherServiceClass }
        guard let strings = attributes[Self.txtAttribute]?.elements?.compactMap(\.textBytes) else { throw .noTXT }
        let record: TXTRecord
        do {
            record = try TXTRecord(decoding: strings)
        } catch {
            throw .badTXT(error)
        }
        let served = Self.servedPorts(attributes)
        let channel = served.channels.first
        let psm = served.psms.first
        guard channel != nil || psm != nil else { throw .noEndpoint }
        self.init(serviceType: serviceType, record: record, channel: channel, psm: psm)
    }

    /// The RFCOMM channels and L2CAP PSMs any SDP record serves (PeerLink's or another
    /// service's), in the order its protocol stacks list them: the first RFCOMM channel of each
    /// stack, and a PSM only where L2CAP is the top of its stack (not under RFCOMM).
    public static func servedPorts(_ attributes: [UInt16: SDPElement]) -> (channels: [RFCOMMChannel], psms: [L2CAPPSM]) {
        var channels: [RFCOMMChannel] = []
        var psms: [L2CAPPSM] = []
        var stacks: [[SDPElement]] = []
        if let main = attributes[protocolDescriptorList]?.elements { stacks.append(main) }
        for list in attributes[additionalProtocolDescriptorLists]?.elements ?? [] {
            if let stack = list.elements { stacks.append(stack) }
        }
        for stack in stacks {
            let layers = stack.compactMap(\.elements)
            for (position, layer) in layers.enumerated() {
                guard let protocolUUID = layer.first?.uuid, let parameter = layer.dropFirst().first?.integer else { continue }
                if protocolUUID == BluetoothUUID(short: UInt32(rfcommUUID)), let channel = RFCOMMChannel(Int(parameter)) {
                    channels.append(channel)
                } else if protocolUUID == BluetoothUUID(short: UInt32(l2capUUID)), position == layers.count - 1,
                    let psm = L2CAPPSM(Int(parameter))
                {
                    psms.append(psm)
                }
            }
        }
        return (channels, psms)
    }

    /// The record in BlueZ's XML form, as `org.bluez.ProfileManager1.RegisterProfile` takes it
    /// (option `ServiceRecord`). Text goes hex-encoded, so no name needs XML escaping.
    public var bluezXML: String {
        var lines = ["<?xml version=\"1.0\" encoding=\"UTF-8\" ?>", "<record>"]
        for id in attributes.keys.sorted() {
            lines.append("  <attribute id=\"\(Self.hex(UInt64(id), digits: 4))\">")
            Self.xml(attributes[id]!, indent: "    ", into: &lines)
            lines.append("  </attribute>")
        }
        lines.append("</record>")
        return lines.joined(separator: "\n") + "\n"
    }

    static func hex(_ value: UInt64, digits: Int) -> String {
        let text = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    static func xml(_ element: SDPElement, indent: String, into lines: inout [String]) {
        func leaf(_ tag: String, _ value: String, _ extra: String = "") {
            lines.append("\(indent)<\(tag)\(extra) value=\"\(value)\" />")
        }
        func hexBytes(_ bytes: [UInt8]) -> String {
            bytes.map { byte in
                let text = String(byte, radix: 16)
                return text.count == 1 ? "0" + text : text
            }.joined()
        }
        switch element {
        case .null: lines.append("\(indent)<nil />")
        case .uint8(let v): leaf("uint8", hex(UInt64(v), digits: 2))
        case .uint16(let v): leaf("uint16", hex(UInt64(v), digits: 4))
        case .uint32(let v): leaf("uint32", hex(UInt64(v), digits: 8))
        case .uint64(let v): leaf("uint64", hex(v, digits: 16))
        case .int8(let v): leaf("int8", String(v))
        case .int16(let v): leaf("int16", String(v))
        case .int32(let v): leaf("int32", String(v))
        case .int64(let v): leaf("int64", String(v))
        case .uuid16(let v): leaf("uuid", hex(UInt64(v), digits: 4))
        case .uuid32(let v): leaf("uuid", hex(UInt64(v), digits: 8))
        case .uuid128(let v): leaf("uuid", v.description)
        case .text(let bytes): leaf("text", hexBytes(bytes), " encoding=\"hex\"")
        case .url(let bytes): leaf("url", String(decoding: bytes, as: UTF8.self).filter { $0 != "\"" && $0 != "<" && $0 != "&" })
        case .bool(let v): leaf("boolean", v ? "true" : "false")
        case .sequence(let children), .alternative(let children):
            let tag: String
            if case .sequence = element { tag = "sequence" } else { tag = "alternate" }
            lines.append("\(indent)<\(tag)>")
            for child in children { xml(child, indent: indent + "  ", into: &lines) }
            lines.append("\(indent)</\(tag)>")
        case .other(_, let data): leaf("text", hexBytes(data), " encoding=\"hex\"")
        }
    }
}
