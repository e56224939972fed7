import PeerLinkCore
import Testing

/// The same bytes fed whole, byte by byte and cut at random points must decode the same
/// (NIO's `ByteToMessageDecoderVerifier`).
@Suite("Wire format: decoders replayed at every split")
struct WireReplayTests {
    /// A stream of every kind of frame, as unencrypted records.
    static func validStream() throws -> (bytes: [UInt8], frames: [Frame]) {
        let frames = WireFrameTests.frames
        return (try records(frames), frames)
    }

    /// `frames` as unencrypted records, one frame each; sequenced frames numbered 1, 2, ….
    static func records(_ frames: [Frame]) throws -> [UInt8] {
        var next: UInt64 = 0
        return try frames.flatMap { frame in
            guard frame.type.isSequenced else { return try FrameDecoder.record(frame) }
            next += 1
            return try FrameDecoder.record(frame, sequence: next)
        }
    }

    static func decodeRecords(
        _ pieces: [ArraySlice<UInt8>], maxRecordLength: Int = WireFormat.maxRecordLength(encrypted: false)
    ) -> [Result<[UInt8], WireError>] {
        var decoder = RecordDecoder(maxRecordLength: maxRecordLength)
        var results = pieces.flatMap { piece -> [Result<[UInt8], WireError>] in
            let results = decoder.decode(piece)
            #expect(decoder.bufferedByteCount <= 2 + maxRecordLength)
            return results
        }
        if let error = decoder.finish() { results.append(.failure(error)) }
        return results
    }

    static func decodeFrames(_ pieces: [ArraySlice<UInt8>]) -> [Result<Frame, WireError>] {
        var decoder = FrameDecoder()
        var results = pieces.flatMap { decoder.decode($0) }
        if let error = decoder.finish() { results.append(.failure(error)) }
        return results
    }

    /// The bodies of the records ``records(_:)`` makes of `frames`.
    static func recordBodies(_ frames: [Frame]) throws -> [Result<[UInt8], WireError>] {
        var next: UInt64 = 0
        return try frames.map { frame in
            guard frame.type.isSequenced else { return .success(try frame.encoded()) }
            next += 1
            return .success(try frame.encoded(sequence: next))
        }
    }

    @Test func recordsOfEveryFrameType() throws {
        let (bytes, frames) = try Self.validStream()
        let expected = try Self.recordBodies(frames)
        for replay in Splits.replays(of: bytes) {
            #expect(Self.decodeRecords(replay.pieces) == expected, "\(replay.name)")
        }
    }

    /// Decoding from one buffer reused for every piece (as a reader's buffer is): the same
    /// records, and the buffer is not shared once `decode` returned.
    @Test func reusedInputBufferIsNotHeld() throws {
        let (bytes, frames) = try Self.validStream()
        let expected = try Self.recordBodies(frames)
        for replay in Splits.replays(of: bytes) {
            var decoder = RecordDecoder()
            var buffer = [UInt8](repeating: 0, count: bytes.count)
            let address = buffer.withUnsafeBufferPointer { $0.baseAddress }
            var results: [Result<[UInt8], WireError>] = []
            for piece in replay.pieces {
                buffer.replaceSubrange(0..<piece.count, with: piece)
                results += decoder.decode(buffer[..<piece.count])
                buffer.withUnsafeMutableBufferPointer { $0.update(repeating: 0xEE) }
                #expect(buffer.withUnsafeBufferPointer { $0.baseAddress } == address, "\(replay.name)")
            }
            #expect(decoder.finish() == nil)
            #expect(results == expected, "\(replay.name)")
        }
    }

    /// Once the length of the record it holds the start of is known, the input buffer appends
    /// only what completes that record: the bytes after it are read where they lie (lent), not
    /// copied behind it.
    @Test func heldRecordTakesOnlyWhatCompletesIt() {
        var buffer = InputBuffer(capacity: 100)
        #expect(buffer.fill(from: [0, 8, 1][...]).isEmpty)
        buffer.keepRest()
        buffer.expect(Record.expectedLength(prefix: buffer.readable))
        let input = [UInt8](2...30)
        let rest = buffer.fill(from: input[...])
        #expect(buffer.count == 10)
        #expect(Array(rest) == Array(9...30))
        buffer.consume(10)
        // Empty again: the rest is lent, and nothing more is expected of it.
        #expect(buffer.fill(from: rest).isEmpty)
        #expect(buffer.count == 22)

        // Without a known length, as much as fits is copied.
        var unknown = InputBuffer(capacity: 100)
        _ = unknown.fill(from: [0][...])
        unknown.keepRest()
        #expect(Record.expectedLength(prefix: unknown.readable) == 2)
        #expect(unknown.fill(from: input[...]).isEmpty)
        #expect(unknown.count == 30)
    }

    @Test func framesOfEveryType() throws {
        let (bytes, frames) = try Self.validStream()
        let expected = frames.map { Result<Frame, WireError>.success($0) }
        for replay in Splits.replays(of: bytes) {
            #expect(Self.decodeFrames(replay.pieces) == expected, "\(replay.name)")
        }
    }

    /// Good frames, then an unknown frame type, then more bytes: the same frames and then the
    /// same error at every split, and nothing after the error.
    @Test func errorsAreReplayedIdentically() throws {
        let good = try [Frame.ping(flags: .syn, opaque: 1), .datagram([1, 2, 3])].flatMap { try FrameDecoder.record($0) }
        let bad = WireFixture.record(WireFixture.rawFrame(type: 9))
        let after = try FrameDecoder.record(.datagram([4]))
        let expected: [Result<Frame, WireError>] = [
            .success(.ping(flags: .syn, opaque: 1)), .success(.datagram([1, 2, 3])),
            .failure(WireError(.protocolError, "frame type 0x9 is unknown")),
        ]
        for replay in Splits.replays(of: good + bad + after) {
            #expect(Self.decodeFrames(replay.pieces) == expected, "\(replay.name)")
        }
    }

    /// A decoder with a limit under the format's (65535) refuses a longer record as soon as its
    /// length arrives, before buffering any of it.
    @Test func oversizedLengthIsRefusedBeforeBuffering() {
        let stream: [UInt8] = [0, 1, 0xAA, 0x7F, 0xFF] + [UInt8](repeating: 0, count: 40000)
        let expected: [Result<[UInt8], WireError>] = [
            .success([0xAA]), .failure(WireError(.protocolError, "a record of 32767 bytes is over the limit of 16396")),
        ]
        for replay in Splits.replays(of: stream) {
            #expect(Self.decodeRecords(replay.pieces, maxRecordLength: 16396) == expected, "\(replay.name)")
        }
    }

    @Test func truncatedStreamIsReplayedIdentically() throws {
        let whole = try FrameDecoder.record(.datagram([1, 2, 3, 4]))
        let stream = whole + whole.dropLast()
        let expected: [Result<Frame, WireError>] = [
            .success(.datagram([1, 2, 3, 4])),
            .failure(WireError(.protocolError, "the stream ends inside a record (17 bytes of it arrived)")),
        ]
        for replay in Splits.replays(of: stream) {
            #expect(Self.decodeFrames(replay.pieces) == expected, "\(replay.name)")
        }
    }

    /// The link state machine is a decoder too: a listener fed a dialer's preface, verdict and a
    /// broken handshake message must do the same thing however the bytes are cut.
    @Test(arguments: [
        ("broken handshake message", [0, 0, 5, 1, 2, 3, 4, 5] as [UInt8]),
        ("a refusal", Verdict.refuse(code: .sessionFull, reason: "full").encoded()),
        ("garbage after the verdict", [0, 0xFF, 0xFF] + [UInt8](repeating: 0x33, count: 300)),
    ])
    func linkStateMachineReplay(_ name: String, _ tail: [UInt8]) {
        let stream = WireFixture.preface().encoded() + tail
        let identity = Identity.generate()
        var reference: (sent: [UInt8], events: [LinkOutput])?
        for replay in Splits.replays(of: stream) {
            var link = LinkStateMachine(
                role: .listener, identity: identity, preface: WireFixture.preface(), hello: WireFixture.hello("Bo"))
            var outputs = link.start(at: .zero)
            for piece in replay.pieces { outputs += link.receive(piece, at: .zero) }
            outputs += link.tick(at: .seconds(10))
            #expect(link.bufferedByteCount <= WireFormat.maxBufferedBytes)
            let result = (outputs.sentBytes, outputs.events)
            #expect(result.1.count == 1, "\(name), \(replay.name): \(result.1)")
            if let reference {
                #expect(result.0 == reference.sent, "\(name), \(replay.name)")
                #expect(result.1 == reference.events, "\(name), \(replay.name)")
            } else {
                reference = result
            }
        }
    }
}
