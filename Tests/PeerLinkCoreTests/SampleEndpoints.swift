import PeerLinkCore

/// An endpoint of a transport the core knows nothing about: the core's discovery and ranking
/// work on any ``EndpointAddress``. The helpers below make endpoints that look like the real
/// transports' (which live in their own targets) without depending on them.
struct SampleEndpoint: EndpointAddress {
    var kind: TransportKind
    var text: String

    var description: String { text }
}

extension Endpoint {
    static func tcp(host: String, port: UInt16) -> Endpoint {
        Endpoint(SampleEndpoint(kind: "tcp", text: host.contains(":") ? "tcp://[\(host)]:\(port)" : "tcp://\(host):\(port)"))
    }

    static func l2cap(address: BluetoothAddress, psm: L2CAPPSM) -> Endpoint {
        Endpoint(SampleEndpoint(kind: "l2cap", text: "bt://\(address)/l2cap/\(psm)"))
    }

    static func rfcomm(address: BluetoothAddress, channel: RFCOMMChannel) -> Endpoint {
        Endpoint(SampleEndpoint(kind: "rfcomm", text: "bt://\(address)/rfcomm/\(channel)"))
    }

    /// An endpoint of a transport no policy ranks (the session tests' links rank 0 too, so
    /// knowing it never makes a pair upgrade).
    static func unranked(_ name: String, kind: TransportKind = "sample") -> Endpoint {
        Endpoint(SampleEndpoint(kind: kind, text: "\(kind)://\(name)"))
    }
}
