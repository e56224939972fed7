#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import Testing

/// Tasks that prefer PeerLink's I/O thread (`IOThreadExecutor`): their jobs run there, between
/// two looks at the sockets, whether they were queued from that thread or from another one while
/// it slept, except those it queues late in a long turn; and two sessions run there end to end.
/// One test at a time: a test's jobs in the same turn of the I/O thread as another's busy job
/// (`aLongTurnHandsJobsToThePool`) would be handed to the pool.
@Suite("IOThreadExecutor: tasks on the I/O thread", .serialized, .timeLimit(.minutes(1)))
struct IOThreadExecutorTests {
    /// The thread a task that prefers the I/O thread runs on.
    static func ioThread() async -> pthread_t {
        await withTaskExecutorPreference(IOThreadExecutor.shared) { pthread_self() }
    }

    @Test("every task that prefers it runs on one thread, not one of Swift's pool, also after a socket wait")
    func oneThread() async throws {
        let io = await Self.ioThread()
        let pool = await Task.detached { pthread_self() }.value
        #expect(pthread_equal(io, pool) == 0, "a task without the preference ran on the I/O thread")
        let seen = await withTaskGroup(of: pthread_t.self) { group in
            for _ in 0..<20 { group.addTask(executorPreference: IOThreadExecutor.shared) { pthread_self() } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(seen.count == 20 && seen.allSatisfy { pthread_equal($0, io) != 0 })
        // named so that `top -H`, perf and debuggers show it
        let name = await withTaskExecutorPreference(IOThreadExecutor.shared) {
            (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
        }
        #expect(name == "peerlink-io\n")

        // A socket wait resumes the task where the readiness was seen: the same thread. Up to
        // three tries: a turn that a loaded machine preempts long enough hands the resumed task
        // to Swift's pool (see `aLongTurnHandsJobsToThePool`), which is right there.
        var resumedOnIOThread = false
        for _ in 0..<3 where !resumedOnIOThread {
            let pair = try ReadinessTests.SocketPair()
            defer { pair.close() }
            let after = try await withTaskExecutorPreference(IOThreadExecutor.shared) { () async throws -> pthread_t in
                let writer = Task.detached {
                    try await Task.sleep(for: .milliseconds(20))
                    pair.write(pair.b)
                }
                try await Readiness.shared.wait(for: pair.a, events: Int16(POLLIN))
                try await writer.value
                return pthread_self()
            }
            resumedOnIOThread = pthread_equal(after, io) != 0
        }
        #expect(resumedOnIOThread, "a task resumed by a socket wait ran on Swift's pool three times out of three")
    }

    @Test("a job queued from another thread while the I/O thread sleeps in epoll_wait wakes it")
    func wakesASleepingThread() async throws {
        _ = await Self.ioThread()
        for _ in 0..<5 {
            // Until the thread has run out of jobs and sleeps; without the wake-up the job would
            // wait for the next socket event, which never comes (the time limit).
            let idleBy = ContinuousClock.now + .seconds(10)
            while !Readiness.shared.isIdle {
                try #require(ContinuousClock.now < idleBy, "the I/O thread never went idle")
                try await Task.sleep(for: .milliseconds(1))
            }
            let started = ContinuousClock.now
            _ = await Self.ioThread()
            #expect(ContinuousClock.now - started < .seconds(5))
        }
    }

    @Test(
        "a job the I/O thread queues late in a long turn (bulk work on it) runs on Swift's pool at once, beside that work, instead of waiting behind it"
    )
    func aLongTurnHandsJobsToThePool() async throws {
        let io = await Self.ioThread()
        let ran = Locked<pthread_t?>(nil)
        let waited = await withTaskExecutorPreference(IOThreadExecutor.shared) { () async -> Bool in
            // This job keeps the I/O thread busy: past the hand-over point first, then until the
            // task it starts has run somewhere (at most 5 s: queued here, it never would).
            let busyUntil = ContinuousClock.now + .milliseconds(2)
            while ContinuousClock.now < busyUntil {}
            let task = Task(executorPreference: IOThreadExecutor.shared) { ran.withLock { $0 = pthread_self() } }
            let deadline = ContinuousClock.now + .seconds(5)
            while ran.withLock({ $0 }) == nil, ContinuousClock.now < deadline {}
            await task.value
            return ContinuousClock.now >= deadline
        }
        #expect(!waited, "the task started late in a long turn waited for the I/O thread")
        let thread = try #require(ran.withLock { $0 })
        #expect(pthread_equal(thread, io) == 0, "it ran on the I/O thread")
        // and a task started afterwards, in a turn of its own, is back on the I/O thread
        #expect(pthread_equal(await Self.ioThread(), io) != 0)
    }

    @Test("two sessions on the I/O thread connect, exchange messages in order both ways, and stop")
    func sessionsOnTheIOThread() async throws {
        let io = await Self.ioThread()
        let log = TestLog()
        let ana = try PeerSessionTCPTests.node("ana", log: log)
        let bo = try PeerSessionTCPTests.node("bo", log: log)
        try await withTaskExecutorPreference(IOThreadExecutor.shared) {
            try await withRunning([ana, bo]) {
                #expect(pthread_equal(pthread_self(), io) != 0)
                ana.find([bo])
                bo.find([ana])
                try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
                try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
                let count = 500
                for index in 1...count {
                    try await ana.session.send(Array("ana \(index)".utf8), to: [bo.peer])
                    try await bo.session.send(Array("bo \(index)".utf8) + [UInt8](repeating: 1, count: index * 40), to: [ana.peer])
                }
                try await bo.log.wait("\(count) messages at Bo") { $0.messages(from: ana.peer).count == count }
                try await ana.log.wait("\(count) messages at Ana") { $0.messages(from: bo.peer).count == count }
                #expect(bo.log.events.messages(from: ana.peer) == (1...count).map { Array("ana \($0)".utf8) })
                #expect(
                    ana.log.events.messages(from: bo.peer)
                        == (1...count).map { Array("bo \($0)".utf8) + [UInt8](repeating: 1, count: $0 * 40) })
                // (A send of this many bytes may have gone on on the pool for a while: see
                // aLongTurnHandsJobsToThePool.)
            }
        }
        #expect(ana.log.events.linkFailures.isEmpty, "\(ana.log.events.linkFailures)")
        #expect(bo.log.events.linkFailures.isEmpty, "\(bo.log.events.linkFailures)")
    }
}
