import Foundation
import Logging
import PeerLinkCore
import PeerLinkSession

/// Makes the local peer visible nearby with its discovery info — on the transports of its
/// session: the LAN (DNS-SD) by default, Bluetooth (an SDP record) for a session made with
/// `transports: .bluetooth` or `.auto` — and hands the invitations other peers send to its
/// delegate: MultipeerConnectivity's nearby-service advertiser.
///
/// ```swift
/// let advertiser = NearbyServiceAdvertiser(peer: me, discoveryInfo: ["room": "kitchen"], serviceType: "chat")
/// advertiser.delegate = self
/// advertiser.startAdvertisingPeer()
///
/// func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peerID: MultipeerPeerID,
///                 withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, MultipeerSession?) -> Void) {
///     invitationHandler(true, session)
/// }
/// ```
///
/// Invitations arrive over links to a session's listener, so the advertiser publishes a session:
/// the most recently made ``MultipeerSession`` of the same peer that is still alive (make the
/// session first; ``startAdvertisingPeer()`` reports `didNotStartAdvertisingPeer` otherwise). Its
/// invitations can be accepted into that session only: the invitation handler declines (and logs
/// why) when given another session.
///
/// Stopping or releasing the advertiser withdraws the advertisement; the session's peers stay
/// connected. Delegate calls arrive on ``delegateQueue``.
public final class NearbyServiceAdvertiser: Sendable {
    /// The local peer.
    public let myPeerID: MultipeerPeerID
    /// Published with the peer; at most 400 bytes as `key=value` entries of at most 255 bytes.
    public let discoveryInfo: [String: String]?
    /// 1 to 15 characters: lowercase letters, digits and single hyphens inside, at least one letter.
    public let serviceType: String
    /// Where delegate calls are made, one at a time.
    public let delegateQueue: DispatchQueue

    private let logger: Logger
    private let state = Locked(State())

    private struct State {
        weak var delegate: (any NearbyServiceAdvertiserDelegate)?
        weak var session: MultipeerSession?
    }

    /// Checks nothing yet: a service type or discovery info out of range is reported by
    /// ``startAdvertisingPeer()`` through the delegate.
    ///
    /// - Parameters:
    ///   - peer: the local peer, which has a ``MultipeerSession`` by the time advertising starts.
    ///   - discoveryInfo: published with the peer (nil: none).
    ///   - serviceType: the service, as in MultipeerConnectivity (`chat` is `_chat._tcp` on the LAN,
    ///     an SDP service class derived from it over Bluetooth).
    ///   - delegateQueue: the serial queue for delegate calls (nil: a private serial queue).
    ///   - logger: where the advertiser logs.
    public init(
        peer: MultipeerPeerID, discoveryInfo: [String: String]?, serviceType: String, delegateQueue: DispatchQueue? = nil,
        logger: Logger = Logger(label: "peerlink.multipeer")
    ) {
        myPeerID = peer
        self.discoveryInfo = discoveryInfo
        self.serviceType = serviceType
        self.delegateQueue = delegateQueue ?? DispatchQueue(label: "peerlink.multipeer.advertiser")
        var logger = logger
        logger[metadataKey: "peer.local"] = "\(peer.fingerprint)"
        self.logger = logger
    }

    deinit {
        if let session = state.withLock({ $0.session }) {
            session.stopAdvertising(for: ObjectIdentifier(self))
        }
    }

    /// Told of invitations and failures, on ``delegateQueue``. Held weakly.
    public var delegate: (any NearbyServiceAdvertiserDelegate)? {
        get { state.withLock { $0.delegate } }
        set { state.withLock { $0.delegate = newValue } }
    }

    /// Publishes the local peer (through its session) with the discovery info. Calling it again
    /// while advertising does nothing. Failures go to
    /// ``NearbyServiceAdvertiserDelegate/advertiser(_:didNotStartAdvertisingPeer:)``.
    ///
    /// It returns without waiting for bluetoothd or avahi-daemon: the session opens its node and
    /// publishes it on threads of their own, and a failure there reaches the delegate the same way.
    public func startAdvertisingPeer() {
        if state.withLock({ $0.session != nil }) { return }
        do throws(PeerLinkError) {
            let type: ServiceType
            let info: DiscoveryInfo
            do throws(ValidationError) {
                type = try ServiceType(serviceType)
                info = try DiscoveryInfo(discoveryInfo ?? [:])
            } catch {
                throw error.peerLinkError
            }
            guard let session = MultipeerRegistry.session(for: myPeerID) else {
                throw PeerLinkError(
                    .invalidParameter,
                    "no MultipeerSession of \(myPeerID) to advertise: make the session first (invitations land in it)")
            }
            try session.startAdvertising(for: self, serviceType: type, info: info)
            state.withLock { $0.session = session }
            logger.info("advertising", metadata: ["service": "\(type.dnsSDType)"])
        } catch {
            logger.warning("advertising did not start: \(error.message)")
            report(error)
        }
    }

    /// Withdraws the advertisement; invitations that arrive from now on are declined. The
    /// session's peers stay connected.
    public func stopAdvertisingPeer() {
        let session = state.withLock { state -> MultipeerSession? in
            defer { state.session = nil }
            return state.session
        }
        session?.stopAdvertising(for: ObjectIdentifier(self))
    }

    // MARK: - For the session

    /// Tells the delegate advertising failed (and forgets the session).
    func report(_ error: PeerLinkError) {
        state.withLock { $0.session = nil }
        delegateQueue.async {
            self.delegate?.advertiser(self, didNotStartAdvertisingPeer: error)
        }
    }

    /// Shows an invitation to the delegate; its answer goes to `session`.
    func offer(_ invitation: InvitationID, from peer: MultipeerPeerID, context: Data?, session: MultipeerSession, generation: Int) {
        delegateQueue.async {
            guard let delegate = self.delegate else {
                self.logger.info("declining \(invitation) from \(peer): the advertiser has no delegate")
                session.answer(invitation, from: peer, accept: false, generation: generation)
                return
            }
            let once = OnceFlag()
            let logger = self.logger
            delegate.advertiser(self, didReceiveInvitationFromPeer: peer, withContext: context) { accept, chosen in
                guard once.claim() else {
                    logger.warning("the invitation handler for \(invitation) from \(peer) was called again; only the first answer counts")
                    return
                }
                let intoThisSession = chosen === session
                if accept && !intoThisSession {
                    logger.warning(
                        "\(invitation) from \(peer) declined: it can only be accepted into the session this advertiser publishes (\(session.myPeerID)'s), passed to the handler")
                }
                session.answer(invitation, from: peer, accept: accept && intoThisSession, generation: generation)
            }
        }
    }
}
