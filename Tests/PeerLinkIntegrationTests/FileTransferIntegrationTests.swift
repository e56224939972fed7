import Crypto
import Foundation
import PeerLink
import Testing

/// A sender and a receiver, each a PeerNode on the LAN against the real avahi-daemon on a service
/// of their own, over loopback TCP. The receiver is advertised at a ``CuttableProxy`` in front of its
/// listener, and the sender's identity sorts first, so the sender dials it through the proxy.
final class FilePair: Sendable {
    let sender: PeerNode
    let receiver: PeerNode
    let proxy: CuttableProxy
    let advertiser: LANAdvertiser
    let directory: String
    let received: AsyncStream<FileTransfer>
    private let tasks: Locked<[Task<Void, Never>]>
    private let connected = ConnectedSet()

    /// `reconnectGrace` as in ``PeerLinkCore/SessionPolicy/reconnectGrace`` (zero: a lost
    /// link's peer leaves at once, and a transfer goes on only by resuming).
    init(reconnectGrace: Duration = SessionPolicy.default.reconnectGrace) throws {
        let service = try ServiceType(TestHost.uniqueServiceType("f"))
        var identities = [Identity.generate(), Identity.generate()]
        identities.sort { $0.fingerprint < $1.fingerprint }
        let policy = SessionPolicy(automatic: true, reconnectGrace: reconnectGrace)
        // The receiver never invites by itself (automatic mode's fallback, 10 s by default, let
        // it dial the sender directly when a loaded machine's discovery was slow; the cut then
        // missed the pair's only link): the sender's link through the proxy is the pair's link.
        var receiverPolicy = policy
        receiverPolicy.automaticFallback = .seconds(3600)
        let lan = TransportChoice.modules([LANTransportModule(listenHost: "127.0.0.1")])
        sender = try PeerNode(
            configuration: PeerNodeConfiguration(
                session: PeerSessionConfiguration(
                    identity: identities[0], displayName: try DisplayName("sender"), serviceType: service, policy: policy),
                transports: lan))
        receiver = try PeerNode(
            configuration: PeerNodeConfiguration(
                session: PeerSessionConfiguration(
                    identity: identities[1], displayName: try DisplayName("receiver"), serviceType: service, policy: receiverPolicy),
                transports: lan, advertising: false))
        guard let receiverPort = receiver.session.listeners.flatMap(\.localEndpoints).compactMap(\.tcp).first?.port else {
            throw HarnessError("the receiver has no TCP listener")
        }
        proxy = try CuttableProxy(to: receiverPort)
        advertiser = try LANAdvertiser(
            identity: identities[1], displayName: try DisplayName("receiver"), serviceType: service, port: proxy.port)
        directory = TestHost.temporaryDirectory("peerlink-files")
        let (received, sink) = AsyncStream.makeStream(of: FileTransfer.self)
        self.received = received
        let fileReceiver = FileReceiver(directory: directory)
        let receiverSession = receiver.session
        let connected = self.connected
        tasks = Locked([
            Task { [sender] in await sender.run() },
            Task { [receiver] in await receiver.run() },
            Task { [sender] in
                for await event in sender.events {
                    connected.record(event)
                    if case .session(.peerStateChanged(let peer, let state, _)) = event {
                        connected.update(peer, state == .connected)
                    }
                }
            },
            Task { [receiver] in for await _ in receiver.events {} },
            Task {
                for await stream in receiverSession.incomingStreams {
                    Task {
                        guard let incoming = try? await fileReceiver.offer(on: stream) else { return }
                        sink.yield(incoming.accept())
                    }
                }
            },
        ])
    }

    var receiverPeer: PeerID { receiver.session.localPeer }

    /// Waits until the sender has the receiver connected.
    func waitConnected(timeout: Duration = .seconds(30)) async throws {
        let deadline = ContinuousClock.now + timeout
        while !connected.contains(receiverPeer) {
            guard ContinuousClock.now < deadline else {
                throw HarnessError(
                    "the sender did not connect to the receiver within \(timeout); the sender's events:\n"
                        + connected.events.joined(separator: "\n"))
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    func close() async {
        advertiser.stop()
        await sender.session.disconnect()
        await receiver.session.disconnect()
        proxy.close()
        for task in tasks.withLock({ $0 }) { task.cancel() }
    }

    /// A file of `mebibytes` MiB: one random MiB, each copy stamped with its index.
    static func makeFile(mebibytes: Int, in directory: String = TestHost.temporaryDirectory("peerlink-files-src")) throws -> String {
        let path = directory + "/payload.bin"
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        // Read at once: a million `UInt8.random` calls are a million system calls, and in a debug
        // build they kept a cooperative thread busy for about a second per file.
        let random = try FileHandle(forReadingFrom: URL(fileURLWithPath: "/dev/urandom"))
        var block = [UInt8](try random.read(upToCount: 1 << 20) ?? Data())
        try random.close()
        guard block.count == 1 << 20 else { throw HarnessError("/dev/urandom gave \(block.count) bytes") }
        for index in 0..<mebibytes {
            block[0] = UInt8(index & 0xFF)
            block[1] = UInt8(index >> 8)
            try handle.write(contentsOf: block)
        }
        try handle.close()
        return path
    }
}

final class ConnectedSet: Sendable {
    private let peers = Locked<Set<PeerID>>([])
    private let log = Locked<[String]>([])

    /// Every event the sender's node reported (its session's, discovery's, the transports'), with
    /// its time: shown when a wait fails.
    func record(_ event: PeerNodeEvent) {
        log.withLock { $0.append("\(ContinuousClock.now) \(event)") }
    }

    var events: [String] { log.withLock { $0 } }

    func update(_ peer: PeerID, _ connected: Bool) {
        peers.withLock { peers in
            if connected { peers.insert(peer) } else { peers.remove(peer) }
        }
    }

    func contains(_ peer: PeerID) -> Bool { peers.withLock { $0.contains(peer) } }
}

extension TransferUpdates {
    func drain(_ body: (TransferProgress) -> Void = { _ in }) async -> TransferFailure? {
        do throws(TransferFailure) {
            for try await progress in self { body(progress) }
            return nil
        } catch {
            return error
        }
    }
}

@Suite(
    "Files over real sessions: loopback TCP, the real avahi-daemon", .serialized,
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct FileTransferIntegrationTests {
    @Test(
        "100 MiB with the link cut in the middle goes on over a new link (the session's continuity: no restart, no resume needed) and ends with the right SHA-256",
        .timeLimit(.minutes(8)))
    func transferOutlivesACut() async throws {
        try await withSharedAvahi {
            let pair = try FilePair()
            defer { Task { await pair.close() } }
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 100))
            try await pair.waitConnected()
            #expect(pair.proxy.accepted.withLock { $0 } >= 1, "the sender dialled through the proxy")

            let transfer = pair.sender.session.sendFile(file, to: pair.receiverPeer)
            var cutAt: UInt64?
            let ended = await transfer.updates.drain { progress in
                if cutAt == nil, progress.bytesDone >= 30 << 20 {
                    cutAt = progress.bytesDone
                    pair.proxy.cut()
                }
            }
            #expect(ended == nil, "\(ended?.message ?? "")")
            #expect(cutAt != nil)
            #expect(try await transfer.result().get() == .sent)
            // One offer, accepted at 0: the stream went on over the next link, nothing was sent
            // again from the start and no resume was needed.
            // (Both sides dial again: the new link may come through the proxy or around it.)
            #expect(transfer.acceptedOffsets == [0], "\(transfer.acceptedOffsets)")

            var saved: String?
            for await incoming in pair.received {
                if case .success(.received(let path)) = await incoming.result() {
                    saved = path
                    break
                }
            }
            let path = try #require(saved)
            #expect(path == pair.directory + "/payload.bin")
            let check = try await OutgoingFile.prepare(path: path)
            #expect(check.sha256 == file.sha256)
            #expect(check.size == 100 << 20)
            #expect(try FileManager.default.contentsOfDirectory(atPath: pair.directory) == ["payload.bin"], "no partial files remain")
        }
    }

    @Test("without the reconnect grace, 20 MiB with the link cut in the middle resumes (not restarts) once the pair is back, with the right SHA-256", .timeLimit(.minutes(4)))
    func resumeAfterTheCutPeerLeft() async throws {
        try await withSharedAvahi {
            let pair = try FilePair(reconnectGrace: .zero)
            defer { Task { await pair.close() } }
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 20))
            try await pair.waitConnected()
            #expect(pair.proxy.accepted.withLock { $0 } >= 1, "the sender dialled through the proxy")
            let transfer = pair.sender.session.sendFile(file, to: pair.receiverPeer)
            var cutAt: UInt64?
            let ended = await transfer.updates.drain { progress in
                if cutAt == nil, progress.bytesDone >= 6 << 20 {
                    cutAt = progress.bytesDone
                    pair.proxy.cut()
                }
            }
            #expect(ended == nil, "\(ended?.message ?? "")")
            #expect(try await transfer.result().get() == .sent)
            let offsets = transfer.acceptedOffsets
            #expect(offsets.count >= 2 && offsets.first == 0 && (offsets.last ?? 0) > 0, "resumed, not restarted: \(offsets)")
            var saved: String?
            for await incoming in pair.received {
                if case .success(.received(let path)) = await incoming.result() {
                    saved = path
                    break
                }
            }
            let check = try await OutgoingFile.prepare(path: try #require(saved))
            #expect(check.sha256 == file.sha256)
        }
    }

    @Test("a byte corrupted on the way: both sides report a checksum mismatch, the partial file is removed", .timeLimit(.minutes(3)))
    func checksumMismatch() async throws {
        try await withSharedAvahi {
            let pair = try FilePair()
            defer { Task { await pair.close() } }
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 4))
            try await pair.waitConnected()
            var corrupting = FileSender()
            corrupting.corruptOffset = 3_000_000
            let transfer = pair.sender.session.sendFile(file, to: pair.receiverPeer, using: corrupting)
            guard case .failure(let failure) = await transfer.result() else { Issue.record("a corrupted file was verified"); return }
            #expect(failure.kind == .checksumMismatch)
            var iterator = pair.received.makeAsyncIterator()
            let incoming = try #require(await iterator.next())
            guard case .failure(let theirs) = await incoming.result() else { Issue.record("the receiver kept a corrupted file"); return }
            #expect(theirs.kind == .checksumMismatch)
            #expect(try FileManager.default.contentsOfDirectory(atPath: pair.directory).isEmpty, "neither the file nor its partial remain")
        }
    }

    @Test("cancel by the sender ends the receiver's transfer with the sender's reason", .timeLimit(.minutes(3)))
    func senderCancels() async throws {
        try await withSharedAvahi {
            let pair = try FilePair()
            defer { Task { await pair.close() } }
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 8))
            try await pair.waitConnected()
            let transfer = pair.sender.session.sendFile(file, to: pair.receiverPeer)
            let ended = await transfer.updates.drain { progress in
                if progress.bytesDone >= 2 << 20 { transfer.cancel(reason: "wrong file") }
            }
            #expect(ended?.kind == .cancelled)
            var iterator = pair.received.makeAsyncIterator()
            let incoming = try #require(await iterator.next())
            guard case .failure(let failure) = await incoming.result() else { Issue.record("the receiver finished a cancelled transfer"); return }
            #expect(failure.kind == .cancelledByPeer)
            #expect(failure.message == "cancelled by the peer: wrong file", "\(failure.message)")
            #expect(transfer.acceptedOffsets == [0], "a cancel is not resumed")
        }
    }

    @Test("cancel by the receiver ends the sender's transfer with the receiver's reason", .timeLimit(.minutes(3)))
    func receiverCancels() async throws {
        try await withSharedAvahi {
            let pair = try FilePair()
            defer { Task { await pair.close() } }
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 8))
            try await pair.waitConnected()
            let transfer = pair.sender.session.sendFile(file, to: pair.receiverPeer)
            var iterator = pair.received.makeAsyncIterator()
            let incoming = try #require(await iterator.next())
            let ended = await incoming.updates.drain { progress in
                if progress.bytesDone >= 2 << 20 { incoming.cancel(reason: "not this one") }
            }
            #expect(ended?.kind == .cancelled)
            guard case .failure(let failure) = await transfer.result() else { Issue.record("the sender finished a cancelled transfer"); return }
            #expect(failure.kind == .cancelledByPeer)
            #expect(failure.message == "cancelled by the peer: not this one", "\(failure.message)")
        }
    }
}

@Suite(
    "peerlink send | receive", .serialized,
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct SendReceiveCLITests {
    @Test("send → receive --accept-all: both exit 0 and the files arrive verified", .timeLimit(.minutes(3)))
    func sendToReceive() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("s")
            let source = TestHost.temporaryDirectory("peerlink-send")
            let destination = TestHost.temporaryDirectory("peerlink-receive")
            let big = try FilePair.makeFile(mebibytes: 3, in: source)
            let small = source + "/note.txt"
            try Data("hello\n".utf8).write(to: URL(fileURLWithPath: small))
            try Data("already here\n".utf8).write(to: URL(fileURLWithPath: destination + "/note.txt"))
            let receiver = try ChildProcess.peerlink(["receive", "--name", "Rita", "--service", service, "--dir", destination, "--accept-all", "--count", "2"])
            let sender = try ChildProcess.peerlink(["send", big, small, "--to", "Rita", "--name", "Sam", "--service", service, "--timeout", "30"])
            #expect(try await sender.waitForExit(timeout: .seconds(90)) == 0, "stdout:\n\(sender.stdout)\nstderr:\n\(sender.stderr)")
            #expect(try await receiver.waitForExit(timeout: .seconds(30)) == 0, "stdout:\n\(receiver.stdout)\nstderr:\n\(receiver.stderr)")
            #expect(sender.stdoutLines.contains { $0.hasPrefix("payload.bin: verified by Rita") })
            #expect(sender.stdoutLines.contains { $0.hasPrefix("note.txt: verified by Rita") })
            #expect(sender.stdoutLines.contains { $0.hasPrefix("payload.bin: ") && $0.contains("%") }, "plain progress lines when not a terminal")
            #expect(receiver.stdoutLines.contains("saved \(destination)/note (1).txt (6 bytes from Sam, SHA-256 verified)"), "\(receiver.stdout)")
            #expect(try String(contentsOfFile: destination + "/note.txt", encoding: .utf8) == "already here\n", "never overwritten")
            let sent = try await OutgoingFile.prepare(path: big)
            #expect(try await OutgoingFile.prepare(path: destination + "/payload.bin").sha256 == sent.sha256)
        }
    }

    @Test("receive without --accept-all and not on a terminal declines; send exits 1 saying so", .timeLimit(.minutes(2)))
    func declinedWhenNotATerminal() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("s")
            let destination = TestHost.temporaryDirectory("peerlink-receive")
            let file = try FilePair.makeFile(mebibytes: 1)
            let receiver = try ChildProcess.peerlink(["receive", "--name", "Rita", "--service", service, "--dir", destination])
            defer { receiver.terminate() }
            let sender = try ChildProcess.peerlink(["send", file, "--to", "Rita", "--name", "Sam", "--service", service])
            #expect(try await sender.waitForExit(timeout: .seconds(60)) == 1)
            #expect(sender.stderr.contains("Rita declined payload.bin: the receiver is not on a terminal and was started without --accept-all"), "\(sender.stderr)")
            _ = try await receiver.waitForStderrLine(containing: "pass --accept-all")
            #expect(try FileManager.default.contentsOfDirectory(atPath: destination).isEmpty)
        }
    }

    @Test("send to a peer that never appears gives up after --timeout with a hint", .timeLimit(.minutes(1)))
    func peerNeverAppears() async throws {
        try await withSharedAvahi {
            let file = try FilePair.makeFile(mebibytes: 1)
            let sender = try ChildProcess.peerlink(["send", file, "--to", "Nobody", "--name", "Sam", "--service", TestHost.uniqueServiceType("s"), "--timeout", "2"])
            #expect(try await sender.waitForExit(timeout: .seconds(30)) == 1)
            #expect(sender.stderr.contains("Nobody did not appear within 2 s"), "\(sender.stderr)")
        }
    }

    @Test("send of a missing file fails before anything else, exit 64")
    func missingFile() async throws {
        let sender = try ChildProcess.peerlink(["send", "/nonexistent/x.bin", "--to", "Rita", "--name", "Sam"])
        #expect(try await sender.waitForExit(timeout: .seconds(30)) == 64)
        #expect(sender.stderr.contains("/nonexistent/x.bin does not exist: check the path"))
    }

    @Test("chat /send: the other chat saves the file and says where; chat goes on", .timeLimit(.minutes(2)))
    func chatSend() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("c")
            let destination = TestHost.temporaryDirectory("peerlink-chat-files")
            let file = try FilePair.makeFile(mebibytes: 2)
            let ann = try ChildProcess.peerlink(["chat", "--name", "Ann", "--service", service], withInput: true)
            let bob = try ChildProcess.peerlink(["chat", "--name", "Bob", "--service", service, "--dir", destination], withInput: true)
            try await ann.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
            try await bob.waitForLine(containing: "* Ann joined", timeout: .seconds(30))
            ann.type("/send \(file)\n")
            ann.type("while sending\n")
            try await bob.waitForLine(containing: "Ann: while sending", timeout: .seconds(30))
            let saved = try await bob.waitForLine(containing: "* saved ", timeout: .seconds(60))
            #expect(saved == "* saved \(destination)/payload.bin (from Ann, 2097152 bytes, SHA-256 verified)")
            try await ann.waitForLine(containing: "* payload.bin verified by Bob", timeout: .seconds(30))
            #expect(try await OutgoingFile.prepare(path: destination + "/payload.bin").sha256 == OutgoingFile.prepare(path: file).sha256)
            ann.type("after\n")
            try await bob.waitForLine(containing: "Ann: after")
            for chat in [ann, bob] {
                chat.closeInput()
                #expect(try await chat.waitForExit() == 0)
            }
        }
    }
}
