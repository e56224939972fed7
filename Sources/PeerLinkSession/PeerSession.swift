import Logging
import PeerLinkCore

/// What a ``PeerSession`` is: who the local peer is, which service it serves, and its rules.
public struct PeerSessionConfiguration: Sendable {
    public var identity: Identity
    public var displayName: DisplayName
    public var serviceType: ServiceType
    /// The encryption preference every link offers (`.required` by default, as in
    /// MultipeerConnectivity): `.required` × `.none` refuses the link on both sides.
    public var encryption: EncryptionPreference
    /// The session's rules: the number of peers, timeouts, and automatic mode.
    public var policy: SessionPolicy
    /// Each link's handshake timeout and keep-alive, and the resource limits (``limits``).
    public var linkPolicy: LinkPolicy
    /// What peers may make this session hold: links in their handshake and in all, reasons'
    /// length, … (see ``PeerLinkCore/ResourceLimits`` and the *Reliability* article). Stored in
    /// ``linkPolicy``, so links and the session keep to the same value.
    public var limits: ResourceLimits {
        get { linkPolicy.limits }
        set { linkPolicy.limits = newValue }
    }
    /// How long one dial of one endpoint may take.
    public var dialTimeout: Duration
    /// Trust: whether a peer may take part, asked once per link right after its handshake
    /// authenticated the peer (its key is proven) and before the session sees the link. A peer it
    /// refuses gets `GO_AWAY` 7 (*identity mismatch*) with the reason "not a known peer", the
    /// link goes, and the app hears ``PeerSessionEvent/linkFailed(_:reason:)`` ("refused NAME
    /// (id …): not a known peer"); the refused side hears it as a `linkFailed`, too. nil admits
    /// every peer (the default). Called with no lock held, on the link's task: keep it quick, and
    /// do not wait on the session from it. Automatic mode still invites found peers (and tries
    /// again after the invitation timeout), so each attempt is refused and reported again.
    public var admit: (@Sendable (PeerID) -> Bool)?

    public init(
        identity: Identity, displayName: DisplayName, serviceType: ServiceType,
        encryption: EncryptionPreference = .required, policy: SessionPolicy = SessionPolicy(),
        linkPolicy: LinkPolicy = LinkPolicy(), dialTimeout: Duration = .seconds(5),
        admit: (@Sendable (PeerID) -> Bool)? = nil
    ) {
        self.identity = identity
        self.displayName = displayName
        self.serviceType = serviceType
        self.encryption = encryption
        self.policy = policy
        self.linkPolicy = linkPolicy
        self.dialTimeout = dialTimeout
        self.admit = admit
    }

    /// The local peer as others see it.
    public var localPeer: PeerID { PeerID(identity: identity, displayName: displayName) }

    /// Checks every value is in range; ``PeerSession/init(configuration:transport:listener:clock:logger:)``
    /// requires a valid configuration.
    ///
    /// - Throws: a ``PeerLinkError`` (`invalidParameter`) naming the value that is out of range.
    public func validate() throws(PeerLinkError) {
        try policy.validate()
        guard dialTimeout > .zero else {
            throw PeerLinkError(.invalidParameter, "the dial timeout must be longer than zero")
        }
        let durations: [(String, Duration)] = [
            ("handshake timeout", linkPolicy.handshakeTimeout), ("keep-alive interval", linkPolicy.keepAliveInterval),
            ("keep-alive timeout", linkPolicy.keepAliveTimeout),
        ]
        for (name, value) in durations where value <= .zero {
            throw PeerLinkError(.invalidParameter, "the link's \(name) must be longer than zero")
        }
        try limits.validate()
    }
}

/// How the local peer is linked to a connected peer, for `/peers`-style displays.
public struct ConnectedPeerInfo: Sendable, Hashable {
    public var peer: PeerID
    /// The transport's name: `tcp`, `memory` (later `rfcomm`, `l2cap`).
    public var transport: String
    /// The remote end, e.g. `tcp://127.0.0.1:40123`.
    public var remote: String
    public var encrypted: Bool
    /// Six digits both users can read out to check nobody sits between them
    /// (``PeerLinkCore/VerificationCode/digits(handshakeHash:)``), the same on both sides.
    public var verificationCode: String
    /// Unreliable messages to this peer dropped on the way out (their lane was full, or too large).
    public var droppedDatagrams: Int
    /// Streams open on the link to this peer, both directions.
    public var openStreams: Int

    public init(
        peer: PeerID, transport: String, remote: String, encrypted: Bool, verificationCode: String, droppedDatagrams: Int = 0,
        openStreams: Int = 0
    ) {
        self.peer = peer
        self.transport = transport
        self.remote = remote
        self.encrypted = encrypted
        self.verificationCode = verificationCode
        self.droppedDatagrams = droppedDatagrams
        self.openStreams = openStreams
    }
}

/// What a ``PeerSession`` tells the app.
public enum PeerSessionEvent: Sendable, Hashable, CustomStringConvertible {
    /// A peer's state changed; `reason` says why a peer became ``PeerLinkCore/PeerState/notConnected``.
    case peerStateChanged(PeerID, PeerState, reason: String?)
    /// A peer invites the local peer: answer with ``PeerSession/respond(to:accept:)``.
    case invitationReceived(InvitationID, from: PeerID, context: [UInt8])
    /// An invitation the app sent with ``PeerSession/invite(_:context:timeout:)`` ended.
    case invitationResult(InvitationID, PeerID, InvitationOutcome)
    /// A message from a connected peer.
    case message(from: PeerID, data: [UInt8], reliable: Bool)
    /// A connected peer's link changed — a failover (its link failed and another transport
    /// reached it), an upgrade (a faster transport), a reconnect — and the peer stayed
    /// connected: nothing sent was lost. `transport` is the new link's (`tcp`, `rfcomm`,
    /// `l2cap`), `remote` its far end.
    case peerTransportChanged(PeerID, transport: String, remote: String)
    /// Something the app should show: a dial that failed, a handshake refusal (such as
    /// encryption *required* × *none*, reported on both sides), a peer refused by
    /// ``PeerSessionConfiguration/admit`` (reported on both sides), a join a member refused, the
    /// listener failing, or an invitation shown with ``invitationReceived(_:from:context:)`` that
    /// can no longer be answered (timed out, the inviter left, the tie-break settled it; see
    /// ``PeerSession/invitationsAwaitingAnswer()``). `peer` is nil when the other side is not
    /// known (a refused incoming link).
    case linkFailed(PeerID?, reason: String)

    public var description: String {
        switch self {
        case .peerStateChanged(let peer, let state, let reason):
            "\(peer) is \(state)" + (reason.map { ": \($0)" } ?? "")
        case .invitationReceived(let id, let peer, let context):
            "\(id) received from \(peer) with \(context.count) bytes of context"
        case .invitationResult(let id, let peer, let outcome): "\(id) to \(peer): \(outcome)"
        case .message(let peer, let data, let reliable):
            "\(reliable ? "message" : "datagram") of \(data.count) bytes from \(peer)"
        case .peerTransportChanged(let peer, let transport, let remote): "\(peer) now on \(transport) (\(remote))"
        case .linkFailed(let peer, let reason): "link " + (peer.map { "to \($0) " } ?? "") + "failed: \(reason)"
        }
    }
}

/// A MultipeerConnectivity-style session, running: invitations, a full mesh of up to 8 peers,
/// automatic mode, and messages, over any ``PeerLinkCore/Transport``.
///
/// It owns one ``PeerLinkCore/SessionStateMachine`` and the links it asks for. ``run()`` does
/// all the work in one task group — accepting incoming links from the listener, dialling,
/// running every link (its handshake, reader, writer and keep-alive), and the session's timers
/// on the injected clock — until ``disconnect()`` or cancellation. Discovery is fed in from
/// outside with ``discovered(_:)``.
///
/// ```swift
/// let session = PeerSession(configuration: config, transport: TCPTransport(), listener: listener)
/// try await withThrowingTaskGroup { group in
///     group.addTask { await session.run() }
///     group.addTask { for await event in try await browser.events() { session.discovered(event) } }
///     for await event in session.events { … }          // ends once run() returned
/// }
/// ```
///
/// Behaviour worth knowing:
/// - A session runs once: after ``disconnect()`` (or once ``run()`` returned) it is over;
///   `invite` and `respond` throw `unavailable`. Make a new one to join again.
/// - Calls made before ``run()`` starts are kept: dials start once it runs.
/// - ``events`` is one stream for one consumer; it finishes when ``run()`` returns. A peer
///   whose messages wait there beyond ``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer``
///   is held back (back pressure; its unreliable messages are dropped) until the app reads on.
/// - Each link has a writer of its own that pulls frames from the state machine only when the
///   link can take them, so a slow link never holds up the others.
/// - Incoming links that end before the handshake without a word (a browser checking that the
///   port is alive) are not reported; refusals (encryption, service, version) are, as
///   ``PeerSessionEvent/linkFailed(_:reason:)``.
/// - With ``PeerSessionConfiguration/admit`` set, a peer it refuses never reaches the session:
///   its link is closed right after the handshake with `GO_AWAY` 7, and both sides report it.
/// - Logs (info and below) carry `peer.id`, `transport` and `link.id`.
public final class PeerSession: Sendable {
    public let configuration: PeerSessionConfiguration
    /// The transports that dial, in order: an endpoint goes to the first that handles its kind.
    public let transports: [any Transport]
    /// Where peers reach this one: every listener is accepted on.
    public let listeners: [any TransportListener]
    /// The first transport (sessions made with one).
    public var transport: any Transport { transports[0] }
    /// The first listener, if any (sessions made with one).
    public var listener: (any TransportListener)? { listeners.first }
    /// The local peer: the identity's fingerprint and the display name.
    public let localPeer: PeerID
    /// This run of the session, as its hellos tell peers: a peer resumes links with the same
    /// incarnation (its channel goes on), and starts afresh with another.
    public let incarnation: Incarnation
    /// What happens in the session, for one consumer; it finishes when ``run()`` returns.
    /// Read it: a peer whose messages wait here beyond
    /// ``PeerLinkCore/ResourceLimits/maximumQueuedMessageBytesPerPeer`` is held back.
    public var events: PeerSessionEvents {
        PeerSessionEvents(queue: eventSink, taken: { [weak self] in self?.eventsTaken($0) }, weight: PeerSession.weight(of:))
    }
    /// Streams peers opened to the local peer, accepted already, for one consumer; it finishes
    /// when ``run()`` returns. Read them (or reset them): an unread stream holds its sender.
    public let incomingStreams: AsyncStream<PeerStream>

    /// How long ``run()`` waits for links to finish their `GO_AWAY` after a disconnect before
    /// it cuts them.
    static let shutdownGrace: Duration = .seconds(3)

    let logger: Logger
    let clock: any Clock<Duration>
    let time: LinkClock
    let preface: LinkPreface
    let hello: Hello
    let eventSink = EventQueue<PeerSessionEvent>()
    let streamSink: AsyncStream<PeerStream>.Continuation
    let spawns: AsyncStream<@Sendable () async -> Void>
    let spawner: AsyncStream<@Sendable () async -> Void>.Continuation
    let core: Locked<SessionCore>
    /// Fired when the session starts stopping: dials and accepts give up.
    let stopped = Latch()
    /// Fired when every link task of a stopping session is over.
    let linksDrained = Latch()
    /// Fired when ``run()`` has returned (or will never run).
    let finished = Latch()

    /// - Parameters:
    ///   - configuration: who, what service, which rules; must be valid
    ///     (``PeerSessionConfiguration/validate()``), or this traps.
    ///   - transport: dials the endpoints discovery reports (a composite transport may serve several).
    ///   - listener: where peers reach this one; nil for a session that only dials. The caller
    ///     owns it and closes it after ``run()`` returned.
    ///   - clock: the time source for every timeout (a `ManualClock` in tests).
    ///   - logger: where the session and its links log, at info and below.
    public convenience init(
        configuration: PeerSessionConfiguration, transport: any Transport, listener: (any TransportListener)?,
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "peerlink.session")
    ) {
        self.init(
            configuration: configuration, transports: [transport], listeners: listener.map { [$0] } ?? [], clock: clock,
            logger: logger)
    }

    /// A session on several transports at once (TCP, RFCOMM, L2CAP): each endpoint is dialled
    /// with the first of `transports` that handles its kind, and links are accepted on every one
    /// of `listeners`.
    ///
    /// - Parameters:
    ///   - transports: at least one; an endpoint no transport handles fails to dial with the
    ///     reason.
    ///   - listeners: where peers reach this one (none for a session that only dials). The
    ///     caller owns them and closes them after ``run()`` returned.
    public init(
        configuration: PeerSessionConfiguration, transports: [any Transport], listeners: [any TransportListener],
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "peerlink.session")
    ) {
        precondition(!transports.isEmpty, "PeerSession: give at least one transport")
        let localPeer = configuration.localPeer
        var machine: SessionStateMachine
        do {
            try configuration.validate()
            machine = try SessionStateMachine(
                localPeer: localPeer, serviceType: configuration.serviceType, policy: configuration.policy)
            machine.partialMessageLimits = (
                configuration.limits.maximumPartialMessageBytesPerLink, configuration.limits.maximumPartialMessageBytesPerSession)
        } catch {
            preconditionFailure("PeerSession: \(error.message) (check the configuration with validate() first)")
        }
        self.configuration = configuration
        self.transports = transports
        self.listeners = listeners
        self.localPeer = localPeer
        self.clock = clock
        self.time = LinkClock(clock)
        self.logger = logger
        do {
            preface = try LinkPreface(encryption: configuration.encryption, service: configuration.serviceType)
        } catch {
            preconditionFailure("PeerSession: the supported protocol versions make no preface: \(error)")
        }
        incarnation = .random()
        hello = Hello(displayName: configuration.displayName, incarnation: incarnation, maxFramePayload: WireFormat.largeFramePayload)
        (incomingStreams, streamSink) = AsyncStream.makeStream(of: PeerStream.self, bufferingPolicy: .unbounded)
        (spawns, spawner) = AsyncStream.makeStream(of: (@Sendable () async -> Void).self, bufferingPolicy: .unbounded)
        core = Locked(SessionCore(machine: machine))
    }

    // MARK: - Discovery

    /// Feeds a discovery report in: `found` makes the peer known with its endpoints (automatic
    /// mode invites it), `updated` refreshes its endpoints, `lost` tells the session discovery
    /// lost it (its links stay until they end). Reports about the local peer are ignored.
    /// Callable from any thread, before or while ``run()`` runs.
    public func discovered(_ event: DiscoveryEvent) {
        let now = time.now()
        let effects = core.withLockThenDeliver { core -> [Effect] in
            guard core.phase.acceptsInput else { return [] }
            switch event {
            case .found(let peer), .updated(let peer):
                guard peer.id.fingerprint != localPeer.fingerprint else { return [] }
                if !peer.endpoints.isEmpty { core.discovered[peer.id.fingerprint] = peer.endpoints }
                if case .updated = event, core.found.contains(peer.id.fingerprint) {
                    return carryOut(core.machine.peerUpdated(peer.id, endpoints: peer.endpoints, at: now), in: &core)
                }
                core.found.insert(peer.id.fingerprint)
                return carryOut(core.machine.peerFound(peer.id, endpoints: peer.endpoints, at: now), in: &core)
            case .lost(let peer):
                guard core.found.remove(peer.fingerprint) != nil else { return [] }
                return carryOut(core.machine.peerLost(peer, at: now), in: &core)
            }
        }
        perform(effects)
    }

    // MARK: - The app

    /// Invites `peer` into the session, dialling it first if needed (at the endpoints
    /// discovery reported). The answer comes as ``PeerSessionEvent/invitationResult(_:_:_:)``.
    ///
    /// - Parameters:
    ///   - context: shown to the invitee's app, at most 8192 bytes.
    ///   - timeout: how long the invitee has to answer.
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `invalidParameter` (itself, already connected or
    ///   invited, context too long), `unavailable` (the session is full, or over).
    public func invite(_ peer: PeerID, context: [UInt8] = [], timeout: Duration = .seconds(30)) async throws -> InvitationID {
        try apply { core, now throws(PeerLinkError) -> ([SessionAction], InvitationID) in
            try core.requireNotOver()
            let endpoints = core.discovered[peer.fingerprint] ?? []
            let (id, actions) = try core.machine.invite(peer, endpoints: endpoints, context: context, timeout: timeout, at: now)
            return (actions, id)
        }
    }

    /// Answers an invitation shown with ``PeerSessionEvent/invitationReceived(_:from:context:)``.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `timedOut` (too late), `invalidParameter` (no such
    ///   invitation waiting), `unavailable` (accepting into a full session, or the session is over).
    public func respond(to invitation: InvitationID, accept: Bool) async throws {
        try apply { core, now throws(PeerLinkError) -> ([SessionAction], Void) in
            try core.requireNotOver()
            return (try core.machine.respond(to: invitation, accept: accept, at: now), ())
        }
    }

    /// Sends `data` to every peer in `peers`: reliably (ordered, up to 16 MiB) or not (one
    /// datagram of at most 16384 bytes, may be dropped). Returns once the message is queued;
    /// each link's writer takes it when the link has room. Unreliable messages never wait: one
    /// that finds its peer's small lane full is dropped and counted
    /// (``ConnectedPeerInfo/droppedDatagrams``).
    ///
    /// A message arrives whole, as one array of its size: for bulk data of a MiB or more a
    /// ``PeerStream`` (or a file) is read in 16 KiB pieces instead, and an app that does send
    /// such messages in a stream of them may want glibc to keep freed memory (the Performance
    /// article, *Large messages and glibc's heap*).
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `notConnected` when any target is not connected
    ///   (then nothing is sent to anyone), `invalidParameter` (no peers, itself, too large).
    public func send(_ data: [UInt8], to peers: [PeerID], reliable: Bool = true) async throws {
        try apply(linksMayChange: false) { core, _ throws(PeerLinkError) -> ([SessionAction], Void) in
            (try core.machine.send(data, to: peers, reliable: reliable), ())
        }
    }

    /// The connected peers, by fingerprint.
    public func connectedPeers() async -> [PeerID] {
        core.withLock { $0.machine.connectedPeers }
    }

    /// The state of `peer` in the session.
    public func state(of peer: PeerID) async -> PeerState {
        core.withLock { $0.machine.state(of: peer) }
    }

    /// The invitations shown with ``PeerSessionEvent/invitationReceived(_:from:context:)`` that
    /// can still be answered, oldest first.
    public func invitationsAwaitingAnswer() async -> [InvitationID] {
        core.withLock { $0.machine.invitationsAwaitingAnswer }
    }

    /// How a connected peer is linked; nil when it is not connected.
    public func info(for peer: PeerID) async -> ConnectedPeerInfo? {
        core.withLock { core -> ConnectedPeerInfo? in
            guard core.machine.state(of: peer) == .connected else { return nil }
            let preferred = core.machine.sendLink(to: peer).map { [$0] } ?? []
            for id in preferred + core.machine.links(to: peer) {
                guard let entry = core.links[id], let established = entry.established else { continue }
                return ConnectedPeerInfo(
                    peer: established.remote, transport: entry.link.channel.transport,
                    remote: entry.link.channel.remoteDescription, encrypted: established.encrypted,
                    verificationCode: entry.link.handshakeHash.map { VerificationCode.digits(handshakeHash: $0) } ?? "",
                    droppedDatagrams: core.machine.droppedDatagrams(to: peer),
                    openStreams: core.channels[peer.fingerprint]?.streamCounts.open ?? 0)
            }
            return nil
        }
    }

    /// Opens a byte stream named `name` to a connected peer, over its link, and waits for the
    /// peer to accept it (its session accepts every stream from a peer it is connected to, and
    /// hands it to the app on ``incomingStreams``).
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `notConnected` when the peer is not connected
    ///   (or its link closes first), `invalidParameter` for a name that is empty or over 255
    ///   bytes or for the local peer, `unavailable` when 256 streams are open to the peer already,
    ///   the peer refused the stream, or the session is over.
    public func openStream(named name: String, to peer: PeerID) async throws -> PeerStream {
        let channel = try core.withLock { core throws(PeerLinkError) -> PeerChannel in
            try core.requireNotOver()
            guard peer.fingerprint != localPeer.fingerprint else {
                throw PeerLinkError(.invalidParameter, "a peer cannot open a stream to itself")
            }
            guard core.machine.state(of: peer) == .connected, let channel = core.channels[peer.fingerprint] else {
                throw PeerLinkError(.notConnected, "\(peer) is not connected: open the stream once it is")
            }
            return channel
        }
        let stream = try channel.beginStream(named: name)
        try await channel.waitUntilAccepted(stream)
        return stream
    }

    /// The stream accounting of the channel to `peer`, for tests and diagnostics; nil when the
    /// peer has no channel.
    package func streamStatistics(for peer: PeerID) -> StreamStatistics? {
        guard let channel = core.withLock({ $0.channels[peer.fingerprint] }) else { return nil }
        let counts = channel.streamCounts
        let (queued, peak) = channel.dataQueueCounts
        return StreamStatistics(
            openStreams: counts.open, unreadBytes: counts.unreadBytes, queuedDataBytes: queued, peakQueuedDataBytes: peak,
            maxQueuedDataBytes: channel.maxQueuedDataBytes)
    }

    /// Streams the channel to `peer` keeps bookkeeping for: open ones, and ended ones the app
    /// still holds (for tests and diagnostics); nil when the peer has no channel.
    package func trackedStreamCount(for peer: PeerID) -> Int? {
        core.withLock { $0.channels[peer.fingerprint] }?.streamCounts.tracked
    }

    /// The channel to `peer` (its continuity and streams), for tests and diagnostics.
    package func channel(for peer: PeerID) -> PeerChannel? {
        core.withLock { $0.channels[peer.fingerprint] }
    }

    /// Every link the session runs that is (or was dialled to become) `peer`'s, in handshake or
    /// established, attached to its channel or not (a duplicate being closed): for tests and
    /// diagnostics.
    package func links(to peer: PeerID) -> [Link] {
        core.withLock { core in
            core.links.values.filter { ($0.established?.remote ?? $0.dialed)?.fingerprint == peer.fingerprint }.map(\.link)
        }
    }

    /// Waits until every peer of the session — connected, or reconnecting within its grace
    /// after losing its link — has acknowledged every reliable message and stream byte sent to
    /// it so far; at most `limit`. Returns whether they all did.
    ///
    /// For a program that sends and then leaves: ``disconnect()`` hands what is queued to the
    /// links there are, so what is still on its way to a peer whose link is being replaced would
    /// be lost. (Unreliable messages are not waited for.)
    public func waitUntilDelivered(within limit: Duration) async -> Bool {
        let deadline = time.now() + limit
        while hasUndeliveredData {
            guard time.now() < deadline else { return false }
            do {
                try await clock.sleep(for: .milliseconds(20))
            } catch {
                return !hasUndeliveredData
            }
        }
        return true
    }

    /// Whether a peer of the session has not acknowledged something sent to it (see
    /// ``waitUntilDelivered(within:)``).
    package var hasUndeliveredData: Bool {
        let channels = core.withLock { core -> [PeerChannel]? in
            let members = core.machine.connectedPeers
            if members.contains(where: { core.machine.hasQueuedMessages(to: $0) }) { return nil }
            return members.compactMap { core.channels[$0.fingerprint] }
        }
        guard let channels else { return true }
        return channels.contains { $0.hasUndeliveredFrames }
    }

    /// Leaves the session: messages already accepted by ``send(_:to:reliable:)`` are queued on
    /// their links, then `GO_AWAY` code 0 on every link, every peer *not connected*. Returns
    /// once ``run()`` has closed every link and returned (at most a few seconds; at once when
    /// the session is not running).
    public func disconnect() async {
        if beginStopping(reason: "\(localPeer.displayName) left the session") {
            await finished.wait()
        }
    }
}
