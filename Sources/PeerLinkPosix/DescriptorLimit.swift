#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Foundation
import PeerLinkCore

/// The process's file descriptor limit (`RLIMIT_NOFILE`), which every link, file and system
/// service of the process shares.
///
/// Distributions start programs with a soft limit of 1024 and a much higher hard limit, which a
/// program may raise its own soft limit to. PeerLink does so once, when the process opens its
/// first TCP listener (``TCPListener``); the `peerlink` tool does so at start. Only `select(2)`
/// cares about descriptors above 1023, and nothing in PeerLink (or in libavahi-client,
/// libdbus-1 or libbluetooth as PeerLink uses them) calls it.
public enum DescriptorLimit {
    /// The soft and hard limit now; nil values where the system does not say.
    public static func current() -> (soft: Int, hard: Int)? {
        guard let limit = try? Sys.descriptorLimit() else { return nil }
        return (clamp(limit.soft), clamp(limit.hard))
    }

    /// Raises the soft limit to the hard limit (or to the most the kernel allows a process,
    /// `fs.nr_open`, when the hard limit is unlimited). Harmless to call again.
    ///
    /// - Returns: the soft limit in force afterwards (unchanged if raising failed).
    @discardableResult
    public static func raiseSoftLimit() -> Int? {
        guard let limit = try? Sys.descriptorLimit() else { return nil }
        if limit.soft < limit.hard {
            var target = limit.hard
            if limit.hard == UInt64.max, let ceiling = kernelCeiling() { target = ceiling }
            try? Sys.setSoftDescriptorLimit(target)
        }
        return current()?.soft
    }

    /// Done once per process by the first ``TCPListener``.
    static let raisedOnce: Int? = raiseSoftLimit()

    /// How many descriptors the process has open (the entries of `/proc/self/fd`), or nil where
    /// that cannot be read.
    public static func openCount() -> Int? {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return nil }
        // The directory's own descriptor is among the entries while it is read.
        return max(0, entries.count - 1)
    }

    private static func kernelCeiling() -> UInt64? {
        guard let text = try? String(contentsOfFile: "/proc/sys/fs/nr_open", encoding: .utf8) else { return nil }
        return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    private static func clamp(_ value: UInt64) -> Int {
        value >= UInt64(Int.max) ? Int.max : Int(value)
    }
}

/// What a listener does when `accept` finds the process short of descriptors or memory, and how
/// it keeps descriptors in reserve: the accept path of ``TCPListener``, apart from the socket.
///
/// - A connection whose descriptor would leave fewer than
///   ``PeerLinkCore/ResourceLimits/reservedDescriptors`` free below the soft limit is closed at
///   once (*shed*): the descriptors left are for honest work — files, dials, the system's own
///   needs (libdispatch reads `/proc` and gives up the process when it cannot).
/// - `EMFILE` / `ENFILE`: the listener closes a spare descriptor it holds for this moment,
///   accepts the oldest pending connection and closes it, then opens its spare again — pending
///   connections are shed one by one instead of the listening socket staying readable and the
///   loop spinning — and pauses.
/// - `ENOBUFS` / `ENOMEM`: it pauses.
/// - Pauses grow from ``PeerLinkCore/ResourceLimits/acceptBackoff``'s lower bound, doubling on
///   each such failure in a row, up to its upper bound; an accepted connection resets them. The
///   listener never stops accepting for these reasons.
package final class AcceptGuard: @unchecked Sendable {
    /// What the listener does next.
    package enum Step: Equatable {
        /// Hand the connection to the caller.
        case accepted(Int32)
        /// Try again at once (a connection was shed, or a client gave up before it was accepted).
        case again
        /// Pause this long, then try again.
        case pause(Duration)
    }

    /// Counts since the listener opened.
    package struct Counts: Equatable, Sendable {
        /// Connections closed at once because they would have eaten into the reserve.
        package var shedForReserve = 0
        /// Connections accepted and closed while the process was out of descriptors.
        package var shedWhileExhausted = 0
        /// `accept` failures for lack of descriptors or memory.
        package var failures = 0
    }

    private let lock = NSLock()
    private let reserved: Int
    private let backoff: ClosedRange<Duration>
    private var spare: Int32 = -1
    private var nextPause: Duration
    private var counts = Counts()
    /// The soft limit, read again after each failure (someone may have raised it).
    private var softLimit: Int
    /// For tests: the descriptor limit to act on instead of the process's.
    private let limitOverride: Int?

    package init(limits: ResourceLimits, descriptorLimit: Int? = nil) {
        reserved = limits.reservedDescriptors
        backoff = limits.acceptBackoff
        nextPause = limits.acceptBackoff.lowerBound
        limitOverride = descriptorLimit
        softLimit = descriptorLimit ?? DescriptorLimit.current()?.soft ?? Int.max
        spare = Self.openSpare()
    }

    deinit {
        if spare >= 0 { Sys.close(spare) }
    }

    package var statistics: Counts { lock.withLock { counts } }

    /// One step of the accept loop on the listening socket `fd`: `accept` is the call itself
    /// (``Sys/accept(_:)`` but for tests), returning nil when nothing is pending.
    package func step(listening fd: Int32, accept: (Int32) throws(SystemError) -> Int32?) throws(SystemError) -> Step? {
        do throws(SystemError) {
            guard let accepted = try accept(fd) else { return nil }
            let shed = lock.withLock { () -> Bool in
                nextPause = backoff.lowerBound
                // Descriptors are numbered from the lowest free one: this one's number says
                // how many are in use below it.
                guard reserved > 0, Int(accepted) >= softLimit - reserved else { return false }
                counts.shedForReserve += 1
                return true
            }
            if shed {
                Sys.close(accepted)
                return .again
            }
            return .accepted(accepted)
        } catch where error.errno == ECONNABORTED || error.errno == EPROTO {
            // A client that gave up before it was accepted.
            return .again
        } catch where error.errno == EMFILE || error.errno == ENFILE {
            return .pause(exhausted(listening: fd, accept: accept))
        } catch where error.errno == ENOBUFS || error.errno == ENOMEM {
            return .pause(failed())
        }
    }

    /// Out of descriptors: the spare makes room to shed the oldest pending connection.
    private func exhausted(listening fd: Int32, accept: (Int32) throws(SystemError) -> Int32?) -> Duration {
        let spare = lock.withLock { () -> Int32 in
            defer { self.spare = -1 }
            return self.spare
        }
        if spare >= 0 {
            Sys.close(spare)
            if let victim = try? accept(fd) {
                Sys.close(victim)
                lock.withLock { counts.shedWhileExhausted += 1 }
            }
        }
        let reopened = Self.openSpare()
        lock.withLock {
            if self.spare < 0 { self.spare = reopened } else if reopened >= 0 { Sys.close(reopened) }
        }
        return failed()
    }

    /// Counts a failure; the pause to take.
    private func failed() -> Duration {
        lock.withLock {
            counts.failures += 1
            if let limitOverride { softLimit = limitOverride } else if let soft = DescriptorLimit.current()?.soft { softLimit = soft }
            let pause = nextPause
            nextPause = min(nextPause * 2, backoff.upperBound)
            return pause
        }
    }

    private static func openSpare() -> Int32 {
        (try? Sys.open("/dev/null", O_RDONLY, 0)) ?? -1
    }
}
