import Foundation
import Logging
import PeerLinkCore

/// Finds peers advertising a service nearby — on the LAN, over Bluetooth, or both — and invites
/// them into a session: MultipeerConnectivity's nearby-service browser.
///
/// ```swift
/// let browser = NearbyServiceBrowser(peer: me, serviceType: "chat")
/// browser.delegate = self
/// browser.startBrowsingForPeers()
///
/// func browser(_ browser: NearbyServiceBrowser, foundPeer peerID: MultipeerPeerID, withDiscoveryInfo info: [String: String]?) {
///     browser.invitePeer(peerID, to: session, withContext: Data("hello".utf8), timeout: 30)
/// }
/// ```
///
/// It browses on its own (a ``PeerDiscovery`` over the transports of its local peer's
/// ``MultipeerSession``, the LAN unless that session was made with others): a peer is *found*
/// once it is reachable (on the LAN, a connection to it succeeded; over Bluetooth, its SDP record
/// answered), and *lost* when it withdraws or stops answering on every transport. A peer found on
/// several transports is found once. The local peer is never reported. Invitations go through the session given to ``invitePeer(_:to:withContext:timeout:)``;
/// their outcome arrives at the session's delegate as the peer's state (*connecting*, then
/// *connected* or *not connected*). Delegate calls arrive on ``delegateQueue``.
public final class NearbyServiceBrowser: Sendable {
    /// The local peer.
    public let myPeerID: MultipeerPeerID
    /// 1 to 15 characters: lowercase letters, digits and single hyphens inside, at least one letter.
    public let serviceType: String
    /// Where delegate calls are made, one at a time.
    public let delegateQueue: DispatchQueue
    /// The transports to browse on; nil: those of the local peer's most recent
    /// ``MultipeerSession`` when browsing starts (the LAN when there is none).
    public let transports: TransportChoice?

    private let logger: Logger
    private let state = Locked(State())

    private struct State {
        weak var delegate: (any NearbyServiceBrowserDelegate)?
        /// The browse under way.
        var browse: Task<Void, Never>?
        /// Counts browses, so a stopped one's last events are not reported.
        var browseNumber = 0
        /// What browsing found, kept after it stops so found peers can still be invited.
        var found: [Fingerprint: DiscoveredPeer] = [:]
    }

    /// Checks nothing yet: a service type out of range is reported by ``startBrowsingForPeers()``
    /// through the delegate.
    ///
    /// - Parameters:
    ///   - peer: the local peer, never reported found.
    ///   - serviceType: the service, as in MultipeerConnectivity (`chat` is `_chat._tcp` on the LAN).
    ///   - transports: where to browse; nil (the default): the transports of the peer's session.
    ///   - delegateQueue: the serial queue for delegate calls (nil: a private serial queue).
    ///   - logger: where the browser logs.
    public init(
        peer: MultipeerPeerID, serviceType: String, transports: TransportChoice? = nil, delegateQueue: DispatchQueue? = nil,
        logger: Logger = Logger(label: "peerlink.multipeer")
    ) {
        myPeerID = peer
        self.serviceType = serviceType
        self.transports = transports
        self.delegateQueue = delegateQueue ?? DispatchQueue(label: "peerlink.multipeer.browser")
        var logger = logger
        logger[metadataKey: "peer.local"] = "\(peer.fingerprint)"
        self.logger = logger
    }

    deinit {
        state.withLock { $0.browse }?.cancel()
    }

    /// Told of found and lost peers, on ``delegateQueue``. Held weakly.
    public var delegate: (any NearbyServiceBrowserDelegate)? {
        get { state.withLock { $0.delegate } }
        set { state.withLock { $0.delegate = newValue } }
    }

    /// Starts browsing: every reachable peer of the service is reported found. Calling it again
    /// while browsing does nothing. Failures go to
    /// ``NearbyServiceBrowserDelegate/browser(_:didNotStartBrowsingForPeers:)``.
    public func startBrowsingForPeers() {
        let type: ServiceType
        do throws(ValidationError) {
            type = try ServiceType(serviceType)
        } catch {
            let error = error.peerLinkError
            logger.warning("browsing did not start: \(error.message)")
            delegateQueue.async { self.delegate?.browser(self, didNotStartBrowsingForPeers: error) }
            return
        }
        let choice = transports ?? MultipeerRegistry.session(for: myPeerID)?.transports ?? .lan
        let modules = choice.modules(logger: logger)
        let discovery = PeerDiscovery(
            modules: modules, request: BrowseRequest(serviceType: type, excluding: [myPeerID.fingerprint]), logger: logger)
        state.withLock { state in
            guard state.browse == nil else { return }  // browsing already
            state.browseNumber += 1
            state.found = [:]
            let number = state.browseNumber
            let owner = WeakBrowser(self)
            let total = modules.count
            state.browse = Task {
                let failures = Locked<[(label: String, error: PeerLinkError)]>([])
                await discovery.run { event in
                    switch event {
                    case .peer(let change):
                        owner.browser?.discovered(change, browse: number)
                    case .browsing:
                        break
                    case .unavailable(_, let label, let error):
                        let all = failures.withLock { failures in
                            failures.append((label, error))
                            return failures
                        }
                        // Every transport failed: the browse did not start.
                        if all.count == total {
                            let combined = total == 1
                                ? error
                                : PeerLinkError(error.code, "no transport can browse here — " + all.map { "\($0.label): \($0.error.message)" }.joined(separator: "; "))
                            owner.browser?.browseFailed(combined, browse: number)
                        }
                    }
                }
            }
        }
    }

    /// Stops browsing: no more found or lost peers are reported. Peers found so far can still be
    /// invited.
    public func stopBrowsingForPeers() {
        state.withLock { state -> Task<Void, Never>? in
            defer { state.browse = nil }
            return state.browse
        }?.cancel()
    }

    /// Invites a found peer into `session`, which the peer's app sees with `context`. The outcome
    /// arrives at the session's delegate: the peer becomes *connecting*, then *connected* (it
    /// accepted) or *not connected* (declined, no answer within `timeout`, unreachable, the session
    /// is full, or the session's delegate refused its key).
    ///
    /// - Parameters:
    ///   - peerID: a peer this browser found (found before, even if browsing stopped since).
    ///   - session: the session to invite it into; it must serve this browser's service type.
    ///   - context: at most 8192 bytes, shown to the invitee's app.
    ///   - timeout: seconds the invitee has to answer; 30 when zero or less.
    public func invitePeer(_ peerID: MultipeerPeerID, to session: MultipeerSession, withContext context: Data?, timeout: TimeInterval = 30) {
        let found = state.withLock { $0.found[peerID.fingerprint] }
        let type: ServiceType
        do {
            type = try ServiceType(serviceType)
        } catch {
            session.invitationNotSent(peerID.peerID, reason: error.description)
            return
        }
        let seconds = timeout.isFinite && timeout > 0 ? min(timeout, 86_400) : 30
        session.invite(
            peerID, found: found, serviceType: type, context: context.map { [UInt8]($0) } ?? [],
            timeout: .milliseconds(Int64((seconds * 1000).rounded())))
    }

    // MARK: - Browsing

    private func browseFailed(_ error: PeerLinkError, browse number: Int) {
        let browse = state.withLock { state -> Task<Void, Never>? in
            guard state.browse != nil, state.browseNumber == number else { return nil }
            defer { state.browse = nil }
            return state.browse
        }
        guard let browse else { return }
        browse.cancel()
        logger.warning("browsing did not start: \(error.message)")
        delegateQueue.async { self.delegate?.browser(self, didNotStartBrowsingForPeers: error) }
    }

    private func discovered(_ event: DiscoveryEvent, browse number: Int) {
        state.withLock { state in
            guard state.browse != nil, state.browseNumber == number else { return }
            switch event {
            case .found(let peer):
                state.found[peer.id.fingerprint] = peer
                deliverFound(peer)
            case .updated(let peer):
                let before = state.found.updateValue(peer, forKey: peer.id.fingerprint)
                if before?.info != peer.info || before == nil { deliverFound(peer) }
            case .lost(let peer):
                guard state.found[peer.fingerprint] != nil else { return }
                let id = MultipeerPeerID(peer)
                delegateQueue.async { self.delegate?.browser(self, lostPeer: id) }
            }
        }
    }

    private func deliverFound(_ peer: DiscoveredPeer) {
        let id = MultipeerPeerID(peer.id)
        let info = peer.info.isEmpty ? nil : peer.info.entries
        delegateQueue.async { self.delegate?.browser(self, foundPeer: id, withDiscoveryInfo: info) }
    }
}

/// A browser held weakly by the task that browses for it.
final class WeakBrowser: Sendable {
    weak let browser: NearbyServiceBrowser?

    init(_ browser: NearbyServiceBrowser) {
        self.browser = browser
    }
}
