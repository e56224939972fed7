import Dispatch
import PeerLinkCore
import Testing

@Suite("Locked: PeerLink's lock")
struct LockedTests {
    @Test("increments from many threads at once are all counted")
    func countsEveryIncrement() {
        let counter = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<10_000 { counter.withLock { $0 += 1 } }
        }
        #expect(counter.withLock { $0 } == 80_000)
    }

    @Test("an error thrown under the lock leaves it released and the change made before it kept")
    func throwsAndReleases() {
        struct Refused: Error {}
        let value = Locked([1])
        #expect(throws: Refused.self) {
            try value.withLock { (array: inout [Int]) throws(Refused) in
                array.append(2)
                throw Refused()
            }
        }
        #expect(value.withLock { $0 } == [1, 2])
    }

    @Test("taking the lock again on the thread that holds it stops the process instead of hanging")
    func recursiveLockStops() async {
        await #expect(processExitsWith: .failure) {
            let value = Locked(0)
            value.withLock { _ in value.withLock { $0 += 1 } }
        }
    }
}
