import Logging
import PeerLinkCore
import PeerLinkPosix

/// The LAN as a transport module: TCP links (a listener on a free port, a dialer for `tcp://`
/// endpoints), DNS-SD through avahi-daemon to advertise (``LANAdvertiser``) and browse
/// (``LANBrowser``).
///
/// Its links open without avahi-daemon (explicit `tcp://` endpoints still connect); advertising
/// and browsing throw `unavailable` without it.
public struct LANTransportModule: TransportModule {
    public var name: String { "lan" }
    public var label: String { "LAN" }
    public var kinds: [TransportKind] { [.tcp] }
    public var endpointSchemes: [EndpointScheme] { [.tcp] }

    /// The numeric address to listen on (nil: every interface).
    public var listenHost: String?
    /// The port to listen on (0: any free one).
    public var port: UInt16
    /// How fast the browser notices a vanished peer.
    public var liveness: LivenessPolicy
    public var logger: Logger

    public init(
        listenHost: String? = nil, port: UInt16 = 0, liveness: LivenessPolicy = LivenessPolicy(),
        logger: Logger = Logger(label: "peerlink.lan")
    ) {
        self.listenHost = listenHost
        self.port = port
        self.liveness = liveness
        self.logger = logger
    }

    public func openLinks(limits: ResourceLimits) throws(PeerLinkError) -> TransportLinks {
        let listener = try TCPTransportListener(host: listenHost, port: port, limits: limits)
        return TransportLinks(dialer: TCPTransport(), listeners: [listener])
    }

    /// Publishes `_<service>._tcp` at the port of the first TCP endpoint.
    public func advertise(_ advertisement: Advertisement, at endpoints: [Endpoint]) throws(PeerLinkError) -> any TransportAdvertiser {
        guard let port = endpoints.compactMap(\.tcp).first?.port else {
            throw PeerLinkError(.invalidParameter, "the LAN advertisement needs a TCP listener to point at")
        }
        return try LANAdvertiser(
            identity: advertisement.identity, displayName: advertisement.displayName, serviceType: advertisement.serviceType,
            info: advertisement.info, port: port, logger: logger)
    }

    public func browser(_ request: BrowseRequest) -> any TransportBrowser {
        LANBrowser(serviceType: request.serviceType, liveness: liveness, excluding: request.excluding, logger: logger)
    }
}
