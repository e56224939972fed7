/// The order in which one link's frames go out, as a pure value: control first, then messages,
/// then stream data round-robin between streams, so bulk data never holds up a chat message or
/// a `WINDOW_UPDATE` by more than the frame being written.
///
/// Lanes, taken in this order:
/// 1. **control**: `PING`, `GO_AWAY`, `CONTROL`, `ACK`, `WINDOW_UPDATE` (stream accepts and
///    credit) and stream resets (`DATA` with `RST`), first in, first out;
/// 2. **messages**: `MESSAGE` chunks and `DATAGRAM`s, first in, first out;
/// 3. **data**: other `DATA` frames (`SYN`, bytes, `FIN`), first in, first out within a stream,
///    one frame per stream per turn.
///
/// A reset drops the frames of its stream still waiting here (they would only be discarded by
/// the peer). A `DATA` or `MESSAGE` frame larger than the link that takes it carries is cut
/// where it is taken (``next(maxPayload:)``): bytes of a stream or chunks of a message may be
/// queued in frames of ``WireFormat/largeFramePayload`` and go out in frames of
/// ``WireFormat/maxFramePayload`` on a link to a peer, or over a transport, that takes no more.
public struct FrameScheduler: Sendable {
    public enum Lane: Hashable, Sendable {
        case control, messages, data
    }

    private var control = FrameQueue()
    private var messages = FrameQueue()
    private var streams: [UInt32: FrameQueue] = [:]
    /// Streams with frames waiting, in turn order.
    private var turns: [UInt32] = []
    private var turn = 0

    /// Payload bytes of the `DATA` frames waiting.
    public private(set) var queuedDataBytes = 0
    /// Encoded bytes of the frames waiting in the control and message lanes.
    public private(set) var queuedPriorityBytes = 0

    public init() {}

    public var isEmpty: Bool { control.isEmpty && messages.isEmpty && turns.isEmpty }

    /// Whether message or stream data frames wait (control frames aside).
    public var hasPayloadFrames: Bool { !messages.isEmpty || !turns.isEmpty }

    /// Frames waiting, in every lane.
    public var count: Int { control.count + messages.count + streams.values.reduce(0) { $0 + $1.count } }

    /// The lane a frame waits in.
    public static func lane(of frame: Frame) -> Lane {
        switch frame {
        case .ping, .goAway, .control, .windowUpdate, .ack: .control
        case .message, .datagram: .messages
        case .data(_, let flags, _): flags.contains(.rst) ? .control : .data
        }
    }

    public mutating func enqueue(_ frame: Frame) {
        switch Self.lane(of: frame) {
        case .control:
            if case .data(let id, _, _) = frame { dropStream(id) }
            control.append(frame)
            queuedPriorityBytes += Self.size(of: frame)
        case .messages:
            messages.append(frame)
            queuedPriorityBytes += Self.size(of: frame)
        case .data:
            guard case .data(let id, _, let payload) = frame else { return }
            if streams[id] == nil {
                streams[id] = FrameQueue()
                turns.append(id)
            }
            streams[id]!.append(frame)
            queuedDataBytes += payload.count
        }
    }

    /// The next frame to write, or nil when nothing waits. A `DATA` or `MESSAGE` frame with
    /// more than `maxPayload` bytes (``Frame/cut(at:)``) gives its first `maxPayload` bytes, and
    /// the rest waits first in its lane.
    public mutating func next(maxPayload: Int = .max) -> Frame? {
        if let frame = control.popFirst() {
            queuedPriorityBytes -= Self.size(of: frame)
            return frame
        }
        if let (frame, cut) = messages.popFirst(maxPayload: maxPayload) {
            // the rest of a cut frame still waits, with a header of its own
            queuedPriorityBytes -= Self.size(of: frame) - (cut ? Self.headerSize(of: frame) : 0)
            return frame
        }
        guard !turns.isEmpty else { return nil }
        if turn >= turns.count { turn = 0 }
        let id = turns[turn]
        guard let (frame, _) = streams[id]?.popFirst(maxPayload: maxPayload) else { return nil }
        if case .data(_, _, let payload) = frame { queuedDataBytes -= payload.count }
        if streams[id]!.isEmpty {
            streams[id] = nil
            turns.remove(at: turn)
        } else {
            turn += 1
        }
        return frame
    }

    /// Drops the `DATA` frames of stream `id` still waiting.
    public mutating func dropStream(_ id: UInt32) {
        guard let queue = streams.removeValue(forKey: id) else { return }
        queuedDataBytes -= queue.dataBytes
        if let index = turns.firstIndex(of: id) {
            turns.remove(at: index)
            if index < turn { turn -= 1 }
        }
    }

    /// Drops everything waiting.
    public mutating func removeAll() { self = FrameScheduler() }

    /// A frame's size on the wire: header (with the sequence number of a sequenced type) and payload.
    public static func size(of frame: Frame) -> Int {
        let payload: Int =
            switch frame {
            case .data(_, _, let bytes), .message(_, _, let bytes): bytes.count
            case .datagram(let bytes): bytes.count
            case .windowUpdate: 4
            case .ping, .ack: 8
            case .goAway(_, let reason): 4 + reason.utf8.count
            case .control(let message): (try? message.encoded())?.count ?? 0
            }
        return headerSize(of: frame) + payload
    }

    /// A frame's header size on the wire, with the sequence number of a sequenced type.
    static func headerSize(of frame: Frame) -> Int {
        WireFormat.frameHeaderLength + (frame.type.isSequenced ? FrameHeader.sequenceLength : 0)
    }
}

/// A first-in first-out queue of frames that pops in constant time.
private struct FrameQueue: Sendable {
    private var items = FIFO<Frame>()
    private(set) var dataBytes = 0
    /// No `DATA` or `MESSAGE` payload waiting is larger (since the queue was last empty): most
    /// takes need not look whether a frame must be cut.
    private var largestPayload = 0

    var isEmpty: Bool { items.isEmpty }
    var count: Int { items.count }

    mutating func append(_ frame: Frame) {
        items.append(frame)
        switch frame {
        case .data(_, _, let payload):
            dataBytes += payload.count
            largestPayload = max(largestPayload, payload.count)
        case .message(_, _, let chunk):
            largestPayload = max(largestPayload, chunk.count)
        default:
            break
        }
    }

    mutating func popFirst() -> Frame? {
        guard let frame = items.removeFirst() else { return nil }
        if case .data(_, _, let payload) = frame { dataBytes -= payload.count }
        if items.isEmpty { largestPayload = 0 }
        return frame
    }

    /// The first frame, or its first `maxPayload` bytes when it is a longer `DATA` or `MESSAGE`
    /// frame (`cut`: the rest stays first).
    mutating func popFirst(maxPayload: Int) -> (frame: Frame, cut: Bool)? {
        let largest = largestPayload
        guard largest > maxPayload else { return popFirst().map { ($0, false) } }
        guard let frame = popFirst() else { return nil }
        guard let (head, tail) = frame.cut(at: maxPayload) else { return (frame, false) }
        items.prepend(tail)
        largestPayload = largest  // still a bound (the pop may have emptied the queue)
        if case .data(_, _, let payload) = tail { dataBytes += payload.count }
        return (head, true)
    }
}
