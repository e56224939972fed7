import Foundation
import PeerLink
import Testing

/// A tmpfs mounted on a fresh directory for one test (needs root: CAP_SYS_ADMIN).
final class SmallFileSystem {
    let path: String

    /// Mounts a tmpfs of `size` bytes (`readOnly`: mounted read-only).
    init(size: Int, readOnly: Bool = false) throws {
        path = TestHost.temporaryDirectory("peerlink-tmpfs")
        let flags = readOnly ? UInt(MS_RDONLY) : 0
        guard mount("tmpfs", path, "tmpfs", flags, "size=\(size),mode=0755") == 0 else {
            throw HarnessError("mount -t tmpfs -o size=\(size) on \(path) failed: \(String(cString: strerror(errno)))")
        }
    }

    /// Gives the file system a new size (mount -o remount,size=...).
    func resize(to size: Int) throws {
        guard mount("tmpfs", path, "tmpfs", UInt(MS_REMOUNT), "size=\(size)") == 0 else {
            throw HarnessError("remounting \(path) with size=\(size) failed: \(String(cString: strerror(errno)))")
        }
    }

    var files: [String] { (try? FileManager.default.contentsOfDirectory(atPath: path).sorted()) ?? [] }

    deinit {
        // Detach: a file still open there cannot keep the mount alive.
        _ = umount2(path, Int32(MNT_DETACH))
        rmdir(path)
    }
}

@Suite("File-system errors at the receiver over real sessions: disk full, read-only", .serialized)
struct FileSystemErrorTests {
    /// Sends the file at `path` from the pair's sender; returns both sides' transfers.
    static func send(_ file: OutgoingFile, in pair: DirectPair) async throws -> (sending: FileTransfer, receiving: FileTransfer) {
        let sending = pair.sender.sendFile(file, to: pair.receiver.localPeer)
        var iterator = pair.received.makeAsyncIterator()
        return (sending, try #require(await iterator.next()))
    }

    /// The link goes on: a message each way, and no stream left open on either side.
    static func expectLinkUsable(_ pair: DirectPair, tag: String) async throws {
        try await pair.sender.send(Array("ping \(tag)".utf8), to: [pair.receiver.localPeer])
        try await pair.atSender.wait(for: 1, prefixed: "pong \(tag)")
        #expect(pair.atSender.isConnected(pair.receiver.localPeer) && pair.atReceiver.isConnected(pair.sender.localPeer))
        let deadline = ContinuousClock.now + .seconds(30)
        var open: (Int?, Int?) = (nil, nil)
        while ContinuousClock.now < deadline {
            open = (
                await pair.sender.info(for: pair.receiver.localPeer)?.openStreams,
                await pair.receiver.info(for: pair.sender.localPeer)?.openStreams
            )
            if open == (0, 0) { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(open == (0, 0), "streams still open at the sender and the receiver: \(open)")
    }

    // Root may write anywhere a file mode forbids, but not past a file system's size.
    @Test("no room: the offer is declined saying so on both sides, nothing is written, the link goes on, and the file goes once there is room",
          .enabled(if: TestHost.isRoot, "mounting a small tmpfs needs root (CI runs as root)"), .timeLimit(.minutes(2)))
    func noRoom() async throws {
        let disk = try SmallFileSystem(size: 512 << 10)
        let source = TestHost.temporaryDirectory("peerlink-full-source")
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 2, in: source))
        let pair = try DirectPair(directory: disk.path)
        do {
            try await pair.waitConnected()
            let (sending, receiving) = try await Self.send(file, in: pair)
            guard case .failure(let theirs) = await receiving.result(within: .seconds(60)) else {
                Issue.record("a 2 MiB file was saved on a 512 KiB file system")
                return await pair.close()
            }
            #expect(theirs.kind == .fileSystem)
            #expect(theirs.message.hasPrefix("no room in \(disk.path) for payload.bin from sender: 2.0 MiB to come, "), "\(theirs.message)")
            guard case .failure(let mine) = await sending.result(within: .seconds(60)) else {
                Issue.record("the sender reported success")
                return await pair.close()
            }
            #expect(mine.kind == .declined)
            // the sender learns what happened without the receiver's paths
            #expect(mine.message.hasPrefix("receiver declined payload.bin: the receiver has no room for it: 2.0 MiB to come, "), "\(mine.message)")
            #expect(!mine.message.contains(disk.path))
            #expect(sending.acceptedOffsets == [], "declined before a byte was written")
            #expect(disk.files.isEmpty, "\(disk.files)")
            try await Self.expectLinkUsable(pair, tag: "after no room")

            // Room made: the same file goes.
            try disk.resize(to: 4 << 20)
            let (again, saved) = try await Self.send(file, in: pair)
            #expect(try await again.result(within: .seconds(60)).get() == .sent)
            #expect(try await saved.result(within: .seconds(60)).get() == .received(path: disk.path + "/payload.bin"))
            #expect(disk.files == ["payload.bin"], "the partial and its record are gone")
            #expect(try await OutgoingFile.prepare(path: disk.path + "/payload.bin").sha256 == file.sha256)
        } catch {
            await pair.close()
            throw error
        }
        await pair.close()
    }

    @Test("a read-only destination: the offer is declined saying so, nothing is written, the link goes on",
          .enabled(if: TestHost.isRoot, "mounting a read-only tmpfs needs root (CI runs as root)"), .timeLimit(.minutes(2)))
    func readOnly() async throws {
        let disk = try SmallFileSystem(size: 1 << 20, readOnly: true)
        let source = TestHost.temporaryDirectory("peerlink-ro-source")
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 1, in: source))
        let pair = try DirectPair(directory: disk.path)
        do {
            try await pair.waitConnected()
            let (sending, receiving) = try await Self.send(file, in: pair)
            let readOnly = "cannot write to \(disk.path): the file system is read-only (receive into another directory)"
            guard case .failure(let theirs) = await receiving.result(within: .seconds(60)), case .failure(let mine) = await sending.result(within: .seconds(60)) else {
                Issue.record("a file was saved on a read-only file system")
                return await pair.close()
            }
            #expect(theirs.kind == .fileSystem)
            #expect(theirs.message == readOnly)
            #expect(mine.kind == .declined)
            #expect(
                mine.message
                    == "receiver declined payload.bin: the receiver's download directory is on a read-only file system: send the file again once it receives into another one")
            #expect(disk.files.isEmpty)
            try await Self.expectLinkUsable(pair, tag: "after read-only")
        } catch {
            await pair.close()
            throw error
        }
        await pair.close()
    }
}
