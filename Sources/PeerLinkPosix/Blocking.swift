#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore

/// Runs a blocking call on a thread of its own, so it never occupies one of Swift concurrency's
/// few cooperative threads (this machine class may have two cores; a blocked pool thread stalls
/// everything else).
///
/// The body's error type is kept: a body that throws only `PeerLinkError` makes this throw only
/// `PeerLinkError`, and a body that cannot throw makes a call that cannot either. The caller's
/// task waits suspended; cancelling it does not stop the body (give the body its own timeout).
public func runBlocking<T: Sendable, Failure: Error>(
    _ name: String, _ body: @escaping @Sendable () throws(Failure) -> T
) async throws(Failure) -> T {
    let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, Failure>, Never>) in
        // Named for `top -H` and perf (Thread.name does not reach the system's name on Linux).
        Thread.detachNewThread {
            Sys.nameCurrentThread(name)
            continuation.resume(returning: Result { () throws(Failure) -> T in try body() })
        }
    }
    return try result.get()
}

/// ``runBlocking(_:_:)`` for a call the kernel may never return from (a Bluetooth connect over
/// a controller that lost its peer can sit in the kernel with no timeout): the caller waits at
/// most `limit`, and no longer than until its task is cancelled (`flag` is set then, for a
/// body that looks). When the caller gave up first, the thread still runs to its end and its
/// result goes to `discard` (a connection nobody took is closed there).
///
/// - Throws: the body's error; `SystemError(ETIMEDOUT)` after `limit`; `CancellationError`.
package func runBlockingAbandonable<T: Sendable>(
    _ name: String, limit: Duration, discard: @escaping @Sendable (T) -> Void,
    _ body: @escaping @Sendable (CancellationFlag) throws -> T
) async throws -> T {
    let flag = CancellationFlag()
    let waiter = OneShot<T>(discard: discard)
    let timer = Task {
        do { try await Timers.shared.sleep(for: limit) } catch { return }
        flag.cancel()
        waiter.finish(with: .failure(SystemError("connect", errno: ETIMEDOUT)))
    }
    defer { timer.cancel() }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            waiter.arm(continuation)
            Thread.detachNewThread {
                Sys.nameCurrentThread(name)
                waiter.finish(with: Result { try body(flag) })
            }
        }
    } onCancel: {
        flag.cancel()
        waiter.finish(with: .failure(CancellationError()))
    }
}

/// One continuation, resumed once: by the first result (or failure) that comes. A value that
/// comes after goes to `discard`.
private final class OneShot<T: Sendable>: Sendable {
    private let state = Locked<(continuation: CheckedContinuation<T, any Error>?, pending: Result<T, any Error>?, done: Bool)>(
        (nil, nil, false))
    private let discard: @Sendable (T) -> Void

    init(discard: @escaping @Sendable (T) -> Void) { self.discard = discard }

    func arm(_ continuation: CheckedContinuation<T, any Error>) {
        let pending = state.withLock { state -> Result<T, any Error>? in
            if let pending = state.pending {
                state.pending = nil
                return pending
            }
            state.continuation = continuation
            return nil
        }
        if let pending { continuation.resume(with: pending) }
    }

    private enum Action { case resume(CheckedContinuation<T, any Error>), keep, late }

    func finish(with result: Result<T, any Error>) {
        let action = state.withLock { state -> Action in
            if state.done { return .late }
            state.done = true
            if let continuation = state.continuation {
                state.continuation = nil
                return .resume(continuation)
            }
            state.pending = result
            return .keep
        }
        switch action {
        case .resume(let continuation): continuation.resume(with: result)
        case .keep: break
        case .late: if case .success(let value) = result { discard(value) }
        }
    }
}
