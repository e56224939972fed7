import PeerLinkCore

/// Everything a ``PeerSession`` knows, under one lock: the state machine, the links, what
/// discovery reported, and the waiting loops. What wakes a task or reaches the app (resumes,
/// events, streams, work for the task group) goes through ``outbox``, carried out once the lock
/// is released.
struct SessionCore: OutboxOwner {
    enum Phase {
        /// ``PeerSession/run()`` has not started; inputs are kept.
        case idle
        case running
        /// ``PeerSession/disconnect()`` or cancellation: links are closing.
        case stopping
        /// ``PeerSession/run()`` returned, or never will.
        case over

        var acceptsInput: Bool { self == .idle || self == .running }
    }

    /// One link the session runs, from its first byte to its end.
    struct LinkEntry {
        let link: Link
        /// The peer dialled, for a link this side opened.
        let dialed: PeerID?
        /// The handshake's outcome, once the session knows the link.
        var established: Link.Established?
        /// The state machine announced frames for this link the writer has not looked at yet.
        var framesPending = false
        /// The link is over: its writer stops.
        var ended = false
        var writerWaiter: CheckedContinuation<Bool, Never>?
    }

    var machine: SessionStateMachine
    var phase = Phase.idle
    /// The events ``PeerSession/report(_:in:)`` queued last, in one delivery.
    var eventRun: EventRun?
    var links: [LinkID: LinkEntry] = [:]
    var nextLinkNumber = 1
    /// Link tasks running (registered and not yet unregistered).
    var liveLinks = 0
    /// The latest endpoints discovery reported, by peer.
    var discovered: [Fingerprint: [Endpoint]] = [:]
    /// Endpoints whose last dial or handshake failed, with when: dialled after the others until
    /// one works again, so a record that leads nowhere (a stale address, or a hostile one naming
    /// somebody else's id) delays a peer's links at most once in `EndpointPenalties.memory`.
    var failedEndpoints = EndpointPenalties()
    /// Unreliable messages dropped on arrival because their peer was held back.
    var droppedIncomingDatagrams = 0
    /// Peers discovery reported found and not lost.
    var found: Set<Fingerprint> = []
    /// Each peer's channel: its sequenced frames and streams, across links.
    var channels: [Fingerprint: PeerChannel] = [:]

    /// The link caps of ``PeerLinkCore/ResourceLimits``: every link by its channel (see
    /// `PeerSession+Limits.swift`).
    var admission = LinkAdmission<ObjectIdentifier>()

    var timerArmed = false
    var timerDeadline: Duration?
    var timerWakePending = false
    var timerWake: CheckedContinuation<Void, Never>?

    var outbox = Outbox()

    init(machine: SessionStateMachine) {
        self.machine = machine
    }

    func requireNotOver() throws(PeerLinkError) {
        guard phase.acceptsInput else {
            throw PeerLinkError(
                .unavailable, "this session is over (it was disconnected or stopped running): start a new PeerSession to connect again")
        }
    }

    mutating func makeLinkID() -> LinkID {
        defer { nextLinkNumber += 1 }
        return LinkID(nextLinkNumber)
    }

    /// Wakes the timer when the state machine's next deadline moved closer than the one it
    /// sleeps towards (or it must stop).
    mutating func wakeTimerIfNeeded() {
        guard timerArmed else { return }
        // Inputs that only moved messages (most of them) bring no deadline earlier: the timer
        // sleeps towards one no later than what is due now.
        guard machine.nextDeadlineMayBeEarlier || phase != .running else { return }
        let next = machine.nextDeadlineInPlace()
        let closer: Bool = if let next { timerDeadline.map { next < $0 } ?? true } else { false }
        if closer || phase != .running { wakeTimer() }
    }

    mutating func wakeTimer() {
        timerWakePending = true
        if let timerWake {
            outbox.add { timerWake.resume() }
            self.timerWake = nil
        }
    }

    /// Resumes the link writer waiting on `id` (with the lock released), if one is.
    mutating func wakeWriter(_ id: LinkID, returning more: Bool) {
        guard let writer = links[id]?.writerWaiter else { return }
        links[id]?.writerWaiter = nil
        outbox.add { writer.resume(returning: more) }
    }
}

/// What is done with the lock released, after an input was applied.
enum Effect: Sendable {
    /// Close a link; `linger` as in ``Link/close(code:reason:linger:)``. With `drainingFor`,
    /// first wait (briefly) until that channel's frames written on the link are acknowledged:
    /// another link carries the peer now, and nothing need be written again.
    case close(Link, code: GoAwayCode, reason: String, linger: Bool = true, drainingFor: PeerChannel? = nil)
}

/// A one-way signal many tasks can wait for: waiting returns once it fired, or when the waiting
/// task is cancelled.
package final class Latch: Sendable {
    private struct State {
        var fired = false
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = Locked(State())

    package init() {}

    package var isFired: Bool { state.withLock { $0.fired } }

    /// Fires; true the first time.
    @discardableResult
    package func fire() -> Bool {
        // The waiters are resumed with the lock released (see ``Outbox``): a waiter being
        // cancelled meanwhile takes the lock in its cancellation handler.
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>]? in
            guard !state.fired else { return nil }
            state.fired = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        guard let waiters else { return false }
        for waiter in waiters { waiter.resume() }
        return true
    }

    package func wait() async {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                state.withLock { state in
                    if state.fired || Task.isCancelled {
                        continuation.resume()
                    } else {
                        state.waiters[id] = continuation
                    }
                }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }
}

/// Events for the app queued as one delivery of the session's outbox. Added to under the
/// session's lock while its delivery is the last one queued (its ``mark`` is the outbox's);
/// taken by that delivery once the outbox handed it over (under the lock too), after which
/// nothing adds to it. Taken, not read: the session keeps the last run, and must not keep a
/// message the app is done with.
final class EventRun: @unchecked Sendable {
    // Not checked for exclusive access at run time (a check per message reported): the
    // session's lock already makes every access exclusive (see above).
    @exclusivity(unchecked) var events: [PeerSessionEvent]
    /// The outbox's mark right after this run's delivery was queued.
    @exclusivity(unchecked) var mark: Outbox.Mark?

    init(_ event: consuming PeerSessionEvent) { events = [event] }

    /// The events, leaving none.
    func take() -> [PeerSessionEvent] {
        defer { events = [] }
        return events
    }
}
