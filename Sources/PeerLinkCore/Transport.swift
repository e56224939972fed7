/// An ordered, reliable byte stream to one peer, as a transport provides it: a TCP connection,
/// an RFCOMM channel, an L2CAP channel (whose packets are concatenated), or an in-memory pipe in
/// tests. The link protocol (``LinkStateMachine``) runs on top; sessions never see sockets.
public protocol LinkChannel: AnyObject, Sendable {
    /// The transport's name as tools show it: `tcp`, `rfcomm`, `l2cap`, `memory`.
    var transport: String { get }
    /// The remote end, for logs and `/peers` (e.g. `tcp://10.99.0.11:40123`).
    var remoteDescription: String { get }
    /// The next bytes that arrived; an empty array at the end of the stream. Throws when the
    /// channel failed (reset, closed locally).
    func read() async throws -> [UInt8]
    /// Reads the next bytes into the front of `buffer` and returns how many arrived (0 at the
    /// end of the stream); throws as ``read()`` does. The channel may replace or grow `buffer`.
    /// A reader that passes the same buffer every time and keeps no other reference to it lets
    /// a channel that reads in place reuse its storage instead of allocating for every read. The
    /// default hands over the array ``read()`` returns.
    func read(into buffer: inout [UInt8]) async throws -> Int
    /// Writes all of `bytes`; returns when the transport took them (back-pressure). In a
    /// cancelled task it takes what the transport takes at once and throws `CancellationError`
    /// instead of waiting for room for the rest, as a socket's send would: a link whose task is
    /// cancelled writes its `GO_AWAY` through it and relies on it to end.
    func write(_ bytes: [UInt8]) async throws
    /// Writes what the transport takes of `bytes` at once, without waiting, and returns how
    /// many bytes that was (0: none now; ``write(_:)`` the rest, in order). Throws as
    /// ``write(_:)`` does. Called only while no ``write(_:)`` runs. The default takes nothing,
    /// so every write goes through ``write(_:)``.
    func writeNow(_ bytes: [UInt8]) throws -> Int
    /// Closes both directions; a pending read returns or throws. Idempotent.
    func close()
    /// Ends this side's direction once everything written has gone, where the transport can
    /// say so and still read (TCP's half-close): the peer's reader sees the end of the stream.
    /// A link calls it after its last frame, its `GO_AWAY`, and reads on until the peer ends
    /// its side too. Reading and ``close()`` work as before. The default does nothing: the peer
    /// sees the end when the channel closes.
    func finishWriting()
    /// The most bytes a link's writer seals and hands to one write on this channel. Larger
    /// batches cost fewer system calls per byte of a bulk transfer; smaller ones keep what a
    /// message queued during one waits behind short on a slow transport. The default (two full
    /// frames, 32 KiB) suits Bluetooth; TCP takes more.
    var writeBatchLimit: Int { get }
    /// The largest `DATA` or `MESSAGE` payload a link writes on this channel to a peer that
    /// takes large frames (``Hello/maxFramePayload``). Larger frames cost less per byte of a
    /// bulk transfer; on a slow transport a message waits behind the frame being written. The
    /// default, ``WireFormat/maxFramePayload``, suits Bluetooth; TCP takes
    /// ``WireFormat/largeFramePayload``.
    var largestFramePayload: Int { get }
}

extension LinkChannel {
    public func read(into buffer: inout [UInt8]) async throws -> Int {
        buffer = try await read()
        return buffer.count
    }

    public func writeNow(_ bytes: [UInt8]) throws -> Int { 0 }

    public func finishWriting() {}

    /// Two full frames (32 KiB).
    public var writeBatchLimit: Int { 2 * WireFormat.maxFramePayload }

    /// ``WireFormat/maxFramePayload``.
    public var largestFramePayload: Int { WireFormat.maxFramePayload }
}

/// A transport's dialer: turns an endpoint of its kinds into a ``LinkChannel``.
///
/// `dial` throws a ``PeerLinkError`` with code `unsupported` for an endpoint of another kind, so a
/// session holding several dialers can try the next one.
public protocol Transport: Sendable {
    /// For logs and errors: `tcp`, `bluetooth`, `memory`.
    var name: String { get }
    /// The kinds of endpoint it dials. Empty (the default): it tries any endpoint and throws
    /// `unsupported` for the ones it does not dial.
    var kinds: Set<TransportKind> { get }
    /// Dials `endpoint`, giving up after `timeout`.
    func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel
}

/// The dialer protocol under the name the transport-module protocols use.
public typealias TransportDialer = Transport

extension Transport {
    public var kinds: Set<TransportKind> { [] }

    /// Whether this dialer takes `endpoint` (its kind is one of ``kinds``, or it names none).
    public func dials(_ endpoint: Endpoint) -> Bool {
        let kinds = kinds
        return kinds.isEmpty || kinds.contains(endpoint.kind)
    }
}

/// Incoming links of a transport that listens.
public protocol TransportListener: AnyObject, Sendable {
    /// Where peers can reach this listener (e.g. the TCP port to advertise).
    var localEndpoints: [Endpoint] { get }
    /// The next incoming link; throws once the listener is closed.
    func accept() async throws -> any LinkChannel
    func close()
}

/// What happens to an advertisement after it started.
public enum AdvertisementEvent: Sendable, Equatable {
    /// Published under this instance name (a DNS-SD instance name on the LAN).
    case published(instanceName: String)
    /// Another service on the network had the name: a new one was picked and it is published
    /// again under that (a `published` event follows).
    case renamed(from: String, to: String)
    /// The daemon behind the advertisement (named: `avahi-daemon`) stopped; it is published
    /// again as soon as it is back.
    case daemonUnavailable(daemon: String)
    /// Publishing failed for good.
    case failed(PeerLinkError)
}

/// A transport's advertisement of the local peer, running until ``stop()``.
public protocol TransportAdvertiser: AnyObject, Sendable {
    /// What is published and where, for people: `as _chat._tcp, port 4000`,
    /// `over Bluetooth on hci0 00:AA:01:00:00:00: SDP service class …`.
    var summary: String { get }
    /// What happens to the advertisement; finishes when it stops (at once for an advertisement
    /// that is complete when made).
    var events: AsyncStream<AdvertisementEvent> { get }
    /// Withdraws the advertisement. Idempotent.
    func stop()
}

/// A table a browser can show after a scan besides the peers it found (Bluetooth: every device
/// nearby, PeerLink or not).
public struct TransportScanReport: Hashable, Sendable {
    /// The line above the table (`Bluetooth devices (bluetoothd discovery): 3`).
    public var title: String
    public var columns: [String]
    public var rows: [[String]]

    public init(title: String, columns: [String], rows: [[String]]) {
        self.title = title
        self.columns = columns
        self.rows = rows
    }
}

/// A transport's browser: finds the peers of one service on that transport.
public protocol TransportBrowser: Sendable {
    /// Starts browsing. Throws `unavailable` (with what to do) when discovery cannot run on this
    /// transport here. Browsing stops when the consumer stops iterating.
    func events() async throws(PeerLinkError) -> AsyncStream<DiscoveryEvent>
    /// A table of what the last scan saw, for `peerlink scan`; nil (the default) for none.
    func scanReport() -> TransportScanReport?
}

extension TransportBrowser {
    public func scanReport() -> TransportScanReport? { nil }
}

/// Who the local peer is and what it publishes, for a transport's advertiser.
public struct Advertisement: Sendable {
    public var identity: Identity
    public var displayName: DisplayName
    public var serviceType: ServiceType
    public var info: DiscoveryInfo

    public init(identity: Identity, displayName: DisplayName, serviceType: ServiceType, info: DiscoveryInfo) {
        self.identity = identity
        self.displayName = displayName
        self.serviceType = serviceType
        self.info = info
    }

    /// The local peer as others see it.
    public var peer: PeerID { PeerID(identity: identity, displayName: displayName) }
}

/// What a node asks of a transport's browser.
public struct BrowseRequest: Sendable {
    public var serviceType: ServiceType
    /// Identities never to report (the local peer's own).
    public var excluding: Set<Fingerprint>
    /// How long one scan round may take, for transports that scan in rounds (Bluetooth inquiry);
    /// nil: the transport's default.
    public var scanWindow: Duration?

    public init(serviceType: ServiceType, excluding: Set<Fingerprint> = [], scanWindow: Duration? = nil) {
        self.serviceType = serviceType
        self.excluding = excluding
        self.scanWindow = scanWindow
    }
}

/// A transport's links, opened for a node: its dialer and its listeners.
public struct TransportLinks: Sendable {
    public var dialer: any TransportDialer
    /// Where peers reach the node on this transport. The node closes them when it stops.
    public var listeners: [any TransportListener]
    /// Where the links are, for people (`hci0 00:AA:01:00:00:00`); nil when there is nothing to say.
    public var place: String?

    public init(dialer: any TransportDialer, listeners: [any TransportListener], place: String? = nil) {
        self.dialer = dialer
        self.listeners = listeners
        self.place = place
    }
}

/// A transport as a module a node runs: it dials, listens, advertises and browses for one kind
/// of network (the LAN: TCP found through DNS-SD; Bluetooth: RFCOMM and L2CAP found through SDP;
/// the in-memory network of tests). Each lives in a target of its own and is registered with a
/// node by being in its transport choice; nothing else in PeerLink names it.
///
/// A node opens every module's links, publishes the local peer with each module's advertiser at
/// the endpoints of that module's listeners, and runs each module's browser; the peers the
/// browsers report are merged by identity. A module that cannot run here throws `unavailable`
/// with what to do, and the node goes on with the others.
///
/// ``openLinks(limits:)`` and ``advertise(_:at:)`` are synchronous and may block while a daemon
/// answers (bluetoothd, avahi-daemon); a node made with `PeerNode.open` calls them on a thread
/// of its own. The async requirements (dialling, browsing) run on Swift's cooperative threads:
/// a call in them that blocks belongs on a thread of its own (`runBlocking` in `PeerLinkPosix`).
public protocol TransportModule: Sendable {
    /// The module's name, as users choose it (`--transport lan`): lowercase, no spaces.
    var name: String { get }
    /// The name in sentences (`LAN`, `Bluetooth`); the default is ``name``.
    var label: String { get }
    /// The kinds of link the module makes, in its own order of preference.
    var kinds: [TransportKind] { get }
    /// How its endpoints are written; registered when a node uses the module. None by default.
    var endpointSchemes: [EndpointScheme] { get }
    /// The dial timeout its links need at least (a Bluetooth page alone may take 5.12 s); nil
    /// (the default): the session's.
    var dialTimeout: Duration? { get }
    /// Opens the links: the dialer and the listeners, which keep to `limits` (a TCP listener
    /// keeps the descriptor reserve free). Throws when this transport cannot run here (no
    /// Bluetooth in the kernel, no free port).
    func openLinks(limits: ResourceLimits) throws(PeerLinkError) -> TransportLinks
    /// Publishes `advertisement`, pointing at `endpoints` (this module's listeners' endpoints).
    /// Throws when it cannot (avahi-daemon or bluetoothd not running).
    func advertise(_ advertisement: Advertisement, at endpoints: [Endpoint]) throws(PeerLinkError) -> any TransportAdvertiser
    /// A browser for `request`; it throws from ``TransportBrowser/events()`` when it cannot run.
    func browser(_ request: BrowseRequest) -> any TransportBrowser
}

extension TransportModule {
    public var label: String { name }
    public var endpointSchemes: [EndpointScheme] { [] }
    public var dialTimeout: Duration? { nil }

    /// Registers the module's endpoint schemes (``EndpointScheme/register(_:)``).
    public func registerEndpointSchemes() {
        for scheme in endpointSchemes { EndpointScheme.register(scheme) }
    }
}
