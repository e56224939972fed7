import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

@Suite("Link over the in-memory transport")
struct MemoryLinkTests {
    /// A dialer and a listener link on a fresh memory network, with their channels.
    struct Pair {
        let dialer: Link
        let listener: Link
        let dialerChannel: MemoryChannel
        let listenerChannel: MemoryChannel
        let dialerIdentity: Identity
        let listenerIdentity: Identity
    }

    static func pair(
        dialer dialerEncryption: EncryptionPreference = .optional,
        listener listenerEncryption: EncryptionPreference = .optional,
        clock: any Clock<Duration> = ContinuousClock(),
        closeTimeout: Duration = .seconds(2),
        log: TestLog
    ) async throws -> Pair {
        let network = MemoryNetwork()
        let listener = try network.listen(name: "bo")
        defer { listener.close() }
        let dialed = try #require(try await network.transport.dial(.memory(name: "bo"), timeout: .seconds(1)) as? MemoryChannel)
        let accepted = try #require(try await listener.accept() as? MemoryChannel)
        let ana = Identity.generate()
        let bo = Identity.generate()
        return Pair(
            dialer: LinkFixture.link(
                dialed, .dialer, ana, name: "Ana", encryption: dialerEncryption, expecting: bo, clock: clock,
                closeTimeout: closeTimeout, log: log),
            listener: LinkFixture.link(
                accepted, .listener, bo, name: "Bo", encryption: listenerEncryption, clock: clock, closeTimeout: closeTimeout,
                log: log),
            dialerChannel: dialed, listenerChannel: accepted, dialerIdentity: ana, listenerIdentity: bo)
    }

    @Test("a memory channel's writeNow takes what fits, nothing behind a waiting write, and fails once closed")
    func memoryWriteNow() async throws {
        let network = MemoryNetwork(bufferCapacity: 1000)
        let listener = try network.listen(name: "bo")
        defer { listener.close() }
        let dialed = try #require(try await network.transport.dial(.memory(name: "bo"), timeout: .seconds(1)) as? MemoryChannel)
        let accepted = try #require(try await listener.accept() as? MemoryChannel)
        let bytes = (0..<1500).map { UInt8(truncatingIfNeeded: $0) }
        #expect(try dialed.writeNow(bytes) == 1000)
        #expect(try dialed.writeNow(bytes) == 0)
        // a write that waits for room, then one that does not wait: in that order
        let waiting = Task { try await dialed.write(Array(bytes[1000...])) }
        var received = try await accepted.read()
        #expect(received == Array(bytes[..<1000]))
        try await waiting.value
        #expect(try dialed.writeNow([9]) == 1)
        received = try await accepted.read()
        #expect(received == Array(bytes[1000...]) + [9])
        dialed.close()
        #expect(throws: PeerLinkError.self) { try dialed.writeNow([1]) }
        accepted.close()
    }

    @Test("a batch is written where the writer was woken when it is large or the link wrote nothing for a while")
    func writesNowRule() {
        let small = [UInt8](repeating: 0, count: 100)
        let large = [UInt8](repeating: 0, count: Link.writeNowMinimum)
        #expect(Link.writesNow(small, lastWriteEnded: nil))
        #expect(Link.writesNow(large, lastWriteEnded: .now))
        #expect(!Link.writesNow(small, lastWriteEnded: .now))
        #expect(Link.writesNow(small, lastWriteEnded: .now - Link.writeNowQuiet))
    }

    @Test("two links establish, exchange messages both ways in order, and close with GO_AWAY 0")
    func establishExchangeClose() async throws {
        let log = TestLog()
        let pair = try await Self.pair(log: log)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await pair.dialer.run() }
            group.addTask { await pair.listener.run() }

            let atDialer = try await pair.dialer.established
            let atListener = try await pair.listener.established
            #expect(atDialer.remote.fingerprint == pair.listenerIdentity.fingerprint)
            #expect(atDialer.remote.displayName == "Bo")
            #expect(atListener.remote.fingerprint == pair.dialerIdentity.fingerprint)
            #expect(atListener.hello == LinkFixture.hello("Ana"))
            #expect(atDialer.encrypted && atListener.encrypted)
            #expect(atDialer.version == WireFormat.version)
            #expect(pair.dialer.handshakeHash == pair.listener.handshakeHash)

            for index in 1...50 {
                try await pair.dialer.send(LinkFixture.message(index))
                try await pair.listener.send(LinkFixture.message(1000 + index))
            }
            var atBo = pair.listener.events.makeAsyncIterator()
            var atAna = pair.dialer.events.makeAsyncIterator()
            #expect(await atBo.next(50).map(LinkFixture.index) == Array(1...50))
            #expect(await atAna.next(50).map(LinkFixture.index) == Array(1001...1050))

            pair.dialer.close()
            let seenByBo = try #require(await atBo.closure())
            #expect(seenByBo.code == .normal)
            #expect(seenByBo.byPeer)
            let seenByAna = try #require(await atAna.closure())
            #expect(seenByAna.code == .normal)
            #expect(!seenByAna.byPeer)
            #expect(await atBo.next() == nil)
            try await group.waitForAll()
        }
        // Both runs returned: the channels are closed, sends fail, the close was logged once each.
        #expect(pair.dialerChannel.isClosed && pair.listenerChannel.isClosed)
        let error = await #expect(throws: PeerLinkError.self) { try await pair.dialer.send(LinkFixture.message(99)) }
        #expect(error?.code == .notConnected)
        #expect(log.closings(remote: pair.dialerChannel.remoteDescription, role: "dialer").count == 1)
        #expect(log.closings(remote: pair.listenerChannel.remoteDescription, role: "listener").count == 1)
        let established = log.all.filter { $0.message == "link established" }
        #expect(established.count == 2)
        #expect(established.allSatisfy { $0.metadata["peer.id"] != nil && $0.metadata["transport"] == "memory" })
    }

    /// After its `GO_AWAY` a link waits for the peer's end of the channel (at most its close
    /// timeout), so that the goodbye is not lost to a reset. A channel without a half-close
    /// (this one; RFCOMM and L2CAP alike) ends only when the peer closes it: when both sides
    /// closed at once, each waited for the other until its close timeout (2 s by default). The
    /// peer's `GO_AWAY`, read after this side's own, now ends the wait. Frames in flight when
    /// both close are read past. The close timeout here is ten minutes; a link still waiting
    /// after 10 s fails the test.
    @Test(
        "two links closed at the same moment end at each other's GO_AWAY on a channel without half-close",
        arguments: [EncryptionPreference.required, .none])
    func simultaneousClose(encryption: EncryptionPreference) async throws {
        for round in 0..<3 {
            let log = TestLog()
            let pair = try await Self.pair(dialer: encryption, listener: encryption, closeTimeout: .seconds(600), log: log)
            let runs = [Task { await pair.dialer.run() }, Task { await pair.listener.run() }]
            _ = try await pair.dialer.established
            _ = try await pair.listener.established
            var atAna = pair.dialer.events.makeAsyncIterator()
            var atBo = pair.listener.events.makeAsyncIterator()
            // Frames in flight both ways as both close: read past after each side's GO_AWAY.
            for index in 0..<(round * 20) {
                try await pair.dialer.send(LinkFixture.message(index))
                try await pair.listener.send(LinkFixture.message(index))
            }
            let took = await LinkFixture.closeTogether(pair.dialer, pair.listener, runs: runs)
            #expect(
                took < .seconds(10),
                "round \(round): the links lingered until cancelled, \(took) after both closed\n\(log.transcript(last: 30))")
            let seenByAna = try #require(await atAna.closure())
            let seenByBo = try #require(await atBo.closure())
            #expect(seenByAna.code == .normal && seenByBo.code == .normal, "round \(round): \(seenByAna), \(seenByBo)")
            #expect(pair.dialerChannel.isClosed && pair.listenerChannel.isClosed)
        }
    }

    @Test("required × none: both sides refuse, and both established throw a message about encryption")
    func encryptionRefused() async throws {
        let log = TestLog()
        let pair = try await Self.pair(dialer: .required, listener: .none, log: log)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await pair.dialer.run() }
            group.addTask { await pair.listener.run() }
            for link in [pair.dialer, pair.listener] {
                let error = await #expect(throws: PeerLinkError.self) { try await link.established }
                #expect(error?.code == .unsupported)
                #expect(error?.message.contains("encryption") == true, "\(String(describing: error))")
                #expect(link.closure?.code == .encryptionMismatch)
            }
            await group.waitForAll()
        }
        let error = await #expect(throws: PeerLinkError.self) { try await pair.listener.send(LinkFixture.message(1)) }
        #expect(error?.message.contains("encryption") == true)
    }

    @Test("keep-alive: a severed link closes with code 8 once 8 s pass without input, not before")
    func keepAliveTimeout() async throws {
        let log = TestLog()
        let clock = ManualClock()
        let pair = try await Self.pair(clock: clock, log: log)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await pair.dialer.run() }
            group.addTask { await pair.listener.run() }
            _ = try await pair.dialer.established
            _ = try await pair.listener.established
            try await clock.waitForSleepers(2)

            pair.dialerChannel.sever()
            // Pings go out every 2 s and vanish; nothing arrives.
            for step in [2000, 4000, 6000, 7999] {
                clock.advance(to: .init(offset: .milliseconds(step)))
                try await clock.waitForSleepers(2)
                #expect(pair.dialer.closure == nil, "closed at \(step) ms")
                #expect(pair.listener.closure == nil, "closed at \(step) ms")
            }

            clock.advance(to: .init(offset: .seconds(8)))
            var atAna = pair.dialer.events.makeAsyncIterator()
            var atBo = pair.listener.events.makeAsyncIterator()
            let atAnaClosure = await atAna.closure()
            let atBoClosure = await atBo.closure()
            for closure in [atAnaClosure, atBoClosure] {
                #expect(closure?.code == .keepAliveTimeout)
                #expect(closure?.byPeer == false)
                #expect(closure?.reason.contains("8 s") == true)
            }
            try await group.waitForAll()
        }
        let error = await #expect(throws: PeerLinkError.self) { try await pair.dialer.send(LinkFixture.message(1)) }
        #expect(error?.code == .notConnected)
        #expect(pair.dialer.closure?.error.code == .timedOut)
    }

    @Test("back-pressure: a peer that stops reading holds the sender, and the link's queue stays bounded")
    func backPressure() async throws {
        let log = TestLog()
        let network = MemoryNetwork(bufferCapacity: 4096)
        let listener = try network.listen(name: "slow")
        defer { listener.close() }
        let dialed = try await network.transport.dial(.memory(name: "slow"), timeout: .seconds(1))
        let accepted = try await listener.accept()
        let server = Identity.generate()
        let limit = 32 * 1024
        // The raw peer never writes, so the link's keep-alive would end it after 8 s: give a
        // loaded machine (the whole suite in parallel) more than that to move 640 KiB.
        let link = Link(
            channel: accepted, role: .listener, identity: server, preface: LinkFixture.preface(),
            hello: LinkFixture.hello("Bo"), policy: LinkPolicy(keepAliveTimeout: .seconds(60)), maxQueuedBytes: limit,
            logger: log.logger)
        let chunk = [UInt8](repeating: 0x5A, count: WireFormat.maxFramePayload)
        let count = 40
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await link.run() }
            var peer = RawPeer(dialed, name: "Slow", expecting: server)
            #expect(try await peer.handshake())
            // 640 KiB towards a peer that reads nothing for now.
            group.addTask {
                for index in 1...count { try await link.send(.datagram([UInt8(index)] + chunk.dropFirst())) }
            }
            // Reading drains it; meanwhile the queue never grows past the limit and one record.
            var reads = 0
            while peer.events.count < count, reads < 10_000 {
                #expect(link.queuedByteCount <= limit + chunk.count + 64)
                #expect(try await peer.readOnce())
                reads += 1
            }
            let ids = peer.events.compactMap { output -> UInt32? in
                if case .frame(.datagram(let received)) = output, received.dropFirst() == chunk.dropFirst() { return UInt32(received[0]) }
                return nil
            }
            #expect(ids == Array(1...UInt32(count)))
            link.close()
            while peer.machine.state != .closed, try await peer.readOnce(), reads < 20_000 { reads += 1 }
            #expect(peer.events.last == .closed(code: .normal, reason: "closed", byPeer: true))
            // As a PeerLink peer does on a GO_AWAY: close, which ends the link's wait at once.
            dialed.close()
            try await group.waitForAll()
        }
    }

    @Test("cancelling the task that runs a link closes it; the peer sees a GO_AWAY")
    func cancellationCloses() async throws {
        let log = TestLog()
        let pair = try await Self.pair(log: log)
        try await withThrowingTaskGroup(of: Void.self) { group in
            let dialerRun = Task { await pair.dialer.run() }
            group.addTask { await pair.listener.run() }
            _ = try await pair.listener.established
            dialerRun.cancel()
            await dialerRun.value
            var atBo = pair.listener.events.makeAsyncIterator()
            let seenByBo = try #require(await atBo.closure())
            #expect(seenByBo.byPeer)
            #expect(seenByBo.code == .normal, "\(seenByBo)")
            #expect(pair.dialer.closure?.error.code == .cancelled)
            try await group.waitForAll()
        }
    }
}

@Suite("The in-memory transport")
struct MemoryTransportTests {
    @Test("bytes arrive in order through a small buffer; a write waits for the reader")
    func backPressure() async throws {
        let network = MemoryNetwork(bufferCapacity: 4)
        let listener = try network.listen(name: "pipe")
        defer { listener.close() }
        let dialed = try await network.transport.dial(.memory(name: "pipe"), timeout: .seconds(1))
        let accepted = try await listener.accept()
        let sent = Array(UInt8(0)..<UInt8(10))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await dialed.write(sent) }
            var received: [UInt8] = []
            for _ in 0..<10 where received.count < sent.count {
                let piece = try await accepted.read()
                #expect(piece.count <= 4)
                received += piece
            }
            #expect(received == sent)
            try await group.waitForAll()
        }
        dialed.close()
        #expect(try await accepted.read() == [])
        accepted.close()
        await #expect(throws: PeerLinkError.self) { try await accepted.read() }
        await #expect(throws: PeerLinkError.self) { try await dialed.write([1]) }
    }

    @Test("a write to a peer that closed fails; the end of the stream follows the data")
    func closeSemantics() async throws {
        let network = MemoryNetwork()
        let listener = try network.listen(name: "pipe")
        defer { listener.close() }
        let dialed = try await network.transport.dial(.memory(name: "pipe"), timeout: .seconds(1))
        let accepted = try await listener.accept()
        try await dialed.write([1, 2, 3])
        dialed.close()
        #expect(try await accepted.read() == [1, 2, 3])
        #expect(try await accepted.read() == [])
        let error = await #expect(throws: PeerLinkError.self) { try await accepted.write([4]) }
        #expect(error?.code == .notConnected)
    }

    @Test("a severed channel: reads wait (until closed here or cancelled), writes vanish")
    func sever() async throws {
        let network = MemoryNetwork()
        let listener = try network.listen(name: "pipe")
        defer { listener.close() }
        let dialed = try #require(try await network.transport.dial(.memory(name: "pipe"), timeout: .seconds(1)) as? MemoryChannel)
        let accepted = try await listener.accept()
        try await dialed.write([1])
        network.cut("pipe")
        try await dialed.write([2])  // into the void
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await #expect(throws: CancellationError.self) { try await accepted.read() }
            }
            group.cancelAll()
        }
        let read = Task { try await dialed.read() }
        dialed.close()
        await #expect(throws: PeerLinkError.self) { try await read.value }
        accepted.close()
    }

    @Test("dials: unknown names are unavailable, TCP endpoints unsupported")
    func dialErrors() async throws {
        let transport = MemoryNetwork().transport
        let missing = await #expect(throws: PeerLinkError.self) {
            try await transport.dial(.memory(name: "nobody"), timeout: .seconds(1))
        }
        #expect(missing?.code == .unavailable)
        #expect(missing?.message.contains("nothing listens at memory://nobody") == true)
        let tcp = await #expect(throws: PeerLinkError.self) {
            try await transport.dial(.tcp(host: "127.0.0.1", port: 9), timeout: .seconds(1))
        }
        #expect(tcp?.code == .unsupported)
    }
}
