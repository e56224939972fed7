import Dispatch
import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// A task executor that runs `probe` on the thread that wakes one of its tasks, at the moment it
/// wakes it: resuming a suspended task's continuation hands the task to its executor right
/// there, inside the resume. A probe that takes a lock therefore shows whether the waker held
/// that lock while resuming — the pattern that deadlocks with a cancellation handler taking the
/// same lock. Held, the probe's lock call is a recursive lock of a ``Locked`` value: the process
/// stops with "Recursive call to lock a Locked value".
final class WakeProbe: TaskExecutor, @unchecked Sendable {
    private let queue = DispatchQueue(label: "peerlink.test.wake-probe")
    private let probe: @Sendable () -> Void
    private let sink: AsyncStream<Void>.Continuation
    /// One element each time a task of this executor suspended (or ended) after running.
    let suspensions: AsyncStream<Void>

    init(probe: @escaping @Sendable () -> Void) {
        self.probe = probe
        (suspensions, sink) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .unbounded)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        probe()
        let job = UnownedJob(job)
        queue.async {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
            self.sink.yield()
        }
    }

    /// Waits until a task of this executor ran and suspended.
    func firstSuspension() async {
        for await _ in suspensions { return }
    }
}

@Suite("Waking tasks with no lock held")
struct WakeOutsideLockTests {
    @Test("a latch wakes a waiting task with its lock released")
    func latch() async {
        let latch = Latch()
        let probe = WakeProbe { _ = latch.isFired }
        let waiter = Task(executorPreference: probe) { await latch.wait() }
        // Its first suspension is in wait(), registered as a waiter.
        await probe.firstSuspension()
        #expect(latch.fire())
        await waiter.value
        #expect(latch.isFired)
    }

    @Test("a link wakes a task waiting for its handshake with its lock released")
    func linkHandshake() async throws {
        let log = TestLog()
        let pair = try await MemoryLinkTests.pair(log: log)
        let probe = WakeProbe { _ = pair.dialer.closure }
        let waiter = Task(executorPreference: probe) { try await pair.dialer.established }
        // Its first suspension is in `established`, before the links run.
        await probe.firstSuspension()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await pair.dialer.run() }
            group.addTask { await pair.listener.run() }
            let established = try await waiter.value
            #expect(established.remote.fingerprint == pair.listenerIdentity.fingerprint)
            pair.dialer.close()
            try await group.waitForAll()
        }
    }

    @Test("a link's own tasks (writer, reader, ticker, event consumer) are woken with its lock released")
    func linkRunning() async throws {
        let log = TestLog()
        // A manual clock that never moves: under a loaded parallel test run one side can be
        // starved for seconds, and the keep-alive must not end the link meanwhile.
        let pair = try await MemoryLinkTests.pair(clock: ManualClock(), log: log)
        let probe = WakeProbe { _ = pair.dialer.closure }
        // Everything of the dialer runs on the probe's executor: run() and its child tasks,
        // and the consumer of its events.
        let dialer = Task(executorPreference: probe) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await pair.dialer.run() }
                var received: [Int] = []
                for await event in pair.dialer.events {
                    if let index = LinkFixture.index(of: event) { received.append(index) }
                }
                return received
            }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await pair.listener.run() }
            _ = try await pair.listener.established
            for index in 1...50 { try await pair.listener.send(LinkFixture.message(index)) }
            pair.listener.close()
            #expect(await dialer.value == Array(1...50))
            try await group.waitForAll()
        }
    }

    @Test("a session's tasks (link writers, timer, links, event consumer) are woken with its locks released, also as its task is cancelled")
    func session() async throws {
        let network = MemoryNetwork()
        let clock = ManualClock()
        let log = TestLog()
        let ana = try SessionNode.memory("ana", on: network, automatic: true, clock: clock, log: log)
        let bo = try SessionNode.memory("bo", on: network, automatic: true, clock: clock, log: log)
        // The session's core lock, then the link's lock under it.
        let probe = WakeProbe { _ = ana.session.streamStatistics(for: bo.peer) }
        let anaRuns = Task(executorPreference: probe) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await ana.log.record(ana.session.events) }
                await ana.run()
            }
        }
        let boRuns = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await bo.log.record(bo.session.events) }
                await bo.run()
            }
        }
        ana.find([bo])
        bo.find([ana])
        try await ana.log.wait("Ana sees Bo connected") { $0.state(of: bo.peer) == .connected }
        try await bo.log.wait("Bo sees Ana connected") { $0.state(of: ana.peer) == .connected }
        let count = 50
        for index in 1...count {
            try await ana.session.send(Array("from Ana \(index)".utf8), to: [bo.peer])
            try await bo.session.send(Array("from Bo \(index)".utf8), to: [ana.peer])
        }
        try await bo.log.wait("\(count) messages at Bo") { $0.messages(from: ana.peer).count == count }
        try await ana.log.wait("\(count) messages at Ana") { $0.messages(from: bo.peer).count == count }
        // Cancelling Ana's task cancels her link writers and timer while her links wake them.
        let before = bo.log.events.count
        ana.kill.fire()
        await anaRuns.value
        // (Bo, automatic, goes on trying to reach Ana: connecting, or not connected.)
        try await bo.log.wait("Bo sees Ana's link gone") { events in
            events.dropFirst(before).contains {
                if case .peerStateChanged(ana.peer, let state, _) = $0 { state != .connected } else { false }
            }
        }
        await bo.session.disconnect()
        await boRuns.value
        ana.listener.close()
        bo.listener.close()
    }
}
