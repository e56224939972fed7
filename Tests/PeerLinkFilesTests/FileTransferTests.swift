import Crypto
import Foundation
import PeerLinkCore
import PeerLinkFiles
import PeerLinkPosix
import Testing

/// A sender and a receiver joined by in-memory channels: each `open` makes a new channel pair
/// (a new "link") and hands its far end to the receiver.
final class FileLab: Sendable {
    static let alice = PeerID(fingerprint: Fingerprint(publicKey: [UInt8](repeating: 1, count: 32)), displayName: "alice")
    static let bob = PeerID(fingerprint: Fingerprint(publicKey: [UInt8](repeating: 2, count: 32)), displayName: "bob")

    let directory: String
    let receiver: FileReceiver
    let received: AsyncStream<FileTransfer>
    private let sink: AsyncStream<FileTransfer>.Continuation
    private let current = Locked<MemoryChannel?>(nil)
    let declineWith: String?
    /// Who the receiver is told sends (alice unless a test needs a sender of its own).
    let sender: PeerID
    private let channels = Locked<[MemoryChannel]>([])

    init(directory: String? = nil, collision: FileReceiver.Collision = .number, declineWith: String? = nil, sender: PeerID = FileLab.alice) throws {
        let directory = try directory ?? Self.temporaryDirectory()
        self.directory = directory
        receiver = FileReceiver(directory: directory, collision: collision)
        (received, sink) = AsyncStream.makeStream(of: FileTransfer.self)
        self.declineWith = declineWith
        self.sender = sender
    }

    static func temporaryDirectory() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("peerlink-files-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Opens a new channel pair; the receiver answers its offer in a task of its own.
    @Sendable func open() async throws -> any ResourceChannel {
        let (near, far) = MemoryChannel.pair()
        current.withLock { $0 = near }
        channels.withLock { $0.append(near) }
        let receiver = self.receiver
        let sink = self.sink
        let declineWith = self.declineWith
        let sender = self.sender
        Task {
            guard let incoming = try? await receiver.offer(on: far, from: sender) else { return }
            if let declineWith {
                await incoming.decline(reason: declineWith)
            } else {
                sink.yield(incoming.accept())
            }
        }
        return near
    }

    /// Cuts the link under the current channel.
    func cut() {
        current.withLock { $0 }?.cut()
    }

    /// Cuts the links under every channel opened.
    func cutAll() {
        for channel in channels.withLock({ $0 }) { channel.cut() }
    }

    /// Offers a file of `size` bytes on a new channel and returns the receiver's answer.
    func offer(name: String, size: UInt64) async throws -> ResourceMessage? {
        try await offer(ResourceOffer(transferID: .random(), name: name, size: size, sha256: [UInt8](repeating: 0, count: 32)))
    }

    /// Makes `offer` on a new channel and returns the receiver's answer.
    func offer(_ offer: ResourceOffer) async throws -> ResourceMessage? {
        let channel = try await open()
        try await channel.write(try ResourceMessage.offer(offer).encoded())
        var decoder = ResourceMessageDecoder()
        var answer: ResourceMessage?
        while answer == nil, let bytes = try await channel.read() {
            decoder.append(bytes)
            answer = try decoder.next()
        }
        return answer
    }

    func files() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
    }

    /// A file of `size` bytes of a repeating pattern, and its SHA-256.
    static func makeFile(size: Int, name: String = "data.bin", seed: UInt8 = 7) throws -> (path: String, sha: [UInt8]) {
        let path = try temporaryDirectory() + "/" + name
        var bytes = [UInt8](repeating: 0, count: size)
        // Four bytes a step through a raw buffer: a byte-wise loop over a checked array kept a
        // cooperative thread busy for most of a second per 16 MiB in a debug build.
        bytes.withUnsafeMutableBytes { raw in
            var value = UInt32(seed)
            var offset = 0
            while offset + 4 <= raw.count {
                value = value &* 1_664_525 &+ 1_013_904_223
                raw.storeBytes(of: value, toByteOffset: offset, as: UInt32.self)
                offset += 4
            }
            while offset < raw.count {
                value = value &* 1_664_525 &+ 1_013_904_223
                raw[offset] = UInt8(truncatingIfNeeded: value >> 24)
                offset += 1
            }
        }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return (path, Array(SHA256.hash(data: bytes)))
    }

    static func sha(of path: String) throws -> [UInt8] {
        Array(SHA256.hash(data: try Data(contentsOf: URL(fileURLWithPath: path))))
    }
}

extension TransferUpdates {
    /// Reads every update, handing each to `body`; returns the failure the updates ended with.
    func drain(_ body: (TransferProgress) -> Void = { _ in }) async -> TransferFailure? {
        do throws(TransferFailure) {
            for try await progress in self { body(progress) }
            return nil
        } catch {
            return error
        }
    }
}

extension FileTransfer {
    /// The failure the transfer ended with; records an issue when it succeeded.
    func failure() async -> TransferFailure? {
        switch await result() {
        case .success(let outcome):
            Issue.record("expected a failure, got \(outcome)")
            return nil
        case .failure(let failure):
            return failure
        }
    }
}

@Suite("File transfers over in-memory channels: verify, resume, cancel, errors")
struct FileTransferTests {
    @Test func sendsAndVerifies() async throws {
        let lab = try FileLab()
        let (path, sha) = try FileLab.makeFile(size: 3 * 1024 * 1024 + 17, name: "photo.jpg")
        let file = try await OutgoingFile.prepare(path: path)
        #expect(file.sha256 == sha && file.name == "photo.jpg" && file.size == 3 * 1024 * 1024 + 17)

        let sending = FileSender().send(file, to: FileLab.bob, open: lab.open)
        var fractions: [Double] = []
        #expect(await sending.updates.drain { fractions.append($0.fraction) } == nil)
        #expect(fractions.last == 1)
        #expect(fractions == fractions.sorted(), "progress only grows")
        #expect(try await sending.result().get() == .sent)
        #expect(sending.acceptedOffsets == [0])

        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        guard case .received(let saved) = try await receiving.result().get() else { Issue.record("not received"); return }
        #expect(saved == lab.directory + "/photo.jpg")
        #expect(try FileLab.sha(of: saved) == sha)
        #expect(try lab.files() == ["photo.jpg"], "no partial or record files remain")
    }

    @Test func emptyFile() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 0, name: "empty")
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        #expect(try await sending.result().get() == .sent)
        #expect(try lab.files() == ["empty"])
    }

    @Test func resumesFromTheAcknowledgedOffsetAfterTheLinkDrops() async throws {
        let lab = try FileLab()
        let size = 24 * 1024 * 1024
        let (path, sha) = try FileLab.makeFile(size: size)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        var cut = false
        let ended = await sending.updates.drain { progress in
            if !cut && progress.bytesDone >= UInt64(size / 3) {
                lab.cut()
                cut = true
            }
        }
        #expect(ended == nil)
        #expect(cut)
        #expect(try await sending.result().get() == .sent)
        var iterator = lab.received.makeAsyncIterator()
        let first = try #require(await iterator.next())
        #expect(await first.failure()?.kind == .linkLost)
        let second = try #require(await iterator.next())
        guard case .received(let saved) = try await second.result().get() else { Issue.record("not received"); return }
        #expect(try FileLab.sha(of: saved) == sha)
        let offsets = sending.acceptedOffsets
        #expect(offsets.count == 2)
        #expect(offsets.first == 0)
        #expect((offsets.last ?? 0) > 0, "resumed, not restarted: \(offsets)")
        #expect(second.acceptedOffsets == [offsets.last ?? 0])
        #expect(try lab.files() == ["data.bin"])
    }

    @Test func senderCancelEndsTheReceiverWithThePeersReason() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 16 * 1024 * 1024)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let ended = await sending.updates.drain { progress in
            if progress.bytesDone > 1024 * 1024 { sending.cancel(reason: "changed my mind") }
        }
        #expect(ended?.kind == .cancelled)
        let mine = try #require(await sending.failure())
        #expect(mine.kind == .cancelled)
        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        let theirs = try #require(await receiving.failure())
        #expect(theirs.kind == .cancelledByPeer)
        #expect(theirs.message.hasPrefix("cancelled by the peer: changed my mind"))
        #expect(try lab.files().allSatisfy { $0.hasPrefix(".peerlink-") }, "the partial is kept for resuming; nothing else")
    }

    @Test func receiverCancelEndsTheSenderWithThePeersReason() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 16 * 1024 * 1024)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        let ended = await receiving.updates.drain { progress in
            if progress.bytesDone > 1024 * 1024 { receiving.cancel(reason: "disk almost full") }
        }
        #expect(ended?.kind == .cancelled)
        let theirs = try #require(await sending.failure())
        #expect(theirs.kind == .cancelledByPeer)
        #expect(theirs.message == "cancelled by the peer: disk almost full")
        #expect(sending.acceptedOffsets == [0], "a cancel is not a lost link: no resume")
    }

    @Test func checksumMismatchRemovesThePartialFile() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 1024 * 1024)
        var sender = FileSender()
        sender.corruptOffset = 300_000
        let sending = sender.send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let mine = try #require(await sending.failure())
        #expect(mine.kind == .checksumMismatch)
        #expect(mine.message.contains("send it again"))
        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        #expect(await receiving.failure()?.kind == .checksumMismatch)
        #expect(try lab.files() == [], "neither the file nor its partial remain")
    }

    @Test func existingFileGetsANumberedName() async throws {
        let lab = try FileLab()
        let (path, sha) = try FileLab.makeFile(size: 1000, name: "notes.txt")
        try Data("mine".utf8).write(to: URL(fileURLWithPath: lab.directory + "/notes.txt"))
        try Data("mine too".utf8).write(to: URL(fileURLWithPath: lab.directory + "/notes (1).txt"))
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        #expect(try await sending.result().get() == .sent)
        #expect(try lab.files() == ["notes (1).txt", "notes (2).txt", "notes.txt"])
        #expect(try FileLab.sha(of: lab.directory + "/notes (2).txt") == sha)
        #expect(try String(contentsOfFile: lab.directory + "/notes.txt", encoding: .utf8) == "mine", "never overwritten")
    }

    @Test func existingFileIsRefusedWithAClearError() async throws {
        let lab = try FileLab(collision: .refuse)
        let (path, _) = try FileLab.makeFile(size: 1000, name: "notes.txt")
        try Data("mine".utf8).write(to: URL(fileURLWithPath: lab.directory + "/notes.txt"))
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let failure = try #require(await sending.failure())
        #expect(failure.kind == .declined)
        #expect(failure.message.contains("the receiver has a file named notes.txt and keeps it"), "\(failure.message)")
        #expect(!failure.message.contains(lab.directory), "the receiver's path reached the sender")
        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        let local = try #require(await receiving.failure())
        #expect(local.kind == .fileSystem)
        #expect(local.message.contains("a file named notes.txt exists in \(lab.directory)"), "\(local.message)")
        #expect(try lab.files() == ["notes.txt"])
    }

    @Test func receiverFailingDuringTheDataStopsTheSender() async throws {
        // A receiver that accepts, takes one DATA message, answers VERDICT 2 (as on a full disk)
        // and reads no more: the sender, short of credit, must stop and report it, not wait.
        let (near, far) = MemoryChannel.pair(capacity: 64 * 1024)
        let receiver = Task {
            var decoder = ResourceMessageDecoder()
            var dataMessages = 0
            while dataMessages == 0, let bytes = try await far.read() {
                decoder.append(bytes)
                while let message = try decoder.next() {
                    switch message {
                    case .offer: try await far.write(try ResourceMessage.accept(offset: 0).encoded())
                    case .data: dataMessages += 1
                    default: break
                    }
                }
            }
            try await far.write(try ResourceMessage.verdict(.error("the disk is full")).encoded())
            try await far.finish()
        }
        let (path, _) = try FileLab.makeFile(size: 8 * 1024 * 1024)
        let opened = Locked(0)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob) {
            opened.withLock { $0 += 1 }
            return near
        }
        // A sender that waits for credit forever fails the test instead of stalling it.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30))
            sending.cancel(reason: "the test stopped waiting for the sender")
        }
        defer { watchdog.cancel() }
        let failure = try #require(await sending.failure())
        #expect(failure.kind == .fileSystem)
        #expect(failure.message == "bob could not save data.bin: the disk is full")
        #expect(opened.withLock { $0 } == 1, "not taken for a lost link: no second offer")
        #expect(near.written.withLock { $0 } < 1024 * 1024, "the sender stopped early: \(near.written.withLock { $0 }) bytes")
        try await receiver.value
    }

    @Test func permissionDeniedIsAClearError() async throws {
        // Root writes anywhere a mode allows nothing, but not into sysfs.
        let directory = geteuid() == 0 ? "/sys/kernel" : try FileLab.temporaryDirectory()
        if geteuid() != 0 { chmod(directory, 0o500) }
        let lab = try FileLab(directory: directory)
        let (path, _) = try FileLab.makeFile(size: 1000)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let failure = try #require(await sending.failure())
        #expect(failure.kind == .declined)
        #expect(failure.message.contains("the receiver may not write to its download directory"), "\(failure.message)")
        #expect(!failure.message.contains(directory), "the receiver's path reached the sender: \(failure.message)")
        // The receiver's own failure names the directory and says what to do.
        var iterator = lab.received.makeAsyncIterator()
        let local = try #require(await iterator.next()?.failure())
        #expect(local.message.contains("permission denied"), "\(local.message)")
        #expect(local.message.contains("--dir"), "says what to do: \(local.message)")
    }

    @Test func missingDirectoryIsAClearError() async throws {
        let lab = try FileLab(directory: "/nonexistent/peerlink-\(UUID().uuidString)")
        let (path, _) = try FileLab.makeFile(size: 10)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let failure = try #require(await sending.failure())
        #expect(failure.message.contains("the receiver's download directory does not exist"), "\(failure.message)")
        var iterator = lab.received.makeAsyncIterator()
        let local = try #require(await iterator.next()?.failure())
        #expect(local.message.contains("is not an existing directory"), "\(local.message)")
    }

    @Test func declineReachesTheSender() async throws {
        let lab = try FileLab(declineWith: "not now")
        let (path, _) = try FileLab.makeFile(size: 10)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        let failure = try #require(await sending.failure())
        #expect(failure.kind == .declined)
        #expect(failure.message == "bob declined data.bin: not now")
    }

    /// An offer larger than the receiver's disk can hold (a hostile peer's 2^64 − 1 bytes) is
    /// declined before anything is written, saying why on both sides; the space is not promised.
    @Test func anOfferTheDiskCannotHoldIsDeclined() async throws {
        let lab = try FileLab()
        let answer = try await lab.offer(name: "huge.bin", size: .max)
        guard case .decline(let reason)? = answer else {
            Issue.record("expected a decline, got \(String(describing: answer))")
            return
        }
        #expect(reason.contains("no room"), "\(reason)")
        #expect(!reason.contains(lab.directory), "the receiver's path reached the sender")
        var iterator = lab.received.makeAsyncIterator()
        let receiving = try #require(await iterator.next())
        let local = try #require(await receiving.failure())
        #expect(local.kind == .fileSystem)
        #expect(local.message.contains("no room in \(lab.directory) for huge.bin"), "\(local.message)")
        #expect(try lab.files() == [], "no partial file")
        // Nothing stays promised: an ordinary file goes through afterwards.
        let (path, sha) = try FileLab.makeFile(size: 4096)
        let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
        #expect(try await sending.result().get() == .sent)
        #expect(try FileLab.sha(of: lab.directory + "/data.bin") == sha)
    }

    @Test func hostileNamesStayInTheDirectory() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 10)
        let file = try await OutgoingFile.prepare(path: path, name: "../../etc/cron.d/evil\u{1B}[2J")
        #expect(file.name == "evil_[2J")
        let sending = FileSender().send(file, to: FileLab.bob, open: lab.open)
        #expect(try await sending.result().get() == .sent)
        #expect(try lab.files() == ["evil_[2J"])
    }

    @Test func unreadableSourceIsAClearError() async throws {
        await #expect {
            _ = try await OutgoingFile.prepare(path: "/nonexistent/file.bin")
        } throws: { error in
            (error as? TransferFailure)?.message == "/nonexistent/file.bin does not exist: check the path"
        }
        let directory = try FileLab.temporaryDirectory()
        await #expect {
            _ = try await OutgoingFile.prepare(path: directory)
        } throws: { error in
            (error as? TransferFailure)?.message.contains("is a directory") == true
        }
    }

    @Test func aSenderThatDropsOfferAfterOfferLeavesABoundedNumberOfPartialFiles() async throws {
        let lab = try FileLab()
        var iterator = lab.received.makeAsyncIterator()
        let count = ResumeBook.keptPerSender + 4
        var first: [String] = []
        for index in 0..<count {
            let offer = ResourceOffer(transferID: .random(), name: "f\(index)", size: 4096, sha256: [UInt8](repeating: 0, count: 32))
            let answer = try await lab.offer(offer)
            guard case .accept(offset: 0)? = answer else {
                Issue.record("expected an accept at 0, got \(String(describing: answer))")
                return
            }
            if index < 4 { first.append(ResumeBook.partialName(sender: FileLab.alice.fingerprint, transfer: offer.transferID)) }
            lab.cut()
            let receiving = try #require(await iterator.next())
            #expect(await receiving.failure()?.kind == .linkLost)
            // File times have a coarse clock: keep the order visible to it.
            try await Task.sleep(for: .milliseconds(15))
        }
        let files = try lab.files()
        #expect(files.count { $0.hasSuffix(ResumeBook.partSuffix) } == ResumeBook.keptPerSender, "\(files)")
        #expect(files.count { $0.hasSuffix(ResumeBook.metaSuffix) } == ResumeBook.keptPerSender, "\(files)")
        for base in first {
            #expect(!files.contains(base + ResumeBook.partSuffix), "the oldest are removed first: \(base)")
        }
    }

    @Test func aPeerHoldsAtMostEightTransfersOpenAtOnce() async throws {
        let mallory = PeerID(fingerprint: Fingerprint(publicKey: [UInt8](repeating: 9, count: 32)), displayName: "mallory")
        let lab = try FileLab(sender: mallory)
        // Offers whose data never comes, each holding a partial file open while it waits.
        for index in 0..<FileReceiver.maxTransfersPerPeer {
            guard case .accept(offset: 0)? = try await lab.offer(name: "held-\(index)", size: 4096) else {
                Issue.record("offer \(index) within the limit was not accepted")
                return
            }
        }
        guard case .decline(let reason)? = try await lab.offer(name: "one-too-many", size: 4096) else {
            Issue.record("an offer beyond the limit must be declined")
            return
        }
        #expect(reason.contains("at most \(FileReceiver.maxTransfersPerPeer) files from one peer at a time"), "\(reason)")
        var iterator = lab.received.makeAsyncIterator()
        var declined: TransferFailure?
        for _ in 0...FileReceiver.maxTransfersPerPeer {
            guard let transfer = await iterator.next() else { break }
            if transfer.name == "one-too-many" { declined = await transfer.failure() }
        }
        #expect(declined?.kind == .declined)
        #expect(declined?.message.contains("declined one-too-many from mallory") == true, "\(declined?.message ?? "")")
        #expect(try lab.files().count { $0.hasSuffix(ResumeBook.partSuffix) } == FileReceiver.maxTransfersPerPeer, "no partial file for the declined one")
        // Once the held transfers end, the peer may send again.
        lab.cutAll()
        let (path, sha) = try FileLab.makeFile(size: 4096, name: "later.bin")
        var sent = false
        for _ in 0..<50 where !sent {
            let sending = FileSender().send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: lab.open)
            sent = (try? await sending.result().get()) == .sent
            if !sent { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(sent)
        #expect(try FileLab.sha(of: lab.directory + "/later.bin") == sha)
    }

    @Test func lostLinkThatDoesNotComeBackFailsSayingHowToResume() async throws {
        let lab = try FileLab()
        let (path, _) = try FileLab.makeFile(size: 8 * 1024 * 1024)
        let opened = Locked(0)
        let open: @Sendable () async throws -> any ResourceChannel = {
            let count = opened.withLock { value -> Int in
                value += 1
                return value
            }
            guard count == 1 else { throw PeerLinkError(.notConnected, "bob is not connected") }
            return try await lab.open()
        }
        let sender = FileSender(resumeWindow: .milliseconds(500))
        let sending = sender.send(try await OutgoingFile.prepare(path: path), to: FileLab.bob, open: open)
        let ended = await sending.updates.drain { progress in
            if progress.bytesDone > 1024 * 1024 { lab.cut() }
        }
        #expect(ended?.kind == .linkLost)
        let failure = try #require(await sending.failure())
        #expect(failure.kind == .linkLost)
        #expect(failure.message.contains("Send the file again to resume"), "\(failure.message)")
    }
}
