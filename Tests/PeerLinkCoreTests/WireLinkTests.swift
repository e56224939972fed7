import PeerLinkCore
import Testing

/// The arguments of the all-combinations test: both preferences and how bytes are cut.
struct PreferenceCase: Sendable, CustomTestStringConvertible {
    let dialer: EncryptionPreference
    let listener: EncryptionPreference
    let granularity: Granularity

    var testDescription: String { "\(dialer) × \(listener), \(granularity.testDescription)" }

    static let all: [PreferenceCase] = EncryptionPreference.allCases.flatMap { dialer in
        EncryptionPreference.allCases.flatMap { listener in
            Granularity.all.map { PreferenceCase(dialer: dialer, listener: listener, granularity: $0) }
        }
    }
}

@Suite("LinkStateMachine: preface, handshake and records between two machines")
struct WireLinkTests {
    /// The `.established` event's fields, compared in full (PeerID equality ignores names).
    static func established(_ events: [LinkOutput]) -> (remote: PeerID, hello: Hello, encrypted: Bool, version: UInt8)? {
        for event in events {
            if case .established(let remote, let hello, let encrypted, let version) = event {
                return (remote, hello, encrypted, version)
            }
        }
        return nil
    }

    @Test(arguments: PreferenceCase.all)
    func everyPreferencePair(_ input: PreferenceCase) throws {
        var pair = LinkPair(
            dialer: WireFixture.preface(input.dialer), listener: WireFixture.preface(input.listener),
            granularity: input.granularity)
        pair.connect()

        guard let encrypted = EncryptionPreference.agreement(input.dialer, input.listener) else {
            // required × none: both sides refuse, each telling its user why.
            for (side, events) in [("dialer", pair.dialerEvents), ("listener", pair.listenerEvents)] {
                #expect(events.count == 1, "\(side): \(events)")
                let closure = try #require(events.closure)
                #expect(closure.code == .encryptionMismatch)
                #expect(!closure.byPeer)
                #expect(closure.reason.contains("encryption"))
            }
            #expect(pair.dialer.state == .closed)
            #expect(pair.listener.state == .closed)
            return
        }

        let atDialer = try #require(Self.established(pair.dialerEvents), "\(pair.dialerEvents)")
        let atListener = try #require(Self.established(pair.listenerEvents), "\(pair.listenerEvents)")
        #expect(pair.dialerEvents.count == 1)
        #expect(pair.listenerEvents.count == 1)
        #expect(atDialer.remote == pair.listenerPeer)
        #expect(atDialer.remote.displayName == "Bo")
        #expect(atDialer.hello == WireFixture.hello("Bo", session: WireFixture.session))
        #expect(atListener.remote == pair.dialerPeer)
        #expect(atListener.remote.displayName == "Ana")
        #expect(atListener.hello == WireFixture.hello("Ana"))
        #expect(atDialer.encrypted == encrypted)
        #expect(atListener.encrypted == encrypted)
        #expect(atDialer.version == WireFormat.version)
        #expect(atListener.version == WireFormat.version)
        #expect(pair.dialer.handshakeHash == pair.listener.handshakeHash)
        #expect(pair.dialer.handshakeHash?.count == 32)

        // Records flow both ways, in order.
        let toListener: [Frame] = [
            .message(id: 1, flags: .more, chunk: FramePayload(repeating: 1, count: 16384)),
            .message(id: 1, flags: [], chunk: FramePayload("end".utf8)),
            .control(.invite(invitation: 1, session: WireFixture.session, timeoutMilliseconds: 30_000, context: [7])),
            .data(stream: 1, flags: .syn, payload: [1, 2, 3]),
        ]
        for frame in toListener { try pair.dialerSends(frame) }
        try pair.listenerSends(.control(.accept(invitation: 1)))
        try pair.listenerSends(.datagram([9]))
        #expect(pair.listenerEvents.dropFirst() == LinkPair.arrivals(toListener)[...])
        #expect(pair.dialerEvents.dropFirst() == [.frame(.control(.accept(invitation: 1))), .frame(.datagram([9]))])

        // A graceful close reaches the other side with its code and reason.
        pair.absorbDialer(pair.dialer.close(code: .normal, reason: "the app left"))
        pair.pump()
        #expect(pair.dialerEvents.last == .closed(code: .normal, reason: "the app left", byPeer: false))
        #expect(pair.listenerEvents.last == .closed(code: .normal, reason: "the app left", byPeer: true))
    }

    @Test(arguments: [true, false])
    func encryptionHidesThePayload(_ encrypted: Bool) throws {
        let preference: EncryptionPreference = encrypted ? .required : .none
        var pair = LinkPair(dialer: WireFixture.preface(preference), listener: WireFixture.preface(preference))
        pair.connect()
        #expect(Self.established(pair.dialerEvents)?.encrypted == encrypted)
        let handshakeBytes = pair.dialerWire.count
        let secret = Array("the secret payload of a MESSAGE frame".utf8)
        try pair.dialerSends(.message(id: 1, flags: [], chunk: FramePayload(secret)))
        let afterHandshake = Array(pair.dialerWire[handshakeBytes...])
        #expect(afterHandshake.containsRun(secret) == !encrypted)
        #expect(afterHandshake.count == 2 + 12 + 8 + secret.count + (encrypted ? 16 : 0))
        #expect(pair.listenerEvents.last == .sequenced(.message(id: 1, flags: [], chunk: FramePayload(secret)), sequence: 1))
    }

    @Test(arguments: [true, false])
    func framesSentTogetherShareRecords(_ encrypted: Bool) throws {
        let preference: EncryptionPreference = encrypted ? .required : .none
        var pair = LinkPair(dialer: WireFixture.preface(preference), listener: WireFixture.preface(preference))
        pair.connect()
        let handshakeBytes = pair.dialerWire.count
        // 2,000 small messages, a full-size chunk among them, and frames of the link's own.
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        var expected: [LinkOutput] = []
        for index in 0..<2000 {
            let sequence = UInt64(index + 1)
            let size = index == 700 ? WireFormat.maxFramePayload : 64
            let frame = Frame.message(id: UInt32(index + 1), flags: [], chunk: FramePayload(repeating: UInt8(truncatingIfNeeded: index), count: size))
            frames.append((frame, sequence))
            expected.append(.sequenced(frame, sequence: sequence))
            if index % 500 == 0 {
                frames.append((.datagram([1, 2, 3]), nil))
                expected.append(.frame(.datagram([1, 2, 3])))
            }
        }
        let frameBytes = frames.reduce(0) { $0 + FrameScheduler.size(of: $1.frame) }
        pair.absorbDialer(try pair.dialer.send(frames, at: pair.now))
        pair.pump()
        #expect(Array(pair.listenerEvents.suffix(expected.count)) == expected)
        // Records as full as the frames allow: the wire holds the frames, and per record only
        // its length (and tag).
        let limit = pair.dialer.recordPayloadLimit
        #expect(limit == (encrypted ? 65519 : 65535))
        var records = 0
        var fill = 0
        var holdsSmall = false
        for (frame, _) in frames {
            let size = FrameScheduler.size(of: frame)
            let large = size > LinkStateMachine.smallFrameLimit
            if fill > 0, fill + size > limit || (large && holdsSmall) {
                records += 1
                fill = 0
                holdsSmall = false
            }
            fill += size
            if !large { holdsSmall = true }
        }
        records += 1
        #expect(records < 10)
        #expect(pair.dialerWire.count - handshakeBytes == frameBytes + records * (2 + (encrypted ? 16 : 0)))
    }

    /// A buffer handed back with `recycle` is where the next records are built (a link writes
    /// batch after batch without a new 128 KiB allocation for each), and what is built there
    /// reads as it should.
    @Test(arguments: [true, false])
    func recordsAreBuiltInARecycledBuffer(_ encrypted: Bool) throws {
        let preference: EncryptionPreference = encrypted ? .required : .none
        var pair = LinkPair(dialer: WireFixture.preface(preference), listener: WireFixture.preface(preference))
        pair.connect()
        var expected: [LinkOutput] = []
        func batch(_ index: Int) throws -> [UInt8] {
            let frames = (0..<8).map { offset -> (frame: Frame, sequence: UInt64?) in
                let sequence = UInt64(index * 8 + offset + 1)
                let frame = Frame.message(
                    id: UInt32(sequence), flags: [], chunk: FramePayload(repeating: UInt8(sequence), count: WireFormat.maxFramePayload))
                expected.append(.sequenced(frame, sequence: sequence))
                return (frame, sequence)
            }
            let outputs = try pair.dialer.send(frames, at: pair.now)
            guard outputs.count == 1, case .send(let bytes) = outputs[0] else {
                Issue.record("one batch of frames should be one write, not \(outputs.count) outputs")
                return []
            }
            return bytes
        }
        /// A copy in storage of its own, for the listener.
        func copy(_ bytes: [UInt8]) -> [UInt8] {
            [UInt8](unsafeUninitializedCapacity: bytes.count) { buffer, count in
                _ = buffer.initialize(from: bytes)
                count = bytes.count
            }
        }
        func address(_ bytes: [UInt8]) -> UInt { bytes.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) } }

        var first = try batch(0)
        let storage = address(first)
        pair.absorbDialer([.send(copy(first))])
        pair.dialer.recycle(first)
        first = []
        let second = try batch(1)
        #expect(address(second) == storage)
        // A third batch, with nothing handed back, is built in new storage.
        let third = try batch(2)
        #expect(address(third) != storage)
        pair.absorbDialer([.send(copy(second)), .send(copy(third))])
        pair.pump()
        #expect(Array(pair.listenerEvents.suffix(expected.count)) == expected)
        // A buffer too large to keep is not kept. (Not checked by the next batch's address: the
        // allocator may well hand the freed block out again for it.)
        pair.dialer.recycle([UInt8](repeating: 0, count: LinkStateMachine.maxSpareCapacity + 1))
        #expect(pair.dialer.keptBufferCapacity <= LinkStateMachine.maxSpareCapacity)
        _ = try batch(3)
    }

    @Test func goAwayInABatchClosesAfterWhatCameBefore() throws {
        var pair = WireLinkHostileTests.establishedPair(.required)
        let before = Frame.message(id: 1, flags: [], chunk: [7])
        let after = Frame.message(id: 2, flags: [], chunk: [8])
        pair.absorbDialer(
            try pair.dialer.send([(before, 1), (Frame.goAway(code: .normal, reason: "done"), nil), (after, 2)], at: pair.now))
        pair.pump()
        let expected: [LinkOutput] = [.sequenced(before, sequence: 1), .closed(code: .normal, reason: "done", byPeer: true)]
        #expect(Array(pair.listenerEvents.suffix(2)) == expected)
        #expect(pair.dialerEvents.last == .closed(code: .normal, reason: "done", byPeer: false))
    }

    @Test func batchBeforeTheHandshakeThrows() {
        var link = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Ana"))
        #expect(throws: WireError.self) { try link.send([(.datagram([1]), nil)], at: .zero) }
    }

    @Test func versionMismatchBetweenMachines() throws {
        var pair = LinkPair(listener: WireFixture.preface(versions: [9]))
        pair.connect()
        let dialer = try #require(pair.dialerEvents.closure)
        #expect(dialer.code == .unsupportedVersion)
        #expect(dialer.reason.contains("versions 2"))
        #expect(!dialer.byPeer)
        let listener = try #require(pair.listenerEvents.closure)
        #expect(listener.code == .unsupportedVersion)
        #expect(listener.reason.contains("versions 9"))
        #expect(pair.dialerEvents.count == 1)
        #expect(pair.listenerEvents.count == 1)
    }

    /// A peer that speaks only version 9, played byte by byte: it is told, in the verdict, which
    /// versions this side speaks.
    @Test func versionNinePeerIsToldWhichVersionsThisSideSpeaks() throws {
        var link = LinkStateMachine(
            role: .listener, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Bo"))
        let started = link.start(at: .zero)
        #expect(started == [.send(WireFixture.preface().encoded())])
        let outputs = link.receive(WireFixture.preface(versions: [9]).encoded(), at: .zero)
        #expect(outputs.count == 2)
        let verdict = try Verdict.decode(outputs.sentBytes)
        guard case .refuse(let code, let reason) = verdict else {
            Issue.record("expected a refusal, got \(verdict)")
            return
        }
        #expect(code == .unsupportedVersion)
        #expect(reason.contains("this peer speaks PeerLink protocol versions 2"))
        #expect(outputs.last == .closed(code: .unsupportedVersion, reason: reason, byPeer: false))
    }

    @Test func serviceMismatch() throws {
        var pair = LinkPair(listener: WireFixture.preface(service: try ServiceType("files")))
        pair.connect()
        for events in [pair.dialerEvents, pair.listenerEvents] {
            let closure = try #require(events.closure)
            #expect(closure.code == .serviceMismatch)
            #expect(closure.reason.contains("'chat'") && closure.reason.contains("'files'"))
            #expect(events.count == 1)
        }
    }

    /// The dialer finds someone else behind the address: it stops before message 3, so the
    /// impostor never learns who dialled, and reports code 7.
    @Test func dialerFindsAnotherKeyThanExpected() throws {
        let advertised = Identity.generate().fingerprint
        var pair = LinkPair(dialerExpects: .fingerprint(advertised))
        pair.connect()
        #expect(pair.dialerEvents.count == 1)
        let dialer = try #require(pair.dialerEvents.closure)
        #expect(dialer.code == .identityMismatch)
        #expect(!dialer.byPeer)
        #expect(dialer.reason.contains(advertised.grouped))
        #expect(dialer.reason.contains(pair.listenerIdentity.fingerprint.grouped))
        // The listener never got message 3, so never established: it sees the link end.
        #expect(pair.listenerEvents == [
            .closed(code: .handshakeFailed, reason: "the peer closed the link before the handshake completed", byPeer: true)
        ])
        // Preface, verdict, message 1 (2 + 32 bytes), nothing else.
        #expect(pair.dialerWire.count == WireFixture.preface().encoded().count + 1 + 2 + 32)
    }

    @Test func listenerFindsAnotherKeyThanExpected() throws {
        let expected = Identity.generate().fingerprint
        var pair = LinkPair(listenerExpects: expected)
        pair.connect()
        // The dialer was established after message 3, then told why by a GO_AWAY.
        #expect(Self.established(pair.dialerEvents) != nil)
        let dialer = try #require(pair.dialerEvents.closure)
        #expect(dialer.code == .identityMismatch)
        #expect(dialer.byPeer)
        #expect(pair.listenerEvents.count == 1)
        let listener = try #require(pair.listenerEvents.closure)
        #expect(listener.code == .identityMismatch)
        #expect(!listener.byPeer)
    }

    @Test func matchingExpectationsOnBothSides() throws {
        let dialerIdentity = Identity.generate()
        var pair = LinkPair(dialerIdentity: dialerIdentity, listenerExpects: dialerIdentity.fingerprint)
        pair.connect()
        #expect(Self.established(pair.dialerEvents) != nil)
        #expect(Self.established(pair.listenerEvents) != nil)
        #expect(pair.dialer.remotePeer == pair.listenerPeer)
        #expect(pair.listener.remotePeer == pair.dialerPeer)
    }

    /// A man in the middle changes the dialer's encryption preference in transit: both sides
    /// still agree on a link, but the prologues differ, so the handshake fails.
    @Test func tamperedPrefaceBreaksTheHandshake() throws {
        var dialer = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: WireFixture.preface(.optional), hello: WireFixture.hello("Ana"))
        var listener = LinkStateMachine(
            role: .listener, identity: .generate(), preface: WireFixture.preface(.optional), hello: WireFixture.hello("Bo"))
        var toListener = dialer.start(at: .zero).sentBytes
        #expect(toListener[6] == EncryptionPreference.optional.rawValue)
        toListener[6] = EncryptionPreference.required.rawValue
        var toDialer = listener.start(at: .zero).sentBytes
        var dialerEvents: [LinkOutput] = []
        var listenerEvents: [LinkOutput] = []
        for _ in 0..<5 {
            let fromListener = listener.receive(toListener, at: .zero)
            toListener = []
            toDialer += fromListener.sentBytes
            listenerEvents += fromListener.events
            let fromDialer = dialer.receive(toDialer, at: .zero)
            toDialer = []
            toListener += fromDialer.sentBytes
            dialerEvents += fromDialer.events
        }
        #expect(listenerEvents == [])
        let closure = try #require(dialerEvents.closure)
        #expect(closure.code == .handshakeFailed)
        #expect(dialerEvents.count == 1)
    }

    @Test func afterClosedEverythingYieldsNothing() throws {
        var pair = LinkPair()
        pair.connect()
        pair.absorbListener(pair.listener.close(code: .sessionFull, reason: "full"))
        pair.pump()
        #expect(pair.dialerEvents.last == .closed(code: .sessionFull, reason: "full", byPeer: true))
        for link in [pair.dialer, pair.listener] {
            var link = link
            #expect(link.state == .closed)
            #expect(link.receive(WireFixture.preface().encoded(), at: .seconds(1)) == [])
            #expect(link.receive([0, 5, 1, 2, 3, 4, 5], at: .seconds(1)) == [])
            #expect(link.tick(at: .seconds(100)) == [])
            #expect(link.receiveEnd(at: .seconds(100)) == [])
            #expect(link.close() == [])
            #expect(try link.send(.datagram([1]), at: .seconds(100)) == [])
            #expect(link.start(at: .seconds(100)) == [])
            #expect(link.nextDeadline == nil)
        }
    }

    @Test func sendingBeforeEstablishedThrowsAndChangesNothing() throws {
        var link = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Ana"))
        #expect(throws: WireError.self) { try link.send(.datagram([1]), at: .zero) }
        _ = link.start(at: .zero)
        #expect(throws: WireError.self) { try link.send(.datagram([1]), at: .zero) }
        #expect(link.state == .awaitingPreface)

        var pair = LinkPair()
        pair.connect()
        #expect(throws: WireError.self) { try pair.dialer.send(.datagram([UInt8](repeating: 0, count: 16385)), at: .zero) }
        #expect(pair.dialer.state == .established)
    }

    @Test func sendingGoAwayCloses() throws {
        var pair = LinkPair()
        pair.connect()
        try pair.dialerSends(.goAway(code: .duplicateLink, reason: "tie-break"))
        #expect(pair.dialerEvents.last == .closed(code: .duplicateLink, reason: "tie-break", byPeer: false))
        #expect(pair.listenerEvents.last == .closed(code: .duplicateLink, reason: "tie-break", byPeer: true))
    }

    /// Both sides close at once: each reads the other's records after its own GO_AWAY only for
    /// the peer's GO_AWAY (frames before it are dropped), then knows both are done. Delivered
    /// a byte at a time, so records complete across calls.
    @Test(arguments: [EncryptionPreference.none, .required])
    func closingTogetherEachSeesTheOthersGoAway(_ encryption: EncryptionPreference) throws {
        var pair = WireLinkHostileTests.establishedPair(encryption)
        var fromListener = try pair.listener.send(.datagram([1, 2, 3]), at: .seconds(1)).sentBytes
        fromListener += try pair.listener.send([(.message(id: 2, flags: [], chunk: [9]), 1)], at: .seconds(1)).sentBytes
        let listenerClose = pair.listener.close(code: .normal, reason: "bye from Bo")
        fromListener += listenerClose.sentBytes
        let dialerClose = pair.dialer.close(code: .normal, reason: "bye from Ana")
        #expect(listenerClose.closure?.byPeer == false && dialerClose.closure?.byPeer == false)
        for (index, byte) in fromListener.enumerated() {
            #expect(!pair.dialer.peerClosedToo)
            #expect(pair.dialer.receive([byte], at: .seconds(2)) == [])
            #expect(pair.dialer.peerClosedToo == (index == fromListener.count - 1))
        }
        #expect(pair.listener.receive(dialerClose.sentBytes, at: .seconds(2)) == [])
        #expect(pair.listener.peerClosedToo)
        // Nothing more is read once both are done.
        #expect(pair.dialer.receive(fromListener, at: .seconds(3)) == [])
        #expect(pair.dialer.bufferedByteCount == 0)
    }

    /// After its GO_AWAY a side reads on only while the peer's records make sense: one that
    /// does not open (or a malformed one) ends that, and a GO_AWAY after it counts for nothing.
    @Test(arguments: [EncryptionPreference.none, .required])
    func afterItsGoAwayASideStopsReadingAtGarbage(_ encryption: EncryptionPreference) throws {
        var pair = WireLinkHostileTests.establishedPair(encryption)
        let goAway = pair.listener.close(code: .normal, reason: "bye").sentBytes
        _ = pair.dialer.close()
        // An encrypted record that does not open; a record of an unknown frame type when plain.
        let garbage: [UInt8] =
            encryption == .required
            ? [0, 20] + [UInt8](repeating: 7, count: 20) : WireFixture.record(WireFixture.rawFrame(type: 9))
        #expect(pair.dialer.receive(garbage + goAway, at: .seconds(1)) == [])
        #expect(!pair.dialer.peerClosedToo)
        #expect(pair.dialer.bufferedByteCount == 0)
        // A side the peer closed first (GO_AWAY read while established) is done at once.
        var other = WireLinkHostileTests.establishedPair(encryption)
        let bye = other.listener.close(code: .normal, reason: "bye").sentBytes
        #expect(other.dialer.receive(bye, at: .seconds(1)) == [.closed(code: .normal, reason: "bye", byPeer: true)])
        #expect(!other.dialer.peerClosedToo)
        #expect(other.dialer.receive(bye, at: .seconds(1)) == [])
    }

    @Test func peerEndingAnEstablishedLinkWithoutGoAway() {
        var pair = LinkPair()
        pair.connect()
        #expect(
            pair.listener.receiveEnd(at: .seconds(1)) == [
                .closed(code: .protocolError, reason: "the peer closed the link without a GO_AWAY", byPeer: true)
            ])
    }
}

@Suite("LinkStateMachine: time (handshake timeout, keep-alive), injected")
struct WireLinkTimeTests {
    @Test(arguments: [Duration.zero, .seconds(1000)])
    func handshakeTimeoutAfterTenSecondsAndNotBefore(_ start: Duration) {
        var link = LinkStateMachine(
            role: .listener, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Bo"))
        #expect(link.tick(at: start) == [])  // not started: nothing to time
        _ = link.start(at: start)
        #expect(link.nextDeadline == start + .seconds(10))
        // A peer that sends its preface and verdict, then nothing.
        #expect(link.receive(WireFixture.preface().encoded() + [0], at: start + .seconds(1)).events == [])
        #expect(link.state == .handshaking)
        for time in [Duration.zero, .seconds(5), .milliseconds(9999)] {
            #expect(link.tick(at: start + time) == [])
        }
        #expect(
            link.tick(at: start + .seconds(10)) == [
                .closed(code: .handshakeFailed, reason: "the handshake did not complete within 10 s", byPeer: false)
            ])
        #expect(link.tick(at: start + .seconds(11)) == [])
    }

    @Test func silentPeerTimesOutInThePreface() {
        var link = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Ana"),
            policy: LinkPolicy(handshakeTimeout: .milliseconds(2500)))
        _ = link.start(at: .zero)
        #expect(link.tick(at: .milliseconds(2499)) == [])
        #expect(link.tick(at: .milliseconds(2500)).closure?.code == .handshakeFailed)
    }

    @Test func pingAfterIdleIntervalThenDeadAfterTimeout() throws {
        var pair = LinkPair()
        pair.connect()
        #expect(pair.dialer.state == .established)
        #expect(pair.dialer.nextDeadline == .seconds(2))
        var dialer = pair.dialer
        // Nothing sent for less than 2 s: nothing to do.
        #expect(dialer.tick(at: .milliseconds(1999)) == [])
        // 2 s idle: a PING request.
        let ping = dialer.tick(at: .seconds(2))
        #expect(ping.events == [])
        #expect(ping.count == 1)
        #expect(dialer.nextDeadline == .seconds(4))
        #expect(dialer.tick(at: .seconds(3)) == [])
        #expect(dialer.tick(at: .seconds(4)).count == 1)
        // Nothing arrived since 0: dead at 8 s, with a GO_AWAY for the peer in case it listens.
        #expect(dialer.tick(at: .milliseconds(7999)).events == [])
        let dead = dialer.tick(at: .seconds(8))
        #expect(dead.count == 2)
        guard case .send = dead.first else {
            Issue.record("expected a GO_AWAY first: \(dead)")
            return
        }
        #expect(
            dead.last == .closed(code: .keepAliveTimeout, reason: "nothing arrived from the peer for 8 s: the link is dead", byPeer: false))
        #expect(dialer.tick(at: .seconds(20)) == [])
    }

    /// In clear, the keep-alive frames themselves can be read off the wire.
    @Test func pingIsAnsweredAndNotSurfaced() throws {
        var pair = LinkPair(dialer: WireFixture.preface(.none), listener: WireFixture.preface(.none))
        pair.connect()
        let dialerBefore = pair.dialerWire.count
        let listenerBefore = pair.listenerWire.count
        pair.now = .seconds(2)
        pair.absorbDialer(pair.dialer.tick(at: pair.now))
        pair.pump()
        var fromDialer = FrameDecoder()
        var fromListener = FrameDecoder()
        #expect(fromDialer.decode(Array(pair.dialerWire[dialerBefore...])) == [.success(.ping(flags: .syn, opaque: 1))])
        #expect(fromListener.decode(Array(pair.listenerWire[listenerBefore...])) == [.success(.ping(flags: .ack, opaque: 1))])
        // Neither side surfaced the pings.
        #expect(pair.dialerEvents.count == 1)
        #expect(pair.listenerEvents.count == 1)
        #expect(pair.dialer.roundTripTime == .zero)
    }

    @Test(arguments: [EncryptionPreference.none, .required])
    func keptAliveWhileThePeerAnswers(_ encryption: EncryptionPreference) {
        var pair = LinkPair(dialer: WireFixture.preface(encryption), listener: WireFixture.preface(encryption))
        pair.connect()
        // A minute of silence from the apps, timers firing every 100 ms on both sides.
        for step in 1...600 { pair.tick(at: .milliseconds(100 * step)) }
        #expect(pair.dialer.state == .established)
        #expect(pair.listener.state == .established)
        #expect(pair.dialerEvents.count == 1)
        #expect(pair.listenerEvents.count == 1)
        #expect(pair.dialer.roundTripTime == .zero)
        // Pings went out roughly every 2 s, not more.
        #expect(pair.dialerWire.count < 2600)  // 30 encrypted pings and the handshake; one per tick would be 20× that
    }

    @Test func onlyOneSideTicksAndTheAnswersKeepItAlive() {
        var pair = LinkPair()
        pair.connect()
        for step in 1...100 {
            pair.now = .milliseconds(500 * step)
            pair.absorbDialer(pair.dialer.tick(at: pair.now))
            pair.pump()
        }
        #expect(pair.dialer.state == .established)
    }

    @Test func nextDeadlineFollowsTraffic() throws {
        var pair = LinkPair()
        pair.connect()
        pair.now = .seconds(2)
        try pair.dialerSends(.datagram([1]))
        // Sent at 2 s; received at 0 s (the listener said nothing since).
        #expect(pair.dialer.nextDeadline == .seconds(4))
        #expect(pair.listener.nextDeadline == .seconds(2))
    }
}

@Suite("LinkStateMachine: hostile peers")
struct WireLinkHostileTests {
    static func listener(encryption: EncryptionPreference = .optional) -> LinkStateMachine {
        LinkStateMachine(
            role: .listener, identity: .generate(), preface: WireFixture.preface(encryption), hello: WireFixture.hello("Bo"))
    }

    @Test func garbagePreface() throws {
        var link = Self.listener()
        _ = link.start(at: .zero)
        let outputs = link.receive(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8), at: .zero)
        let closure = try #require(outputs.closure)
        #expect(closure.code == .protocolError)
        #expect(closure.reason.contains("PLNK"))
        #expect(!closure.byPeer)
        // The refusing verdict says so, in case it is a PeerLink peer with a bug.
        #expect(try Verdict.decode(outputs.sentBytes) == .refuse(code: .protocolError, reason: closure.reason))
        #expect(link.bufferedByteCount == 0)
    }

    @Test func malformedPrefaceFields() throws {
        for bytes: [UInt8] in [
            WireFormat.magic + [0], WireFormat.magic + [1, 1, 7], WireFormat.magic + [1, 1, 1, 0],
            WireFormat.magic + [1, 1, 1, 4] + Array("CHAT".utf8),
        ] {
            var link = Self.listener()
            _ = link.start(at: .zero)
            #expect(link.receive(bytes, at: .zero).closure?.code == .protocolError, "\(bytes)")
        }
    }

    @Test func refusalFromThePeerIsSurfaced() {
        var link = Self.listener()
        _ = link.start(at: .zero)
        let bytes = WireFixture.preface().encoded() + Verdict.refuse(code: .sessionFull, reason: "eight is enough").encoded()
        let outputs = link.receive(bytes, at: .zero)
        #expect(outputs.events == [.closed(code: .sessionFull, reason: "eight is enough", byPeer: true)])
        // Its own verdict went out before it read the refusal.
        #expect(outputs.sentBytes == [0])
    }

    @Test func truncatedHandshakeThenEnd() {
        var link = Self.listener()
        _ = link.start(at: .zero)
        // Message 1 is 32 bytes; 10 arrive, then the link ends.
        let outputs = link.receive(WireFixture.preface().encoded() + [0, 0, 32] + [UInt8](repeating: 9, count: 10), at: .zero)
        #expect(outputs.events == [])
        #expect(link.bufferedByteCount == 12)
        #expect(link.receiveEnd(at: .seconds(1)).closure?.code == .handshakeFailed)
    }

    @Test func handshakeMessageTooShortForNoise() throws {
        var link = Self.listener()
        _ = link.start(at: .zero)
        let outputs = link.receive(WireFixture.preface().encoded() + [0, 0, 3, 1, 2, 3], at: .zero)
        let closure = try #require(outputs.closure)
        #expect(closure.code == .handshakeFailed)
        #expect(closure.reason.contains("handshake message 1"))
        // Before the handshake completes nothing more is sent: only the verdict.
        #expect(outputs.sentBytes == [0])
    }

    @Test func garbageHandshakeMessageToTheDialer() throws {
        var link = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Ana"))
        _ = link.start(at: .zero)
        var generator = SeededGenerator(seed: 7)
        let garbage = (0..<96).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let outputs = link.receive(WireFixture.preface().encoded() + [0, 0, 96] + garbage, at: .zero)
        #expect(outputs.closure?.code == .handshakeFailed)
    }

    /// An endless handshake message: held back only up to its 65535 bytes, however much arrives.
    @Test func bufferingIsBounded() {
        var link = Self.listener()
        _ = link.start(at: .zero)
        _ = link.receive(WireFixture.preface().encoded() + [0, 0xFF, 0xFF], at: .zero)
        let piece = [UInt8](repeating: 0x42, count: 60000)
        #expect(link.receive(piece, at: .zero) == [])
        #expect(link.bufferedByteCount == 60002)
        // The rest of the message and a megabyte more in one piece: the message is read (and
        // fails as Noise), the rest is never held.
        let outputs = link.receive([UInt8](repeating: 0x42, count: 1 << 20), at: .zero)
        #expect(outputs.closure?.code == .handshakeFailed)
        #expect(link.bufferedByteCount == 0)
    }

    @Test func bufferingIsBoundedInTheVerdict() {
        var link = Self.listener()
        _ = link.start(at: .zero)
        let outputs = link.receive(WireFixture.preface().encoded() + [4, 0xFF, 0xFF] + [UInt8](repeating: 0x41, count: 100_000), at: .zero)
        #expect(outputs.closure?.code == .encryptionMismatch)
        // The whole verdict was read (65535 bytes of reason); what is reported is cut.
        #expect(outputs.closure?.reason == String(repeating: "A", count: ResourceLimits.default.maximumReasonBytes - 3) + PeerText.ellipsis)
        #expect(link.bufferedByteCount == 0)
    }

    static func establishedPair(_ encryption: EncryptionPreference) -> LinkPair {
        var pair = LinkPair(dialer: WireFixture.preface(encryption), listener: WireFixture.preface(encryption))
        pair.connect()
        #expect(pair.listener.state == .established)
        return pair
    }

    @Test(arguments: [EncryptionPreference.none, .required])
    func undersizedRecordLength(_ encryption: EncryptionPreference) throws {
        // Every 2-byte length up to 65535 is a record the format allows; one too short to hold a
        // frame header (and the tag) is refused as soon as its length arrives.
        var pair = Self.establishedPair(encryption)
        let minimum = WireFormat.minRecordLength(encrypted: encryption == .required)
        let length = UInt16(minimum - 1)
        let outputs = pair.listener.receive([UInt8(length >> 8), UInt8(length & 0xFF)], at: .zero)
        let closure = try #require(outputs.closure)
        #expect(closure.code == .protocolError)
        #expect(closure.reason == "a record of \(minimum - 1) bytes is under the minimum of \(minimum)")
        // A GO_AWAY goes to the peer first.
        pair.absorbListener(outputs)
        pair.pump()
        #expect(pair.dialerEvents.last == .closed(code: .protocolError, reason: closure.reason, byPeer: true))
    }

    @Test func unknownFrameType() throws {
        var pair = Self.establishedPair(.none)
        let outputs = pair.listener.receive(WireFixture.record(WireFixture.rawFrame(type: 9)), at: .zero)
        #expect(outputs.events == [.closed(code: .protocolError, reason: "frame type 0x9 is unknown", byPeer: false)])
        var decoder = FrameDecoder()
        #expect(decoder.decode(outputs.sentBytes) == [.success(.goAway(code: .protocolError, reason: "frame type 0x9 is unknown"))])
    }

    @Test func frameLengthDisagreeingWithTheRecord() throws {
        var pair = Self.establishedPair(.none)
        let outputs = pair.listener.receive(WireFixture.record(WireFixture.rawFrame(type: 6, length: 10, payload: [1])), at: .zero)
        #expect(outputs.closure?.code == .protocolError)
    }

    @Test func forgedRecordOnAnEncryptedLink() throws {
        var pair = Self.establishedPair(.required)
        // A well-formed frame in clear is not a sealed record.
        let outputs = pair.listener.receive(WireFixture.record(try Frame.datagram([UInt8](repeating: 1, count: 20)).encoded()), at: .zero)
        let closure = try #require(outputs.closure)
        #expect(closure.code == .protocolError)
        #expect(closure.reason.contains("decrypt"))
    }

    @Test func peerThatNeverFinishesTheHandshake() {
        // A dialer that sends its preface and verdict, then never message 1.
        var listener = Self.listener()
        _ = listener.start(at: .zero)
        _ = listener.receive(WireFixture.preface().encoded() + [0], at: .zero)
        #expect(listener.tick(at: .seconds(9)) == [])
        #expect(listener.tick(at: .seconds(10)).closure?.code == .handshakeFailed)
    }

    /// A reader reuses one buffer for every read (`LinkChannel.read(into:)`): the machine reads
    /// whole records where they lie in it and copies only the start of an incomplete one, so it
    /// keeps no reference to the buffer and the reader's next read writes into the same
    /// storage. Every read below holds whole records and the start of the next.
    @Test(arguments: [EncryptionPreference.none, .required])
    func readBufferIsNotHeldBetweenReads(_ encryption: EncryptionPreference) throws {
        var pair = Self.establishedPair(encryption)
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        for index in 0..<40 {
            let size = index % 3 == 0 ? WireFormat.maxFramePayload : 200 + index
            frames.append((.message(id: UInt32(index + 1), flags: [], chunk: FramePayload(repeating: UInt8(index), count: size)), UInt64(index + 1)))
        }
        var wire: [UInt8] = []
        for frame in frames { wire += try pair.dialer.send([frame], at: .zero).sentBytes }
        let received = Self.readThroughOneBuffer(wire, into: &pair.listener, readSize: 50_000)
        #expect(received == frames.map { .sequenced($0.frame, sequence: $0.sequence!) })
        #expect(pair.listener.bufferedByteCount == 0)
    }

    /// What `machine` reports for `wire` handed to it as a reader would: `readSize` bytes at a
    /// time through one buffer, scribbled over after each read as the next read would, and
    /// expected to stay the same storage (nothing shared it).
    static func readThroughOneBuffer(_ wire: [UInt8], into machine: inout LinkStateMachine, readSize: Int) -> [LinkOutput] {
        var buffer = [UInt8](repeating: 0, count: readSize)
        let address = buffer.withUnsafeBufferPointer { $0.baseAddress }
        var received: [LinkOutput] = []
        var offset = 0
        while offset < wire.count {
            let count = min(buffer.count, wire.count - offset)
            buffer.replaceSubrange(0..<count, with: wire[offset..<offset + count])
            received += machine.receive(buffer[..<count], at: .zero).events
            offset += count
            buffer.withUnsafeMutableBufferPointer { $0.update(repeating: 0xEE) }
            #expect(buffer.withUnsafeBufferPointer { $0.baseAddress } == address)
        }
        return received
    }

    /// A large message chunk whose record was completed in the machine's own storage (plain: a
    /// record cut by a read) or opened there (encrypted) is a part of that storage, not a copy
    /// (``RecordPin``): the storage is left to it, so it stays what was sent while later records
    /// arrive, and the caller's read buffer is still never held.
    @Test(arguments: [EncryptionPreference.none, .required])
    func largeChunksArePartsOfTheirRecord(_ encryption: EncryptionPreference) throws {
        var pair = Self.establishedPair(encryption)
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        for index in 0..<30 {
            let size = [WireFormat.maxFramePayload, RecordPin.minimumChunk, RecordPin.minimumChunk - 1, 900][index % 4]
            let chunk = FramePayload((0..<size).map { UInt8(truncatingIfNeeded: $0 &+ index &* 13) })
            frames.append((.message(id: UInt32(index % 3 + 1), flags: index < 27 ? .more : [], chunk: chunk), UInt64(index + 1)))
        }
        // several frames to a record, as a writer batches them
        var wire: [UInt8] = []
        for start in stride(from: 0, to: frames.count, by: 3) {
            wire += try pair.dialer.send(Array(frames[start..<min(start + 3, frames.count)]), at: .zero).sentBytes
        }
        let received = Self.readThroughOneBuffer(wire, into: &pair.listener, readSize: 20_011)
        #expect(received == frames.map { .sequenced($0.frame, sequence: $0.sequence!) })
        var parts = 0
        for output in received {
            guard case .sequenced(.message(_, _, let chunk), _) = output else { continue }
            if chunk.pin != nil {
                parts += 1
                #expect(chunk.count >= RecordPin.minimumChunk)
            }
        }
        // encrypted: every large chunk (opened in the machine's buffer); plain: those whose
        // record a read cut
        #expect(encryption == .required ? parts == 16 : parts > 0)
        #expect(pair.listener.bufferedByteCount == 0)
    }

    /// A hostile record: one message chunk just large enough to be kept as a part of it, and
    /// the rest datagrams. Kept for the rest of its message, the chunk holds all of the record
    /// alive, and that is what the partial-message limits count.
    @Test func aSmallChunkInABigRecordCountsAsTheRecord() throws {
        var pair = Self.establishedPair(.required)
        let chunk = FramePayload(repeating: 7, count: RecordPin.minimumChunk)
        var frames: [(frame: Frame, sequence: UInt64?)] = [(.message(id: 1, flags: .more, chunk: chunk), 1)]
        for _ in 0..<3 { frames.append((.datagram([UInt8](repeating: 1, count: 16_000)), nil)) }
        let received = pair.listener.receive(try pair.dialer.send(frames, at: .zero).sentBytes, at: .zero).events
        guard case .sequenced(.message(let id, let flags, let kept), _) = received.first else {
            Issue.record("no chunk: \(received)")
            return
        }
        let pin = try #require(kept.pin)
        #expect(pin.size >= RecordPin.minimumChunk + 3 * 16_000)
        var reassembly = MessageReassembly()
        #expect(reassembly.add(id: id, flags: flags, chunk: kept) == .incomplete)
        #expect(reassembly.bufferedBytes == pin.size)
    }

    @Test func bytesAfterGoAwayAreIgnored() throws {
        var pair = Self.establishedPair(.none)
        let goAway = try FrameDecoder.record(.goAway(code: .normal, reason: "bye"))
        let more = try FrameDecoder.record(.datagram([1]))
        let outputs = pair.listener.receive(goAway + more, at: .zero)
        #expect(outputs == [.closed(code: .normal, reason: "bye", byPeer: true)])
    }
}
