/// A link a peer is expected to replace its last one with, and until when.
struct AwaitedReplacement: Sendable {
    var deadline: Duration
    /// The link awaited is the one the peer kept when it closed the last one as a duplicate
    /// (not only the local dial under way): a failed dial of the local side does not end the wait.
    var keptLink = false
}

/// What the session knows about one remote peer. Internal to ``SessionStateMachine``.
struct PeerRecord: Sendable {
    /// The latest name the peer was seen under (its hello, a `MEMBERS` message, the app).
    var id: PeerID
    /// The state last reported to the app.
    var reported: PeerState = .notConnected
    /// In the session: messages may be sent to it.
    var isMember = false
    var endpoints: [Endpoint] = []
    /// When discovery (or the app) last gave ``endpoints``.
    var endpointsAt: Duration?
    /// A link this side dialled reached the peer's current incarnation since ``endpoints`` last
    /// changed: they are that run's.
    var endpointsReached = false
    /// A `.dial` is out and not answered yet.
    var dialing = false
    /// The dial out is an upgrade: it tries only the transports ranked above the link the
    /// peer had, so its failure says nothing about the others.
    var dialingUpgrade = false
    /// Established links to the peer, oldest first.
    var links: [LinkID] = []
    /// The link queued frames go out on (see ``SessionStateMachine`` on duplicate links).
    var sendLink: LinkID?
    /// `.framesReady` was announced for `sendLink` and the owner has not drained it to nil yet.
    var signalled = false
    var outbox = PeerOutbox()
    /// The peer's last link went while another was on its way (closed as a duplicate, or with a
    /// local dial out): that replacement is expected until then.
    var replacement: AwaitedReplacement?
    /// The local peer is joining this member (it was in the roster of the local peer's inviter)
    /// and waits for its `JOIN` until then.
    var joiningDeadline: Duration?
    /// A member announced this peer as a newcomer: its `JOIN` is expected until then.
    var announcedDeadline: Duration?
    /// A `JOIN` from this peer that waits for its announcement.
    var pendingJoin: PendingJoin?
    /// The local peer accepted this peer's invitation: the next `MEMBERS` from it is the roster.
    var expectingRoster = false
    /// The local app's pending invitation to this peer.
    var outgoingInvitation: InvitationID?
    /// Answers given to this peer's invitations, by wire id, newest last: a repeated `INVITE`
    /// (sent again on a replacement link) gets the same answer again.
    var answers: [(wireID: UInt32, answer: Answer)] = []
    /// Discovery reports it (automatic mode invites only found peers).
    var found = false
    /// Automatic mode does not invite it again until it is lost and found again (it declined
    /// with *session full*, or it left).
    var autoBlocked = false
    /// Automatic mode invites it again no earlier than this (after a failed invitation).
    var autoRetryAt: Duration?
    /// Automatic invitations in a row that never reached it (a dial that failed, a link that
    /// broke): each doubles the wait before the next (``SessionPolicy/automaticRetryDelay(afterFailures:invitationTimeout:)``).
    var autoFailures = 0
    /// When discovery last found it (was not found before); automatic mode's fallback counts
    /// from here for a peer that should have invited the local one.
    var foundAt: Duration?
    /// The peer's incarnation, as its links' hellos say (nil: not known, or it does not resume).
    var incarnation: Incarnation?
    /// When a link carried another incarnation than the one known before (the peer restarted).
    var restartSeenAt: Duration?
    /// The id the next reliable message to this peer gets (ids count per peer, not per link,
    /// since a message's chunks may cross a link change).
    var nextMessageID: UInt32 = 1
    /// Reliable messages arriving from this peer, in part.
    var reassembly = MessageReassembly()
    /// A member whose last link failed: it stays in the session until this deadline while it
    /// is dialled again (``SessionPolicy/reconnectGrace``).
    var reconnectDeadline: Duration?
    /// When the next reconnect (or upgrade) dial may start.
    var redialAt: Duration?
    /// Endpoints of a better ranked transport than the current link's, seen since when (an
    /// upgrade is due).
    var upgradeSeenAt: Duration?
    /// The member's link last told to the app (a change is reported as ``SessionEvent/linkChanged(_:_:)``).
    var announcedLink: LinkID?
    /// The last time the session had business with this peer (for the idle-link timeout).
    var purposeAt: Duration = .zero
    /// Why the peer is about to be reported `notConnected`.
    var lostReason: String?

    init(id: PeerID) {
        self.id = id
    }

    enum Answer: Hashable, Sendable {
        case accepted
        case declined(DeclineReason)
    }

    struct PendingJoin: Hashable, Sendable {
        var link: LinkID
        var deadline: Duration
    }

    /// Discovery (or the app) gives the peer's endpoints at `now` (none: nothing changes).
    mutating func noteEndpoints(_ given: [Endpoint], at now: Duration) {
        guard !given.isEmpty else { return }
        if given != endpoints { endpointsReached = false }
        endpoints = given
        endpointsAt = now
    }

    /// Whether ``endpoints`` belong to the peer's current run, so that nothing listening at any
    /// of them means that run is gone: no restart of the peer was seen, or a dial there reached
    /// the new run, or discovery gave them after the restart was seen. Otherwise they may be the
    /// earlier run's: a peer restarted just before its link was lost listens elsewhere now, and
    /// discovery has not seen that yet (a cut that came before its announcement).
    var endpointsAreCurrent: Bool {
        guard let since = restartSeenAt else { return true }
        return endpointsReached || (endpointsAt.map { $0 >= since } ?? false)
    }

    func answer(for wireID: UInt32) -> Answer? {
        answers.last { $0.wireID == wireID }?.answer
    }

    mutating func record(_ answer: Answer, for wireID: UInt32) {
        answers.removeAll { $0.wireID == wireID }
        answers.append((wireID, answer))
        if answers.count > 16 { answers.removeFirst(answers.count - 16) }
    }

    /// Whether the peer holds one of the session's places (see ``SessionStateMachine``'s rules
    /// on a full session): a member, or on its way in.
    var holdsPlace: Bool {
        isMember || outgoingInvitation != nil || joiningDeadline != nil || announcedDeadline != nil
    }

    /// Whether it is tied to the local peer's current session (so another session cannot be
    /// adopted).
    var tiesSession: Bool {
        isMember || joiningDeadline != nil || announcedDeadline != nil || pendingJoin != nil
    }
}

/// One established link. Internal to ``SessionStateMachine``.
struct LinkRecord: Sendable {
    let peer: Fingerprint
    let dialedLocally: Bool
    /// Establishment order, across all links of the state machine.
    let order: Int
    let establishedAt: Duration
    /// Its transport's rank (``SessionPolicy/transportRanks``).
    let rank: Int
    /// The largest message chunk it carries (``SessionStateMachine/linkEstablished(_:peer:dialedLocally:incarnation:transport:framePayload:at:)``).
    let framePayload: Int
    /// A `JOIN` went out on this link.
    var joinSent = false
}

/// An invitation the local peer sent. Internal to ``SessionStateMachine``.
struct OutgoingInvitation: Sendable {
    let peer: Fingerprint
    let context: [UInt8]
    /// When the invitation times out (the invitee's clock starts when the `INVITE` arrives, so
    /// an `INVITE` carries the time that remains when it is written).
    let deadline: Duration
    /// Made by automatic mode, not by the app: no result is reported.
    let automatic: Bool
    /// The link its `INVITE` went out on, if any.
    var sentOn: LinkID?
    /// The peer answered `DECLINE` *crossed*: the peer's own invitation will settle it.
    var crossed = false
}

/// An invitation the local peer received. Internal to ``SessionStateMachine``.
struct IncomingInvitation: Sendable {
    enum State: Hashable, Sendable {
        /// Shown to the app, waiting for ``SessionStateMachine/respond(to:accept:at:)``.
        case awaitingApp
        /// To be accepted without asking (automatic mode) once the session has room.
        case awaitingRoom
        /// Crossed with the local peer's own invitation, which wins the tie-break: answered
        /// once the local invitation is settled.
        case crossedWinner
    }

    let peer: Fingerprint
    let wireID: UInt32
    let session: SessionID
    let context: [UInt8]
    let deadline: Duration
    var state: State
}

/// A place in a bounded first-in-first-out memory (answers to late calls).
struct BoundedMemory<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private var values: [Key: Value] = [:]
    private var order: [Key] = []
    let capacity: Int

    init(capacity: Int) {
        self.capacity = capacity
    }

    subscript(key: Key) -> Value? { values[key] }

    mutating func insert(_ value: Value, for key: Key) {
        if values.updateValue(value, forKey: key) == nil { order.append(key) }
        if order.count > capacity { values[order.removeFirst()] = nil }
    }

    mutating func remove(_ key: Key) {
        if values.removeValue(forKey: key) != nil { order.removeAll { $0 == key } }
    }
}

/// A late answer's key: which peer, which wire invitation id.
struct WireInvitationKey: Hashable, Sendable {
    let peer: Fingerprint
    let wireID: UInt32
}
