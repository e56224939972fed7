/// The bytes a `DATA` or `MESSAGE` frame carries: a whole array, or a part of a larger one that
/// shares its storage (a chunk of a message, a piece of a stream write), so that cutting a
/// message or a write into frames copies nothing.
///
/// As small as an array (one word): a frame is copied several times on its way, and a larger
/// payload would make every small message pay for what only large ones gain. A part costs one
/// small allocation instead of a copy of its bytes.
public struct FramePayload: Hashable, Sendable, ExpressibleByArrayLiteral, CustomStringConvertible {
    private final class Part: Sendable {
        let bytes: ArraySlice<UInt8>
        init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }
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
