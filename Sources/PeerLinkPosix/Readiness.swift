#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
internal import CEpoll
import Foundation

/// Waits until descriptors become readable or writable, for every link of the process, on one
/// thread: a link's reads and writes are tried at once without blocking, and only a call that
/// would block parks here (no thread per call, no cooperative thread ever blocked).
///
/// Every descriptor that ever parked is registered with one epoll instance and stays there (the
/// kernel drops it from the set when it is closed). Parking arms it one-shot for what its
/// waiters want — one `epoll_ctl(2)` on the parking thread, with no set to rebuild and no thread
/// to wake — and the I/O thread sleeps in `epoll_wait(2)` until a descriptor is ready. A wait
/// ends when its descriptor is ready, hung up or in error (the caller's next call reports what
/// happened), or with `CancellationError` when the waiting task is cancelled. Closing a
/// descriptor while a task waits on it is the caller's to avoid: `Descriptor` keeps it open
/// until the wait returns, and its `close()` shuts the socket down and calls ``end(_:)``, which
/// ends the wait.
package final class Readiness: @unchecked Sendable {
    package static let shared = Readiness()

    private enum Entry {
        /// Registered, not yet parked: a cancel that comes first is remembered here.
        case starting
        case cancelled
        case parked(fd: Int32, events: UInt32, CheckedContinuation<Void, any Error>)
    }

    private let lock = NSLock()
    private var entries: [UInt64: Entry] = [:]
    /// The parked waits of each descriptor, oldest first (a link's reader and writer may park
    /// on the same socket at once).
    private var waiting: [Int32: [UInt64]] = [:]
    private var nextToken: UInt64 = 1
    private var epoll: Int32 = -1
    /// Descriptors being closed (see ``end(_:)``): a wait on one returns at once.
    private var ended: Set<Int32> = []
    /// Jobs of tasks that prefer the I/O thread (``IOThreadExecutor``), run between two
    /// `epoll_wait` calls, in the order they came.
    private var jobs: [UnownedJob] = []
    /// The I/O thread is in `epoll_wait`, or about to be, with no job left: a job queued from
    /// another thread then wakes it (``wakeCounter``).
    private var sleeping = false
    /// An eventfd in the epoll set, signalled to wake the I/O thread for a job.
    private var wakeCounter: Int32 = -1
    /// The I/O thread, once it runs.
    private var ioThread: pthread_t?
    /// When the I/O thread's current turn began (``Sys/monotonicNanoseconds()``): its
    /// `epoll_wait` returned and it went on to the continuations and jobs that followed.
    private var turnStarted: UInt64 = 0

    private static let hangUp = EPOLLERR.rawValue | EPOLLHUP.rawValue

    private init() {}

    /// Suspends until `fd` is readable (`POLLIN`) or writable (`POLLOUT`), hung up or failed.
    package func wait(for fd: Int32, events: Int16) async throws {
        // POLLIN and POLLOUT have the values of EPOLLIN and EPOLLOUT.
        let wanted = UInt32(UInt16(bitPattern: events)) & (EPOLLIN.rawValue | EPOLLOUT.rawValue)
        let token = try lock.withLock { () throws -> UInt64 in
            try startIfNeeded()
            defer { nextToken += 1 }
            entries[nextToken] = .starting
            return nextToken
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let outcome = lock.withLock { () -> Result<Void, any Error>? in
                    if case .cancelled = entries[token] {
                        entries[token] = nil
                        return .failure(CancellationError())
                    }
                    if ended.contains(fd) {
                        entries[token] = nil
                        return .success(())
                    }
                    entries[token] = .parked(fd: fd, events: wanted, continuation)
                    waiting[fd, default: []].append(token)
                    do {
                        try arm(fd)
                        return nil
                    } catch {
                        // Not a descriptor epoll can watch (closed already, or not pollable):
                        // the caller's next call on it says what is wrong.
                        entries[token] = nil
                        remove(token, of: fd)
                        return .success(())
                    }
                }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let continuation = lock.withLock { () -> CheckedContinuation<Void, any Error>? in
                switch entries[token] {
                case .starting:
                    entries[token] = .cancelled
                    return nil
                case .parked(let fd, _, let continuation):
                    // Left armed: an event that finds nobody waiting is dropped.
                    entries[token] = nil
                    remove(token, of: fd)
                    return continuation
                case .cancelled, nil:
                    return nil
                }
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Ends every wait on `fd`, and makes every later one return at once until ``forget(_:)``:
    /// for a descriptor being closed. Its shutdown ends a wait on a connected socket, but not on
    /// every kind of listening socket (a listening RFCOMM socket stays silent), and a task that
    /// took the descriptor just before the close may park just after it.
    package func end(_ fd: Int32) {
        let woken = lock.withLock { () -> [CheckedContinuation<Void, any Error>] in
            ended.insert(fd)
            let tokens = waiting.removeValue(forKey: fd) ?? []
            return tokens.compactMap { token in
                if case .parked(_, _, let continuation) = entries.removeValue(forKey: token) { return continuation }
                return nil
            }
        }
        for continuation in woken { continuation.resume() }
    }

    /// The descriptor `fd`, ended, is about to be closed, and its number may then be another
    /// socket's: waits on it are parked again.
    package func forget(_ fd: Int32) {
        lock.withLock { _ = ended.remove(fd) }
    }

    /// Whether the I/O thread sleeps in `epoll_wait` with no job queued: for tests.
    package var isIdle: Bool {
        lock.withLock { sleeping && jobs.isEmpty }
    }

    /// Whether waits on `fd` return at once (``end(_:)`` without ``forget(_:)`` since): for tests.
    package func isEnded(_ fd: Int32) -> Bool {
        lock.withLock { ended.contains(fd) }
    }

    /// Called with the lock held: arms `fd`, one-shot, for everything its parked waits want.
    private func arm(_ fd: Int32) throws(SystemError) {
        var events: UInt32 = 0
        for token in waiting[fd] ?? [] {
            if case .parked(_, let wanted, _) = entries[token] { events |= wanted }
        }
        guard events != 0 else { return }
        try Sys.epollArm(epoll, fd, events: events | EPOLLONESHOT.rawValue)
    }

    /// Called with the lock held.
    private func remove(_ token: UInt64, of fd: Int32) {
        guard var tokens = waiting[fd] else { return }
        tokens.removeAll { $0 == token }
        waiting[fd] = tokens.isEmpty ? nil : tokens
    }

    /// Queues `job` to run on the I/O thread, started if it was not, and wakes the thread if it
    /// sleeps in `epoll_wait`. False when the job is not queued: there is no I/O thread to be
    /// had (no epoll instance or eventfd: the process is out of descriptors), or the job comes
    /// from the I/O thread itself in a turn that has run for ``spillAfter`` already (a task
    /// moving bulk on it, sealing or copying record after record): it then goes to another
    /// thread rather than wait behind that work.
    func enqueue(_ job: UnownedJob) -> Bool {
        let queued = lock.withLock { () -> Bool? in
            guard (try? startIfNeeded()) != nil else { return nil }
            if let ioThread, Sys.isCurrentThread(ioThread), Sys.monotonicNanoseconds() &- turnStarted > Self.spillAfter { return nil }
            jobs.append(job)
            defer { sleeping = false }
            return sleeping
        }
        guard let wake = queued else { return false }
        if wake { Sys.signal(wakeCounter) }
        return true
    }

    /// Called with the lock held.
    private func startIfNeeded() throws(SystemError) {
        guard epoll < 0 else { return }
        let epoll = try Sys.epollCreate()
        do throws(SystemError) {
            wakeCounter = try Sys.eventCounter()
            // level-triggered, not one-shot: it stays armed
            try Sys.epollArm(epoll, wakeCounter, events: EPOLLIN.rawValue)
        } catch {
            Sys.close(epoll)
            if wakeCounter >= 0 { Sys.close(wakeCounter) }
            wakeCounter = -1
            throw error
        }
        self.epoll = epoll
        // The process moves messages from now on: the heap keeps what they free (HeapTuning).
        HeapTuning.apply()
        let thread = Thread { [self] in
            Sys.nameCurrentThread("peerlink-io")
            run()
        }
        thread.start()
    }

    private func run() {
        lock.withLock { ioThread = Sys.currentThread() }
        var events = [epoll_event](repeating: epoll_event(), count: 64)
        let executor = IOThreadExecutor.shared.asUnownedTaskExecutor()
        while true {
            // Sleeps only with no job queued; a job queued from now on signals the counter.
            let block = lock.withLock { () -> Bool in
                sleeping = jobs.isEmpty
                return sleeping
            }
            let count: Int
            do {
                count = try events.withUnsafeMutableBufferPointer { buffer throws(SystemError) in
                    try Sys.epollWait(epoll, into: buffer, block: block)
                }
            } catch {
                // Only a broken epoll descriptor fails here (EBADF, EINVAL): nothing to wait on.
                Sys.sleep(milliseconds: 100)
                continue
            }
            var ready: [CheckedContinuation<Void, any Error>] = []
            let turn = Sys.monotonicNanoseconds()
            lock.withLock {
                sleeping = false
                turnStarted = turn
                for event in events[0..<count] {
                    let fd = event.data.fd
                    if fd == wakeCounter {
                        Sys.drainCounter(fd)
                        continue
                    }
                    guard let tokens = waiting[fd] else { continue }
                    var left: [UInt64] = []
                    for token in tokens {
                        guard case .parked(_, let wanted, let continuation) = entries[token] else { continue }
                        if event.events & (wanted | Self.hangUp) != 0 {
                            entries[token] = nil
                            ready.append(continuation)
                        } else {
                            left.append(token)
                        }
                    }
                    waiting[fd] = left.isEmpty ? nil : left
                    // One-shot: what still waits (the other direction) is armed again.
                    if !left.isEmpty, (try? arm(fd)) == nil {
                        for token in left {
                            if case .parked(_, _, let continuation) = entries.removeValue(forKey: token) { ready.append(continuation) }
                        }
                        waiting[fd] = nil
                    }
                }
            }
            // A task that prefers this thread, resumed here, queues its job here (no wake-up).
            for continuation in ready { continuation.resume() }
            // The jobs queued, and those they queue in turn (a read wakes the app's task, whose
            // send wakes nothing here): a few rounds before the sockets are looked at again.
            for _ in 0..<Self.jobRounds {
                let queued = lock.withLock { () -> [UnownedJob] in
                    defer { jobs = [] }
                    return jobs
                }
                if queued.isEmpty { break }
                for job in queued { job.runSynchronously(on: executor) }
            }
        }
    }

    /// Rounds of jobs run between two looks at the sockets (see ``run()``).
    private static let jobRounds = 8

    /// How long a turn of the I/O thread may have run before the jobs it queues go to Swift's
    /// pool instead (see ``enqueue(_:)``), in nanoseconds: above what a turn of a small message's
    /// round trip takes (a whole round trip, at least two turns, took 70–190 µs on the project's
    /// slow 2-CPU machine), so round trips hand over next to nothing.
    static let spillAfter: UInt64 = 200_000
}

/// Runs the jobs of the tasks that prefer it on PeerLink's I/O thread, the thread that waits for
/// every socket of the process (epoll): a task that reads a socket, and the tasks it wakes, then
/// go on where the read's readiness was seen, with no other thread woken. Swift's global
/// executor hands each of those steps to a pool thread, which must be woken (on another CPU,
/// often an idle one): on loopback, the largest part of a small message's round trip.
///
/// Opt in for a whole session with a task executor preference around both its `run()` and the
/// loop that takes its events (the session's own tasks are children of `run()` and inherit it):
///
/// ```swift
/// await withTaskExecutorPreference(IOThreadExecutor.shared) {
///     await withDiscardingTaskGroup { group in
///         group.addTask { await session.run() }
///         for await event in session.events { … }
///     }
/// }
/// ```
///
/// Everything that prefers it then runs on one thread while the work comes in small steps: round
/// trips are shorter. When a turn of the I/O thread has run for 200 µs (a bulk transfer sealing
/// or copying record after record), the jobs it queues from then on until its next look at the
/// sockets go to Swift's pool, so bulk work spreads over the machine's CPUs again, if less
/// evenly than on the pool alone; see the Performance article for both. So a task that prefers
/// it may run on a pool thread for a while: it is a preference, not a guarantee of one thread
/// (no `TaskExecutor` is). Like any event loop, it must never be blocked: code that waits on a
/// lock held across I/O, sleeps, or reads a file at length belongs on another executor, since
/// the sockets of every link wait while it runs.
public final class IOThreadExecutor: TaskExecutor, Sendable {
    /// The one I/O thread's executor (the thread starts with its first job or socket wait).
    public static let shared = IOThreadExecutor()

    private init() {}

    /// Queues `job` for the I/O thread, waking it if it sleeps; or hands it to Swift's pool when
    /// the I/O thread queues it late in a long turn.
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // Not queued (the I/O thread busy for a while, or none to be had because the process is
        // out of descriptors): the job runs on the pool.
        if !Readiness.shared.enqueue(job) { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }
}
