import Logging
@_spi(Runtime) import PeerLinkCore

// The runtime behind PeerSession: one task group holding the listener's accept loop, the
// session timer, every dial and every link (each with a writer of its own). Every input is
// applied to the state machine under the core lock and its actions decided at once; closing a
// link is done with the lock released, and so is everything that wakes a task (resumes, events,
// streams, new work: the core's `Outbox`, in order), since cancellation handlers take the lock.

extension PeerSession {
    // MARK: - Running

    /// Runs the session until ``disconnect()`` or until the calling task is cancelled: accepts
    /// incoming links, dials, drives every link and the session's timers. Cancellation closes
    /// every link with `GO_AWAY` 0 at once; after ``disconnect()`` links get a few seconds to
    /// say goodbye. Returns once everything is closed; ``events`` finishes then.
    /// Calling it a second time returns at once.
    public func run() async {
        let starts = core.withLock { core -> Bool in
            guard core.phase == .idle else { return false }
            core.phase = .running
            return true
        }
        guard starts else {
            logger.debug("run() called on a session that is running or over", metadata: localMetadata)
            return
        }
        logger.info(
            "session running",
            metadata: localMetadata.merging(
                [
                    "session.automatic": "\(configuration.policy.automatic)",
                    "session.encryption": "\(configuration.encryption)",
                    "session.listening": "\(listeners.isEmpty ? "no" : listeners.flatMap(\.localEndpoints).map(\.description).joined(separator: ", "))",
                ], uniquingKeysWith: { $1 }))
        await withDiscardingTaskGroup { group in
            for listener in listeners {
                group.addTask { await self.acceptLoop(listener) }
            }
            group.addTask { await self.timerLoop() }
            for await work in spawns {
                group.addTask { await work() }
            }
            // disconnect() ended the stream of work, or this task was cancelled.
            beginStopping(reason: "\(localPeer.displayName) stopped its session")
            if !(await waitForLinks()) {
                logger.info(
                    "links did not close within \(Self.shutdownGrace); cutting them", metadata: localMetadata)
            }
            group.cancelAll()
        }
        let (leftovers, channels) = core.withLockThenDeliver { core -> ([Link], [PeerChannel]) in
            core.phase = .over
            let links = core.links.values.map(\.link)
            core.links = [:]
            let channels = Array(core.channels.values)
            core.channels = [:]
            return (links, channels)
        }
        for link in leftovers { link.close(code: .normal, reason: "\(localPeer.displayName) stopped its session") }
        for channel in channels {
            channel.close(PeerLinkError(.notConnected, "\(localPeer.displayName) stopped its session"))
            channel.deliverPending()
        }
        // Through the outbox: after every event queued before.
        core.withLockThenDeliver { core in core.outbox.add { self.finishStreams() } }
        logger.info("session stopped", metadata: localMetadata)
    }

    /// Starts leaving: the state machine disconnects (`GO_AWAY` 0 on its links, every peer not
    /// connected), links still in their handshake are closed, dials and accepts give up.
    /// Returns whether ``run()`` is running or stopping (and will fire ``finished``).
    @discardableResult
    func beginStopping(reason: String) -> Bool {
        let now = time.now()
        let (effects, running) = core.withLockThenDeliver { core -> ([Effect], Bool) in
            switch core.phase {
            case .idle:
                core.phase = .over
                let effects = carryOut(core.machine.disconnect(at: now), in: &core)
                core.outbox.add {
                    self.stopped.fire()
                    self.spawner.finish()
                    self.finishStreams()
                }
                return (effects, false)
            case .running:
                core.phase = .stopping
                let known = Set(core.machine.allLinks)
                handOverQueuedFrames(in: &core)
                var effects = carryOut(core.machine.disconnect(at: now), in: &core)
                for (id, entry) in core.links where !known.contains(id) {
                    effects.append(.close(entry.link, code: .normal, reason: reason))
                }
                core.wakeTimer()
                if core.liveLinks == 0 { core.outbox.add { self.linksDrained.fire() } }
                // After the work queued before: run()'s loop takes it all, then ends.
                core.outbox.add {
                    self.stopped.fire()
                    self.spawner.finish()
                }
                return (effects, true)
            case .stopping:
                return ([], true)
            case .over:
                return ([], false)
            }
        }
        perform(effects)
        return running
    }

    /// Queues on each link every frame the state machine still holds for it (messages the app
    /// sent that the link's writer has not taken yet), ahead of the `GO_AWAY` that leaving puts
    /// on it, so messages sent just before ``disconnect()`` still go out — the state machine
    /// drops what it holds when it disconnects. The links have until ``shutdownGrace`` to write them.
    private func handOverQueuedFrames(in core: inout SessionCore) {
        for id in core.machine.allLinks {
            guard let entry = core.links[id] else { continue }
            let link = entry.link
            let channel = entry.established.flatMap { core.channels[$0.remote.fingerprint] }
            while let frame = core.machine.nextFrame(for: id) {
                if frame.type.isSequenced {
                    channel?.enqueue([frame])
                    continue
                }
                do throws(PeerLinkError) {
                    try link.enqueueLeavingDelivery(frame)
                } catch {
                    break
                }
            }
            core.outbox.add { link.deliverPending() }
            if let channel { core.outbox.add { channel.deliverPending() } }
        }
    }

    /// The end of ``events`` and ``incomingStreams``, then ``finished`` fires. Delivered
    /// through the outbox, after everything queued before.
    private func finishStreams() {
        eventSink.finish()
        streamSink.finish()
        finished.fire()
    }

    /// Waits until every link task ended, at most ``shutdownGrace``; false when time ran out.
    private func waitForLinks() async -> Bool {
        let deadline = time.now() + Self.shutdownGrace
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await self.linksDrained.wait()
                return true
            }
            group.addTask {
                try? await self.time.sleep(until: deadline)
                return false
            }
            let first = await group.next() ?? true
            group.cancelAll()
            return first || linksDrained.isFired
        }
    }

    /// Hands work to the task group of ``run()``; false once it takes no more.
    @discardableResult
    private func spawn(_ work: @escaping @Sendable () async -> Void) -> Bool {
        if case .terminated = spawner.yield(work) { return false }
        return true
    }

    // MARK: - Applying inputs

    /// Applies one input to the state machine under the lock, carries out its actions, and
    /// closes the links it closed once the lock is released.
    @discardableResult
    func apply<R: Sendable, E: Error>(
        linksMayChange: Bool = true, _ input: (inout SessionCore, Duration) throws(E) -> ([SessionAction], R)
    ) throws(E) -> R {
        let now = time.now()
        let (effects, result) = try core.withLockThenDeliver { core throws(E) -> ([Effect], R) in
            let (actions, result) = try input(&core, now)
            return (carryOut(actions, in: &core, linksMayChange: linksMayChange), result)
        }
        perform(effects)
        return result
    }

    /// Carries out actions under the lock: dials handed to the task group, writers woken and
    /// events yielded through the outbox (in order, once the lock is released); closes are
    /// returned for later.
    /// `linksMayChange`: false where the input cannot change which link carries a peer (a
    /// message sent), so the channels need no look.
    func carryOut(_ actions: consuming [SessionAction], in core: inout SessionCore, linksMayChange: Bool = true) -> [Effect] {
        var effects: [Effect] = []
        // links with frames announced whose write loop waits for them
        var idleWriters: [LinkID] = []
        var tally = MessageTally()
        // Each action moved out of the list, not copied: a message's bytes go on to the app's
        // event without a retain and a release on the way.
        var pending = actions
        for index in pending.indices {
            switch pending.take(at: index, leaving: .framesReady(LinkID(0))) {
            case .dial(let peer, let endpoints):
                guard core.phase.acceptsInput else { continue }
                var all = endpoints
                // A dial to a peer with a link already is an upgrade, to the better transports
                // the machine names: any other endpoint that answered would only duplicate the
                // link it has (and one whose dials failed lately would be tried first, so a
                // pair that failed over stayed off the LAN until the failures were forgotten).
                if core.machine.links(to: peer).isEmpty {
                    for endpoint in core.discovered[peer.fingerprint] ?? [] where !all.contains(endpoint) {
                        all.append(endpoint)
                    }
                }
                let targets = core.failedEndpoints.ordered(all, at: time.now())
                core.outbox.add { self.spawn { await self.dial(peer, endpoints: targets) } }
            case .framesReady(let id):
                guard let index = core.links.index(forKey: id) else { continue }
                if core.links.values[index].writerWaiter != nil {
                    idleWriters.append(id)
                } else {
                    core.links.values[index].framesPending = true
                }
            case .closeLink(let id, let code, let reason):
                guard let entry = core.links[id] else { continue }
                logger.debug(
                    "closing link", metadata: linkMetadata(id, entry).merging(["link.close.code": "\(code.rawValue)"], uniquingKeysWith: { $1 }))
                // Duplicates and idle links are dropped by both sides at about the same time:
                // only the side that dialled the link waits for the other's end of stream, or
                // both would wait for each other until the link's close timeout.
                let linger = entry.dialed != nil || core.phase != .running
                // A link another one replaces (an upgrade, a duplicate) closes once what it
                // carried is acknowledged, so nothing is written twice.
                var draining: PeerChannel?
                if let peer = entry.established?.remote, let channel = core.channels[peer.fingerprint],
                    core.machine.sendLink(to: peer) != nil, core.phase == .running
                {
                    draining = channel
                }
                effects.append(.close(entry.link, code: code, reason: reason, linger: linger, drainingFor: draining))
            case .event(let event):
                emit(consume event, in: &core, tally: &tally)
            }
        }
        tally.flush()
        if linksMayChange { syncChannels(&core) }
        for id in idleWriters where !takeFramesForIdleWriter(id, in: &core) {
            core.wakeWriter(id, returning: true)
        }
        core.wakeTimerIfNeeded()
        return effects
    }

    /// Does for `link`, whose write loop waits for frames, what that loop would do on being
    /// woken, here under the lock already held: takes the frames the state machine has for it
    /// and hands them to the peer's channel (or the link's own frame to the link), with the
    /// wake-ups after the lock. A message sent or an acknowledgement due then costs no hand-over
    /// to the loop's task. True when that was all; false when the loop must be woken after all:
    /// no room in the channel now (the loop waits for it), more frames than one take, a frame of
    /// the link's own (the loop waits for the link's room after it), or anything unusual.
    private func takeFramesForIdleWriter(_ id: LinkID, in core: inout SessionCore) -> Bool {
        guard let index = core.links.index(forKey: id), let peer = core.links.values[index].established?.remote,
            let channel = core.channels[peer.fingerprint], channel.isIdle
        else { return false }
        let link = core.links.values[index].link
        guard link.hasRoom else { return false }
        let frames = core.machine.nextFrames(for: id, upTo: Self.takeLimit)
        guard let last = frames.last else { return true }
        if !last.type.isSequenced {
            // the run ends with the link's own frame; the loop takes what follows it
            if frames.count > 1 {
                channel.enqueue(Array(frames.dropLast()))
                core.outbox.add { channel.deliverPending() }
            }
            do throws(PeerLinkError) {
                try link.enqueueLeavingDelivery(last)
            } catch {
                return false
            }
            core.outbox.add { link.deliverPending() }
            return false
        }
        channel.enqueue(frames)
        core.outbox.add { channel.deliverPending() }
        return frames.reduce(0) { $0 + FrameScheduler.size(of: $1) } < Self.takeLimit
    }

    func perform(_ effects: [Effect]) {
        for effect in effects {
            switch effect {
            case .close(let link, let code, let reason, let linger, let draining):
                guard let draining else {
                    link.close(code: code, reason: reason, linger: linger)
                    continue
                }
                let spawned = spawn {
                    await draining.drained(link, within: Self.drainTimeout)
                    link.close(code: code, reason: reason, linger: linger)
                }
                if !spawned { link.close(code: code, reason: reason, linger: linger) }
            }
        }
    }

    /// How long a replaced link waits for its frames to be acknowledged before it closes.
    static let drainTimeout: Duration = .seconds(2)

    /// Keeps each channel in step with the state machine (under the lock): it writes on the
    /// link the state machine sends the peer's frames on, and it ends once the peer is gone
    /// (not a member, no link left, not being reconnected) — also when automatic mode invites
    /// it again at once: the pair's next membership starts afresh on both sides, and a peer
    /// that kept the old one is told (see `PeerChannel.receive`), not answered with silence.
    ///
    /// Once the session stops, channels stay as they are: each link being closed writes what
    /// its channel still holds ahead of its `GO_AWAY`, and ``run()`` closes the channels last.
    func syncChannels(_ core: inout SessionCore) {
        guard core.phase == .running else { return }
        for (fingerprint, channel) in core.channels {
            let peer = channel.peer
            let target = core.machine.sendLink(to: peer).flatMap { core.links[$0]?.link }
            // the usual case, on every message: the channel writes on the link it should
            if let target, channel.activeLink === target { continue }
            let links = core.machine.links(to: peer)
            if links.isEmpty, !core.machine.isReconnecting(peer), core.machine.state(of: peer) != .connected {
                core.channels[fingerprint] = nil
                channel.close(PeerLinkError(.notConnected, "\(peer) left the session"))
                core.outbox.add { channel.deliverPending() }
                continue
            }
            if channel.activeLink !== target {
                channel.activate(target)
                core.outbox.add { channel.deliverPending() }
            }
        }
    }

    /// Tells the app: logs under the lock, yields through the outbox (so events keep the order
    /// the state machine gave them).
    private func emit(_ event: consuming SessionEvent, in core: inout SessionCore, tally: inout MessageTally) {
        switch consume event {
        case .peerStateChanged(let peer, let state, let reason):
            var metadata = peerMetadata(peer)
            if let reason { metadata["reason"] = "\(reason)" }
            logger.info("peer \(state)", metadata: metadata)
            report(.peerStateChanged(peer, state, reason: reason), in: &core)
        case .invitationReceived(let id, let peer, let context):
            logger.info("invitation received", metadata: peerMetadata(peer).merging(["invitation": "\(id.rawValue)"], uniquingKeysWith: { $1 }))
            report(.invitationReceived(id, from: peer, context: context), in: &core)
        case .invitationResult(let id, let peer, let outcome):
            logger.info(
                "invitation ended",
                metadata: peerMetadata(peer).merging(["invitation": "\(id.rawValue)", "outcome": "\(outcome)"], uniquingKeysWith: { $1 }))
            report(.invitationResult(id, peer, outcome), in: &core)
        case .invitationCancelled(let id, let peer, let reason):
            logger.info(
                "invitation cancelled",
                metadata: peerMetadata(peer).merging(["invitation": "\(id.rawValue)", "reason": "\(reason)"], uniquingKeysWith: { $1 }))
            report(.linkFailed(peer, reason: "\(id) from \(peer) can no longer be answered: \(reason)"), in: &core)
        case .invitationRefused(let peer, let reason, let detail):
            logger.info(
                "invitation refused without asking the app",
                metadata: peerMetadata(peer).merging(["reason": "\(reason)", "detail": "\(detail)"], uniquingKeysWith: { $1 }))
        case .joinRefused(let peer, let code, let reason):
            let refusal = "\(SessionEvent.joinRefused(peer, code: code, reason: reason))"
            logger.info("join refused", metadata: peerMetadata(peer).merging(["reason": "\(refusal)"], uniquingKeysWith: { $1 }))
            report(.linkFailed(peer, reason: refusal), in: &core)
        case .messageReceived(let peer, let data, let reliable):
            logger.trace(
                "message received",
                metadata: peerMetadata(peer).merging(["bytes": "\(data.count)", "reliable": "\(reliable)"], uniquingKeysWith: { $1 }))
            if reliable {
                tally.add(data.count, from: peer, in: core)
            } else {
                // Dropped or not by what is counted so far.
                tally.flush()
                guard queueDatagram(from: peer, bytes: data.count, in: &core) else { return }
            }
            report(.message(from: peer, data: data, reliable: reliable), in: &core)
        case .linkChanged(let peer, let id):
            guard let link = core.links[id]?.link else { return }
            logger.info(
                "peer now on another link",
                metadata: peerMetadata(peer).merging(
                    ["transport": "\(link.channel.transport)", "link.remote": "\(link.channel.remoteDescription)", "link.id": "\(id.rawValue)"],
                    uniquingKeysWith: { $1 }))
            report(.peerTransportChanged(peer, transport: link.channel.transport, remote: link.channel.remoteDescription), in: &core)
        }
    }

    /// Yields `event` to ``events`` once the lock is released, in order (under the lock).
    /// Queues `event` for the app, once the lock is released. Events reported one after another
    /// (nothing else queued in between, none handed over yet: a run of messages from one link)
    /// go to the app in one delivery, with one turn of its queue's lock.
    func report(_ event: consuming PeerSessionEvent, in core: inout SessionCore) {
        if let run = core.eventRun, run.mark == core.outbox.mark {
            run.events.append(event)
            return
        }
        let run = EventRun(event)
        core.outbox.add { [eventSink] in eventSink.yield(contentsOf: run.take()) }
        run.mark = core.outbox.mark
        core.eventRun = run
    }

    // MARK: - Incoming links

    private func acceptLoop(_ listener: any TransportListener) async {
        var failuresInARow = 0
        while true {
            let accepted: (any LinkChannel)?
            do {
                accepted = try await unlessStopped { try await listener.accept() } discard: { $0.close() }
            } catch {
                if stopped.isFired || PeerLinkError.isCancellation(error) { return }
                // Resource limits (issue 11): only a closed listener ends the loop; other failures
                // (no descriptors, no memory) pause and accept again (PeerSession+Limits.swift).
                if await acceptFailed(error, listener: listener, failuresInARow: &failuresInARow) { continue }
                return
            }
            failuresInARow = 0
            guard let channel = accepted else { return }
            // Resource limits (issue 11): over a link cap the channel is closed at once.
            guard admitIncoming(channel) else { continue }
            guard case (let id, let link)? = register(channel, dialed: nil) else {
                channel.close()
                return
            }
            logger.debug(
                "incoming link",
                metadata: [
                    "link.id": "\(id.rawValue)", "transport": "\(channel.transport)", "link.remote": "\(channel.remoteDescription)",
                ])
            guard spawn({ await self.drive(link, id: id) }) else {
                link.close(code: .normal, reason: "\(localPeer.displayName) stopped its session")
                unregister(id)
                return
            }
        }
    }

    // MARK: - Dialling

    /// Dials `peer` at each endpoint in turn until one answers and completes the handshake as
    /// `peer`, then runs the link; reports `dialFailed` when none does. An endpoint that accepts
    /// and then fails the handshake (never answers, answers as somebody else, refuses) moves on
    /// to the next one, and is dialled last for a while (``PeerLinkCore/EndpointPenalties``).
    private func dial(_ peer: PeerID, endpoints: [Endpoint]) async {
        var failures: [String] = []
        // whether every endpoint answered that nothing listens there (the peer's session is gone)
        var refusedEverywhere = true
        // A redial in the grace gives up sooner: the next one comes 2 s later anyway, and one
        // that hangs (a device that went away mid-link may not answer pages) must not use the grace up.
        let timeout =
            core.withLock { $0.machine.isReconnecting(peer) } ? min(configuration.dialTimeout, Self.redialTimeout) : configuration.dialTimeout
        for endpoint in endpoints {
            guard !stopped.isFired else { return }
            var metadata = peerMetadata(peer)
            metadata["transport"] = "\(endpoint.transport)"
            metadata["link.remote"] = "\(endpoint)"
            logger.debug("dialling", metadata: metadata)
            let dialled: (any LinkChannel)?
            do {
                dialled = try await unlessStopped {
                    try await self.dialChannel(endpoint, timeout: timeout)
                } discard: {
                    $0.close()
                }
            } catch {
                if PeerLinkError.isCancellation(error) { return }
                let message = Self.message(of: error)
                metadata["reason"] = "\(message)"
                logger.info("dial failed", metadata: metadata)
                failures.append(message)
                if (error as? PeerLinkError)?.nothingListens != true { refusedEverywhere = false }
                endpointFailed(endpoint)
                continue
            }
            guard let channel = dialled else { return }
            guard case (let id, let link)? = register(channel, dialed: peer) else {
                channel.close()
                return
            }
            let handshakeFailure = await drive(link, id: id, dialing: true)
            guard let handshakeFailure else {
                core.withLock { $0.failedEndpoints.worked(endpoint) }
                return
            }
            if PeerLinkError.isCancellation(handshakeFailure) || stopped.isFired { return }
            let message = Self.message(of: handshakeFailure)
            metadata["reason"] = "\(message)"
            logger.info("handshake failed on a dialled link", metadata: metadata)
            failures.append("\(endpoint): \(message)")
            refusedEverywhere = false
            endpointFailed(endpoint)
        }
        let reason =
            failures.isEmpty
            ? "no endpoint is known for it: discovery has not reported it, or not on a transport this session dials"
            : failures.joined(separator: "; ")
        dialFailed(peer, reason: reason, refused: !failures.isEmpty && refusedEverywhere, report: "could not reach \(peer): \(reason)")
    }

    private func endpointFailed(_ endpoint: Endpoint) {
        let now = time.now()
        core.withLock { $0.failedEndpoints.failed(endpoint, at: now) }
    }

    /// Dials `endpoint` with the first transport that dials its kind (``PeerLinkCore/Transport/dials(_:)``;
    /// one that names no kinds is tried too, and answers `unsupported` for kinds it does not dial).
    /// How long a redial (a member in its reconnect grace) waits for one endpoint to answer.
    static let redialTimeout: Duration = .seconds(8)

    private func dialChannel(_ endpoint: Endpoint, timeout: Duration? = nil) async throws -> any LinkChannel {
        for transport in transports where transport.dials(endpoint) {
            do {
                return try await transport.dial(endpoint, timeout: timeout ?? configuration.dialTimeout)
            } catch let error as PeerLinkError where error.code == .unsupported && transports.count > 1 {
                continue
            }
        }
        throw PeerLinkError(
            .unsupported,
            "no transport of this session dials \(endpoint) (it has \(transports.map(\.name).joined(separator: ", ")))")
    }

    /// Whether ``run()`` is running and the session takes work (not yet stopping).
    public var isRunning: Bool { core.withLock { $0.phase == .running } }

    /// Connects to the peer at `endpoint`, whoever it is: dials it, learns its identity from
    /// the handshake, and invites it (with `context`, answered within `timeout`) unless it is
    /// connected or invited already. Returns the peer; follow its state through ``events``.
    ///
    /// This is how a peer is reached that no discovery reported, such as
    /// `bt://00:AA:01:00:00:00/l2cap/0x1001` typed by the user. The endpoint is remembered for
    /// the peer, as if discovery had reported it.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: the dial's or the handshake's failure
    ///   (`unavailable`, `timedOut`, `unsupported` for an endpoint no transport dials, …),
    ///   `notConnected` when the session is not running, or the invitation's failure.
    public func connect(to endpoint: Endpoint, context: [UInt8] = [], timeout: Duration = .seconds(30)) async throws -> PeerID {
        guard core.withLock({ $0.phase == .running }) else {
            throw PeerLinkError(.notConnected, "the session is not running: call run() first")
        }
        let channel = try await dialChannel(endpoint)
        // The Noise initiator, like a dial; the state machine sees the link as incoming until
        // the peer is known, which the invitation below then uses.
        guard case (let id, let link)? = register(channel, dialed: nil, role: .dialer) else {
            channel.close()
            throw PeerLinkError(.notConnected, "the session stopped while \(endpoint) was dialled")
        }
        guard spawn({ await self.drive(link, id: id) }) else {
            link.close(code: .normal, reason: "\(localPeer.displayName) stopped its session")
            unregister(id)
            throw PeerLinkError(.notConnected, "the session stopped while \(endpoint) was dialled")
        }
        let established = try await link.established
        let peer = established.remote
        // drive() admits the link to the state machine right after the handshake; wait for it,
        // so the invitation goes over this link instead of dialling a second one.
        while true {
            let (admitted, gone) = core.withLock { core in
                (core.links[id]?.established != nil, core.links[id] == nil || core.links[id]?.ended == true)
            }
            if admitted { break }
            if gone {
                throw PeerLinkError(.notConnected, "the link to \(endpoint) ended right after its handshake (refused, or the session stopped)")
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        discovered(.found(DiscoveredPeer(id: peer, protocolVersion: Int(established.version), endpoints: [endpoint], info: try! DiscoveryInfo())))
        let state = await state(of: peer)
        if state == .notConnected {
            do {
                _ = try await invite(peer, context: context, timeout: timeout)
            } catch let error as PeerLinkError where error.code == .invalidParameter {
                // automatic mode invited it as it was found, or it joined meanwhile
            }
        }
        return peer
    }

    /// Tells the state machine a dial failed, and the app why.
    /// While the peer is being reconnected (its grace) or is connected (an upgrade dial), a
    /// failed dial is logged, not reported: the app hears once whether the peer came back
    /// (``PeerSessionEvent/peerTransportChanged(_:transport:remote:)``) or left.
    private func dialFailed(_ peer: PeerID, reason: String, refused: Bool = false, report: String) {
        let now = time.now()
        let effects = core.withLockThenDeliver { core -> [Effect] in
            guard core.phase == .running else { return [] }
            // a redial in the grace, or an upgrade dial to a peer connected already: logged only
            if !core.machine.isReconnecting(peer), core.machine.state(of: peer) != .connected {
                self.report(.linkFailed(peer, reason: report), in: &core)
            }
            return carryOut(core.machine.dialFailed(peer, reason: reason, refused: refused, at: now), in: &core)
        }
        perform(effects)
    }

    // MARK: - Links

    /// Makes the link for `channel` and records it, while the session runs.
    private func register(_ channel: any LinkChannel, dialed peer: PeerID?, role: LinkStateMachine.Role? = nil) -> (LinkID, Link)? {
        core.withLockThenDeliver { core -> (LinkID, Link)? in
            guard core.phase == .running else { return nil }
            let id = core.makeLinkID()
            var logger = self.logger
            logger[metadataKey: "link.id"] = "\(id.rawValue)"
            let link = Link(
                channel: channel, role: role ?? (peer == nil ? .listener : .dialer), identity: configuration.identity,
                preface: preface, hello: hello, policy: configuration.linkPolicy, expectedRemote: peer?.fingerprint,
                clock: clock, logger: logger)
            link.holdEventsForHandler()  // taken by drive(_:id:dialing:) as they arrive
            core.links[id] = SessionCore.LinkEntry(link: link, dialed: peer)
            core.liveLinks += 1
            recordLink(channel, in: &core)  // Resource limits (issue 11)
            return (id, link)
        }
    }

    private func unregister(_ id: LinkID) {
        core.withLockThenDeliver { core in
            core.wakeWriter(id, returning: false)
            if let link = core.links[id]?.link { core.admission.removed(ObjectIdentifier(link.channel)) }  // Resource limits (issue 11)
            guard core.links.removeValue(forKey: id) != nil else { return }
            core.liveLinks -= 1
            if core.phase == .stopping, core.liveLinks == 0 { core.outbox.add { self.linksDrained.fire() } }
        }
    }

    /// Runs one link: its handshake, then the session's business on it (frames in, a writer
    /// pulling frames out) until it ends. A link this session dialled (`dialing`) that fails its
    /// handshake returns the failure, for ``dial(_:endpoints:)`` to try the next endpoint; any
    /// other failure is reported here.
    @discardableResult
    private func drive(_ link: Link, id: LinkID, dialing: Bool = false) async -> (any Error)? {
        let failure = await withDiscardingTaskGroup(returning: (any Error)?.self) { group in
            group.addTask { await link.run() }
            let established: Link.Established
            do {
                established = try await link.established
            } catch {
                if dialing { return error }
                handshakeFailed(link, id: id, error: error)
                return nil
            }
            guard admit(link, id: id, established) else { return nil }
            group.addTask { await self.writeLoop(link, id: id) }
            await takeEvents(of: link, id: id, from: established.remote)
            core.withLockThenDeliver { core in
                core.links[id]?.ended = true
                core.wakeWriter(id, returning: false)
            }
            return nil
        }
        unregister(id)
        return failure
    }

    /// Takes the link's frames and its closure into the state machine as they arrive, on the
    /// thread that read them (the link's reader, through its outbox): no hand-over to another
    /// task per frame, and one turn of the session's lock for a run of message chunks (often
    /// a whole read's). Returns once the link closed, or when the task is cancelled; a frame or
    /// closure that comes after that (or after the link was marked ended) is not taken.
    private func takeEvents(of link: Link, id: LinkID, from remote: PeerID) async {
        let closed = Latch()
        let channel = link.attachedChannel
        link.handleEvents { events in
            var index = events.startIndex
            while index < events.endIndex {
                switch events[index] {
                case .frame(.message) where channel != nil:
                    // A run of chunks, taken under one turn of the lock.
                    var end = index + 1
                    while end < events.endIndex, case .frame(.message) = events[end] { end += 1 }
                    self.takeChunks(end - index, from: channel!, on: id, remote: remote)
                    index = end
                    continue
                case .frame(let frame):
                    self.apply { core, now in
                        guard core.links[id]?.ended != true else { return ([], ()) }
                        return (core.machine.frameReceived(frame, on: id, from: remote, at: now), ())
                    }
                case .closed(let code, let reason, let byPeer):
                    // After the handshake, only an admission check closes a link with code 7.
                    if byPeer, code == .identityMismatch { self.refusedByPeer(remote, reason: reason) }
                    let lost = link.closure?.lost ?? false
                    let dropped = self.apply { core, now -> ([SessionAction], Int) in
                        guard core.links[id]?.ended != true else { return ([], 0) }
                        let held = core.machine.bufferedMessageBytes
                        let actions = core.machine.linkClosed(id, code: code, reason: reason, lost: lost, at: now)
                        return (actions, held - core.machine.bufferedMessageBytes)
                    }
                    // A peer that left (or was sent away) with messages in part: their memory
                    // goes back to the system, not only to the allocator.
                    MemoryRelief.dropped(dropped)
                    closed.fire()
                }
                index += 1
            }
        }
        await closed.wait()
    }

    /// Takes `count` message chunks from the pair's channel into the state machine, under one
    /// turn of the session's lock.
    ///
    /// The chunks the channel accepted first go through the state machine, whichever link's
    /// events these are: right after a link change the old link's last chunks and the new
    /// link's first ones arrive here on two threads, and taking them in these events' stead
    /// would reorder messages. Taken under the session's lock, so two threads take and apply in
    /// turn. Then each chunk is held in part, or counted anew as a complete message (or
    /// dropped). A chunk does not change which link carries a peer (a limit it breaks closes a
    /// link, and that close is an input of its own): the channels need no look.
    private func takeChunks(_ count: Int, from channel: PeerChannel, on id: LinkID, remote: PeerID) {
        let processed = apply(linksMayChange: false) { core, now -> ([SessionAction], (bytes: Int, partial: Int)?) in
            guard core.links[id]?.ended != true else { return ([], nil) }
            // Only message chunks are delivered to the channel.
            let chunks = channel.takeDelivered(upTo: count)
            let bytes = chunks.reduce(0) { total, frame in
                if case .message(_, _, let chunk) = frame { total + chunk.count } else { total }
            }
            let actions = core.machine.framesReceived(chunks, on: id, from: remote, at: now)
            return (actions, (bytes, core.machine.partialMessageBytes(from: remote)))
        }
        if let processed { channel.chunkProcessed(processed.bytes, partialMessageBytes: processed.partial) }
    }

    /// A stream the peer opened: handed to the app when the peer is in the session (or on its
    /// way in), reset otherwise.
    func acceptStream(_ stream: PeerStream) {
        let reason = "\(localPeer.displayName) is not in a session with \(stream.peer.displayName)"
        let accepted = core.withLockThenDeliver { core -> Bool in
            guard core.phase == .running, core.machine.state(of: stream.peer) != .notConnected else { return false }
            core.outbox.add {
                if case .terminated = self.streamSink.yield(stream) { stream.reset(reason: reason) }
            }
            return true
        }
        if !accepted { stream.reset(reason: reason) }
    }

    /// The handshake is done: the state machine learns of the link (unless the session stops,
    /// or ``PeerSessionConfiguration/admit`` refuses the peer).
    private func admit(_ link: Link, id: LinkID, _ established: Link.Established) -> Bool {
        if let admit = configuration.admit, !admit(established.remote) {
            refuse(link, id: id, established.remote)
            return false
        }
        let now = time.now()
        let (effects, admitted) = core.withLockThenDeliver { core -> ([Effect], Bool) in
            guard core.phase == .running, var entry = core.links[id] else {
                return ([.close(link, code: .normal, reason: "\(localPeer.displayName) stopped its session")], false)
            }
            entry.established = established
            core.links[id] = entry
            core.admission.established(ObjectIdentifier(link.channel))  // Resource limits (issue 11)
            logger.debug(
                "link admitted to the session",
                metadata: linkMetadata(id, entry).merging(["link.encrypted": "\(established.encrypted)"], uniquingKeysWith: { $1 }))
            let peer = established.remote
            let incarnation = established.hello.incarnation
            let actions = core.machine.linkEstablished(
                id, peer: peer, dialedLocally: entry.dialed != nil, incarnation: incarnation, transport: link.channel.transport,
                framePayload: established.bulkFramePayload, at: now)
            // The peer's channel: the one its links carried so far, unless it started anew.
            if let existing = core.channels[peer.fingerprint], existing.incarnation != incarnation || incarnation == nil {
                core.channels[peer.fingerprint] = nil
                existing.close(PeerLinkError(.notConnected, "\(peer) started anew"))
                core.outbox.add { existing.deliverPending() }
            }
            let channel =
                core.channels[peer.fingerprint]
                ?? PeerChannel(
                    peer: peer, incarnation: incarnation, localPeer: localPeer,
                    maxUnconsumedMessageBytes: configuration.limits.maximumQueuedMessageBytesPerPeer, clock: time, logger: logger,
                    keepsDeliveryOrder: true, streamOpened: { [weak self] stream in self?.acceptStream(stream) })
            core.channels[peer.fingerprint] = channel
            // what attaching hands on is delivered once the session's lock is released: it can
            // come back to the session (frames that arrived early, taken by the channel)
            link.attachLeavingDelivery(channel)
            core.outbox.add { link.deliverPending() }
            return (carryOut(actions, in: &core), true)
        }
        perform(effects)
        return admitted
    }

    /// The text a refused peer gets in its `GO_AWAY`.
    static let refusalReason = "not a known peer: only known peers are admitted"

    /// ``PeerSessionConfiguration/admit`` refused the peer on `link`: `GO_AWAY` 7 to it, and the
    /// app is told (a refused dial is a failed dial, so an invitation waiting for it fails).
    private func refuse(_ link: Link, id: LinkID, _ peer: PeerID) {
        let reason = "refused \(peer.displayName) (id \(peer.fingerprint.grouped)): not a known peer"
        let dialed = core.withLock { core -> PeerID? in
            guard let entry = core.links[id] else { return nil }
            logger.info("peer refused", metadata: linkMetadata(id, entry).merging(peerMetadata(peer), uniquingKeysWith: { $1 }))
            return entry.dialed
        }
        link.close(code: .identityMismatch, reason: Self.refusalReason)
        if let dialed {
            dialFailed(dialed, reason: reason, report: reason)
        } else {
            core.withLockThenDeliver { core in
                guard core.phase == .running else { return }
                report(.linkFailed(peer, reason: reason), in: &core)
            }
        }
    }

    /// The peer closed an established link with `GO_AWAY` 7: its admission refused this peer.
    private func refusedByPeer(_ peer: PeerID, reason: String) {
        logger.info("refused by the peer", metadata: peerMetadata(peer).merging(["reason": "\(reason)"], uniquingKeysWith: { $1 }))
        core.withLockThenDeliver { core in
            guard core.phase == .running else { return }
            report(.linkFailed(peer, reason: "\(peer.displayName) (id \(peer.fingerprint.grouped)) refused the link: \(reason)"), in: &core)
        }
    }

    /// A link that was not dialled for a known peer and never got established: reported only
    /// when it was refused (a connection that ends before its first word, such as a browser
    /// checking the port, is not news). Dialled links' failures go back to ``dial(_:endpoints:)``.
    private func handshakeFailed(_ link: Link, id: LinkID, error: any Error) {
        var metadata: Logger.Metadata = [
            "link.id": "\(id.rawValue)", "transport": "\(link.channel.transport)", "link.remote": "\(link.channel.remoteDescription)",
        ]
        let reason = Self.message(of: error)
        metadata["reason"] = "\(reason)"
        if PeerLinkError.isCancellation(error) || stopped.isFired {
            logger.debug("link ended during the handshake as the session stops", metadata: metadata)
            return
        }
        if let closure = link.closure, closure.code == .handshakeFailed {
            logger.debug("incoming link ended before its handshake", metadata: metadata)
            return
        }
        logger.info("incoming link refused", metadata: metadata)
        core.withLockThenDeliver { core in
            guard core.phase == .running else { return }
            report(.linkFailed(nil, reason: reason), in: &core)
        }
    }

    /// Pulls the frames the state machine has for `link`, one at a time, each queued on the link
    /// under the lock it was taken under, then waits for room: a slow link holds up only itself.
    private func writeLoop(_ link: Link, id: LinkID) async {
        while await framesAnnounced(id) {
            while true {
                // Sequenced frames (message chunks) go to the peer's channel, which writes them
                // on whatever link carries the peer and keeps them until acknowledged; the
                // link's own frames (session control, datagrams) go to the link. Up to 64 KiB
                // of chunks in one go (one look-up of the peer, one lock of the channel, one
                // wake-up of its link), ended by a frame of the link's own if one comes.
                let taken = core.withLockThenDeliver { core -> Result<PeerChannel?, PeerLinkError>? in
                    var frames = core.machine.nextFrames(for: id, upTo: Self.takeLimit)
                    guard let last = frames.last else { return nil }
                    let own = last.type.isSequenced ? nil : frames.removeLast()
                    var channel: PeerChannel?
                    if !frames.isEmpty {
                        guard let peer = core.links[id]?.established?.remote, let found = core.channels[peer.fingerprint] else {
                            return .failure(PeerLinkError(.notConnected, "the link has no channel"))
                        }
                        found.enqueue(frames)
                        channel = found
                    }
                    if let own {
                        do throws(PeerLinkError) {
                            try link.enqueueLeavingDelivery(own)
                        } catch {
                            return .failure(error)
                        }
                    }
                    return .success(channel)
                }
                // The link's writer is woken with no lock held.
                link.deliverPending()
                guard let taken else { break }
                guard case .success(let channel) = taken else { return }
                do {
                    if let channel {
                        channel.deliverPending()
                        try await channel.waitUntilWritable()
                    } else {
                        try await link.waitUntilWritable()
                    }
                } catch {
                    return
                }
            }
        }
    }

    /// How many bytes of message chunks the write loop hands a channel at once.
    static let takeLimit = 64 * 1024

    /// Waits for a `framesReady` on `id`; false once the link is over.
    private func framesAnnounced(_ id: LinkID) async -> Bool {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                core.withLock { core in
                    guard var entry = core.links[id] else {
                        continuation.resume(returning: false)
                        return
                    }
                    if entry.framesPending {
                        entry.framesPending = false
                        continuation.resume(returning: true)
                    } else if entry.ended || Task.isCancelled {
                        continuation.resume(returning: false)
                    } else {
                        entry.writerWaiter = continuation
                    }
                    core.links[id] = entry
                }
            }
        } onCancel: {
            let writer = core.withLock { core -> CheckedContinuation<Bool, Never>? in
                defer { core.links[id]?.writerWaiter = nil }
                return core.links[id]?.writerWaiter
            }
            writer?.resume(returning: false)
        }
    }

    // MARK: - Time

    /// Ticks the state machine at its deadlines; wakes early when a deadline moves closer.
    private func timerLoop() async {
        var lastTick: Duration?
        while !Task.isCancelled {
            let next = core.withLock { core -> Duration?? in
                guard core.phase == .running else { return .none }
                core.timerArmed = true
                core.timerDeadline = core.machine.nextDeadlineInPlace()
                core.timerWakePending = false
                return .some(core.timerDeadline)
            }
            guard case .some(var deadline) = next else { return }
            // A deadline that ticking did not move is not ticked again at once.
            if let due = deadline, let lastTick, due <= lastTick { deadline = lastTick + .milliseconds(10) }
            await sleepOrWake(until: deadline)
            if Task.isCancelled { return }
            let now = time.now()
            lastTick = now
            let effects = core.withLockThenDeliver { core -> [Effect] in
                core.timerArmed = false
                guard core.phase == .running else { return [] }
                return carryOut(core.machine.tick(at: now), in: &core)
            }
            perform(effects)
        }
    }

    private func sleepOrWake(until deadline: Duration?) async {
        await withTaskGroup(of: Void.self) { group in
            if let deadline {
                group.addTask { try? await self.time.sleep(until: deadline) }
            }
            group.addTask { await self.waitForTimerWake() }
            await group.next()
            group.cancelAll()
        }
    }

    private func waitForTimerWake() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                core.withLock { core in
                    if core.timerWakePending || Task.isCancelled {
                        continuation.resume()
                    } else {
                        core.timerWake = continuation
                    }
                }
            }
        } onCancel: {
            let wake = core.withLock { core -> CheckedContinuation<Void, Never>? in
                defer { core.timerWake = nil }
                return core.timerWake
            }
            wake?.resume()
        }
    }

    // MARK: - Helpers

    /// Runs `operation` until it ends or the session stops (then nil, and whatever the
    /// operation still returns is handed to `discard`).
    private func unlessStopped<T: Sendable>(
        _ operation: @escaping @Sendable () async throws -> T, discard: @escaping @Sendable (T) -> Void
    ) async throws -> T? {
        try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await operation() }
            group.addTask {
                await self.stopped.wait()
                return nil
            }
            let first: T??
            do {
                first = try await group.next()
            } catch {
                group.cancelAll()
                throw error
            }
            group.cancelAll()
            if case .some(.some(let value)) = first { return value }
            while true {
                do {
                    guard let rest = try await group.next() else { break }
                    if let rest { discard(rest) }
                } catch {
                    continue
                }
            }
            return nil
        }
    }

    static func message(of error: any Error) -> String {
        if let error = error as? PeerLinkError { return error.message }
        if error is CancellationError { return "cancelled" }
        return "\(error)"
    }

    var localMetadata: Logger.Metadata { ["peer.local": "\(localPeer.fingerprint)"] }

    func peerMetadata(_ peer: PeerID) -> Logger.Metadata {
        ["peer.id": "\(peer.fingerprint)", "peer.name": "\(peer.displayName)"]
    }

    func linkMetadata(_ id: LinkID, _ entry: SessionCore.LinkEntry) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "link.id": "\(id.rawValue)", "transport": "\(entry.link.channel.transport)",
            "link.remote": "\(entry.link.channel.remoteDescription)",
        ]
        if let peer = entry.established?.remote ?? entry.dialed { metadata["peer.id"] = "\(peer.fingerprint)" }
        return metadata
    }
}
