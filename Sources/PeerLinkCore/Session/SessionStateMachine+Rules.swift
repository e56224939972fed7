// The rules behind SessionStateMachine's inputs: invitations, membership, links, control
// messages, and `settle()`, which every input ends with.

extension SessionStateMachine {
    // MARK: - Plumbing

    mutating func advance(to time: Duration) {
        if time > now { now = time }
    }

    mutating func takeActions() -> [SessionAction] {
        defer { actions = [] }
        return actions
    }

    mutating func emit(_ action: SessionAction) { actions.append(action) }

    mutating func emit(_ event: SessionEvent) { actions.append(.event(event)) }

    func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let (product, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? 0 : Int64.max }
        return max(0, product + attoseconds / 1_000_000_000_000_000)
    }

    /// The places held by peers other than `fingerprint` (see ``PeerRecord/holdsPlace``).
    func placesHeld(excluding fingerprint: Fingerprint) -> Int {
        peers.reduce(0) { $0 + ($1.key != fingerprint && $1.value.holdsPlace ? 1 : 0) }
    }

    /// Members other than `fingerprint`.
    func memberCount(excluding fingerprint: Fingerprint) -> Int {
        peers.reduce(0) { $0 + ($1.key != fingerprint && $1.value.isMember ? 1 : 0) }
    }

    /// Whether `fingerprint` can take a place (the local peer holds one of the maximum).
    func hasRoom(excluding fingerprint: Fingerprint) -> Bool {
        placesHeld(excluding: fingerprint) < policy.maximumPeers - 1
    }

    /// Whether the members alone fill the session, `fingerprint` aside.
    func isFullOfMembers(excluding fingerprint: Fingerprint) -> Bool {
        memberCount(excluding: fingerprint) >= policy.maximumPeers - 1
    }

    /// Whether an invitation into `session` from `fingerprint` can be accepted: it is the local
    /// session, or the local peer has no ties to its own (then it adopts `session`). Automatic
    /// mode stays in the automatic session.
    func canAdopt(_ session: SessionID, excluding fingerprint: Fingerprint) -> Bool {
        if session == sessionID { return true }
        if isAutomatic { return false }
        return !peers.contains { $0.key != fingerprint && $0.value.tiesSession }
    }

    func derivedState(_ record: PeerRecord) -> PeerState {
        if record.isMember { return .connected }
        if record.outgoingInvitation != nil || record.joiningDeadline != nil || record.announcedDeadline != nil
            || record.pendingJoin != nil
            || incoming.values.contains(where: { $0.peer == record.id.fingerprint && $0.state != .awaitingApp })
        {
            return .connecting
        }
        return .notConnected
    }

    func hasBusiness(_ record: PeerRecord) -> Bool {
        record.isMember || record.outgoingInvitation != nil || record.joiningDeadline != nil
            || record.announcedDeadline != nil || record.pendingJoin != nil || record.dialing
            || record.replacement != nil || !record.outbox.isEmpty
            || incoming.values.contains { $0.peer == record.id.fingerprint }
    }

    /// When the links to a peer the session has no business with are closed.
    func idleDeadline(_ record: PeerRecord) -> Duration? {
        guard !record.links.isEmpty, !hasBusiness(record) else { return nil }
        let newest = record.links.compactMap { links[$0]?.establishedAt }.max() ?? record.purposeAt
        return max(newest, record.purposeAt) + policy.idleLinkTimeout
    }

    func memberEntry(_ peer: PeerID) -> ControlMessage.Member {
        let name = (try? DisplayName(peer.displayName)) ?? (try? DisplayName(peer.fingerprint.value))
        // A fingerprint is always a valid display name (16 ASCII letters and digits).
        return ControlMessage.Member(fingerprint: peer.fingerprint, displayName: name!)
    }

    // MARK: - Invitations

    /// Records a new invitation to `fingerprint`, queues its `INVITE` and dials if needed.
    mutating func startInvitation(to fingerprint: Fingerprint, context: [UInt8], timeout: Duration, automatic: Bool) -> InvitationID {
        let id = InvitationID(nextInvitationNumber)
        nextInvitationNumber = nextInvitationNumber == .max ? 1 : nextInvitationNumber + 1
        outgoing[id] = OutgoingInvitation(peer: fingerprint, context: context, deadline: now + timeout, automatic: automatic)
        peers[fingerprint]!.outgoingInvitation = id
        peers[fingerprint]!.outbox.enqueue(.invite(id))
        dialIfNeeded(fingerprint)
        return id
    }

    mutating func dialIfNeeded(_ fingerprint: Fingerprint) {
        guard var record = peers[fingerprint], record.links.isEmpty, !record.dialing, record.replacement == nil else { return }
        record.dialing = true
        peers[fingerprint] = record
        emit(.dial(record.id, endpoints: record.endpoints))
    }

    mutating func answer(_ fingerprint: Fingerprint, wireID: UInt32, with answer: PeerRecord.Answer) {
        peers[fingerprint]!.record(answer, for: wireID)
        switch answer {
        case .accepted: peers[fingerprint]!.outbox.enqueue(.message(.accept(invitation: wireID)))
        case .declined(let reason): peers[fingerprint]!.outbox.enqueue(.message(.decline(invitation: wireID, reason: reason)))
        }
    }

    /// Accepts an incoming invitation (the checks are the caller's): `ACCEPT`, adopt the
    /// session, membership; the inviter's `MEMBERS` that follows is the roster.
    mutating func acceptIncoming(_ id: InvitationID) {
        guard let invitation = incoming.removeValue(forKey: id) else { return }
        answer(invitation.peer, wireID: invitation.wireID, with: .accepted)
        if invitation.session != sessionID { sessionID = invitation.session }
        peers[invitation.peer]!.expectingRoster = true
        becomeMember(invitation.peer)
    }

    mutating func declineIncoming(_ id: InvitationID, reason: DeclineReason) {
        guard let invitation = incoming.removeValue(forKey: id) else { return }
        answer(invitation.peer, wireID: invitation.wireID, with: .declined(reason))
        if closedIncoming[id] == nil {
            closedIncoming.insert(PeerLinkError(.invalidParameter, "\(id) was already answered (declined: \(reason))"), for: id)
        }
    }

    /// Ends one of the local invitations. Crossed invitations from the same peer that waited for
    /// it are settled now: declined *crossed* if it was accepted, otherwise accepted in its
    /// place when possible (and then the local invitation counts as accepted).
    mutating func resolveOutgoing(_ id: InvitationID, _ outcome: InvitationOutcome) {
        guard let invitation = outgoing.removeValue(forKey: id) else { return }
        let fingerprint = invitation.peer
        if peers[fingerprint]?.outgoingInvitation == id { peers[fingerprint]!.outgoingInvitation = nil }
        peers[fingerprint]?.outbox.removeControl { $0 == .invite(id) }
        var final = outcome
        let crossed = incoming.filter { $0.value.peer == fingerprint && $0.value.state == .crossedWinner }.keys.sorted()
        for other in crossed {
            if final == .accepted {
                declineIncoming(other, reason: .crossed)
            } else if links.values.contains(where: { $0.peer == fingerprint }), canAdopt(incoming[other]!.session, excluding: fingerprint),
                hasRoom(excluding: fingerprint)
            {
                acceptIncoming(other)
                final = .accepted
            } else {
                declineIncoming(other, reason: hasRoom(excluding: fingerprint) ? .declined : .sessionFull)
            }
        }
        if final != .accepted, var record = peers[fingerprint] {
            if !record.isMember { record.lostReason = "invitation \(final)" }
            if invitation.automatic {
                switch final {
                case .sessionFull:
                    record.autoBlocked = true
                case .failed:
                    // The invitation never reached the peer (a dial that failed, a link that
                    // broke): try again soon, as a peer that is just starting may not listen yet.
                    record.autoFailures += 1
                    record.autoRetryAt =
                        now + SessionPolicy.automaticRetryDelay(afterFailures: record.autoFailures, invitationTimeout: policy.invitationTimeout)
                default:
                    // The peer said no, or did not answer: leave it alone for a while.
                    record.autoRetryAt = now + policy.invitationTimeout
                }
            }
            peers[fingerprint] = record
        }
        if !invitation.automatic, let peer = peers[fingerprint]?.id {
            emit(.invitationResult(id, peer: peer, final))
        }
    }

    /// `fingerprint` is now a member: joins, announcements and invitations about it are settled.
    mutating func becomeMember(_ fingerprint: Fingerprint) {
        var record = peers[fingerprint]!
        let pending = record.pendingJoin
        record.isMember = true
        record.joiningDeadline = nil
        record.announcedDeadline = nil
        record.pendingJoin = nil
        record.lostReason = nil
        record.autoRetryAt = nil
        record.autoFailures = 0
        peers[fingerprint] = record
        if let pending { replyToJoin(from: fingerprint, on: pending.link) }
        if let own = record.outgoingInvitation { resolveOutgoing(own, .accepted) }
        for id in incoming.filter({ $0.value.peer == fingerprint }).keys.sorted() {
            let invitation = incoming[id]!
            if invitation.state == .awaitingApp {
                closedIncoming.insert(
                    PeerLinkError(.invalidParameter, "\(id) from \(record.id) was accepted automatically: the peer is already connected"),
                    for: id)
                emit(.invitationCancelled(id, from: record.id, reason: .alreadyConnected))
            }
            incoming[id] = nil
            answer(fingerprint, wireID: invitation.wireID, with: .accepted)
        }
    }

    /// `fingerprint`, a peer that is here (its link is up), asks for a place in a session that
    /// has none: members whose every link is gone and who are only waited for (their reconnect
    /// grace) give theirs up, the longest away first, until there is one. Otherwise peers that
    /// join and drop their links at once (a hostile peer's throwaway keys) would keep every
    /// newcomer out for as long as they keep doing it.
    mutating func yieldPlacesOfAbsentMembers(to fingerprint: Fingerprint) {
        while !hasRoom(excluding: fingerprint) || isFullOfMembers(excluding: fingerprint) {
            let absent = peers.filter { key, record in
                key != fingerprint && record.isMember && record.links.isEmpty && record.reconnectDeadline != nil
            }
            guard let away = absent.min(by: { ($0.value.reconnectDeadline!, $0.key) < ($1.value.reconnectDeadline!, $1.key) })?.key else { return }
            peers[away]!.reconnectDeadline = nil
            peers[away]!.redialAt = nil
            lose(away, reason: "\(peers[away]!.id)'s link was lost and the session was full: its place went to \(peers[fingerprint]?.id.description ?? "a peer that is here")")
        }
    }

    /// The pair's links are all gone (or the peer left): everything in progress with it ends.
    mutating func lose(_ fingerprint: Fingerprint, reason: String) {
        guard var record = peers[fingerprint] else { return }
        let wasMember = record.isMember
        record.isMember = false
        record.joiningDeadline = nil
        record.announcedDeadline = nil
        record.pendingJoin = nil
        record.expectingRoster = false
        record.replacement = nil
        record.reconnectDeadline = nil
        record.redialAt = nil
        record.upgradeSeenAt = nil
        record.announcedLink = nil
        bufferedMessageBytes -= record.reassembly.bufferedBytes
        record.reassembly = MessageReassembly()
        record.outbox.removeAll()
        record.signalled = false
        record.lostReason = reason
        if wasMember, isAutomatic { record.autoRetryAt = now }
        peers[fingerprint] = record
        for id in incoming.filter({ $0.value.peer == fingerprint }).keys.sorted() {
            let invitation = incoming.removeValue(forKey: id)!
            if invitation.state == .awaitingApp {
                closedIncoming.insert(PeerLinkError(.cancelled, "\(id) from \(record.id) was cancelled: \(reason)"), for: id)
                emit(.invitationCancelled(id, from: record.id, reason: .peerGone(reason)))
            }
        }
        if let own = record.outgoingInvitation { resolveOutgoing(own, .failed(reason)) }
        peers[fingerprint]!.lostReason = reason
    }

    // MARK: - Links

    /// Closes `link` (the owner is told with `.closeLink`) and forgets it.
    mutating func close(_ link: LinkID, code: GoAwayCode, reason: String) {
        guard links[link] != nil else { return }
        emit(.closeLink(link, code: code, reason: reason))
        removeLink(link, code: code, reason: reason)
    }

    /// Forgets `link`. A pair left without links is lost, unless the link was closed as a
    /// duplicate or the local dial to the peer is under way: then its replacement is awaited.
    mutating func removeLink(_ link: LinkID, code: GoAwayCode, reason: String, lost: Bool = false) {
        guard let linkRecord = links.removeValue(forKey: link), var record = peers[linkRecord.peer] else { return }
        record.links.removeAll { $0 == link }
        if record.pendingJoin?.link == link { record.pendingJoin = nil }
        // automatic mode's fallback gives the inviting side its time again
        if record.links.isEmpty, record.foundAt != nil { record.foundAt = now }
        guard record.links.isEmpty else {
            peers[linkRecord.peer] = record
            return
        }
        let waitedFor = record.isMember && policy.reconnectGrace > .zero && (lost || Self.isRecoverable(code))
        if record.dialing, code != .duplicateLink, waitedFor {
            // The member's last link failed while a dial to it is out (an upgrade, say): its
            // grace starts now, and that dial's end decides what comes next (``dialFailed``).
            if record.reconnectDeadline == nil { record.reconnectDeadline = now + policy.reconnectGrace }
            peers[linkRecord.peer] = record
            return
        }
        if code == .duplicateLink || record.dialing {
            if record.replacement == nil { record.replacement = AwaitedReplacement(deadline: now + policy.replacementGrace) }
            if code == .duplicateLink { record.replacement?.keptLink = true }
            peers[linkRecord.peer] = record
            return
        }
        if waitedFor {
            // The member stays; its frames wait (and are kept) for the next link, whichever
            // transport brings it. Both sides dial; the duplicate tie-break keeps one link.
            if record.reconnectDeadline == nil { record.reconnectDeadline = now + policy.reconnectGrace }
            record.dialing = true
            record.redialAt = nil
            peers[linkRecord.peer] = record
            emit(.dial(record.id, endpoints: rankedEndpoints(record)))
            return
        }
        peers[linkRecord.peer] = record
        if record.joiningDeadline != nil, !record.isMember {
            emit(.joinRefused(record.id, code: code, reason: reason))
        }
        lose(linkRecord.peer, reason: reason)
    }

    /// Whether a member whose last link ended with `code` is waited for (dialled again) rather
    /// than lost at once: not when it left on purpose or was refused.
    static func isRecoverable(_ code: GoAwayCode) -> Bool {
        switch code {
        case .normal, .identityMismatch, .sessionFull, .unsupportedVersion, .serviceMismatch, .encryptionMismatch, .protocolError,
            .resourceLimit:
            false
        case .keepAliveTimeout, .handshakeFailed, .duplicateLink, .internalError, .other:
            true
        }
    }

    /// The peer started anew (its hello names another incarnation): the old one leaves, with
    /// everything that was under way with it.
    mutating func restarted(_ peer: PeerID) {
        guard var record = peers[peer.fingerprint] else { return }
        // An invitation that never went out on a link of the old run (that run had left, and
        // the app invited the peer again) is for the new run: it goes on.
        let forNewRun = record.outgoingInvitation.flatMap { id -> InvitationID? in
            guard let invitation = outgoing[id] else { return nil }
            if let sentOn = invitation.sentOn, links[sentOn] != nil { return nil }  // it went out to the old run
            return id
        }
        // So is a join under way with it (an announcement, a roster naming it): the session knows
        // the peer, not its runs, and the old run was no member. (Read before the old run's links
        // close, which may forget them.)
        let (announced, joining) = record.isMember ? (nil, nil) : (record.announcedDeadline, record.joiningDeadline)
        if forNewRun != nil { peers[peer.fingerprint]!.outgoingInvitation = nil }
        for link in record.links { close(link, code: .normal, reason: "\(peer) started anew") }
        record = peers[peer.fingerprint]!
        record.reconnectDeadline = nil
        record.redialAt = nil
        bufferedMessageBytes -= record.reassembly.bufferedBytes
        record.reassembly = MessageReassembly()
        record.nextMessageID = 1
        // The answers given to the old run's invitations: the new run numbers its own from the
        // start again, and an INVITE of it must not be taken for the old one sent anew.
        record.answers.removeAll()
        peers[peer.fingerprint] = record
        lose(peer.fingerprint, reason: "\(peer) started anew (its process restarted)")
        peers[peer.fingerprint]!.announcedDeadline = announced
        peers[peer.fingerprint]!.joiningDeadline = joining
        if let forNewRun, outgoing[forNewRun] != nil {
            peers[peer.fingerprint]!.outgoingInvitation = forNewRun
            outgoing[forNewRun]!.sentOn = nil
            peers[peer.fingerprint]!.outbox.enqueue(.invite(forNewRun))
        }
    }

    /// The peer's endpoints, best ranked transport first.
    func rankedEndpoints(_ record: PeerRecord) -> [Endpoint] {
        record.endpoints.enumerated().sorted { lhs, rhs in
            let (left, right) = (policy.rank(of: lhs.element.transport), policy.rank(of: rhs.element.transport))
            return left != right ? left > right : lhs.offset < rhs.offset
        }.map(\.element)
    }

    /// The rank of the link a peer's frames go on now (nil without one).
    func currentRank(_ record: PeerRecord) -> Int? {
        sendLink(for: record).flatMap { links[$0]?.rank }
    }

    /// The peer's endpoints on a transport ranked above its current link's.
    func betterEndpoints(_ record: PeerRecord) -> [Endpoint] {
        guard let rank = currentRank(record) else { return [] }
        return rankedEndpoints(record).filter { policy.rank(of: $0.transport) > rank }
    }

    /// Whether the peer is known at an endpoint ranked above its current link's (what
    /// ``betterEndpoints(_:)`` tells, without building the list: it is asked on every send).
    func hasBetterEndpoint(_ record: PeerRecord) -> Bool {
        guard let rank = currentRank(record) else { return false }
        return record.endpoints.contains { policy.rank(of: $0.transport) > rank }
    }

    /// A member found on a better ranked transport than its link's: the upgrade is due at once
    /// on the side with the smaller fingerprint, after ``SessionPolicy/automaticFallback`` on
    /// the other (in case the first cannot dial it).
    mutating func noteUpgrade(_ fingerprint: Fingerprint) {
        guard var record = peers[fingerprint] else { return }
        if record.isMember, hasBetterEndpoint(record) {
            if record.upgradeSeenAt == nil { record.upgradeSeenAt = now }
        } else {
            record.upgradeSeenAt = nil
        }
        peers[fingerprint] = record
    }

    func upgradeDeadline(_ record: PeerRecord) -> Duration? {
        guard let seen = record.upgradeSeenAt, record.isMember, !record.links.isEmpty, hasBetterEndpoint(record)
        else { return nil }
        let wait = localPeer.fingerprint < record.id.fingerprint ? Duration.zero : policy.automaticFallback
        return max(seen + wait, record.redialAt ?? .zero)
    }

    /// The tie-break for duplicate links: keep the best ranked transport (an upgrade), and of
    /// links on it the one dialled by the peer with the smaller fingerprint. Each side decides
    /// from the same facts (transports, who dialled which link), so both keep the same one
    /// without exchanging anything. Of several links dialled by the local side, the oldest is
    /// kept; several links dialled by the peer are the peer's to close.
    mutating func collapseDuplicates(of fingerprint: Fingerprint) {
        guard let record = peers[fingerprint] else { return }
        let best = record.links.map { links[$0]!.rank }.max() ?? 0
        for link in record.links where links[link]!.rank < best {
            close(link, code: .duplicateLink, reason: "replaced by a link on a faster transport to \(record.id)")
        }
        let remaining = peers[fingerprint]!.links
        let mine = remaining.filter { links[$0]!.dialedLocally }
        let theirs = remaining.filter { !links[$0]!.dialedLocally }
        var doomed = Array(mine.dropFirst())
        let localIsSmaller = localPeer.fingerprint < fingerprint
        if localIsSmaller, !mine.isEmpty { doomed += theirs }
        if !localIsSmaller, !theirs.isEmpty { doomed += mine.prefix(1) }
        let kept = localIsSmaller ? "this peer's" : "the peer's"
        for link in doomed {
            close(
                link, code: .duplicateLink,
                reason: "duplicate link with \(record.id): the link dialled by the smaller fingerprint (\(kept)) is kept")
        }
    }

    /// The link queued frames to `record` go out on: a link dialled by the smaller fingerprint
    /// if there is one; otherwise the oldest link, except that the side with the smaller
    /// fingerprint holds its frames back while its own dial is under way (that link will win).
    func sendLink(for record: PeerRecord) -> LinkID? {
        let best = record.links.compactMap { links[$0]?.rank }.max() ?? 0
        let candidates = record.links.filter { links[$0]?.rank == best }
        let localIsSmaller = localPeer.fingerprint < record.id.fingerprint
        if let preferred = candidates.first(where: { links[$0]!.dialedLocally == localIsSmaller }) { return preferred }
        // an upgrade or reconnect dial under way does not hold back frames on a link in use
        if localIsSmaller, record.dialing, record.reconnectDeadline == nil, record.upgradeSeenAt == nil, !record.isMember {
            return nil
        }
        return candidates.first
    }

    // MARK: - Control messages

    mutating func receive(_ message: ControlMessage, from fingerprint: Fingerprint, on link: LinkID) {
        switch message {
        case .invite(let wireID, let session, let timeout, let context):
            receiveInvite(wireID, session: session, timeout: .milliseconds(Int64(timeout)), context: context, from: fingerprint)
        case .accept(let wireID):
            receiveAccept(wireID, from: fingerprint)
        case .decline(let wireID, let reason):
            receiveDecline(wireID, reason: reason, from: fingerprint)
        case .members(let session, let members):
            receiveMembers(members, session: session, from: fingerprint)
        case .join(let session):
            receiveJoin(session, from: fingerprint, on: link)
        case .leave(let session):
            guard session == sessionID, peers[fingerprint]!.isMember else { return }
            peers[fingerprint]!.isMember = false
            peers[fingerprint]!.autoBlocked = true
            peers[fingerprint]!.outbox.removeAll()
            peers[fingerprint]!.lostReason = "it left the session"
        }
    }

    mutating func receiveInvite(_ wireID: UInt32, session: SessionID, timeout: Duration, context: [UInt8], from fingerprint: Fingerprint) {
        let record = peers[fingerprint]!
        // The same INVITE again (sent anew on a replacement link): the same answer again.
        if let given = record.answer(for: wireID) {
            answer(fingerprint, wireID: wireID, with: given)
            return
        }
        if incoming.values.contains(where: { $0.peer == fingerprint && $0.wireID == wireID }) { return }
        if record.isMember {
            if session == sessionID {
                answer(fingerprint, wireID: wireID, with: .accepted)
                peers[fingerprint]!.expectingRoster = true
            } else {
                refuse(wireID, from: fingerprint, reason: .declined, detail: "it is connected already, in another session")
            }
            return
        }
        if session == sessionID { yieldPlacesOfAbsentMembers(to: fingerprint) }
        if isFullOfMembers(excluding: fingerprint) {
            refuse(
                wireID, from: fingerprint, reason: .sessionFull,
                detail: "session is full: \(policy.maximumPeers) peers including this one")
            return
        }
        if !canAdopt(session, excluding: fingerprint) {
            refuse(wireID, from: fingerprint, reason: .declined, detail: "this peer is in another session with other members")
            return
        }
        let id = InvitationID(nextInvitationNumber)
        nextInvitationNumber = nextInvitationNumber == .max ? 1 : nextInvitationNumber + 1
        var invitation = IncomingInvitation(
            peer: fingerprint, wireID: wireID, session: session, context: context, deadline: now + timeout, state: .awaitingApp)
        if record.outgoingInvitation != nil {
            // Crossed invitations: the smaller fingerprint's invitation wins.
            if localPeer.fingerprint < fingerprint {
                invitation.state = .crossedWinner
                incoming[id] = invitation
            } else {
                invitation.state = .awaitingRoom
                incoming[id] = invitation
                if hasRoom(excluding: fingerprint) { acceptIncoming(id) }
            }
            return
        }
        if isAutomatic {
            invitation.state = .awaitingRoom
            incoming[id] = invitation
            if hasRoom(excluding: fingerprint) { acceptIncoming(id) }
            return
        }
        incoming[id] = invitation
        emit(.invitationReceived(id, from: record.id, context: context))
    }

    /// Declines without asking the app, and says so in a diagnostic event.
    mutating func refuse(_ wireID: UInt32, from fingerprint: Fingerprint, reason: DeclineReason, detail: String) {
        answer(fingerprint, wireID: wireID, with: .declined(reason))
        emit(.invitationRefused(from: peers[fingerprint]!.id, reason: reason, detail: detail))
    }

    mutating func receiveAccept(_ wireID: UInt32, from fingerprint: Fingerprint) {
        let id = InvitationID(wireID)
        guard let invitation = outgoing[id], invitation.peer == fingerprint else {
            // Too late: this side gave up on it, the invitee thinks it is in. Tell it otherwise.
            let key = WireInvitationKey(peer: fingerprint, wireID: wireID)
            if timedOutOutgoing[key] != nil, !peers[fingerprint]!.isMember {
                timedOutOutgoing.remove(key)
                peers[fingerprint]!.outbox.enqueue(.message(.leave(session: sessionID)))
            } else if peers[fingerprint]!.isMember {
                // Settled here some other way; the invitee still waits for its roster.
                sendRoster(to: fingerprint)
            }
            return
        }
        let wasMember = peers[fingerprint]!.isMember
        becomeMember(fingerprint)
        // The roster for the newcomer, then the newcomer announced to every other member.
        let others = sendRoster(to: fingerprint)
        guard !wasMember else { return }
        let newcomer = memberEntry(peers[fingerprint]!.id)
        for member in others {
            peers[member.fingerprint]!.outbox.enqueue(.message(.members(session: sessionID, members: [newcomer])))
        }
    }

    /// Queues `MEMBERS` with every member but `fingerprint` for it; returns those members.
    @discardableResult
    mutating func sendRoster(to fingerprint: Fingerprint) -> [PeerID] {
        let others = peers.values.filter { $0.isMember && $0.id.fingerprint != fingerprint }.map(\.id)
            .sorted { $0.fingerprint < $1.fingerprint }
        peers[fingerprint]!.outbox.enqueue(.message(.members(session: sessionID, members: others.map(memberEntry))))
        return others
    }

    mutating func receiveDecline(_ wireID: UInt32, reason: DeclineReason, from fingerprint: Fingerprint) {
        let id = InvitationID(wireID)
        guard let invitation = outgoing[id], invitation.peer == fingerprint else { return }
        switch reason {
        case .crossed: outgoing[id]!.crossed = true
        case .sessionFull: resolveOutgoing(id, .sessionFull)
        case .timedOut: resolveOutgoing(id, .timedOut)
        case .declined, .other: resolveOutgoing(id, .declined)
        }
    }

    /// `MEMBERS`: from the inviter just after the local peer accepted, the roster (join every
    /// member in it); from any member later, an announcement (let these newcomers join).
    mutating func receiveMembers(_ members: [ControlMessage.Member], session: SessionID, from fingerprint: Fingerprint) {
        guard peers[fingerprint]!.isMember else { return }
        let isRoster = peers[fingerprint]!.expectingRoster
        if isRoster {
            peers[fingerprint]!.expectingRoster = false
            if session != sessionID {
                // The inviter moved to another session meanwhile; follow it while alone with it.
                guard !isAutomatic, !peers.contains(where: { $0.key != fingerprint && $0.value.tiesSession }) else { return }
                sessionID = session
            }
        } else if session != sessionID {
            return
        }
        for member in members.sorted(by: { $0.fingerprint < $1.fingerprint }) where member.fingerprint != localPeer.fingerprint {
            var record = peers[member.fingerprint] ?? PeerRecord(id: member.peerID)
            guard !record.isMember else { continue }
            if record.links.isEmpty { record.id = member.peerID }
            let holdsPlace = record.holdsPlace
            peers[member.fingerprint] = record
            guard holdsPlace || hasRoom(excluding: member.fingerprint) else { continue }
            peers[member.fingerprint]!.announcedDeadline = now + policy.joinTimeout
            if isRoster {
                peers[member.fingerprint]!.joiningDeadline = now + policy.joinTimeout
                dialIfNeeded(member.fingerprint)
            }
        }
    }

    mutating func receiveJoin(_ session: SessionID, from fingerprint: Fingerprint, on link: LinkID) {
        // From a member too: a member joins this session again on a new link, never another.
        guard session == sessionID else {
            close(link, code: .protocolError, reason: "JOIN for session \(session), but this peer is in session \(sessionID)")
            return
        }
        if peers[fingerprint]!.isMember {
            replyToJoin(from: fingerprint, on: link)
            return
        }
        peers[fingerprint]!.pendingJoin = .init(link: link, deadline: now + policy.joinTimeout)
        _ = settleJoin(of: fingerprint)
    }

    /// A waiting `JOIN`: accepted once the peer is announced (or the local peer joins it too, or
    /// in automatic mode) and there is a place; refused with `GO_AWAY` *session full* when there
    /// is no place. Returns whether it was settled.
    mutating func settleJoin(of fingerprint: Fingerprint) -> Bool {
        guard peers[fingerprint]?.pendingJoin != nil else { return false }
        if !peers[fingerprint]!.holdsPlace { yieldPlacesOfAbsentMembers(to: fingerprint) }
        guard let record = peers[fingerprint], let pending = record.pendingJoin else { return false }
        guard links[pending.link] != nil else {
            peers[fingerprint]!.pendingJoin = nil
            return true
        }
        if !record.holdsPlace, !hasRoom(excluding: fingerprint) || isFullOfMembers(excluding: fingerprint) {
            peers[fingerprint]!.pendingJoin = nil
            close(
                pending.link, code: .sessionFull,
                reason: "session is full: \(policy.maximumPeers) peers including this one are in or on their way in")
            return true
        }
        let allowed = record.announcedDeadline != nil || record.joiningDeadline != nil || isAutomatic
        guard allowed else { return false }
        becomeMember(fingerprint)
        return true
    }

    /// Answers a `JOIN` with one, unless this side sent a `JOIN` on that link already (then the
    /// peer's was the answer) or one is queued.
    mutating func replyToJoin(from fingerprint: Fingerprint, on link: LinkID) {
        guard let linkRecord = links[link], !linkRecord.joinSent, !peers[fingerprint]!.outbox.contains(.join) else { return }
        peers[fingerprint]!.outbox.enqueue(.join)
    }

    // MARK: - Settling

    /// ``settle()`` after an input that only queued messages for `involved` peers or took
    /// messages from them (no invitation, join, link or place changed): the rules are skipped
    /// while ``rulesQuietUntil`` says the last full settle left them nothing to do until a later
    /// time, and only frames queued for the involved peers are announced: every peer is
    /// otherwise as the last settle left it. Every message sent or received comes here, so this
    /// is the session's fast path.
    mutating func settle(movingMessagesOf involved: [Fingerprint]) {
        guard now < rulesQuietUntil, !settlesEveryInputFully else {
            settle()
            return
        }
        for fingerprint in involved.count > 1 ? involved.sorted() : involved { announceFrames(of: fingerprint) }
        notePurposes()
    }

    /// ``settle(movingMessagesOf:)`` for one peer (most inputs): no list to build; `index`,
    /// where its record lies, when the caller has it.
    mutating func settle(movingMessagesOf fingerprint: Fingerprint, at index: [Fingerprint: PeerRecord].Index? = nil) {
        guard now < rulesQuietUntil, !settlesEveryInputFully else {
            settle()
            return
        }
        announceFrames(of: fingerprint, at: index)
        notePurposes()
    }

    /// What `pump` would do for a peer whose links, invitations and joins are as the last
    /// settle left them: announce frames queued for its send link.
    private mutating func announceFrames(of fingerprint: Fingerprint, at known: [Fingerprint: PeerRecord].Index? = nil) {
        // in place (see `inPlace`): this runs for every message
        guard let index = known ?? peers.index(forKey: fingerprint),
            let link = inPlace(index, { record -> LinkID? in
                guard let link = record.sendLink, !record.signalled, !record.outbox.isEmpty else { return nil }
                record.signalled = true
                return link
            })
        else { return }
        emit(.framesReady(link))
    }

    /// What `reportStates` does after an input that changed no peer's state: each peer with
    /// business had it until now.
    private mutating func notePurposes() {
        let now = now
        var index = peers.values.startIndex
        while index != peers.values.endIndex {
            let marked = inPlace(index) { record in
                guard record.isMember else { return false }
                record.purposeAt = now
                return true
            }
            if !marked, hasBusiness(peers.values[index]) { peers.values[index].purposeAt = now }
            peers.values.formIndex(after: &index)
        }
    }

    /// Until when the rules of ``settle()`` have nothing to do as long as only messages come
    /// in: never again without another input if no invitation waits for room, no join waits,
    /// and automatic mode has no peer to invite later; the earliest automatic retry or
    /// fallback when it has; now (not quiet) when anything waits.
    func rulesQuietTime() -> Duration {
        if incoming.values.contains(where: { $0.state == .awaitingRoom }) { return now }
        if peers.values.contains(where: { $0.pendingJoin != nil }) { return now }
        var quiet = Duration.seconds(Int64.max)
        guard isAutomatic else { return quiet }
        for (fingerprint, record) in peers {
            if let due = automaticInvitationDue(fingerprint, record) { quiet = min(quiet, due) }
        }
        return quiet
    }

    /// When automatic mode invites `record` (greater peers at once; smaller ones when they have
    /// not come by themselves, after the fallback), or after its retry time; nil while its
    /// state rules it out (not found, blocked, holding a place, joining, being replaced, in an
    /// invitation, no room).
    func automaticInvitationDue(_ fingerprint: Fingerprint, _ record: PeerRecord) -> Duration? {
        guard record.found, !record.autoBlocked, !record.holdsPlace, record.pendingJoin == nil,
            record.replacement == nil, !incoming.values.contains(where: { $0.peer == fingerprint }),
            hasRoom(excluding: fingerprint)
        else { return nil }
        var due = record.autoRetryAt ?? .zero
        if fingerprint < localPeer.fingerprint {
            guard let fallback = automaticFallbackDeadline(record) else { return nil }
            due = max(due, fallback)
        }
        return due
    }

    /// Run after every input: settles what waited for a place, makes automatic invitations,
    /// picks each peer's send link (re-sending what a lost link may have swallowed), announces
    /// ready links, and reports state changes.
    mutating func settle() {
        nextDeadlineMayBeEarlier = true
        var rounds = 0
        var changed = true
        // The peers in order, sorted once (every message sent or received comes here); sorted
        // again only if a rule below added or removed one.
        var order = peers.keys.sorted()
        func sortedPeers() -> [Fingerprint] {
            if order.count != peers.count { order = peers.keys.sorted() }
            return order
        }
        while changed, rounds < 64 {
            changed = false
            rounds += 1
            for id in incoming.keys.sorted() {
                guard let invitation = incoming[id], invitation.state == .awaitingRoom else { continue }
                if isFullOfMembers(excluding: invitation.peer) {
                    declineIncoming(id, reason: .sessionFull)
                    emit(
                        .invitationRefused(
                            from: peers[invitation.peer]!.id, reason: .sessionFull,
                            detail: "session is full: \(policy.maximumPeers) peers including this one"))
                    changed = true
                } else if hasRoom(excluding: invitation.peer) {
                    acceptIncoming(id)
                    changed = true
                }
            }
            if peers.values.contains(where: { $0.pendingJoin != nil }) {
                for fingerprint in sortedPeers() where peers[fingerprint]?.pendingJoin != nil {
                    if settleJoin(of: fingerprint) { changed = true }
                }
            }
            if isAutomatic {
                for fingerprint in sortedPeers() {
                    guard let record = peers[fingerprint], let due = automaticInvitationDue(fingerprint, record), now >= due
                    else { continue }
                    peers[fingerprint]!.autoRetryAt = nil
                    _ = startInvitation(to: fingerprint, context: [], timeout: policy.invitationTimeout, automatic: true)
                    changed = true
                }
            }
        }
        for fingerprint in sortedPeers() where peers[fingerprint] != nil { pump(fingerprint) }
        rulesQuietUntil = rulesQuietTime()
        reportStates()
    }

    /// Notes when each peer last had business with the session and reports the peers whose
    /// state changed, in the peers' order.
    mutating func reportStates() {
        // Every input comes here (each message sent or received): the records are updated where
        // they lie, not copied out and back, and the rare state changes are reported in the
        // peers' order.
        var changes: [(fingerprint: Fingerprint, peer: PeerID, state: PeerState, reason: String?)] = []
        var index = peers.values.startIndex
        while index != peers.values.endIndex {
            if hasBusiness(peers.values[index]) { peers.values[index].purposeAt = now }
            let state = derivedState(peers.values[index])
            if state != peers.values[index].reported {
                peers.values[index].reported = state
                let reason = state == .notConnected ? (peers.values[index].lostReason ?? "no longer in the session") : nil
                changes.append((peers.keys[index], peers.values[index].id, state, reason))
            }
            if peers.values[index].lostReason != nil { peers.values[index].lostReason = nil }
            peers.values.formIndex(after: &index)
        }
        for change in changes.sorted(by: { $0.fingerprint < $1.fingerprint }) {
            emit(.peerStateChanged(change.peer, change.state, reason: change.reason))
        }
    }

    /// When automatic mode's fallback invites `record`, a found peer with a smaller fingerprint
    /// that has not come to the local peer (no link, no dial, no place held); nil when it does not apply.
    func automaticFallbackDeadline(_ record: PeerRecord) -> Duration? {
        guard record.id.fingerprint < localPeer.fingerprint, record.found, let foundAt = record.foundAt,
            record.links.isEmpty, !record.dialing, !record.holdsPlace
        else { return nil }
        return foundAt + policy.automaticFallback
    }

    /// Picks the peer's send link. When it changes, partly sent messages begin again on the new
    /// one, and an `INVITE` or `JOIN` that went out on a link now gone is sent again.
    mutating func pump(_ fingerprint: Fingerprint) {
        var record = peers[fingerprint]!
        let chosen = sendLink(for: record)
        if chosen != record.sendLink {
            // Chunks taken already went to the pair's continuity (kept until acknowledged, sent
            // again on the next link): messages go on where they were.
            record.sendLink = chosen
            record.signalled = false
        }
        if let chosen, record.isMember {
            if let announced = record.announcedLink, announced != chosen { emit(.event(.linkChanged(record.id, chosen))) }
            record.announcedLink = chosen
            // A member on a link ranked below an endpoint it is known at (after a failover, or
            // an upgrade dial that failed) is dialled there again: an upgrade is due once more.
            if record.upgradeSeenAt == nil, !record.dialing, hasBetterEndpoint(record) { record.upgradeSeenAt = now }
        }
        guard let link = chosen else {
            peers[fingerprint] = record
            return
        }
        if let own = record.outgoingInvitation, let invitation = outgoing[own], !invitation.crossed,
            invitation.sentOn.map({ links[$0] == nil }) ?? false, !record.outbox.contains(.invite(own))
        {
            record.outbox.enqueue(.invite(own))
        }
        if record.joiningDeadline != nil, !record.isMember, !links[link]!.joinSent, !record.outbox.contains(.join) {
            record.outbox.enqueue(.join)
        }
        if !record.outbox.isEmpty, !record.signalled {
            record.signalled = true
            emit(.framesReady(link))
        }
        peers[fingerprint] = record
    }
}
