/// Which kinds of link to prefer, best first: the order in which a peer's endpoints are dialled,
/// and the order tools list a peer's transports in.
///
/// The default is `tcp` (the LAN: fastest), then `l2cap` (Bluetooth packets with a negotiated MTU),
/// then `rfcomm`. Kinds the order does not name come after the named ones, in the order they were
/// reported. The order is a policy value: a node takes it in its configuration
/// (`PeerNodeConfiguration.ranking`), `peerlink chat --prefer l2cap,tcp` sets it, and chat shows it
/// when it starts.
public struct TransportRanking: Hashable, Sendable, CustomStringConvertible {
    /// The preferred kinds, best first.
    public var order: [TransportKind]

    /// TCP, then L2CAP, then RFCOMM.
    public static let standard = TransportRanking(["tcp", "l2cap", "rfcomm"])

    public init(_ order: [TransportKind]) {
        var seen: Set<TransportKind> = []
        self.order = order.filter { seen.insert($0).inserted }
    }

    /// Reads a list such as `l2cap,tcp` (commas or spaces between kinds).
    ///
    /// - Throws: `invalidParameter` naming the entry that is not a kind, or for an empty list.
    public init(parsing text: String) throws(PeerLinkError) {
        let names = text.split(whereSeparator: { $0 == "," || $0 == " " }).map(String.init)
        guard !names.isEmpty else {
            throw PeerLinkError(.invalidParameter, "the transport order is empty: name kinds such as tcp,l2cap,rfcomm")
        }
        var kinds: [TransportKind] = []
        for name in names {
            guard let kind = TransportKind(name.lowercased()) else {
                throw PeerLinkError(.invalidParameter, "'\(name)' is not a transport kind: name kinds such as tcp, l2cap, rfcomm")
            }
            kinds.append(kind)
        }
        self.init(kinds)
    }

    /// Where `kind` stands: 0 is best; every kind not named shares the place after the last.
    public func rank(of kind: TransportKind) -> Int {
        order.firstIndex(of: kind) ?? order.count
    }

    /// `endpoints` best first: by ``rank(of:)``, then in the order given; each endpoint once.
    public func ranked(_ endpoints: [Endpoint]) -> [Endpoint] {
        var seen: Set<Endpoint> = []
        let unique = endpoints.filter { seen.insert($0).inserted }
        return unique.enumerated()
            .sorted { (rank(of: $0.element.kind), $0.offset) < (rank(of: $1.element.kind), $1.offset) }
            .map(\.element)
    }

    /// `kinds` best first, each once.
    public func ranked(_ kinds: [TransportKind]) -> [TransportKind] {
        var seen: Set<TransportKind> = []
        let unique = kinds.filter { seen.insert($0).inserted }
        return unique.enumerated()
            .sorted { (rank(of: $0.element), $0.offset) < (rank(of: $1.element), $1.offset) }
            .map(\.element)
    }

    /// `tcp > l2cap > rfcomm`.
    public var description: String { order.map(\.rawValue).joined(separator: " > ") }
}
