import PeerLinkCore

extension TransportKind {
    /// A Bluetooth Classic RFCOMM channel: a byte stream.
    public static let rfcomm: TransportKind = "rfcomm"
    /// A Bluetooth Classic L2CAP channel in SEQPACKET mode: packets of at most the negotiated MTU.
    public static let l2cap: TransportKind = "l2cap"
}

/// A Bluetooth Classic endpoint: a device and an RFCOMM channel (`bt://ADDR/rfcomm/CHANNEL`) or
/// an L2CAP PSM (`bt://ADDR/l2cap/PSM`).
public struct BluetoothEndpoint: EndpointAddress {
    /// Where on the device: an RFCOMM server channel or an L2CAP PSM.
    public enum Port: Hashable, Sendable {
        case rfcomm(RFCOMMChannel)
        case l2cap(L2CAPPSM)
    }

    /// The device.
    public var address: BluetoothAddress
    public var port: Port

    public init(address: BluetoothAddress, port: Port) {
        self.address = address
        self.port = port
    }

    public var kind: TransportKind { socketKind == .rfcomm ? .rfcomm : .l2cap }

    /// The socket the endpoint is dialled with.
    public var socketKind: BluetoothSocketKind {
        if case .rfcomm = port { return .rfcomm }
        return .l2cap
    }

    /// The channel or PSM as a number.
    public var portNumber: UInt16 {
        switch port {
        case .rfcomm(let channel): return UInt16(channel.value)
        case .l2cap(let psm): return psm.value
        }
    }

    public var description: String {
        switch port {
        case .rfcomm(let channel): return "bt://\(address)/rfcomm/\(channel)"
        case .l2cap(let psm): return "bt://\(address)/l2cap/\(psm)"
        }
    }

    public var fields: [String: EndpointField] {
        switch port {
        case .rfcomm(let channel): return ["address": .text(address.description), "channel": .number(Int(channel.value))]
        case .l2cap(let psm): return ["address": .text(address.description), "psm": .number(Int(psm.value))]
        }
    }

    public var origin: String? { address.description }
}

extension Endpoint {
    /// A Bluetooth Classic RFCOMM server channel (a byte stream).
    public static func rfcomm(address: BluetoothAddress, channel: RFCOMMChannel) -> Endpoint {
        Endpoint(BluetoothEndpoint(address: address, port: .rfcomm(channel)))
    }

    /// A Bluetooth Classic L2CAP channel in SEQPACKET mode, by PSM.
    public static func l2cap(address: BluetoothAddress, psm: L2CAPPSM) -> Endpoint {
        Endpoint(BluetoothEndpoint(address: address, port: .l2cap(psm)))
    }

    /// The device and channel or PSM, when this is a Bluetooth endpoint.
    public var bluetooth: BluetoothEndpoint? { address(as: BluetoothEndpoint.self) }

    /// Whether the endpoint is on a Bluetooth transport.
    public var isBluetooth: Bool { bluetooth != nil }

    /// The device address of a `bt://` endpoint.
    var bluetoothAddress: BluetoothAddress? { bluetooth?.address }
}

extension EndpointScheme {
    /// `bt://00:AA:01:00:00:00/rfcomm/5`, `bt://00:AA:01:00:00:00/l2cap/0x1001` (a PSM in hex or decimal).
    public static let bluetooth = EndpointScheme(
        name: "bt", forms: ["bt://AA:BB:CC:DD:EE:FF/rfcomm/CHANNEL (1-30)", "bt://AA:BB:CC:DD:EE:FF/l2cap/PSM (odd, e.g. 0x1001)"]
    ) { rest throws(EndpointSyntaxError) in
        let parts = rest.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            throw EndpointSyntaxError("a Bluetooth endpoint has an address, a protocol and a channel or PSM")
        }
        guard let address = BluetoothAddress(String(parts[0])) else {
            throw EndpointSyntaxError("'\(parts[0])' is not a Bluetooth address")
        }
        switch parts[1].lowercased() {
        case "rfcomm":
            guard let number = Int(parts[2]), let channel = RFCOMMChannel(number) else {
                throw EndpointSyntaxError("'\(parts[2])' is not an RFCOMM channel (1-30)")
            }
            return .rfcomm(address: address, channel: channel)
        case "l2cap":
            guard let psm = L2CAPPSM(String(parts[2])) else {
                throw EndpointSyntaxError("'\(parts[2])' is not an L2CAP PSM (odd low byte, even high byte; dynamic PSMs start at 0x1001)")
            }
            return .l2cap(address: address, psm: psm)
        default:
            throw EndpointSyntaxError("'\(parts[1])' is not rfcomm or l2cap")
        }
    }
}

extension PeerLinkServiceRecord {
    /// The endpoints this record offers on the device at `address`: L2CAP first (packets with a
    /// negotiated MTU), then RFCOMM.
    public func endpoints(at address: BluetoothAddress) -> [Endpoint] {
        [psm.map { Endpoint.l2cap(address: address, psm: $0) }, channel.map { Endpoint.rfcomm(address: address, channel: $0) }]
            .compactMap { $0 }
    }
}
