/// Every per-process, per-session and per-link resource limit of PeerLink, in one value with
/// documented defaults: what a peer — honest, broken or hostile — may make this process hold.
///
/// Like libp2p's resource manager: limits are a policy value, not constants scattered through
/// the code. A session takes one in ``PeerLinkCore/LinkPolicy/limits`` (also reachable as
/// `PeerSessionConfiguration.limits`); the defaults suit a chat or file-sharing peer on a laptop
/// or a Raspberry Pi. ``fitted(toDescriptorLimit:)`` shrinks the link caps to what a process's
/// descriptor limit can hold.
///
/// The DocC article *Reliability* lists every limit, its default, what happens when it is reached
/// and which part of PeerLink enforces it.
public struct ResourceLimits: Hashable, Sendable {
    // MARK: Links

    /// Links that have not finished their handshake (preface, verdicts, Noise), incoming and
    /// dialled together. An incoming link that arrives when this many are in their handshake
    /// takes the place of the oldest incoming one (which is closed at once), so a flood of
    /// connections that never finish cannot keep an honest peer out. Default 64.
    public var maximumHandshakingLinks: Int

    /// Incoming links in their handshake from one remote address (an IP address, a Bluetooth
    /// device): one more is closed at once. Default 8.
    public var maximumHandshakingLinksPerAddress: Int

    /// Links of any kind a session holds at once, in their handshake or established. An incoming
    /// link beyond it is closed at once. Default 128 (a full session needs 7, plus duplicates
    /// while the tie-break settles).
    public var maximumLinks: Int

    /// Links of any kind from one remote address. Default 32 (several peers may share a host).
    public var maximumLinksPerAddress: Int

    /// How long one write of at most 32 KiB may wait for the transport to take it: beyond it the
    /// link is closed (`GO_AWAY` 11) and its socket with it, so a peer that stops reading cannot
    /// pin a descriptor and its send queue. (32 KiB in 15 s is about 2 KiB/s: slower than any
    /// working Bluetooth link.) Default 15 s.
    public var writeProgressTimeout: Duration

    // MARK: Memory

    /// Bytes of reliable messages received in part (chunks waiting for the rest of their
    /// message) on one link: a link that goes over it is closed (`GO_AWAY` 11) and what it held
    /// dropped. At least one whole message (``WireFormat/maxMessageLength``, 16 MiB). Default
    /// 32 MiB.
    public var maximumPartialMessageBytesPerLink: Int

    /// Bytes of reliable messages received in part, all links of a session together: the link
    /// whose chunk goes over it is closed (`GO_AWAY` 11). Default 64 MiB.
    public var maximumPartialMessageBytesPerSession: Int

    /// Bytes of one peer's messages received and waiting for the app to take them from the
    /// session's events. Beyond it the session stops acknowledging that peer's reliable frames
    /// (so its unacknowledged-bytes limit stops it: back pressure, nothing lost) and drops its
    /// unreliable messages, until the app has taken half of them; a peer that keeps sending
    /// regardless is closed (`GO_AWAY` 11). Other peers are not held up. Default 32 MiB.
    public var maximumQueuedMessageBytesPerPeer: Int

    // MARK: Text and files

    /// A reason a peer gives (a refusing verdict, a `GO_AWAY`) is cut to this many bytes of
    /// UTF-8, after control characters, escape sequences and text-direction overrides were
    /// escaped (``PeerText``), before it reaches a log or a terminal. Default 256.
    public var maximumReasonBytes: Int

    /// Peers remembered in the known-peers file (trust on first use). Beyond it, the peers seen
    /// least recently are forgotten first; peers marked trusted are kept. Default 1024.
    public var maximumKnownPeers: Int

    // MARK: Descriptors

    /// File descriptors kept free for honest work (files, dials, the system's own needs): a
    /// listener closes a connection it accepted at once when fewer than this many descriptors
    /// would be left below the process's limit. Default 32.
    public var reservedDescriptors: Int

    /// How long a listener pauses after `accept` failed for lack of descriptors or memory
    /// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): the lower bound first, doubling on each failure
    /// in a row up to the upper bound. It never stops accepting. Default 10 ms to 1 s.
    public var acceptBackoff: ClosedRange<Duration>

    public init(
        maximumHandshakingLinks: Int = 64,
        maximumHandshakingLinksPerAddress: Int = 8,
        maximumLinks: Int = 128,
        maximumLinksPerAddress: Int = 32,
        writeProgressTimeout: Duration = .seconds(15),
        maximumPartialMessageBytesPerLink: Int = 32 * 1024 * 1024,
        maximumPartialMessageBytesPerSession: Int = 64 * 1024 * 1024,
        maximumQueuedMessageBytesPerPeer: Int = 32 * 1024 * 1024,
        maximumReasonBytes: Int = 256,
        maximumKnownPeers: Int = 1024,
        reservedDescriptors: Int = 32,
        acceptBackoff: ClosedRange<Duration> = .milliseconds(10) ... .seconds(1)
    ) {
        self.maximumHandshakingLinks = maximumHandshakingLinks
        self.maximumHandshakingLinksPerAddress = maximumHandshakingLinksPerAddress
        self.maximumLinks = maximumLinks
        self.maximumLinksPerAddress = maximumLinksPerAddress
        self.writeProgressTimeout = writeProgressTimeout
        self.maximumPartialMessageBytesPerLink = maximumPartialMessageBytesPerLink
        self.maximumPartialMessageBytesPerSession = maximumPartialMessageBytesPerSession
        self.maximumQueuedMessageBytesPerPeer = maximumQueuedMessageBytesPerPeer
        self.maximumReasonBytes = maximumReasonBytes
        self.maximumKnownPeers = maximumKnownPeers
        self.reservedDescriptors = reservedDescriptors
        self.acceptBackoff = acceptBackoff
    }

    /// The defaults listed above.
    public static let `default` = ResourceLimits()

    /// The shortest reason ``maximumReasonBytes`` may ask for: room for a code's explanation.
    public static let minimumReasonBytes = 16

    /// Checks that every limit is in range and that they agree with each other.
    ///
    /// - Throws: a ``PeerLinkError`` (`invalidParameter`) naming the limit and its allowed range.
    public func validate() throws(PeerLinkError) {
        func require(_ condition: Bool, _ message: @autoclosure () -> String) throws(PeerLinkError) {
            guard condition else { throw PeerLinkError(.invalidParameter, "resource limits: " + message()) }
        }
        try require(maximumLinks >= 1, "maximumLinks must be at least 1, not \(maximumLinks)")
        try require(
            (1...maximumLinks).contains(maximumHandshakingLinks),
            "maximumHandshakingLinks must be 1 to maximumLinks (\(maximumLinks)), not \(maximumHandshakingLinks)")
        try require(
            (1...maximumHandshakingLinks).contains(maximumHandshakingLinksPerAddress),
            "maximumHandshakingLinksPerAddress must be 1 to maximumHandshakingLinks (\(maximumHandshakingLinks)), not \(maximumHandshakingLinksPerAddress)")
        try require(
            (1...maximumLinks).contains(maximumLinksPerAddress),
            "maximumLinksPerAddress must be 1 to maximumLinks (\(maximumLinks)), not \(maximumLinksPerAddress)")
        try require(writeProgressTimeout > .zero, "writeProgressTimeout must be longer than zero")
        try require(
            maximumPartialMessageBytesPerLink >= WireFormat.maxMessageLength,
            "maximumPartialMessageBytesPerLink must hold one whole message (\(WireFormat.maxMessageLength) bytes), not \(maximumPartialMessageBytesPerLink)")
        try require(
            maximumPartialMessageBytesPerSession >= maximumPartialMessageBytesPerLink,
            "maximumPartialMessageBytesPerSession must be at least maximumPartialMessageBytesPerLink (\(maximumPartialMessageBytesPerLink)), not \(maximumPartialMessageBytesPerSession)")
        try require(
            maximumQueuedMessageBytesPerPeer >= 1024,
            "maximumQueuedMessageBytesPerPeer must be at least 1024, not \(maximumQueuedMessageBytesPerPeer)")
        try require(
            (Self.minimumReasonBytes...PeerText.decodedReasonBytes).contains(maximumReasonBytes),
            "maximumReasonBytes must be \(Self.minimumReasonBytes) to \(PeerText.decodedReasonBytes), not \(maximumReasonBytes)")
        try require(maximumKnownPeers >= 1, "maximumKnownPeers must be at least 1, not \(maximumKnownPeers)")
        try require(reservedDescriptors >= 0, "reservedDescriptors must not be negative, not \(reservedDescriptors)")
        try require(acceptBackoff.lowerBound > .zero, "acceptBackoff must start above zero")
    }

    /// These limits with the link caps shrunk to what `descriptorLimit` (the process's
    /// `RLIMIT_NOFILE` soft limit) can hold: at most half of the descriptors not in reserve go
    /// to links, at most half of those to links in their handshake. Other limits are unchanged;
    /// limits already lower stay as they are.
    public func fitted(toDescriptorLimit descriptorLimit: Int) -> ResourceLimits {
        var fitted = self
        let budget = max(0, descriptorLimit - reservedDescriptors)
        fitted.maximumLinks = max(2, min(maximumLinks, budget / 2))
        fitted.maximumHandshakingLinks = max(1, min(maximumHandshakingLinks, fitted.maximumLinks / 2))
        fitted.maximumHandshakingLinksPerAddress = max(1, min(maximumHandshakingLinksPerAddress, fitted.maximumHandshakingLinks))
        fitted.maximumLinksPerAddress = max(1, min(maximumLinksPerAddress, fitted.maximumLinks))
        return fitted
    }
}
