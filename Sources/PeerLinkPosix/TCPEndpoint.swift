import PeerLinkCore

extension TransportKind {
    /// A TCP connection.
    public static let tcp: TransportKind = "tcp"
}

/// A TCP endpoint: `tcp://HOST:PORT`, `tcp://[IPv6]:PORT`.
public struct TCPEndpoint: EndpointAddress {
    /// A numeric IPv4 or IPv6 address; an IPv6 link-local address carries its zone (`fe80::1%eth0`).
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    public var kind: TransportKind { .tcp }

    public var description: String {
        host.contains(":") ? "tcp://[\(host)]:\(port)" : "tcp://\(host):\(port)"
    }

    public var fields: [String: EndpointField] { ["host": .text(host), "port": .number(Int(port))] }

    public var origin: String? { host }
}

extension Endpoint {
    /// A TCP endpoint. `host` is a numeric IPv4 or IPv6 address; an IPv6 link-local address
    /// carries its zone (`fe80::1%eth0`).
    public static func tcp(host: String, port: UInt16) -> Endpoint {
        Endpoint(TCPEndpoint(host: host, port: port))
    }

    /// The host and port, when this is a TCP endpoint.
    public var tcp: TCPEndpoint? { address(as: TCPEndpoint.self) }
}

extension EndpointScheme {
    /// `tcp://127.0.0.1:4000`, `tcp://[::1]:4000`.
    public static let tcp = EndpointScheme(name: "tcp", forms: ["tcp://HOST:PORT", "tcp://[IPv6]:PORT"]) {
        rest throws(EndpointSyntaxError) in
        let host: Substring
        let portText: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]"), rest[rest.index(after: close)...].hasPrefix(":") else {
                throw EndpointSyntaxError("an IPv6 address is written in brackets: tcp://[::1]:4000")
            }
            host = rest[rest.index(after: rest.startIndex)..<close]
            portText = rest[rest.index(close, offsetBy: 2)...]
        } else {
            guard let colon = rest.lastIndex(of: ":") else { throw EndpointSyntaxError("the port is missing") }
            host = rest[..<colon]
            portText = rest[rest.index(after: colon)...]
        }
        guard !host.isEmpty else { throw EndpointSyntaxError("the host is missing") }
        guard let port = UInt16(portText), port > 0 else { throw EndpointSyntaxError("'\(portText)' is not a port (1-65535)") }
        return .tcp(host: String(host), port: port)
    }
}
