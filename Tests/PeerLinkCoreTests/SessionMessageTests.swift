import PeerLinkCore
import Testing

@Suite("Session: reliable and unreliable messages", .ownThread)
struct SessionMessageTests {
    /// Two connected peers.
    static func connectedPair(seed: UInt64 = 1) throws -> SessionNet {
        var net = try SessionNet(["alice", "bob"], seed: seed)
        _ = try net.invite(0, 1)
        net.run()
        try net.respond(1, net.invitationsReceived(1)[0].id, accept: true)
        net.run()
        try #require(net.connected(0) == [1])
        return net
    }

    static func bytes(_ count: Int, seed: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed &* 7) }
    }

    /// Frames the node has waiting for its one link, drained.
    static func drain(_ net: inout SessionNet, _ node: Int) throws -> (LinkID, [Frame]) {
        let link = try #require(net.machine(node).allLinks.first)
        var frames: [Frame] = []
        while let frame = net.nodes[node].machine.nextFrame(for: link) { frames.append(frame) }
        net.nodes[node].ready.remove(link)
        return (link, frames)
    }

    /// Messages sent and received leave the next deadline where it was (the session's timer
    /// then does not read every peer's record after each); any other input may move it.
    @Test func onlyMessagesMovingLeaveTheDeadlineAlone() throws {
        var net = try Self.connectedPair()
        _ = net.nodes[0].machine.nextDeadlineInPlace()
        _ = net.nodes[1].machine.nextDeadlineInPlace()
        #expect(!net.machine(0).nextDeadlineMayBeEarlier)
        try net.send(0, Self.bytes(100, seed: 1), to: [1])
        try net.send(0, Self.bytes(40_000, seed: 2), to: [1])
        let (_, frames) = try Self.drain(&net, 0)
        let link = try #require(net.machine(1).allLinks.first)
        net.apply(1, net.nodes[1].machine.framesReceived(frames, on: link, at: net.now))
        #expect(net.received(1).count == 2)
        #expect(!net.machine(0).nextDeadlineMayBeEarlier, "sending and taking frames for a member")
        #expect(!net.machine(1).nextDeadlineMayBeEarlier, "receiving messages")
        net.apply(1, net.nodes[1].machine.tick(at: net.now))
        #expect(net.machine(1).nextDeadlineMayBeEarlier, "a tick settles in full")
        net.nodes[0].machine.settlesEveryInputFully = true
        try net.send(0, Self.bytes(100, seed: 3), to: [1])
        #expect(net.machine(0).nextDeadlineMayBeEarlier, "a message settled in full")
    }

    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func messagesArriveInOrderExactlyOnceBothWays(seed: UInt64) throws {
        var net = try Self.connectedPair(seed: seed)
        // Sizes that never shrink keep their order even though chunks interleave.
        let sizes = [0, 1, 2, 100, 16383, 16384, 16385, 16385, 40_000, 70_000, 70_000, 200_000]
        var sentByAlice: [[UInt8]] = []
        var sentByBob: [[UInt8]] = []
        for (index, size) in sizes.enumerated() {
            let a = Self.bytes(size, seed: index)
            let b = Self.bytes(size, seed: index + 100)
            try net.send(0, a, to: [1])
            try net.send(1, b, to: [0])
            sentByAlice.append(a)
            sentByBob.append(b)
            if index % 3 == 0 { net.run(limit: 5) }  // some go out while others are queued
        }
        net.run()
        #expect(net.received(1).map(\.data) == sentByAlice)
        #expect(net.received(0).map(\.data) == sentByBob)
        #expect(net.received(1).allSatisfy { $0.reliable && $0.from == 0 })
    }

    @Test func largeMessagesAreChunkedAtTheMaximumFrameSize() throws {
        var net = try Self.connectedPair()
        let message = Self.bytes(40_000, seed: 9)
        try net.send(0, message, to: [1])
        let (_, frames) = try Self.drain(&net, 0)
        #expect(frames.count == 3)
        var ids: Set<UInt32> = []
        for (index, frame) in frames.enumerated() {
            guard case .message(let id, let flags, let chunk) = frame else {
                Issue.record("expected MESSAGE, got \(frame)")
                continue
            }
            ids.insert(id)
            #expect(flags.contains(.more) == (index < 2))
            #expect(chunk.count == [16384, 16384, 7232][index])
            // a reliable chunk carries its sequence number after the header
            #expect(try frame.encoded(sequence: UInt64(index + 1)).count == WireFormat.frameHeaderLength + 8 + chunk.count)
        }
        #expect(ids.count == 1)
        let bobLink = try #require(net.machine(1).allLinks.first)
        var delivered: [[UInt8]] = []
        for frame in frames {
            for action in net.nodes[1].machine.frameReceived(frame, on: bobLink, at: net.now) {
                if case .event(.messageReceived(_, let data, true)) = action { delivered.append(data) }
            }
        }
        #expect(delivered == [message])
    }

    /// However many messages are queued, at most 8 are in progress at once, of 16 MiB at most
    /// together (one larger alone): what the receiver holds in part stays bounded.
    @Test func messagesInProgressAreBounded() throws {
        var net = try Self.connectedPair()
        let sizes = Array(repeating: 64 * 1024, count: 40) + Array(repeating: 6 * 1024 * 1024, count: 4) + [16 * 1024 * 1024, 1000]
        for (index, size) in sizes.enumerated() { try net.send(0, Self.bytes(size, seed: index), to: [1]) }
        let link = try #require(net.machine(0).allLinks.first)
        var inProgress: [UInt32: Int] = [:]  // id: bytes taken so far
        var sizeOf: [UInt32: Int] = [:]
        var nextIndex = 0
        var most = 0
        var mostBytes = 0
        while let frame = net.nodes[0].machine.nextFrame(for: link) {
            guard case .message(let id, let flags, let chunk) = frame else { continue }
            if sizeOf[id] == nil {
                sizeOf[id] = sizes[nextIndex]
                nextIndex += 1
            }
            inProgress[id, default: 0] += chunk.count
            most = max(most, inProgress.count)
            mostBytes = max(mostBytes, inProgress.keys.reduce(0) { $0 + sizeOf[$1]! })
            if !flags.contains(.more) { inProgress[id] = nil }
        }
        #expect(nextIndex == sizes.count && inProgress.isEmpty)
        #expect(most == 8, "\(most) messages in progress at once")
        #expect(mostBytes <= WireFormat.maxMessageLength, "\(mostBytes) bytes of messages in progress at once")
    }

    /// A message is cut into chunks without copying it: every chunk taken for the link is a part
    /// of the message's own storage, in order, and together they are the message; a message of
    /// one chunk is its own array.
    @Test func chunksArePartsOfTheMessage() throws {
        var net = try Self.connectedPair()
        let message = Self.bytes(3 * WireFormat.maxFramePayload + 100, seed: 5)
        let line = Array("one chunk".utf8)
        try net.send(0, message, to: [1])
        try net.send(0, line, to: [1])
        let link = try #require(net.machine(0).allLinks.first)
        func address(_ bytes: UnsafeRawBufferPointer) -> UInt { UInt(bitPattern: bytes.baseAddress) }
        let base = message.withUnsafeBytes(address)
        // The two messages' chunks interleave (the line overtakes the large message).
        var received: [UInt32: [UInt8]] = [:]
        var largeID: UInt32?
        var complete = 0
        while complete < 2, case .message(let id, let flags, let chunk)? = net.nodes[0].machine.nextFrame(for: link) {
            if largeID == nil { largeID = id }
            if id == largeID {
                let offset = received[id]?.count ?? 0
                #expect(chunk.withUnsafeBytes(address) == base + UInt(offset), "the chunk at offset \(offset) is a copy")
            } else {
                #expect(chunk.withUnsafeBytes(address) == line.withUnsafeBytes(address))
                #expect(chunk.array.withUnsafeBytes(address) == line.withUnsafeBytes(address))
            }
            received[id, default: []] += chunk.array
            if !flags.contains(.more) { complete += 1 }
        }
        #expect(received.values.sorted { $0.count < $1.count } == [line, message])
    }

    /// A 10 MiB message does not hold up a chat line queued after it: the line's only frame is
    /// the second frame out, and it is received long before the large one.
    @Test func aSmallMessageOvertakesALargeOne() throws {
        var net = try Self.connectedPair()
        let large = Self.bytes(10 * 1024 * 1024, seed: 1)
        let chat = Array("lunch?".utf8)
        try net.send(0, large, to: [1])
        try net.send(0, chat, to: [1])
        let link = try #require(net.machine(0).allLinks.first)
        let first = net.nodes[0].machine.nextFrame(for: link)
        let second = net.nodes[0].machine.nextFrame(for: link)
        guard case .message(let largeID, let largeFlags, _) = first, case .message(let chatID, let chatFlags, let chatChunk) = second
        else {
            Issue.record("expected two MESSAGE frames, got \(String(describing: first)), \(String(describing: second))")
            return
        }
        #expect(largeFlags.contains(.more))
        #expect(chatID == largeID + 1 && !chatFlags.contains(.more) && chatChunk.array == chat)
        let bobLink = try #require(net.machine(1).allLinks.first)
        net.apply(1, net.nodes[1].machine.frameReceived(first!, on: bobLink, at: net.now))
        net.apply(1, net.nodes[1].machine.frameReceived(second!, on: bobLink, at: net.now))
        #expect(net.received(1).map(\.data) == [chat])
        // The rest of the large one follows, whole.
        var rest: [Frame] = []
        while let frame = net.nodes[0].machine.nextFrame(for: link) { rest.append(frame) }
        #expect(rest.count == 640 - 1)
        for frame in rest { net.apply(1, net.nodes[1].machine.frameReceived(frame, on: bobLink, at: net.now)) }
        #expect(net.received(1).map(\.data.count) == [chat.count, large.count])
        #expect(net.received(1)[1].data == large)
    }

    /// `nextFrames(for:upTo:)` gives what `nextFrame(for:)` gives one call at a time, in the
    /// same order; a run ends at the size limit, at a frame of the link's own (a datagram), or
    /// when nothing waits.
    @Test func framesTakenInRunsAreTheFramesTakenOneByOne() throws {
        var one = try Self.connectedPair(seed: 7)
        var runs = try Self.connectedPair(seed: 7)
        for index in 0..<300 {
            let data = Self.bytes([64, 1, 1000, 20_000][index % 4], seed: index)
            let reliable = index % 7 != 3 || data.count > 16384
            try one.send(0, data, to: [1], reliable: reliable)
            try runs.send(0, data, to: [1], reliable: reliable)
        }
        let (_, expected) = try Self.drain(&one, 0)
        let link = try #require(runs.machine(0).allLinks.first)
        var taken: [Frame] = []
        var runCount = 0
        while true {
            let run = runs.nodes[0].machine.nextFrames(for: link, upTo: 8 * 1024)
            guard let last = run.last else { break }
            runCount += 1
            let size = run.reduce(0) { $0 + FrameScheduler.size(of: $1) }
            let sizeBeforeLast = size - FrameScheduler.size(of: last)
            #expect(sizeBeforeLast < 8 * 1024, "a run goes on only while under the limit")
            let ownBeforeLast = run.dropLast().contains { !$0.type.isSequenced }
            #expect(!ownBeforeLast, "a frame of the link's own ends a run")
            taken += run
        }
        #expect(taken == expected)
        let hasDatagrams = expected.contains { !$0.type.isSequenced }
        #expect(hasDatagrams && runCount < expected.count)
        #expect(runs.nodes[0].machine.nextFrame(for: link) == nil)
    }

    @Test func manySmallMessagesQueuedAtOnceLeaveInOrderOneFrameEach() throws {
        var net = try Self.connectedPair()
        let count = 20_000
        for index in 0..<count { try net.send(0, Self.bytes(8, seed: index), to: [1]) }
        let (_, frames) = try Self.drain(&net, 0)
        #expect(frames.count == count)
        for (index, frame) in frames.enumerated() {
            guard case .message(_, let flags, let chunk) = frame, flags.isEmpty, chunk.array == Self.bytes(8, seed: index) else {
                Issue.record("frame \(index) is \(frame)")
                return
            }
        }
    }

    @Test func sixteenMebibytesIsTheLimitBothWays() throws {
        var net = try Self.connectedPair()
        let limit = WireFormat.maxMessageLength
        let tooLarge = #expect(throws: PeerLinkError.self) { try net.send(0, [UInt8](repeating: 1, count: limit + 1), to: [1]) }
        #expect(tooLarge?.code == .invalidParameter)

        // Exactly 16 MiB goes through.
        let largest = Self.bytes(limit, seed: 3)
        try net.send(0, largest, to: [1])
        net.run()
        #expect(net.received(1).count == 1 && net.received(1)[0].data == largest)

        // A peer that sends more is closed with a protocol error, and is no longer connected.
        let bobLink = try #require(net.machine(1).allLinks.first)
        let chunk = [UInt8](repeating: 0xAB, count: WireFormat.maxFramePayload)
        var actions: [SessionAction] = []
        for _ in 0..<(limit / chunk.count) {
            actions = net.nodes[1].machine.frameReceived(.message(id: 77, flags: .more, chunk: FramePayload(chunk)), on: bobLink, at: net.now)
            #expect(actions.isEmpty)
        }
        #expect(net.machine(1).bufferedMessageBytes(from: net.peer(0)) == limit)
        actions = net.nodes[1].machine.frameReceived(.message(id: 77, flags: [], chunk: [1]), on: bobLink, at: net.now)
        #expect(actions.contains { if case .closeLink(bobLink, .protocolError, _) = $0 { return true } else { return false } })
        #expect(actions.contains { if case .event(.peerStateChanged(_, .notConnected, _)) = $0 { return true } else { return false } })
        #expect(net.machine(1).connectedPeers.isEmpty)
    }

    @Test func sendingToAPeerThatIsNotConnectedFailsAsAWhole() throws {
        var net = try SessionNet(["alice", "bob", "carol"])
        _ = try net.invite(0, 1)
        net.run()
        try net.respond(1, net.invitationsReceived(1)[0].id, accept: true)
        net.run()
        _ = try Self.drain(&net, 0)
        let error = #expect(throws: PeerLinkError.self) { try net.send(0, [1, 2, 3], to: [1, 2]) }
        #expect(error?.code == .notConnected)
        #expect(error?.message.contains("carol") == true)
        let link = try #require(net.machine(0).allLinks.first)
        #expect(net.nodes[0].machine.nextFrame(for: link) == nil, "nothing was queued for bob either")
        #expect(throws: PeerLinkError.self) { try net.send(0, [1], to: [2], reliable: false) }
        #expect(throws: PeerLinkError.self) { try net.send(0, [1], to: []) }
    }

    @Test func datagramsAndChunksTakeTurnsSoAFloodNeverHoldsUpReliableMessages() throws {
        var net = try Self.connectedPair()
        let link = try #require(net.machine(0).allLinks.first)
        _ = try Self.drain(&net, 0)
        try net.send(0, Self.bytes(3 * WireFormat.maxFramePayload, seed: 5), to: [1])
        var kinds: [String] = []
        for round in 0..<6 {
            // The app floods datagrams faster than the link takes frames.
            for index in 0..<4 { try net.send(0, [UInt8(round), UInt8(index)], to: [1], reliable: false) }
            guard let frame = net.nodes[0].machine.nextFrame(for: link) else { break }
            if case .message = frame { kinds.append("chunk") } else if case .datagram = frame { kinds.append("datagram") }
        }
        // The three chunks of the message went out within the first six frames.
        #expect(kinds == ["datagram", "chunk", "datagram", "chunk", "datagram", "chunk"])
        // Lane of 8: 24 sent, 3 taken, 8 waiting, the rest dropped and counted for that peer.
        #expect(net.machine(0).droppedDatagrams == 13)
        #expect(net.machine(0).droppedDatagrams(to: net.peer(1)) == 13)
    }

    @Test func datagramsGoFirstAreBoundedAndDropWhenTooLarge() throws {
        var net = try Self.connectedPair()
        let link = try #require(net.machine(0).allLinks.first)
        _ = try Self.drain(&net, 0)

        // Too large for one frame: an error, counted as dropped.
        let tooLarge = #expect(throws: PeerLinkError.self) {
            try net.send(0, [UInt8](repeating: 0, count: WireFormat.maxFramePayload + 1), to: [1], reliable: false)
        }
        #expect(tooLarge?.code == .invalidParameter)
        #expect(net.machine(0).droppedDatagrams == 1)

        // A datagram never waits behind reliable chunks.
        try net.send(0, Self.bytes(1_000_000, seed: 2), to: [1])
        _ = net.nodes[0].machine.nextFrame(for: link)
        try net.send(0, [42], to: [1], reliable: false)
        #expect(net.nodes[0].machine.nextFrame(for: link) == .datagram([42]))

        // The lane holds 8; more are dropped and counted, not errors.
        for index in 0..<10 { try net.send(0, [UInt8(index)], to: [1], reliable: false) }
        #expect(net.machine(0).droppedDatagrams == 3)
        var datagrams: [[UInt8]] = []
        while let frame = net.nodes[0].machine.nextFrame(for: link) {
            if case .datagram(let bytes) = frame { datagrams.append(bytes) }
        }
        #expect(datagrams == (0..<8).map { [UInt8($0)] })

        // Received as unreliable.
        let bobLink = try #require(net.machine(1).allLinks.first)
        let actions = net.nodes[1].machine.frameReceived(.datagram([9, 9]), on: bobLink, at: net.now)
        #expect(actions == [.event(.messageReceived(net.peer(0), [9, 9], reliable: false))])
    }

    @Test func messagesFromPeersOutsideTheSessionAreIgnored() throws {
        var net = try SessionNet(["alice", "stranger"])
        net.openLink(from: 1, to: 0)
        net.run()
        let link = try #require(net.machine(0).allLinks.first)
        let actions = net.nodes[0].machine.frameReceived(.message(id: 1, flags: [], chunk: [1]), on: link, at: net.now)
        #expect(actions.isEmpty)
        #expect(net.machine(0).ignoredMessages == 1)
    }

    /// A peer that starts messages and never ends them is held to the partial-message limits:
    /// over the link's, or over the session's with several links, its link is closed with code
    /// 11 and what it held is dropped; finished messages are delivered as before.
    @Test func partialMessagesAreHeldToTheirLimits() throws {
        var net = try SessionNet(["alice", "bob", "carol"])
        for index in 0..<3 { net.nodes[index].machine.partialMessageLimits = (perLink: 10_000, perSession: 15_000) }
        _ = try net.invite(0, 1)
        net.run()
        try net.respond(1, net.invitationsReceived(1)[0].id, accept: true)
        net.run()
        _ = try net.invite(0, 2)
        net.run()
        try net.respond(2, net.invitationsReceived(2)[0].id, accept: true)
        net.run()
        try #require(net.connected(0) == [1, 2])
        let links = net.machine(0).allLinks
        try #require(links.count == 2)
        let (fromBob, fromCarol) = (links[0], links[1])

        // A finished message of any size under 16 MiB is not "partial" once complete.
        var actions = net.nodes[0].machine.frameReceived(.message(id: 1, flags: .more, chunk: FramePayload(repeating: 1, count: 6_000)), on: fromBob, at: net.now)
        #expect(actions.isEmpty)
        #expect(net.machine(0).bufferedMessageBytes == 6_000)
        actions = net.nodes[0].machine.frameReceived(.message(id: 1, flags: [], chunk: FramePayload(repeating: 1, count: 6_000)), on: fromBob, at: net.now)
        #expect(actions.count == 1)
        #expect(net.machine(0).bufferedMessageBytes == 0)

        // Over the session's limit with two links: the link that went over is closed.
        _ = net.nodes[0].machine.frameReceived(.message(id: 2, flags: .more, chunk: FramePayload(repeating: 2, count: 9_000)), on: fromBob, at: net.now)
        actions = net.nodes[0].machine.frameReceived(.message(id: 7, flags: .more, chunk: FramePayload(repeating: 3, count: 7_000)), on: fromCarol, at: net.now)
        #expect(actions.contains { if case .closeLink(fromCarol, .resourceLimit, _) = $0 { true } else { false } }, "\(actions)")
        #expect(net.machine(0).bufferedMessageBytes == 9_000)

        // Over the link's limit: closed, and its bytes released.
        actions = net.nodes[0].machine.frameReceived(.message(id: 3, flags: .more, chunk: FramePayload(repeating: 4, count: 1_500)), on: fromBob, at: net.now)
        #expect(actions.contains { if case .closeLink(fromBob, .resourceLimit, _) = $0 { true } else { false } }, "\(actions)")
        #expect(net.machine(0).bufferedMessageBytes == 0)
        #expect(net.machine(0).bufferedMessageBytes(from: net.peer(1)) == 0)
    }

    /// A run of frames taken in at once (as a session takes the chunks its links hand it) acts
    /// exactly as the same frames one at a time: the same actions in the same order and the
    /// same state after, a limit that closes the link in the middle of the run included.
    @Test(arguments: [false, true])
    func aRunOfFramesActsAsEachInTurn(overLimit: Bool) throws {
        var net = try Self.connectedPair()
        if overLimit { net.nodes[1].machine.partialMessageLimits = (perLink: 50_000, perSession: 60_000) }
        for (index, size) in [10, 40_000, 0, 16_384, 70_000, 5].enumerated() {
            try net.send(0, Self.bytes(size, seed: index), to: [1])
        }
        try net.send(0, Self.bytes(300, seed: 50), to: [1], reliable: false)
        let (_, frames) = try Self.drain(&net, 0)
        let link = try #require(net.machine(1).allLinks.first)
        // A chunk of a message that never ends, as a peer breaking the limit would send.
        let run = frames + [.message(id: 999, flags: .more, chunk: FramePayload(Self.bytes(16_384, seed: 7)))] + frames.prefix(2)
        var oneByOne = net.nodes[1].machine
        var together = net.nodes[1].machine
        var actionsOneByOne: [SessionAction] = []
        for frame in run { actionsOneByOne += oneByOne.frameReceived(frame, on: link, at: net.now) }
        let actionsTogether = together.framesReceived(run, on: link, at: net.now)
        #expect(actionsTogether == actionsOneByOne)
        #expect(actionsTogether.contains { if case .closeLink(link, .resourceLimit, _) = $0 { true } else { false } } == overLimit)
        #expect(together.bufferedMessageBytes == oneByOne.bufferedMessageBytes)
        #expect(together.nextDeadline == oneByOne.nextDeadline)
        #expect(together.connectedPeers == oneByOne.connectedPeers)
        let delivered = actionsTogether.filter { if case .event(.messageReceived) = $0 { true } else { false } }.count
        // Every message (and the datagram), or those before the close.
        #expect(overLimit ? delivered >= 1 : delivered >= 7, "\(delivered) messages delivered")
    }
}
