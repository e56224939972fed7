import Testing

@testable import PeerLinkCore

/// Frames larger than 16384 bytes: asked for in the hello (field 4), used only on a link whose
/// two sides both asked, and cut back to 16384 where a link that takes no more writes them.
@Suite("Wire: large frames")
struct LargeFrameTests {
    static func hello(_ name: String, large: Int?) -> Hello {
        Hello(displayName: try! DisplayName(name), session: WireFixture.session, maxFramePayload: large)
    }

    static func pair(_ encryption: EncryptionPreference, dialer: Int?, listener: Int?) -> LinkPair {
        var pair = LinkPair(
            dialer: WireFixture.preface(encryption), listener: WireFixture.preface(encryption),
            dialerHello: hello("Ana", large: dialer), listenerHello: hello("Bo", large: listener))
        pair.connect()
        #expect(pair.dialer.state == .established)
        #expect(pair.listener.state == .established)
        return pair
    }

    // MARK: - The hello's field

    @Test func theHelloCarriesTheLimitAndOlderHellosDoNot() throws {
        let large = Self.hello("Ana", large: WireFormat.largeFramePayload)
        #expect(try Hello.decode(large.encoded()) == large)
        #expect(try Hello.decode(large.encoded()).maxFramePayload == 61440)
        #expect(try Hello.decode(Self.hello("Ana", large: nil).encoded()).maxFramePayload == nil)
        // a limit above what this side takes is kept as the peer said it
        #expect(try Hello.decode(Self.hello("Ana", large: 1 << 20).encoded()).maxFramePayload == 1 << 20)
    }

    @Test func aMalformedLimitIsRefused() {
        let name = Self.hello("Ana", large: nil).encoded()
        let cases: [(bytes: [UInt8], reason: String)] = [
            (name + [4, 0, 2, 0xF0, 0x00], "the hello's frame payload limit is 2 bytes, not 4"),
            (name + [4, 0, 4, 0, 0, 0x3F, 0xFF], "the hello's frame payload limit is 16383, below the 16384 every peer takes"),
            (name + [4, 0, 4, 0, 0, 0xF0, 0] + [4, 0, 4, 0, 0, 0xF0, 0], "the hello has two frame payload limits"),
        ]
        for (bytes, reason) in cases {
            #expect(throws: WireError.malformed(reason)) { try Hello.decode(bytes) }
        }
    }

    @Test func theLinkLimitIsTheSmallerOfTwoAndOnlyWhenBothAsk() {
        let limit = { (a: Int?, b: Int?) in Hello.framePayloadLimit(Self.hello("Ana", large: a), Self.hello("Bo", large: b)) }
        #expect(limit(nil, nil) == 16384)
        #expect(limit(61440, nil) == 16384)
        #expect(limit(nil, 61440) == 16384)
        #expect(limit(61440, 61440) == 61440)
        #expect(limit(61440, 20000) == 20000)
        #expect(limit(20000, 1 << 20) == 20000)
        // never more than one record carries
        #expect(limit(1 << 20, 1 << 20) == 65499)
    }

    // MARK: - On a link

    @Test(arguments: [EncryptionPreference.none, .required])
    func bothSidesAskingCarryLargeFramesBothWays(_ encryption: EncryptionPreference) throws {
        var pair = Self.pair(encryption, dialer: WireFormat.largeFramePayload, listener: WireFormat.largeFramePayload)
        #expect(pair.dialer.framePayloadLimit == 61440)
        #expect(pair.listener.framePayloadLimit == 61440)
        var generator = SeededGenerator(seed: 61440)
        let message = Frame.message(id: 1, flags: .more, chunk: FramePayload(generator.bytes(61440)))
        let data = Frame.data(stream: 3, flags: [], payload: FramePayload(generator.bytes(50000)))
        try pair.dialerSends(message)
        try pair.listenerSends(data)
        #expect(pair.listenerEvents.suffix(1) == [.sequenced(message, sequence: 1)])
        #expect(pair.dialerEvents.suffix(1) == [.sequenced(data, sequence: 1)])
        // over the limit, and a datagram over 16384, still cannot be sent
        #expect(throws: WireError.self) {
            try pair.dialer.send(.message(id: 1, flags: [], chunk: FramePayload(repeating: 1, count: 61441)), sequence: 2, at: .zero)
        }
        #expect(throws: WireError.self) { try pair.dialer.send(.datagram([UInt8](repeating: 1, count: 16385)), at: .zero) }
        #expect(pair.dialer.state == .established)
    }

    @Test(arguments: [(61440, nil), (nil, 61440), (nil, nil)] as [(Int?, Int?)])
    func aSideThatDoesNotAskGetsNoLargeFrame(_ dialer: Int?, _ listener: Int?) throws {
        var pair = Self.pair(.required, dialer: dialer, listener: listener)
        #expect(pair.dialer.framePayloadLimit == 16384)
        #expect(pair.listener.framePayloadLimit == 16384)
        #expect(throws: WireError.self) {
            try pair.dialer.send(.message(id: 1, flags: [], chunk: FramePayload(repeating: 1, count: 16385)), sequence: 1, at: .zero)
        }
        #expect(pair.dialer.state == .established)
    }

    @Test func aLargeFrameFromAPeerThatDidNotAskClosesTheLink() throws {
        // The dialer asked for large frames, the listener did not: the listener takes none.
        var pair = Self.pair(.none, dialer: WireFormat.largeFramePayload, listener: nil)
        let frame = WireFixture.rawFrame(type: 5, stream: 1, sequence: 1, payload: [UInt8](repeating: 7, count: 16385))
        let outputs = pair.listener.receive(WireFixture.record(frame), at: .zero)
        #expect(outputs.closure?.code == .protocolError)
        #expect(outputs.closure?.reason == "a MESSAGE frame of 16385 bytes is over the limit of 16384")
    }

    @Test func overTheLargeLimitOrALargeFrameOfAnotherTypeClosesTheLink() throws {
        for (type, length, reason) in [
            (UInt8(5), 61441, "a MESSAGE frame of 61441 bytes is over the limit of 61440"),
            (UInt8(6), 16385, "a DATAGRAM frame of 16385 bytes is over the limit of 16384"),
        ] {
            var pair = Self.pair(.none, dialer: WireFormat.largeFramePayload, listener: WireFormat.largeFramePayload)
            let frame = WireFixture.rawFrame(
                type: type, stream: type == 5 ? 1 : 0, sequence: type == 5 ? 1 : nil, payload: [UInt8](repeating: 7, count: length))
            let outputs = pair.listener.receive(WireFixture.record(frame), at: .zero)
            #expect(outputs.closure?.code == .protocolError)
            #expect(outputs.closure?.reason == reason)
        }
    }

    // MARK: - Cut where a link takes them

    @Test func framesAreCutWhereTheyAreTakenAndMeanTheSame() throws {
        var generator = SeededGenerator(seed: 7)
        let messageBytes = generator.bytes(40000)
        let streamBytes = generator.bytes(40000)
        var scheduler = FrameScheduler()
        scheduler.enqueue(.message(id: 9, flags: [], chunk: FramePayload(messageBytes)))
        scheduler.enqueue(.data(stream: 3, flags: .fin, payload: FramePayload(streamBytes)))
        scheduler.enqueue(.data(stream: 5, flags: [], payload: FramePayload(generator.bytes(100))))
        #expect(scheduler.queuedDataBytes == 40100)
        var taken: [Frame] = []
        while let frame = scheduler.next(maxPayload: 16384) { taken.append(frame) }
        #expect(scheduler.queuedDataBytes == 0)
        #expect(scheduler.queuedPriorityBytes == 0)
        #expect(scheduler.isEmpty)

        var message: [UInt8] = []
        var stream: [UInt8] = []
        var messageFlags: [FrameFlags] = []
        var streamFlags: [FrameFlags] = []
        for frame in taken {
            switch frame {
            case .message(let id, let flags, let chunk):
                #expect(id == 9 && chunk.count <= 16384)
                chunk.append(to: &message)
                messageFlags.append(flags)
            case .data(3, let flags, let payload):
                #expect(payload.count <= 16384)
                payload.append(to: &stream)
                streamFlags.append(flags)
            case .data(5, _, let payload):
                #expect(payload.count == 100)
            default:
                Issue.record("unexpected \(frame)")
            }
        }
        #expect(message == messageBytes)
        #expect(stream == streamBytes)
        #expect(messageFlags == [.more, .more, []])
        #expect(streamFlags == [[], [], .fin])
        // the message lane first, then the streams take turns a frame at a time
        #expect(taken.prefix(3).allSatisfy { $0.type == .message })
    }

    @Test func framesThatFitOrOpenOrResetAStreamAreNotCut() {
        #expect(Frame.message(id: 1, flags: [], chunk: FramePayload(repeating: 0, count: 16384)).cut(at: 16384) == nil)
        #expect(Frame.data(stream: 1, flags: .syn, payload: FramePayload(repeating: 0, count: 200)).cut(at: 100) == nil)
        #expect(Frame.data(stream: 1, flags: .rst, payload: FramePayload(repeating: 0, count: 200)).cut(at: 100) == nil)
        #expect(Frame.datagram([UInt8](repeating: 0, count: 200)).cut(at: 100) == nil)
        let cut = Frame.message(id: 1, flags: [], chunk: FramePayload([1, 2, 3])).cut(at: 1)
        #expect(cut?.head == .message(id: 1, flags: .more, chunk: [1]))
        #expect(cut?.tail == .message(id: 1, flags: [], chunk: [2, 3]))
    }

    @Test func aPartOfAPayloadIsCutAgainInPlace() {
        let whole = FramePayload([UInt8](0..<10))
        let (head, tail) = whole.split(at: 4)
        #expect(head == FramePayload([0, 1, 2, 3]))
        #expect(tail == FramePayload([4, 5, 6, 7, 8, 9]))
        let (middle, end) = tail.split(at: 2)
        #expect(middle == FramePayload([4, 5]))
        #expect(end == FramePayload([6, 7, 8, 9]))
    }

    // MARK: - Messages cut for the link

    @Test func aSessionCutsMessagesToTheLinksLimit() {
        var outbox = PeerOutbox()
        outbox.enqueueMessage([UInt8](repeating: 1, count: 100_000))
        var id: UInt32 = 1
        var sizes: [Int] = []
        while case .message(_, _, let chunk)? = outbox.takeChunk(nextID: &id, maxChunk: WireFormat.largeFramePayload) {
            sizes.append(chunk.count)
        }
        #expect(sizes == [61440, 100_000 - 61440])
    }
}
