#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Foundation

/// Waits until descriptors become readable or writable, for every link of the process, on one
/// thread: a link's reads and writes are tried at once without blocking, and only a call that
/// would block parks here (no thread per call, no cooperative thread ever blocked).
///
/// The thread sleeps in `poll(2)` on every parked descriptor plus a pipe that wakes it when one
/// is added. A wait ends when the descriptor is ready, hung up or in error (the caller's next
/// call reports what happened), or with `CancellationError` when the waiting task is cancelled.
/// Closing a descriptor while a task waits on it is the caller's to avoid: `Descriptor` keeps
/// it open until the wait returns, and `shutdown(2)` (what `Descriptor.close()` does first)
/// ends the wait.
package final class Readiness: @unchecked Sendable {
    package static let shared = Readiness()

    private enum Entry {
        /// Registered, not yet parked: a cancel that comes first is remembered here.
        case starting
        case cancelled
        case parked(fd: Int32, events: Int16, CheckedContinuation<Void, any Error>)
    }

    private let lock = NSLock()
    private var entries: [UInt64: Entry] = [:]
    private var nextToken: UInt64 = 1
    private var wakeRead: Int32 = -1
    private var wakeWrite: Int32 = -1
    private var started = false

    private init() {}

    /// Suspends until `fd` is readable (`POLLIN`) or writable (`POLLOUT`), hung up or failed.
    package func wait(for fd: Int32, events: Int16) async throws {
        let token = try lock.withLock { () throws -> UInt64 in
            try startIfNeeded()
            defer { nextToken += 1 }
            entries[nextToken] = .starting
            return nextToken
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let cancelled = lock.withLock { () -> Bool in
                    if case .cancelled = entries[token] {
                        entries[token] = nil
                        return true
                    }
                    entries[token] = .parked(fd: fd, events: events, continuation)
                    return false
                }
                if cancelled {
                    continuation.resume(throwing: CancellationError())
                } else {
                    wake()
                }
            }
        } onCancel: {
            let continuation = lock.withLock { () -> CheckedContinuation<Void, any Error>? in
                switch entries[token] {
                case .starting:
                    entries[token] = .cancelled
                    return nil
                case .parked(_, _, let continuation):
                    entries[token] = nil
                    return continuation
                case .cancelled, nil:
                    return nil
                }
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Called with the lock held.
    private func startIfNeeded() throws(SystemError) {
        guard !started else { return }
        var ends: [Int32] = [0, 0]
        guard Glibc.pipe(&ends) == 0 else { throw SystemError("pipe", errno: errno) }
        started = true
        for end in ends {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        let thread = Thread { [self] in run() }
        thread.name = "peerlink-io"
        thread.start()
    }

    private func wake() {
        var byte: UInt8 = 1
        // A full pipe already holds a wake-up: nothing is lost by a failed write.
        _ = Glibc.write(wakeWrite, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        while true {
            var tokens: [UInt64] = []
            var polled: [pollfd] = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            lock.withLock {
                for (token, entry) in entries {
                    guard case .parked(let fd, let events, _) = entry else { continue }
                    tokens.append(token)
                    polled.append(pollfd(fd: fd, events: events, revents: 0))
                }
            }
            let count = polled.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, nfds_t($0.count), -1) }
            guard count > 0 else { continue }  // EINTR
            if polled[0].revents != 0 {
                while Glibc.read(wakeRead, &drain, drain.count) > 0 {}
            }
            var ready: [CheckedContinuation<Void, any Error>] = []
            lock.withLock {
                for (index, token) in tokens.enumerated() where polled[index + 1].revents != 0 {
                    if case .parked(_, _, let continuation) = entries.removeValue(forKey: token) {
                        ready.append(continuation)
                    }
                }
            }
            for continuation in ready { continuation.resume() }
        }
    }
}
