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
/// the peer).
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

    /// The next frame to write, or nil when nothing waits.
    public mutating func next() -> Frame? {
        if let frame = control.popFirst() ?? messages.popFirst() {
            queuedPriorityBytes -= Self.size(of: frame)
            return frame
        }
        guard !turns.isEmpty else { return nil }
        if turn >= turns.count { turn = 0 }
        let id = turns[turn]
        guard let frame = streams[id]?.popFirst() else { return nil }
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
        return WireFormat.frameHeaderLength + (frame.type.isSequenced ? FrameHeader.sequenceLength : 0) + payload
    }
}

/// A first-in first-out queue of frames that pops in constant time.
private struct FrameQueue: Sendable {
    private var items = FIFO<Frame>()
    private(set) var dataBytes = 0

    var isEmpty: Bool { items.isEmpty }
    var count: Int { items.count }

    mutating func append(_ frame: Frame) {
        items.append(frame)
        if case .data(_, _, let payload) = frame { dataBytes += payload.count }
    }

    mutating func popFirst() -> Frame? {
        guard let frame = items.removeFirst() else { return nil }
        if case .data(_, _, let payload) = frame { dataBytes -= payload.count }
        return frame
    }
}
