#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore
import PeerLinkPosix
import Testing

/// The I/O thread's waits (`Readiness`, epoll): one-shot arming per wait, two directions parked
/// on one socket, cancellation, descriptor numbers reused.
@Suite("Readiness: waits on the I/O thread", .timeLimit(.minutes(1)))
struct ReadinessTests {
    /// A connected pair of non-blocking stream sockets.
    final class SocketPair: Sendable {
        let a: Int32
        let b: Int32

        init() throws {
            var ends: [Int32] = [-1, -1]
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else {
                throw SystemError("socketpair", errno: errno)
            }
            (a, b) = (ends[0], ends[1])
            for fd in ends { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        }

        /// Writes to `fd` until its buffer is full.
        func fill(_ fd: Int32) {
            let block = [UInt8](repeating: 7, count: 65536)
            while block.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) > 0 {}
        }

        /// Reads everything waiting at `fd`.
        func drain(_ fd: Int32) -> Int {
            var total = 0
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if count <= 0 { return total }
                total += count
            }
        }

        func write(_ fd: Int32) {
            var byte: UInt8 = 1
            _ = send(fd, &byte, 1, Int32(MSG_NOSIGNAL))
        }

        func close() {
            Glibc.close(a)
            Glibc.close(b)
        }
    }

    @Test("a descriptor closed while its last call returns on another thread: its number is closed after its waits were ended, never left ended")
    func closeRacingTheLastUser() async throws {
        for _ in 0..<3000 {
            let pair = try SocketPair()
            let descriptor = Descriptor(pair.a)
            _ = try descriptor.acquire("test")
            let go = Locked(false)
            let released = Locked(false)
            // The last call returns on another thread while close() runs on this one.
            let releaser = Thread {
                while !go.withLock({ $0 }) {}
                descriptor.release()
                released.withLock { $0 = true }
            }
            releaser.start()
            go.withLock { $0 = true }
            descriptor.close()
            while !released.withLock({ $0 }) { usleep(50) }
            Glibc.close(pair.b)
            // Both returned, so the number is closed, and it must not stay ended: a socket that
            // takes the number next would have every wait return at once (its reader would
            // spin). Another test's descriptor that has this number and is being closed right
            // now is ended only for a moment: looked at again for up to 20 ms.
            var ended = Readiness.shared.isEnded(pair.a)
            var looks = 0
            while ended, looks < 20 {
                usleep(1000)
                looks += 1
                ended = Readiness.shared.isEnded(pair.a)
            }
            #expect(!ended, "descriptor \(pair.a) left ended after its number was closed")
            if ended { break }
        }
    }

    @Test("a reader and a writer parked on one socket each wake for their own event, in either order")
    func bothDirectionsOnOneSocket() async throws {
        let pair = try SocketPair()
        defer { pair.close() }
        pair.fill(pair.a)
        let fd = pair.a
        let writer = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLOUT)) }
        let reader = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLIN)) }
        // Both park (the writer's socket is full, nothing is there to read); the reader's event
        // comes first, and the writer's registration must be armed again after it.
        try await Task.sleep(for: .milliseconds(50))
        pair.write(pair.b)
        try await reader.value
        #expect(pair.drain(pair.b) > 0)  // room again at a's end
        try await writer.value
    }

    @Test("cancelling one wait leaves the other wait on the same socket parked and woken")
    func cancelOneOfTwo() async throws {
        let pair = try SocketPair()
        defer { pair.close() }
        pair.fill(pair.a)
        let fd = pair.a
        let writer = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLOUT)) }
        let reader = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLIN)) }
        try await Task.sleep(for: .milliseconds(50))
        writer.cancel()
        await #expect(throws: CancellationError.self) { try await writer.value }
        pair.write(pair.b)
        try await reader.value
    }

    @Test("a descriptor number closed and used again by a new socket is watched anew")
    func reusedNumbers() async throws {
        for _ in 0..<20 {
            let pair = try SocketPair()
            let fd = pair.a
            let reader = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLIN)) }
            try await Task.sleep(for: .milliseconds(2))
            pair.write(pair.b)
            try await reader.value
            pair.close()
        }
    }

    @Test("a thousand waits in turn on many sockets each end with their event")
    func manyWaits() async throws {
        let pairs = try (0..<16).map { _ in try SocketPair() }
        defer { for pair in pairs { pair.close() } }
        for round in 0..<64 {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for pair in pairs {
                    let fd = pair.a
                    group.addTask { try await Readiness.shared.wait(for: fd, events: Int16(POLLIN)) }
                }
                for (index, pair) in pairs.enumerated() where (index + round) % 2 == 0 { pair.write(pair.b) }
                for (index, pair) in pairs.enumerated() where (index + round) % 2 == 1 { pair.write(pair.b) }
                try await group.waitForAll()
            }
            for pair in pairs { _ = pair.drain(pair.a) }
        }
    }

    @Test("closing a Descriptor ends a wait the kernel would not end (a pipe: shutdown does nothing to it)")
    func closeEndsAWaitShutdownCannot() async throws {
        var ends: [Int32] = [-1, -1]
        #expect(pipe(&ends) == 0)
        defer { Glibc.close(ends[1]) }
        let descriptor = Descriptor(ends[0])
        let reader = Task {
            let fd = try descriptor.acquire("read")
            defer { descriptor.release() }
            try await Readiness.shared.wait(for: fd, events: Int16(POLLIN))
        }
        try await Task.sleep(for: .milliseconds(50))
        descriptor.close()
        try await reader.value
        #expect(throws: SystemError.self) { _ = try descriptor.acquire("read") }
    }

    @Test("a task that took a Descriptor before its close and parks after it returns at once")
    func parkAfterClose() async throws {
        var ends: [Int32] = [-1, -1]
        #expect(pipe(&ends) == 0)
        defer { Glibc.close(ends[1]) }
        let descriptor = Descriptor(ends[0])
        let fd = try descriptor.acquire("read")
        descriptor.close()
        try await Readiness.shared.wait(for: fd, events: Int16(POLLIN))
        descriptor.release()
        // The number is closed now, and may be used again: a wait on a new descriptor with it parks.
        let pair = try SocketPair()
        defer { pair.close() }
        let other = pair.a
        let waiting = Task { try await Readiness.shared.wait(for: other, events: Int16(POLLIN)) }
        try await Task.sleep(for: .milliseconds(50))
        pair.write(pair.b)
        try await waiting.value
    }

    @Test("shutting a socket down ends a wait on it")
    func shutdownEndsAWait() async throws {
        let pair = try SocketPair()
        defer { pair.close() }
        let fd = pair.a
        let reader = Task { try await Readiness.shared.wait(for: fd, events: Int16(POLLIN)) }
        try await Task.sleep(for: .milliseconds(50))
        shutdown(fd, Int32(SHUT_RDWR))
        try await reader.value
    }
}
