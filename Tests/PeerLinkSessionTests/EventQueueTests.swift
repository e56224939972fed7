import PeerLinkCore
import PeerLinkSession
import Testing

/// The queue behind a session's (and a node's) events: one consumer, in order, batches taken
/// whole, each event counted as taken once the consumer is done with it (told in runs, all of
/// them by the time the consumer waits).
@Suite("EventQueue", .timeLimit(.minutes(1)))
struct EventQueueTests {
    @Test("events come out in order, counted as taken in runs once the consumer asks for more (all by the time it waits), queued ones before the end")
    func orderAndEnd() async {
        let queue = EventQueue<Int>()
        let counted = Locked<[Int]>([])
        let runs = Locked(0)
        let events = EventSequence(queue: queue, taken: { run in
            counted.withLock { $0 += run }
            runs.withLock { $0 += 1 }
        })
        for value in 0..<1000 { #expect(queue.yield(value)) }
        let consumer = Task {
            var seen: [Int] = []
            for await value in events {
                // Not counted while the consumer has it; at most a run of them untold.
                let last = counted.withLock { $0.last } ?? -1
                #expect(last < value && value - last <= EventSequence<Int>.maxUntoldEvents, "\(value) handed out, \(last) told")
                seen.append(value)
                if value == 999 { queue.yield(1000) }
            }
            return seen
        }
        // Some while the consumer waits, then the end: what is queued still comes first.
        await Self.untilWaiting(queue)
        #expect(counted.withLock { $0 } == Array(0...1000), "a consumer that waits has every event it took counted")
        for value in 1001..<1100 { queue.yield(value) }
        queue.finish()
        #expect(!queue.yield(5000), "an event after the end is refused")
        let seen = await consumer.value
        #expect(seen == Array(0..<1100))
        #expect(counted.withLock { $0 } == Array(0..<1100))
        #expect(runs.withLock { $0 } <= 1100 / 16, "\(runs.withLock { $0 }) runs told for 1100 events")
    }

    @Test("a run of events yielded at once comes out in order, between single ones, and wakes a waiting consumer with all of it")
    func yieldingARun() async {
        let queue = EventQueue<Int>()
        let events = EventSequence(queue: queue, taken: { _ in })
        let consumer = Task {
            var seen: [Int] = []
            for await value in events { seen.append(value) }
            return seen
        }
        await Self.untilWaiting(queue)
        #expect(queue.yield(contentsOf: [0, 1, 2]))
        queue.yield(3)
        #expect(queue.yield(contentsOf: []))
        #expect(queue.yield(contentsOf: [4, 5]))
        queue.finish()
        #expect(!queue.yield(contentsOf: [6]), "a run after the end is refused")
        #expect(await consumer.value == [0, 1, 2, 3, 4, 5])
    }

    @Test("heavy events are told sooner: at most 64 KiB of them untold")
    func heavyEventsToldSooner() async {
        let queue = EventQueue<Int>()
        let counted = Locked<[Int]>([])
        // Each event weighs 40 KiB: told after every second one at the latest.
        let events = EventSequence(queue: queue, taken: { run in counted.withLock { $0 += run } }, weight: { _ in 40 * 1024 })
        for value in 0..<20 { queue.yield(value) }
        queue.finish()
        for await value in events {
            let last = counted.withLock { $0.last } ?? -1
            #expect(value - last <= 2, "\(value) handed out, \(last) told")
        }
        #expect(counted.withLock { $0 } == Array(0..<20))
    }

    @Test("a waiting consumer is woken by the next event and by the end")
    func waitingConsumer() async {
        let queue = EventQueue<String>()
        let events = EventSequence(queue: queue, taken: { _ in })
        let consumer = Task {
            var iterator = events.makeAsyncIterator()
            let first = await iterator.next()
            let second = await iterator.next()
            return (first, second)
        }
        await Self.untilWaiting(queue)
        queue.yield("one")
        await Self.untilWaiting(queue)
        queue.finish()
        let (first, second) = await consumer.value
        #expect(first == "one")
        #expect(second == nil)
    }

    @Test("a cancelled consumer's iteration ends, waiting or not, even while events keep coming")
    func cancellation() async {
        let queue = EventQueue<Int>()
        let events = EventSequence(queue: queue, taken: { _ in })
        // Waiting when cancelled.
        let waiting = Task {
            var count = 0
            for await _ in events { count += 1 }
            return count
        }
        await Self.untilWaiting(queue)
        waiting.cancel()
        #expect(await waiting.value == 0)
        #expect(!queue.yield(1), "nobody takes events once the consumer is gone")

        // Busy when cancelled: a producer that never stops does not keep it going.
        let busyQueue = EventQueue<Int>()
        let busyEvents = EventSequence(queue: busyQueue, taken: { _ in })
        let producer = Task.detached {
            var value = 0
            while busyQueue.yield(value), value < 5_000_000 { value += 1 }
        }
        let busy = Task {
            var count = 0
            for await _ in busyEvents {
                count += 1
                if count == 1000 { withUnsafeCurrentTask { $0?.cancel() } }
            }
            return count
        }
        let count = await busy.value
        #expect(count >= 1000)
        await producer.value
    }

    @Test("a consumer that leaves its loop and iterates again misses nothing, each event counted once")
    func iteratingAgain() async {
        let queue = EventQueue<Int>()
        let counted = Locked<[Int]>([])
        let events = EventSequence(queue: queue, taken: { run in counted.withLock { $0 += run } })
        for value in 0..<10 { queue.yield(value) }
        var seen: [Int] = []
        // Leaves after 3 of the 10 taken in one batch: the other 7 go back to the queue.
        for await value in events {
            seen.append(value)
            if value == 2 { break }
        }
        queue.yield(10)
        for await value in events {
            seen.append(value)
            if value == 5 { break }
        }
        // An iterator that holds a batch when another consumer waits: what it did not hand out
        // goes to that consumer as it goes.
        let waiting: Task<Int?, Never>
        do {
            var holder = events.makeAsyncIterator()
            seen.append(await holder.next() ?? -1)
            waiting = Task {
                var iterator = events.makeAsyncIterator()
                return await iterator.next()
            }
            await Self.untilWaiting(queue)
        }  // the holder goes here
        #expect(await waiting.value == 7)
        queue.yield(11)
        queue.finish()
        for await value in events { seen.append(value) }
        #expect(seen == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11], "7 went to the waiting consumer")
        #expect(counted.withLock { $0 }.sorted() == Array(0...11))
    }

    /// Returns once the queue's consumer waits for an event (the suite's time limit bounds it).
    static func untilWaiting<Element>(_ queue: EventQueue<Element>) async {
        while !queue.consumerWaits { await Task.yield() }
    }
}
