/// The bytes a `DATA` or `MESSAGE` frame carries: a whole array, or a part of a larger one that
/// shares its storage (a chunk of a message, a piece of a stream write), so that cutting a
/// message or a write into frames copies nothing.
///
/// As small as an array (one word): a frame is copied several times on its way, and a larger
/// payload would make every small message pay for what only large ones gain. A part costs one
/// small allocation instead of a copy of its bytes.
///
/// A received chunk of a large message may be a part of the record it arrived in (see
/// `RecordPin`): the record's bytes stay alive while the chunk waits for the rest of its
/// message, and the chunk is copied once, into the joined message.
public struct FramePayload: Hashable, Sendable, ExpressibleByArrayLiteral, CustomStringConvertible {
    private final class Part: Sendable {
        let bytes: ArraySlice<UInt8>
        let pin: RecordPin?
        init(_ bytes: ArraySlice<UInt8>, pin: RecordPin? = nil) {
            self.bytes = bytes
            self.pin = pin
        }
    }

    private enum Storage: Sendable {
        case whole([UInt8])
        case part(Part)
    }

    private let storage: Storage

    /// All of `bytes`.
    public init(_ bytes: [UInt8]) { storage = .whole(bytes) }

    /// The bytes of `slice`, sharing its storage.
    public init(_ slice: ArraySlice<UInt8>) { storage = .part(Part(slice)) }

    /// The bytes of `bytes` in `range`: the array itself when the range is all of it, else a
    /// part sharing its storage.
    public init(_ bytes: [UInt8], _ range: Range<Int>) {
        storage = range == bytes.indices ? .whole(bytes) : .part(Part(bytes[range]))
    }

    /// The bytes of `slice`, a part of the received record `pin` stands for (sharing its storage).
    package init(_ slice: ArraySlice<UInt8>, pinning pin: RecordPin) { storage = .part(Part(slice, pin: pin)) }

    /// The received record whose bytes this payload is a part of (and keeps alive), if any.
    package var pin: RecordPin? {
        switch storage {
        case .whole: nil
        case .part(let part): part.pin
        }
    }

    /// The bytes of a sequence (copied).
    public init(_ bytes: some Sequence<UInt8>) { storage = .whole(Array(bytes)) }

    /// `count` bytes of `byte`.
    public init(repeating byte: UInt8, count: Int) { storage = .whole([UInt8](repeating: byte, count: count)) }

    public init(arrayLiteral elements: UInt8...) { storage = .whole(elements) }

    public var count: Int {
        switch storage {
        case .whole(let bytes): bytes.count
        case .part(let part): part.bytes.count
        }
    }

    public var isEmpty: Bool { count == 0 }

    /// The bytes as an array: the array itself for a whole payload (no copy), a copy for a part.
    public var array: [UInt8] {
        switch storage {
        case .whole(let bytes): bytes
        case .part(let part): Array(part.bytes)
        }
    }

    /// The first `count` bytes and the rest (`0 < count < self.count`), each sharing this
    /// payload's storage (and record, if any): a frame cut in two copies nothing.
    public func split(at count: Int) -> (head: FramePayload, tail: FramePayload) {
        precondition(count > 0 && count < self.count, "a payload of \(self.count) bytes cannot be cut at \(count)")
        switch storage {
        case .whole(let bytes):
            return (FramePayload(bytes, 0..<count), FramePayload(bytes, count..<bytes.count))
        case .part(let part):
            let cut = part.bytes.startIndex + count
            return (
                FramePayload(storage: .part(Part(part.bytes[..<cut], pin: part.pin))),
                FramePayload(storage: .part(Part(part.bytes[cut...], pin: part.pin)))
            )
        }
    }

    private init(storage: Storage) { self.storage = storage }

    /// Calls `body` with the bytes, in place.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch storage {
        case .whole(let bytes): try bytes.withUnsafeBytes(body)
        case .part(let part): try part.bytes.withUnsafeBytes(body)
        }
    }

    /// Appends the bytes to `buffer`.
    public func append(to buffer: inout [UInt8]) {
        switch storage {
        case .whole(let bytes): buffer.append(contentsOf: bytes)
        case .part(let part): buffer.append(contentsOf: part.bytes)
        }
    }

    public static func == (lhs: FramePayload, rhs: FramePayload) -> Bool {
        guard lhs.count == rhs.count else { return false }
        return lhs.withUnsafeBytes { left in rhs.withUnsafeBytes { right in left.elementsEqual(right) } }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    public var description: String { "\(count) bytes" }
}

/// A received record whose bytes chunks of messages share (``FramePayload/init(_:pinning:)``)
/// instead of being copied out of it: the record is kept alive, all of it, while any of them is.
/// Its identity tells the chunks of one record apart from another's, so what they hold is
/// counted once (``MessageReassembly``); `size` is the memory they keep alive.
package final class RecordPin: Sendable {
    /// The bytes the record's storage takes (its capacity).
    package let size: Int

    package init(size: Int) { self.size = size }

    /// The smallest message chunk kept as a part of its record: a smaller one is copied out (a
    /// copy of a few KiB costs less than a part and its count).
    package static let minimumChunk = 4096
}
