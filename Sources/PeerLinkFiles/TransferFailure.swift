import PeerLinkCore

/// Why a file transfer did not end with a verified file. ``message`` says what to do.
public struct TransferFailure: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: String, Hashable, Sendable {
        /// This side cancelled (``FileTransfer/cancel(reason:)``).
        case cancelled
        /// The peer cancelled: the message starts with "cancelled by the peer".
        case cancelledByPeer
        /// The receiver declined the offer (its reason is in the message).
        case declined
        /// The bytes did not hash to the offered SHA-256; the receiver removed its partial file.
        case checksumMismatch
        /// The link went away and did not come back in time; the receiver keeps what it has,
        /// and sending the same file again resumes.
        case linkLost
        /// A file could not be read or written here or at the receiver: disk full, permission
        /// denied, a file of that name exists, a file missing.
        case fileSystem
        /// The peer does not follow the resource protocol.
        case protocolError
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }

    /// The same failure as the project-wide error type (for a command's exit status).
    public var peerLinkError: PeerLinkError {
        switch kind {
        case .cancelled, .cancelledByPeer, .declined: PeerLinkError(.cancelled, message)
        case .linkLost: PeerLinkError(.notConnected, message)
        case .checksumMismatch, .fileSystem, .protocolError: PeerLinkError(.unknown, message)
        }
    }
}

/// How a transfer ended well.
public enum TransferOutcome: Hashable, Sendable {
    /// The receiver verified the file's SHA-256 and has it in place.
    case sent
    /// The file is verified and in place at `path`.
    case received(path: String)
}
