import PeerLinkCore
import Testing

/// Two stream tables wired to each other by hand: what one sends, the test delivers.
private struct TablePair {
    var dialer = StreamTable(role: .dialer)
    var listener = StreamTable(role: .listener)

    /// Opens a stream from the dialer and lets the listener accept it; returns its id.
    mutating func openAccepted(_ name: String = "file") throws -> UInt32 {
        let (id, syn) = try dialer.open(name: name)
        let atListener = try listener.receive(syn)
        #expect(atListener.events == [.opened(id: id, name: name)])
        #expect(atListener.frames == [.windowUpdate(stream: id, flags: .ack, credit: 0)])
        let atDialer = try dialer.receive(atListener.frames[0])
        #expect(atDialer.events == [.accepted(id: id)])
        return id
    }
}

@Suite("Streams: table, credit and windows")
struct StreamTableTests {
    static let window = WireFormat.initialStreamWindow

    @Test func idsFollowTheRole() throws {
        var dialer = StreamTable(role: .dialer)
        var listener = StreamTable(role: .listener)
        #expect(try (0..<3).map { _ in try dialer.open(name: "a").id } == [1, 3, 5])
        #expect(try (0..<3).map { _ in try listener.open(name: "b").id } == [2, 4, 6])
    }

    @Test func synCarriesTheNameAndAnAckAcceptsIt() throws {
        var pair = TablePair()
        let (id, syn) = try pair.dialer.open(name: "photo.jpg")
        #expect(syn == .data(stream: id, flags: .syn, payload: FramePayload("photo.jpg".utf8)))
        #expect(pair.dialer[id]?.isAccepted == false)
        let outcome = try pair.listener.receive(syn)
        #expect(outcome.events == [.opened(id: id, name: "photo.jpg")])
        #expect(try pair.dialer.receive(outcome.frames[0]).events == [.accepted(id: id)])
        #expect(pair.dialer[id]?.isAccepted == true)
        // The name does not count against the window.
        #expect(pair.listener[id]?.receiveWindow == Self.window)
    }

    @Test func badNamesAreRefusedWhenOpening() {
        var table = StreamTable(role: .dialer)
        #expect(throws: PeerLinkError.self) { try table.open(name: "") }
        #expect(throws: PeerLinkError.self) { try table.open(name: String(repeating: "x", count: 256)) }
        #expect((try? table.open(name: String(repeating: "é", count: 127))) != nil)  // 254 bytes
    }

    @Test func creditIsTheWindowAndComesBackWithWindowUpdates() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        #expect(pair.dialer.takeCredit(id, upTo: 200_000) == 200_000)
        #expect(pair.dialer.takeCredit(id, upTo: 100_000) == Self.window - 200_000)
        #expect(pair.dialer.takeCredit(id, upTo: 1) == 0)
        // The listener receives a window's worth and reads it in pieces.
        for _ in 0..<16 {
            let outcome = try pair.listener.receive(.data(stream: id, flags: [], payload: FramePayload(repeating: 7, count: 16384)))
            #expect(outcome.events == [.data(id: id, bytes: [UInt8](repeating: 7, count: 16384))])
        }
        #expect(pair.listener[id]?.receiveWindow == 0)
        // Less than half the window consumed: nothing granted yet.
        #expect(pair.listener.consumed(id, count: Self.window / 2 - 1) == nil)
        let granted = pair.listener.consumed(id, count: 1)
        let update = try #require(granted)
        #expect(update == .windowUpdate(stream: id, flags: [], credit: UInt32(Self.window / 2)))
        #expect(pair.listener[id]?.receiveWindow == Self.window / 2)
        #expect(try pair.dialer.receive(update).events == [.credit(id: id)])
        #expect(pair.dialer.takeCredit(id, upTo: .max) == Self.window / 2)
    }

    @Test func bytesOverTheWindowAreAProtocolError() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        for _ in 0..<16 { _ = try pair.listener.receive(.data(stream: id, flags: [], payload: FramePayload(repeating: 0, count: 16384))) }
        let error = try #require(throws: WireError.self) { try pair.listener.receive(.data(stream: id, flags: [], payload: [1])) }
        #expect(error.code == .protocolError)
        #expect(error.reason.contains("window"), "\(error.reason)")
    }

    @Test func finEndsOneDirectionAndBothEndTheStream() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        let fin = try pair.dialer.finish(id)
        #expect(fin == .data(stream: id, flags: .fin, payload: []))
        #expect(throws: PeerLinkError.self) { try pair.dialer.finish(id) }
        #expect(pair.dialer.takeCredit(id, upTo: 10) == 0)
        #expect(try pair.listener.receive(fin).events == [.finished(id: id)])
        // Bytes after FIN are a protocol error; the other direction still works.
        #expect(throws: WireError.self) { try pair.listener.receive(.data(stream: id, flags: [], payload: [1])) }
        var again = TablePair()
        let other = try again.openAccepted()
        _ = try again.listener.receive(try again.dialer.finish(other))
        #expect(again.listener.takeCredit(other, upTo: 5) == 5)
        #expect(try again.dialer.receive(.data(stream: other, flags: [], payload: [1, 2, 3, 4, 5])).events == [
            .data(id: other, bytes: [1, 2, 3, 4, 5])
        ])
        // The listener finishes too: the stream is gone on both sides.
        let listenerFin = try again.listener.finish(other)
        #expect(again.listener[other] == nil)
        #expect(try again.dialer.receive(listenerFin).events == [.finished(id: other)])
        #expect(again.dialer[other] == nil)
    }

    @Test func resetCarriesAReasonAndLateFramesAreIgnored() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        let reset = pair.listener.reset(id, reason: "disk full")
        let rst = try #require(reset)
        #expect(rst == .data(stream: id, flags: .rst, payload: FramePayload("disk full".utf8)))
        #expect(pair.listener[id] == nil)
        #expect(pair.listener.reset(id, reason: "again") == nil)
        #expect(try pair.dialer.receive(rst).events == [.reset(id: id, reason: "disk full")])
        #expect(pair.dialer[id] == nil)
        // Data and credit that were on their way are ignored, not errors.
        #expect(try pair.listener.receive(.data(stream: id, flags: [], payload: [1])) == StreamTable.Outcome())
        #expect(try pair.dialer.receive(.windowUpdate(stream: id, flags: [], credit: 10)) == StreamTable.Outcome())
    }

    @Test func tooManyStreamsAreRefusedWithRST() throws {
        var dialer = StreamTable(role: .dialer, maxStreams: 2)
        var listener = StreamTable(role: .listener, maxStreams: 2)
        let first = try dialer.open(name: "1")
        let second = try dialer.open(name: "2")
        #expect(throws: PeerLinkError.self) { try dialer.open(name: "3") }
        _ = try listener.receive(first.frame)
        _ = try listener.receive(second.frame)
        // A peer that opens more than allowed is answered with RST, and nothing opens.
        let third = try listener.receive(.data(stream: 5, flags: .syn, payload: FramePayload("3".utf8)))
        #expect(third.events.isEmpty)
        guard case .data(5, let flags, let reason)? = third.frames.first, flags == .rst else {
            Issue.record("expected an RST for stream 5, got \(third.frames)")
            return
        }
        #expect(String(decoding: reason.array, as: UTF8.self).contains("too many streams"))
        #expect(try dialer.receive(third.frames[0]).events.isEmpty)  // 5 was never opened there
        #expect(listener.openCounts.incoming == 2)
    }

    @Test func synViolationsAreProtocolErrors() throws {
        var listener = StreamTable(role: .listener)
        // The dialer opens odd ids only.
        #expect(throws: WireError.self) { try listener.receive(.data(stream: 2, flags: .syn, payload: [0x61])) }
        _ = try listener.receive(.data(stream: 3, flags: .syn, payload: [0x61]))
        // Ids only go up.
        #expect(throws: WireError.self) { try listener.receive(.data(stream: 1, flags: .syn, payload: [0x61])) }
        #expect(throws: WireError.self) { try listener.receive(.data(stream: 3, flags: .syn, payload: [0x61])) }
        // A name is 1 to 255 bytes of UTF-8.
        #expect(throws: WireError.self) { try listener.receive(.data(stream: 5, flags: .syn, payload: [])) }
        #expect(throws: WireError.self) { try listener.receive(.data(stream: 7, flags: .syn, payload: [0xFF, 0xFE])) }
        #expect(throws: WireError.self) {
            try listener.receive(.data(stream: 9, flags: .syn, payload: FramePayload(repeating: 0x61, count: 256)))
        }
        // A stream opens with DATA, not WINDOW_UPDATE.
        #expect(throws: WireError.self) { try listener.receive(.windowUpdate(stream: 11, flags: .syn, credit: 0)) }
    }

    @Test func aWindowCannotGrowPastTheLimit() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        _ = try pair.dialer.receive(.windowUpdate(stream: id, flags: [], credit: UInt32.max - UInt32(Self.window)))
        #expect(throws: WireError.self) { try pair.dialer.receive(.windowUpdate(stream: id, flags: [], credit: 1)) }
    }

    /// Moves `total` bytes from the dialer to the listener in 16 KiB frames as fast as the
    /// credit allows, the listener's reader taking each frame `perFrame` after the one before;
    /// returns the credit the listener granted beyond what its reader consumed. Bytes over
    /// the window would throw.
    private static func stream(
        _ pair: inout TablePair, _ id: UInt32, bytes total: Int, perFrame: Duration, from start: inout Duration
    ) throws -> Int {
        let frame = 16384
        var moved = 0
        var extra = 0
        while moved < total {
            let credit = pair.dialer.takeCredit(id, upTo: frame)
            try #require(credit == frame, "the dialer ran out of credit after \(moved) bytes")
            _ = try pair.listener.receive(.data(stream: id, flags: [], payload: FramePayload(repeating: 1, count: credit)))
            start += perFrame
            if let update = pair.listener.consumed(id, count: credit, at: start) {
                guard case .windowUpdate(_, _, let granted) = update else { Issue.record("\(update)"); return extra }
                extra += Int(granted)
                _ = try pair.dialer.receive(update)
            }
            moved += credit
            extra -= credit
        }
        return extra
    }

    @Test func aFastReadersWindowGrowsToWhatItReadsInTheTargetDelay() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        var now = Duration.seconds(1)
        // 16 KiB every 10 µs: 1.6 GB/s, so 0.75 ms of reading is about 1.2 MB.
        let grown = try Self.stream(&pair, id, bytes: 64 << 20, perFrame: .microseconds(10), from: &now)
        let limit = try #require(pair.listener[id]?.receiveLimit)
        #expect((1_000_000...1_400_000).contains(limit), "\(limit)")
        // what the grants gave beyond the bytes read is the window's growth, less what is
        // consumed and not granted yet
        #expect(grown + (pair.listener[id]?.unacknowledged ?? 0) == limit - Self.window)
        // The reader slows to 16 KiB a millisecond (the pair moved to a slower link): within
        // 3 MiB the window is back to the initial one, shrinking at every grant; the sender is
        // never short of credit for what it may still send.
        _ = try Self.stream(&pair, id, bytes: 3 << 20, perFrame: .milliseconds(1), from: &now)
        #expect(pair.listener[id]?.receiveLimit == Self.window)
    }

    @Test func aSlowReaderOrFixedTuningKeepsTheInitialWindow() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        var now = Duration.zero
        // 16 KiB a millisecond: 16 MB/s, 12 KB in 0.75 ms.
        #expect(try Self.stream(&pair, id, bytes: 8 << 20, perFrame: .milliseconds(1), from: &now) <= 0)
        #expect(pair.listener[id]?.receiveLimit == Self.window)
        var fixed = TablePair(
            dialer: StreamTable(role: .dialer), listener: StreamTable(role: .listener, tuning: .fixed))
        let other = try fixed.openAccepted()
        _ = try Self.stream(&fixed, other, bytes: 8 << 20, perFrame: .nanoseconds(1), from: &now)
        #expect(fixed.listener[other]?.receiveLimit == Self.window)
    }

    @Test func growthIsBoundedPerStreamAndForAllStreams() throws {
        let tuning = StreamTable.WindowTuning(targetDelay: .milliseconds(1), maximumWindow: 1 << 20, maximumGrowth: 1 << 20)
        var pair = TablePair(dialer: StreamTable(role: .dialer), listener: StreamTable(role: .listener, tuning: tuning))
        let first = try pair.openAccepted("a")
        let second = try pair.openAccepted("b")
        var now = Duration.zero
        // Reading without any time passing: as fast as can be.
        _ = try Self.stream(&pair, first, bytes: 32 << 20, perFrame: .zero, from: &now)
        #expect(pair.listener[first]?.receiveLimit == 1 << 20)
        // The first stream's window grew by 768 KiB of the 1 MiB allowed: the second's grows by
        // the 256 KiB left.
        _ = try Self.stream(&pair, second, bytes: 32 << 20, perFrame: .zero, from: &now)
        #expect(pair.listener[second]?.receiveLimit == 2 * Self.window)
        // Once the first is gone, its growth is free for the second.
        _ = pair.listener.reset(first, reason: "done")
        _ = try Self.stream(&pair, second, bytes: 32 << 20, perFrame: .zero, from: &now)
        #expect(pair.listener[second]?.receiveLimit == 1 << 20)
    }

    @Test func noUpdatesAfterThePeerFinished() throws {
        var pair = TablePair()
        let id = try pair.openAccepted()
        _ = try pair.listener.receive(.data(stream: id, flags: .fin, payload: FramePayload(repeating: 1, count: 16384)))
        #expect(pair.listener.consumed(id, count: Self.window) == nil)
    }
}

@Suite("Streams: frame scheduler order")
struct FrameSchedulerTests {
    static func data(_ stream: UInt32, _ byte: UInt8, count: Int = 4, flags: FrameFlags = []) -> Frame {
        .data(stream: stream, flags: flags, payload: FramePayload(repeating: byte, count: count))
    }

    @Test func controlThenMessagesThenDataRoundRobin() {
        var scheduler = FrameScheduler()
        scheduler.enqueue(Self.data(1, 1))
        scheduler.enqueue(Self.data(1, 2))
        scheduler.enqueue(Self.data(1, 3))
        scheduler.enqueue(Self.data(3, 4))
        scheduler.enqueue(Self.data(3, 5))
        scheduler.enqueue(.message(id: 1, flags: [], chunk: [9]))
        scheduler.enqueue(.datagram([8]))
        scheduler.enqueue(.windowUpdate(stream: 2, flags: [], credit: 100))
        scheduler.enqueue(.ping(flags: .syn, opaque: 1))
        #expect(scheduler.queuedDataBytes == 20)
        var order: [Frame] = []
        while let frame = scheduler.next() { order.append(frame) }
        #expect(order == [
            .windowUpdate(stream: 2, flags: [], credit: 100), .ping(flags: .syn, opaque: 1),
            .message(id: 1, flags: [], chunk: [9]), .datagram([8]),
            Self.data(1, 1), Self.data(3, 4), Self.data(1, 2), Self.data(3, 5), Self.data(1, 3),
        ])
        #expect(scheduler.queuedDataBytes == 0 && scheduler.queuedPriorityBytes == 0 && scheduler.isEmpty)
    }

    @Test func aMessageQueuedDuringBulkDataGoesNext() {
        var scheduler = FrameScheduler()
        for index in 0..<64 { scheduler.enqueue(Self.data(1, UInt8(index), count: 16384)) }
        _ = scheduler.next()
        scheduler.enqueue(.message(id: 7, flags: [], chunk: FramePayload("hi".utf8)))
        #expect(scheduler.next() == .message(id: 7, flags: [], chunk: FramePayload("hi".utf8)))
        #expect(scheduler.queuedDataBytes == 63 * 16384)
    }

    @Test func aResetJumpsAheadAndDropsTheStreamsData() {
        var scheduler = FrameScheduler()
        scheduler.enqueue(Self.data(1, 1, flags: .syn))
        scheduler.enqueue(Self.data(1, 2))
        scheduler.enqueue(Self.data(3, 3))
        scheduler.enqueue(Self.data(1, 4, flags: .fin))
        scheduler.enqueue(.data(stream: 1, flags: .rst, payload: FramePayload("stop".utf8)))
        #expect(scheduler.queuedDataBytes == 4)
        #expect(scheduler.next() == .data(stream: 1, flags: .rst, payload: FramePayload("stop".utf8)))
        #expect(scheduler.next() == Self.data(3, 3))
        #expect(scheduler.next() == nil)
    }

    @Test func finStaysBehindItsStreamsData() {
        var scheduler = FrameScheduler()
        scheduler.enqueue(Self.data(1, 1))
        scheduler.enqueue(.data(stream: 1, flags: .fin, payload: []))
        scheduler.enqueue(.message(id: 1, flags: [], chunk: [0]))
        #expect(scheduler.next() == .message(id: 1, flags: [], chunk: [0]))
        #expect(scheduler.next() == Self.data(1, 1))
        #expect(scheduler.next() == .data(stream: 1, flags: .fin, payload: []))
    }
}
