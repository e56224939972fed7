import Foundation
import PeerLinkCore

/// The known-peers file next to the identity: `$XDG_CONFIG_HOME/peerlink/known-peers.json`.
public enum KnownPeersStore {
    public static func defaultPath(identityPath: String) -> String {
        (identityPath as NSString).deletingLastPathComponent + "/known-peers.json"
    }

    /// Reads the file; a missing file is an empty store, a corrupt one an error naming the path.
    public static func load(at path: String) throws(PeerLinkError) -> KnownPeers {
        guard FileManager.default.fileExists(atPath: path) else { return KnownPeers() }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw PeerLinkError(.unavailable, "cannot read known peers file \(path): check its permissions")
        }
        guard let peers = KnownPeers(fileContents: data) else {
            throw PeerLinkError(.invalidParameter, "known peers file \(path) is corrupt; it was left untouched: move it away to start afresh")
        }
        return peers
    }

    /// Writes the file atomically, mode 0600.
    public static func save(_ peers: KnownPeers, at path: String) throws(PeerLinkError) {
        let directory = (path as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            let temporary = path + ".tmp-\(ProcessInfo.processInfo.processIdentifier)"
            guard FileManager.default.createFile(atPath: temporary, contents: peers.fileContents(), attributes: [.posixPermissions: 0o600]) else {
                throw PeerLinkError(.unavailable, "cannot write \(temporary)")
            }
            if rename(temporary, path) != 0 {
                unlink(temporary)
                throw PeerLinkError(.unavailable, "cannot replace \(path)")
            }
        } catch let error as PeerLinkError {
            throw error
        } catch {
            throw PeerLinkError(.unavailable, "cannot save known peers to \(path): \(error.localizedDescription)")
        }
    }
}
