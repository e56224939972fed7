import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix
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
/// - No call waits for a daemon: the node is opened, and its listeners published and
///   withdrawn, on threads of their own (``PeerNode/open(configuration:clock:logger:)``), in the
///   order the calls came; what fails there reaches the delegates as it did when it failed at
///   once (an advertiser's `didNotStartAdvertisingPeer`, an invited peer *not connected*).
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
    /// Publishes and withdraws the session's advertisement, in order, off the caller's thread.
    private let publisher = Publisher()

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
        let (generation, resources) = state.withLock { ($0.generation, $0.resources.values) }
        publisher.withdraw()
        publisher.finish()
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
    ///
    /// It returns at once; the links are closed by the session's own tasks a moment later. A
    /// process that exits next calls ``disconnect(waitingUpTo:)`` instead: a process gone before
    /// its `GO_AWAY` went out looks to its peers like a lost link, and they keep it for their
    /// reconnect grace (30 s by default) before they see it leave.
    public func disconnect() {
        leave()
    }

    /// Leaves the session as ``disconnect()`` does, and returns once every link has sent its
    /// `GO_AWAY` and closed, or after `timeout` (whichever comes first; at once when the session
    /// was not connected). What a process calls before it exits, so its peers see it leave at
    /// once.
    ///
    /// - Returns: false when `timeout` passed first (or the calling task was cancelled).
    @discardableResult
    public func disconnect(waitingUpTo timeout: Duration) async -> Bool {
        guard let closing = leave() else { return true }
        // Not a task group: a group waits for all its tasks, and waiting for a task's value does
        // not end when cancelled, so a generation still opening would hold the caller past the
        // timeout. The first of the two answers; the generation's waiter ends with it.
        let (answers, answer) = AsyncStream.makeStream(of: Bool.self)
        Task {
            await closing.value
            answer.yield(true)
        }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            answer.yield(false)
        }
        defer {
            timer.cancel()
            answer.finish()
        }
        for await closed in answers { return closed }
        return false  // the calling task was cancelled
    }

    /// What ``disconnect()`` does; returns the task of the generation it ended, which is over
    /// once that generation's links are closed (nil when there was none).
    @discardableResult
    private func leave() -> Task<Void, Never>? {
        let resources = state.withLock { state in
            defer { state.resources = [:] }
            return state.resources.values
        }
        for job in resources { job.cancel(reason: "\(myPeerID.displayName) left the session", code: .notConnected) }
        return state.withLock { state -> Task<Void, Never>? in
            guard let generation = state.generation else { return nil }
            state.generation = nil
            publisher.withdraw()
            for tracked in state.peers.values.sorted(by: { $0.since < $1.since }) where tracked.state != .notConnected {
                let peer = tracked.peer
                deliver { $0.session(self, peer: peer, didChange: .notConnected) }
            }
            state.peers = [:]
            generation.commands.yield(.disconnect)
            generation.commands.finish()
            logger.info("left the session")
            guard state.advertising != nil, let serviceType = state.serviceType else { return generation.task }
            // Advertised again on a new node; if it cannot open or publish, the advertiser is
            // told (generationFailed, publishFailed).
            let next = makeGeneration(serviceType, in: &state)
            state.generation = next
            publish(in: next, state: &state)
            return generation.task
        }
    }

    /// How a connected peer is linked (transport, address, encryption, and the six-digit
    /// verification code both users can compare); nil when it is not connected.
    public func info(for peerID: MultipeerPeerID) async -> ConnectedPeerInfo? {
        guard let session = state.withLock({ $0.generation?.peer?.session }) else { return nil }
        return await session.info(for: peerID.peerID)
    }

    // MARK: - For resources and streams

    /// The running PeerSession, when `peerID` is connected in it.
    ///
    /// - Throws: `invalidParameter` for the local peer, `notConnected` when the peer is not connected.
    func peerSession(connectedTo peerID: MultipeerPeerID, for what: String) throws(PeerLinkError) -> PeerSession {
        if peerID == myPeerID { throw PeerLinkError(.invalidParameter, "a peer cannot \(what) to itself") }
        return try state.withLock { state throws(PeerLinkError) in
            guard state.peers[peerID.fingerprint]?.state == .connected, let peer = state.generation?.peer else {
                throw PeerLinkError(.notConnected, "\(peerID) is not connected: \(what) once the delegate is told it is connected")
            }
            return peer.session
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

    /// Starts publishing the session's listener for `advertiser`: at once when the session's
    /// node is open, else once it is. Throws what can be told at once (another advertiser, another
    /// service type); a node that does not open, or a publication that fails, is reported to the
    /// advertiser later (``NearbyServiceAdvertiser/report(_:)``).
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
            state.advertising = Advertising(id: id, advertiser: advertiser, info: info, turn: 0)
            publish(in: generation, state: &state)
        }
    }

    /// Withdraws the advertisement made for the advertiser `id`; its invitations are declined from now on.
    func stopAdvertising(for id: ObjectIdentifier) {
        state.withLock { state in
            guard state.advertising?.id == id else { return }
            state.advertising = nil
            publisher.withdraw()
        }
    }

    /// Invites `peer` on behalf of a browser of `serviceType`; every failure is reported to the
    /// delegate as the peer being *not connected*.
    func invite(_ peer: MultipeerPeerID, found: DiscoveredPeer?, serviceType: ServiceType, context: [UInt8], timeout: Duration) {
        do {
            try state.withLock { state throws(PeerLinkError) in
                let generation = try self.generation(for: serviceType, state: &state)
                // Taken up once the generation's node is open (askBeforeInviting); if it does not
                // open, the invitation is not sent.
                generation.commands.yield(.ask(peer, found: found, context: context, timeout: timeout))
            }
        } catch {
            invitationNotSent(peer.peerID, reason: error.message)
        }
    }

    /// Asks the delegate about `peer`'s key, then invites it in generation `number` if that is
    /// still the session's.
    private func askBeforeInviting(_ peer: MultipeerPeerID, context: [UInt8], timeout: Duration, generation number: Int) {
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

    /// The running generation, started for `serviceType` if there is none. Throws only when the
    /// session serves another service type; a node that does not open is reported later
    /// (``generationFailed(_:generation:)``).
    private func generation(for serviceType: ServiceType, state: inout State) throws(PeerLinkError) -> Generation {
        if let served = state.serviceType, served != serviceType {
            throw PeerLinkError(
                .invalidParameter,
                "this session serves the service type \(served), not \(serviceType): a session serves one service type; make another session")
        }
        if let generation = state.generation { return generation }
        let generation = makeGeneration(serviceType, in: &state)
        state.serviceType = serviceType
        state.generation = generation
        return generation
    }

    /// Starts a generation: a task that opens a ``PeerNode`` (not advertised) on a thread of its
    /// own — the caller does not wait for bluetoothd or avahi-daemon —, then runs it, carries out
    /// the session's commands in order (those that came while it opened first), and hands its
    /// events to the session.
    private func makeGeneration(_ serviceType: ServiceType, in state: inout State) -> Generation {
        let configuration = PeerNodeConfiguration(
            session: PeerSessionConfiguration(
                identity: identity, displayName: displayName, serviceType: serviceType, encryption: encryptionPreference),
            transports: transports, advertising: false, discoveryRequired: false)
        let number = state.nextGeneration
        state.nextGeneration += 1
        let (commandStream, commands) = AsyncStream.makeStream(of: Command.self)
        let owner = WeakSession(self)
        let logger = logger
        let opening = Task { () async -> Result<PeerNode, PeerLinkError> in
            do throws(PeerLinkError) {
                return .success(try await PeerNode.open(configuration: configuration, logger: logger))
            } catch {
                return .failure(error)
            }
        }
        let task = Task {
            let peer: PeerNode
            switch await opening.value {
            case .success(let opened):
                peer = opened
            case .failure(let error):
                owner.session?.generationFailed(error, generation: number)
                // What was asked of it meanwhile: the invitations are not sent (the stream ends
                // once the generation is over).
                for await command in commandStream {
                    if case .ask(let invitee, _, _, _) = command {
                        owner.session?.invitationNotSent(invitee.peerID, reason: error.message)
                    }
                }
                return
            }
            if Task.isCancelled {
                // The session was released while the node opened.
                await runBlocking("peerlink-node-close") { peer.close() }
                return
            }
            owner.session?.generationOpened(peer, generation: number)
            logger.debug(
                "session peer started",
                metadata: [
                    "generation": "\(number)", "transports": "\(peer.runningModules)",
                    "link.listen": "\(peer.session.listeners.flatMap(\.localEndpoints).map(\.description))",
                ])
            await withDiscardingTaskGroup { group in
                group.addTask { await peer.run() }
                group.addTask {
                    for await command in commandStream {
                        if case .ask(let invitee, let found, let context, let timeout) = command {
                            if let found { peer.session.discovered(DiscoveryEvent.found(found)) }
                            owner.session?.askBeforeInviting(invitee, context: context, timeout: timeout, generation: number)
                            continue
                        }
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
        return Generation(number: number, peer: nil, opening: opening, commands: commands, task: task)
    }

    /// Generation `number`'s node is open: it is the session's (unless the session moved on).
    private func generationOpened(_ peer: PeerNode, generation number: Int) {
        state.withLock { state in
            guard state.generation?.number == number else { return }
            state.generation?.peer = peer
            state.serviceTypeSettled = true
        }
    }

    /// Generation `number`'s node did not open (no transport can run here): the generation is
    /// over, and the advertiser waiting for it is told, as when a node failed to open at once.
    /// The next use of the session tries again.
    private func generationFailed(_ error: PeerLinkError, generation number: Int) {
        let advertising = state.withLock { state -> Advertising? in
            guard let generation = state.generation, generation.number == number else { return nil }
            state.generation = nil
            generation.commands.finish()
            // A service type no node ever served is not the session's yet.
            if !state.serviceTypeSettled { state.serviceType = nil }
            defer { state.advertising = nil }
            return state.advertising
        }
        logger.info("the session's transports did not open: \(error.message)")
        // Advertisers are only ever held strongly outside the lock: releasing the last reference
        // to one runs its deinit, which takes this lock.
        advertising?.advertiser?.report(error)
    }

    /// Publishes generation's listeners with the advertised info, after what the publisher was
    /// asked before (the advertisement before is withdrawn first). What happens to the
    /// advertisements comes as the node's transport notices; a publication that fails is
    /// reported to the advertiser, unless it was advertised again since.
    private func publish(in generation: Generation, state: inout State) {
        guard var advertising = state.advertising else { return }
        state.advertisingTurn += 1
        advertising.turn = state.advertisingTurn
        state.advertising = advertising
        let turn = advertising.turn
        let owner = WeakSession(self)
        publisher.publish(on: generation.opening, info: advertising.info) { error in
            owner.session?.publishFailed(error, turn: turn)
        }
    }

    /// The publication of `turn` failed: its advertiser, if it still advertises, is told.
    private func publishFailed(_ error: PeerLinkError, turn: Int) {
        let advertising = state.withLock { state -> Advertising? in
            guard let advertising = state.advertising, advertising.turn == turn else { return nil }
            state.advertising = nil
            return advertising
        }
        guard let advertising else { return }
        logger.info("advertising failed: \(error.message)")
        advertising.advertiser?.report(error)
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
            case .ask:
                break  // taken up before (it needs the session)
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
                publisher.withdraw()
                return advertising
            }
            advertising?.advertiser?.report(error)
        }
    }

    // MARK: - State

    private struct State {
        weak var delegate: (any MultipeerSessionDelegate)?
        var serviceType: ServiceType?
        /// A node of the session opened: the service type is the session's for good (until
        /// then, a node that does not open leaves the session free to serve another).
        var serviceTypeSettled = false
        var generation: Generation?
        var nextGeneration = 1
        var advertising: Advertising?
        /// Counts publications asked for, so a late failure of one advertised again since is not reported.
        var advertisingTurn = 0
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
        /// The publication asked for last (``State/advertisingTurn``).
        var turn: Int
    }

    /// One run of the session: a PeerNode from the first use (or the last disconnect) to the next
    /// disconnect.
    private struct Generation: Sendable {
        var number: Int
        /// The node, once it is open.
        var peer: PeerNode?
        /// Opens the node, on a thread of its own.
        var opening: Task<Result<PeerNode, PeerLinkError>, Never>
        var commands: AsyncStream<Command>.Continuation
        var task: Task<Void, Never>
    }

    private enum Command: Sendable, CustomStringConvertible {
        /// Ask the delegate about the peer's key, then invite it (once the node is open).
        case ask(MultipeerPeerID, found: DiscoveredPeer?, context: [UInt8], timeout: Duration)
        case invite(PeerID, context: [UInt8], timeout: Duration)
        case respond(InvitationID, from: PeerID, accept: Bool)
        case send([UInt8], to: [PeerID], reliable: Bool)
        case disconnect

        var description: String {
            switch self {
            case .ask(let peer, _, _, _): "asking about \(peer) before inviting it"
            case .invite(let peer, _, _): "inviting \(peer)"
            case .respond(let invitation, let peer, let accept): "\(accept ? "accepting" : "declining") \(invitation) from \(peer)"
            case .send(let data, let peers, let reliable):
                "sending \(data.count) bytes \(reliable ? "reliably" : "unreliably") to \(peers.map(\.description).joined(separator: ", "))"
            case .disconnect: "leaving the session"
            }
        }
    }
}

/// A session's advertising work, in the order it was asked for: publishing a generation's
/// listeners (once its node is open) and withdrawing them. Both wait for bluetoothd and
/// avahi-daemon, so each runs on a thread of its own (``PeerLinkPosix/runBlocking(_:_:)``), one
/// after the other, in a task of the publisher's; the session's lock is never held meanwhile, and
/// an advertisement is withdrawn before the next one is made (bluetoothd takes one record per
/// identity and service type).
private final class Publisher: Sendable {
    private enum Job: Sendable {
        case publish(opening: Task<Result<PeerNode, PeerLinkError>, Never>, info: DiscoveryInfo, failed: @Sendable (PeerLinkError) -> Void)
        case withdraw
    }

    private let jobs: AsyncStream<Job>.Continuation

    init() {
        let (stream, jobs) = AsyncStream.makeStream(of: Job.self)
        self.jobs = jobs
        Task {
            var current: NodePublication?
            for await job in stream {
                if let previous = current {
                    current = nil
                    await runBlocking("peerlink-mpc-withdraw") { previous.stop() }
                }
                guard case .publish(let opening, let info, let failed) = job else { continue }
                // A node that did not open is reported by its generation.
                guard case .success(let node) = await opening.value else { continue }
                do throws(PeerLinkError) {
                    current = try await runBlocking("peerlink-mpc-publish") { () throws(PeerLinkError) -> NodePublication in
                        try node.publish(info: info)
                    }
                } catch {
                    failed(error)
                }
            }
            // The session was released: what is still published is withdrawn.
            if let current { await runBlocking("peerlink-mpc-withdraw") { current.stop() } }
        }
    }

    /// Publishes the node `opening` opens with `info` once it is open, after withdrawing the
    /// current advertisement; `failed` is told when it cannot.
    func publish(
        on opening: Task<Result<PeerNode, PeerLinkError>, Never>, info: DiscoveryInfo, failed: @escaping @Sendable (PeerLinkError) -> Void
    ) {
        jobs.yield(.publish(opening: opening, info: info, failed: failed))
    }

    /// Withdraws the current advertisement.
    func withdraw() { jobs.yield(.withdraw) }

    /// No more work: what is queued is done, then the task ends.
    func finish() { jobs.finish() }
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
