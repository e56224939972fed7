/// Where a peer can be reached: one address on one transport.
public enum Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// A TCP endpoint. `host` is a numeric IPv4 or IPv6 address; an IPv6 link-local address
    /// carries its zone (`fe80::1%eth0`).
    case tcp(host: String, port: UInt16)
    /// A Bluetooth Classic RFCOMM server channel (a byte stream).
    case rfcomm(address: BluetoothAddress, channel: RFCOMMChannel)
    /// A Bluetooth Classic L2CAP channel in SEQPACKET mode, by PSM.
    case l2cap(address: BluetoothAddress, psm: L2CAPPSM)
    /// A listener of the in-memory transport, by name (deterministic tests only).
    case memory(name: String)

    /// The transport's name as tools print it: `tcp`, `rfcomm`, `l2cap`, `memory`.
    public var transport: String {
        switch self {
        case .tcp: return "tcp"
        case .rfcomm: return "rfcomm"
        case .l2cap: return "l2cap"
        case .memory: return "memory"
        }
    }

    /// Whether the endpoint is on a Bluetooth transport.
    public var isBluetooth: Bool {
        switch self {
        case .rfcomm, .l2cap: return true
        case .tcp, .memory: return false
        }
    }

    public var description: String {
        switch self {
        case .tcp(let host, let port):
            return host.contains(":") ? "tcp://[\(host)]:\(port)" : "tcp://\(host):\(port)"
        case .rfcomm(let address, let channel):
            return "bt://\(address)/rfcomm/\(channel)"
        case .l2cap(let address, let psm):
            return "bt://\(address)/l2cap/\(psm)"
        case .memory(let name):
            return "memory://\(name)"
        }
    }

    /// Parses what ``description`` prints: `tcp://127.0.0.1:4000`, `tcp://[::1]:4000`,
    /// `bt://00:AA:01:00:00:00/rfcomm/5`, `bt://00:AA:01:00:00:00/l2cap/0x1001` (a PSM in hex or
    /// decimal). The error says which part is wrong and shows the accepted forms.
    public init(parsing text: String) throws(PeerLinkError) {
        let forms = "use tcp://HOST:PORT, tcp://[IPv6]:PORT, bt://AA:BB:CC:DD:EE:FF/rfcomm/CHANNEL (1-30) or bt://AA:BB:CC:DD:EE:FF/l2cap/PSM (odd, e.g. 0x1001)"
        func bad(_ why: String) -> PeerLinkError {
            PeerLinkError(.invalidParameter, "'\(text)' is not an endpoint: \(why); \(forms)")
        }
        if text.hasPrefix("bt://") {
            let parts = text.dropFirst("bt://".count).split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count == 3 else { throw bad("a Bluetooth endpoint has an address, a protocol and a channel or PSM") }
            guard let address = BluetoothAddress(String(parts[0])) else { throw bad("'\(parts[0])' is not a Bluetooth address") }
            switch parts[1].lowercased() {
            case "rfcomm":
                guard let number = Int(parts[2]), let channel = RFCOMMChannel(number) else {
                    throw bad("'\(parts[2])' is not an RFCOMM channel (1-30)")
                }
                self = .rfcomm(address: address, channel: channel)
            case "l2cap":
                guard let psm = L2CAPPSM(String(parts[2])) else {
                    throw bad("'\(parts[2])' is not an L2CAP PSM (odd low byte, even high byte; dynamic PSMs start at 0x1001)")
                }
                self = .l2cap(address: address, psm: psm)
            default:
                throw bad("'\(parts[1])' is not rfcomm or l2cap")
            }
            return
        }
        if text.hasPrefix("tcp://") {
            let rest = text.dropFirst("tcp://".count)
            let host: Substring
            let portText: Substring
            if rest.hasPrefix("[") {
                guard let close = rest.firstIndex(of: "]"), rest[rest.index(after: close)...].hasPrefix(":") else {
                    throw bad("an IPv6 address is written in brackets: tcp://[::1]:4000")
                }
                host = rest[rest.index(after: rest.startIndex)..<close]
                portText = rest[rest.index(close, offsetBy: 2)...]
            } else {
                guard let colon = rest.lastIndex(of: ":") else { throw bad("the port is missing") }
                host = rest[..<colon]
                portText = rest[rest.index(after: colon)...]
            }
            guard !host.isEmpty else { throw bad("the host is missing") }
            guard let port = UInt16(portText), port > 0 else { throw bad("'\(portText)' is not a port (1-65535)") }
            self = .tcp(host: String(host), port: port)
            return
        }
        throw bad("unknown scheme")
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
