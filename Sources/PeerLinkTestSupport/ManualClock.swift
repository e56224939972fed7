import Synchronization

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
        let count: Int
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Instant
        var sleepers: [Sleeper] = []
        var idleWaiters: [IdleWaiter] = []
        var nextID = 0

        /// Sleepers that still wait (deadline after now).
        var waitingCount: Int { sleepers.count { $0.deadline > now } }

        mutating func resumeIdleWaiters() {
            let waiting = waitingCount
            idleWaiters.removeAll { waiter in
                guard waiting >= waiter.count else { return false }
                waiter.continuation.resume()
                return true
            }
        }
    }

    private let state: Mutex<State>

    public init(now: Instant = Instant(offset: .zero)) {
        state = Mutex(State(now: now))
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
                state.withLock { state in
                    if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else if deadline <= state.now {
                        continuation.resume()
                    } else {
                        state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                        state.resumeIdleWaiters()
                    }
                }
            }
        } onCancel: {
            state.withLock { state in
                if let index = state.sleepers.firstIndex(where: { $0.id == id }) {
                    state.sleepers.remove(at: index).continuation.resume(throwing: CancellationError())
                }
            }
        }
    }

    /// Moves the clock forward by `duration`, waking every sleeper whose deadline is reached.
    public func advance(by duration: Duration) {
        state.withLock { state in advance(&state, to: state.now.advanced(by: duration)) }
    }

    /// Moves the clock to `instant` (never backwards), waking every sleeper whose deadline is reached.
    public func advance(to instant: Instant) {
        state.withLock { state in advance(&state, to: instant) }
    }

    private func advance(_ state: inout State, to instant: Instant) {
        guard instant > state.now else { return }
        state.now = instant
        let due = state.sleepers.filter { $0.deadline <= instant }
        state.sleepers.removeAll { $0.deadline <= instant }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Waits until at least `count` sleepers wait for a deadline after now: the code under test
    /// has handled everything that is due and is asleep again.
    public func waitForSleepers(_ count: Int) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                state.withLock { state in
                    if state.waitingCount >= count {
                        continuation.resume()
                    } else if Task.isCancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        state.idleWaiters.append(IdleWaiter(id: id, count: count, continuation: continuation))
                    }
                }
            }
        } onCancel: {
            state.withLock { state in
                if let index = state.idleWaiters.firstIndex(where: { $0.id == id }) {
                    state.idleWaiters.remove(at: index).continuation.resume(throwing: CancellationError())
                }
            }
        }
    }
}
