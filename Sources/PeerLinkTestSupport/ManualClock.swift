import PeerLinkCore

/// A clock that moves only when a test says so, so timeouts are tested without sleeping.
///
/// Sleepers wake when ``advance(by:)`` or ``advance(to:)`` reaches their deadline; a sleep
/// whose deadline has passed returns at once; a cancelled sleep throws `CancellationError`.
/// ``waitForSleepers(_:)`` lets a test wait until the code under test has gone back to sleep,
/// i.e. has done everything the last advance made due.
///
/// ```swift
/// let clock = ManualClock()
/// clock.advance(by: .seconds(9))
/// await clock.waitForSleepers(1)   // the ticker handled 9 s and sleeps again
/// ```
public final class ManualClock: Clock, Sendable {
    public struct Instant: InstantProtocol, CustomStringConvertible {
        /// The time since the clock's zero.
        public var offset: Duration

        public init(offset: Duration) {
            self.offset = offset
        }

        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
        public var description: String { "\(offset)" }
    }

    private struct Sleeper {
        let id: Int
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct IdleWaiter {
        let id: Int
        /// What it waits for: this many sleepers waiting, or one waiting until this deadline.
        let count: Int
        let deadline: Instant?
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Instant
        var sleepers: [Sleeper] = []
        var idleWaiters: [IdleWaiter] = []
        var nextID = 0

        /// Sleepers that still wait (deadline after now).
        var waitingCount: Int { sleepers.count { $0.deadline > now } }

        /// Whether at least `count` sleepers wait, and one of them until `deadline` if given.
        func satisfies(count: Int, deadline: Instant?) -> Bool {
            guard waitingCount >= count else { return false }
            guard let deadline else { return true }
            return sleepers.contains { $0.deadline == deadline && $0.deadline > now }
        }

        /// Takes the idle waiters that are satisfied now, for resuming once the lock is released.
        mutating func takeSatisfiedIdleWaiters() -> [CheckedContinuation<Void, any Error>] {
            var satisfied: [CheckedContinuation<Void, any Error>] = []
            let waiters = idleWaiters
            idleWaiters = waiters.filter { waiter in
                guard satisfies(count: waiter.count, deadline: waiter.deadline) else { return true }
                satisfied.append(waiter.continuation)
                return false
            }
            return satisfied
        }
    }

    private let state: Locked<State>

    public init(now: Instant = Instant(offset: .zero)) {
        state = Locked(State(now: now))
    }

    public var now: Instant { state.withLock { $0.now } }
    public var minimumResolution: Duration { .zero }

    /// The deadlines of the sleepers, soonest first.
    public var sleeperDeadlines: [Instant] { state.withLock { $0.sleepers.map(\.deadline).sorted() } }

    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // Other tasks are resumed with the lock released: their cancellation handlers
                // take it (this task's own continuation can be resumed under it: it has not
                // suspended yet).
                let idle = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
                    if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else if deadline <= state.now {
                        continuation.resume()
                    } else {
                        state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                        return state.takeSatisfiedIdleWaiters()
                    }
                    return []
                }
                for waiter in idle { waiter.resume() }
            }
        } onCancel: {
            let sleeper = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.sleepers.remove(at: index).continuation
            }
            sleeper?.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock forward by `duration`, waking every sleeper whose deadline is reached.
    public func advance(by duration: Duration) {
        let due = state.withLock { state in advance(&state, to: state.now.advanced(by: duration)) }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Moves the clock to `instant` (never backwards), waking every sleeper whose deadline is reached.
    public func advance(to instant: Instant) {
        let due = state.withLock { state in advance(&state, to: instant) }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Moves the clock; returns the sleepers that are due, for waking once the lock is released.
    private func advance(_ state: inout State, to instant: Instant) -> [Sleeper] {
        guard instant > state.now else { return [] }
        state.now = instant
        let due = state.sleepers.filter { $0.deadline <= instant }
        state.sleepers.removeAll { $0.deadline <= instant }
        return due
    }

    /// Waits until at least `count` sleepers wait for a deadline after now: the code under test
    /// has handled everything that is due and is asleep again.
    public func waitForSleepers(_ count: Int) async throws {
        try await waitUntilIdle(count: count, deadline: nil)
    }

    /// Waits until a sleeper waits until `deadline` (after now): the code under test has taken
    /// in what it was given and set a timer for that moment.
    public func waitForSleeper(until deadline: Instant) async throws {
        try await waitUntilIdle(count: 1, deadline: deadline)
    }

    private func waitUntilIdle(count: Int, deadline: Instant?) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                state.withLock { state in
                    if state.satisfies(count: count, deadline: deadline) {
                        continuation.resume()
                    } else if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        state.idleWaiters.append(IdleWaiter(id: id, count: count, deadline: deadline, continuation: continuation))
                    }
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.idleWaiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.idleWaiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
    }
}
