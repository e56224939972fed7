/// The type byte of a frame header.
public enum FrameType: UInt8, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    case data = 0
    case windowUpdate = 1
    case ping = 2
    case goAway = 3
    case control = 4
    case message = 5
    case datagram = 6
    case ack = 7

    public var description: String {
        switch self {
        case .data: "DATA"
        case .windowUpdate: "WINDOW_UPDATE"
        case .ping: "PING"
        case .goAway: "GO_AWAY"
        case .control: "CONTROL"
        case .message: "MESSAGE"
        case .datagram: "DATAGRAM"
        case .ack: "ACK"
        }
    }

    /// Whether frames of this type name a stream or message (a non-zero id) rather than the
    /// link as a whole (id 0).
    public var hasID: Bool {
        switch self {
        case .data, .windowUpdate, .message: true
        case .ping, .goAway, .control, .datagram, .ack: false
        }
    }

    /// Whether frames of this type are *sequenced*: numbered per pair of peers (not per link),
    /// kept by the sender until acknowledged and sent again on the next link, so they survive a
    /// link change (see the *Sessions* article). Their header carries the 8-byte sequence number.
    public var isSequenced: Bool {
        switch self {
        case .data, .windowUpdate, .message: true
        case .ping, .goAway, .control, .datagram, .ack: false
        }
    }

    /// Whether frames of this type carry bulk bytes (a stream's or a reliable message's), whose
    /// payload may be larger than ``WireFormat/maxFramePayload`` on a link whose two sides
    /// both take large frames (``Hello/maxFramePayload``).
    public var carriesBulk: Bool { self == .data || self == .message }
}

/// The flags of a frame header. Bits this version does not define are kept, not refused.
public struct FrameFlags: OptionSet, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16

    public init(rawValue: UInt16) {
        self.rawValue = rawValue
    }

    /// Opens a stream; a ping request.
    public static let syn = FrameFlags(rawValue: 0x1)
    /// Accepts a stream; a ping reply.
    public static let ack = FrameFlags(rawValue: 0x2)
    /// Half-closes a stream.
    public static let fin = FrameFlags(rawValue: 0x4)
    /// Resets a stream.
    public static let rst = FrameFlags(rawValue: 0x8)
    /// More chunks of this message follow.
    public static let more = FrameFlags(rawValue: 0x10)

    public var description: String {
        let names: [(FrameFlags, String)] = [(.syn, "SYN"), (.ack, "ACK"), (.fin, "FIN"), (.rst, "RST"), (.more, "MORE")]
        var parts = names.filter { contains($0.0) }.map(\.1)
        let unknown = rawValue & ~0x1F
        if unknown != 0 { parts.append(WireText.hex(unknown)) }
        return "[" + parts.joined(separator: ",") + "]"
    }
}

/// The header in front of every frame: 12 bytes, and 8 more (the sequence number) on the
/// sequenced types (``FrameType/isSequenced``).
public struct FrameHeader: Hashable, Sendable {
    /// The size of the fixed part: version, type, flags, stream id, length.
    public static let length = WireFormat.frameHeaderLength
    /// The size of the sequence number that follows the fixed part on sequenced types.
    public static let sequenceLength = 8

    public var version: UInt8
    public var type: FrameType
    public var flags: FrameFlags
    public var streamID: UInt32
    public var length: UInt32
    /// The frame's sequence number: present exactly on the sequenced types, never 0.
    public var sequence: UInt64?

    public init(
        version: UInt8 = WireFormat.version, type: FrameType, flags: FrameFlags, streamID: UInt32, length: UInt32,
        sequence: UInt64? = nil
    ) {
        self.version = version
        self.type = type
        self.flags = flags
        self.streamID = streamID
        self.length = length
        self.sequence = sequence
    }

    /// The header's size on the wire: 12, or 20 with a sequence number.
    public var encodedLength: Int { Self.length + (type.isSequenced ? Self.sequenceLength : 0) }

    public func encoded() -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(encodedLength)
        encode(into: &bytes)
        return bytes
    }

    /// Appends the header's bytes to `bytes`.
    public func encode(into bytes: inout [UInt8]) {
        bytes.append(version)
        bytes.append(type.rawValue)
        bytes.appendBigEndian(flags.rawValue)
        bytes.appendBigEndian(streamID)
        bytes.appendBigEndian(length)
        if type.isSequenced { bytes.appendBigEndian(sequence ?? 0) }
    }

    /// Decodes the header at the start of `bytes` and checks everything the header alone can
    /// tell: version, type, payload limit, stream id, and the sequence number of a sequenced type.
    ///
    /// - Parameter payloadLimit: the largest `DATA` or `MESSAGE` payload taken (the link's,
    ///   ``Hello/framePayloadLimit(_:_:)``); every other type's is ``WireFormat/maxFramePayload``.
    public static func decode(
        _ bytes: ArraySlice<UInt8>, payloadLimit: Int = WireFormat.maxFramePayload
    ) throws(WireError) -> FrameHeader {
        var reader = WireReader(bytes)
        guard let version = reader.uint8(), let typeByte = reader.uint8(), let flags = reader.uint16(),
            let streamID = reader.uint32(), let length = reader.uint32()
        else { throw .malformed("a frame header is at least 12 bytes, got \(bytes.count)") }
        guard version == WireFormat.version else {
            throw .malformed("frame version \(version) is not \(WireFormat.version)")
        }
        guard let type = FrameType(rawValue: typeByte) else {
            throw .malformed("frame type \(WireText.hex(typeByte)) is unknown")
        }
        let limit = type.carriesBulk ? payloadLimit : WireFormat.maxFramePayload
        guard length <= limit else {
            throw .malformed("a \(type) frame of \(length) bytes is over the limit of \(limit)")
        }
        if type.hasID, streamID == 0 {
            throw .malformed("a \(type) frame has id 0")
        } else if !type.hasID, streamID != 0 {
            throw .malformed("a \(type) frame has stream id \(streamID), not 0")
        }
        var sequence: UInt64?
        if type.isSequenced {
            guard let number = reader.uint64() else {
                throw .malformed("a \(type) frame header is 20 bytes with its sequence number, got \(bytes.count)")
            }
            guard number != 0 else { throw .malformed("a \(type) frame has sequence number 0") }
            sequence = number
        }
        return FrameHeader(
            version: version, type: type, flags: FrameFlags(rawValue: flags), streamID: streamID, length: length, sequence: sequence)
    }
}

/// One frame: what one record carries.
///
/// `GO_AWAY`, `CONTROL` and `DATAGRAM` frames are encoded without flags, and any flags on
/// them are ignored when decoding.
public enum Frame: Hashable, Sendable, CustomStringConvertible {
    /// Stream bytes (a part of a larger write shares its storage: ``FramePayload``).
    case data(stream: UInt32, flags: FrameFlags, payload: FramePayload)
    /// Credit added to the stream's send window.
    case windowUpdate(stream: UInt32, flags: FrameFlags, credit: UInt32)
    /// A ping request (``FrameFlags/syn``) or reply (``FrameFlags/ack``) with 8 opaque bytes.
    case ping(flags: FrameFlags, opaque: UInt64)
    /// The sender is closing the link.
    case goAway(code: GoAwayCode, reason: String)
    /// A session control message.
    case control(ControlMessage)
    /// A chunk of a reliable message; ``FrameFlags/more`` on every chunk but the last (a part of
    /// a larger message shares its storage: ``FramePayload``).
    case message(id: UInt32, flags: FrameFlags, chunk: FramePayload)
    /// One unreliable message, whole.
    case datagram([UInt8])
    /// Every sequenced frame up to this sequence number arrived (see ``FrameType/isSequenced``).
    case ack(receivedThrough: UInt64)

    public var type: FrameType {
        switch self {
        case .data: .data
        case .windowUpdate: .windowUpdate
        case .ping: .ping
        case .goAway: .goAway
        case .control: .control
        case .message: .message
        case .datagram: .datagram
        case .ack: .ack
        }
    }

    public var description: String {
        switch self {
        case .data(let stream, let flags, let payload): "DATA stream \(stream) \(flags) \(payload.count) bytes"
        case .windowUpdate(let stream, let flags, let credit): "WINDOW_UPDATE stream \(stream) \(flags) +\(credit)"
        case .ping(let flags, let opaque): "PING \(flags) \(WireText.hex(opaque))"
        case .goAway(let code, let reason): "GO_AWAY \(code): \(reason)"
        case .control(let message): "CONTROL \(message)"
        case .message(let id, let flags, let chunk): "MESSAGE \(id) \(flags) \(chunk.count) bytes"
        case .datagram(let payload): "DATAGRAM \(payload.count) bytes"
        case .ack(let through): "ACK through \(through)"
        }
    }

    /// A `DATA` or `MESSAGE` frame whose payload is over `maxPayload` bytes, cut in two that
    /// mean the same to the receiver: the first `maxPayload` bytes (a `MESSAGE` chunk with
    /// `MORE`, `DATA` without `FIN`), then the rest with the frame's flags. Nil for any other
    /// frame, one that fits, and a `DATA` frame that opens, accepts or resets its stream (`SYN`, `ACK`, `RST`:
    /// never that long).
    public func cut(at maxPayload: Int) -> (head: Frame, tail: Frame)? {
        guard maxPayload > 0 else { return nil }
        switch self {
        case .data(let stream, let flags, let payload) where payload.count > maxPayload && flags.isDisjoint(with: [.syn, .ack, .rst]):
            let (head, tail) = payload.split(at: maxPayload)
            return (.data(stream: stream, flags: flags.subtracting(.fin), payload: head), .data(stream: stream, flags: flags, payload: tail))
        case .message(let id, let flags, let chunk) where chunk.count > maxPayload:
            let (head, tail) = chunk.split(at: maxPayload)
            return (.message(id: id, flags: flags.union(.more), chunk: head), .message(id: id, flags: flags, chunk: tail))
        default:
            return nil
        }
    }

    /// The frame's bytes: header and payload.
    ///
    /// - Parameters:
    ///   - sequence: the sequence number of a sequenced frame (``FrameType/isSequenced``):
    ///     required there (1 or more), and only there.
    ///   - payloadLimit: the largest `DATA` or `MESSAGE` payload the link carries
    ///     (``Hello/framePayloadLimit(_:_:)``); every other type's is 16384 bytes.
    /// - Throws: a ``WireError`` (code 1) for a frame the format cannot carry: a payload over
    ///   its limit, id 0 on a `DATA`, `WINDOW_UPDATE` or `MESSAGE` frame, a sequence number
    ///   missing on a sequenced frame or given to another, or a control message that cannot be
    ///   encoded. A `GO_AWAY` reason that does not fit is cut instead.
    public func encoded(sequence: UInt64? = nil, payloadLimit: Int = WireFormat.maxFramePayload) throws(WireError) -> [UInt8] {
        var bytes: [UInt8] = []
        try encode(sequence: sequence, payloadLimit: payloadLimit, into: &bytes)
        return bytes
    }

    /// Appends the frame's bytes (``encoded(sequence:)``) to `bytes`: a record being built
    /// frame by frame. Throws as ``encoded(sequence:)`` does, and then appends nothing.
    public func encode(
        sequence: UInt64? = nil, payloadLimit: Int = WireFormat.maxFramePayload, into bytes: inout [UInt8]
    ) throws(WireError) {
        let id: UInt32
        let flags: FrameFlags
        // A DATA or MESSAGE frame's payload as it is; any other frame's written here.
        var carried: FramePayload?
        var payload: [UInt8] = []
        switch self {
        case .data(let stream, let dataFlags, let bytes):
            (id, flags, carried) = (stream, dataFlags, bytes)
        case .windowUpdate(let stream, let updateFlags, let credit):
            (id, flags) = (stream, updateFlags)
            payload.appendBigEndian(credit)
        case .ping(let pingFlags, let opaque):
            (id, flags) = (0, pingFlags)
            payload.appendBigEndian(opaque)
        case .goAway(let code, let reason):
            (id, flags) = (0, [])
            payload.appendBigEndian(code.rawValue)
            payload += WireText.utf8(reason, limit: WireFormat.maxFramePayload - 4)
        case .control(let message):
            (id, flags) = (0, [])
            payload = try message.encoded()
        case .message(let messageID, let messageFlags, let chunk):
            (id, flags, carried) = (messageID, messageFlags, chunk)
        case .datagram(let bytes):
            (id, flags, payload) = (0, [], bytes)
        case .ack(let through):
            (id, flags) = (0, [])
            payload.appendBigEndian(through)
        }
        if type.hasID, id == 0 { throw .malformed("a \(type) frame needs a non-zero id") }
        if type.isSequenced {
            guard let sequence, sequence != 0 else { throw .malformed("a \(type) frame needs a sequence number (1 or more)") }
        } else if sequence != nil {
            throw .malformed("a \(type) frame carries no sequence number")
        }
        let length = carried?.count ?? payload.count
        let limit = carried == nil ? WireFormat.maxFramePayload : payloadLimit
        guard length <= limit else {
            throw .malformed("a \(type) frame of \(length) bytes is over the limit of \(limit)")
        }
        let header = FrameHeader(type: type, flags: flags, streamID: id, length: UInt32(length), sequence: sequence)
        if bytes.isEmpty { bytes.reserveCapacity(header.encodedLength + length) }
        header.encode(into: &bytes)
        if let carried { carried.append(to: &bytes) } else { bytes.append(contentsOf: payload) }
    }

    /// Decodes a record's body (after decryption): one or more whole frames, back to back.
    ///
    /// - Throws: a ``WireError`` (code 1): an empty record, a frame cut short by the record's
    ///   end, an unknown version or type, a payload over the limit or of a size the type does
    ///   not allow, an id that does not fit the type, a missing or zero sequence number, a
    ///   malformed control message.
    ///
    /// - Parameter payloadLimit: the largest `DATA` or `MESSAGE` payload taken
    ///   (``FrameHeader/decode(_:payloadLimit:)``).
    public static func decodeRecord(
        _ record: ArraySlice<UInt8>, payloadLimit: Int = WireFormat.maxFramePayload
    ) throws(WireError) -> [(frame: Frame, sequence: UInt64?)] {
        var pin: RecordPin?
        return try decodeRecord(record, payloadLimit: payloadLimit, pinnable: nil, pin: &pin)
    }

    /// ``decodeRecord(_:)``, keeping each message chunk of at least ``RecordPin/minimumChunk``
    /// bytes as a part of `record` instead of a copy, when `pinnable` (the bytes the record's
    /// storage takes) is given: `pin` is then the record's pin if any chunk is such a part (the
    /// caller must not reuse the storage then), else nil.
    package static func decodeRecord(
        _ record: ArraySlice<UInt8>, payloadLimit: Int = WireFormat.maxFramePayload, pinnable: Int?, pin: inout RecordPin?
    ) throws(WireError) -> [(frame: Frame, sequence: UInt64?)] {
        pin = nil
        guard !record.isEmpty else { throw .malformed("a record holds no frame") }
        var frames: [(frame: Frame, sequence: UInt64?)] = []
        var rest = record
        while !rest.isEmpty {
            guard rest.count >= FrameHeader.length else {
                throw .malformed("a record ends with \(rest.count) bytes, shorter than a frame header (12)")
            }
            let header = try FrameHeader.decode(rest, payloadLimit: payloadLimit)
            let start = rest.startIndex + header.encodedLength
            guard rest.count >= header.encodedLength + Int(header.length) else {
                throw .malformed(
                    "the \(header.type) frame says \(header.length) bytes but the record holds \(rest.count - header.encodedLength)")
            }
            let payload = rest[start..<(start + Int(header.length))]
            if let pinnable, header.type == .message, payload.count >= RecordPin.minimumChunk {
                let recordPin = pin ?? RecordPin(size: pinnable)
                pin = recordPin
                frames.append((.message(id: header.streamID, flags: header.flags, chunk: FramePayload(payload, pinning: recordPin)), header.sequence))
            } else {
                frames.append((try decodePayload(header, payload), header.sequence))
            }
            rest = rest[(start + Int(header.length))...]
        }
        return frames
    }

    /// Decodes a record's body that holds exactly one frame (the sequence number, if any, is dropped).
    public static func decode(_ record: ArraySlice<UInt8>) throws(WireError) -> Frame {
        let frames = try decodeRecord(record)
        guard frames.count == 1 else { throw .malformed("the record holds \(frames.count) frames, not one") }
        return frames[0].frame
    }

    private static func decodePayload(_ header: FrameHeader, _ payload: ArraySlice<UInt8>) throws(WireError) -> Frame {
        var reader = WireReader(payload)
        switch header.type {
        case .data:
            return .data(stream: header.streamID, flags: header.flags, payload: FramePayload(Array(payload)))
        case .windowUpdate:
            guard payload.count == 4, let credit = reader.uint32() else {
                throw .malformed("a WINDOW_UPDATE payload is 4 bytes, not \(payload.count)")
            }
            return .windowUpdate(stream: header.streamID, flags: header.flags, credit: credit)
        case .ping:
            guard payload.count == 8, let opaque = reader.uint64() else {
                throw .malformed("a PING payload is 8 bytes, not \(payload.count)")
            }
            return .ping(flags: header.flags, opaque: opaque)
        case .goAway:
            guard let code = reader.uint32() else {
                throw .malformed("a GO_AWAY payload starts with a 4-byte code; it is \(payload.count) bytes")
            }
            return .goAway(code: GoAwayCode(rawValue: code), reason: WireText.lenient(reader.rest()))
        case .control:
            return .control(try ControlMessage.decode(payload))
        case .message:
            return .message(id: header.streamID, flags: header.flags, chunk: FramePayload(Array(payload)))
        case .datagram:
            return .datagram(Array(payload))
        case .ack:
            guard payload.count == 8, let through = reader.uint64() else {
                throw .malformed("an ACK payload is 8 bytes, not \(payload.count)")
            }
            return .ack(receivedThrough: through)
        }
    }

    public static func decode(_ record: [UInt8]) throws(WireError) -> Frame {
        try decode(record[...])
    }
}
