/// Where a peer can be reached: one address on one transport.
public enum Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// A TCP endpoint. `host` is a numeric IPv4 or IPv6 address; an IPv6 link-local address
    /// carries its zone (`fe80::1%eth0`).
    case tcp(host: String, port: UInt16)
    /// A listener of the in-memory transport, by name (deterministic tests only).
    case memory(name: String)

    /// The transport's name as tools print it (`tcp`, later `rfcomm`, `l2cap`).
    public var transport: String {
        switch self {
        case .tcp: return "tcp"
        case .memory: return "memory"
        }
    }

    public var description: String {
        switch self {
        case .tcp(let host, let port):
            return host.contains(":") ? "tcp://[\(host)]:\(port)" : "tcp://\(host):\(port)"
        case .memory(let name):
            return "memory://\(name)"
        }
    }
}

/// A peer found by a browser: who it is, where it can be reached, and what it published.
public struct DiscoveredPeer: Hashable, Sendable {
    public var id: PeerID
    public var protocolVersion: Int
    public var endpoints: [Endpoint]
    public var info: DiscoveryInfo

    public init(id: PeerID, protocolVersion: Int, endpoints: [Endpoint], info: DiscoveryInfo) {
        self.id = id
        self.protocolVersion = protocolVersion
        self.endpoints = endpoints
        self.info = info
    }
}

/// What a browser reports.
public enum DiscoveryEvent: Hashable, Sendable {
    /// A peer is reachable (first seen, or back after being lost).
    case found(DiscoveredPeer)
    /// A reachable peer changed its endpoints, name or discovery info.
    case updated(DiscoveredPeer)
    /// A peer withdrew, or stopped answering for longer than the liveness timeout.
    case lost(PeerID)
}
