/// The kind of link an endpoint leads to — `tcp`, `l2cap`, `rfcomm`, `memory` — as tools print it
/// and as ``TransportRanking`` orders it.
///
/// An open set: each transport target names its own kinds (`TransportKind.tcp` comes with the TCP
/// transport, `.l2cap` and `.rfcomm` with the Bluetooth one), and a new transport adds its kind
/// without touching anything here. A kind is 1 to 32 lowercase ASCII letters, digits, `+`, `-`
/// or `.`, starting with a letter (the characters of a URL scheme).
public struct TransportKind: Hashable, Sendable, Comparable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let rawValue: String

    /// nil when `rawValue` is not a valid kind (see the type's rules).
    public init?(_ rawValue: String) {
        guard Self.isValid(rawValue) else { return nil }
        self.rawValue = rawValue
    }

    /// A kind written in code; an invalid one traps.
    public init(stringLiteral value: String) {
        precondition(Self.isValid(value), "'\(value)' is not a transport kind: 1-32 lowercase letters, digits, '+', '-' or '.', starting with a letter")
        rawValue = value
    }

    static func isValid(_ text: String) -> Bool {
        guard let first = text.utf8.first, (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first), text.utf8.count <= 32 else {
            return false
        }
        return text.utf8.allSatisfy { byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
        }
    }

    public var description: String { rawValue }

    public static func < (lhs: TransportKind, rhs: TransportKind) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A value a transport puts in its endpoints: what a script sees of an endpoint in
/// `peerlink scan --json` besides its text.
public enum EndpointField: Hashable, Sendable {
    case text(String)
    case number(Int)
}

/// The address part of an ``Endpoint``, defined by the transport that dials it: `TCPEndpoint`
/// (host and port), `BluetoothEndpoint` (device, RFCOMM channel or L2CAP PSM), `MemoryEndpoint`
/// (a listener's name)…
///
/// Its `description` is the endpoint's text, which the transport's ``EndpointScheme`` parses back
/// (`tcp://127.0.0.1:4000`, `bt://00:AA:01:00:00:00/l2cap/0x1001`).
public protocol EndpointAddress: Hashable, Sendable, CustomStringConvertible {
    /// The kind of link this address leads to.
    var kind: TransportKind { get }
    /// The address's parts by name, for scripts (`host`, `port`; `address`, `channel`…).
    var fields: [String: EndpointField] { get }
    /// The machine the address leads to (a TCP host, a Bluetooth device address): incoming
    /// links from one origin share the per-address caps of ``ResourceLimits``. Nil (the
    /// default) when the transport has no such notion; then only session-wide caps apply.
    var origin: String? { get }
}

extension EndpointAddress {
    public var fields: [String: EndpointField] { [:] }
    public var origin: String? { nil }

    fileprivate func isEqual(to other: any EndpointAddress) -> Bool {
        guard let other = other as? Self else { return false }
        return self == other
    }
}

/// Where a peer can be reached: one address on one kind of link.
///
/// Endpoints are values of an open set: the core knows none of them. Each transport target adds
/// its typed constructors and accessors in an extension (`Endpoint.tcp(host:port:)` and
/// `endpoint.tcp` with the TCP transport; `Endpoint.l2cap(address:psm:)`, `.rfcomm(address:channel:)`
/// and `endpoint.bluetooth` with the Bluetooth one) and registers an ``EndpointScheme`` so that
/// ``init(parsing:)`` reads its texts.
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// The kind of link: `tcp`, `l2cap`, `rfcomm`, `memory`…
    public let kind: TransportKind
    /// The transport's own address value; ``address(as:)`` reads it as its type.
    public let address: any EndpointAddress

    public init(_ address: some EndpointAddress) {
        kind = address.kind
        self.address = address
    }

    /// The address as the transport's type, or nil when it is another transport's.
    public func address<Address: EndpointAddress>(as type: Address.Type) -> Address? {
        address as? Address
    }

    /// The kind's name as tools print it: `tcp`, `rfcomm`, `l2cap`, `memory`.
    public var transport: String { kind.rawValue }

    /// The endpoint's text, as ``init(parsing:)`` reads it: `tcp://127.0.0.1:4000`.
    public var description: String { address.description }

    public static func == (lhs: Endpoint, rhs: Endpoint) -> Bool {
        lhs.kind == rhs.kind && lhs.address.isEqual(to: rhs.address)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        address.hash(into: &hasher)
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

    /// The kinds of link the peer is reachable on, in the order of its endpoints, each once.
    public var transports: [TransportKind] {
        var seen: Set<TransportKind> = []
        return endpoints.map(\.kind).filter { seen.insert($0).inserted }
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
