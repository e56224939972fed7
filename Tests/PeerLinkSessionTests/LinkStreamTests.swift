import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// A link with the channel of the peer at its other end, as a session pairs them once the
/// handshake named the peer.
func attachChannel(to link: Link, local: Identity, log: TestLog) async throws -> (PeerChannel, AsyncStream<PeerStream>) {
    let remote = try await link.established.remote
    let (streams, sink) = AsyncStream.makeStream(of: PeerStream.self)
    let channel = PeerChannel(
        peer: remote, incarnation: nil, localPeer: PeerID(identity: local, displayName: try DisplayName("Bo")),
        clock: ContinuousClock(), logger: log.logger, streamOpened: { sink.yield($0) })
    link.attach(channel)
    channel.activate(link)
    // As a session does once its lock is released: the link's writer looks at once, and the
    // ACK a new link owes (where the pair stands) goes out now, not with whatever comes next.
    channel.deliverPending()
    return (channel, streams)
}

/// Opens a stream named "bulk" on `channel`, whose link has `peer` at its other end: waits for
/// the stream's `SYN` there and answers it with an accept that grants `credit`.
func openBulkStream(on channel: PeerChannel, to peer: inout RawPeer, credit: Int) async throws -> PeerStream {
    let opening = Task { try await channel.openStream(named: "bulk") }
    while !peer.frames.contains(where: { if case .data = $0 { true } else { false } }) {
        try #require(await peer.readOnce(), "the link ended: \(String(describing: peer.events.last))")
    }
    guard case .data(let id, .syn, let name)? = peer.frames.first(where: { if case .data = $0 { true } else { false } }) else {
        opening.cancel()
        Issue.record("expected a SYN, got \(peer.events)")
        throw CancellationError()
    }
    #expect(name.array == Array("bulk".utf8))
    try await peer.send(.windowUpdate(stream: id, flags: .ack, credit: UInt32(credit)))
    return try await opening.value
}

@Suite("Link streams against a peer driven by hand", .timeLimit(.minutes(1)))
struct LinkStreamTests {
    /// A link that listens ("Bo") on the in-memory transport, and the dialled end of its
    /// connection for a peer driven by hand; close the listener when done.
    static func listeningLink(
        log: TestLog, bufferCapacity: Int = 64 * 1024
    ) async throws -> (any TransportListener, any LinkChannel, Identity, Link) {
        let (listener, dialed, server, link, _) = try await listeningLinkAndItsEnd(log: log, bufferCapacity: bufferCapacity)
        return (listener, dialed, server, link)
    }

    /// ``listeningLink(log:bufferCapacity:)``, and the link's own end of the connection; the
    /// channels may take another write batch limit, the link another clock.
    static func listeningLinkAndItsEnd(
        log: TestLog, bufferCapacity: Int = 64 * 1024, writeBatchLimit: Int? = nil, clock: any Clock<Duration> = ContinuousClock()
    ) async throws -> (any TransportListener, any LinkChannel, Identity, Link, MemoryChannel) {
        let network = MemoryNetwork(bufferCapacity: bufferCapacity, writeBatchLimit: writeBatchLimit)
        let listener = try network.listen(name: "bo")
        let dialed = try await network.transport.dial(.memory(name: "bo"), timeout: .seconds(1))
        let accepted = try #require(try await listener.accept() as? MemoryChannel)
        let server = Identity.generate()
        let link = Link(
            channel: accepted, role: .listener, identity: server, preface: LinkFixture.preface(), hello: LinkFixture.hello("Bo"),
            clock: clock, logger: log.logger)
        return (listener, dialed, server, link, accepted)
    }

    @Test(
        "a 64 KiB write on a stream with credit goes out in the channel's write batches (two frames by default, eight over TCP), not one write per frame",
        arguments: [(nil, 2), (8 * WireFormat.maxFramePayload, 1)] as [(Int?, Int)])
    func streamWriteGoesOutInBatches(writeBatchLimit: Int?, writesEach: Int) async throws {
        let log = TestLog()
        // Room for the whole write in the transport: how many writes it takes is the link's doing.
        let (listener, dialed, server, link, linkEnd) = try await Self.listeningLinkAndItsEnd(
            log: log, bufferCapacity: 1 << 20, writeBatchLimit: writeBatchLimit)
        defer { listener.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            defer { dialed.close() }
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Reader", expecting: server)
            #expect(try await peer.handshake())
            let (channel, _) = try await attachChannel(to: link, local: server, log: log)
            let stream = try await openBulkStream(on: channel, to: &peer, credit: 1 << 20)

            // Eight writes of 64 KiB, each read to the end before the next: how many transport
            // writes each took does not depend on a writer still busy with the one before.
            let size = 4 * WireFormat.maxFramePayload, rounds = 8
            var writes: [Int] = []
            var received = 0
            for round in 1...rounds {
                let before = linkEnd.writeCount
                try await stream.write([UInt8](repeating: 0xB0, count: size))
                while received < round * size {
                    try #require(await peer.readOnce(), "the link ended: \(String(describing: peer.events.last))")
                    received = peer.frames.reduce(0) { total, frame in
                        if case .data(_, [], let payload) = frame { total + payload.count } else { total }
                    }
                }
                writes.append(linkEnd.writeCount - before)
            }
            #expect(received == rounds * size)
            // The writer seals at most the channel's batch limit at once (by default two frames,
            // what a message may wait behind, see `LinkSchedulingTests`): two writes for each, or
            // one with eight frames to a batch, where a wake-up per frame made up to four.
            #expect(writes.allSatisfy { $0 <= writesEach }, "64 KiB stream writes went out in \(writes) transport writes")
            stream.reset(reason: "enough")
            dialed.close()
            try await group.waitForAll()
        }
    }

    @Test("3 MiB of message frames that arrive before the channel is attached (a peer resending its window on a new link) wait for it: nothing lost, no error")
    func earlyFramesWaitForTheChannel() async throws {
        let log = TestLog()
        let (listener, dialed, server, link) = try await Self.listeningLink(log: log)
        defer { listener.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            defer { dialed.close() }
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Ana", expecting: server)
            #expect(try await peer.handshake())
            // 3 MiB of chunks of one message, written before the session took the link.
            let chunk = [UInt8](repeating: 0x42, count: WireFormat.maxFramePayload)
            let count = 3 * 1024 * 1024 / chunk.count
            let writer = Task { [peer] in
                var peer = peer
                for index in 0..<count {
                    try await peer.send(.message(id: 1, flags: index == count - 1 ? [] : .more, chunk: FramePayload(chunk)))
                }
            }
            try await Task.sleep(for: .milliseconds(500))
            #expect(link.closure == nil, "the link closed before the channel was attached: \(String(describing: link.closure))")
            _ = try await attachChannel(to: link, local: server, log: log)
            var events = link.events.makeAsyncIterator()
            var received = 0
            while received < count, let event = await events.next() {
                guard case .frame(.message(1, _, let bytes)) = event else {
                    Issue.record("unexpected \(event)")
                    break
                }
                #expect(bytes.array == chunk)
                received += 1
            }
            #expect(received == count)
            try await writer.value
            #expect(link.closure == nil)
            link.close(code: .normal, reason: "done")
            try await group.waitForAll()
        }
    }

    @Test("a peer that sends more than the window gets GO_AWAY 1; the bytes within it can still be read")
    func windowViolationClosesTheLink() async throws {
        let log = TestLog()
        let (listener, dialed, server, link) = try await Self.listeningLink(log: log)
        defer { listener.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Greedy", expecting: server)
            #expect(try await peer.handshake())
            let (channel, opened) = try await attachChannel(to: link, local: server, log: log)
            var events = link.events.makeAsyncIterator()
            // The greedy peer's fingerprint may be either side of Bo's: it opens a stream with an
            // id of its own parity (the smaller fingerprint opens odd ones).
            let id: UInt32 = try await link.established.remote.fingerprint < server.fingerprint ? 1 : 2
            try await peer.send(.data(stream: id, flags: .syn, payload: FramePayload("flood".utf8)))
            var streams = opened.makeAsyncIterator()
            guard let stream = await streams.next() else {
                Issue.record("the channel did not report the stream the peer opened")
                dialed.close()
                return
            }
            #expect(stream.name == "flood" && stream.id == id && !stream.isOutgoing)
            // The ACK comes back before any other stream frame.
            while !peer.frames.contains(where: { if case .windowUpdate = $0 { true } else { false } }) {
                #expect(try await peer.readOnce())
            }
            #expect(peer.frames.first { if case .windowUpdate = $0 { true } else { false } } == .windowUpdate(stream: id, flags: .ack, credit: 0))

            let chunk = [UInt8](repeating: 1, count: WireFormat.maxFramePayload)
            for _ in 0...(WireFormat.initialStreamWindow / chunk.count) { try await peer.send(.data(stream: id, flags: [], payload: FramePayload(chunk))) }
            let closure = await events.closure()
            #expect(closure?.code == .protocolError)
            #expect(closure?.reason.contains("window") == true, "\(closure?.reason ?? "")")
            #expect(closure?.byPeer == false)
            // A protocol error is not recovered from: the session ends the peer's channel, and
            // its streams with it (a stream outlives a link, not its peer).
            #expect(!channel.isClosed)
            channel.close(PeerLinkError(.notConnected, "Greedy broke the stream rules"))
            channel.deliverPending()

            var received = 0
            do {
                while let bytes = try await stream.read() { received += bytes.count }
                Issue.record("the stream ended with FIN, not with the link")
            } catch let error as PeerLinkError {
                #expect(error.code == .notConnected)
            }
            #expect(received == WireFormat.initialStreamWindow)
            dialed.close()
            try await group.waitForAll()
        }
    }
}

@Suite("Link scheduling: bulk stream data never holds up a message", .timeLimit(.minutes(1)))
struct LinkSchedulingTests {
    @Test(
        "a message queued during a bulk transfer goes out behind at most one write batch of stream data (two frames by default, eight over TCP)",
        arguments: [(nil, 2), (8 * WireFormat.maxFramePayload, 8)] as [(Int?, Int)])
    func messageOvertakesBulkData(writeBatchLimit: Int?, framesAhead: Int) async throws {
        let log = TestLog()
        // A small pipe: what is written waits in the link's queues, not in the transport.
        let network = MemoryNetwork(bufferCapacity: 4096, writeBatchLimit: writeBatchLimit)
        let listener = try network.listen(name: "bo")
        defer { listener.close() }
        let dialed = try await network.transport.dial(.memory(name: "bo"), timeout: .seconds(1))
        let accepted = try await listener.accept()
        let server = Identity.generate()
        // The peer driven by hand answers keep-alives only as it reads: a slow (sanitizer) build
        // must not end the link for that.
        var policy = LinkPolicy.default
        policy.keepAliveTimeout = .seconds(120)
        let link = Link(
            channel: accepted, role: .listener, identity: server, preface: LinkFixture.preface(), hello: LinkFixture.hello("Bo"),
            policy: policy, logger: log.logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            defer { dialed.close() }  // a failed step ends the link, and with it the tasks
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Reader", expecting: server)
            #expect(try await peer.handshake())
            let (channel, _) = try await attachChannel(to: link, local: server, log: log)
            // The SYN, then an accept with credit for the whole transfer.
            let total = 4 << 20
            let stream = try await openBulkStream(on: channel, to: &peer, credit: total)
            group.addTask {
                // Ends when the test resets the stream.
                let error = await #expect(throws: PeerLinkError.self) {
                    try await stream.write([UInt8](repeating: 0xB0, count: total))
                }
                #expect(error?.code == .cancelled)
            }

            // Let the transfer run for a while, then queue a message.
            var dataFrames = 0
            while dataFrames < 40 {
                try #require(await peer.readOnce(), "the link ended: \(String(describing: peer.events.last))")
                dataFrames = peer.frames.count { if case .data(_, [], _) = $0 { true } else { false } }
            }
            let chat = Frame.message(id: 1, flags: [], chunk: FramePayload("chat".utf8))
            let sending = Task { try await link.send(chat) }
            let before = peer.frames.count
            while !peer.frames.contains(chat) {
                try #require(await peer.readOnce(), "the link ended: \(String(describing: peer.events.last))")
            }
            try await sending.value
            let overtaken = peer.frames[before...].count { if case .data = $0 { true } else { false } }
            #expect(overtaken <= framesAhead, "\(overtaken) DATA frames went out after the message was queued")
            #expect(channel.dataQueueCounts.peak <= channel.maxQueuedDataBytes)
            stream.reset(reason: "enough")
            dialed.close()
            try await group.waitForAll()
        }
    }
}

@Suite("Link acknowledgements: the ticker writes an ACK owed at its deadline", .timeLimit(.minutes(1)))
struct LinkAcknowledgementTests {
    @Test("an ACK owed is written at the ACK delay when nothing else goes out; one a reply carried does not delay the next, nor does a deadline kept from it bring it early")
    func ackAtItsDeadline() async throws {
        let log = TestLog()
        let clock = ManualClock()
        let (listener, dialed, server, link, accepted) = try await LinkStreamTests.listeningLinkAndItsEnd(log: log, clock: clock)
        defer { listener.close() }
        let delay = Continuity.Policy.default.ackDelay
        try await withThrowingTaskGroup(of: Void.self) { group in
            defer { dialed.close() }
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Ana", expecting: server)
            #expect(try await peer.handshake())
            let (channel, _) = try await attachChannel(to: link, local: server, log: log)
            func acknowledged(_ through: UInt64) -> Bool {
                peer.frames.contains { if case .ack(through) = $0 { true } else { false } }
            }
            // What the link took in, in order: a message has arrived once it is here.
            var arrived = link.events.makeAsyncIterator()
            func arrival(of text: String) async throws {
                while let event = await arrived.next() {
                    if case .frame(.message(_, _, let chunk)) = event, chunk.array == Array(text.utf8) { return }
                }
                Issue.record("the link ended before \"\(text)\" arrived")
                throw CancellationError()
            }

            // On a new link the first ACK goes at once (the peer must hear where it stands),
            // before anything arrived on it.
            while !acknowledged(0) { try #require(await peer.readOnce(), "the link ended") }

            // Nothing goes back: the next ACK is written when the delay is over, not before.
            try await peer.send(.message(id: 1, flags: [], chunk: FramePayload("one".utf8)))
            try await clock.waitForSleeper(until: .init(offset: delay))
            #expect(accepted.bufferedByteCount == 0, "written before the ACK delay")
            clock.advance(to: .init(offset: delay))
            while !acknowledged(1) { try #require(await peer.readOnce(), "the link ended") }

            // A reply carries the ACK for the next one.
            try await peer.send(.message(id: 2, flags: [], chunk: FramePayload("two".utf8)))
            try await clock.waitForSleeper(until: .init(offset: delay * 2))
            channel.enqueue([.message(id: 1, flags: [], chunk: FramePayload("reply".utf8))])
            channel.deliverPending()
            while !acknowledged(2) { try #require(await peer.readOnce(), "the link ended") }
            #expect(peer.frames.contains(.message(id: 1, flags: [], chunk: FramePayload("reply".utf8))))

            // The third arrives 1 ms later: its ACK is due a delay after it, not at the deadline
            // the ticker kept from the second (which passes with nothing written), nor later.
            clock.advance(to: .init(offset: delay + .milliseconds(1)))
            try await peer.send(.message(id: 3, flags: [], chunk: FramePayload("three".utf8)))
            try await arrival(of: "three")
            let due = delay * 2 + .milliseconds(1)
            clock.advance(to: .init(offset: delay * 2))
            try await clock.waitForSleeper(until: .init(offset: due))
            #expect(accepted.bufferedByteCount == 0, "the ACK for 3 went out before it was due")
            clock.advance(to: .init(offset: due))
            while !acknowledged(3) { try #require(await peer.readOnce(), "the link ended") }

            dialed.close()
            try await group.waitForAll()
        }
    }
}
