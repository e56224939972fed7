import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What one engine does for one measurement. Every engine moves the same bytes between two
/// sockets of one loopback TCP connection (`TCP_NODELAY` on) and reads in pieces of at most
/// 64 KiB, the size a PeerLink link reads.
protocol Engine: Sendable {
    var name: String { get }
    /// Seconds to move `total` bytes one way, written `chunk` bytes per call.
    func bulk(total: Int, chunk: Int) async throws -> Double
    /// Seconds to move `count` messages of `size` bytes one way, one write call each.
    func smallWrites(count: Int, size: Int) async throws -> Double
    /// Seconds per round trip of `size` bytes (written, echoed, read back), one at a time.
    func roundTrips(samples: Int, size: Int) async throws -> [Double]
}

struct MeasureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

/// Processor time (user and system, every thread) this process has used, in seconds.
func processorSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    func value(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
    return value(usage.ru_utime) + value(usage.ru_stime)
}

/// A thread whose result can be waited for.
final class Joinable<T: Sendable>: @unchecked Sendable {
    private let condition = NSCondition()
    private var result: Result<T, any Error>?

    init(_ name: String, _ body: @escaping @Sendable () throws -> T) {
        let thread = Thread { [self] in
            let outcome = Result { try body() }
            condition.lock()
            result = outcome
            condition.broadcast()
            condition.unlock()
        }
        thread.name = name
        thread.start()
    }

    func join() throws -> T {
        condition.lock()
        defer { condition.unlock() }
        while result == nil { condition.wait() }
        return try result!.get()
    }
}

/// Runs blocking `body` on a thread of its own, not on one of Swift concurrency's.
func onThread<T: Sendable>(_ name: String, _ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread { continuation.resume(with: Result { try body() }) }
        thread.name = name
        thread.start()
    }
}

func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
    guard !sorted.isEmpty else { return .nan }
    let index = min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.down)))
    return sorted[index]
}

func median(_ values: [Double]) -> Double { percentile(values.sorted(), 0.5) }
