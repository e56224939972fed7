import Foundation
import PeerLink
import Testing

/// Samples this process's resident set size until stopped.
final class MemoryWatch: Sendable {
    private let samples = Shared<[Int]>([])
    private let task = Shared<Task<Void, Never>?>(nil)

    func start(every interval: Duration = .milliseconds(100)) {
        let samples = self.samples
        let sampling = Task {
            while !Task.isCancelled {
                if let bytes = residentBytes() { samples.update { $0.append(bytes) } }
                try? await Task.sleep(for: interval)
            }
        }
        task.update { $0 = sampling }
    }

    func stop() {
        task.value?.cancel()
        if let bytes = residentBytes() { samples.update { $0.append(bytes) } }
    }

    var peak: Int { samples.value.max() ?? 0 }
    var count: Int { samples.value.count }
}

@Suite("Large files over real sessions: loopback TCP, encrypted, no discovery daemon", .serialized)
struct LargeFileTests {
    static let mebibytes = 1024
    /// Growth of the resident set a transfer may cause. A transfer that held the file (or a
    /// good part of it) in memory on either side would pass it by far; flow control keeps the
    /// real figure to a few MiB (at most 256 KiB of stream data queued per link).
    static let memoryBound = 256 << 20

    @Test("a 1 GiB file arrives verified while chat flows both ways, every message in order; memory stays flat",
          .timeLimit(.minutes(10)))
    func gibibyteWhileChatting() async throws {
        let source = TestHost.temporaryDirectory("peerlink-gib-source")
        let destination = TestHost.temporaryDirectory("peerlink-gib-received")
        defer {
            try? FileManager.default.removeItem(atPath: source)
            try? FileManager.default.removeItem(atPath: destination)
        }
        let clock = ContinuousClock()
        let began = clock.now
        let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: Self.mebibytes, in: source))
        #expect(file.size == UInt64(Self.mebibytes) << 20)
        let prepared = clock.now

        let pair = try DirectPair(directory: destination)
        do {
            try await pair.waitConnected()
            try await run(pair, file: file, destination: destination)
        } catch {
            await pair.close()
            throw error
        }
        await pair.close()
        print("1 GiB test: file made and hashed in \(prepared - began), all done in \(clock.now - began)")
    }

    @Test(
        "a 1 GiB file whose link changes transport twice on the way (in-memory → TCP by upgrade, TCP → in-memory by failover) arrives verified, never started again",
        .timeLimit(.minutes(10)))
    func gibibyteAcrossTwoTransportChanges() async throws {
        let source = TestHost.temporaryDirectory("peerlink-gib-moving-source")
        let destination = TestHost.temporaryDirectory("peerlink-gib-moving-received")
        defer {
            try? FileManager.default.removeItem(atPath: source)
            try? FileManager.default.removeItem(atPath: destination)
        }
        let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: Self.mebibytes, in: source))
        let pair = try MovingPair(directory: destination)
        do {
            try await pair.waitUntil(on: "memory")
            let transfer = pair.sender.sendFile(file, to: pair.receiver.localPeer)
            var iterator = pair.received.makeAsyncIterator()
            let incoming = try #require(await iterator.next())
            // The receiver's progress drives the changes: a third in, TCP is found (upgrade);
            // two thirds in, TCP goes away (failover).
            let (marks, marksSink) = AsyncStream.makeStream(of: Int.self)
            let receiving = Task {
                var reached = 0
                let ended = await incoming.updates.drain { progress in
                    while reached < 2, progress.bytesDone >= file.size * UInt64(reached + 1) / 3 {
                        reached += 1
                        marksSink.yield(reached)
                    }
                }
                marksSink.finish()
                return ended
            }
            var steps = marks.makeAsyncIterator()
            #expect(await steps.next() == 1, "the transfer ended before a third had arrived")
            pair.offerTCP()
            try await pair.waitUntil(on: "tcp")
            #expect(await steps.next() == 2, "the transfer ended before two thirds had arrived")
            pair.takeTCPAway()
            try await pair.waitUntil(on: "memory")

            let sending = await transfer.updates.drain()
            #expect(sending == nil, "\(sending?.message ?? "")")
            let ended = await receiving.value
            #expect(ended == nil, "\(ended?.message ?? "")")
            #expect(try await transfer.result().get() == .sent)
            #expect(transfer.acceptedOffsets == [0], "one offer, at 0: never started again (\(transfer.acceptedOffsets))")
            // the receiver checked the SHA-256 before it saved the file
            guard case .received(let path) = try await incoming.result().get() else {
                Issue.record("the receiver did not save the file")
                await pair.close()
                return
            }
            #expect(PosixFile.length(of: path) == file.size)
            // (a link replaced by another on the same transport is reported too: a new remote)
            let transports = pair.transportChanges.reduce(into: [String]()) { if $0.last != $1 { $0.append($1) } }
            #expect(transports == ["tcp", "memory"], "\(pair.transportChanges)")
            #expect(!pair.receiverLeft, "the receiver never left the session")
        } catch {
            await pair.close()
            throw error
        }
        await pair.close()
    }

    private func run(_ pair: DirectPair, file: OutgoingFile, destination: String) async throws {
        let (sender, receiver) = (pair.sender, pair.receiver)
        let receiverPeer = receiver.localPeer
        let senderPeer = sender.localPeer
        let done = Shared(false)
        let pingsSent = Shared<[ContinuousClock.Instant]>([])

        let baseline = try #require(residentBytes(), "VmRSS in /proc/self/status")
        let memory = MemoryWatch()
        memory.start()

        // Chat both ways while the file goes: the sender pings (the receiver answers each with a
        // pong), the receiver chats on its own. Bounded in count and time.
        async let pings: Int = {
            var count = 0
            while !done.value || count < 20, count < 20_000 {
                count += 1
                pingsSent.update { $0.append(.now) }
                try await sender.send(Array("ping \(count)".utf8), to: [receiverPeer])
                try await Task.sleep(for: .milliseconds(10))
            }
            return count
        }()
        async let chats: Int = {
            var count = 0
            while !done.value || count < 20, count < 20_000 {
                count += 1
                try await receiver.send(Array("chat \(count)".utf8), to: [senderPeer])
                try await Task.sleep(for: .milliseconds(10))
            }
            return count
        }()

        let transfer = sender.sendFile(file, to: receiverPeer)
        var iterator = pair.received.makeAsyncIterator()
        let incoming = try #require(await iterator.next())
        // The middle half of the transfer, as the receiver saw it: chat must get through then.
        var middle: (start: ContinuousClock.Instant?, end: ContinuousClock.Instant?) = (nil, nil)
        let quarter = file.size / 4
        let receiving = await incoming.updates.drain { progress in
            if middle.start == nil, progress.bytesDone >= quarter { middle.start = .now }
            if middle.end == nil, progress.bytesDone >= 3 * quarter { middle.end = .now }
        }
        let sending = await transfer.updates.drain()
        done.update { $0 = true }
        memory.stop()
        #expect(receiving == nil, "\(receiving?.message ?? "")")
        #expect(sending == nil, "\(sending?.message ?? "")")

        // The file: verified by the receiver (SHA-256), in place, the right size, nothing else left.
        #expect(try await transfer.result().get() == .sent)
        guard case .received(let path) = try await incoming.result().get() else {
            Issue.record("the receiver did not save the file")
            return
        }
        #expect(path == destination + "/payload.bin")
        #expect(PosixFile.length(of: path) == file.size)
        #expect(try FileManager.default.contentsOfDirectory(atPath: destination) == ["payload.bin"], "no partial files remain")

        // Chat: every message arrived, in order, both ways, and some while the file was going.
        let (pingCount, chatCount) = (try await pings, try await chats)
        try await pair.atReceiver.wait(for: pingCount, prefixed: "ping ")
        try await pair.atSender.wait(for: pingCount, prefixed: "pong ")
        try await pair.atSender.wait(for: chatCount, prefixed: "chat ")
        #expect(pair.atReceiver.messages(prefixed: "ping ").map(\.text) == (1...pingCount).map { "ping \($0)" })
        #expect(pair.atSender.messages(prefixed: "pong ").map(\.text) == (1...pingCount).map { "pong \($0)" })
        #expect(pair.atSender.messages(prefixed: "chat ").map(\.text) == (1...chatCount).map { "chat \($0)" })
        let start = try #require(middle.start), end = try #require(middle.end)
        let pingsInMiddle = pair.atReceiver.messages(prefixed: "ping ").count { $0.time > start && $0.time < end }
        let chatsInMiddle = pair.atSender.messages(prefixed: "chat ").count { $0.time > start && $0.time < end }
        #expect(pingsInMiddle > 0 && chatsInMiddle > 0, "chat got through while the file was going: \(pingsInMiddle) pings, \(chatsInMiddle) chats")

        // Memory: flat, whatever the file size; the link never queued more than its bound.
        let growth = memory.peak - baseline
        #expect(growth < Self.memoryBound, "the resident set grew by \(growth >> 20) MiB during the transfer")
        let statistics = try #require(sender.streamStatistics(for: receiverPeer))
        #expect(statistics.peakQueuedDataBytes <= statistics.maxQueuedDataBytes)

        // Figures, not assertions: the benchmark watches speed.
        let sentTimes = pingsSent.value
        let trips = zip(sentTimes, pair.atSender.messages(prefixed: "pong ")).map { sent, pong in pong.time - sent }
        let roundTrips = trips.sorted()
        let worstIndex = trips.indices.max { trips[$0] < trips[$1] } ?? 0
        let seconds = Double((end - start).components.seconds) + Double((end - start).components.attoseconds) / 1e18
        print("""
            1 GiB test: middle half at \(Int(Double(file.size / 2) / seconds / 1e6)) MB/s; \
            \(pingCount) pings, \(chatCount) chats; ping round trip p50 \(roundTrips.isEmpty ? Duration.zero : roundTrips[roundTrips.count / 2]), \
            worst \(roundTrips.last ?? .zero) (ping \(worstIndex + 1)); RSS \(baseline >> 20) MiB before, peak \(memory.peak >> 20) MiB \
            (\(memory.count) samples)
            """)
    }
}
