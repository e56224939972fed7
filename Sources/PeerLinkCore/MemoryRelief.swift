/// Gives memory back to the system after a session dropped a lot of it at once: the messages a
/// peer had sent in part when its link closed over a limit, or when it left or restarted.
///
/// The C library keeps what is freed for the next allocations, which is right while messages
/// flow, and wrong after a hostile peer made the process hold tens of MiB it will not need
/// again: without this, the memory stays resident for as long as the process runs. The session
/// reports such drops here (never a message delivered: that memory is the next message's); the
/// platform layer installs what returns free memory (`PeerLinkPosix.HeapTuning`: glibc's
/// `malloc_trim`), run off the caller's thread and at most once a second.
public enum MemoryRelief {
    /// Drops smaller than this are left to the allocator.
    public static let threshold = 4 << 20

    private static let release = Locked<(@Sendable () -> Void)?>(nil)

    /// Sets what gives free memory back (the platform layer, once).
    public static func install(_ giveBack: @escaping @Sendable () -> Void) {
        release.withLock { $0 = giveBack }
    }

    /// The session let go of `bytes` of a peer's messages that will not be delivered.
    public static func dropped(_ bytes: Int) {
        guard bytes >= threshold, let giveBack = release.withLock({ $0 }) else { return }
        giveBack()
    }
}
