import Foundation

/// Runs a blocking call on a thread of its own, so it never occupies one of Swift concurrency's
/// few cooperative threads (this machine class may have two cores; a blocked pool thread stalls
/// everything else).
public func runBlocking<T: Sendable>(
    _ name: String, _ body: @escaping @Sendable () throws -> T
) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            continuation.resume(with: Result { try body() })
        }
        thread.name = name
        thread.start()
    }
}
