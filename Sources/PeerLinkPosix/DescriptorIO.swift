#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Reads and writes of a connected non-blocking socket, for every kind of link (TCP, RFCOMM,
/// L2CAP): each call is tried at once, and only one that would block parks on ``Readiness``'s
/// thread until the socket is ready.
extension Descriptor {
    /// The next bytes that arrived, at most `maxCount` (on a `SOCK_SEQPACKET` socket: the next
    /// packet); an empty array at the end of the stream.
    ///
    /// - Throws: a ``SystemError`` when the socket failed or was closed on this side (`EBADF`,
    ///   also for a read that was waiting), `CancellationError` when the task is cancelled.
    package func receive(maxCount: Int) async throws -> [UInt8] {
        // Received straight into the array's storage, not zeroed first; the array is as long
        // as what arrived (its capacity is `maxCount` until the caller lets it go).
        var bytes: [UInt8] = []
        let received = try await receive(into: &bytes, maxCount: maxCount)
        bytes.removeSubrange(received...)
        return bytes
    }

    /// The next bytes that arrived, at most `maxCount`, received into the front of `bytes`
    /// (grown to `maxCount` bytes first if it is shorter): how many (0 at the end of the
    /// stream). A caller that keeps no other reference to `bytes` has its storage reused: no
    /// allocation per read.
    ///
    /// - Throws: as ``receive(maxCount:)`` does.
    package func receive(into bytes: inout [UInt8], maxCount: Int) async throws -> Int {
        let count = max(1, maxCount)
        if bytes.count < count {
            // Not zeroed: only what the kernel writes is ever read, and a link that receives
            // little touches (makes resident) only the first pages of it.
            bytes = [UInt8](unsafeUninitializedCapacity: count) { _, initialized in initialized = count }
        }
        while true {
            try Task.checkCancellation()
            let fd = try acquire("recv")
            defer { release() }
            var failure: SystemError?
            let received = bytes.withUnsafeMutableBytes { raw -> Int? in
                do throws(SystemError) {
                    return try Sys.receive(fd, UnsafeMutableRawBufferPointer(rebasing: raw[..<count]))
                } catch {
                    failure = error
                    return 0
                }
            }
            if let failure { throw failure }
            if let received {
                // A shutdown by close() on this side reads as the end of the stream.
                if received == 0, isClosed { throw SystemError("recv", errno: EBADF) }
                return received
            }
            // Nothing yet: park on the I/O thread until the socket is readable (or shut down).
            try await Readiness.shared.wait(for: fd, events: Int16(POLLIN))
        }
    }

    /// Sends what the kernel takes of `bytes` now, without waiting: how many bytes that was
    /// (0 when the socket buffer is full).
    ///
    /// - Throws: a ``SystemError`` as ``send(_:inPiecesOf:)`` does (never a `SIGPIPE`).
    package func sendNow(_ bytes: [UInt8]) throws(SystemError) -> Int {
        guard !bytes.isEmpty else { return 0 }
        return try withFD("send") { fd throws(SystemError) -> Int in
            var failure: SystemError?
            let sent = bytes.withUnsafeBytes { all -> Int in
                do throws(SystemError) {
                    return try Sys.send(fd, all) ?? 0
                } catch {
                    failure = error
                    return 0
                }
            }
            if let failure { throw failure }
            return sent
        }
    }

    /// Writes all of `bytes`, in sends of at most `piece` bytes (a `SOCK_SEQPACKET` socket: one
    /// packet each; nil: any size); returns once the kernel took the last of them.
    ///
    /// Like a blocking socket's, a cancelled task's write still hands the kernel what it takes at
    /// once: only waiting for room is cancelled. (A link whose task is cancelled writes its
    /// `GO_AWAY` that way.)
    ///
    /// - Throws: a ``SystemError`` when the peer is gone (`EPIPE`, `ECONNRESET`; never a
    ///   `SIGPIPE`) or the socket was closed on this side, `CancellationError` when the task is
    ///   cancelled and the rest would have to wait for room: then part of `bytes` may have been
    ///   sent, so close the socket.
    package func send(_ bytes: [UInt8], inPiecesOf piece: Int? = nil) async throws {
        let piece = max(1, piece ?? bytes.count)
        var offset = 0
        while offset < bytes.count {
            let fd = try acquire("send")
            defer { release() }
            let end = min(offset + piece, bytes.count)
            let sent = try bytes.withUnsafeBytes { all throws(SystemError) -> Int? in
                try Sys.send(fd, UnsafeRawBufferPointer(rebasing: all[offset..<end]))
            }
            if let sent {
                offset += sent
            } else {
                // The socket buffer is full: park until it drains (or the socket is shut down),
                // unless the task was cancelled.
                try Task.checkCancellation()
                try await Readiness.shared.wait(for: fd, events: Int16(POLLOUT))
            }
        }
    }
}
