import PeerLinkCore

extension TransportKind {
    /// A connection of a ``MemoryNetwork`` (deterministic tests only).
    public static let memory: TransportKind = "memory"
}

/// A listener of a ``MemoryNetwork``, by name: `memory://name` (or `KIND://name` for a listener
/// of another kind).
public struct MemoryEndpoint: EndpointAddress {
    public var name: String
    public var kind: TransportKind

    public init(name: String, kind: TransportKind = .memory) {
        self.name = name
        self.kind = kind
    }

    public var description: String { "\(kind)://\(name)" }

    public var fields: [String: EndpointField] { ["name": .text(name)] }
}

extension Endpoint {
    /// A listener of the in-memory transport, by name (deterministic tests only).
    public static func memory(name: String, kind: TransportKind = .memory) -> Endpoint {
        Endpoint(MemoryEndpoint(name: name, kind: kind))
    }

    /// The listener's name and kind, when this is an in-memory endpoint.
    public var memory: MemoryEndpoint? { address(as: MemoryEndpoint.self) }
}

extension EndpointScheme {
    /// `memory://name`.
    public static let memory = EndpointScheme.memory(kind: .memory)

    /// `KIND://name`, for in-memory listeners of another kind.
    public static func memory(kind: TransportKind) -> EndpointScheme {
        EndpointScheme(name: kind.rawValue, forms: ["\(kind)://NAME"]) { rest throws(EndpointSyntaxError) in
            guard !rest.isEmpty, !rest.contains("/") else { throw EndpointSyntaxError("the listener's name is missing") }
            return .memory(name: String(rest), kind: kind)
        }
    }
}

/// A peer published on a ``MemoryNetwork``; ``stop()`` withdraws it.
public final class MemoryPublication: TransportAdvertiser {
    public let peer: DiscoveredPeer
    public let events: AsyncStream<AdvertisementEvent> = AsyncStream { $0.finish() }
    private let network: MemoryNetwork
    private let id: Int
    private let stopped = Locked(false)

    init(network: MemoryNetwork, id: Int, peer: DiscoveredPeer) {
        self.network = network
        self.id = id
        self.peer = peer
    }

    public var summary: String { "in memory at \(peer.endpoints.map(\.description).joined(separator: ", "))" }

    public func stop() {
        let first = stopped.withLock { stopped in
            defer { stopped = true }
            return !stopped
        }
        if first { network.withdraw(id) }
    }

    deinit { stop() }
}

/// The in-memory network's directory: publications and the browsers that see them. Pure state;
/// the network yields what it returns with its lock released.
struct MemoryDirectory {
    typealias Sink = AsyncStream<DiscoveryEvent>.Continuation

    /// Who sees a publication: browsers of the same service on the same kind of link.
    struct Scope: Hashable, Sendable {
        var serviceType: ServiceType
        var kind: TransportKind
    }

    private struct Browser {
        var scope: Scope
        var excluding: Set<Fingerprint>
        var sink: Sink
    }

    private var publications: [Int: (scope: Scope, peer: DiscoveredPeer)] = [:]
    private var browsers: [Int: Browser] = [:]
    private var nextID = 0

    private func published(_ scope: Scope, _ fingerprint: Fingerprint) -> [DiscoveredPeer] {
        publications.keys.sorted().compactMap { id in
            let entry = publications[id]!
            return entry.scope == scope && entry.peer.id.fingerprint == fingerprint ? entry.peer : nil
        }
    }

    /// What a browser of the peer's service sees of it now: its endpoints over every publication.
    private func view(_ scope: Scope, _ fingerprint: Fingerprint) -> DiscoveredPeer? {
        let all = published(scope, fingerprint)
        guard var peer = all.last else { return nil }
        var seen: Set<Endpoint> = []
        peer.endpoints = all.flatMap(\.endpoints).filter { seen.insert($0).inserted }
        return peer
    }

    private func deliveries(_ scope: Scope, _ fingerprint: Fingerprint, _ event: DiscoveryEvent) -> [(Sink, DiscoveryEvent)] {
        browsers.keys.sorted().compactMap { id in
            let browser = browsers[id]!
            guard browser.scope == scope, !browser.excluding.contains(fingerprint) else { return nil }
            return (browser.sink, event)
        }
    }

    mutating func publish(_ peer: DiscoveredPeer, scope: Scope) -> (Int, [(Sink, DiscoveryEvent)]) {
        nextID += 1
        let known = view(scope, peer.id.fingerprint) != nil
        publications[nextID] = (scope, peer)
        let now = view(scope, peer.id.fingerprint)!
        return (nextID, deliveries(scope, peer.id.fingerprint, known ? .updated(now) : .found(now)))
    }

    mutating func withdraw(_ id: Int) -> [(Sink, DiscoveryEvent)] {
        guard let (scope, peer) = publications.removeValue(forKey: id) else { return [] }
        let event: DiscoveryEvent = view(scope, peer.id.fingerprint).map { .updated($0) } ?? .lost(peer.id)
        return deliveries(scope, peer.id.fingerprint, event)
    }

    mutating func addBrowser(scope: Scope, excluding: Set<Fingerprint>, sink: Sink) -> (Int, [DiscoveryEvent]) {
        nextID += 1
        browsers[nextID] = Browser(scope: scope, excluding: excluding, sink: sink)
        var seen: Set<Fingerprint> = []
        let fingerprints = publications.keys.sorted().compactMap { id -> Fingerprint? in
            let entry = publications[id]!
            guard entry.scope == scope, !excluding.contains(entry.peer.id.fingerprint) else { return nil }
            return seen.insert(entry.peer.id.fingerprint).inserted ? entry.peer.id.fingerprint : nil
        }
        return (nextID, fingerprints.compactMap { view(scope, $0).map(DiscoveryEvent.found) })
    }

    mutating func removeBrowser(_ id: Int) {
        browsers[id] = nil
    }
}

/// The in-memory network as a transport module, for tests of code that runs a node: links are
/// a listener of the network (named after the module's `listenerName`) and a dialer of its kind;
/// advertising publishes on the network, browsing watches it.
///
/// Several modules of different kinds (`MemoryTransportModule(network:, listenerName: "ana-fast",
/// kind: "fast")`) play several transports, each with its own endpoints and scheme. Faults make a
/// part of the module unavailable, as a missing daemon or radio would.
public struct MemoryTransportModule: TransportModule {
    /// Failures to inject: each set part throws its error instead of running.
    public struct Faults: Sendable {
        public var links: PeerLinkError?
        public var advertising: PeerLinkError?
        public var browsing: PeerLinkError?

        public init(links: PeerLinkError? = nil, advertising: PeerLinkError? = nil, browsing: PeerLinkError? = nil) {
            self.links = links
            self.advertising = advertising
            self.browsing = browsing
        }
    }

    public let network: MemoryNetwork
    /// The name the module's listener takes on the network.
    public let listenerName: String
    public let kind: TransportKind
    public var faults: Faults

    /// - Parameters:
    ///   - name: the module's name; the kind's name by default.
    public init(network: MemoryNetwork, listenerName: String, kind: TransportKind = .memory, name: String? = nil, faults: Faults = Faults()) {
        self.network = network
        self.listenerName = listenerName
        self.kind = kind
        self.moduleName = name ?? kind.rawValue
        self.faults = faults
    }

    private let moduleName: String
    public var name: String { moduleName }
    public var kinds: [TransportKind] { [kind] }
    public var endpointSchemes: [EndpointScheme] { [.memory(kind: kind)] }

    public func openLinks(limits: ResourceLimits) throws(PeerLinkError) -> TransportLinks {
        if let error = faults.links { throw error }
        let listener = try network.listen(name: listenerName, kind: kind)
        return TransportLinks(dialer: MemoryTransport(network: network, kind: kind), listeners: [listener])
    }

    public func advertise(_ advertisement: Advertisement, at endpoints: [Endpoint]) throws(PeerLinkError) -> any TransportAdvertiser {
        if let error = faults.advertising { throw error }
        let peer = DiscoveredPeer(
            id: advertisement.peer, protocolVersion: Int(WireFormat.version), endpoints: endpoints.filter { $0.kind == kind },
            info: advertisement.info)
        return network.publish(peer, serviceType: advertisement.serviceType, kind: kind)
    }

    public func browser(_ request: BrowseRequest) -> any TransportBrowser {
        MemoryBrowser(network: network, request: request, kind: kind, fault: faults.browsing)
    }
}

/// Browses a ``MemoryNetwork`` for the publications of one kind of link.
public struct MemoryBrowser: TransportBrowser {
    public let network: MemoryNetwork
    public let request: BrowseRequest
    public let kind: TransportKind
    let fault: PeerLinkError?

    public init(network: MemoryNetwork, request: BrowseRequest, kind: TransportKind = .memory, fault: PeerLinkError? = nil) {
        self.network = network
        self.request = request
        self.kind = kind
        self.fault = fault
    }

    public func events() async throws(PeerLinkError) -> AsyncStream<DiscoveryEvent> {
        if let fault { throw fault }
        return network.browse(serviceType: request.serviceType, kind: kind, excluding: request.excluding)
    }
}
