import Crypto

/// A link as the owner of a ``SessionStateMachine`` names it: an opaque number, unique among the
/// links of one state machine for as long as the link lives. The owner picks it; the state
/// machine never makes one up.
public struct LinkID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: Int

    public init(_ rawValue: Int) {
        self.rawValue = rawValue
    }

    public static func < (lhs: LinkID, rhs: LinkID) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "link \(rawValue)" }
}

/// An invitation as the local app sees it, sent or received. Numbers are local to one
/// ``SessionStateMachine``: an incoming invitation gets its own number, whatever number the
/// inviter gave it on the wire.
public struct InvitationID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt32

    public init(_ rawValue: UInt32) {
        self.rawValue = rawValue
    }

    public static func < (lhs: InvitationID, rhs: InvitationID) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "invitation \(rawValue)" }
}

/// A remote peer's state in the local session, as in MultipeerConnectivity.
public enum PeerState: Hashable, Sendable, CustomStringConvertible {
    /// Not in the session (never was, declined, timed out, left, or its link is gone).
    case notConnected
    /// On its way in: an invitation is out, a join is under way, or a member announced it.
    case connecting
    /// A member of the session: messages can be sent to it.
    case connected

    public var description: String {
        switch self {
        case .notConnected: "not connected"
        case .connecting: "connecting"
        case .connected: "connected"
        }
    }
}

/// The rules of one local session: a policy value, not constants scattered through the code.
///
/// Whether unknown peers are trusted is not decided here: a link reaches the session only once
/// the layers below have authenticated the peer and the trust policy has let it in.
public struct SessionPolicy: Hashable, Sendable {
    /// The most peers any session holds, the local one included (MultipeerConnectivity's limit).
    public static let largestSession = 8

    /// The most peers in the session, **the local one included**: 2 to 8 (8 by default).
    public var maximumPeers: Int
    /// How long an invitation waits for an answer when ``SessionStateMachine/invite(_:endpoints:context:timeout:at:)``
    /// names no timeout (30 s, as in MultipeerConnectivity).
    public var invitationTimeout: Duration
    /// Automatic mode: the local peer invites every peer discovery finds whose fingerprint is
    /// greater than its own and accepts every invitation and join into the automatic session
    /// while there is room, so all automatic peers of a service form one session.
    public var automatic: Bool
    /// How long a join may take: a newcomer waiting for a member's `JOIN` in reply, a member
    /// waiting for an announced newcomer's `JOIN`, or a `JOIN` waiting for its announcement.
    public var joinTimeout: Duration
    /// How much longer than the invitation's timeout an inviter waits for the answer, to allow
    /// for the answer's trip back (the invitee's own clock ends the invitation at its timeout).
    public var responseGrace: Duration
    /// How long a peer stays as it is after its link was closed as a duplicate (code 9) while
    /// the link that replaces it is still being set up; after that the peer is lost.
    public var replacementGrace: Duration
    /// A link to a peer the session has no business with (not a member, no invitation, no join)
    /// is closed after this long.
    public var idleLinkTimeout: Duration
    /// The most unreliable messages queued for one peer; more are dropped (and counted).
    public var maximumQueuedDatagrams: Int
    /// Automatic mode: a found peer with a *smaller* fingerprint (the one that invites) that
    /// has not reached the local peer within this long is invited by the local peer too. The
    /// pair's usual direction can fail where the other works: a firewall in one direction, or
    /// a Bluetooth device that refuses the inviter's pairing because it keeps a bond the
    /// inviter no longer has. The tie-break settles it if both invitations get through.
    public var automaticFallback: Duration
    /// How long a member whose last link failed stays in the session while it is dialled again
    /// on every transport that knows it (its frames kept, see ``Continuity``); it leaves
    /// (``PeerState/notConnected``) only when no link comes back within this long. A member
    /// that left on purpose (`GO_AWAY` 0, `LEAVE`) leaves at once. Zero turns this off.
    public var reconnectGrace: Duration
    /// How often a member in its reconnect grace is dialled again.
    public var redialInterval: Duration
    /// Each transport's rank (`tcp`, `l2cap`, `rfcomm`, ...): when a pair has links on several
    /// transports, the best ranked carries its frames and the others are closed once drained;
    /// a connected peer found on a better ranked transport is dialled there (an upgrade).
    /// Transports not listed rank 0.
    public var transportRanks: [String: Int]

    public init(
        maximumPeers: Int = SessionPolicy.largestSession,
        invitationTimeout: Duration = .seconds(30),
        automatic: Bool = false,
        joinTimeout: Duration = .seconds(15),
        responseGrace: Duration = .seconds(2),
        replacementGrace: Duration = .seconds(10),
        idleLinkTimeout: Duration = .seconds(10),
        maximumQueuedDatagrams: Int = 8,
        automaticFallback: Duration = .seconds(10),
        reconnectGrace: Duration = .seconds(30),
        redialInterval: Duration = .seconds(2),
        transportRanks: [String: Int] = SessionPolicy.defaultTransportRanks
    ) {
        self.maximumPeers = maximumPeers
        self.invitationTimeout = invitationTimeout
        self.automatic = automatic
        self.joinTimeout = joinTimeout
        self.responseGrace = responseGrace
        self.replacementGrace = replacementGrace
        self.idleLinkTimeout = idleLinkTimeout
        self.maximumQueuedDatagrams = maximumQueuedDatagrams
        self.automaticFallback = automaticFallback
        self.reconnectGrace = reconnectGrace
        self.redialInterval = redialInterval
        self.transportRanks = transportRanks
    }

    /// The default ranks: TCP (the LAN) first, then L2CAP, then RFCOMM.
    public static let defaultTransportRanks: [String: Int] = ["tcp": 30, "l2cap": 20, "rfcomm": 10]

    /// The rank of `transport` (0 when not listed).
    public func rank(of transport: String) -> Int { transportRanks[transport] ?? 0 }

    /// Invitations answered by the app, 8 peers, 30 s invitations.
    public static let `default` = SessionPolicy()

    /// How soon automatic mode invites a peer again after an invitation that never reached it.
    public static let automaticRetryAfterFailure: Duration = .seconds(2)

    /// The wait before automatic mode invites a peer again after `failures` invitations in a
    /// row that never reached it: ``automaticRetryAfterFailure``, doubled for each failure after
    /// the first, at most `invitationTimeout` (a peer given by an address that stays down is not
    /// dialled every two seconds for as long as the session runs).
    public static func automaticRetryDelay(afterFailures failures: Int, invitationTimeout: Duration) -> Duration {
        let doublings = min(max(failures - 1, 0), 16)
        return min(invitationTimeout, automaticRetryAfterFailure * (1 << doublings))
    }

    /// - Throws: a ``PeerLinkError`` (`invalidParameter`) naming the value that is out of range.
    public func validate() throws(PeerLinkError) {
        guard (2...Self.largestSession).contains(maximumPeers) else {
            throw PeerLinkError(
                .invalidParameter,
                "a session holds 2 to \(Self.largestSession) peers including the local one; \(maximumPeers) is out of range")
        }
        let durations: [(String, Duration)] = [
            ("invitation timeout", invitationTimeout), ("join timeout", joinTimeout),
            ("replacement grace", replacementGrace), ("idle link timeout", idleLinkTimeout),
            ("automatic fallback", automaticFallback), ("redial interval", redialInterval),
        ]
        for (name, value) in durations where value <= .zero {
            throw PeerLinkError(.invalidParameter, "the session's \(name) must be longer than zero")
        }
        guard responseGrace >= .zero else {
            throw PeerLinkError(.invalidParameter, "the session's response grace cannot be negative")
        }
        guard reconnectGrace >= .zero else {
            throw PeerLinkError(.invalidParameter, "the session's reconnect grace cannot be negative")
        }
        guard maximumQueuedDatagrams >= 1 else {
            throw PeerLinkError(.invalidParameter, "at least one unreliable message must be allowed to queue")
        }
    }
}

/// How an invitation the local app sent ended.
public enum InvitationOutcome: Hashable, Sendable, CustomStringConvertible {
    /// The peer is in the session. Also reported when both peers invited each other and the
    /// tie-break connected them through the other invitation.
    case accepted
    /// The peer's app declined.
    case declined
    /// No answer within the timeout (the invitee's clock, or the inviter's plus a grace).
    case timedOut
    /// The peer's session already holds its maximum number of peers.
    case sessionFull
    /// The invitation could not be carried out: the peer could not be reached, its link was
    /// lost, or the session was left.
    case failed(String)

    public var description: String {
        switch self {
        case .accepted: "accepted"
        case .declined: "declined"
        case .timedOut: "timed out"
        case .sessionFull: "session full"
        case .failed(let reason): "failed: \(reason)"
        }
    }
}

/// Why an invitation shown to the app with ``SessionEvent/invitationReceived(_:from:context:)``
/// can no longer be answered.
public enum InvitationCancelReason: Hashable, Sendable, CustomStringConvertible {
    /// Its timeout passed; the inviter was told (`DECLINE` timed out).
    case timedOut
    /// The inviter's link is gone.
    case peerGone(String)
    /// The peer is already connected some other way (it joined through another member, or the
    /// local app invited it); the invitation was accepted without asking.
    case alreadyConnected
    /// Both peers invited each other; the tie-break settled it (see the Sessions article).
    case crossed
    /// The local peer left the session.
    case disconnected

    public var description: String {
        switch self {
        case .timedOut: "timed out"
        case .peerGone(let reason): "the inviter is gone: \(reason)"
        case .alreadyConnected: "already connected"
        case .crossed: "settled by the tie-break for crossed invitations"
        case .disconnected: "the local peer left the session"
        }
    }
}

/// What the session tells the app.
public enum SessionEvent: Hashable, Sendable, CustomStringConvertible {
    /// A peer's state changed. `reason` says why a peer became ``PeerState/notConnected``
    /// (nil otherwise).
    case peerStateChanged(PeerID, PeerState, reason: String?)
    /// A peer invites the local peer; answer with ``SessionStateMachine/respond(to:accept:at:)``
    /// before the invitation times out.
    case invitationReceived(InvitationID, from: PeerID, context: [UInt8])
    /// An invitation the local app sent has ended.
    case invitationResult(InvitationID, peer: PeerID, InvitationOutcome)
    /// An invitation shown to the app can no longer be answered.
    case invitationCancelled(InvitationID, from: PeerID, reason: InvitationCancelReason)
    /// An invitation was declined without asking the app (the session is full, or the local
    /// peer is in another session). Diagnostic.
    case invitationRefused(from: PeerID, reason: DeclineReason, detail: String)
    /// A member refused the local peer's `JOIN` (closed the link with `code`), or never answered
    /// it (`code` nil), so the session is not a full mesh for this pair. Diagnostic.
    case joinRefused(PeerID, code: GoAwayCode?, reason: String)
    /// A message from a connected peer: `reliable` tells which mode it was sent in.
    case messageReceived(PeerID, [UInt8], reliable: Bool)
    /// A member's frames now go over another link (a failover, an upgrade, a reconnect): the
    /// peer stays connected, nothing is lost.
    case linkChanged(PeerID, LinkID)

    public var description: String {
        switch self {
        case .peerStateChanged(let peer, let state, let reason):
            "\(peer) is \(state)" + (reason.map { ": \($0)" } ?? "")
        case .invitationReceived(let id, let peer, let context):
            "\(id) received from \(peer) with \(context.count) bytes of context"
        case .invitationResult(let id, let peer, let outcome): "\(id) to \(peer): \(outcome)"
        case .invitationCancelled(let id, let peer, let reason): "\(id) from \(peer) cancelled: \(reason)"
        case .invitationRefused(let peer, let reason, let detail): "invitation from \(peer) refused (\(reason)): \(detail)"
        case .joinRefused(let peer, let code, let reason):
            "join with \(peer) refused" + (code.map { ", code \($0)" } ?? "") + ": \(reason)"
        case .messageReceived(let peer, let data, let reliable):
            "\(reliable ? "message" : "datagram") of \(data.count) bytes from \(peer)"
        case .linkChanged(let peer, let link): "\(peer) now on \(link)"
        }
    }
}

/// What a ``SessionStateMachine`` asks of its owner, in order.
public enum SessionAction: Hashable, Sendable, CustomStringConvertible {
    /// Open a link to this peer. `endpoints` are the ones the state machine knows (from
    /// ``SessionStateMachine/invite(_:endpoints:context:timeout:at:)`` or
    /// ``SessionStateMachine/peerFound(_:endpoints:at:)``); when it is empty (a member learned from
    /// a `MEMBERS` message) the owner resolves the peer's endpoints through discovery. Every
    /// dial must be answered with ``SessionStateMachine/linkEstablished(_:peer:dialedLocally:at:)``
    /// (`dialedLocally: true`) or ``SessionStateMachine/dialFailed(_:reason:at:)``.
    case dial(PeerID, endpoints: [Endpoint])
    /// Frames are waiting for this link: call ``SessionStateMachine/nextFrame(for:)`` whenever
    /// the link can take a frame, until it returns nil. Announced again only after a nil.
    case framesReady(LinkID)
    /// Close this link: write out the frames already taken, then a `GO_AWAY` with this code
    /// and reason, then shut it down. The state machine has already forgotten the link.
    case closeLink(LinkID, code: GoAwayCode, reason: String)
    /// Tell the app.
    case event(SessionEvent)

    public var description: String {
        switch self {
        case .dial(let peer, let endpoints):
            "dial \(peer)"
                + (endpoints.isEmpty ? " (endpoints from discovery)" : " at " + endpoints.map(\.description).joined(separator: ", "))
        case .framesReady(let link): "frames ready on \(link)"
        case .closeLink(let link, let code, let reason): "close \(link), code \(code): \(reason)"
        case .event(let event): "event: \(event)"
        }
    }
}

extension SessionID {
    /// The session every automatic peer of `serviceType` is in: the first 16 bytes of
    /// SHA-256("PeerLink automatic session v1" || 0x00 || service type). Every automatic peer
    /// computes the same id, so their invitations and joins never disagree about the session.
    public static func automatic(for serviceType: ServiceType) -> SessionID {
        let input = Array("PeerLink automatic session v1".utf8) + [0] + Array(serviceType.value.utf8)
        return SessionID(unchecked: Array(Array(SHA256.hash(data: input)).prefix(length)))
    }
}
