#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Sleeps on the process's one timer thread, for the deadlines links and sessions keep
/// (keep-alive, acknowledgments, write progress, grace periods).
///
/// `Task.sleep` would do, except for what a cancelled sleep leaves behind on Linux: the
/// dispatch timer under it stays armed until its deadline. Links and sessions cancel a sleep
/// each time a closer deadline appears (many times a second under traffic), and some of the
/// deadlines they cancel are minutes away; those timers pile up, each a few small allocations
/// that outlive the busy ones around them, and a long-running process's memory grew without
/// end (a 10-minute soak of 8 chats: 12 % and rising). Here a cancelled sleep is removed at
/// once and resumes its task at once.
///
/// The thread sleeps in `pthread_cond_timedwait` (monotonic clock) until the earliest
/// deadline, and is woken when an earlier one arrives.
public final class Timers: @unchecked Sendable {
    public static let shared = Timers()

    private struct Entry {
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>?
        var cancelled = false
    }

    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    // Guarded by `mutex`.
    private var entries: [UInt64: Entry] = [:]
    /// Deadlines with their tokens, a binary min-heap; an entry removed from `entries` is
    /// skipped when it reaches the top, and the heap is rebuilt when such entries dominate it.
    private var heap: [(deadline: ContinuousClock.Instant, token: UInt64)] = []
    private var nextToken: UInt64 = 1
    private var started = false
    /// The deadline the thread sleeps until (nil: no deadline, or awake).
    private var sleepingUntil: ContinuousClock.Instant?
    private var threadSleeps = false

    private init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    /// How many sleeps are pending (for tests and diagnostics).
    public var pendingCount: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return entries.count
    }

    /// Suspends until `deadline` (at once when it has passed).
    ///
    /// - Throws: `CancellationError` when the task is cancelled first; the timer is gone then.
    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        try Task.checkCancellation()
        guard deadline > .now else { return }
        let token = locked { () -> UInt64 in
            startIfNeeded()
            defer { nextToken += 1 }
            entries[nextToken] = Entry(deadline: deadline)
            return nextToken
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let outcome = locked { () -> Bool? in
                    guard let entry = entries[token] else { return true }  // due already
                    if entry.cancelled {
                        entries[token] = nil
                        return false
                    }
                    entries[token]?.continuation = continuation
                    push(deadline, token)
                    if threadSleeps, sleepingUntil.map({ deadline < $0 }) ?? true {
                        pthread_cond_signal(condition)
                    }
                    return nil
                }
                switch outcome {
                case true?: continuation.resume()
                case false?: continuation.resume(throwing: CancellationError())
                case nil: break
                }
            }
        } onCancel: {
            let continuation = locked { () -> CheckedContinuation<Void, any Error>? in
                guard let entry = entries[token] else { return nil }
                if let continuation = entry.continuation {
                    entries[token] = nil
                    compactIfNeeded()
                    return continuation
                }
                entries[token]?.cancelled = true
                return nil
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Suspends for `duration`.
    public func sleep(for duration: Duration) async throws {
        try await sleep(until: .now + duration)
    }

    private func locked<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return body()
    }

    /// With the mutex held.
    private func startIfNeeded() {
        guard !started else { return }
        started = true
        var thread = pthread_t()
        let status = pthread_create(
            &thread, nil,
            { _ in
                Timers.shared.run()
                return nil
            }, nil)
        precondition(status == 0, "pthread_create failed (\(status)) for the timer thread")
        pthread_detach(thread)
    }

    private func run() {
        pthread_mutex_lock(mutex)
        while true {
            let now = ContinuousClock.now
            var due: [CheckedContinuation<Void, any Error>] = []
            while let top = heap.first, top.deadline <= now {
                popTop()
                if let entry = entries.removeValue(forKey: top.token), let continuation = entry.continuation {
                    due.append(continuation)
                }
            }
            if !due.isEmpty {
                pthread_mutex_unlock(mutex)
                for continuation in due { continuation.resume() }
                pthread_mutex_lock(mutex)
                continue
            }
            threadSleeps = true
            if let next = heap.first?.deadline {
                sleepingUntil = next
                var wake = timespec()
                clock_gettime(CLOCK_MONOTONIC, &wake)
                let (seconds, attoseconds) = (next - now).components
                var nanoseconds = Int64(wake.tv_nsec) + attoseconds / 1_000_000_000 + 1
                var wholeSeconds = Int64(wake.tv_sec) + seconds + nanoseconds / 1_000_000_000
                nanoseconds %= 1_000_000_000
                if wholeSeconds < 0 { wholeSeconds = 0 }
                wake.tv_sec = time_t(wholeSeconds)
                wake.tv_nsec = Int(nanoseconds)
                pthread_cond_timedwait(condition, mutex, &wake)
            } else {
                sleepingUntil = nil
                pthread_cond_wait(condition, mutex)
            }
            threadSleeps = false
            sleepingUntil = nil
        }
    }

    // MARK: - The heap (mutex held)

    private func push(_ deadline: ContinuousClock.Instant, _ token: UInt64) {
        heap.append((deadline, token))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func popTop() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        siftDown(0)
    }

    private func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count, heap[right].deadline < heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }

    /// Drops the heap's entries of cancelled sleeps once they are most of it, so that a far
    /// deadline cancelled many times leaves nothing behind.
    private func compactIfNeeded() {
        guard heap.count > 64, heap.count > 2 * entries.count else { return }
        heap.removeAll { entries[$0.token] == nil }
        for index in stride(from: heap.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
    }
}
