/// The session logic of one local peer, MultipeerConnectivity-style, as a pure state machine:
/// invitations with context and timeout, a full mesh of up to 8 peers, the tie-break for
/// duplicate links and crossed invitations, automatic mode, and reliable and unreliable
/// messages.
///
/// It does no I/O and reads no clock. Its owner feeds it inputs — app calls, discovery,
/// established and closed links, received frames, the time — and carries out the
/// ``SessionAction``s each input returns, in order. Outgoing frames are pulled, one at a time,
/// with ``nextFrame(for:)`` after a ``SessionAction/framesReady(_:)``.
///
/// ```swift
/// var session = try SessionStateMachine(localPeer: me, serviceType: chat)
/// var (invitation, actions) = try session.invite(bob, endpoints: bobEndpoints, at: now)
/// perform(actions)                                    // .dial(bob, …)
/// // link up:          perform(session.linkEstablished(link, peer: bob, dialedLocally: true, at: now))
/// // frames ready:     while let frame = session.nextFrame(for: link) { write(frame) }
/// // frame received:   perform(session.frameReceived(frame, on: link, at: now))
/// // link gone:        perform(session.linkClosed(link, code: code, reason: reason, at: now))
/// // timer:            perform(session.tick(at: now)); sleep until session.nextDeadline
/// ```
///
/// Links are named by the owner (``LinkID``) and reach the state machine only once established:
/// the peer is authenticated (its fingerprint proven by the handshake). The owner runs each link's
/// own protocol (``LinkStateMachine``: keep-alive, `PING`, `GO_AWAY`) and passes the frames it
/// surfaces; `PING`, `DATA` and `WINDOW_UPDATE` frames are not the session's business and are
/// ignored here.
///
/// The rules, in short (the *Sessions* article has them in full):
///
/// - **Places.** A session holds at most ``SessionPolicy/maximumPeers`` peers including the local
///   one. A place is held by every member and by every peer on its way in (an invitation out, a
///   join under way, an announced newcomer). Inviting with no place left throws; an `INVITE`
///   arriving when the members alone fill the session is declined *session full*; a `JOIN` that
///   finds no place closes its link with `GO_AWAY` *session full*.
/// - **Invitations.** `INVITE` → the app answers → `ACCEPT` / `DECLINE`. The invitee's clock
///   starts when the `INVITE` arrives and runs for the timeout it carries; on expiry it answers
///   `DECLINE` *timed out*, and answering later throws. The inviter waits for the timeout plus
///   ``SessionPolicy/responseGrace``. An `ACCEPT` arriving after that is answered with `LEAVE`.
/// - **Mesh.** When an invitee accepts, the inviter sends it `MEMBERS` with the other members (the
///   roster) and sends each other member `MEMBERS` announcing the newcomer. The newcomer dials
///   every member it has no link to (``SessionAction/dial(_:endpoints:)`` with no endpoints: the
///   owner resolves them through discovery) and sends `JOIN`; a member accepts a `JOIN` from an
///   announced peer (a `JOIN` that arrives before its announcement waits for it) and answers
///   with its own `JOIN`, which makes the newcomer count the member as connected.
/// - **Duplicate links.** When a pair has links dialled from both sides, the link dialled by the
///   peer with the smaller fingerprint is kept and the others are closed with `GO_AWAY` 9 —
///   both sides decide alone and alike. The side with the smaller fingerprint sends nothing on
///   the other side's link while its own dial is under way, so nothing it sends is lost; what
///   the other side sent on a link that is then closed (an `INVITE`, a `JOIN`) is sent again on
///   the kept one. A pair's state does not change when one of its links is closed as a
///   duplicate; a peer that receives `GO_AWAY` 9 on its last link waits
///   ``SessionPolicy/replacementGrace`` for the other.
/// - **Crossed invitations.** When two peers invite each other, the invitation of the peer with
///   the smaller fingerprint wins. The loser accepts it without asking its app (it wanted the
///   peer, too) and reports its own invitation as accepted; the winner answers the loser's
///   `INVITE` with `DECLINE` *crossed* once its own invitation is accepted. If the loser cannot
///   accept (its session is full, or it is in another session), the winner accepts the loser's
///   invitation instead.
/// - **Automatic mode.** Every found peer with a greater fingerprint is invited, every `INVITE`
///   and `JOIN` into the automatic session (``SessionID/automatic(for:)``) is accepted while
///   there is room; an automatic `INVITE` that finds every place taken, some only by peers on
///   their way in, waits for those to settle.
public struct SessionStateMachine: Sendable {
    /// The local peer.
    public let localPeer: PeerID
    public let serviceType: ServiceType
    public let policy: SessionPolicy
    /// The session the local peer is in: given (or random) at first, the inviter's once the
    /// local peer accepts an invitation while it has no members, the automatic session in
    /// automatic mode.
    public internal(set) var sessionID: SessionID
    /// Whether automatic mode is on (``SessionPolicy/automatic``, until ``disconnect(at:)``).
    public internal(set) var isAutomatic: Bool
    /// Unreliable messages dropped on the way out: too large, or their lane was full.
    public internal(set) var droppedDatagrams = 0
    /// ``droppedDatagrams`` by the peer they were for (too large ones are not counted here).
    var droppedDatagramsByPeer: [Fingerprint: Int] = [:]
    /// Messages received from peers that are not members, dropped.
    public internal(set) var ignoredMessages = 0
    /// Bytes of reliable messages received in part that one link, and all links together, may
    /// hold (``ResourceLimits/maximumPartialMessageBytesPerLink`` and `…PerSession`): a link
    /// that goes over either is closed with ``GoAwayCode/resourceLimit`` and its partial
    /// messages dropped. A session sets them from its configuration.
    public var partialMessageLimits = (perLink: ResourceLimits.default.maximumPartialMessageBytesPerLink,
                                       perSession: ResourceLimits.default.maximumPartialMessageBytesPerSession)
    /// Bytes of reliable messages received in part, all links together.
    public internal(set) var bufferedMessageBytes = 0

    /// Bytes of `peer`'s reliable messages received in part (chunks waiting for the rest).
    public func partialMessageBytes(from peer: PeerID) -> Int {
        peers[peer.fingerprint]?.reassembly.bufferedBytes ?? 0
    }

    var now: Duration = .zero
    var peers: [Fingerprint: PeerRecord] = [:]
    var links: [LinkID: LinkRecord] = [:]
    var outgoing: [InvitationID: OutgoingInvitation] = [:]
    var incoming: [InvitationID: IncomingInvitation] = [:]
    /// Why an incoming invitation that is gone can no longer be answered.
    var closedIncoming = BoundedMemory<InvitationID, PeerLinkError>(capacity: 64)
    /// Invitations that timed out here: an `ACCEPT` for one is answered with `LEAVE`.
    var timedOutOutgoing = BoundedMemory<WireInvitationKey, Bool>(capacity: 64)
    var nextInvitationNumber: UInt32 = 1
    var nextLinkOrder = 0
    var actions: [SessionAction] = []
    /// Until when `settle()`'s rules (waiting invitations and joins, automatic invitations)
    /// have nothing to do for an input that only moves messages: set by every full settle.
    var rulesQuietUntil: Duration = .zero
    /// Every input settles in full, messages too (no fast path): for tests that check the
    /// fast path changes nothing.
    package var settlesEveryInputFully = false
    /// False while no input since ``nextDeadlineInPlace()`` last looked can have brought a
    /// deadline earlier than it found: only messages moved (sent, received, or their frames
    /// taken for a member's link), which move deadlines later or not at all. Every full settle,
    /// and frames taken for a peer that is not a member (its queue emptied may start its idle
    /// link's deadline), set it again. A session that sleeps until the next deadline asks it
    /// after every input: with only messages moving, it need not read every peer's record.
    public internal(set) var nextDeadlineMayBeEarlier = true

    /// What `read` makes of the record at `index`, read where it lies. `peers.values[index]`
    /// read as a value is a copy of the whole record (each array and table in it retained, then
    /// released), which the paths taken for every frame cannot afford; an `inout` access is no
    /// copy. `read` must not touch `self`: it runs inside an access to ``peers``.
    @inline(__always)
    mutating func inPlace<Result>(_ index: [Fingerprint: PeerRecord].Index, _ read: (inout PeerRecord) -> Result) -> Result {
        read(&peers.values[index])
    }

    /// - Parameters:
    ///   - localPeer: who the local peer is (its fingerprint decides every tie-break).
    ///   - serviceType: the service; in automatic mode it names the session.
    ///   - policy: limits and timeouts; validated.
    ///   - sessionID: the session to start with; by default a random one, or the automatic
    ///     session in automatic mode (which always uses the automatic session).
    /// - Throws: a ``PeerLinkError`` (`invalidParameter`) for a policy out of range.
    public init(
        localPeer: PeerID, serviceType: ServiceType, policy: SessionPolicy = .default, sessionID: SessionID? = nil
    ) throws(PeerLinkError) {
        try policy.validate()
        self.localPeer = localPeer
        self.serviceType = serviceType
        self.policy = policy
        isAutomatic = policy.automatic
        self.sessionID = policy.automatic ? .automatic(for: serviceType) : (sessionID ?? .random())
    }

    // MARK: - What the app and the owner read

    /// The state of `peer` in the session.
    public func state(of peer: PeerID) -> PeerState {
        peers[peer.fingerprint].map(derivedState) ?? .notConnected
    }

    /// The members, by fingerprint.
    public var connectedPeers: [PeerID] {
        peers.values.filter(\.isMember).map(\.id).sorted { $0.fingerprint < $1.fingerprint }
    }

    /// Whether messages the app sent to `peer` still wait in the session's queue for it (not
    /// yet handed to the peer's channel).
    public func hasQueuedMessages(to peer: PeerID) -> Bool {
        peers[peer.fingerprint]?.outbox.hasMessages ?? false
    }

    /// The established links to `peer`, oldest first.
    public func links(to peer: PeerID) -> [LinkID] {
        peers[peer.fingerprint]?.links ?? []
    }

    /// Unreliable messages for `peer` dropped because its lane was full.
    public func droppedDatagrams(to peer: PeerID) -> Int {
        droppedDatagramsByPeer[peer.fingerprint] ?? 0
    }

    /// The link frames for `peer` go out on now (the one its streams use), or nil.
    public func sendLink(to peer: PeerID) -> LinkID? {
        peers[peer.fingerprint].flatMap(sendLink(for:))
    }

    /// The peer at the other end of `link`, if the link is known.
    public func peer(on link: LinkID) -> PeerID? {
        links[link].flatMap { peers[$0.peer]?.id }
    }

    /// The invitations shown to the app and not answered yet, oldest first.
    public var invitationsAwaitingAnswer: [InvitationID] {
        incoming.filter { $0.value.state == .awaitingApp }.keys.sorted()
    }

    /// Every established link.
    public var allLinks: [LinkID] { links.keys.sorted() }

    /// Bytes of reliable messages received in part from `peer`.
    public func bufferedMessageBytes(from peer: PeerID) -> Int {
        peers[peer.fingerprint]?.reassembly.bufferedBytes ?? 0
    }

    /// Whether `peer` is a member whose last link failed and who is being dialled again
    /// (``SessionPolicy/reconnectGrace``).
    public func isReconnecting(_ peer: PeerID) -> Bool {
        peers[peer.fingerprint]?.reconnectDeadline != nil
    }

    /// When ``tick(at:)`` has something to do next, or nil.
    public var nextDeadline: Duration? {
        var earliest = invitationsDeadline
        // Each record is copied out to be read (a getter cannot read it in place; see
        // `inPlace`): ``nextDeadlineInPlace()`` does not.
        var index = peers.values.startIndex
        while index != peers.values.endIndex {
            Self.consider(earliestDeadline(of: peers.values[index]), for: &earliest)
            peers.values.formIndex(after: &index)
        }
        return earliest
    }

    /// ``nextDeadline``, each peer's record read where it lies: the getter copies every record
    /// out to read it (each array and table in it retained, then released), and the session
    /// asks after every input. The table is taken out of `self` while it is read (nothing that
    /// reads a record's deadlines looks at the table), so it is the table's only owner and
    /// reading a record in place copies nothing.
    public mutating func nextDeadlineInPlace() -> Duration? {
        nextDeadlineMayBeEarlier = false
        var table = peers
        peers = [:]
        defer { peers = table }
        var earliest = invitationsDeadline
        func read(_ record: inout PeerRecord) -> Duration? { earliestDeadline(of: record) }
        var index = table.values.startIndex
        while index != table.values.endIndex {
            Self.consider(read(&table.values[index]), for: &earliest)
            table.values.formIndex(after: &index)
        }
        return earliest
    }

    /// The earliest deadline of the invitations, sent and received.
    private var invitationsDeadline: Duration? {
        var earliest: Duration?
        for invitation in outgoing.values {
            Self.consider(invitation.sentOn == nil ? invitation.deadline : invitation.deadline + policy.responseGrace, for: &earliest)
        }
        for invitation in incoming.values { Self.consider(invitation.deadline, for: &earliest) }
        return earliest
    }

    /// Keeps the earlier of `deadline` and `earliest` in `earliest`.
    @inline(__always)
    private static func consider(_ deadline: Duration?, for earliest: inout Duration?) {
        if let deadline, earliest.map({ deadline < $0 }) ?? true { earliest = deadline }
    }

    /// The earliest of `record`'s deadlines that ``nextDeadline`` counts, or nil.
    private func earliestDeadline(of record: PeerRecord) -> Duration? {
        var earliest: Duration?
        func consider(_ deadline: Duration?) {
            if let deadline, earliest.map({ deadline < $0 }) ?? true { earliest = deadline }
        }
        consider(record.replacement?.deadline)
        consider(record.joiningDeadline)
        consider(record.announcedDeadline)
        consider(record.pendingJoin?.deadline)
        consider(idleDeadline(record))
        if isAutomatic, let retry = record.autoRetryAt, retry > now { consider(retry) }
        if isAutomatic, let fallback = automaticFallbackDeadline(record), fallback > now { consider(fallback) }
        consider(record.reconnectDeadline)
        consider(record.redialAt)
        consider(upgradeDeadline(record))
        return earliest
    }

    // MARK: - The app

    /// Invites `peer` into the session. Dials it first when there is no link to it yet.
    ///
    /// - Parameters:
    ///   - peer: the peer to invite.
    ///   - endpoints: where the peer can be reached (passed on in ``SessionAction/dial(_:endpoints:)``).
    ///   - context: shown to the invitee's app, at most 8192 bytes.
    ///   - timeout: how long the invitee has to answer (``SessionPolicy/invitationTimeout`` by default).
    ///   - time: now.
    /// - Returns: the invitation, whose end is reported with ``SessionEvent/invitationResult(_:peer:_:)``,
    ///   and the actions. If `peer` had already invited the local peer and waits for an answer,
    ///   the two invitations crossed: see the tie-break.
    /// - Throws: a ``PeerLinkError``: `invalidParameter` (the local peer itself, a context over
    ///   8192 bytes, a timeout out of range, a peer already connected or already invited),
    ///   `unavailable` (the session is full).
    public mutating func invite(
        _ peer: PeerID, endpoints: [Endpoint] = [], context: [UInt8] = [], timeout: Duration? = nil, at time: Duration
    ) throws(PeerLinkError) -> (InvitationID, [SessionAction]) {
        advance(to: time)
        let fingerprint = peer.fingerprint
        guard fingerprint != localPeer.fingerprint else {
            throw PeerLinkError(.invalidParameter, "a peer cannot invite itself (\(peer))")
        }
        guard context.count <= WireFormat.maxContextLength else {
            throw PeerLinkError(
                .invalidParameter,
                "an invitation's context is at most \(WireFormat.maxContextLength) bytes; this one is \(context.count)")
        }
        let timeout = timeout ?? policy.invitationTimeout
        guard timeout > .zero, milliseconds(timeout) < UInt32.max else {
            throw PeerLinkError(.invalidParameter, "an invitation's timeout must be between 1 ms and about 49 days")
        }
        var record = peers[fingerprint] ?? PeerRecord(id: peer)
        record.noteEndpoints(endpoints, at: now)
        guard !record.isMember else {
            throw PeerLinkError(.invalidParameter, "\(peer) is already connected")
        }
        guard record.outgoingInvitation == nil else {
            throw PeerLinkError(.invalidParameter, "an invitation to \(peer) is already waiting for an answer")
        }
        guard hasRoom(excluding: fingerprint) else {
            throw PeerLinkError(
                .unavailable,
                "session is full: \(policy.maximumPeers) peers including this one are connected or on their way in, "
                    + "the most this session holds (MultipeerConnectivity allows at most \(SessionPolicy.largestSession))")
        }
        peers[fingerprint] = record
        let id = startInvitation(to: fingerprint, context: context, timeout: timeout, automatic: false)

        // The peer is already waiting for this app's answer to its own invitation: crossed.
        if let waiting = incoming.filter({ $0.value.peer == fingerprint && $0.value.state == .awaitingApp }).keys.min() {
            closedIncoming.insert(
                PeerLinkError(.invalidParameter, "\(waiting) from \(peer) was settled when this peer invited it in turn"),
                for: waiting)
            emit(.invitationCancelled(waiting, from: peers[fingerprint]!.id, reason: .crossed))
            if localPeer.fingerprint < fingerprint {
                incoming[waiting]?.state = .crossedWinner
            } else if canAdopt(incoming[waiting]!.session, excluding: fingerprint) {
                acceptIncoming(waiting)
            } else {
                incoming[waiting]?.state = .crossedWinner
            }
        }
        settle()
        return (id, takeActions())
    }

    /// Answers an invitation shown with ``SessionEvent/invitationReceived(_:from:context:)``.
    ///
    /// Accepting adopts the inviter's session when the local peer has no members yet.
    /// - Throws: a ``PeerLinkError``: `timedOut` (the invitation expired), `invalidParameter`
    ///   (no such invitation waiting, or it was settled otherwise), `unavailable` (accepting
    ///   when the session is full or the local peer is in another session: the inviter is told
    ///   `DECLINE`).
    public mutating func respond(to invitation: InvitationID, accept: Bool, at time: Duration) throws(PeerLinkError) -> [SessionAction] {
        advance(to: time)
        guard let waiting = incoming[invitation], waiting.state == .awaitingApp else {
            if let reason = closedIncoming[invitation] { throw reason }
            throw PeerLinkError(.invalidParameter, "no \(invitation) is waiting for an answer")
        }
        let peer = peers[waiting.peer]!.id
        if accept {
            if !canAdopt(waiting.session, excluding: waiting.peer) {
                declineIncoming(invitation, reason: .declined)
                settle()
                throw PeerLinkError(
                    .unavailable,
                    "cannot accept \(invitation) from \(peer): this peer is in another session with other members; disconnect first")
            }
            if !hasRoom(excluding: waiting.peer) {
                declineIncoming(invitation, reason: .sessionFull)
                settle()
                throw PeerLinkError(
                    .unavailable, "session is full: cannot accept \(invitation) from \(peer) with \(policy.maximumPeers) peers already in")
            }
            acceptIncoming(invitation)
        } else {
            declineIncoming(invitation, reason: .declined)
        }
        settle()
        return takeActions()
    }

    /// Sends `data` to every peer in `peers`, reliably (ordered, chunked, reassembled, up to
    /// 16 MiB) or not (one `DATAGRAM`, at most 16384 bytes, may be dropped).
    ///
    /// As in MultipeerConnectivity, the call fails as a whole when any target is not connected:
    /// nothing is sent to anyone.
    ///
    /// Reliable messages to one peer are delivered exactly once, each whole. Their chunks are
    /// interleaved round-robin, so a small message sent after a large one arrives first; messages
    /// no larger than the ones sent after them arrive in the order sent.
    /// - Throws: a ``PeerLinkError``: `notConnected`, or `invalidParameter` (no peers, the local
    ///   peer, too large — a too large unreliable message is also counted in ``droppedDatagrams``).
    public mutating func send(_ data: [UInt8], to targets: [PeerID], reliable: Bool = true) throws(PeerLinkError) -> [SessionAction] {
        guard !targets.isEmpty else { throw PeerLinkError(.invalidParameter, "a message needs at least one peer to go to") }
        if targets.count == 1 {
            // One peer, as most messages go: no lists to build for it.
            let fingerprint = targets[0].fingerprint
            let index = try memberIndex(of: targets[0])
            try checkSize(of: data, reliable: reliable)
            enqueue(data, reliable: reliable, at: index, for: fingerprint)
            settle(movingMessagesOf: fingerprint, at: index)
            return takeActions()
        }
        var fingerprints: [Fingerprint] = []
        // where their records are (the table does not change while the message is queued)
        var indices: [[Fingerprint: PeerRecord].Index] = []
        for target in targets where !fingerprints.contains(target.fingerprint) {
            indices.append(try memberIndex(of: target))
            fingerprints.append(target.fingerprint)
        }
        try checkSize(of: data, reliable: reliable)
        for (fingerprint, index) in zip(fingerprints, indices) { enqueue(data, reliable: reliable, at: index, for: fingerprint) }
        settle(movingMessagesOf: fingerprints)
        return takeActions()
    }

    /// Where the record of `target`, a member a message may go to, lies in ``peers``.
    private mutating func memberIndex(of target: PeerID) throws(PeerLinkError) -> [Fingerprint: PeerRecord].Index {
        guard target.fingerprint != localPeer.fingerprint else {
            throw PeerLinkError(.invalidParameter, "a peer cannot send a message to itself")
        }
        // in place: `peers[key]?.field` copies the whole record out first
        guard let index = peers.index(forKey: target.fingerprint), inPlace(index, { $0.isMember }) else {
            throw PeerLinkError(.notConnected, "\(target) is not connected; nothing was sent")
        }
        return index
    }

    /// Throws when `data` is over the size a message of its kind may have (a too large
    /// unreliable one is counted in ``droppedDatagrams``).
    private mutating func checkSize(of data: [UInt8], reliable: Bool) throws(PeerLinkError) {
        if reliable {
            guard data.count <= WireFormat.maxMessageLength else {
                throw PeerLinkError(
                    .invalidParameter,
                    "a message is at most \(WireFormat.maxMessageLength) bytes (16 MiB); this one is \(data.count). "
                        + "Send a resource or a stream instead")
            }
        } else {
            guard data.count <= WireFormat.maxFramePayload else {
                droppedDatagrams += 1
                throw PeerLinkError(
                    .invalidParameter,
                    "an unreliable message is at most \(WireFormat.maxFramePayload) bytes; this one (\(data.count)) was dropped")
            }
        }
    }

    /// Queues `data` for the peer whose record lies at `index`; an unreliable message its lane
    /// has no room for is dropped and counted.
    private mutating func enqueue(_ data: [UInt8], reliable: Bool, at index: [Fingerprint: PeerRecord].Index, for fingerprint: Fingerprint) {
        if reliable {
            inPlace(index) { $0.outbox.enqueueMessage(data) }
        } else {
            let limit = policy.maximumQueuedDatagrams
            guard !inPlace(index, { $0.outbox.enqueueDatagram(data, limit: limit) }) else { return }
            droppedDatagrams += 1
            droppedDatagramsByPeer[fingerprint, default: 0] += 1
        }
    }

    /// Leaves the session: `GO_AWAY` code 0 on every link, every peer `notConnected`, invitations
    /// ended. Automatic mode is turned off (``resumeAutomatic(at:)`` turns it on again).
    public mutating func disconnect(at time: Duration) -> [SessionAction] {
        advance(to: time)
        for link in links.keys.sorted() {
            emit(.closeLink(link, code: .normal, reason: "\(localPeer.displayName) left the session"))
        }
        links.removeAll()
        bufferedMessageBytes = 0
        isAutomatic = false
        let reason = "the local peer left the session"
        for id in incoming.keys.sorted() {
            let invitation = incoming.removeValue(forKey: id)!
            if invitation.state == .awaitingApp {
                closedIncoming.insert(PeerLinkError(.cancelled, "\(id) was cancelled: \(reason)"), for: id)
                emit(.invitationCancelled(id, from: peers[invitation.peer]!.id, reason: .disconnected))
            }
        }
        for id in outgoing.keys.sorted() { resolveOutgoing(id, .failed(reason)) }
        for fingerprint in peers.keys.sorted() {
            var record = peers[fingerprint]!
            record.isMember = false
            record.dialing = false
            record.dialingUpgrade = false
            record.links = []
            record.sendLink = nil
            record.signalled = false
            record.outbox.removeAll()
            record.replacement = nil
            record.joiningDeadline = nil
            record.announcedDeadline = nil
            record.pendingJoin = nil
            record.expectingRoster = false
            record.lostReason = reason
            peers[fingerprint] = record
        }
        settle()
        return takeActions()
    }

    /// Turns automatic mode on again after ``disconnect(at:)`` (when the policy asks for it):
    /// the automatic session, and invitations to the found peers.
    public mutating func resumeAutomatic(at time: Duration) -> [SessionAction] {
        advance(to: time)
        if policy.automatic, !isAutomatic {
            isAutomatic = true
            sessionID = .automatic(for: serviceType)
        }
        settle()
        return takeActions()
    }

    // MARK: - Discovery

    /// Discovery found `peer` (or it is back). Automatic mode invites it if its fingerprint is
    /// greater than the local one. `endpoints` are kept for dialling it.
    public mutating func peerFound(_ peer: PeerID, endpoints: [Endpoint] = [], at time: Duration) -> [SessionAction] {
        advance(to: time)
        guard peer.fingerprint != localPeer.fingerprint else { return takeActions() }
        var record = peers[peer.fingerprint] ?? PeerRecord(id: peer)
        if !record.found { record.foundAt = now }
        record.found = true
        record.autoBlocked = false
        record.noteEndpoints(endpoints, at: now)
        peers[peer.fingerprint] = record
        noteUpgrade(peer.fingerprint)
        settle()
        return takeActions()
    }

    /// Discovery has new endpoints for `peer`, found before (another transport found it, an
    /// address changed). Mostly only the endpoints change: a member found on a better ranked
    /// transport than its link's is upgraded (see ``SessionPolicy/transportRanks``). A peer that
    /// left on purpose is not called back by automatic mode, unless an endpoint of one of its
    /// transports was replaced by another (a restarted chat listens on another port, and
    /// discovery reports that without losing the peer first): that is likely a new run of it,
    /// and it is invited as after a loss and a find.
    public mutating func peerUpdated(_ peer: PeerID, endpoints: [Endpoint], at time: Duration) -> [SessionAction] {
        advance(to: time)
        guard var record = peers[peer.fingerprint], !endpoints.isEmpty else { return takeActions() }
        let previous = record.endpoints
        let replaced = previous.contains { old in
            !endpoints.contains(old) && endpoints.contains { $0.kind == old.kind && !previous.contains($0) }
        }
        if replaced { record.autoBlocked = false }
        record.noteEndpoints(endpoints, at: now)
        peers[peer.fingerprint] = record
        noteUpgrade(peer.fingerprint)
        settle()
        return takeActions()
    }

    /// Discovery lost `peer`. Its links and membership are not touched (a link's keep-alive
    /// decides when it is dead); automatic mode stops inviting it.
    public mutating func peerLost(_ peer: PeerID, at time: Duration) -> [SessionAction] {
        advance(to: time)
        if var record = peers[peer.fingerprint] {
            record.found = false
            record.foundAt = nil
            record.autoBlocked = false
            record.autoRetryAt = nil
            record.autoFailures = 0
            peers[peer.fingerprint] = record
        }
        settle()
        return takeActions()
    }

    // MARK: - Links

    /// A link to `peer` is established (the peer is authenticated). `dialedLocally` says whether
    /// the local side opened it — it answers a ``SessionAction/dial(_:endpoints:)`` to that peer.
    ///
    /// - Parameters:
    ///   - incarnation: the peer's incarnation from its hello. Another incarnation than the one
    ///     the session knows means the peer started anew: the old one leaves first.
    ///   - transport: the link's transport (`tcp`, `l2cap`, ...), ranked by
    ///     ``SessionPolicy/transportRanks``: of several links to a peer the best ranked is kept.
    ///   - framePayload: the largest message chunk the link carries (at least
    ///     ``WireFormat/maxFramePayload``; more when both sides take large frames over a
    ///     transport that carries them well): messages are cut into chunks of this size for it.
    public mutating func linkEstablished(
        _ link: LinkID, peer: PeerID, dialedLocally: Bool, incarnation: Incarnation? = nil, transport: String = "",
        framePayload: Int = WireFormat.maxFramePayload, at time: Duration
    ) -> [SessionAction] {
        advance(to: time)
        guard links[link] == nil else { return takeActions() }
        guard peer.fingerprint != localPeer.fingerprint else {
            emit(.closeLink(link, code: .internalError, reason: "a link from this peer to itself"))
            return takeActions()
        }
        if let known = peers[peer.fingerprint]?.incarnation, let incarnation, known != incarnation {
            restarted(peer)
        }
        var record = peers[peer.fingerprint] ?? PeerRecord(id: peer)
        record.id = peer
        if let incarnation, record.incarnation != incarnation {
            if record.incarnation != nil {
                record.restartSeenAt = now
                record.endpointsReached = false
            }
            record.incarnation = incarnation
        }
        if dialedLocally {
            record.dialing = false
            record.dialingUpgrade = false
            record.endpointsReached = true
        }
        record.links.append(link)
        record.replacement = nil
        record.reconnectDeadline = nil
        record.redialAt = nil
        peers[peer.fingerprint] = record
        links[link] = LinkRecord(
            peer: peer.fingerprint, dialedLocally: dialedLocally, order: nextLinkOrder, establishedAt: now,
            rank: policy.rank(of: transport),
            framePayload: min(max(framePayload, WireFormat.maxFramePayload), WireFormat.largeFramePayload))
        nextLinkOrder += 1
        collapseDuplicates(of: peer.fingerprint)
        settle()
        return takeActions()
    }

    /// A ``SessionAction/dial(_:endpoints:)`` to `peer` failed.
    ///
    /// - Parameter refused: every endpoint dialled answered that nothing listens there
    ///   (`ECONNREFUSED`): the machine is reachable and the peer's session is gone. A member
    ///   being reconnected leaves at once then, instead of at the end of its grace — a peer
    ///   that comes back is another run of it (another incarnation) anyway. Not when the
    ///   endpoints may be an earlier run's (the member restarted just before, and discovery has
    ///   not seen its new endpoints yet): it is dialled again within its grace, and it dials too.
    public mutating func dialFailed(_ peer: PeerID, reason: String, refused: Bool = false, at time: Duration) -> [SessionAction] {
        advance(to: time)
        if var record = peers[peer.fingerprint], record.dialing {
            record.dialing = false
            let wasUpgrade = record.dialingUpgrade
            record.dialingUpgrade = false
            if wasUpgrade, record.reconnectDeadline != nil, record.links.isEmpty {
                // The link failed while an upgrade was dialled, on the better transports only:
                // the member is dialled at once on every transport it has.
                record.dialing = true
                record.redialAt = nil
                peers[peer.fingerprint] = record
                emit(.dial(record.id, endpoints: rankedEndpoints(record)))
            } else if refused, record.reconnectDeadline != nil, record.links.isEmpty, record.endpointsAreCurrent {
                record.reconnectDeadline = nil
                record.redialAt = nil
                peers[peer.fingerprint] = record
                lose(peer.fingerprint, reason: "\(peer)'s link failed and nothing listens at its addresses any more: \(reason)")
            } else if record.reconnectDeadline != nil || !record.links.isEmpty {
                // reconnecting or upgrading: try again later, the grace decides
                record.redialAt = now + policy.redialInterval
                peers[peer.fingerprint] = record
            } else if record.replacement?.keptLink == true {
                // its last link was closed as a duplicate: the link the peer kept is on its way,
                // and the replacement grace decides
                peers[peer.fingerprint] = record
            } else {
                peers[peer.fingerprint] = record
                lose(peer.fingerprint, reason: "could not reach \(peer): \(reason)")
            }
        }
        settle()
        return takeActions()
    }

    /// `link` is over (the peer's `GO_AWAY`, the end of its stream, a keep-alive timeout, an
    /// error). Links the state machine closed itself are forgotten already and ignored here.
    ///
    /// - Parameter lost: the link ended without a `GO_AWAY` (the end of its stream, a reset, an
    ///   I/O error): a member is then dialled again within its grace whatever `code` says.
    public mutating func linkClosed(_ link: LinkID, code: GoAwayCode, reason: String, lost: Bool = false, at time: Duration) -> [SessionAction] {
        advance(to: time)
        // The peer closed its link with code 0: it left (or has no business here). Automatic
        // mode does not call it back until discovery loses it and finds it again.
        if code == .normal, !lost, let fingerprint = links[link]?.peer { peers[fingerprint]?.autoBlocked = true }
        removeLink(link, code: code, reason: "link closed, code \(code): \(reason)", lost: lost)
        settle()
        return takeActions()
    }

    /// A frame from the peer on `link`.
    ///
    /// - Parameter peer: the link's peer. A message chunk is the peer's, not the link's (the
    ///   pair's continuity took it, and acknowledges it): one that arrives on a link this side
    ///   closed already — a duplicate the tie-break dropped, a link being replaced — still counts.
    public mutating func frameReceived(_ frame: Frame, on link: LinkID, from peer: PeerID? = nil, at time: Duration) -> [SessionAction] {
        advance(to: time)
        var sender: Sender?
        if let fingerprint = receive(frame, on: link, from: peer, sender: &sender) {
            settleAfterReceiving(frame, from: fingerprint, closedLink: closesLink(since: 0))
        }
        return takeActions()
    }

    /// ``frameReceived(_:on:from:at:)`` for each of `frames` in turn, with one list of actions
    /// for them all: for a run of message chunks from one link, which the session takes in one
    /// go. What the rules do after messages (announce frames queued for their peer) is done
    /// once for a run of them from one peer, after its last; any other frame, or a message that
    /// closed a link (over a limit), is settled at once, as on its own.
    public mutating func framesReceived(_ frames: some Sequence<Frame>, on link: LinkID, from peer: PeerID? = nil, at time: Duration) -> [SessionAction] {
        advance(to: time)
        // The peer whose messages were taken in and not settled yet.
        var unsettled: Fingerprint?
        // Who sent the messages of this run and where its record lies: looked up at the run's
        // first message and forgotten after anything that may change the tables (any other
        // frame, a settle, a link closed).
        var sender: Sender?
        for frame in frames {
            let before = actions.count
            guard let fingerprint = receive(frame, on: link, from: peer, sender: &sender) else { continue }
            let closed = closesLink(since: before)
            if let other = unsettled, other != fingerprint || closed || !frame.isMessage {
                settle(movingMessagesOf: other)
                unsettled = nil
                sender = nil
            }
            if frame.isMessage, !closed {
                unsettled = fingerprint
            } else {
                settleAfterReceiving(frame, from: fingerprint, closedLink: closed)
                sender = nil
            }
        }
        if let unsettled { settle(movingMessagesOf: unsettled) }
        return takeActions()
    }

    /// Whether an action taken since `actions[start]` closes a link.
    private func closesLink(since start: Int) -> Bool {
        actions[start...].contains { if case .closeLink = $0 { true } else { false } }
    }

    /// What the rules do after `frame` from `fingerprint`'s link was taken in.
    private mutating func settleAfterReceiving(_ frame: Frame, from fingerprint: Fingerprint, closedLink: Bool) {
        // After a message, unless a limit closed a link, the rules have no new business.
        if frame.isMessage, !closedLink { settle(movingMessagesOf: fingerprint) } else { settle() }
    }

    /// The peer a run of messages from one link comes from, and where its record lies in
    /// ``peers`` (valid while no peer is added or removed).
    private struct Sender {
        var fingerprint: Fingerprint
        var index: [Fingerprint: PeerRecord].Index
    }

    /// Takes in `frame` (see ``frameReceived(_:on:from:at:)``), without settling: the peer it
    /// came from, or nil when it is ignored (a link this side forgot, from a peer not known).
    /// A message's sender is taken from `sender` when it is known (the run's earlier messages
    /// looked it up, and the caller forgets it when the tables may have changed), and left there.
    private mutating func receive(_ frame: Frame, on link: LinkID, from peer: PeerID?, sender: inout Sender?) -> Fingerprint? {
        if frame.isMessage, let known = sender {
            receiveMessage(frame, on: link, from: known)
            return known.fingerprint
        }
        let fingerprint: Fingerprint
        if let record = links[link] {
            fingerprint = record.peer
        } else if case .message = frame, let peer, peers.index(forKey: peer.fingerprint) != nil {
            fingerprint = peer.fingerprint
        } else {
            return nil
        }
        if frame.isMessage {
            let known = Sender(fingerprint: fingerprint, index: peers.index(forKey: fingerprint)!)
            sender = known
            receiveMessage(frame, on: link, from: known)
            return fingerprint
        }
        switch frame {
        case .control(let message):
            receive(message, from: fingerprint, on: link)
        case .message, .datagram:
            break  // taken above
        case .goAway(let code, let reason):
            removeLink(link, code: code, reason: "link closed by the peer, code \(code): \(reason)")
        case .ping, .data, .windowUpdate, .ack:
            break
        }
        return fingerprint
    }

    /// Takes in a chunk of a reliable message, or an unreliable message, from `sender`.
    private mutating func receiveMessage(_ frame: Frame, on link: LinkID, from sender: Sender) {
        let index = sender.index
        // Where a chunk that breaks a limit is answered: its link, or the peer's link now.
        // Records are read through the index: `peers[key]!.field` copies the whole record out
        // first, and this runs for every frame.
        func culprit() -> LinkID? {
            if links[link] != nil { return link }
            return sendLink(for: peers.values[index])
        }
        switch frame {
        case .message(let id, let flags, let chunk):
            let (before, outcome, held) = inPlace(index) { record in
                let before = record.reassembly.bufferedBytes
                let outcome = record.reassembly.add(id: id, flags: flags, chunk: chunk)
                return (before, outcome, record.reassembly.bufferedBytes)
            }
            bufferedMessageBytes += held - before
            switch outcome {
            case .incomplete:
                if held > partialMessageLimits.perLink, let culprit = culprit() {
                    close(
                        culprit, code: .resourceLimit,
                        reason: "\(held) bytes of messages received in part from this peer, over the limit of \(partialMessageLimits.perLink)")
                } else if bufferedMessageBytes > partialMessageLimits.perSession, let culprit = culprit() {
                    close(
                        culprit, code: .resourceLimit,
                        reason: "\(bufferedMessageBytes) bytes of messages received in part in this session, over the limit of \(partialMessageLimits.perSession)")
                }
            case .complete(let bytes):
                if let member = inPlace(index, { $0.isMember ? $0.id : nil }) {
                    emit(.event(.messageReceived(member, bytes, reliable: true)))
                } else {
                    ignoredMessages += 1
                }
            case .tooLarge(let size):
                guard let culprit = culprit() else { break }
                close(
                    culprit, code: .protocolError,
                    reason: "message \(id) is over \(size - chunk.count) bytes and growing; "
                        + "a message is at most \(WireFormat.maxMessageLength) bytes (16 MiB)")
            }
        case .datagram(let bytes):
            if let member = inPlace(index, { $0.isMember ? $0.id : nil }) {
                emit(.event(.messageReceived(member, bytes, reliable: false)))
            } else {
                ignoredMessages += 1
            }
        default:
            break
        }
    }

    /// The next frame to write on `link`, or nil when nothing waits for it (then the next
    /// ``SessionAction/framesReady(_:)`` says when there is). Control messages first; then
    /// unreliable messages and chunks of reliable messages (round-robin between messages) take
    /// turns, so neither holds up the other.
    public mutating func nextFrame(for link: LinkID) -> Frame? {
        // The record is taken out of the table while it changes: a copy left behind would make
        // every change to its outbox copy the whole queue (quadratic with many small messages).
        guard let linkRecord = links[link], peers[linkRecord.peer]?.sendLink == link,
            var record = peers.removeValue(forKey: linkRecord.peer)
        else { return nil }
        defer { peers[linkRecord.peer] = record }
        return nextFrame(from: &record, on: link, maxChunk: linkRecord.framePayload)
    }

    /// The frames ``nextFrame(for:)`` would give one call at a time, in the same order, until
    /// they come to `limit` bytes (``FrameScheduler/size(of:)``; the last one may pass it),
    /// nothing waits, or one that is not sequenced (a frame of the link's own: session control,
    /// a datagram) was taken, which ends the run: one look-up of the peer for a run of message
    /// chunks instead of one each, and a link that fails to take its own frame loses only that
    /// one (what was not taken stays for the peer's next link).
    public mutating func nextFrames(for link: LinkID, upTo limit: Int) -> [Frame] {
        // One look-up; the record is swapped out of its place while it changes (see
        // `nextFrame(for:)`) and back into it, which the table's layout does not notice.
        guard let linkRecord = links[link], let index = peers.index(forKey: linkRecord.peer),
            inPlace(index, { $0.sendLink == link })
        else { return [] }
        var record = PeerRecord(id: inPlace(index) { $0.id })
        swap(&record, &peers.values[index])
        defer { swap(&record, &peers.values[index]) }
        var frames: [Frame] = []
        var size = 0
        while size < limit, let frame = nextFrame(from: &record, on: link, maxChunk: linkRecord.framePayload) {
            frames.append(frame)
            size += FrameScheduler.size(of: frame)
            if !frame.type.isSequenced { break }
        }
        return frames
    }

    /// ``nextFrame(for:)`` of the record of the peer `link` sends for, taken out of the table.
    /// Message chunks are at most `maxChunk` bytes (the link's ``LinkRecord/framePayload``).
    private mutating func nextFrame(from record: inout PeerRecord, on link: LinkID, maxChunk: Int) -> Frame? {
        if !record.isMember { nextDeadlineMayBeEarlier = true }
        while let control = record.outbox.takeControl() {
            switch control {
            case .invite(let id):
                guard var invitation = outgoing[id] else { continue }
                invitation.sentOn = link
                outgoing[id] = invitation
                let remaining = max(invitation.deadline - now, .milliseconds(1))
                return .control(
                    .invite(
                        invitation: id.rawValue, session: sessionID, timeoutMilliseconds: UInt32(clamping: milliseconds(remaining)),
                        context: invitation.context))
            case .join:
                links[link]!.joinSent = true
                return .control(.join(session: sessionID))
            case .message(let message):
                return .control(message)
            }
        }
        // Datagrams and chunks take turns, so a flood of datagrams never holds up reliable messages.
        if !record.outbox.datagramsLast || !record.outbox.hasMessages, let datagram = record.outbox.takeDatagram() {
            return .datagram(datagram)
        }
        if let chunk = record.outbox.takeChunk(nextID: &record.nextMessageID, maxChunk: maxChunk) {
            return chunk
        }
        record.signalled = false
        return nil
    }

    // MARK: - Time

    /// Fires what is due at `time`: invitation timeouts (both sides), joins that took too long,
    /// duplicate links never replaced, idle links, automatic retries.
    public mutating func tick(at time: Duration) -> [SessionAction] {
        advance(to: time)
        for id in outgoing.keys.sorted() {
            guard let invitation = outgoing[id] else { continue }
            let limit = invitation.sentOn == nil ? invitation.deadline : invitation.deadline + policy.responseGrace
            if now >= limit {
                timedOutOutgoing.insert(true, for: WireInvitationKey(peer: invitation.peer, wireID: id.rawValue))
                resolveOutgoing(id, .timedOut)
            }
        }
        for id in incoming.keys.sorted() {
            guard let invitation = incoming[id], now >= invitation.deadline else { continue }
            let peer = peers[invitation.peer]!.id
            if invitation.state == .awaitingApp {
                closedIncoming.insert(
                    PeerLinkError(.timedOut, "\(id) from \(peer) timed out; it can no longer be answered"), for: id)
                emit(.invitationCancelled(id, from: peer, reason: .timedOut))
            }
            declineIncoming(id, reason: .timedOut)
        }
        for fingerprint in peers.keys.sorted() {
            guard var record = peers[fingerprint] else { continue }
            if let deadline = record.replacement?.deadline, now >= deadline, record.links.isEmpty {
                record.replacement = nil
                peers[fingerprint] = record
                lose(fingerprint, reason: "its link was closed as a duplicate and no other link came")
                record = peers[fingerprint]!
            }
            if let deadline = record.joiningDeadline, now >= deadline, !record.isMember {
                record.joiningDeadline = nil
                record.lostReason = "joining it took longer than \(WireText.seconds(policy.joinTimeout))"
                emit(.event(.joinRefused(record.id, code: nil, reason: record.lostReason!)))
            }
            if let deadline = record.announcedDeadline, now >= deadline, !record.isMember {
                record.announcedDeadline = nil
                record.lostReason = "it was announced but did not join within \(WireText.seconds(policy.joinTimeout))"
            }
            peers[fingerprint] = record
            if let pending = record.pendingJoin, now >= pending.deadline {
                peers[fingerprint]!.pendingJoin = nil
                close(
                    pending.link, code: .protocolError,
                    reason: "JOIN from \(record.id), whom no member announced within \(WireText.seconds(policy.joinTimeout))")
            }
        }
        for fingerprint in peers.keys.sorted() {
            guard var record = peers[fingerprint] else { continue }
            if let deadline = record.reconnectDeadline, now >= deadline, record.links.isEmpty {
                record.reconnectDeadline = nil
                record.redialAt = nil
                peers[fingerprint] = record
                lose(
                    fingerprint,
                    reason: "no transport reached \(record.id) within \(WireText.seconds(policy.reconnectGrace)) of losing its link")
                continue
            }
            if let redial = record.redialAt, now >= redial, !record.dialing, record.reconnectDeadline != nil, record.links.isEmpty {
                record.redialAt = nil
                record.dialing = true
                peers[fingerprint] = record
                emit(.dial(record.id, endpoints: rankedEndpoints(record)))
            }
            if let upgrade = upgradeDeadline(record), now >= upgrade, !record.dialing {
                record.upgradeSeenAt = nil
                record.redialAt = now + policy.redialInterval
                record.dialing = true
                record.dialingUpgrade = true
                peers[fingerprint] = record
                emit(.dial(record.id, endpoints: betterEndpoints(record)))
            }
        }
        for fingerprint in peers.keys.sorted() {
            guard let record = peers[fingerprint], let deadline = idleDeadline(record), now >= deadline else { continue }
            for link in record.links {
                close(link, code: .normal, reason: "no session business with \(record.id) for \(WireText.seconds(policy.idleLinkTimeout))")
            }
        }
        settle()
        return takeActions()
    }
}

extension Frame {
    /// A chunk of a reliable message, or an unreliable message.
    fileprivate var isMessage: Bool {
        switch self {
        case .message, .datagram: true
        default: false
        }
    }
}
