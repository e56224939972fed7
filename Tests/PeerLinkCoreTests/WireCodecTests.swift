import PeerLinkCore
import Testing

// MARK: - Constants and codes

@Suite("Wire format: constants and go-away codes")
struct WireConstantsTests {
    @Test func constantsMatchTheSpec() {
        #expect(WireFormat.magic == Array("PLNK".utf8))
        #expect(WireFormat.version == 2)
        #expect(WireFormat.maxFramePayload == 16384)
        #expect(WireFormat.maxMessageLength == 16 * 1024 * 1024)
        #expect(WireFormat.maxContextLength == 8192)
        #expect(WireFormat.initialStreamWindow == 256 * 1024)
        #expect(WireFormat.maxRecordLength(encrypted: false) == 65535)
        #expect(WireFormat.maxRecordLength(encrypted: true) == 65535)
        #expect(WireFormat.maxPrefaceLength == 277)
        let policy = LinkPolicy.default
        #expect(policy.handshakeTimeout == .seconds(10))
        #expect(policy.keepAliveInterval == .seconds(2))
        #expect(policy.keepAliveTimeout == .seconds(8))
    }

    @Test func goAwayCodesHaveTheSpecNumbers() {
        let codes: [GoAwayCode] = [
            .normal, .protocolError, .unsupportedVersion, .serviceMismatch, .encryptionMismatch, .sessionFull,
            .handshakeFailed, .identityMismatch, .keepAliveTimeout, .duplicateLink, .internalError,
        ]
        #expect(codes.map(\.rawValue) == Array(0...10))
        for code in codes { #expect(GoAwayCode(rawValue: code.rawValue) == code) }
    }

    @Test func unknownGoAwayCodesArePreserved() throws {
        #expect(GoAwayCode(rawValue: 4242) == .other(4242))
        #expect(GoAwayCode.other(3) == .serviceMismatch)
        let bytes = try Frame.goAway(code: .other(0xDEAD_BEEF), reason: "later").encoded()
        #expect(try Frame.decode(bytes) == .goAway(code: .other(0xDEAD_BEEF), reason: "later"))
        #expect(try Verdict.decode([200, 0, 1, 0x41]) == .refuse(code: .other(200), reason: "A"))
    }
}

// MARK: - Preface, negotiation, verdict

@Suite("Wire format: preface, negotiation and verdict")
struct WirePrefaceTests {
    @Test func prefaceLayout() throws {
        let preface = try LinkPreface(versions: [2, 1], encryption: .required, service: WireFixture.chat)
        #expect(preface.encoded() == [0x50, 0x4C, 0x4E, 0x4B, 2, 2, 1, 2, 4] + Array("chat".utf8))
        #expect(try LinkPreface.decode(preface.encoded()) == preface)
    }

    @Test(arguments: EncryptionPreference.allCases)
    func prefaceRoundTrip(_ encryption: EncryptionPreference) throws {
        let longest = try ServiceType("abcdefghijklmno")
        for versions: [UInt8] in [[1], [9, 1], Array(1...255).reversed()] {
            let preface = try LinkPreface(versions: versions, encryption: encryption, service: longest)
            #expect(try LinkPreface.decode(preface.encoded()) == preface)
        }
    }

    @Test func prefaceNeedsOneTo255Versions() {
        #expect(throws: WireError.self) { try LinkPreface(versions: [], encryption: .none, service: WireFixture.chat) }
        #expect(throws: WireError.self) {
            try LinkPreface(versions: [UInt8](repeating: 1, count: 256), encryption: .none, service: WireFixture.chat)
        }
    }

    @Test func prefixParseWaitsForMoreAndFailsEarly() throws {
        let bytes = WireFixture.preface().encoded()
        for length in 0..<bytes.count {
            #expect(try LinkPreface.parse(prefix: bytes[..<length]) == nil)
        }
        let parsed = try #require(try LinkPreface.parse(prefix: (bytes + [0xAA])[...]))
        #expect(parsed.1 == bytes.count)
        // Not PeerLink: refused at the first byte, without waiting for more.
        #expect(throws: WireError(.protocolError, "the preface does not start with PLNK (byte 0 is 0x47): not a PeerLink peer")) {
            try LinkPreface.parse(prefix: [0x47][...])
        }
    }

    /// The spec's table, row by row: nil means refused.
    static let table: [(EncryptionPreference, EncryptionPreference, Bool?)] = [
        (.none, .none, false), (.none, .optional, false), (.none, .required, nil),
        (.optional, .none, false), (.optional, .optional, true), (.optional, .required, true),
        (.required, .none, nil), (.required, .optional, true), (.required, .required, true),
    ]

    @Test func encryptionTable() {
        for (local, remote, expected) in Self.table {
            #expect(EncryptionPreference.agreement(local, remote) == expected, "\(local) × \(remote)")
            let outcome = LinkPreface.negotiate(local: WireFixture.preface(local), remote: WireFixture.preface(remote))
            if let expected {
                #expect(outcome == .agreed(version: 2, encrypted: expected))
            } else {
                guard case .refused(let code, let reason) = outcome else {
                    Issue.record("\(local) × \(remote) should be refused")
                    continue
                }
                #expect(code == .encryptionMismatch)
                #expect(reason.contains("encryption"))
            }
        }
    }

    @Test func highestCommonVersionWins() {
        let outcome = LinkPreface.negotiate(
            local: WireFixture.preface(versions: [3, 2, 1]), remote: WireFixture.preface(versions: [1, 2, 5]))
        #expect(outcome == .agreed(version: 2, encrypted: true))
    }

    @Test func refusalsInTheSpecOrder() throws {
        let other = try ServiceType("files")
        // No common version is reported first, even when the service and encryption differ too.
        let versionFirst = LinkPreface.negotiate(
            local: WireFixture.preface(.required), remote: WireFixture.preface(.none, versions: [9], service: other))
        #expect(
            versionFirst
                == .refused(
                    code: .unsupportedVersion,
                    reason: "this peer speaks PeerLink protocol versions 2; the other speaks 9"))
        let service = LinkPreface.negotiate(
            local: WireFixture.preface(.required), remote: WireFixture.preface(.none, service: other))
        #expect(service == .refused(code: .serviceMismatch, reason: "this peer serves 'chat', the other 'files'"))
    }

    @Test func verdictRoundTrips() throws {
        let verdicts: [Verdict] = [
            .accept, .refuse(code: .encryptionMismatch, reason: "this peer requires encryption"),
            .refuse(code: .protocolError, reason: ""), .refuse(code: .other(255), reason: "é ✓"),
        ]
        for verdict in verdicts {
            #expect(try Verdict.decode(verdict.encoded()) == verdict)
        }
        #expect(Verdict.accept.encoded() == [0])
        #expect(Verdict.refuse(code: .serviceMismatch, reason: "no").encoded() == [3, 0, 2, 0x6E, 0x6F])
        // A code one byte cannot carry as a refusal goes out as internal error.
        #expect(Verdict.refuse(code: .other(300), reason: "").encoded() == [10, 0, 0])
        #expect(Verdict.refuse(code: .normal, reason: "").encoded() == [10, 0, 0])
    }

    @Test func verdictReasonIsReadLeniently() throws {
        #expect(try Verdict.decode([1, 0, 2, 0xFF, 0x41]) == .refuse(code: .protocolError, reason: "\u{FFFD}A"))
    }
}

// MARK: - Hello

@Suite("Wire format: hello")
struct WireHelloTests {
    @Test func roundTrips() throws {
        for hello in [WireFixture.hello("Ana"), WireFixture.hello("Ζωή 🎈", session: WireFixture.session)] {
            #expect(try Hello.decode(hello.encoded()) == hello)
        }
        let longest = WireFixture.hello(String(repeating: "x", count: 63))
        #expect(try Hello.decode(longest.encoded()) == longest)
    }

    @Test func layout() {
        #expect(WireFixture.hello("Bo", session: WireFixture.session).encoded() == [1, 0, 2, 0x42, 0x6F, 2, 0, 16] + Array(1...16))
    }

    @Test func unknownFieldsAreSkipped() throws {
        let bytes: [UInt8] = [9, 0, 3, 1, 2, 3] + [1, 0, 2, 0x42, 0x6F] + [200, 0, 0]
        #expect(try Hello.decode(bytes) == WireFixture.hello("Bo"))
    }
}

// MARK: - Frames and control messages

@Suite("Wire format: frames and control messages")
struct WireFrameTests {
    static let members: [ControlMessage.Member] = [
        ControlMessage.Member(fingerprint: Fingerprint(publicKey: [UInt8](repeating: 1, count: 32)), displayName: try! DisplayName("Ana")),
        ControlMessage.Member(fingerprint: Fingerprint(publicKey: [UInt8](repeating: 2, count: 32)), displayName: try! DisplayName("Bo 🎈")),
    ]

    static let controls: [ControlMessage] = [
        .invite(invitation: 7, session: WireFixture.session, timeoutMilliseconds: 30_000, context: Array("hi".utf8)),
        .invite(invitation: .max, session: WireFixture.session, timeoutMilliseconds: 0, context: []),
        .invite(invitation: 1, session: WireFixture.session, timeoutMilliseconds: 1, context: [UInt8](repeating: 0xC0, count: 8192)),
        .accept(invitation: 7),
        .decline(invitation: 7, reason: .declined), .decline(invitation: 8, reason: .sessionFull),
        .decline(invitation: 9, reason: .timedOut), .decline(invitation: 10, reason: .crossed),
        .decline(invitation: 11, reason: .other(77)),
        .members(session: WireFixture.session, members: members), .members(session: WireFixture.session, members: []),
        .join(session: WireFixture.session), .leave(session: WireFixture.session),
    ]

    static let frames: [Frame] =
        [
            .data(stream: 1, flags: .syn, payload: FramePayload("open".utf8)),
            .data(stream: 2, flags: [.fin, .ack], payload: []),
            .data(stream: 3, flags: .rst, payload: FramePayload(repeating: 0xAB, count: 16384)),
            .windowUpdate(stream: 1, flags: [], credit: 262_144),
            .windowUpdate(stream: .max, flags: .syn, credit: .max),
            .ping(flags: .syn, opaque: 0x0102_0304_0506_0708), .ping(flags: .ack, opaque: .max),
            .goAway(code: .normal, reason: "bye"), .goAway(code: .keepAliveTimeout, reason: ""),
            .message(id: 1, flags: .more, chunk: FramePayload(repeating: 7, count: 16384)),
            .message(id: 1, flags: [], chunk: FramePayload("tail".utf8)),
            .datagram(Array("unreliable".utf8)), .datagram([]),
        ] + controls.map(Frame.control)

    @Test(arguments: frames)
    func frameRoundTrip(_ frame: Frame) throws {
        // Sequenced frames (reliable chunks, stream data and credit) carry their number.
        let sequence: UInt64? = frame.type.isSequenced ? 0x0102_0304_0506_0708 : nil
        let bytes = try frame.encoded(sequence: sequence)
        #expect(bytes.count >= (sequence == nil ? 12 : 20))
        #expect(bytes[0] == WireFormat.version)
        #expect(bytes[1] == frame.type.rawValue)
        let decoded = try Frame.decodeRecord(bytes[...])
        #expect(decoded.count == 1)
        #expect(decoded.first?.frame == frame)
        #expect(decoded.first?.sequence == sequence)
    }

    @Test func severalFramesInOneRecord() throws {
        let frames: [(Frame, UInt64?)] = [
            (.message(id: 1, flags: .more, chunk: [1, 2]), 7), (.ack(receivedThrough: 41), nil),
            (.datagram([3]), nil), (.message(id: 1, flags: [], chunk: [4]), 8),
        ]
        var record: [UInt8] = []
        for (frame, sequence) in frames { record += try frame.encoded(sequence: sequence) }
        let decoded = try Frame.decodeRecord(record[...])
        #expect(decoded.map(\.frame) == frames.map(\.0))
        #expect(decoded.map(\.sequence) == frames.map(\.1))
        // a frame cut short by the record's end is malformed
        #expect(throws: WireError.self) { try Frame.decodeRecord(record.dropLast()) }
    }

    /// A payload is as small as an array (frames are copied on their way, and a larger one
    /// would cost every small message); a part of an array and the same bytes whole are equal
    /// and hash alike; a decoded payload is an array of its own, copied out of the record once
    /// and handed on without another copy.
    @Test func framePayloads() throws {
        #expect(MemoryLayout<FramePayload>.size == MemoryLayout<[UInt8]>.size)
        let bytes = (0..<5000).map { UInt8(truncatingIfNeeded: $0) }
        let part = FramePayload(bytes[100..<300])
        let whole = FramePayload(Array(bytes[100..<300]))
        #expect(part == whole && part.hashValue == whole.hashValue && part.count == 200)
        #expect(part != FramePayload(Array(bytes[101..<301])))
        #expect(part.array == Array(bytes[100..<300]))

        func address(_ raw: UnsafeRawBufferPointer) -> UInt { UInt(bitPattern: raw.baseAddress) }
        // A range that is all of the array is the array; any other shares its storage.
        #expect(FramePayload(bytes, bytes.indices).array.withUnsafeBytes(address) == bytes.withUnsafeBytes(address))
        #expect(FramePayload(bytes, 100..<300).withUnsafeBytes(address) == bytes.withUnsafeBytes(address) + 100)
        #expect(FramePayload(bytes, 100..<300) == part)
        var record = try Frame.message(id: 3, flags: [], chunk: FramePayload(bytes[...])).encoded(sequence: 1)
        record += try Frame.data(stream: 5, flags: [], payload: FramePayload(bytes[100...])).encoded(sequence: 2)
        let recordStart = record.withUnsafeBytes(address)
        let recordRange = recordStart..<(recordStart + UInt(record.count))
        let decoded = try Frame.decodeRecord(record[...])
        guard decoded.count == 2, case .message(3, [], let chunk) = decoded[0].frame, case .data(5, [], let payload) = decoded[1].frame
        else {
            Issue.record("decoded \(decoded)")
            return
        }
        for (received, expected) in [(chunk, Array(bytes)), (payload, Array(bytes[100...]))] {
            #expect(received.array == expected)
            #expect(!recordRange.contains(received.withUnsafeBytes(address)), "a payload still refers to the record's buffer")
            #expect(received.array.withUnsafeBytes(address) == received.withUnsafeBytes(address), "the array is a copy")
        }
    }

    @Test func sequenceNumbersAreWhereTheTypeSaysAndNowhereElse() {
        #expect(throws: WireError.self) { try Frame.message(id: 1, flags: [], chunk: [1]).encoded() }
        #expect(throws: WireError.self) { try Frame.message(id: 1, flags: [], chunk: [1]).encoded(sequence: 0) }
        #expect(throws: WireError.self) { try Frame.datagram([1]).encoded(sequence: 3) }
        #expect(throws: WireError.self) { try Frame.ack(receivedThrough: 1).encoded(sequence: 3) }
    }

    @Test(arguments: controls)
    func controlRoundTrip(_ message: ControlMessage) throws {
        #expect(try ControlMessage.decode(message.encoded()) == message)
    }

    @Test func headerLayout() throws {
        let bytes = try Frame.windowUpdate(stream: 0x0102_0304, flags: [.syn, .more], credit: 5).encoded(sequence: 9)
        #expect(bytes == [2, 1, 0x00, 0x11, 1, 2, 3, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 5])
        let header = try FrameHeader.decode(bytes[...])
        #expect(header == FrameHeader(type: .windowUpdate, flags: [.syn, .more], streamID: 0x0102_0304, length: 4, sequence: 9))
        #expect(header.encoded() == Array(bytes.prefix(20)))
        let ping = try Frame.ping(flags: .ack, opaque: 1).encoded()
        #expect(ping == [2, 2, 0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1])
    }

    @Test func controlLayouts() throws {
        let session = WireFixture.session.bytes
        #expect(try ControlMessage.accept(invitation: 0x0A0B_0C0D).encoded() == [2, 0x0A, 0x0B, 0x0C, 0x0D])
        #expect(try ControlMessage.decline(invitation: 1, reason: .crossed).encoded() == [3, 0, 0, 0, 1, 3])
        #expect(try ControlMessage.join(session: WireFixture.session).encoded() == [5] + session)
        #expect(try ControlMessage.leave(session: WireFixture.session).encoded() == [6] + session)
        #expect(
            try ControlMessage.invite(invitation: 1, session: WireFixture.session, timeoutMilliseconds: 1000, context: [9]).encoded()
                == [1, 0, 0, 0, 1] + session + [0, 0, 0x03, 0xE8, 9])
        let member = Self.members[0]
        #expect(
            try ControlMessage.members(session: WireFixture.session, members: [member]).encoded()
                == [4] + session + [1] + Array(member.fingerprint.value.utf8) + [3] + Array("Ana".utf8))
    }

    /// A roster longer than any session (a hostile member's 255 made-up peers) is malformed.
    @Test func membersOverASessionsSizeAreMalformed() throws {
        let eight = try ControlMessage.members(session: WireFixture.session, members: Array(repeating: Self.members[0], count: 8)).encoded()
        #expect(try ControlMessage.decode(eight) == .members(session: WireFixture.session, members: Array(repeating: Self.members[0], count: 8)))
        let nine = try ControlMessage.members(session: WireFixture.session, members: Array(repeating: Self.members[0], count: 9)).encoded()
        #expect(throws: WireError.self) { try ControlMessage.decode(nine) }
    }

    @Test func unknownFlagBitsAreKept() throws {
        let bytes = WireFixture.rawFrame(type: 0, flags: 0x8001, stream: 5, sequence: 1, payload: [1])
        #expect(try Frame.decode(bytes) == .data(stream: 5, flags: FrameFlags(rawValue: 0x8001), payload: [1]))
    }

    @Test func framesThatCannotBeEncodedThrow() {
        #expect(throws: WireError.self) { try Frame.data(stream: 0, flags: [], payload: []).encoded() }
        #expect(throws: WireError.self) { try Frame.message(id: 0, flags: [], chunk: []).encoded() }
        #expect(throws: WireError.self) { try Frame.datagram([UInt8](repeating: 0, count: 16385)).encoded() }
        #expect(throws: WireError.self) {
            try Frame.control(.invite(invitation: 1, session: WireFixture.session, timeoutMilliseconds: 1, context: [UInt8](repeating: 0, count: 8193))).encoded()
        }
        #expect(throws: WireError.self) {
            try ControlMessage.members(session: WireFixture.session, members: Array(repeating: Self.members[0], count: 256)).encoded()
        }
    }

    @Test func longGoAwayReasonsAreCutAtACharacter() throws {
        let reason = String(repeating: "é", count: 9000)  // 18000 bytes
        let encoded = try Frame.goAway(code: .normal, reason: reason).encoded()
        // Sent: cut to what one frame carries, at a character.
        #expect(encoded.count == WireFormat.frameHeaderLength + WireFormat.maxFramePayload)
        #expect(String(validating: encoded.dropFirst(WireFormat.frameHeaderLength + 4), as: UTF8.self) == String(repeating: "é", count: 8190))
        guard case .goAway(_, let decoded) = try Frame.decode(encoded) else {
            Issue.record("not a GO_AWAY")
            return
        }
        // Received: cut again, to what a reason may hold once decoded.
        #expect(decoded.utf8.count <= PeerText.decodedReasonBytes)
        #expect(decoded == String(repeating: "é", count: 510) + PeerText.ellipsis)
    }
}

// MARK: - Malformed input

/// One malformed input and the error it must give.
struct MalformedCase: Sendable, CustomTestStringConvertible {
    enum Decoder: Sendable { case preface, hello, frame, control, records }

    let name: String
    let decoder: Decoder
    let bytes: [UInt8]
    let code: GoAwayCode
    /// A part of the reason.
    let says: String

    init(_ name: String, _ decoder: Decoder, _ bytes: [UInt8], _ says: String, code: GoAwayCode = .protocolError) {
        self.name = name
        self.decoder = decoder
        self.bytes = bytes
        self.code = code
        self.says = says
    }

    var testDescription: String { name }

    func decode() throws(WireError) {
        switch decoder {
        case .preface: _ = try LinkPreface.decode(bytes)
        case .hello: _ = try Hello.decode(bytes)
        case .frame: _ = try Frame.decode(bytes)
        case .control: _ = try ControlMessage.decode(bytes)
        case .records:
            var decoder = RecordDecoder()
            for result in decoder.decode(bytes) {
                if case .failure(let error) = result { throw error }
            }
            if let error = decoder.finish() { throw error }
        }
    }
}

@Suite("Wire format: malformed input gives exact errors, never a trap")
struct WireMalformedTests {
    static let magic = WireFormat.magic
    static let chat = Array("chat".utf8)
    static let session = WireFixture.session.bytes
    static let fingerprint = Array(Fingerprint(publicKey: [UInt8](repeating: 1, count: 32)).value.utf8)
    static func control(_ payload: [UInt8]) -> [UInt8] { WireFixture.rawFrame(type: 4, payload: payload) }

    static let cases: [MalformedCase] = [
        // Preface
        .init("preface: HTTP instead of PeerLink", .preface, Array("GET / HTTP/1.1\r\n".utf8), "does not start with PLNK"),
        .init("preface: truncated magic", .preface, [0x50, 0x4C], "truncated"),
        .init("preface: no versions", .preface, magic + [0, 1, 4] + chat, "no protocol version"),
        .init("preface: encryption 3", .preface, magic + [1, 1, 3, 4] + chat, "encryption preference 3 is unknown"),
        .init("preface: empty service", .preface, magic + [1, 1, 1, 0], "service type is 0 bytes"),
        .init("preface: service of 16 bytes", .preface, magic + [1, 1, 1, 16] + [UInt8](repeating: 0x61, count: 16), "16 bytes"),
        .init("preface: uppercase service", .preface, magic + [1, 1, 1, 4] + Array("Chat".utf8), "not a valid service type"),
        .init("preface: non-ASCII service", .preface, magic + [1, 1, 1, 2] + [0xC3, 0xA9], "not a valid service type"),
        .init("preface: truncated service", .preface, magic + [1, 1, 1, 4] + Array("ch".utf8), "truncated"),
        .init("preface: trailing byte", .preface, magic + [1, 1, 1, 4] + chat + [0], "follow the preface"),
        // Hello
        .init("hello: empty", .hello, [], "no display name"),
        .init("hello: field header cut", .hello, [1, 0], "ends inside a field header"),
        .init("hello: field longer than the hello", .hello, [1, 0, 5, 0x41], "says 5 bytes"),
        .init("hello: empty name", .hello, [1, 0, 0], "display name is empty"),
        .init("hello: 64-byte name", .hello, [1, 0, 64] + [UInt8](repeating: 0x41, count: 64), "64 bytes"),
        .init("hello: name not UTF-8", .hello, [1, 0, 2, 0xC3, 0x28], "not UTF-8"),
        .init("hello: name with a newline", .hello, [1, 0, 2, 0x41, 0x0A], "control"),
        .init("hello: two names", .hello, [1, 0, 1, 0x41, 1, 0, 1, 0x42], "two display names"),
        .init("hello: 15-byte session", .hello, [1, 0, 1, 0x41, 2, 0, 15] + [UInt8](repeating: 0, count: 15), "session is 15 bytes"),
        .init("hello: two sessions", .hello, [1, 0, 1, 0x41] + [2, 0, 16] + session + [2, 0, 16] + session, "two sessions"),
        // Frames
        .init("frame: record shorter than a header", .frame, [1, 0, 0, 0, 0, 0, 0, 1], "shorter than a frame header"),
        .init("frame: empty record", .frame, [], "holds no frame"),
        .init("frame: version 1", .frame, WireFixture.rawFrame(version: 1, type: 0, stream: 1, sequence: 1), "frame version 1 is not 2"),
        .init("frame: unknown type 9", .frame, WireFixture.rawFrame(type: 9), "frame type 0x9 is unknown"),
        .init("frame: unknown type 0xff", .frame, WireFixture.rawFrame(type: 0xFF), "frame type 0xff is unknown"),
        .init("frame: length over 16384", .frame, WireFixture.rawFrame(type: 0, stream: 1, length: 16385, sequence: 1), "over the limit of 16384"),
        .init("frame: length 2^32-1", .frame, WireFixture.rawFrame(type: 6, length: .max), "over the limit"),
        .init("frame: length longer than the record", .frame, WireFixture.rawFrame(type: 0, stream: 1, length: 5, sequence: 1, payload: [1]), "says 5 bytes but the record holds 1"),
        .init("frame: length shorter than the record", .frame, WireFixture.rawFrame(type: 6, length: 0, payload: [1]), "a record ends with 1 bytes, shorter than a frame header"),
        .init("frame: DATA on stream 0", .frame, WireFixture.rawFrame(type: 0, stream: 0), "DATA frame has id 0"),
        .init("frame: MESSAGE with id 0", .frame, WireFixture.rawFrame(type: 5, stream: 0), "MESSAGE frame has id 0"),
        .init("frame: WINDOW_UPDATE on stream 0", .frame, WireFixture.rawFrame(type: 1, stream: 0, payload: [0, 0, 0, 1]), "id 0"),
        .init("frame: PING on stream 3", .frame, WireFixture.rawFrame(type: 2, stream: 3, payload: [UInt8](repeating: 0, count: 8)), "stream id 3, not 0"),
        .init("frame: WINDOW_UPDATE of 3 bytes", .frame, WireFixture.rawFrame(type: 1, stream: 1, sequence: 1, payload: [0, 0, 1]), "4 bytes, not 3"),
        .init("frame: PING of 7 bytes", .frame, WireFixture.rawFrame(type: 2, payload: [UInt8](repeating: 0, count: 7)), "8 bytes, not 7"),
        .init("frame: PING of 9 bytes", .frame, WireFixture.rawFrame(type: 2, payload: [UInt8](repeating: 0, count: 9)), "8 bytes, not 9"),
        .init("frame: GO_AWAY of 3 bytes", .frame, WireFixture.rawFrame(type: 3, payload: [0, 0, 0]), "4-byte code"),
        .init("frame: MESSAGE without its sequence number", .frame, WireFixture.rawFrame(type: 5, stream: 1), "20 bytes with its sequence number"),
        .init("frame: MESSAGE with sequence number 0", .frame, WireFixture.rawFrame(type: 5, stream: 1, sequence: 0, payload: [1]), "sequence number"),
        .init("frame: ACK of 4 bytes", .frame, WireFixture.rawFrame(type: 7, payload: [0, 0, 0, 1]), "8 bytes, not 4"),
        .init("frame: empty CONTROL", .frame, control([]), "no control type"),
        // Control messages (inside CONTROL frames, so the frame decoder's path is covered too)
        .init("control: unknown type 7", .frame, control([7]), "control type 0x7 is unknown"),
        .init("control: unknown type 0", .control, [0], "control type 0x0 is unknown"),
        .init("control: INVITE of 23 bytes", .frame, control([1] + [UInt8](repeating: 0, count: 23)), "at least 24 bytes"),
        .init("control: INVITE context of 8193", .frame, control([1, 0, 0, 0, 1] + session + [0, 0, 0, 1] + [UInt8](repeating: 0, count: 8193)), "over the limit of 8192"),
        .init("control: ACCEPT of 3 bytes", .frame, control([2, 0, 0, 1]), "ACCEPT message is truncated"),
        .init("control: ACCEPT of 5 bytes", .frame, control([2, 0, 0, 0, 1, 0]), "1 bytes follow the ACCEPT"),
        .init("control: DECLINE without reason", .frame, control([3, 0, 0, 0, 1]), "DECLINE message is truncated"),
        .init("control: MEMBERS without count", .frame, control([4] + session), "MEMBERS message is truncated"),
        .init("control: MEMBERS says 2, has 1", .frame, control([4] + session + [2] + fingerprint + [1, 0x41]), "ends inside member 2"),
        .init("control: MEMBERS uppercase fingerprint", .control, [4] + session + [1] + Array(String(decoding: fingerprint, as: UTF8.self).uppercased().utf8) + [1, 0x41], "member 1's fingerprint"),
        .init("control: MEMBERS fingerprint with '1'", .control, [4] + session + [1] + [UInt8](repeating: 0x31, count: 16) + [1, 0x41], "member 1's fingerprint"),
        .init("control: MEMBERS empty name", .control, [4] + session + [1] + fingerprint + [0], "member 1's display name"),
        .init("control: MEMBERS trailing byte", .control, [4] + session + [1] + fingerprint + [1, 0x41, 0], "1 bytes follow the MEMBERS"),
        .init("control: JOIN of 15 bytes", .control, [5] + session.dropLast(), "JOIN message is truncated"),
        .init("control: LEAVE of 17 bytes", .control, [6] + session + [0], "1 bytes follow the LEAVE"),
        // Records
        .init("records: stream ends inside a record", .records, [0, 5, 1, 2], "ends inside a record"),
        .init("records: stream ends inside a length", .records, [0], "ends inside a record"),
    ]

    @Test(arguments: cases)
    func malformedInputIsAnError(_ input: MalformedCase) {
        do {
            try input.decode()
            Issue.record("\(input.name): decoded without an error")
        } catch {
            #expect(error.code == input.code)
            #expect(error.reason.contains(input.says), "reason: \(error.reason)")
        }
    }

    /// Random bytes through every decoder: errors, never traps.
    @Test func randomGarbageNeverTraps() {
        var generator = SeededGenerator(seed: 42)
        for _ in 0..<2000 {
            let count = Int.random(in: 0...64, using: &generator)
            var bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
            // Often make it look like a frame, so the deeper checks are reached.
            if bytes.count >= 12, Bool.random(using: &generator) {
                bytes[0] = 1
                bytes[1] = UInt8.random(in: 0...6, using: &generator)
                bytes[8...11] = [0, 0, 0, UInt8(bytes.count - 12)]
            }
            _ = try? LinkPreface.decode(bytes)
            _ = try? Verdict.decode(bytes)
            _ = try? Hello.decode(bytes)
            _ = try? Frame.decode(bytes)
            _ = try? ControlMessage.decode(bytes)
            var records = RecordDecoder()
            _ = records.decode(bytes)
            _ = records.finish()
        }
    }
}
