import Crypto
import Foundation
import PeerLink
import Testing

/// Resources and streams through the MultipeerConnectivity-shaped API, between two sessions in
/// one process, over real links found through the real avahi-daemon. Files are sent one test
/// at a time (two cores; cancels need transfers still running).
@Suite("MultipeerConnectivity-shaped API: resources and streams", .serialized)
struct MultipeerDataTests {
    /// Two sessions, Ann advertising and Bob browsing, connected; stopped by `close()`.
    struct Pair {
        let ann: MultipeerPeerID
        let bob: MultipeerPeerID
        let annSession: MultipeerSession
        let bobSession: MultipeerSession
        let annLog: DataRecorder
        let bobLog: DataRecorder
        let advertiser: NearbyServiceAdvertiser
        let browser: NearbyServiceBrowser
        let invitations: AdvertiserRecorder

        static func connect() async throws -> Pair {
            let service = TestHost.uniqueServiceType("md")
            let ann = try MultipeerAPITests.freshPeer("Ann")
            let bob = try MultipeerAPITests.freshPeer("Bob")
            let annSession = MultipeerSession(peer: ann)
            let annLog = DataRecorder()
            annSession.delegate = annLog
            let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: nil, serviceType: service)
            let invitations = AdvertiserRecorder { _ in (true, annSession) }
            advertiser.delegate = invitations
            advertiser.startAdvertisingPeer()

            let bobSession = MultipeerSession(peer: bob)
            let bobLog = DataRecorder()
            bobSession.delegate = bobLog
            let browser = NearbyServiceBrowser(peer: bob, serviceType: service)
            let sightings = BrowserRecorder()
            browser.delegate = sightings
            browser.startBrowsingForPeers()
            try await sightings.wait("Bob's browser finds Ann") { $0.contains { $0.isFound(ann) } }
            browser.invitePeer(ann, to: bobSession, withContext: nil, timeout: 30)
            try await annLog.wait("Ann sees Bob connected") { $0.connected.contains(bob) }
            try await bobLog.wait("Bob sees Ann connected") { $0.connected.contains(ann) }
            return Pair(
                ann: ann, bob: bob, annSession: annSession, bobSession: bobSession, annLog: annLog, bobLog: bobLog,
                advertiser: advertiser, browser: browser, invitations: invitations)
        }

        func close() {
            browser.stopBrowsingForPeers()
            advertiser.stopAdvertisingPeer()
            annSession.disconnect()
            bobSession.disconnect()
        }
    }

    static func sha256(_ bytes: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: bytes)) }

    @Test(
        "a resource A→B arrives with its name and bytes; progress reaches 100 % on both sides; completion nil; the file goes after the callback",
        MultipeerAPITests.avahiGate, .timeLimit(.minutes(2)))
    func resourceArrives() async throws {
        try await withSharedAvahi {
            let pair = try await Pair.connect()
            defer { pair.close() }
            let path = try FilePair.makeFile(mebibytes: 3)
            let sent = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
            let done = Completion()
            let progress = try #require(
                try pair.annSession.sendResource(
                    at: URL(fileURLWithPath: path), withName: "holiday photos.bin", toPeer: pair.bob,
                    withCompletionHandler: done.handler))
            #expect(progress.totalUnitCount == Int64(sent.count))

            try await done.wait("Ann's completion handler")
            #expect(done.calls == 1)
            #expect(done.errors.first.map { $0 == nil } == true, "completion: nil; got \(String(describing: done.errors))")
            #expect(progress.completedUnitCount == Int64(sent.count))
            #expect(progress.fractionCompleted == 1)

            try await pair.bobLog.wait("Bob's delegate hears the file arrived") { !$0.finished.isEmpty }
            let started = try #require(pair.bobLog.events.started.first)
            #expect(started.name == "holiday photos.bin")
            #expect(started.peer == pair.ann)
            #expect(started.progress.totalUnitCount == Int64(sent.count))
            #expect(started.progress.completedUnitCount == Int64(sent.count), "the receiver's progress reaches 100 %")
            let finished = try #require(pair.bobLog.events.finished.first)
            #expect(finished.name == "holiday photos.bin")
            #expect(finished.peer == pair.ann)
            #expect(finished.error == nil)
            let url = try #require(finished.url)
            #expect(finished.bytes.map(Self.sha256) == Self.sha256(sent), "the file at localURL holds the bytes sent")
            // Read on the delegate queue after the callback returned: the file is gone, as in MPC.
            let left = pair.bobSession.delegateQueue.sync { FileManager.default.fileExists(atPath: url.path) }
            #expect(!left, "the received file is removed once the callback returns")
            #expect(pair.annLog.events.started.isEmpty && pair.annLog.events.finished.isEmpty)
        }
    }

    @Test(
        "cancelling a resource's Progress, on the sending side and then on the receiving side, ends both sides with an error",
        MultipeerAPITests.avahiGate, .timeLimit(.minutes(2)))
    func resourceCancelled() async throws {
        try await withSharedAvahi {
            let pair = try await Pair.connect()
            defer { pair.close() }
            let path = try FilePair.makeFile(mebibytes: 32)

            // The sender cancels as soon as the receiver started: Bob's delegate cancels Ann's
            // progress from its didStart call, while 32 MiB are still on their way.
            let senderSide = Completion()
            let outgoing = Locked<Progress?>(nil)
            pair.bobLog.onStart { _ in outgoing.withLock { $0 }?.cancel() }
            let first = try #require(
                try pair.annSession.sendResource(
                    at: URL(fileURLWithPath: path), withName: "first.bin", toPeer: pair.bob, withCompletionHandler: senderSide.handler))
            outgoing.withLock { $0 = first }
            try await senderSide.wait("Ann's completion after her cancel")
            let senderError = try #require(senderSide.errors.first as? PeerLinkError)
            #expect(senderError.code == .cancelled)
            try await pair.bobLog.wait("Bob's delegate hears the first file failed") { $0.finished.count == 1 }
            let firstEnd = try #require(pair.bobLog.events.finished.first)
            #expect(firstEnd.name == "first.bin" && firstEnd.url == nil)
            let firstError = try #require(firstEnd.error as? PeerLinkError)
            #expect(firstError.code == .cancelled && firstError.message.contains("cancelled by the peer"), "\(firstError)")
            #expect(first.completedUnitCount < first.totalUnitCount)

            // The receiver cancels from its didStart call.
            let receiverSide = Completion()
            pair.bobLog.onStart { progress in progress.cancel() }
            try pair.annSession.sendResource(
                at: URL(fileURLWithPath: path), withName: "second.bin", toPeer: pair.bob, withCompletionHandler: receiverSide.handler)
            try await receiverSide.wait("Ann's completion after Bob's cancel")
            let receiverCancel = try #require(receiverSide.errors.first as? PeerLinkError)
            #expect(receiverCancel.code == .cancelled && receiverCancel.message.contains("cancelled by the peer"), "\(receiverCancel)")
            try await pair.bobLog.wait("Bob's delegate hears the second file failed") { $0.finished.count == 2 }
            let secondEnd = try #require(pair.bobLog.events.finished.last)
            #expect(secondEnd.name == "second.bin" && secondEnd.url == nil)
            #expect((secondEnd.error as? PeerLinkError)?.code == .cancelled)
            #expect(senderSide.calls == 1 && receiverSide.calls == 1, "each completion handler is called once")
            #expect(pair.annSession.connectedPeers == [pair.bob], "cancelling a transfer leaves the session as it was")
        }
    }

    @Test(
        "a stream A→B carries 1 MiB through OutputStream and InputStream: SHA-256 matches, and the reader sees the end (read returns 0)",
        MultipeerAPITests.avahiGate, .timeLimit(.minutes(2)))
    func streamCarriesBytes() async throws {
        try await withSharedAvahi {
            let pair = try await Pair.connect()
            defer { pair.close() }
            var generator = SystemRandomNumberGenerator()
            let sent = (0..<(1 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }

            nonisolated(unsafe) let output = try pair.annSession.startStream(withName: "camera feed", toPeer: pair.bob)
            #expect(output.streamStatus == .notOpen)
            output.open()
            // Writes block (1 MiB is more than the buffers hold until Bob reads): on a thread of
            // their own, never on the test's task, while Bob reads on another.
            async let writing = onThread { () -> Int in
                var offset = 0
                var pieces = 0
                while offset < sent.count {
                    let length = min(sent.count - offset, Int.random(in: 1...100_000))
                    let written = sent.withUnsafeBufferPointer { output.write($0.baseAddress! + offset, maxLength: length) }
                    guard written > 0 else { throw HarnessError("write returned \(written): \(String(describing: output.streamError))") }
                    offset += written
                    pieces += 1
                }
                output.close()
                return pieces
            }

            try await pair.bobLog.wait("Bob's delegate gets the stream") { !$0.streams.isEmpty }
            let arrived = try #require(pair.bobLog.events.streams.first)
            #expect(arrived.name == "camera feed" && arrived.peer == pair.ann)
            nonisolated(unsafe) let input = arrived.stream
            input.open()
            let (received, reads) = try await onThread { () -> ([UInt8], Int) in
                var received: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 50_000)
                var reads = 0
                while true {
                    let count = buffer.withUnsafeMutableBufferPointer { input.read($0.baseAddress!, maxLength: $0.count) }
                    guard count >= 0 else { throw HarnessError("read returned -1: \(String(describing: input.streamError))") }
                    if count == 0 { break }
                    received.append(contentsOf: buffer[0..<count])
                    reads += 1
                }
                return (received, reads)
            }
            #expect(try await writing > 10)
            #expect(received.count == sent.count)
            #expect(Self.sha256(received) == Self.sha256(sent))
            #expect(reads >= sent.count / 50_000)
            #expect(input.streamStatus == .atEnd, "the writer's close is the reader's end")
            #expect(input.streamError == nil)
            input.close()
            #expect(output.streamError == nil)
        }
    }

    @Test(
        "a stream nobody takes is reset (the default delegate method); a reader that closes early resets the writer",
        MultipeerAPITests.avahiGate, .timeLimit(.minutes(2)))
    func streamRefusedAndClosedEarly() async throws {
        try await withSharedAvahi {
            let pair = try await Pair.connect()
            defer { pair.close() }
            let chunk = [UInt8](repeating: 7, count: 64 * 1024)

            // Ann's delegate does not implement the stream method: the default resets the
            // stream, and Bob's writes fail once the reset arrives.
            let plain = PlainDelegate()
            pair.annSession.delegate = plain
            nonisolated(unsafe) let toAnn = try pair.bobSession.startStream(withName: "unwanted", toPeer: pair.ann)
            toAnn.open()
            let refused = try await onThread { () -> PeerLinkError? in
                for _ in 0..<2_000 {
                    let written = chunk.withUnsafeBufferPointer { toAnn.write($0.baseAddress!, maxLength: $0.count) }
                    if written < 0 { return toAnn.streamError as? PeerLinkError }
                }
                return nil
            }
            let error = try #require(refused, "writing 128 MiB to a stream that was reset never failed")
            #expect(error.code == .cancelled && error.message.contains("does not take streams"), "\(error)")
            #expect(toAnn.streamStatus == .error)

            // Bob takes the stream, reads a little, closes: Ann's writes fail.
            nonisolated(unsafe) let toBob = try pair.annSession.startStream(withName: "too much", toPeer: pair.bob)
            toBob.open()
            #expect(chunk.withUnsafeBufferPointer { toBob.write($0.baseAddress!, maxLength: $0.count) } == chunk.count)
            try await pair.bobLog.wait("Bob's delegate gets the stream") { !$0.streams.isEmpty }
            nonisolated(unsafe) let input = try #require(pair.bobLog.events.streams.first?.stream)
            input.open()
            let firstRead = try await onThread { () -> Int in
                var buffer = [UInt8](repeating: 0, count: 1024)
                return buffer.withUnsafeMutableBufferPointer { input.read($0.baseAddress!, maxLength: $0.count) }
            }
            #expect(firstRead > 0)
            input.close()
            #expect(input.streamStatus == .closed)
            let closed = try await onThread { () -> PeerLinkError? in
                for _ in 0..<2_000 {
                    let written = chunk.withUnsafeBufferPointer { toBob.write($0.baseAddress!, maxLength: $0.count) }
                    if written < 0 { return toBob.streamError as? PeerLinkError }
                }
                return nil
            }
            let closedError = try #require(closed, "writing 128 MiB to a stream its reader closed never failed")
            #expect(closedError.code == .cancelled && closedError.message.contains("the reader closed the stream"), "\(closedError)")
            _ = plain
        }
    }

    @Test("resources and streams check their input at once")
    func checkedAtOnce() throws {
        let me = try MultipeerPeerID(displayName: "Me")
        let other = MultipeerPeerID(try MultipeerPeerID(displayName: "Other").peerID)
        let session = MultipeerSession(peer: me)
        defer { session.disconnect() }
        let file = try FilePair.makeFile(mebibytes: 1)
        let notConnected = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: URL(fileURLWithPath: file), withName: "payload", toPeer: other)
        }
        #expect(notConnected?.code == .notConnected)
        let missing = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: URL(fileURLWithPath: file + ".missing"), withName: "payload", toPeer: other)
        }
        #expect(missing?.code == .invalidParameter && missing?.message.contains("check the path") == true)
        let directory = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: URL(fileURLWithPath: NSTemporaryDirectory()), withName: "payload", toPeer: other)
        }
        #expect(directory?.message.contains("is a directory") == true)
        let remote = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: try #require(URL(string: "https://example.com/a")), withName: "a", toPeer: other)
        }
        #expect(remote?.code == .invalidParameter)
        let unnamed = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: URL(fileURLWithPath: file), withName: "", toPeer: other)
        }
        #expect(unnamed?.code == .invalidParameter)
        let toMyself = #expect(throws: PeerLinkError.self) {
            try session.sendResource(at: URL(fileURLWithPath: file), withName: "payload", toPeer: me)
        }
        #expect(toMyself?.code == .invalidParameter)

        let streamNotConnected = #expect(throws: PeerLinkError.self) { try session.startStream(withName: "audio", toPeer: other) }
        #expect(streamNotConnected?.code == .notConnected)
        let reserved = #expect(throws: PeerLinkError.self) {
            try session.startStream(withName: ResourceProtocol.streamName, toPeer: other)
        }
        #expect(reserved?.code == .invalidParameter)
        let tooLong = #expect(throws: PeerLinkError.self) {
            try session.startStream(withName: String(repeating: "s", count: 256), toPeer: other)
        }
        #expect(tooLong?.code == .invalidParameter)
        let empty = #expect(throws: PeerLinkError.self) { try session.startStream(withName: "", toPeer: other) }
        #expect(empty?.code == .invalidParameter)
    }
}

// MARK: - Helpers

/// Runs `body` on a new thread (blocking stream calls must stay off the cooperative pool) and
/// returns what it returns.
func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do {
                continuation.resume(returning: try body())
            } catch {
                continuation.resume(throwing: error)
            }
        }
        thread.start()
    }
}

/// A completion handler that records its calls.
final class Completion: Sendable {
    private let log = Locked<[(any Error)?]>([])

    var handler: @Sendable ((any Error)?) -> Void {
        { error in self.log.withLock { $0.append(error) } }
    }

    var calls: Int { log.withLock { $0.count } }
    var errors: [(any Error)?] { log.withLock { $0 } }

    func wait(_ what: String, timeout: Duration = .seconds(60)) async throws {
        let deadline = ContinuousClock.now + timeout
        while calls == 0 {
            guard ContinuousClock.now < deadline else { throw HarnessError("\(what): not called within \(timeout)") }
            try await Task.sleep(for: .milliseconds(50))
        }
    }
}

/// A session delegate that records states, resources and streams. It keeps the files that
/// arrive (reading them in the callback, as an app moves them out) and the streams.
final class DataRecorder: MultipeerSessionDelegate {
    struct Started: @unchecked Sendable {
        var name: String
        var peer: MultipeerPeerID
        var progress: Progress
    }

    struct Finished: @unchecked Sendable {
        var name: String
        var peer: MultipeerPeerID
        var url: URL?
        var bytes: [UInt8]?
        var error: (any Error)?
    }

    struct Arrived: @unchecked Sendable {
        var name: String
        var peer: MultipeerPeerID
        var stream: InputStream
    }

    struct Events: @unchecked Sendable {
        var connected: [MultipeerPeerID] = []
        var started: [Started] = []
        var finished: [Finished] = []
        var streams: [Arrived] = []
    }

    private struct Log: @unchecked Sendable {
        var events = Events()
        var onStart: (@Sendable (Progress) -> Void)?
    }

    private let log = Locked(Log())

    var events: Events { log.withLock { $0.events } }

    /// Runs `body` with the progress of each resource that starts arriving, in the delegate call.
    func onStart(_ body: @escaping @Sendable (Progress) -> Void) { log.withLock { $0.onStart = body } }

    func session(_ session: MultipeerSession, peer peerID: MultipeerPeerID, didChange state: PeerState) {
        log.withLock { log in
            if state == .connected { log.events.connected.append(peerID) }
            if state == .notConnected { log.events.connected.removeAll { $0 == peerID } }
        }
    }

    func session(_ session: MultipeerSession, didReceive data: Data, fromPeer peerID: MultipeerPeerID) {}

    func session(
        _ session: MultipeerSession, didStartReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        with progress: Progress
    ) {
        let hook = log.withLock { log in
            log.events.started.append(Started(name: resourceName, peer: peerID, progress: progress))
            return log.onStart
        }
        hook?(progress)
    }

    func session(
        _ session: MultipeerSession, didFinishReceivingResourceWithName resourceName: String, fromPeer peerID: MultipeerPeerID,
        at localURL: URL?, withError error: (any Error)?
    ) {
        let bytes = localURL.flatMap { try? [UInt8](Data(contentsOf: $0)) }
        log.withLock { $0.events.finished.append(Finished(name: resourceName, peer: peerID, url: localURL, bytes: bytes, error: error)) }
    }

    func session(_ session: MultipeerSession, didReceive stream: InputStream, withName streamName: String, fromPeer peerID: MultipeerPeerID) {
        log.withLock { $0.events.streams.append(Arrived(name: streamName, peer: peerID, stream: stream)) }
    }

    func wait(_ what: String, timeout: Duration = .seconds(60), until condition: (Events) -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while !condition(events) {
            guard ContinuousClock.now < deadline else { throw HarnessError("\(what): not within \(timeout)") }
            try await Task.sleep(for: .milliseconds(50))
        }
    }
}

/// A delegate with none of the data methods: files are dropped, streams reset (the defaults).
final class PlainDelegate: MultipeerSessionDelegate {
    func session(_ session: MultipeerSession, peer peerID: MultipeerPeerID, didChange state: PeerState) {}
    func session(_ session: MultipeerSession, didReceive data: Data, fromPeer peerID: MultipeerPeerID) {}
}
