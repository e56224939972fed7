import Foundation
import Testing

/// Runs a test on a thread of its own instead of Swift's cooperative pool: for tests that compute
/// synchronously for a long time (seeded simulations, thousands of cases).
///
/// The test process shares one cooperative pool, as wide as the machine has CPUs (two here), with
/// every suite that runs at the same time. A simulation that keeps a pool thread busy for seconds
/// starves the tasks of the other suites — the integration tests' timers, probes and link tasks —
/// and their timed expectations fail for want of a thread, not for a fault (measured: both pool
/// threads held for 20–30 s by the simulations, a liveness test's `lost` event 3.5 s late).
/// Every test with this trait runs its jobs, in turn, on one dedicated thread: the kernel
/// schedules that thread beside the pool, and the simulations never hold more than one CPU
/// between them.
struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    var isRecursive: Bool { true }

    func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await withTaskExecutorPreference(SimulationThread.shared) {
            try await function()
        }
    }
}

extension Trait where Self == OwnThreadTrait {
    /// Runs the test (or each test of the suite) on the simulations' own thread.
    static var ownThread: Self { OwnThreadTrait() }
}

/// A task executor with one thread, running the jobs given to it in the order they came.
final class SimulationThread: TaskExecutor, @unchecked Sendable {
    static let shared = SimulationThread()

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    private init() {
        let thread = Thread { [unowned self] in self.run() }
        thread.name = "peerlink.test.simulations"
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty { condition.wait() }
            let batch = jobs
            jobs.removeAll(keepingCapacity: true)
            condition.unlock()
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
        }
    }
}
