import PeerLinkCore
import PeerLinkSession

/// What a ``PeerNode`` is: the session it runs (identity, display name, service type, encryption,
/// rules), what it publishes, the transports it uses and in which order it prefers them, and
/// whom it trusts.
public struct PeerNodeConfiguration: Sendable {
    /// Who the local peer is, which service it serves, encryption and the session's rules.
    /// Its `admit` check, if any, is asked after the node's own (``admitOnlyKnownPeers``).
    public var session: PeerSessionConfiguration
    /// The app's discovery info, published by every transport's advertiser.
    public var info: DiscoveryInfo
    /// The transports to run: `.lan`, `.bluetooth`, `.auto` (both, the default), or modules.
    public var transports: TransportChoice
    /// Which kinds of link to prefer: the order of a peer's endpoints, so the order they are
    /// dialled in (``PeerLinkCore/TransportRanking/standard``: TCP, L2CAP, RFCOMM).
    public var ranking: TransportRanking
    /// Whether the node publishes the local peer when it is made (false: only when the app calls
    /// ``PeerNode/publish(info:)``).
    public var advertising: Bool
    /// Whether the node browses for peers and feeds them to its session.
    public var browsing: Bool
    /// Whether a node that advertises must be visible somewhere: when true (the default), making
    /// the node fails when no transport can advertise (avahi-daemon and bluetoothd both missing).
    /// False for a node that is reached at explicit endpoints.
    public var discoveryRequired: Bool
    /// The known-peers file: every peer met is remembered there (trust on first use) and judged
    /// with a ``PeerNodeEvent/met(_:_:verificationCode:)`` event. nil: peers are remembered in
    /// memory only, for this node.
    public var knownPeersPath: String?
    /// Admit only peers already known (in the known-peers file when the node was made); every
    /// other peer is refused right after its handshake, and both sides are told why.
    public var admitOnlyKnownPeers: Bool

    public init(
        session: PeerSessionConfiguration, info: DiscoveryInfo = try! DiscoveryInfo(), transports: TransportChoice = .auto,
        ranking: TransportRanking = .standard, advertising: Bool = true, browsing: Bool = true, discoveryRequired: Bool = true,
        knownPeersPath: String? = nil, admitOnlyKnownPeers: Bool = false
    ) {
        self.session = session
        self.info = info
        self.transports = transports
        self.ranking = ranking
        self.advertising = advertising
        self.browsing = browsing
        self.discoveryRequired = discoveryRequired
        self.knownPeersPath = knownPeersPath
        self.admitOnlyKnownPeers = admitOnlyKnownPeers
    }

    /// A node of the local peer `identity` called `displayName` on `serviceType`, with the
    /// session's defaults (encryption required, manual invitations unless `policy` says automatic).
    public init(
        identity: Identity, displayName: DisplayName, serviceType: ServiceType, info: DiscoveryInfo = try! DiscoveryInfo(),
        transports: TransportChoice = .auto, encryption: EncryptionPreference = .required, policy: SessionPolicy = SessionPolicy()
    ) {
        self.init(
            session: PeerSessionConfiguration(
                identity: identity, displayName: displayName, serviceType: serviceType, encryption: encryption, policy: policy),
            info: info, transports: transports)
    }
}

/// One of a transport module's parts, in ``TransportNotice``s.
public enum TransportFacility: String, Sendable, Hashable {
    /// Its links: listeners and dialer.
    case links
    /// Its advertisement of the local peer.
    case advertising
    /// Its browser.
    case browsing
}

/// Something that happened to one of a node's transport modules: what runs, what cannot.
public struct TransportNotice: Sendable, CustomStringConvertible {
    public enum What: Sendable {
        /// The module's links are open: its listeners' endpoints, and where they are (an adapter).
        case listening(place: String?, endpoints: [Endpoint])
        /// The module advertises the local peer (``PeerLinkCore/TransportAdvertiser/summary``).
        case advertising(summary: String)
        /// What happened to the module's advertisement since (published, renamed, daemon gone).
        case advertisement(AdvertisementEvent)
        /// The module's browser runs.
        case browsing
        /// A part of the module cannot run here; `error` says why and what to do. Without its
        /// links the module is out; without advertising or browsing its links still work for
        /// explicit endpoints.
        case unavailable(TransportFacility, PeerLinkError)
    }

    /// The module's name (`lan`, `bluetooth`).
    public var module: String
    /// The module's name in sentences (`LAN`, `Bluetooth`).
    public var label: String
    public var what: What

    public init(module: String, label: String, what: What) {
        self.module = module
        self.label = label
        self.what = what
    }

    public var description: String {
        switch what {
        case .listening(let place, let endpoints):
            "\(label): listening\(place.map { " on \($0)" } ?? "") at \(endpoints.map(\.description).joined(separator: ", "))"
        case .advertising(let summary): "\(label): advertising \(summary)"
        case .advertisement(let event): "\(label): advertisement \(event)"
        case .browsing: "\(label): browsing"
        case .unavailable(let facility, let error): "\(label): \(facility.rawValue) unavailable: \(error.message)"
        }
    }
}

/// What a ``PeerNode`` tells the app: every event of its session, as it is, and the node's own.
public enum PeerNodeEvent: Sendable, CustomStringConvertible {
    /// An event of the node's ``PeerLinkSession/PeerSession``, forwarded as it came (peers
    /// joining and leaving, invitations, messages, failures, and any event the session adds).
    case session(PeerSessionEvent)
    /// A peer connected (first time in this node, or back after leaving): what the known-peers
    /// file says of it (trust on first use), and the link's verification code.
    case met(PeerID, KnownPeers.Verdict, verificationCode: String?)
    /// The node's discovery, merged over every transport: a peer found, changed (its
    /// endpoints, so its transports, or its name or info), lost on the last transport.
    case discovery(DiscoveryEvent)
    /// A transport module started, advertises, browses, or cannot.
    case transport(TransportNotice)
    /// An invitation made because of ``PeerNode/invitePeers(named:context:timeout:)``: sent (its
    /// answer comes as a session event) or not.
    case invitedByName(PeerID, Result<InvitationID, PeerLinkError>)

    public var description: String {
        switch self {
        case .session(let event): "session: \(event)"
        case .met(let peer, let verdict, let code): "met \(peer): \(verdict)\(code.map { ", code \($0)" } ?? "")"
        case .discovery(let event): "discovery: \(event)"
        case .transport(let notice): "transport \(notice)"
        case .invitedByName(let peer, .success(let id)): "invited \(peer) by name: \(id)"
        case .invitedByName(let peer, .failure(let error)): "could not invite \(peer) by name: \(error.message)"
        }
    }
}

/// How the node reaches one peer: every endpoint discovery knows for it and the link in use.
public struct NodePeerStatus: Sendable {
    public var peer: PeerID
    /// The link in use (transport, remote end, encryption, verification code); nil when the
    /// peer is not connected.
    public var link: ConnectedPeerInfo?
    /// Where the peer can be reached, best first by the node's ranking.
    public var endpoints: [Endpoint]
    /// Every transport the peer is reachable on, best first: the kinds of ``endpoints``, and
    /// the one in use.
    public var transports: [TransportKind]

    public init(peer: PeerID, link: ConnectedPeerInfo?, endpoints: [Endpoint], transports: [TransportKind]) {
        self.peer = peer
        self.link = link
        self.endpoints = endpoints
        self.transports = transports
    }

    /// The kind of the link in use, when connected.
    public var transportInUse: TransportKind? { link.flatMap { TransportKind($0.transport) } }
}
