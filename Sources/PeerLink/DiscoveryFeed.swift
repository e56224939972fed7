import Synchronization

/// Discovery from several browsers — LAN and Bluetooth — merged by identity
/// (``PeerLinkCore/MergedDiscovery``) and fed to one session: a peer found on both transports is
/// one peer with every endpoint, TCP first, and it is lost only when the last browser lost it.
public final class DiscoveryFeed: Sendable {
    public let session: PeerSession
    private let merged: Mutex<MergedDiscovery>

    public init(session: PeerSession, selection: TransportSelection = .auto) {
        self.session = session
        merged = Mutex(MergedDiscovery(selection: selection))
    }

    /// One event of the browser called `source` (`lan`, `bluetooth`).
    public func apply(_ event: DiscoveryEvent, from source: String) {
        let events = merged.withLock { $0.apply(event, from: source) }
        for event in events { session.discovered(event) }
    }

    /// The merged peers found now.
    public var peers: [DiscoveredPeer] { merged.withLock { $0.peers } }
}
