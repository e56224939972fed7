import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession

/// A peer, running: its transports (each a ``PeerLinkCore/TransportModule``: the LAN, Bluetooth,
/// or the app's own), their listeners, advertisements and browsers, a ``PeerLinkSession/PeerSession``
/// over all of them, and trust on first use.
///
/// ```swift
/// let node = try await PeerNode.open(configuration: PeerNodeConfiguration(
///     identity: identity, displayName: try DisplayName("Ann"), serviceType: try ServiceType("chat"),
///     transports: .auto, policy: SessionPolicy(automatic: true)))
/// try await withThrowingTaskGroup { group in
///     group.addTask { await node.run() }
///     for await event in node.events { … }          // .session(…), .met(…), .transport(…), .discovery(…)
/// }
/// ```
///
/// What it does:
/// - Making it opens every chosen module's links (its listeners and dialer) and, when
///   advertising, publishes the local peer on every module at the endpoints of that module's
///   listeners. A module that cannot run here — no Bluetooth in the kernel, avahi-daemon or
///   bluetoothd not running — is a ``TransportNotice`` (``PeerNodeEvent/transport(_:)``, also in
///   ``notices``) and the node goes on with the others. It throws when no module can open its
///   links, or when it must be discoverable (``PeerNodeConfiguration/discoveryRequired``) and no
///   module can advertise.
/// - ``run()`` runs the session and every module's browser; what the browsers find is merged by
///   identity (one peer, every endpoint, best first by ``PeerNodeConfiguration/ranking``) and fed
///   to the session, so a peer is dialled on its best transport first.
/// - Every session event is forwarded as ``PeerNodeEvent/session(_:)``. When a peer connects it is
///   judged against the known peers (new, known, or a known name with another key) and
///   remembered: ``PeerNodeEvent/met(_:_:verificationCode:)``. With
///   ``PeerNodeConfiguration/admitOnlyKnownPeers`` any peer not known is refused after its handshake.
/// - ``invitePeers(named:context:timeout:)`` invites every peer found with a display name;
///   ``connect(to:context:timeout:)`` reaches a peer at an endpoint whoever it is.
/// - ``events`` is one stream for one consumer, buffered without limit; it finishes after
///   ``run()`` returned.
///
/// Where the waiting happens: opening and advertising ask daemons (bluetoothd over D-Bus,
/// avahi-daemon), whose answers may take seconds — a D-Bus call waits up to 25 s for a daemon
/// that hangs. ``open(configuration:clock:logger:)`` makes the node on a thread of its own and
/// is the way to make one from async code; ``init(configuration:clock:logger:)`` blocks its
/// caller meanwhile. ``run()`` withdraws the advertisements and closes the listeners on a thread
/// of its own when it ends; ``publish(info:)`` and ``close()`` block their caller.
public final class PeerNode: Sendable {
    public let configuration: PeerNodeConfiguration
    /// The session over every transport that runs. Its `events` are consumed by the node (read
    /// ``events`` instead); read its `incomingStreams` for streams peers open.
    public let session: PeerSession
    /// What happens: the session's events and the node's own, for one consumer. Read it: the
    /// session's messages count as waiting for the app until they are taken here (see
    /// ``PeerLinkSession/PeerSessionEvents``).
    public var events: PeerNodeEvents {
        let sessionEvents = session.events
        return PeerNodeEvents(
            queue: sink,
            taken: { events in
                let inner = events.compactMap { event -> PeerSessionEvent? in
                    if case .session(let inner) = event { inner } else { nil }
                }
                if !inner.isEmpty { sessionEvents.markTaken(inner[...]) }
            },
            weight: { event in
                if case .session(let inner) = event { sessionEvents.weight(of: inner) } else { 0 }
            })
    }
    /// The modules chosen, in order (those that could not run included).
    public let modules: [any TransportModule]
    /// The names of the modules whose links are open.
    public let runningModules: [String]
    /// What happened while the node was made: links opened, advertisements, modules that
    /// cannot run (the same notices start ``events``).
    public let notices: [TransportNotice]
    /// The merged discovery over every running module.
    public let discovery: PeerDiscovery

    private let sink = EventQueue<PeerNodeEvent>()
    private let trust: NodeTrust
    private let logger: Logger
    private let state = Locked(State())
    /// Modules that could not open their links, with why: for errors about their endpoints.
    private let failedModules: [(module: any TransportModule, error: PeerLinkError)]

    private struct State {
        var publications: [NodePublication] = []
        var namesToInvite: [String: (context: [UInt8], timeout: Duration)] = [:]
        var invitedByName: Set<Fingerprint> = []
        var closed = false
    }

    /// Opens the chosen transports and starts advertising (see the type's notes), on the
    /// caller's thread.
    ///
    /// It blocks while the daemons answer: bluetoothd (an adapter held discoverable for each
    /// Bluetooth listener, the SDP record registered) and avahi-daemon — milliseconds usually,
    /// up to 25 s per call to a daemon that hangs. From async code, use
    /// ``open(configuration:clock:logger:)``, which runs this on a thread of its own, so that no
    /// thread of Swift's cooperative pool waits for a daemon.
    ///
    /// - Parameters:
    ///   - clock: the time source of the session's timeouts (a `ManualClock` in tests).
    ///   - logger: where the node, its modules made here and its session log.
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `invalidParameter` for a configuration out of
    ///   range or a corrupt known-peers file; `unavailable` (or `unsupported`) when no transport
    ///   can run, or none can advertise while that is required — the message says, per
    ///   transport, why and what to do.
    public init(
        configuration: PeerNodeConfiguration, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger = Logger(label: "peerlink")
    ) throws(PeerLinkError) {
        try configuration.session.validate()
        let modules = configuration.transports.modules(logger: logger)
        guard !modules.isEmpty else {
            throw PeerLinkError(.invalidParameter, "the node has no transport to run: choose at least one")
        }
        for module in modules { module.registerEndpointSchemes() }
        let trust = try NodeTrust(
            path: configuration.knownPeersPath, limit: configuration.session.limits.maximumKnownPeers, logger: logger)

        var notices: [TransportNotice] = []
        var opened: [(module: any TransportModule, links: TransportLinks)] = []
        var failed: [(module: any TransportModule, error: PeerLinkError)] = []
        for module in modules {
            do throws(PeerLinkError) {
                let links = try module.openLinks(limits: configuration.session.limits)
                opened.append((module, links))
                notices.append(
                    TransportNotice(
                        module: module.name, label: module.label,
                        what: .listening(place: links.place, endpoints: links.listeners.flatMap(\.localEndpoints))))
            } catch {
                failed.append((module, error))
                notices.append(TransportNotice(module: module.name, label: module.label, what: .unavailable(.links, error)))
                logger.info("transport cannot run", metadata: ["transport": "\(module.name)", "reason": "\(error.message)"])
            }
        }
        guard !opened.isEmpty else { throw Self.combined(failed, doing: "run") }

        var sessionConfiguration = configuration.session
        let slowest = opened.compactMap(\.module.dialTimeout).max() ?? .zero
        sessionConfiguration.dialTimeout = max(sessionConfiguration.dialTimeout, slowest)
        if configuration.admitOnlyKnownPeers || sessionConfiguration.admit != nil {
            let onlyKnown = configuration.admitOnlyKnownPeers
            let also = sessionConfiguration.admit
            sessionConfiguration.admit = { peer in
                (!onlyKnown || trust.isKnown(peer)) && (also?(peer) ?? true)
            }
        }
        let session = PeerSession(
            configuration: sessionConfiguration, transports: opened.map(\.links.dialer),
            listeners: opened.flatMap(\.links.listeners), clock: clock, logger: logger)
        let localPeer = session.localPeer

        self.configuration = configuration
        self.session = session
        self.modules = modules
        self.runningModules = opened.map(\.module.name)
        self.trust = trust
        self.logger = logger
        self.failedModules = failed
        discovery = PeerDiscovery(
            modules: opened.map(\.module),
            request: BrowseRequest(serviceType: configuration.session.serviceType, excluding: [localPeer.fingerprint]),
            ranking: configuration.ranking, logger: logger)

        if configuration.advertising {
            let publication = Self.startPublication(
                configuration.session, info: configuration.info, on: Self.endpoints(of: opened.map(\.module), in: session), sink: sink,
                logger: logger, notices: &notices)
            if publication.advertisers.isEmpty && configuration.discoveryRequired {
                publication.stop()
                for listener in session.listeners { listener.close() }
                throw Self.combined(failed + publication.failures, doing: "advertise")
            }
            state.withLock { $0.publications.append(publication) }
        }
        self.notices = notices
        for notice in notices { sink.yield(.transport(notice)) }
    }

    /// Opens the chosen transports and starts advertising, as
    /// ``init(configuration:clock:logger:)`` does, on a thread of its own: the calling task waits
    /// suspended while bluetoothd and avahi-daemon answer, and no thread of Swift's cooperative
    /// pool is held meanwhile. Making the node is not cancelled with the task (each daemon call
    /// has its own timeout).
    ///
    /// - Throws: what ``init(configuration:clock:logger:)`` throws.
    public static func open(
        configuration: PeerNodeConfiguration, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger = Logger(label: "peerlink")
    ) async throws(PeerLinkError) -> PeerNode {
        try await runBlocking("peerlink-node-open") { () throws(PeerLinkError) -> PeerNode in
            try PeerNode(configuration: configuration, clock: clock, logger: logger)
        }
    }

    /// The local peer: the identity's fingerprint and the display name.
    public var localPeer: PeerID { session.localPeer }

    /// One error for several modules' failures: the module's own when there is one, else each
    /// module's message after its label.
    private static func combined(_ failures: [(module: any TransportModule, error: PeerLinkError)], doing what: String) -> PeerLinkError {
        if failures.count == 1 { return failures[0].error }
        let code = failures.allSatisfy { $0.error.code == .unsupported || $0.error.code == .unavailable }
            ? PeerLinkError.Code.unavailable : failures.last?.error.code ?? .unavailable
        let reasons = failures.map { "\($0.module.label): \($0.error.message)" }.joined(separator: "; ")
        return PeerLinkError(code, "no transport can \(what) here — \(reasons)")
    }

    // MARK: - Running

    /// Runs the session and the browsers until ``disconnect()`` (or the task is cancelled); then
    /// withdraws every advertisement and closes the listeners (``close()``, on a thread of its
    /// own: withdrawing a Bluetooth record waits for bluetoothd) and finishes ``events``.
    public func run() async {
        await withTaskGroup(of: Void.self) { outer in
            // Every session event goes out, until the session's stream ends after run() returned.
            outer.addTask { await self.forwardSessionEvents() }
            await withTaskGroup(of: Bool.self) { group in
                group.addTask {
                    await self.session.run()
                    return true
                }
                if configuration.browsing {
                    group.addTask {
                        await self.discovery.run { event in await self.discovered(event) }
                        return false
                    }
                }
                while let sessionEnded = await group.next() {
                    if sessionEnded { group.cancelAll() }
                }
            }
            await runBlocking("peerlink-node-close") { self.close() }
        }
        sink.finish()
    }

    /// Withdraws every advertisement and closes the listeners. ``run()`` does it when it ends;
    /// call it for a node that never ran. Idempotent.
    ///
    /// It blocks while bluetoothd takes the SDP record back and the adapters' discoverable
    /// mode is restored (milliseconds usually, up to 25 s if bluetoothd hangs); from async code,
    /// call it through ``PeerLinkPosix/runBlocking(_:_:)``.
    public func close() {
        let publications = state.withLock { state -> [NodePublication] in
            state.closed = true
            defer { state.publications = [] }
            return state.publications
        }
        for publication in publications { publication.stop() }
        for listener in session.listeners { listener.close() }
    }

    /// Leaves the session (every peer is told) and returns once ``run()`` is over.
    public func disconnect() async {
        await session.disconnect()
    }

    private func forwardSessionEvents() async {
        var present: Set<PeerID> = []
        // uncounted: the session's events count as taken when the app takes them from ours
        for await event in session.events.uncounted {
            sink.yield(.session(event))
            guard case .peerStateChanged(let peer, let peerState, _) = event else { continue }
            if peerState == .connected {
                guard present.insert(peer).inserted else { continue }
                let verdict = trust.meet(peer)
                let code = await session.info(for: peer)?.verificationCode
                sink.yield(.met(peer, verdict, verificationCode: code))
            } else {
                present.remove(peer)
            }
        }
    }

    private func discovered(_ event: PeerDiscoveryEvent) async {
        switch event {
        case .peer(let change):
            session.discovered(change)
            sink.yield(.discovery(change))
            if case .found(let peer) = change { await inviteIfNamed(peer.id) }
            if case .updated(let peer) = change { await inviteIfNamed(peer.id) }
        case .browsing(let module, let label):
            sink.yield(.transport(TransportNotice(module: module, label: label, what: .browsing)))
        case .unavailable(let module, let label, let error):
            sink.yield(.transport(TransportNotice(module: module, label: label, what: .unavailable(.browsing, error))))
        }
    }

    // MARK: - Advertising

    /// Publishes the local peer with `info` on every running transport, until the returned
    /// publication is stopped (or the node ends). For a node made with `advertising: false`;
    /// what happens to each advertisement comes as ``PeerNodeEvent/transport(_:)``.
    ///
    /// It blocks while bluetoothd and avahi-daemon answer (see the type's notes); from async
    /// code, call it through ``PeerLinkPosix/runBlocking(_:_:)``, as ``MultipeerSession`` does.
    ///
    /// - Throws: the error of each transport when none can advertise (avahi-daemon and
    ///   bluetoothd not running); `unavailable` when the node is closed.
    @discardableResult
    public func publish(info: DiscoveryInfo) throws(PeerLinkError) -> NodePublication {
        guard !state.withLock({ $0.closed }) else {
            throw PeerLinkError(.unavailable, "the node has stopped: make a new one to advertise again")
        }
        var notices: [TransportNotice] = []
        let running = discovery.modules.compactMap { name in modules.first { $0.name == name } }
        let publication = Self.startPublication(
            configuration.session, info: info, on: Self.endpoints(of: running, in: session), sink: sink, logger: logger,
            notices: &notices)
        for notice in notices { sink.yield(.transport(notice)) }
        guard !publication.advertisers.isEmpty else { throw Self.combined(publication.failures, doing: "advertise") }
        let kept = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.publications.append(publication)
            return true
        }
        if !kept {
            publication.stop()
            throw PeerLinkError(.unavailable, "the node has stopped: make a new one to advertise again")
        }
        return publication
    }

    /// Starts each module's advertiser at its endpoints; what happens is added to `notices`.
    private static func startPublication(
        _ configuration: PeerSessionConfiguration, info: DiscoveryInfo, on running: [(module: any TransportModule, endpoints: [Endpoint])],
        sink: EventQueue<PeerNodeEvent>, logger: Logger, notices: inout [TransportNotice]
    ) -> NodePublication {
        let advertisement = Advertisement(
            identity: configuration.identity, displayName: configuration.displayName, serviceType: configuration.serviceType, info: info)
        var advertisers: [(module: any TransportModule, advertiser: any TransportAdvertiser)] = []
        var failures: [(module: any TransportModule, error: PeerLinkError)] = []
        for (module, endpoints) in running {
            do throws(PeerLinkError) {
                let advertiser = try module.advertise(advertisement, at: endpoints)
                advertisers.append((module, advertiser))
                notices.append(TransportNotice(module: module.name, label: module.label, what: .advertising(summary: advertiser.summary)))
            } catch {
                failures.append((module, error))
                notices.append(TransportNotice(module: module.name, label: module.label, what: .unavailable(.advertising, error)))
                logger.info("advertising failed", metadata: ["transport": "\(module.name)", "reason": "\(error.message)"])
            }
        }
        let watchers = advertisers.map { entry in
            let (name, label, events) = (entry.module.name, entry.module.label, entry.advertiser.events)
            return Task {
                for await event in events {
                    sink.yield(.transport(TransportNotice(module: name, label: label, what: .advertisement(event))))
                }
            }
        }
        return NodePublication(advertisers: advertisers.map(\.advertiser), watchers: watchers, failures: failures)
    }

    /// Each module with the endpoints of the session's listeners of its kinds.
    private static func endpoints(of modules: [any TransportModule], in session: PeerSession) -> [(module: any TransportModule, endpoints: [Endpoint])] {
        modules.map { module in
            (module, session.listeners.flatMap(\.localEndpoints).filter { module.kinds.contains($0.kind) })
        }
    }

    // MARK: - Inviting and connecting

    /// Invites every peer found with display name `name` — the ones found already and the ones
    /// found later — once per identity. Each invitation is reported as
    /// ``PeerNodeEvent/invitedByName(_:_:)``; its answer comes as a session event.
    public func invitePeers(named name: String, context: [UInt8] = [], timeout: Duration = .seconds(30)) async {
        state.withLock { $0.namesToInvite[name] = (context, timeout) }
        for peer in discovery.peers where peer.id.displayName == name {
            await inviteIfNamed(peer.id)
        }
    }

    private func inviteIfNamed(_ peer: PeerID) async {
        let wanted = state.withLock { state -> (context: [UInt8], timeout: Duration)? in
            guard let wanted = state.namesToInvite[peer.displayName], state.invitedByName.insert(peer.fingerprint).inserted else {
                return nil
            }
            return wanted
        }
        guard let wanted else { return }
        do {
            let id = try await session.invite(peer, context: wanted.context, timeout: wanted.timeout)
            sink.yield(.invitedByName(peer, .success(id)))
        } catch {
            sink.yield(.invitedByName(peer, .failure(error as? PeerLinkError ?? PeerLinkError(.unknown, "\(error)"))))
        }
    }

    /// Reaches the peer at `endpoint`, whoever it is, once the node runs (waiting up to 10 s for
    /// ``run()`` to start): dials it, learns its identity from the handshake and invites it (see
    /// ``PeerLinkSession/PeerSession/connect(to:context:timeout:)``). The endpoint is added to
    /// the peer's endpoints.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `unsupported` when no running transport reaches
    ///   that kind of endpoint (the message says which transport would and why it does not run),
    ///   the dial's or the handshake's failure, `notConnected` when the node does not run.
    public func connect(to endpoint: Endpoint, context: [UInt8] = [], timeout: Duration = .seconds(30)) async throws -> PeerID {
        let running = discovery.modules.compactMap { name in modules.first { $0.name == name } }
        guard running.contains(where: { $0.kinds.contains(endpoint.kind) }) else {
            let names = running.map(\.name).joined(separator: ", ")
            if let failure = failedModules.first(where: { $0.module.kinds.contains(endpoint.kind) }) {
                throw PeerLinkError(
                    .unsupported,
                    "cannot reach \(endpoint): its transport (\(failure.module.label)) does not run here: \(failure.error.message)")
            }
            throw PeerLinkError(
                .unsupported,
                "cannot reach \(endpoint): no transport of this node makes \(endpoint.kind) links (it runs \(names)); choose one that does")
        }
        for _ in 0..<1000 where !session.isRunning {
            if state.withLock({ $0.closed }) { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        guard session.isRunning else {
            throw PeerLinkError(.notConnected, "cannot reach \(endpoint): the node is not running (call run() first)")
        }
        let peer = try await session.connect(to: endpoint, context: context, timeout: timeout)
        let found = DiscoveredPeer(id: peer, protocolVersion: Int(WireFormat.version), endpoints: [endpoint], info: try! DiscoveryInfo())
        for change in discovery.apply(.found(found), from: "connect") {
            session.discovered(change)
            sink.yield(.discovery(change))
        }
        return peer
    }

    // MARK: - Peers

    /// How the node reaches `peer`: the link in use (if connected) and every endpoint and
    /// transport it is known on.
    public func status(of peer: PeerID) async -> NodePeerStatus {
        let link = await session.info(for: peer)
        let endpoints = discovery.peer(peer.fingerprint)?.endpoints ?? []
        var kinds = endpoints.map(\.kind)
        if let inUse = link.flatMap({ TransportKind($0.transport) }) { kinds.append(inUse) }
        return NodePeerStatus(peer: peer, link: link, endpoints: endpoints, transports: configuration.ranking.ranked(kinds))
    }

    /// ``status(of:)`` for every connected peer, by display name.
    public func connectedPeerStatuses() async -> [NodePeerStatus] {
        var statuses: [NodePeerStatus] = []
        for peer in await session.connectedPeers().sorted(by: { ($0.displayName, $0.fingerprint) < ($1.displayName, $1.fingerprint) }) {
            statuses.append(await status(of: peer))
        }
        return statuses
    }

    /// The peers found now on any transport, merged, by fingerprint.
    public var discoveredPeers: [DiscoveredPeer] { discovery.peers }

    /// The known peers now (the file's, and every peer met since).
    public var knownPeers: KnownPeers { trust.snapshot }
}

/// The advertisements a node made for one ``PeerNode/publish(info:)`` (or when it was made).
public final class NodePublication: Sendable {
    let advertisers: [any TransportAdvertiser]
    let failures: [(module: any TransportModule, error: PeerLinkError)]
    private let watchers: [Task<Void, Never>]

    init(
        advertisers: [any TransportAdvertiser], watchers: [Task<Void, Never>], failures: [(module: any TransportModule, error: PeerLinkError)]
    ) {
        self.advertisers = advertisers
        self.watchers = watchers
        self.failures = failures
    }

    /// What each transport publishes, for people.
    public var summaries: [String] { advertisers.map(\.summary) }

    /// Withdraws every advertisement. Idempotent. It blocks while bluetoothd takes a Bluetooth
    /// record back (see ``PeerNode``'s notes).
    public func stop() {
        for watcher in watchers { watcher.cancel() }
        for advertiser in advertisers { advertiser.stop() }
    }
}

/// The known peers of a node: loaded from the file, every peer met remembered (and saved).
final class NodeTrust: Sendable {
    private let peers: Locked<KnownPeers>
    private let path: String?
    private let limit: Int
    private let logger: Logger

    init(path: String?, limit: Int, logger: Logger) throws(PeerLinkError) {
        peers = Locked(try path.map { path throws(PeerLinkError) in try KnownPeersStore.load(at: path) } ?? KnownPeers())
        self.path = path
        self.limit = limit
        self.logger = logger
    }

    var snapshot: KnownPeers { peers.withLock { $0 } }

    func isKnown(_ peer: PeerID) -> Bool {
        peers.withLock { $0.isKnown(peer.fingerprint) }
    }

    /// Judges and remembers `peer` (keeping to the limit of known peers), saving the file when
    /// that changed it.
    func meet(_ peer: PeerID) -> KnownPeers.Verdict {
        let (meeting, snapshot) = peers.withLock { peers in
            (peers.record(peer, at: Date().timeIntervalSince1970, limit: limit), peers)
        }
        let verdict = meeting.verdict
        if let path, meeting.changed {
            do throws(PeerLinkError) {
                try KnownPeersStore.save(snapshot, at: path)
            } catch {
                logger.warning("cannot remember the peer: \(error.message)", metadata: ["peer.id": "\(peer.fingerprint)"])
            }
        }
        return verdict
    }
}

/// What a ``PeerNode`` tells the app, in order, for one consumer: iterate it with
/// `for await event in node.events`. It finishes when the node's session is over. A session
/// event counts as taken (``PeerLinkSession/PeerSessionEvents``) when the app takes it here.
public typealias PeerNodeEvents = EventSequence<PeerNodeEvent>
