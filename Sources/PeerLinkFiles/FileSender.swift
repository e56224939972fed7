import Crypto
import PeerLinkCore
import PeerLinkPosix

#if canImport(Glibc)
import Glibc
#endif

/// A file ready to be offered: its name, size and SHA-256 (hashed once, before any offer).
public struct OutgoingFile: Hashable, Sendable {
    public let path: String
    /// The name offered to the receiver (the file's own name, sanitised, unless told otherwise).
    public let name: String
    public let size: UInt64
    public let sha256: [UInt8]
    /// Derived from the content, size and name (``PeerLinkCore/TransferID/derived(sha256:size:name:)``):
    /// offering the same file again resumes where the receiver stopped.
    public let transferID: TransferID

    /// Reads the file at `path` once to learn its size and SHA-256 (on a thread of its own).
    ///
    /// - Parameter name: the name to offer; nil offers the file's own name.
    /// - Throws: a ``TransferFailure`` (`fileSystem`) when the file cannot be read, saying why.
    public static func prepare(path: String, name: String? = nil) async throws(TransferFailure) -> OutgoingFile {
        let offered = ResourceName.sanitized(name ?? String(path.split(separator: "/").last ?? Substring(path)))
        do {
            return try await runBlocking("peerlink-hash") { () throws -> OutgoingFile in
                let file = try PosixFile.openForReading(path)
                defer { file.close() }
                var hasher = SHA256()
                var offset: UInt64 = 0
                while true {
                    let chunk = try file.read(at: offset, count: 1 << 20)
                    if chunk.isEmpty { break }
                    hasher.update(data: chunk)
                    offset += UInt64(chunk.count)
                }
                let sha = Array(hasher.finalize())
                return OutgoingFile(
                    path: path, name: offered, size: offset, sha256: sha,
                    transferID: .derived(sha256: sha, size: offset, name: offered))
            }
        } catch let error as SystemError {
            throw FileErrors.reading(path, error)
        } catch {
            throw TransferFailure(.fileSystem, "cannot read \(path): \(error)")
        }
    }

    var offer: ResourceOffer { ResourceOffer(transferID: transferID, name: name, size: size, sha256: sha256) }
}

/// Sends files over resource channels, resuming after a lost link.
public struct FileSender: Sendable {
    /// How long a sender waits for a lost link to come back before it gives up.
    public var resumeWindow: Duration
    /// Testing hook: flip one bit of the byte at this offset on the way out (the receiver must
    /// then report a checksum mismatch).
    package var corruptOffset: UInt64?

    public init(resumeWindow: Duration = .seconds(60)) {
        self.resumeWindow = resumeWindow
    }

    /// Sends `file` to `peer` over channels from `open`: one to begin with, and a new one
    /// after each lost link (until ``resumeWindow`` passes without one), re-offering the file
    /// so that the receiver answers with the offset it holds.
    ///
    /// - Parameter open: opens a channel to the peer, waiting for it to be reachable; throws
    ///   when it cannot (the transfer then fails with that reason).
    public func send(
        _ file: OutgoingFile, to peer: PeerID, open: @escaping @Sendable () async throws -> any ResourceChannel
    ) -> FileTransfer {
        let transfer = FileTransfer(direction: .sending, name: file.name, size: file.size, peer: peer)
        let sender = self
        transfer.start { transfer in
            await sender.run(file, transfer: transfer, open: open)
        }
        return transfer
    }

    private func run(
        _ file: OutgoingFile, transfer: FileTransfer, open: @escaping @Sendable () async throws -> any ResourceChannel
    ) async -> Result<TransferOutcome, TransferFailure> {
        let clock = ContinuousClock()
        var ledger = SendLedger(size: file.size)
        var lastLoss: (ContinuousClock.Instant, TransferFailure)?
        while true {
            let channel: any ResourceChannel
            do {
                channel = try await open()
            } catch {
                if let reason = transfer.cancelReason { return .failure(TransferFailure(.cancelled, "cancelled: \(reason)")) }
                if let (since, _) = lastLoss, clock.now - since < resumeWindow {
                    try? await Task.sleep(for: .milliseconds(250))
                    continue
                }
                let text = (error as? PeerLinkError)?.message ?? "\(error)"
                return .failure(lastLoss.map { TransferFailure(.linkLost, "\($0.1.message); it did not come back within \(resumeWindow): \(text). Send the file again to resume") }
                    ?? TransferFailure(.linkLost, "cannot reach \(transfer.peer.displayName): \(text)"))
            }
            guard transfer.use(channel) else { return .failure(TransferFailure(.cancelled, "cancelled: \(transfer.cancelReason ?? "")")) }
            let answeredBefore = ledger.attempts
            do {
                try await attempt(file, over: channel, ledger: &ledger, transfer: transfer)
                try? await channel.finish()
                return .success(.sent)
            } catch {
                let failure = transfer.failure(from: error)
                guard failure.kind == .linkLost else {
                    // Whatever the peer still holds of this stream goes (a reset it sent needs no answer).
                    if failure.kind != .cancelledByPeer { channel.reset(reason: failure.message) }
                    return .failure(failure)
                }
                // The window runs from the first loss after the last offer the receiver answered.
                if lastLoss == nil || ledger.attempts > answeredBefore { lastLoss = (clock.now, failure) }
                guard let (since, _) = lastLoss, clock.now - since < resumeWindow else { return .failure(failure) }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    /// One offer and, when accepted, the bytes from the accepted offset and the verdict.
    private func attempt(
        _ file: OutgoingFile, over channel: any ResourceChannel, ledger: inout SendLedger, transfer: FileTransfer
    ) async throws {
        var reader = MessageReader(channel)
        try await channel.send(.offer(file.offer))
        let offset: UInt64
        switch try await reader.next() {
        case .accept(let at):
            offset = try ledger.accepted(at: at)
        case .decline(let reason):
            throw TransferFailure(.declined, "\(transfer.peer.displayName) declined \(file.name): \(reason)")
        case .cancel(let reason):
            throw TransferFailure(.cancelledByPeer, "cancelled by the peer: \(reason)")
        case .verdict(let verdict):
            throw TransferFailure(.fileSystem, "\(transfer.peer.displayName) cannot take \(file.name): \(verdict)")
        case nil:
            throw PeerLinkError(.notConnected, "the receiver closed the stream before answering the offer")
        case let other?:
            throw ResourceMessage.violation("a \(other.kind) message instead of an answer to the offer")
        }
        transfer.accepted(at: offset)

        // The bytes go out while the receiver's answer is awaited: a receiver that fails during
        // the data (disk full) answers at once and reads no more, and a sender that only wrote
        // would wait forever for credit that never comes.
        let sender = self
        let answer = try await withThrowingTaskGroup(of: Leg.self) { group -> ResourceMessage? in
            group.addTask { [reader] in
                var reader = reader
                return .answer(try await reader.next())
            }
            group.addTask {
                try await sender.sendBytes(of: file, from: offset, over: channel, transfer: transfer)
                return .sent
            }
            var sent = false
            var answered = false
            var answer: ResourceMessage?
            while let leg = try await group.next() {
                switch leg {
                case .sent:
                    sent = true
                case .answer(let message):
                    answered = true
                    answer = message
                }
                guard answered else { continue }
                if sent { return answer }
                switch answer {
                case .verdict(.verified)?, .verdict(.checksumMismatch)?:
                    // The receiver had every byte: the data leg is ending.
                    continue
                default:
                    // The receiver gave up (or broke the protocol) before the last byte: stop sending.
                    group.cancelAll()
                    return answer
                }
            }
            return answer
        }
        switch answer {
        case .verdict(.verified):
            return
        case .verdict(.checksumMismatch):
            throw TransferFailure(.checksumMismatch, "\(transfer.peer.displayName) received \(file.name) damaged (its SHA-256 does not match) and removed it: send it again")
        case .verdict(.error(let reason)):
            throw TransferFailure(.fileSystem, "\(transfer.peer.displayName) could not save \(file.name): \(reason)")
        case .cancel(let reason):
            throw TransferFailure(.cancelledByPeer, "cancelled by the peer: \(reason)")
        case nil:
            throw PeerLinkError(.notConnected, "the receiver closed the stream before its verdict")
        case let other?:
            throw ResourceMessage.violation("a \(other.kind) message instead of the verdict")
        }
    }

    /// One leg of an accepted offer: the bytes all queued, or the receiver's answer.
    private enum Leg: Sendable {
        case sent
        case answer(ResourceMessage?)
    }

    /// Sends the file's bytes from `offset` on, as `DATA` messages, reporting progress.
    private func sendBytes(
        of file: OutgoingFile, from offset: UInt64, over channel: any ResourceChannel, transfer: FileTransfer
    ) async throws {
        let source: PosixFile
        do {
            source = try PosixFile.openForReading(file.path)
        } catch {
            throw FileErrors.reading(file.path, error)
        }
        defer { source.close() }
        let clock = ContinuousClock()
        let start = clock.now
        var meter = RateMeter()
        var position = offset
        _ = meter.record(bytes: position, at: .zero)
        transfer.report(TransferProgress(bytesDone: position, total: file.size, bytesPerSecond: 0, resumedAt: offset))
        while position < file.size {
            try Task.checkCancellation()
            let count = Int(min(UInt64(ResourceProtocol.chunkBytes), file.size - position))
            var chunk: [UInt8]
            do {
                chunk = try source.read(at: position, count: count)
            } catch {
                let failure = FileErrors.reading(file.path, error)
                try? await channel.send(.cancel(reason: "the sender cannot read the file any more"))
                throw failure
            }
            guard chunk.count == count else {
                try? await channel.send(.cancel(reason: "the sender's file changed while it was sent"))
                throw TransferFailure(.fileSystem, "\(file.path) became shorter while it was sent: send it again once nothing writes to it")
            }
            if let corrupt = corruptOffset, corrupt >= position, corrupt < position + UInt64(count) {
                chunk[Int(corrupt - position)] ^= 0x01
            }
            try await channel.send(.data(chunk))
            position += UInt64(count)
            let rate = meter.record(bytes: position, at: clock.now - start)
            transfer.report(TransferProgress(bytesDone: position, total: file.size, bytesPerSecond: rate, resumedAt: offset))
        }
    }
}

/// Messages for file-system failures, each saying what to do.
enum FileErrors {
    static func reading(_ path: String, _ error: SystemError) -> TransferFailure {
        switch error.errno {
        case ENOENT: TransferFailure(.fileSystem, "\(path) does not exist: check the path")
        case EACCES, EPERM: TransferFailure(.fileSystem, "\(path) cannot be read: permission denied (check its permissions)")
        case EISDIR: TransferFailure(.fileSystem, "\(path) is a directory: send the files in it one by one (or an archive of it)")
        case EINVAL: TransferFailure(.fileSystem, "\(path) is not a regular file: send a regular file")
        default: TransferFailure(.fileSystem, "cannot read \(path): \(error)")
        }
    }

    /// What the sender is told when the receiver cannot write: the receiver's paths stay with
    /// the receiver, and the text says what happens next from the sender's side.
    static func toSender(_ error: SystemError) -> String {
        switch error.errno {
        case ENOSPC, EDQUOT:
            "the receiver's disk is full: send the file again once it has made room (what arrived is kept and the transfer resumes)"
        case EACCES, EPERM:
            "the receiver may not write to its download directory: send the file again once it receives into another one"
        case EROFS:
            "the receiver's download directory is on a read-only file system: send the file again once it receives into another one"
        case ENOENT, ENOTDIR:
            "the receiver's download directory does not exist: send the file again once it has created it or chosen another one"
        default:
            "the receiver could not write the file (\(String(cString: strerror(error.errno)))): send it again later"
        }
    }

    static func writing(_ directory: String, _ error: SystemError) -> TransferFailure {
        switch error.errno {
        case ENOSPC, EDQUOT:
            TransferFailure(.fileSystem, "the disk holding \(directory) is full: free some space and send the file again (what arrived is kept and the transfer resumes)")
        case EACCES, EPERM:
            TransferFailure(.fileSystem, "cannot write to \(directory): permission denied (receive into a directory you may write to, e.g. --dir ~/Downloads)")
        case EROFS:
            TransferFailure(.fileSystem, "cannot write to \(directory): the file system is read-only (receive into another directory)")
        case ENOENT, ENOTDIR:
            TransferFailure(.fileSystem, "\(directory) is not an existing directory: create it or receive into another one")
        default:
            TransferFailure(.fileSystem, "cannot write to \(directory): \(error)")
        }
    }
}
