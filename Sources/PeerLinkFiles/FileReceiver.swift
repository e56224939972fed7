import Crypto
import PeerLinkCore
import PeerLinkPosix

#if canImport(Glibc)
import Glibc
#endif

/// Receives files into one directory: through a temporary file, verified, moved into place.
///
/// For each transfer the receiver writes to a hidden partial file in the destination
/// directory (``PeerLinkCore/ResumeBook/partialName(sender:transfer:)``), hashing as the bytes
/// arrive. Only when every byte is there and the SHA-256 matches the offer does it move the file
/// into place — atomically, and never over an existing file: with ``Collision/number`` (the
/// default) `report.pdf` becomes `report (1).pdf`, with ``Collision/refuse`` the offer is
/// declined. A mismatch removes the partial file. A transfer that stops early (lost link,
/// cancel, disk full) keeps it, and when the same sender offers the same file again the
/// receiver answers with the length it holds, re-hashes that prefix, and continues from there.
public struct FileReceiver: Sendable {
    /// What to do when a file of the offered name exists.
    public enum Collision: Sendable, Hashable {
        /// Save under the first free name of `name (1).ext`, `name (2).ext`, ... (up to 999).
        case number
        /// Decline the offer, saying the file exists.
        case refuse
    }

    public let directory: String
    public var collision: Collision

    /// How many files one peer may have in transfer to a receiver (and its copies) at once, and
    /// how many all peers together: an accepted offer beyond either is declined at once, saying
    /// so, before any file is opened (each transfer holds its partial file open).
    public static let maxTransfersPerPeer = 8
    public static let maxTransfers = 32
    let slots = TransferSlots()

    public init(directory: String, collision: Collision = .number) {
        self.directory = directory.count > 1 && directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        self.collision = collision
    }

    /// Reads the offer that opens `channel` (a stream `peer` opened).
    ///
    /// - Throws: a ``TransferFailure``: the stream ended or broke before an offer, or it did
    ///   not start with one (the stream is reset then).
    public func offer(on channel: any ResourceChannel, from peer: PeerID) async throws(TransferFailure) -> IncomingFile {
        var reader = MessageReader(channel)
        let message: ResourceMessage?
        do {
            message = try await reader.next()
        } catch let error as PeerLinkError where error.code == .cancelled {
            throw TransferFailure(.cancelledByPeer, "cancelled by the peer: \(FileTransfer.peerReason(error.message))")
        } catch let error as PeerLinkError where error.code == .unknown || error.code == .unsupported {
            channel.reset(reason: error.message)
            throw TransferFailure(.protocolError, error.message)
        } catch {
            throw TransferFailure(.linkLost, "the link to \(peer.displayName) went away before its offer: \(error)")
        }
        guard case .offer(let offer)? = message else {
            let text = "the stream did not start with an offer"
            channel.reset(reason: text)
            throw TransferFailure(.protocolError, "\(peer.displayName) broke the resource protocol: \(text)")
        }
        return IncomingFile(peer: peer, offer: offer, receiver: self, channel: channel, reader: reader)
    }

    func path(_ name: String) -> String { directory == "/" ? "/" + name : directory + "/" + name }
}

/// An offer waiting for an answer: ``accept()`` or ``decline(reason:)``.
public struct IncomingFile: Sendable {
    public let peer: PeerID
    public let offer: ResourceOffer
    public let receiver: FileReceiver
    let channel: any ResourceChannel
    let reader: MessageReader

    /// The name the file will be saved under (sanitised; numbered if that name is taken).
    public var name: String { ResourceName.sanitized(offer.name) }
    public var size: UInt64 { offer.size }

    /// Bytes of this file kept from an earlier, interrupted transfer (0 when none).
    public var alreadyReceived: UInt64 {
        let base = receiver.path(ResumeBook.partialName(sender: peer.fingerprint, transfer: offer.transferID))
        return ResumeBook.decide(
            offer: offer, record: PosixFile.contents(of: base + ResumeBook.metaSuffix),
            partialLength: PosixFile.length(of: base + ResumeBook.partSuffix)
        ).offset
    }

    /// Declines the offer; the sender's transfer ends with `declined` and this reason.
    public func decline(reason: String = "declined") async {
        try? await channel.send(.decline(reason: reason))
        try? await channel.finish()
    }

    /// Accepts the offer and starts receiving; the returned transfer ends with the file's
    /// path once it is verified and in place.
    public func accept() -> FileTransfer {
        let transfer = FileTransfer(direction: .receiving, name: name, size: size, peer: peer)
        let incoming = self
        transfer.start { transfer in
            await incoming.receive(transfer)
        }
        return transfer
    }

    /// Receivers of the same partial file in this process, so a re-offer waits for a stale
    /// receiver (its link not yet noticed as lost) to let go.
    private static let busy = Locked<Set<String>>([])

    private func receive(_ transfer: FileTransfer) async -> Result<TransferOutcome, TransferFailure> {
        guard transfer.use(channel) else { return .failure(TransferFailure(.cancelled, "cancelled: \(transfer.cancelReason ?? "")")) }
        let base = receiver.path(ResumeBook.partialName(sender: peer.fingerprint, transfer: offer.transferID))
        var claimed = false
        for _ in 0..<100 {
            claimed = Self.busy.withLock { $0.insert(base).inserted }
            if claimed { break }
            try? await Task.sleep(for: .milliseconds(50))
        }
        guard claimed else {
            return await refuse("\(name) from \(peer.displayName) is being received already", kind: .protocolError)
        }
        defer { _ = Self.busy.withLock { $0.remove(base) } }
        // Each transfer holds a partial file open: a peer that offers file after file and sends
        // none of them must not take every descriptor of the process. (Taken after the claim, so
        // a re-offer after a lost link finds the slot of the stale receiver it waited for free.)
        guard let slot = receiver.slots.take(for: peer.fingerprint) else {
            let under = receiver.slots.count(for: peer.fingerprint)
            let reason = under >= FileReceiver.maxTransfersPerPeer
                ? "the receiver takes at most \(FileReceiver.maxTransfersPerPeer) files from one peer at a time: send it again once one has finished"
                : "the receiver is taking \(FileReceiver.maxTransfers) files at once already: send it again later"
            await decline(reason: reason)
            return .failure(TransferFailure(
                .declined,
                "declined \(name) from \(peer.displayName): \(under) of their files are being received (at most \(FileReceiver.maxTransfersPerPeer) from one peer and \(FileReceiver.maxTransfers) in all at a time)"))
        }
        defer { slot.release() }
        do {
            return .success(try await run(transfer, base: base))
        } catch {
            let failure = transfer.failure(from: error)
            if failure.kind == .protocolError { channel.reset(reason: failure.message) }
            return .failure(failure)
        }
    }

    private func refuse(_ reason: String, kind: TransferFailure.Kind) async -> Result<TransferOutcome, TransferFailure> {
        await decline(reason: reason)
        return .failure(TransferFailure(kind, reason))
    }

    private func run(_ transfer: FileTransfer, base: String) async throws -> TransferOutcome {
        let directory = receiver.directory
        guard PosixFile.isDirectory(directory) else {
            let error = SystemError("stat", errno: ENOENT)
            await decline(reason: FileErrors.toSender(error))
            throw FileErrors.writing(directory, error)
        }
        if receiver.collision == .refuse, PosixFile.exists(receiver.path(name)) {
            await decline(reason: "the receiver has a file named \(name) and keeps it: send the file again once it was moved or renamed there")
            throw TransferFailure(
                .fileSystem,
                "a file named \(name) exists in \(directory): it is kept; remove or rename it, or receive without refusing existing names, then have the file sent again")
        }
        let partPath = base + ResumeBook.partSuffix
        let metaPath = base + ResumeBook.metaSuffix

        // Where to start: what is kept for this (sender, transfer), if it fits the offer.
        let decision = ResumeBook.decide(
            offer: offer, record: PosixFile.contents(of: metaPath), partialLength: PosixFile.length(of: partPath))
        if case .restart = decision {
            PosixFile.remove(partPath)
            PosixFile.remove(metaPath)
        }
        if decision.offset == 0 { makeRoomForAnotherPartial(base: base) }
        // Room for what is still to come, next to what the transfers under way here will write:
        // an offer the disk cannot hold (a hostile peer's 2^64 bytes, or a real file too big) is
        // declined before a byte is written.
        let coming = size - min(size, decision.offset)
        guard let reservation = SpaceReservation.take(coming, in: directory) else {
            let space = PosixFile.space(at: directory)
            let freeText = space.map { "\(ByteCount.text($0.available)) free" } ?? "its free space unknown"
            await decline(reason: "the receiver has no room for it: \(ByteCount.text(coming)) to come, \(freeText)")
            throw TransferFailure(
                .fileSystem,
                "no room in \(directory) for \(name) from \(peer.displayName): \(ByteCount.text(coming)) to come, \(freeText) (the receiver keeps \(ByteCount.text(SpaceReservation.spare(total: space?.total ?? 0))) free and room for the files it is receiving); declined")
        }
        defer { reservation.release() }
        // Opening, and re-hashing what is kept (up to the whole file, seconds for a large one),
        // on a thread of its own, not one of the few cooperative ones.
        let kept = decision.offset
        let opened: (part: PosixFile, offset: UInt64, hasher: SHA256)
        do {
            opened = try await runBlocking("peerlink-resume") { () throws -> (PosixFile, UInt64, SHA256) in
                let part = try PosixFile.openForUpdate(partPath)
                var offset = kept
                var hasher = SHA256()
                do {
                    if offset == 0 {
                        try part.truncate(to: 0)
                        try PosixFile.write(ResumeBook.record(for: offer), to: metaPath)
                    } else {
                        // Re-hash the kept prefix; a prefix that cannot be read is dropped.
                        var position: UInt64 = 0
                        while position < offset {
                            let chunk = try part.read(at: position, count: Int(min(1 << 20, offset - position)))
                            if chunk.isEmpty { break }
                            hasher.update(data: chunk)
                            position += UInt64(chunk.count)
                        }
                        if position < offset {
                            offset = 0
                            hasher = SHA256()
                            try part.truncate(to: 0)
                        }
                    }
                    try part.sync()
                } catch {
                    part.close()
                    throw error
                }
                return (part, offset, hasher)
            }
        } catch {
            let error = error as? SystemError ?? SystemError("open", errno: EIO)
            await decline(reason: FileErrors.toSender(error))
            throw FileErrors.writing(directory, error)
        }
        let part = opened.part
        let offset = opened.offset
        var hasher = opened.hasher
        defer { part.close() }

        try await channel.send(.accept(offset: offset))
        transfer.accepted(at: offset)
        let clock = ContinuousClock()
        let start = clock.now
        var meter = RateMeter()
        _ = meter.record(bytes: offset, at: .zero)
        var position = offset
        transfer.report(TransferProgress(bytesDone: position, total: size, bytesPerSecond: 0, resumedAt: offset))
        var reader = self.reader
        while position < size {
            switch try await reader.next() {
            case .data(let bytes):
                guard UInt64(bytes.count) <= size - position else {
                    throw ResourceMessage.violation("more bytes than the \(size) offered")
                }
                do {
                    try part.write(bytes, at: position)
                } catch {
                    try? await channel.send(.verdict(.error(FileErrors.toSender(error))))
                    try? await channel.finish()
                    throw FileErrors.writing(directory, error)
                }
                hasher.update(data: bytes)
                position += UInt64(bytes.count)
                let rate = meter.record(bytes: position, at: clock.now - start)
                transfer.report(TransferProgress(bytesDone: position, total: size, bytesPerSecond: rate, resumedAt: offset))
            case .cancel(let reason):
                throw TransferFailure(.cancelledByPeer, "cancelled by the peer: \(reason) (\(position) of \(size) bytes kept; a new offer resumes)")
            case nil:
                throw TransferFailure(.linkLost, "\(peer.displayName) stopped sending \(name) after \(position) of \(size) bytes; what arrived is kept and a new offer resumes")
            case let other?:
                throw ResourceMessage.violation("a \(other.kind) message during the data")
            }
        }

        // Every byte is here: verify, then move into place.
        guard Array(hasher.finalize()) == offer.sha256 else {
            part.close()
            PosixFile.remove(partPath)
            PosixFile.remove(metaPath)
            try? await channel.send(.verdict(.checksumMismatch))
            try? await channel.finish()
            throw TransferFailure(.checksumMismatch, "\(name) from \(peer.displayName) arrived damaged (its SHA-256 does not match the offer): removed; ask them to send it again")
        }
        do {
            // Flushing a large file can take seconds: on a thread of its own, not the pool's.
            try await runBlocking("peerlink-fsync") { try part.sync() }
        } catch {
            let systemError = error as? SystemError
            let failure = systemError.map { FileErrors.writing(directory, $0) }
                ?? TransferFailure(.fileSystem, "cannot write to \(directory): \(error)")
            try? await channel.send(.verdict(.error(systemError.map(FileErrors.toSender) ?? "the receiver could not write the file: send it again later")))
            throw failure
        }
        let destination: String
        do throws(TransferFailure) {
            destination = try moveIntoPlace(partPath)
        } catch {
            let failure = error
            try? await channel.send(.verdict(.error(failure.message)))
            try? await channel.finish()
            throw failure
        }
        PosixFile.remove(metaPath)
        transfer.report(TransferProgress(bytesDone: size, total: size, bytesPerSecond: meter.record(bytes: size, at: clock.now - start), resumedAt: offset))
        try? await channel.send(.verdict(.verified))
        try? await channel.finish()
        return .received(path: destination)
    }

    /// Before a transfer starts to be kept: removes the partial files that were left alone
    /// longest when this sender, or all senders together, already have as many unfinished
    /// transfers here as a receiver keeps (``PeerLinkCore/ResumeBook/keptPerSender``,
    /// ``PeerLinkCore/ResumeBook/keptInDirectory``).
    private func makeRoomForAnotherPartial(base: String) {
        let entries = PosixFile.entries(in: receiver.directory) { $0.hasPrefix(ResumeBook.partialPrefix) } ?? []
        let kept = entries.compactMap { entry in
            ResumeBook.keptTransfer(named: entry.name).map {
                ResumeBook.Kept(base: receiver.path($0.base), sender: $0.sender, modified: entry.modified)
            }
        }
        let busy = Self.busy.withLock { $0 }
        for stale in ResumeBook.toRemove(beforeStarting: base, from: peer.fingerprint.value, kept: kept, busy: busy) {
            PosixFile.remove(stale + ResumeBook.partSuffix)
            PosixFile.remove(stale + ResumeBook.metaSuffix)
        }
    }

    /// Moves the verified partial file to its name, never over an existing file.
    private func moveIntoPlace(_ partPath: String) throws(TransferFailure) -> String {
        let candidates = receiver.collision == .refuse ? [name] : [name] + (1...999).map { ResourceName.alternative(to: name, number: $0) }
        for candidate in candidates {
            let destination = receiver.path(candidate)
            do {
                try PosixFile.moveNoReplace(partPath, to: destination)
                return destination
            } catch where error.errno == EEXIST {
                continue
            } catch {
                throw FileErrors.writing(receiver.directory, error)
            }
        }
        throw TransferFailure(.fileSystem, receiver.collision == .refuse
            ? "a file named \(name) appeared in \(receiver.directory) meanwhile: the receiver keeps it; the verified copy is kept as \(partPath) — rename it by hand"
            : "\(name) and its numbered alternatives up to 999 exist in \(receiver.directory): clear some of them and send again")
    }
}

/// The files a receiver (and its copies) is receiving, per sender, bounded by
/// ``FileReceiver/maxTransfersPerPeer`` and ``FileReceiver/maxTransfers``.
final class TransferSlots: Sendable {
    private let taken = Locked<(bySender: [Fingerprint: Int], total: Int)>(([:], 0))

    /// One file's slot, given back with ``release()``.
    struct Slot: Sendable {
        let slots: TransferSlots
        let sender: Fingerprint

        func release() {
            slots.taken.withLock { taken in
                let left = taken.bySender[sender, default: 0] - 1
                taken.bySender[sender] = left > 0 ? left : nil
                taken.total -= 1
            }
        }
    }

    /// A slot for one more file from `sender`; nil when it has the most a peer may have, or
    /// the receiver the most in all.
    func take(for sender: Fingerprint) -> Slot? {
        taken.withLock { taken -> Slot? in
            guard taken.total < FileReceiver.maxTransfers, taken.bySender[sender, default: 0] < FileReceiver.maxTransfersPerPeer else { return nil }
            taken.bySender[sender, default: 0] += 1
            taken.total += 1
            return Slot(slots: self, sender: sender)
        }
    }

    /// How many files from `sender` are being received.
    func count(for sender: Fingerprint) -> Int { taken.withLock { $0.bySender[sender, default: 0] } }
}

/// Space promised to the files being received in this process, per file system, so that offers
/// accepted at once cannot together promise the same free space twice.
struct SpaceReservation: Sendable {
    /// What a receiver leaves free on a file system of `total` bytes, whatever is offered: a
    /// twentieth of it, at most 64 MiB.
    static func spare(total: UInt64) -> UInt64 { min(64 << 20, total / 20) }
    private static let promised = Locked<[UInt64: UInt64]>([:])
    let bytes: UInt64
    /// The file system it is promised on (nil: one that tells no free space, nothing promised).
    let fileSystem: UInt64?

    /// Reserves `bytes` when the file system under `directory` has them free besides what is
    /// promised already and its ``spare(total:)``; nil when it has not. A file system that
    /// tells no free space (read-only, `/sys`) is not judged: writing will say what is wrong.
    static func take(_ bytes: UInt64, in directory: String) -> SpaceReservation? {
        guard let space = PosixFile.space(at: directory) else { return SpaceReservation(bytes: 0, fileSystem: nil) }
        return promised.withLock { promised -> SpaceReservation? in
            let (wanted, overflow) = bytes.addingReportingOverflow(promised[space.fileSystem, default: 0])
            let spare = spare(total: space.total)
            guard !overflow, space.available >= spare, wanted <= space.available - spare else { return nil }
            promised[space.fileSystem] = wanted
            return SpaceReservation(bytes: bytes, fileSystem: space.fileSystem)
        }
    }

    func release() {
        guard let fileSystem else { return }
        Self.promised.withLock { promised in
            let left = promised[fileSystem, default: 0] - min(promised[fileSystem, default: 0], bytes)
            promised[fileSystem] = left == 0 ? nil : left
        }
    }
}
