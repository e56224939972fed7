import PeerLinkCore

/// Work that must not run while a lock is held — resuming a suspended task's continuation,
/// yielding to or finishing an `AsyncStream`, firing a ``Latch`` — queued under the lock and
/// carried out, in order, once it is released.
///
/// Why: cancelling a task runs its cancellation handlers (and those of its child tasks) on the
/// cancelling thread while holding the task's status lock, and resuming a suspended task takes
/// that same status lock. So a handler that takes lock `L` deadlocks with a thread that holds
/// `L` while it resumes the task — or yields to a stream the task, or a parent of it, waits on:
/// each thread holds the lock the other waits for, and neither lock is reentrant. The rule in
/// this module: nothing is resumed, yielded, fired or cancelled while one of its locks is held.
/// Then cancellation handlers may take the locks directly (and cancellation stays prompt).
///
/// Resuming a continuation inside the `withChecked…Continuation` body that made it is fine under
/// a lock: the task has not suspended yet, so the resume only marks it and takes no status lock.
///
/// Order: deliveries run in the order they were queued, by one thread at a time. Whoever
/// releases the lock with deliveries pending while no other thread delivers becomes the
/// deliverer and runs them, and those queued meanwhile, until none are left; a thread that finds
/// another one delivering leaves its deliveries to it. So events reach a stream's consumer in
/// the order they were decided under the lock, as when they were yielded under it.
struct Outbox {
    typealias Delivery = @Sendable () -> Void

    private var pending: [Delivery] = []
    private var delivering = false
    /// Counts the hand-overs of ``pending`` to a deliverer.
    private var handOvers = 0

    /// Queues `delivery` (under the lock).
    mutating func add(_ delivery: @escaping Delivery) {
        pending.append(delivery)
    }

    /// Which delivery was queued last, as long as it has not been handed to a deliverer: a
    /// producer that queued a delivery and reads the same mark later knows that delivery is
    /// still the last one queued and has not run (it may add to what that delivery carries).
    var mark: Mark { Mark(handOvers: handOvers, count: pending.count) }

    struct Mark: Equatable {
        let handOvers: Int
        let count: Int
    }

    /// Under the lock, on the way out: whether the caller is to deliver now (something is
    /// pending and no other thread is delivering).
    mutating func claim() -> Bool {
        guard !pending.isEmpty, !delivering else { return false }
        delivering = true
        return true
    }

    /// Under the lock, for the deliverer: what to deliver next, or nil once nothing is left
    /// (the deliverer is done).
    mutating func take() -> [Delivery]? {
        guard !pending.isEmpty else {
            delivering = false
            return nil
        }
        defer {
            pending = []
            handOvers &+= 1
        }
        return pending
    }
}

/// A lock-protected state with an ``Outbox``.
protocol OutboxOwner {
    var outbox: Outbox { get set }
}

extension Locked where Value: OutboxOwner {
    /// `withLock`, then, with the lock released, what `body` (or another thread meanwhile)
    /// queued in the outbox. Call it with no other lock held: the deliveries run on this thread.
    func withLockThenDeliver<R: Sendable, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        let (result, delivers) = withLock { value -> (Result<R, E>, Bool) in
            let result: Result<R, E>
            do throws(E) {
                result = .success(try body(&value))
            } catch {
                result = .failure(error)
            }
            return (result, value.outbox.claim())
        }
        if delivers { deliverClaimed() }
        return try result.get()
    }

    /// Carries out what is pending in the outbox, unless another thread is at it. For a caller
    /// that queued deliveries with `withLock` while it held another lock: call it once that
    /// lock is released.
    func deliverPending() {
        if withLock({ $0.outbox.claim() }) { deliverClaimed() }
    }

    private func deliverClaimed() {
        while let deliveries = withLock({ $0.outbox.take() }) {
            for delivery in deliveries { delivery() }
        }
    }
}
