import PeerLinkCore
import PeerLinkSession

/// A session's streams carry file transfers as they are.
extension PeerStream: ResourceChannel {}

extension PeerSession {
    /// Sends `file` to `peer` over a stream named ``PeerLinkCore/ResourceProtocol/streamName``;
    /// when the link drops, a new stream is opened as soon as the peer is connected again and
    /// the transfer resumes (within the sender's ``FileSender/resumeWindow``).
    public func sendFile(_ file: OutgoingFile, to peer: PeerID, using sender: FileSender = FileSender()) -> FileTransfer {
        sender.send(file, to: peer) { [self] in
            try await openStream(named: ResourceProtocol.streamName, to: peer)
        }
    }
}

extension FileReceiver {
    /// Reads the offer that opens a stream named ``PeerLinkCore/ResourceProtocol/streamName``.
    ///
    /// - Throws: a ``TransferFailure`` as ``offer(on:from:)``; `protocolError` for a stream of
    ///   another name (which is left alone).
    public func offer(on stream: PeerStream) async throws(TransferFailure) -> IncomingFile {
        guard stream.name == ResourceProtocol.streamName else {
            throw TransferFailure(.protocolError, "stream \"\(stream.name)\" is not a file transfer (\(ResourceProtocol.streamName))")
        }
        return try await offer(on: stream, from: stream.peer)
    }
}
