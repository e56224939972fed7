/// Records: a 2-byte length, then that many bytes. Handshake messages travel the same way.
public enum Record {
    /// `body` behind its 2-byte length. The caller keeps bodies at most 65535 bytes (frames,
    /// sealed frames and Noise messages all are); a longer body is cut, never trapped on.
    public static func framed(_ body: [UInt8]) -> [UInt8] {
        let length = min(body.count, Int(UInt16.max))
        var bytes: [UInt8] = []
        bytes.reserveCapacity(2 + length)
        bytes.appendBigEndian(UInt16(length))
        bytes += body.prefix(length)
        return bytes
    }

    /// The record at the start of `bytes`: its body and the bytes it took, or nil when more
    /// bytes are needed. A length over `maxLength` fails at once, before any of it is buffered;
    /// so does one under `minLength`.
    public static func parse(
        prefix bytes: ArraySlice<UInt8>, maxLength: Int, minLength: Int = 0
    ) throws(WireError) -> (body: ArraySlice<UInt8>, consumed: Int)? {
        var reader = WireReader(bytes)
        guard let length = reader.uint16() else { return nil }
        guard Int(length) <= maxLength else {
            throw .malformed("a record of \(length) bytes is over the limit of \(maxLength)")
        }
        guard Int(length) >= minLength else {
            throw .malformed("a record of \(length) bytes is under the minimum of \(minLength)")
        }
        guard let body = reader.bytes(Int(length)) else { return nil }
        return (body, 2 + Int(length))
    }

    /// How many bytes the record at the start of `bytes` takes with its length, as far as its
    /// start tells: the whole record once its length arrived, 2 (the length) before.
    package static func expectedLength(prefix bytes: ArraySlice<UInt8>) -> Int {
        var reader = WireReader(bytes)
        guard let length = reader.uint16() else { return 2 }
        return 2 + Int(length)
    }
}

/// A byte queue for input that arrives in pieces: append at the back, consume from the front,
/// never more than `capacity` bytes held.
///
/// Input that arrives while the queue is empty is not copied: the queue reads it where it lies
/// (``fill(from:)`` lends it), and only what is left of it when the caller is done with the input
/// (the start of an item not yet complete) is copied into the queue's own storage by
/// ``keepRest()``. So a read that holds whole records costs no copy, and the caller's read
/// buffer is free to be reused once `keepRest()` returned. When the next input comes, only what
/// completes that item is copied behind it, if its reader said how long it is (``expect(_:)``):
/// the rest is lent again once the item is consumed.
package struct InputBuffer: Sendable {
    package let capacity: Int
    /// The queue's own bytes, from `start`; reused (its capacity kept) as it empties.
    private var storage: [UInt8] = []
    private var start = 0
    /// Input read where it lies, while `storage` holds nothing.
    private var lent: ArraySlice<UInt8> = []
    /// How many bytes the item at the front takes, when its reader could tell (0: not known).
    private var expected = 0

    package init(capacity: Int) {
        self.capacity = capacity
    }

    package var count: Int { storage.count - start + lent.count }
    package var room: Int { capacity - count }
    package var readable: ArraySlice<UInt8> { lent.isEmpty ? storage[start...] : lent }

    /// How many bytes the storage that ``readable`` is a part of takes, when that storage is
    /// the queue's own (nil while it is lent input: the caller's buffer is reused). Parts of it
    /// may then outlive the queue's use of it: see ``consume(_:keepingParts:)``.
    package var ownedStorageSize: Int? { lent.isEmpty && count > 0 ? storage.capacity : nil }

    /// Takes as many of `bytes` as fit and returns the rest: lent when the queue is empty,
    /// appended to its storage otherwise. When the front item's length is known (``expect(_:)``),
    /// only what completes it is appended: the rest is lent once the item is consumed, instead
    /// of copied behind it.
    package mutating func fill(from bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var taken = min(room, bytes.count)
        if count > 0, expected > count { taken = min(taken, expected - count) }
        if count == 0 {
            lent = taken > 0 ? bytes.prefix(taken) : []
            return bytes.dropFirst(taken)
        }
        keepRest()
        if start > 0, start >= storage.count / 2 {
            storage.removeFirst(start)
            start = 0
        }
        // Room for the whole item at once, no more: storage kept alive by parts of an item (see
        // consume(_:keepingParts:)) is as large as that item, and it is not grown twice.
        if expected > count, storage.capacity < start + expected { storage.reserveCapacity(start + expected) }
        storage += bytes.prefix(taken)
        return bytes.dropFirst(taken)
    }

    /// The item at the front, not complete yet, takes `length` bytes in all: ``fill(from:)``
    /// appends no more than that while it is there. Forgotten when anything is consumed.
    package mutating func expect(_ length: Int) {
        expected = length
    }

    package mutating func consume(_ count: Int) {
        consume(count, keepingParts: false)
    }

    /// Consumes `count` bytes; `keepingParts`: parts of them live on elsewhere (sharing the
    /// storage, ``ownedStorageSize``), so the storage is left to them instead of emptied for
    /// reuse, and the next item gets storage of its own size.
    package mutating func consume(_ count: Int, keepingParts: Bool) {
        let count = max(count, 0)
        expected = 0
        if !lent.isEmpty {
            // An empty slice would still hold on to the caller's buffer.
            lent = count < lent.count ? lent.dropFirst(count) : []
            return
        }
        start = min(start + count, storage.count)
        if start == storage.count {
            if keepingParts {
                storage = []
            } else {
                storage.removeAll(keepingCapacity: storage.capacity <= 2 * capacity)
            }
            start = 0
        } else if keepingParts {
            // What follows moves to storage of its own (not in a link, which completes one
            // item at a time in its storage).
            storage = Array(storage[start...])
            start = 0
        }
    }

    /// Copies what is left of lent input into the queue's own storage, so that the queue no
    /// longer refers to the caller's bytes. Call before the input's buffer is reused.
    package mutating func keepRest() {
        guard !lent.isEmpty else { return }
        // Lending happens only while the storage is empty.
        storage.removeAll(keepingCapacity: storage.capacity <= 2 * capacity)
        start = 0
        if storage.capacity < max(lent.count, expected) { storage.reserveCapacity(max(lent.count, expected)) }
        storage += lent
        lent = []
    }

    package mutating func removeAll() {
        storage = []
        start = 0
        lent = []
        expected = 0
    }
}

/// Turns a byte stream cut anywhere into records (2-byte length prefix), holding at most one
/// record's worth of bytes.
///
/// Errors are values: the output of each call is the records it completed, then at most one
/// failure, after which the decoder is done and every later call returns nothing. Feeding the
/// same bytes in any pieces gives the same sequence of results.
public struct RecordDecoder: Sendable {
    public let maxRecordLength: Int
    public let minRecordLength: Int
    private var buffer: InputBuffer
    public private(set) var failure: WireError?

    /// - Parameters:
    ///   - maxRecordLength: the longest body accepted (at most 65535).
    ///   - minRecordLength: the shortest body accepted.
    public init(
        maxRecordLength: Int = WireFormat.maxRecordLength(encrypted: false),
        minRecordLength: Int = 0
    ) {
        self.maxRecordLength = min(max(maxRecordLength, 0), Int(UInt16.max))
        self.minRecordLength = minRecordLength
        buffer = InputBuffer(capacity: 2 + self.maxRecordLength)
    }

    /// The bytes held back: the start of a record not yet complete.
    public var bufferedByteCount: Int { buffer.count }

    public mutating func decode(_ bytes: ArraySlice<UInt8>) -> [Result<[UInt8], WireError>] {
        guard failure == nil else { return [] }
        var results: [Result<[UInt8], WireError>] = []
        var input = bytes
        while true {
            do {
                if let (body, consumed) = try Record.parse(
                    prefix: buffer.readable, maxLength: maxRecordLength, minLength: minRecordLength)
                {
                    results.append(.success(Array(body)))
                    buffer.consume(consumed)
                    continue
                }
            } catch {
                failure = error
                buffer.removeAll()
                results.append(.failure(error))
                return results
            }
            if input.isEmpty {
                buffer.keepRest()
                return results
            }
            buffer.expect(Record.expectedLength(prefix: buffer.readable))
            input = buffer.fill(from: input)
        }
    }

    public mutating func decode(_ bytes: [UInt8]) -> [Result<[UInt8], WireError>] {
        decode(bytes[...])
    }

    /// The end of the stream: a failure if it ends inside a record.
    public mutating func finish() -> WireError? {
        guard failure == nil else { return nil }
        guard buffer.count == 0 else {
            let error = WireError.malformed("the stream ends inside a record (\(buffer.count) bytes of it arrived)")
            failure = error
            buffer.removeAll()
            return error
        }
        return nil
    }
}

/// Records of unencrypted frames: a ``RecordDecoder`` whose records are decoded as frames.
public struct FrameDecoder: Sendable {
    private var records = RecordDecoder(
        maxRecordLength: WireFormat.maxRecordLength(encrypted: false),
        minRecordLength: WireFormat.minRecordLength(encrypted: false))
    private var failed = false

    public init() {}

    public var bufferedByteCount: Int { records.bufferedByteCount }

    public mutating func decode(_ bytes: ArraySlice<UInt8>) -> [Result<Frame, WireError>] {
        guard !failed else { return [] }
        var results: [Result<Frame, WireError>] = []
        for record in records.decode(bytes) {
            switch record {
            case .success(let body):
                do {
                    results.append(.success(try Frame.decode(body)))
                } catch {
                    failed = true
                    results.append(.failure(error))
                    return results
                }
            case .failure(let error):
                failed = true
                results.append(.failure(error))
            }
        }
        return results
    }

    public mutating func decode(_ bytes: [UInt8]) -> [Result<Frame, WireError>] {
        decode(bytes[...])
    }

    /// The end of the stream: a failure if it ends inside a record.
    public mutating func finish() -> WireError? {
        guard !failed else { return nil }
        let error = records.finish()
        if error != nil { failed = true }
        return error
    }

    /// One frame as a record's bytes (unencrypted).
    public static func record(_ frame: Frame, sequence: UInt64? = nil) throws(WireError) -> [UInt8] {
        Record.framed(try frame.encoded(sequence: sequence))
    }
}
