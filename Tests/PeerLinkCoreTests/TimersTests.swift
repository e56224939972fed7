import PeerLinkCore
import Testing

@Suite("Timers: sleeps on the timer thread")
struct TimersTests {
    @Test("sleeps end at their deadlines, earliest first, however they were started")
    func deadlinesInOrder() async throws {
        let order = Locked<[Int]>([])
        let lateStarts = Locked(0)
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, milliseconds) in [(3, 1600), (1, 1200), (2, 1400), (0, 1000)] {
                group.addTask {
                    // On a loaded machine a task may start after the first deadline passed; the
                    // order is only checked when every sleep began in time.
                    if ContinuousClock.now >= start + .milliseconds(1000) { lateStarts.withLock { $0 += 1 } }
                    try await Timers.shared.sleep(until: start + .milliseconds(milliseconds))
                    #expect(ContinuousClock.now >= start + .milliseconds(milliseconds))
                    order.withLock { $0.append(index) }
                }
            }
            try await group.waitForAll()
        }
        if lateStarts.withLock({ $0 }) == 0 {
            #expect(order.withLock { $0 } == [0, 1, 2, 3])
        }
    }

    @Test("a cancelled sleep ends at once with CancellationError and leaves nothing pending")
    func cancellationRemovesTheTimer() async throws {
        let before = Timers.shared.pendingCount
        // Many far deadlines, each cancelled soon after it started (what a session does when a
        // closer deadline comes): none of them may stay behind.
        for _ in 0..<200 {
            let sleeper = Task { try await Timers.shared.sleep(for: .seconds(3600)) }
            await Task.yield()
            sleeper.cancel()
            await #expect(throws: CancellationError.self) { try await sleeper.value }
        }
        // (Other suites running beside this one may add a few sleeps of their own.)
        #expect(Timers.shared.pendingCount < before + 100)
        // A sleep cancelled before it started does not start.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await Timers.shared.sleep(for: .seconds(3600))
        }
        await #expect(throws: CancellationError.self) { try await early.value }
    }

    @Test("a deadline that has passed returns at once")
    func pastDeadline() async throws {
        let start = ContinuousClock.now
        try await Timers.shared.sleep(until: start - .seconds(1))
        try await Timers.shared.sleep(for: .zero)
        #expect(ContinuousClock.now - start < .seconds(1))
    }
}
