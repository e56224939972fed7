import Foundation
import Logging
import PeerLinkCore
import PeerLinkSession

/// A session in the shape MultipeerConnectivity developers know: the local peer and up to seven
/// others, a delegate told of every peer's state and every message, `send(_:toPeers:with:)` and
/// `disconnect()`.
///
/// ```swift
/// let me = try MultipeerPeerID(displayName: "Ann", identityPath: IdentityStore.defaultPath())
/// let session = MultipeerSession(peer: me, securityIdentity: nil, encryptionPreference: .required)
/// session.delegate = self
/// let advertiser = NearbyServiceAdvertiser(peer: me, discoveryInfo: ["room": "kitchen"], serviceType: "chat")
/// advertiser.delegate = self          // accepts with invitationHandler(true, session)
/// advertiser.startAdvertisingPeer()
/// ```
///
/// It is a thin layer over the async API: the session runs one ``PeerNode`` on the transports it
/// was made with — the LAN by default, as MultipeerConnectivity's sessions use the network;
/// `transports: .bluetooth` or `.auto` for Bluetooth Classic, which works the same way (its
/// listeners, its browser feeding the session's discovery, and a ``PeerLinkSession/PeerSession``).
/// Because PeerLink binds every link to a service type, that node starts when the first
/// ``NearbyServiceAdvertiser`` or ``NearbyServiceBrowser`` of the session's service type uses
/// the session (an advertiser publishes the session's listeners; a browser invites into it), and
/// a session serves one service type.
///
/// - Delegate calls arrive on ``delegateQueue``, a serial queue (a private one unless the app
///   gave one): never on the caller's thread, one at a time, in order.
/// - ``send(_:toPeers:with:)`` checks what it can at once (the peers are connected, the sizes)
///   and throws; the message then goes out in order behind earlier ones.
/// - ``disconnect()`` reports every peer *not connected* to the delegate at once; the session can
///   be invited again afterwards (a new listener is published if an advertiser is attached).
/// - ``sendResource(at:withName:toPeer:withCompletionHandler:)`` sends a file with a
///   `Progress`; ``startStream(withName:toPeer:)`` opens a byte stream (a blocking
///   `OutputStream`). Files and streams from peers reach the delegate.
/// - Releasing the session closes its links at once.
public final class MultipeerSession: Sendable {
    /// How ``send(_:toPeers:with:)`` delivers.
    public enum SendDataMode: Hashable, Sendable {
        /// Ordered, retransmitted, up to 16 MiB per message.
        case reliable
        /// Sent at once as one datagram of at most 16384 bytes; may be dropped.
        case unreliable
    }

    /// The most peers a session holds, the local one included.
    public static let maximumNumberOfPeers = SessionPolicy.largestSession
    /// The fewest peers a session holds, the local one included.
    public static let minimumNumberOfPeers = 2

    /// The local peer.
    public let myPeerID: MultipeerPeerID
    /// The identity given at creation (nil: the one of ``myPeerID``).
    public let securityIdentity: Identity?
    /// What every link of the session offers: `.required` refuses peers that refuse encryption.
    public let encryptionPreference: EncryptionPreference
    /// The transports the session's links run on, and its advertisers and browsers use:
    /// `.lan` (the default), `.bluetooth`, `.auto` (both), or modules of the app's own.
    public let transports: TransportChoice
    /// Where delegate calls are made, one at a time.
    public let delegateQueue: DispatchQueue

    let identity: Identity
    let displayName: DisplayName
    let logger: Logger
    /// Where files from peers are received (made with the first one, removed with the session).
    let resourceDirectory: String
    private let state = Locked(State())

    /// - Parameters:
    ///   - peer: the local peer; a remote peer (without its key pair) traps.
    ///   - securityIdentity: nil (the usual) to prove who the local peer is with the identity of
    ///     `peer`. PeerLink has no certificates: a peer *is* its key, so an identity given here must
    ///     be the one of `peer` (anything else traps).
    ///   - encryptionPreference: `.required` by default, as for an MPC session made from a peer
    ///     alone; `.optional` encrypts unless the other side refuses; `.none` refuses encryption.
    ///   - transports: where the session's peers are found and linked: `.lan` (the default, TCP
    ///     found through DNS-SD), `.bluetooth` (RFCOMM and L2CAP found through SDP), `.auto`
    ///     (both, each peer on its best transport). Advertisers and browsers of the same peer use
    ///     the same transports.
    ///   - delegateQueue: the serial queue for delegate calls (nil: a private serial queue).
    ///   - logger: where the session and its links log, at info and below.
    public init(
        peer: MultipeerPeerID, securityIdentity: Identity? = nil, encryptionPreference: EncryptionPreference = .required,
        transports: TransportChoice = .lan, delegateQueue: DispatchQueue? = nil, logger: Logger = Logger(label: "peerlink.multipeer")
    ) {
        guard let identity = securityIdentity ?? peer.identity else {
            preconditionFailure(
                "MultipeerSession: \(peer) is a remote peer; make the session with the local peer "
                    + "(MultipeerPeerID(displayName:) or MultipeerPeerID(displayName:identityPath:))")
        }
        precondition(
            identity.fingerprint == peer.fingerprint,
            "MultipeerSession: the security identity \(identity.fingerprint) is not the identity of \(peer): a peer is its key")
        guard let displayName = try? DisplayName(peer.displayName) else {
            preconditionFailure("MultipeerSession: \(peer.displayName.debugDescription) is not a valid display name")
        }
        myPeerID = peer
        self.securityIdentity = securityIdentity
        self.encryptionPreference = encryptionPreference
        self.transports = transports
        self.delegateQueue = delegateQueue ?? DispatchQueue(label: "peerlink.multipeer.session")
        self.identity = identity
        self.displayName = displayName
        var logger = logger
        logger[metadataKey: "peer.local"] = "\(peer.fingerprint)"
        self.logger = logger
        resourceDirectory = Self.makeResourceDirectoryPath()
        MultipeerRegistry.register(self)
    }

    deinit {
        let (generation, publication, resources) = state.withLock { ($0.generation, $0.publication, $0.resources.values) }
        publication?.stop()
        for job in resources { job.cancel(reason: "the session was released") }
        removeResourceDirectory()
        if let generation {
            generation.commands.finish()
            generation.task.cancel()
        }
        // The registry forgets released sessions by itself (it holds them weakly).
    }

    /// Told of peers' states and messages, on ``delegateQueue``. Held weakly.
    public var delegate: (any MultipeerSessionDelegate)? {
        get { state.withLock { $0.delegate } }
        set { state.withLock { $0.delegate = newValue } }
    }

    /// The peers connected now, in the order they connected: the ones the delegate was told are
    /// *connected* and not since told are *not connected*.
    public var connectedPeers: [MultipeerPeerID] {
        state.withLock { state in
            state.peers.values.filter { $0.state == .connected }.sorted { $0.since < $1.since }.map(\.peer)
        }
    }

    /// The service type the session serves: set by the first advertiser or browser that used it.
    public var serviceType: String? { state.withLock { $0.serviceType?.value } }

    /// Sends `data` to every peer in `peerIDs`.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `notConnected` when any of them is not
    ///   connected (nothing is sent to anyone), `invalidParameter` for no peers, the local peer, or
    ///   data too large for the mode (16 MiB reliable, 16384 bytes unreliable).
    public func send(_ data: Data, toPeers peerIDs: [MultipeerPeerID], with mode: SendDataMode) throws(PeerLinkError) {
        guard !peerIDs.isEmpty else { throw PeerLinkError(.invalidParameter, "a message needs at least one peer to go to") }
        let reliable = mode == .reliable
        if reliable, data.count > WireFormat.maxMessageLength {
            throw PeerLinkError(
                .invalidParameter,
                "a reliable message is at most \(WireFormat.maxMessageLength) bytes (16 MiB); this one is \(data.count)")
        }
        if !reliable, data.count > WireFormat.maxFramePayload {
            throw PeerLinkError(
                .invalidParameter, "an unreliable message is at most \(WireFormat.maxFramePayload) bytes; this one is \(data.count)")
        }
        if peerIDs.contains(myPeerID) { throw PeerLinkError(.invalidParameter, "a peer cannot send a message to itself") }
        let bytes = [UInt8](data)
        try state.withLock { state throws(PeerLinkError) in
            for peer in peerIDs where state.peers[peer.fingerprint]?.state != .connected {
                throw PeerLinkError(.notConnected, "\(peer) is not connected; nothing was sent")
            }
            guard let generation = state.generation else {
                throw PeerLinkError(.notConnected, "the session is not connected to anyone; nothing was sent")
            }
            generation.commands.yield(.send(bytes, to: peerIDs.map(\.peerID), reliable: reliable))
        }
    }

    /// Leaves the session: every link is closed (`GO_AWAY` 0, after what was already sent), and
    /// the delegate is told every peer is *not connected*. The session stays usable: an advertiser
    /// attached to it keeps advertising (a new listener), and it can be invited again.
    public func disconnect() {
        let resources = state.withLock { state in
            defer { state.resources = [:] }
            return state.resources.values
        }
        for job in resources { job.cancel(reason: "\(myPeerID.displayName) left the session", code: .notConnected) }
        let failure = state.withLock { state -> (Advertising, PeerLinkError)? in
            guard let generation = state.generation else { return nil }
            state.generation = nil
            state.publication?.stop()
            state.publication = nil
            for tracked in state.peers.values.sorted(by: { $0.since < $1.since }) where tracked.state != .notConnected {
                let peer = tracked.peer
                deliver { $0.session(self, peer: peer, didChange: .notConnected) }
            }
            state.peers = [:]
            generation.commands.yield(.disconnect)
            generation.commands.finish()
            logger.info("left the session")
            guard let advertising = state.advertising, let serviceType = state.serviceType else { return nil }
            do throws(PeerLinkError) {
                let next = try makeGeneration(serviceType, in: &state)
                state.generation = next
                try publish(advertising.info, in: next, state: &state)
                return nil
            } catch {
                state.advertising = nil
                return (advertising, error)
            }
        }
        // Advertisers are only ever held strongly outside the lock: releasing the last reference
        // to one runs its deinit, which takes this lock.
        if case let (advertising, error)? = failure { advertising.advertiser?.report(error) }
    }

    /// How a connected peer is linked (transport, address, encryption, and the six-digit
    /// verification code both users can compare); nil when it is not connected.
    public func info(for peerID: MultipeerPeerID) async -> ConnectedPeerInfo? {
        guard let session = state.withLock({ $0.generation?.peer.session }) else { return nil }
        return await session.info(for: peerID.peerID)
    }

    // MARK: - For resources and streams

    /// The running PeerSession, when `peerID` is connected in it.
    ///
    /// - Throws: `invalidParameter` for the local peer, `notConnected` when the peer is not connected.
    func peerSession(connectedTo peerID: MultipeerPeerID, for what: String) throws(PeerLinkError) -> PeerSession {
        if peerID == myPeerID { throw PeerLinkError(.invalidParameter, "a peer cannot \(what) to itself") }
        return try state.withLock { state throws(PeerLinkError) in
            guard state.peers[peerID.fingerprint]?.state == .connected, let generation = state.generation else {
                throw PeerLinkError(.notConnected, "\(peerID) is not connected: \(what) once the delegate is told it is connected")
            }
            return generation.peer.session
        }
    }

    /// Keeps `job` until ``forget(_:)``, so that leaving the session (or the peer leaving)
    /// cancels it; false (and the job cancelled) when the session was left, or when
    /// `requiringConnected` and the peer is not connected any more. (A file arriving needs no
    /// check: its stream may be handed over before the event saying the peer is connected.)
    func track(_ job: ResourceJob, requiringConnected: Bool = true) -> Bool {
        let tracked = state.withLock { state -> Bool in
            guard state.generation != nil else { return false }
            guard !requiringConnected || state.peers[job.peer]?.state == .connected else { return false }
            state.resources[ObjectIdentifier(job)] = job
            return true
        }
        if !tracked { job.cancel(reason: "the peer is not connected any more", code: .notConnected) }
        return tracked
    }

    func forget(_ job: ResourceJob) {
        _ = state.withLock { $0.resources.removeValue(forKey: ObjectIdentifier(job)) }
    }

    // MARK: - For the advertiser and the browser

    /// Starts publishing the session's listener for `advertiser`.
    func startAdvertising(
        for advertiser: NearbyServiceAdvertiser, serviceType: ServiceType, info: DiscoveryInfo
    ) throws(PeerLinkError) {
        try state.withLock { state throws(PeerLinkError) in
            let id = ObjectIdentifier(advertiser)
            if let current = state.advertising, current.id != id {
                throw PeerLinkError(
                    .invalidParameter,
                    "\(myPeerID)'s session is already advertised by another NearbyServiceAdvertiser; stop that one first")
            }
            let generation = try generation(for: serviceType, state: &state)
            state.publication?.stop()
            state.publication = nil
            try publish(info, in: generation, state: &state)
            state.advertising = Advertising(id: id, advertiser: advertiser, info: info)
        }
    }

    /// Withdraws the advertisement made for the advertiser `id`; its invitations are declined from now on.
    func stopAdvertising(for id: ObjectIdentifier) {
        state.withLock { state in
            guard state.advertising?.id == id else { return }
            state.advertising = nil
            state.publication?.stop()
            state.publication = nil
        }
    }

    /// Invites `peer` on behalf of a browser of `serviceType`; every failure is reported to the
    /// delegate as the peer being *not connected*.
    func invite(_ peer: MultipeerPeerID, found: DiscoveredPeer?, serviceType: ServiceType, context: [UInt8], timeout: Duration) {
        let generation: Generation
        do {
            generation = try state.withLock { state throws(PeerLinkError) in try self.generation(for: serviceType, state: &state) }
        } catch {
            invitationNotSent(peer.peerID, reason: error.message)
            return
        }
        if let found { generation.peer.session.discovered(DiscoveryEvent.found(found)) }
        let number = generation.number
        askAboutPeer(peer) { accepted in
            self.state.withLock { state in
                guard let current = state.generation, current.number == number else { return }
                if accepted {
                    current.commands.yield(.invite(peer.peerID, context: context, timeout: timeout))
                } else {
                    self.invitationNotSent(peer.peerID, reason: "the delegate refused its key", state: &state)
                }
            }
        }
    }

    /// Answers an invitation of generation `number` (ignored when that generation is over).
    /// Accepting makes the inviter *connecting* until the session says more, as in
    /// MultipeerConnectivity.
    func answer(_ invitation: InvitationID, from peer: MultipeerPeerID, accept: Bool, generation number: Int) {
        state.withLock { state in
            guard let generation = state.generation, generation.number == number else {
                logger.info("\(invitation) can no longer be answered: the session was left since")
                return
            }
            if accept, (state.peers[peer.fingerprint]?.state ?? .notConnected) == .notConnected {
                state.clock += 1
                state.peers[peer.fingerprint] = Tracked(peer: peer, state: .connecting, since: state.clock, answering: true)
                deliver { $0.session(self, peer: peer, didChange: .connecting) }
            }
            generation.commands.yield(.respond(invitation, from: peer.peerID, accept: accept))
        }
    }

    // MARK: - Running

    /// Hands `body` the delegate on ``delegateQueue`` (nothing when there is none by then).
    func deliver(_ body: @escaping @Sendable (any MultipeerSessionDelegate) -> Void) {
        delegateQueue.async {
            if let delegate = self.delegate { body(delegate) }
        }
    }

    /// Asks the delegate about `peer`'s key, then calls `decided` once.
    private func askAboutPeer(_ peer: MultipeerPeerID, decided: @escaping @Sendable (Bool) -> Void) {
        delegateQueue.async {
            let once = OnceFlag()
            let handler: @Sendable (Bool) -> Void = { accepted in
                if once.claim() { decided(accepted) }
            }
            if let delegate = self.delegate {
                delegate.session(self, didReceiveCertificate: peer.fingerprint, fromPeer: peer, certificateHandler: handler)
            } else {
                handler(true)
            }
        }
    }

    /// The running generation, started for `serviceType` if there is none.
    private func generation(for serviceType: ServiceType, state: inout State) throws(PeerLinkError) -> Generation {
        if let served = state.serviceType, served != serviceType {
            throw PeerLinkError(
                .invalidParameter,
                "this session serves the service type \(served), not \(serviceType): a session serves one service type; make another session")
        }
        if let generation = state.generation { return generation }
        let generation = try makeGeneration(serviceType, in: &state)
        state.serviceType = serviceType
        state.generation = generation
        return generation
    }

    /// Starts a ``PeerNode`` (not advertised) and the task that runs it, carries out the
    /// session's commands in order, and hands its events to the session.
    private func makeGeneration(_ serviceType: ServiceType, in state: inout State) throws(PeerLinkError) -> Generation {
        let configuration = PeerNodeConfiguration(
            session: PeerSessionConfiguration(
                identity: identity, displayName: displayName, serviceType: serviceType, encryption: encryptionPreference),
            transports: transports, advertising: false, discoveryRequired: false)
        let peer = try PeerNode(configuration: configuration, logger: logger)
        let number = state.nextGeneration
        state.nextGeneration += 1
        let (commandStream, commands) = AsyncStream.makeStream(of: Command.self)
        let owner = WeakSession(self)
        let logger = logger
        let task = Task {
            await withDiscardingTaskGroup { group in
                group.addTask { await peer.run() }
                group.addTask {
                    for await command in commandStream {
                        if let failure = await Self.perform(command, on: peer.session, logger: logger) {
                            owner.session?.commandFailed(failure, generation: number)
                        }
                    }
                }
                group.addTask {
                    for await stream in peer.session.incomingStreams {
                        if let session = owner.session {
                            session.accept(stream)
                        } else {
                            stream.reset(reason: "the session was released")
                        }
                    }
                }
                for await event in peer.events {
                    switch event {
                    case .session(let event): owner.session?.handle(event, generation: number)
                    case .transport(let notice): owner.session?.transportNotice(notice, generation: number)
                    case .met, .discovery, .invitedByName: break
                    }
                }
                commands.finish()
            }
        }
        logger.debug(
            "session peer started",
            metadata: [
                "generation": "\(number)", "transports": "\(peer.runningModules)",
                "link.listen": "\(peer.session.listeners.flatMap(\.localEndpoints).map(\.description))",
            ])
        return Generation(number: number, peer: peer, commands: commands, task: task)
    }

    /// Publishes generation's listeners with `info` (what happens to the advertisements comes
    /// as the node's transport notices).
    private func publish(_ info: DiscoveryInfo, in generation: Generation, state: inout State) throws(PeerLinkError) {
        state.publication = try generation.peer.publish(info: info)
    }

    /// Carries out one command; returns the invitation or answer that could not be sent.
    private static func perform(_ command: Command, on session: PeerSession, logger: Logger) async -> Failure? {
        do {
            switch command {
            case .invite(let peer, let context, let timeout):
                _ = try await session.invite(peer, context: context, timeout: timeout)
            case .respond(let invitation, _, let accept):
                try await session.respond(to: invitation, accept: accept)
            case .send(let data, let peers, let reliable):
                try await session.send(data, to: peers, reliable: reliable)
            case .disconnect:
                await session.disconnect()
            }
        } catch {
            let error = error as? PeerLinkError ?? PeerLinkError(.unknown, "\(error)")
            switch command {
            case .invite(let peer, _, _): return .invitation(peer, error)
            case .respond(_, let peer, true): return .acceptance(peer, error)
            default: logger.info("\(command) failed: \(error.message)")
            }
        }
        return nil
    }

    /// An event of generation `number`, told to the delegate (or the advertiser).
    private func handle(_ event: PeerSessionEvent, generation number: Int) {
        state.withLock { state in
            guard let generation = state.generation, generation.number == number else { return }
            switch event {
            case .peerStateChanged(let peer, let peerState, let reason):
                let id = MultipeerPeerID(peer)
                if peerState == .notConnected {
                    state.peers[peer.fingerprint] = nil
                    for (key, job) in state.resources where job.peer == peer.fingerprint {
                        state.resources[key] = nil
                        job.cancel(reason: "\(peer.displayName) left the session", code: .notConnected)
                    }
                } else {
                    state.clock += 1
                    state.peers[peer.fingerprint] = Tracked(peer: id, state: peerState, since: state.clock, answering: false)
                }
                if let reason { logger.debug("\(peer) is \(peerState): \(reason)") }
                deliver { $0.session(self, peer: id, didChange: peerState) }
            case .peerTransportChanged(let peer, let transport, let remote):
                // MPC has no such callback: the peer stays connected, nothing sent was lost.
                logger.info("\(peer) now on \(transport) (\(remote))")
            case .message(let from, let data, _):
                let id = MultipeerPeerID(from)
                let data = Data(data)
                deliver { $0.session(self, didReceive: data, fromPeer: id) }
            case .invitationReceived(let invitation, let from, let context):
                guard let advertising = state.advertising else {
                    logger.info("declining \(invitation) from \(from): nobody advertises this session")
                    generation.commands.yield(.respond(invitation, from: from, accept: false))
                    return
                }
                let id = MultipeerPeerID(from)
                let context = context.isEmpty ? nil : Data(context)
                askAboutPeer(id) { accepted in
                    if accepted, let advertiser = advertising.advertiser {
                        advertiser.offer(invitation, from: id, context: context, session: self, generation: number)
                    } else if accepted {
                        self.logger.info("declining \(invitation) from \(from): its advertiser was released")
                        self.answer(invitation, from: id, accept: false, generation: number)
                    } else {
                        self.logger.info("declining \(invitation) from \(from): the delegate refused its key")
                        self.answer(invitation, from: id, accept: false, generation: number)
                    }
                }
            case .invitationResult(let invitation, let peer, let outcome):
                logger.debug("\(invitation) to \(peer): \(outcome)")
            case .linkFailed:
                logger.info("\(event)")
            }
        }
    }

    /// An invitation or an acceptance the PeerSession of generation `number` refused.
    private func commandFailed(_ failure: Failure, generation number: Int) {
        state.withLock { state in
            guard state.generation?.number == number else { return }
            switch failure {
            case .invitation(let peer, let error):
                invitationNotSent(peer, reason: error.message, state: &state)
            case .acceptance(let peer, let error):
                // Too late, the session is full, or the invitation was settled otherwise (then
                // the session reports the peer's state itself).
                logger.info("accepting the invitation from \(peer) failed: \(error.message)")
                guard let tracked = state.peers[peer.fingerprint], tracked.answering else { return }
                state.peers[peer.fingerprint] = nil
                let id = tracked.peer
                deliver { $0.session(self, peer: id, didChange: .notConnected) }
            }
        }
    }

    /// An invitation that could not be sent: the peer is reported *not connected*, unless it is
    /// connected or on its way in already (inviting it again changes nothing).
    func invitationNotSent(_ peer: PeerID, reason: String) {
        state.withLock { state in invitationNotSent(peer, reason: reason, state: &state) }
    }

    private func invitationNotSent(_ peer: PeerID, reason: String, state: inout State) {
        if let tracked = state.peers[peer.fingerprint], tracked.state != .notConnected {
            logger.debug("invitation to \(peer) not sent: \(reason)")
            return
        }
        logger.info("cannot invite \(peer): \(reason)")
        let id = MultipeerPeerID(peer)
        deliver { $0.session(self, peer: id, didChange: .notConnected) }
    }

    /// A notice of generation `number`'s node: advertisements that failed for good detach the
    /// advertiser; the rest is logged.
    private func transportNotice(_ notice: TransportNotice, generation number: Int) {
        guard case .advertisement(let event) = notice.what else {
            logger.debug("\(notice)", metadata: ["transport": "\(notice.module)"])
            return
        }
        switch event {
        case .published(let name): logger.debug("advertised as \(name)", metadata: ["transport": "\(notice.module)"])
        case .renamed(let from, let to): logger.info("advertised name \(from) taken on the network; now \(to)", metadata: ["transport": "\(notice.module)"])
        case .daemonUnavailable(let daemon): logger.warning("\(daemon) went away; advertising again once it is back")
        case .failed(let error):
            // Publishing failed for good: the advertiser is told and detached.
            let advertising = state.withLock { state -> Advertising? in
                guard state.generation?.number == number, let advertising = state.advertising else { return nil }
                state.advertising = nil
                state.publication?.stop()
                state.publication = nil
                return advertising
            }
            advertising?.advertiser?.report(error)
        }
    }

    // MARK: - State

    private struct State {
        weak var delegate: (any MultipeerSessionDelegate)?
        var serviceType: ServiceType?
        var generation: Generation?
        var nextGeneration = 1
        var publication: NodePublication?
        var advertising: Advertising?
        var peers: [Fingerprint: Tracked] = [:]
        var clock = 0
        /// Files on their way to or from peers, until they end.
        var resources: [ObjectIdentifier: ResourceJob] = [:]
    }

    private struct Tracked {
        var peer: MultipeerPeerID
        var state: PeerState
        /// When it entered this state, for ordering.
        var since: Int
        /// *Connecting* because the app accepted its invitation, until the session says more.
        var answering: Bool
    }

    private enum Failure: Sendable {
        /// The invitation to this peer was not sent.
        case invitation(PeerID, PeerLinkError)
        /// Accepting this peer's invitation failed.
        case acceptance(PeerID, PeerLinkError)
    }

    /// The advertiser publishing the session, held weakly (and only ever loaded outside the lock).
    private struct Advertising: Sendable {
        var id: ObjectIdentifier
        weak var advertiser: NearbyServiceAdvertiser?
        var info: DiscoveryInfo
    }

    /// One run of the session: a PeerNode from the first use (or the last disconnect) to the next
    /// disconnect.
    private struct Generation: Sendable {
        var number: Int
        var peer: PeerNode
        var commands: AsyncStream<Command>.Continuation
        var task: Task<Void, Never>
    }

    private enum Command: Sendable, CustomStringConvertible {
        case invite(PeerID, context: [UInt8], timeout: Duration)
        case respond(InvitationID, from: PeerID, accept: Bool)
        case send([UInt8], to: [PeerID], reliable: Bool)
        case disconnect

        var description: String {
            switch self {
            case .invite(let peer, _, _): "inviting \(peer)"
            case .respond(let invitation, let peer, let accept): "\(accept ? "accepting" : "declining") \(invitation) from \(peer)"
            case .send(let data, let peers, let reliable):
                "sending \(data.count) bytes \(reliable ? "reliably" : "unreliably") to \(peers.map(\.description).joined(separator: ", "))"
            case .disconnect: "leaving the session"
            }
        }
    }
}

/// A session held weakly, for the tasks a session owns (so releasing the session ends them).
final class WeakSession: Sendable {
    weak let session: MultipeerSession?

    init(_ session: MultipeerSession) {
        self.session = session
    }
}

/// The live sessions of each local peer, so an advertiser made from a peer ID finds the session
/// its invitations land in (MultipeerConnectivity's advertiser takes no session).
enum MultipeerRegistry {
    private struct Entry {
        weak var session: MultipeerSession?
    }

    private static let sessions = Locked<[Fingerprint: [Entry]]>([:])

    static func register(_ session: MultipeerSession) {
        let entry = Entry(session: session)
        sessions.withLock { sessions in
            for key in Array(sessions.keys) {
                sessions[key]?.removeAll { $0.session == nil }
                if sessions[key]?.isEmpty == true { sessions[key] = nil }
            }
            sessions[session.myPeerID.fingerprint, default: []].append(entry)
        }
    }

    /// The most recently made live session of `peer`.
    static func session(for peer: MultipeerPeerID) -> MultipeerSession? {
        sessions.withLock { sessions in sessions[peer.fingerprint]?.reversed().lazy.compactMap(\.session).first }
    }
}
