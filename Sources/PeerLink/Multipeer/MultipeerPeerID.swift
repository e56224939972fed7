import Foundation
import PeerLinkCore
import PeerLinkPosix

/// A peer as the MultipeerConnectivity-shaped API names it: a display name and an identity.
///
/// The local peer is made from a display name, with a new identity
/// (``init(displayName:)``, like a new peer ID in MultipeerConnectivity: two calls with the same
/// name make two different peers) or with an identity kept on disk
/// (``init(displayName:identityPath:)``, where a MultipeerConnectivity app archives its peer ID to
/// stay the same peer across launches). Remote peers come from ``NearbyServiceBrowser``,
/// ``NearbyServiceAdvertiser`` and ``MultipeerSession``.
///
/// Two peer IDs are equal when their identities (fingerprints) are equal, whatever their
/// display names: peers with the same name are different peers, and a peer that renamed itself
/// is still the same peer.
public struct MultipeerPeerID: Hashable, Sendable, CustomStringConvertible {
    /// The label people see: 1 to 63 bytes of UTF-8.
    public let displayName: String
    /// Who the peer is: the fingerprint of its public key.
    public let fingerprint: Fingerprint
    /// The key pair, for the local peer only (nil for a remote peer).
    public let identity: Identity?

    /// A new local peer with a new identity, not stored anywhere.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError`` (`invalidParameter`) for a display name that is
    ///   empty, longer than 63 bytes of UTF-8, or holds control characters.
    public init(displayName: String) throws(PeerLinkError) {
        try self.init(displayName: displayName, identity: .generate())
    }

    /// The local peer with the given identity.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError`` (`invalidParameter`) for a display name out of range.
    public init(displayName: String, identity: Identity) throws(PeerLinkError) {
        let name: DisplayName
        do {
            name = try DisplayName(displayName)
        } catch {
            throw error.peerLinkError
        }
        self.displayName = name.value
        self.fingerprint = identity.fingerprint
        self.identity = identity
    }

    /// The local peer with the identity stored at `identityPath` (created there, mode 0600, when
    /// the file does not exist): the same peer every time the app starts, as an archived peer ID
    /// is in MultipeerConnectivity. The display name may change between launches; the peer stays
    /// the same.
    ///
    /// - Parameters:
    ///   - displayName: the label others see, which may differ from launch to launch.
    ///   - identityPath: the identity file, such as ``PeerLinkPosix/IdentityStore/defaultPath(environment:)``
    ///     (`~/.config/peerlink/identity.json`, shared with the `peerlink` tool).
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `invalidParameter` for a display name out of
    ///   range or a corrupt identity file, `unavailable` when the file cannot be read or written.
    public init(displayName: String, identityPath: String) throws(PeerLinkError) {
        let loaded = try IdentityStore.loadOrCreate(at: identityPath)
        try self.init(displayName: displayName, identity: loaded.identity)
    }

    /// A remote peer, as the async API names it.
    public init(_ peer: PeerID) {
        displayName = peer.displayName
        fingerprint = peer.fingerprint
        identity = nil
    }

    /// The peer as the async API (``PeerLinkSession/PeerSession``) names it.
    public var peerID: PeerID { PeerID(fingerprint: fingerprint, displayName: displayName) }

    /// Whether this is a local peer (it holds its key pair).
    public var isLocal: Bool { identity != nil }

    public static func == (lhs: MultipeerPeerID, rhs: MultipeerPeerID) -> Bool { lhs.fingerprint == rhs.fingerprint }
    public func hash(into hasher: inout Hasher) { hasher.combine(fingerprint) }

    public var description: String { "\(displayName) [\(fingerprint)]" }
}
