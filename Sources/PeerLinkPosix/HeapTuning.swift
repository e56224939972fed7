#if canImport(Glibc)
import Glibc
internal import CMalloc
#elseif canImport(Musl)
import Musl
#endif
import Foundation
import PeerLinkCore

/// How PeerLink sets glibc's heap for a process that moves messages: once, when the process's
/// first link waits for its socket (the I/O thread starts), glibc is told to keep ``topPad``
/// bytes free at the top of a heap when it gives memory back to the system (`mallopt(M_TOP_PAD)`,
/// 128 KiB by default), and to take allocations under ``mmapThreshold`` from its heaps
/// (`mallopt(M_MMAP_THRESHOLD)`).
///
/// Why: every message received is an array of its own, which the app frees when it is done
/// with it. After such frees glibc gives the free memory at the top of the thread's heap back to
/// the kernel (`madvise`) whenever it is over a threshold, or unmaps a message's mapping, and the
/// next messages fault the same amount of memory in again, every page zeroed by the kernel. With
/// messages of 64 KiB and more that was most of the process's time: 200,000–400,000 page faults
/// (and 1,500–2,300 `madvise` calls) to receive 512 MiB as 64 KiB and then 1 MiB messages,
/// encrypted and not, about 7,000 (and 6) with the tuning; 1 MiB messages moved 1.16
/// (encrypted) and 1.93 (plain) times as fast (the *Performance* article has the figures). Both
/// settings are needed: setting the pad alone turns off glibc's own adjustment of the mapping
/// threshold, leaving it wherever it was, and messages over it would be mapped afresh every time.
///
/// Only what glibc keeps of freed memory changes: nothing is allocated ahead, and a process that
/// never frees much never holds more. What it costs: up to ``topPad`` of free memory stays
/// resident in each heap that saw such frees (glibc keeps a heap per thread that allocates, up
/// to eight per CPU); the benchmark's peak RSS went from 53–54 MiB to 53–57 MiB over TCP, from
/// 28–30 MiB to 34–36 MiB over Bluetooth.
///
/// PeerLink leaves the heap as it is when the process chose otherwise: `PEERLINK_HEAP_TUNING=off`
/// in the environment, a `glibc.malloc.*` tunable in `GLIBC_TUNABLES`, any of glibc's
/// `MALLOC_*_` variables (`MALLOC_TOP_PAD_`, `MALLOC_CHECK_`, …; `MALLOC_ARENA_MAX` does not touch
/// what is set here), or ``keepDefaults()`` called before the first link. With a C library other
/// than glibc it does nothing. The file descriptor limit is raised in the same spirit
/// (``DescriptorLimit``).
public enum HeapTuning {
    /// The free memory glibc keeps at the top of a heap when it trims: 8 MiB, twice the
    /// largest allocation a heap serves (``mmapThreshold``), so that a message just freed and
    /// the next one both fit in what is kept.
    public static let topPad = 8 * 1024 * 1024
    /// Allocations of at least this many bytes are mapped on their own (and unmapped when
    /// freed) rather than taken from a heap: 4 MiB.
    public static let mmapThreshold = 4 * 1024 * 1024

    /// What was done.
    public enum Outcome: Hashable, Sendable, CustomStringConvertible {
        /// glibc keeps `topPad` bytes free at the top of a heap and maps allocations of
        /// `mmapThreshold` bytes and more on their own.
        case tuned(topPad: Int, mmapThreshold: Int)
        /// The heap was left as the process had it, for this reason.
        case left(String)

        public var description: String {
            switch self {
            case .tuned(let pad, let threshold):
                "glibc keeps \(pad >> 20) MiB free at the top of a heap and maps allocations from \(threshold >> 20) MiB on their own "
                    + "(mallopt M_TOP_PAD, M_MMAP_THRESHOLD)"
            case .left(let reason): "glibc's heap left as it was: \(reason)"
            }
        }
    }

    private static let state = Locked<(kept: Bool, outcome: Outcome?)>((false, nil))

    /// What was done, or nil while no link has started (and ``apply(environment:)`` was not called).
    public static var outcome: Outcome? { state.withLock { $0.outcome } }

    /// Leaves glibc's heap settings alone in this process: call it before the first link.
    public static func keepDefaults() {
        state.withLock { state in
            state.kept = true
            if state.outcome == nil { state.outcome = .left(keptByTheApp) }
        }
    }

    /// Tunes the heap unless the process chose otherwise (see ``HeapTuning``), once: later
    /// calls return what the first one did. PeerLink calls it when its I/O thread starts.
    @discardableResult
    public static func apply(environment: [String: String] = ProcessInfo.processInfo.environment) -> Outcome {
        state.withLock { state in
            if let outcome = state.outcome { return outcome }
            MemoryRelief.install { HeapTuning.trimSoon() }
            let outcome = decide(environment: environment, kept: state.kept)
            state.outcome = outcome
            return outcome
        }
    }

    private static let keptByTheApp = "the app keeps glibc's defaults (HeapTuning.keepDefaults())"

    /// Gives the heaps' free memory back to the kernel (`malloc_trim`) on a thread of its own,
    /// shortly after it is asked (the session's drop is freed by then), and at most once a
    /// second: a request while a trim runs or within the second after one is carried out once
    /// that second is over. Installed as ``PeerLinkCore/MemoryRelief``'s release whatever the
    /// tuning: a heap keeps what a hostile peer made it hold with glibc's defaults too.
    private static let trimming = Locked<(running: Bool, pending: Bool)>((false, false))

    static func trimSoon() {
        #if canImport(Glibc)
        let start = trimming.withLock { state -> Bool in
            if state.running {
                state.pending = true
                return false
            }
            state.running = true
            return true
        }
        guard start else { return }
        let thread = Thread {
            Thread.sleep(forTimeInterval: 0.05)
            while true {
                _ = malloc_trim(0)
                Thread.sleep(forTimeInterval: 1)
                let again = trimming.withLock { state -> Bool in
                    if state.pending {
                        state.pending = false
                        return true
                    }
                    state.running = false
                    return false
                }
                if !again { break }
            }
        }
        thread.name = "peerlink-trim"
        thread.start()
        #endif
    }

    private static func decide(environment: [String: String], kept: Bool) -> Outcome {
        if let reason = reasonToLeave(environment: environment, kept: kept) { return .left(reason) }
        #if canImport(Glibc)
        // mallopt returns 1 on success, 0 on error. The threshold first: had only the pad been
        // set, the threshold would stay wherever glibc's own adjustment had left it.
        guard mallopt(M_MMAP_THRESHOLD, Int32(mmapThreshold)) == 1 else {
            return .left("mallopt(M_MMAP_THRESHOLD) refused the setting")
        }
        guard mallopt(M_TOP_PAD, Int32(topPad)) == 1 else { return .left("mallopt(M_TOP_PAD) refused the setting") }
        return .tuned(topPad: topPad, mmapThreshold: mmapThreshold)
        #else
        return .left("the C library is not glibc")
        #endif
    }

    /// Why the heap is to be left as it is, or nil to tune it: the process's own choice.
    package static func reasonToLeave(environment: [String: String], kept: Bool) -> String? {
        if kept { return keptByTheApp }
        if let setting = environment["PEERLINK_HEAP_TUNING"], ["off", "0", "no", "false"].contains(setting.lowercased()) {
            return "PEERLINK_HEAP_TUNING=\(setting)"
        }
        if let tunables = environment["GLIBC_TUNABLES"], tunables.contains("glibc.malloc.") {
            return "GLIBC_TUNABLES sets the heap"
        }
        if let name = environment.keys.sorted().first(where: { $0.hasPrefix("MALLOC_") && $0.hasSuffix("_") }) {
            return "\(name) sets the heap"
        }
        return nil
    }
}
