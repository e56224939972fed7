/// A control message waiting to be sent. Invitations and joins are written out only when the
/// frame is taken, so they carry the session id and remaining timeout of that moment.
enum QueuedControl: Hashable, Sendable {
    /// `INVITE` for one of the local peer's invitations.
    case invite(InvitationID)
    /// `JOIN` for the current session.
    case join
    /// Any other control message, as is.
    case message(ControlMessage)
}

/// A reliable message on its way out: whole bytes, and how far it got (chunks taken go to the
/// pair's continuity, which delivers them whatever link carries them).
struct OutgoingMessage: Sendable {
    var bytes: [UInt8]
    /// Bytes already taken as chunks.
    var offset = 0
    /// The message id (per peer), given when its first chunk is taken.
    var id: UInt32?
}

/// Everything queued for one peer, whatever link will carry it: the peer's send link can
/// change (a duplicate collapsed, a link lost, an upgrade), and the queue moves with the peer.
///
/// Three lanes: control messages first (first in, first out); then unreliable messages (a small
/// bounded lane) and reliable messages take turns, a datagram then a chunk, so neither waits
/// behind the other; reliable messages go one chunk per turn, round-robin among the messages
/// started (a message with chunks left goes to the back of them), so a small message queued
/// after a large one is finished long before the large one. At most ``maxInterleaved`` messages
/// of at most ``interleaveBytes`` together are started at once (one larger message alone): what
/// the receiver holds in part stays within that, whatever the sender queued. Every operation on
/// the lanes is O(1) amortised, however many messages wait.
struct PeerOutbox: Sendable {
    private var control = FIFO<QueuedControl>()
    private var datagrams = FIFO<[UInt8]>()
    /// Reliable messages not started yet, in the order they were sent.
    private var messages = FIFO<OutgoingMessage>()
    /// Reliable messages started (round-robin among them), and their bytes in all.
    private var started = FIFO<OutgoingMessage>()
    private var startedBytes = 0
    /// The last frame taken from the datagram and message lanes was a datagram.
    private(set) var datagramsLast = false

    /// At most this many messages are started at once…
    static let maxInterleaved = 8
    /// … of at most this many bytes together (a larger message is started alone).
    static let interleaveBytes = WireFormat.maxMessageLength

    var isEmpty: Bool { control.isEmpty && datagrams.isEmpty && messages.isEmpty && started.isEmpty }
    var hasMessages: Bool { !messages.isEmpty || !started.isEmpty }

    mutating func enqueue(_ item: QueuedControl) { control.append(item) }

    func contains(_ item: QueuedControl) -> Bool { control.items.contains(item) }

    mutating func removeControl(where predicate: (QueuedControl) -> Bool) { control.removeAll(where: predicate) }

    /// Queues a datagram; false (nothing queued) when the lane already holds `limit`.
    mutating func enqueueDatagram(_ bytes: [UInt8], limit: Int) -> Bool {
        guard datagrams.count < limit else { return false }
        datagrams.append(bytes)
        return true
    }

    mutating func enqueueMessage(_ bytes: [UInt8]) { messages.append(OutgoingMessage(bytes: bytes)) }

    mutating func removeAll() { self = PeerOutbox() }

    mutating func takeControl() -> QueuedControl? { control.removeFirst() }

    mutating func takeDatagram() -> [UInt8]? {
        guard let datagram = datagrams.removeFirst() else { return nil }
        datagramsLast = true
        return datagram
    }

    /// The next chunk, round-robin across the messages started: one chunk of the first of them,
    /// which then goes to the back if it has chunks left. Messages waiting are started, in
    /// order, while ``maxInterleaved`` and ``interleaveBytes`` allow. `nextID` gives a message
    /// its id when its first chunk is taken (counting up on the link, skipping 0). A chunk is at
    /// most `maxChunk` bytes (the link's; the last of a message may be shorter).
    mutating func takeChunk(nextID: inout UInt32, maxChunk: Int = WireFormat.maxFramePayload) -> Frame? {
        while let next = messages.first,
            started.isEmpty || (started.count < Self.maxInterleaved && startedBytes + next.bytes.count <= Self.interleaveBytes)
        {
            _ = messages.removeFirst()
            started.append(next)
            startedBytes += next.bytes.count
        }
        guard var message = started.removeFirst() else { return nil }
        datagramsLast = false
        let id: UInt32
        if let existing = message.id {
            id = existing
        } else {
            id = nextID
            nextID = nextID == .max ? 1 : nextID + 1
            message.id = id
        }
        let end = min(message.offset + maxChunk, message.bytes.count)
        // A message that fits one frame is its own chunk; a longer one's chunks are parts of it
        // (its storage shared, kept while the pair's continuity holds a chunk for a resend):
        // no copy either way.
        let chunk = FramePayload(message.bytes, message.offset..<end)
        message.offset = end
        let finished = end == message.bytes.count
        if finished { startedBytes -= message.bytes.count } else { started.append(message) }
        return .message(id: id, flags: finished ? [] : .more, chunk: chunk)
    }
}

/// Reassembles the reliable messages arriving on one link, per message id; chunks of different
/// messages may interleave.
///
/// A message of one chunk is that chunk, not a copy. A longer one is kept as its chunks (runs of
/// small chunks merged until they fill a frame, so a peer sending tiny chunks costs no more than
/// their bytes) and joined once, into a buffer of the message's size, when its last chunk
/// arrives: not grown and copied again as it arrives. A large chunk may be a part of the record
/// it arrived in (``RecordPin``), kept as it is: ``bufferedBytes`` counts its bytes while the
/// chunks held of that record make up at least half of it, and the whole record once they are
/// less (so a peer cannot make a few bytes of each record hold all of it uncounted).
package struct MessageReassembly: Sendable {
    private struct Partial {
        var pieces: [FramePayload] = []
        var count = 0
    }

    /// The chunks held of one record (``RecordPin``).
    private struct Pinned {
        let size: Int
        var chunks = 0
        var bytes = 0
        /// What it adds to ``bufferedBytes``.
        var counted: Int { 2 * bytes >= size ? bytes : size }
    }

    private var partial: [UInt32: Partial] = [:]
    /// The records that chunks held in ``partial`` are parts of.
    private var pins: [ObjectIdentifier: Pinned] = [:]
    /// The memory held for ``partial``, as the session's limits count it: the bytes of the
    /// chunks (see the type's note for the records chunks are parts of).
    package private(set) var bufferedBytes = 0

    package init() {}

    /// How many buffers hold the messages received in part (for tests of what they cost).
    package var bufferCount: Int { partial.values.reduce(0) { $0 + $1.pieces.count } }

    package enum Outcome: Equatable {
        case incomplete
        case complete([UInt8])
        /// Over ``WireFormat/maxMessageLength``: a protocol error.
        case tooLarge(Int)
    }

    /// Takes a chunk of message `id`. A whole chunk (a decoded frame's) is kept or delivered as
    /// its own array, not copied; a part of a received record is kept as it is.
    package mutating func add(id: UInt32, flags: FrameFlags, chunk: FramePayload) -> Outcome {
        // (no look-up while nothing waits: most messages are one chunk)
        guard !partial.isEmpty, var message = partial.removeValue(forKey: id) else {
            // The first chunk: a whole message when no more follow (a chunk is never over the
            // limit: a frame is far shorter).
            guard flags.contains(.more) else { return .complete(chunk.array) }
            var message = Partial()
            keep(chunk, in: &message)
            partial[id] = message
            return .incomplete
        }
        let total = message.count + chunk.count
        guard total <= WireFormat.maxMessageLength else {
            release(message)
            return .tooLarge(total)
        }
        if flags.contains(.more) {
            keep(chunk, in: &message)
            partial[id] = message
            return .incomplete
        }
        release(message)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(total)
        for piece in message.pieces { piece.append(to: &bytes) }
        chunk.append(to: &bytes)
        return .complete(bytes)
    }

    /// Adds `chunk` to `message`'s pieces, and what it holds to ``bufferedBytes``.
    private mutating func keep(_ chunk: FramePayload, in message: inout Partial) {
        message.count += chunk.count
        if let pin = chunk.pin {
            message.pieces.append(chunk)
            count(pin, chunks: 1, bytes: chunk.count)
            return
        }
        bufferedBytes += chunk.count
        if let last = message.pieces.indices.last, message.pieces[last].pin == nil,
            message.pieces[last].count < WireFormat.maxFramePayload
        {
            var bytes = message.pieces[last].array
            message.pieces[last] = []
            chunk.append(to: &bytes)
            message.pieces[last] = FramePayload(bytes)
        } else {
            message.pieces.append(FramePayload(chunk.array))
        }
    }

    /// Takes what `message`'s pieces hold off ``bufferedBytes``.
    private mutating func release(_ message: Partial) {
        for piece in message.pieces {
            if let pin = piece.pin {
                count(pin, chunks: -1, bytes: -piece.count)
            } else {
                bufferedBytes -= piece.count
            }
        }
    }

    /// Counts `chunks` more chunks of `pin`'s record, of `bytes` bytes (fewer when negative).
    private mutating func count(_ pin: RecordPin, chunks: Int, bytes: Int) {
        let key = ObjectIdentifier(pin)
        var pinned = Pinned(size: pin.size)
        if let held = pins[key] {
            pinned = held
            bufferedBytes -= held.counted
        }
        pinned.chunks += chunks
        pinned.bytes += bytes
        if pinned.chunks > 0 {
            bufferedBytes += pinned.counted
            pins[key] = pinned
        } else {
            pins[key] = nil
        }
    }
}
