import Foundation
import PeerLinkCore

/// What a ``MultipeerSession`` tells its delegate.
///
/// Every method is called on the session's ``MultipeerSession/delegateQueue`` (a private serial
/// queue unless the app gave one), one call at a time, in the order things happened — never on
/// the thread that made a call to the session. Hop to the main queue or an actor yourself before
/// touching UI or state that lives there.
public protocol MultipeerSessionDelegate: AnyObject, Sendable {
    /// A peer's state in the session changed: *connecting*, *connected*, or *not connected*
    /// (declined, timed out, left, unreachable, or the local peer disconnected).
    func session(_ session: MultipeerSession, peer peerID: MultipeerPeerID, didChange state: PeerState)

    /// A message from a connected peer arrived (sent reliably or not).
    func session(_ session: MultipeerSession, didReceive data: Data, fromPeer peerID: MultipeerPeerID)

    /// Asks whether to let `peerID` in: `fingerprint` is its key's fingerprint (PeerLink has no
    /// certificates; a peer is its key). Call `certificateHandler` exactly once, with true to go on
    /// or false to refuse, from any thread. Asked before an invitation from the peer reaches the
    /// advertiser's delegate, and before an invitation to the peer is sent — see the *Migrating
    /// from MultipeerConnectivity* article for what is not asked yet.
    ///
    /// The default accepts every peer.
    func session(
        _ session: MultipeerSession, didReceiveCertificate fingerprint: Fingerprint, fromPeer peerID: MultipeerPeerID,
        certificateHandler: @escaping @Sendable (Bool) -> Void)

    /// A peer started sending a file (``MultipeerSession/sendResource(at:withName:toPeer:withCompletionHandler:)``
    /// on its side). `resourceName` is the name it gave, made safe as a file name (no `/`, no
    /// `..`, no control characters). `progress` counts the bytes received out of the file's
    /// size; `progress.cancel()` stops the transfer (both sides then end with an error).
    ///
    /// The default does nothing (the file is received all the same).
    func session(
        _ session: MultipeerSession, didStartReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        with progress: Progress)

    /// A file from a peer arrived, its SHA-256 verified (`localURL` set, `error` nil), or its
    /// transfer failed (`localURL` nil, `error` a ``PeerLinkCore/PeerLinkError`` saying why:
    /// cancelled by either side, the link lost, the bytes did not match).
    ///
    /// The file is in a temporary directory of the session and is **removed when this method
    /// returns**, as in MultipeerConnectivity: move or copy it out before returning (for example
    /// `FileManager.default.moveItem(at: localURL, to: destination)`).
    ///
    /// The default does nothing (the file is removed).
    func session(
        _ session: MultipeerSession, didFinishReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        at localURL: URL?, withError error: (any Error)?)

    /// A peer opened a byte stream to the local peer
    /// (``MultipeerSession/startStream(withName:toPeer:)`` on its side). Keep `stream`, open it,
    /// and read it on a thread of your own (reads block: see ``MultipeerInputStream``); close
    /// it when done. A stream that is not read holds its writer.
    ///
    /// The default resets the stream: the writer's next write fails.
    func session(_ session: MultipeerSession, didReceive stream: InputStream, withName streamName: String, fromPeer peerID: MultipeerPeerID)
}

extension MultipeerSessionDelegate {
    public func session(
        _ session: MultipeerSession, didReceiveCertificate fingerprint: Fingerprint, fromPeer peerID: MultipeerPeerID,
        certificateHandler: @escaping @Sendable (Bool) -> Void
    ) {
        certificateHandler(true)
    }

    public func session(
        _ session: MultipeerSession, didStartReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        with progress: Progress
    ) {}

    public func session(
        _ session: MultipeerSession, didFinishReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        at localURL: URL?, withError error: (any Error)?
    ) {}

    public func session(
        _ session: MultipeerSession, didReceive stream: InputStream, withName streamName: String, fromPeer peerID: MultipeerPeerID
    ) {
        if let stream = stream as? MultipeerInputStream {
            stream.reset(reason: "the receiving app does not take streams")
        } else {
            stream.close()
        }
    }
}

/// What a ``NearbyServiceAdvertiser`` tells its delegate, on the advertiser's
/// ``NearbyServiceAdvertiser/delegateQueue``.
public protocol NearbyServiceAdvertiserDelegate: AnyObject, Sendable {
    /// A peer invites the local peer into its session. Call `invitationHandler` once, from any
    /// thread, with true and the session this advertiser serves to accept, or with false (and
    /// nil) to decline. Not answering lets the invitation time out (the inviter's timeout, 30 s by
    /// default). `context` is what the inviter passed, nil when it passed nothing.
    func advertiser(
        _ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peerID: MultipeerPeerID,
        withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, MultipeerSession?) -> Void)

    /// Advertising did not start, or stopped for good: `error` is a ``PeerLinkCore/PeerLinkError``
    /// saying why (avahi-daemon not running, a service type or discovery info out of range, no
    /// session for the peer). The default does nothing.
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: any Error)
}

extension NearbyServiceAdvertiserDelegate {
    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: any Error) {}
}

/// What a ``NearbyServiceBrowser`` tells its delegate, on the browser's
/// ``NearbyServiceBrowser/delegateQueue``.
public protocol NearbyServiceBrowserDelegate: AnyObject, Sendable {
    /// A peer advertising the service is reachable, with its discovery info (nil when it
    /// published none). Reported again when the peer changes its discovery info.
    func browser(_ browser: NearbyServiceBrowser, foundPeer peerID: MultipeerPeerID, withDiscoveryInfo info: [String: String]?)

    /// A peer reported found withdrew its advertisement or stopped answering (within 10 s).
    func browser(_ browser: NearbyServiceBrowser, lostPeer peerID: MultipeerPeerID)

    /// Browsing did not start: `error` is a ``PeerLinkCore/PeerLinkError`` saying why
    /// (avahi-daemon not running, a service type out of range). The default does nothing.
    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: any Error)
}

extension NearbyServiceBrowserDelegate {
    public func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: any Error) {}
}

/// Lets a handler given to the app run once: later calls are ignored.
final class OnceFlag: Sendable {
    private let claimed = Locked(false)

    /// True the first time only.
    func claim() -> Bool {
        claimed.withLock { claimed in
            defer { claimed = true }
            return !claimed
        }
    }
}
