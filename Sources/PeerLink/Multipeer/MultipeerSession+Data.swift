import Foundation
import PeerLinkCore
import PeerLinkFiles
import PeerLinkPosix
import PeerLinkSession

extension MultipeerSession {
    /// Sends the file at `resourceURL` to `peerID` under the name `resourceName`.
    ///
    /// The file is hashed (SHA-256), offered, and sent over a stream of its own, behind nothing:
    /// messages and other streams keep flowing. The receiver verifies the hash before its
    /// delegate hears of the file
    /// (``MultipeerSessionDelegate/session(_:didFinishReceivingResourceWithName:fromPeer:at:withError:)``).
    ///
    /// - Returns: a `Progress` counting the bytes the receiver holds out of the file's size
    ///   (it reaches its total once the receiver verified the file). `progress.cancel()` stops
    ///   the transfer: the completion handler gets a `cancelled` error, and so does the
    ///   receiver's delegate.
    /// - Parameter completionHandler: called once on ``delegateQueue``: with nil once the
    ///   receiver verified the file, or with a ``PeerLinkCore/PeerLinkError`` saying why not
    ///   (`cancelled` by either side or refused by the receiver, `notConnected` when the peer or
    ///   the local peer left the session, `unknown` for a file that could not be read or bytes
    ///   that did not match).
    /// - Throws: a ``PeerLinkCore/PeerLinkError`` at once, and then the handler is never called:
    ///   `invalidParameter` for a URL that is not a regular local file, an empty name or the
    ///   local peer; `notConnected` when the peer is not connected.
    @discardableResult
    public func sendResource(
        at resourceURL: URL, withName resourceName: String, toPeer peerID: MultipeerPeerID,
        withCompletionHandler completionHandler: (@Sendable ((any Error)?) -> Void)? = nil
    ) throws(PeerLinkError) -> Progress? {
        guard resourceURL.isFileURL else {
            throw PeerLinkError(.invalidParameter, "\(resourceURL) is not a local file: pass a file URL (URL(fileURLWithPath:))")
        }
        guard !resourceName.isEmpty else { throw PeerLinkError(.invalidParameter, "a resource needs a name: pass a non-empty resourceName") }
        let path = resourceURL.path
        guard let size = PosixFile.length(of: path) else {
            throw PeerLinkError(
                .invalidParameter,
                PosixFile.isDirectory(path)
                    ? "\(path) is a directory: send the files in it one by one (or an archive of it)"
                    : "\(path) is not an existing regular file: check the path")
        }
        let session = try peerSession(connectedTo: peerID, for: "send a resource")
        let job = ResourceJob(peer: peerID.fingerprint)
        let progress = Progress(totalUnitCount: Int64(clamping: size))
        progress.isCancellable = true
        progress.isPausable = false
        progress.cancellationHandler = { job.cancel(reason: "the sender cancelled") }
        guard track(job) else { throw PeerLinkError(.notConnected, "\(peerID) is not connected: send the resource once it is") }
        let once = OnceFlag()
        // The transfer holds the session weakly: releasing it cancels the transfer (deinit).
        let owner = WeakSession(self)
        let queue = delegateQueue
        let finish: @Sendable ((any Error)?) -> Void = { error in
            owner.session?.forget(job)
            guard once.claim(), let completionHandler else { return }
            queue.async { completionHandler(error) }
        }
        let to = peerID.peerID
        let logger = logger
        Task {
            let file: OutgoingFile
            do throws(TransferFailure) {
                file = try await OutgoingFile.prepare(path: path, name: resourceName)
            } catch {
                finish(job.error(for: error))
                return
            }
            if let cancelled = job.cancelled {
                finish(cancelled)
                return
            }
            let transfer = session.sendFile(file, to: to, using: FileSender(resumeWindow: Self.resumeWindow))
            guard job.attach(transfer) else {
                finish(job.error(for: await transfer.result()))
                return
            }
            logger.debug("sending \(file.name) (\(file.size) bytes) to \(to)")
            progress.totalUnitCount = Int64(clamping: file.size)
            await Self.follow(transfer, with: progress)
            finish(job.error(for: await transfer.result()))
        }
        return progress
    }

    /// Opens a byte stream named `streamName` to `peerID`.
    ///
    /// Returns at once with a ``MultipeerOutputStream``; the stream opens on the link in the
    /// background, and the peer's delegate gets the other end
    /// (``MultipeerSessionDelegate/session(_:didReceive:withName:fromPeer:)``). Open it, write on
    /// a thread of your own (writes block while the peer's reader is behind), close it at the end.
    /// From async code, ``PeerLinkSession/PeerSession/openStream(named:to:)`` suspends instead.
    ///
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `invalidParameter` for a name that is empty,
    ///   over 255 bytes, or PeerLink's own file-transfer name, or for the local peer;
    ///   `notConnected` when the peer is not connected. Failures after this (the peer refuses the
    ///   stream, the link closes) show in the stream's `streamError`.
    public func startStream(withName streamName: String, toPeer peerID: MultipeerPeerID) throws(PeerLinkError) -> OutputStream {
        let length = streamName.utf8.count
        guard (1...255).contains(length) else {
            throw PeerLinkError(.invalidParameter, "a stream name is 1 to 255 bytes of UTF-8; \(streamName.debugDescription) is \(length)")
        }
        guard streamName != ResourceProtocol.streamName else {
            throw PeerLinkError(
                .invalidParameter, "\(ResourceProtocol.streamName) is the name PeerLink's file transfers use: choose another stream name")
        }
        let session = try peerSession(connectedTo: peerID, for: "open a stream")
        let to = peerID.peerID
        return MultipeerOutputStream(name: streamName, peer: peerID) {
            try await session.openStream(named: streamName, to: to)
        }
    }

    /// How long a file transfer waits for a lost link to the peer to come back and resume.
    static let resumeWindow: Duration = .seconds(10)

    // MARK: - Receiving

    /// A stream a peer opened: a file, or a stream for the delegate.
    func accept(_ stream: PeerStream) {
        let peer = MultipeerPeerID(stream.peer)
        guard stream.name == ResourceProtocol.streamName else {
            // Foundation streams are not Sendable; this one keeps its state behind a lock, and
            // is handed over whole to the delegate queue.
            nonisolated(unsafe) let input = MultipeerInputStream(stream)
            delegateQueue.async {
                if let delegate = self.delegate {
                    delegate.session(self, didReceive: input, withName: input.name, fromPeer: peer)
                } else {
                    input.reset(reason: "the receiving app has no session delegate")
                }
            }
            return
        }
        let job = ResourceJob(peer: peer.fingerprint)
        guard track(job, requiringConnected: false) else {
            stream.reset(reason: "\(myPeerID.displayName) left the session")
            return
        }
        let directory = resourceDirectory
        let logger = logger
        let queue = delegateQueue
        // The transfer holds the session weakly: releasing it cancels the transfer (deinit).
        let owner = WeakSession(self)
        Task {
            defer { owner.session?.forget(job) }
            let incoming: IncomingFile
            do throws(TransferFailure) {
                try Self.makeResourceDirectory(directory)
                incoming = try await FileReceiver(directory: directory).offer(on: stream)
            } catch {
                logger.info("a file from \(peer) did not start: \(error.message)")
                return
            }
            let transfer = incoming.accept()
            guard job.attach(transfer) else {
                _ = await transfer.result()
                return
            }
            let name = incoming.name
            let progress = Progress(totalUnitCount: Int64(clamping: incoming.size))
            progress.isCancellable = true
            progress.isPausable = false
            progress.cancellationHandler = { job.cancel(reason: "the receiver cancelled") }
            if let session = owner.session {
                session.deliver { $0.session(session, didStartReceivingResourceWithName: name, fromPeer: peer, with: progress) }
            }
            await Self.follow(transfer, with: progress)
            let result = await transfer.result()
            let error = job.error(for: result)
            let path: String? = if case .success(.received(let path)) = result { path } else { nil }
            queue.async {
                if let session = owner.session, let delegate = session.delegate {
                    delegate.session(
                        session, didFinishReceivingResourceWithName: name, fromPeer: peer,
                        at: path.map { URL(fileURLWithPath: $0) }, withError: error)
                }
                // As in MultipeerConnectivity: the app moved the file out, or it goes.
                if let path { PosixFile.remove(path) }
            }
        }
    }

    /// Copies `transfer`'s progress into `progress` until it ends (complete when it succeeded).
    private static func follow(_ transfer: FileTransfer, with progress: Progress) async {
        do {
            for try await update in transfer.updates {
                progress.completedUnitCount = Int64(clamping: update.bytesDone)
            }
            progress.completedUnitCount = progress.totalUnitCount
        } catch {
            // The end is read from the transfer's result.
        }
    }

    // MARK: - The directory files arrive in

    static func makeResourceDirectoryPath() -> String {
        let base = NSTemporaryDirectory()
        return (base.hasSuffix("/") ? base : base + "/") + "peerlink-resources-\(UUID().uuidString)"
    }

    private static func makeResourceDirectory(_ path: String) throws(TransferFailure) {
        do {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw TransferFailure(
                .fileSystem, "cannot make \(path) to receive files in: \(error) (check TMPDIR points to a directory you may write to)")
        }
    }

    /// Removes the directory files arrived in, with what a transfer left there.
    func removeResourceDirectory() {
        try? FileManager.default.removeItem(atPath: resourceDirectory)
    }
}

/// One file on its way to or from a peer, as the session tracks it: cancelled when the app
/// cancels its `Progress`, when the peer leaves, or when the local peer leaves the session.
final class ResourceJob: Sendable {
    let peer: Fingerprint
    private let state = Locked<(transfer: FileTransfer?, cancel: (reason: String, code: PeerLinkError.Code)?)>((nil, nil))

    init(peer: Fingerprint) {
        self.peer = peer
    }

    /// Makes `transfer` the one a cancel stops; false (and the transfer cancelled) when the job
    /// was cancelled already.
    func attach(_ transfer: FileTransfer) -> Bool {
        let reason = state.withLock { state -> String? in
            state.transfer = transfer
            return state.cancel?.reason
        }
        if let reason { transfer.cancel(reason: reason) }
        return reason == nil
    }

    /// Stops the job: its transfer ends with `reason`, reported with `code`. Only the first
    /// cancel counts.
    func cancel(reason: String, code: PeerLinkError.Code = .cancelled) {
        let transfer = state.withLock { state -> FileTransfer? in
            guard state.cancel == nil else { return nil }
            state.cancel = (reason, code)
            return state.transfer
        }
        transfer?.cancel(reason: reason)
    }

    /// The error the app is told when the job was cancelled; nil while it was not.
    var cancelled: PeerLinkError? {
        state.withLock { state in state.cancel.map { PeerLinkError($0.code, "cancelled: \($0.reason)") } }
    }

    /// What the app is told: nil for success, else a PeerLinkError (this side's cancel with the
    /// code it was given).
    func error(for result: Result<TransferOutcome, TransferFailure>) -> PeerLinkError? {
        switch result {
        case .success: nil
        case .failure(let failure): error(for: failure)
        }
    }

    func error(for failure: TransferFailure) -> PeerLinkError {
        if failure.kind == .cancelled, let code = state.withLock({ $0.cancel?.code }) {
            return PeerLinkError(code, failure.message)
        }
        return failure.peerLinkError
    }
}
