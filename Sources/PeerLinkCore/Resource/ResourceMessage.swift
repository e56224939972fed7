import Crypto

/// Constants of the resource (file) transfer protocol: one stream per transfer, named
/// ``streamName``, carrying ``ResourceMessage``s. The article *Files* specifies it.
public enum ResourceProtocol {
    /// The name of every stream that carries a resource transfer.
    public static let streamName = "peerlink.resource"
    /// The version byte at the start of every offer.
    public static let version: UInt8 = 1
    /// The largest body of one message; a `DATA` message carries at most ``chunkBytes``.
    public static let maximumBodyBytes = 256 * 1024
    /// How many file bytes a sender puts in one `DATA` message.
    public static let chunkBytes = 64 * 1024
    /// The longest reason text (UTF-8 bytes) in a `DECLINE`, `VERDICT` or `CANCEL`.
    public static let maximumReasonBytes = 1024
    /// The size of a message header: the type byte and a 4-byte big-endian body length.
    public static let headerBytes = 5
}

/// Names one transfer between a sender and a receiver; a re-offer with the same ID resumes it.
public struct TransferID: Hashable, Sendable, CustomStringConvertible {
    public static let byteCount = 16
    public let bytes: [UInt8]

    /// - Throws: `invalidParameter` unless `bytes` is 16 bytes long.
    public init(bytes: [UInt8]) throws(PeerLinkError) {
        guard bytes.count == Self.byteCount else {
            throw PeerLinkError(.invalidParameter, "a transfer ID is \(Self.byteCount) bytes, not \(bytes.count)")
        }
        self.bytes = bytes
    }

    /// A fresh random ID.
    public static func random() -> TransferID {
        var generator = SystemRandomNumberGenerator()
        return TransferID(unchecked: (0..<byteCount).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// The ID a sender derives from what it sends, so that sending the same file again (after
    /// the sending program itself was stopped) resumes where the receiver stopped: the first 16
    /// bytes of SHA-256("peerlink.resource" ‖ sha256 ‖ size ‖ name).
    public static func derived(sha256: [UInt8], size: UInt64, name: String) -> TransferID {
        var hasher = SHA256()
        hasher.update(data: Array(ResourceProtocol.streamName.utf8))
        hasher.update(data: sha256)
        var writer = ByteWriter()
        writer.u64(size)
        hasher.update(data: writer.bytes)
        hasher.update(data: Array(name.utf8))
        return TransferID(unchecked: Array(hasher.finalize().prefix(byteCount)))
    }

    private init(unchecked bytes: [UInt8]) {
        self.bytes = bytes
    }

    /// 32 lowercase hexadecimal digits.
    public var hex: String { bytes.map { byte in String(byte, radix: 16).leftPadded(to: 2) }.joined() }
    public var description: String { hex }
}

/// What the sender proposes: a file, by name, size and SHA-256.
public struct ResourceOffer: Hashable, Sendable {
    public var transferID: TransferID
    /// The file's name as the sender sanitised it; the receiver sanitises it again.
    public var name: String
    public var size: UInt64
    /// The SHA-256 of the whole file (32 bytes).
    public var sha256: [UInt8]

    public init(transferID: TransferID, name: String, size: UInt64, sha256: [UInt8]) {
        self.transferID = transferID
        self.name = name
        self.size = size
        self.sha256 = sha256
    }
}

/// The receiver's last word on a transfer.
public enum ResourceVerdict: Hashable, Sendable, CustomStringConvertible {
    /// The bytes hashed to the offered SHA-256 and the file is in place.
    case verified
    /// The bytes did not hash to the offered SHA-256; the receiver removed its partial file.
    case checksumMismatch
    /// The receiver could not finish (disk full, permission denied, ...): the text says why.
    case error(String)

    public var description: String {
        switch self {
        case .verified: "verified"
        case .checksumMismatch: "checksum mismatch"
        case .error(let reason): "error: \(reason)"
        }
    }
}

/// One message of a resource transfer stream. Each is a type byte, a 4-byte big-endian body
/// length and the body.
///
/// The exchange: the sender's ``offer(_:)``; the receiver's ``accept(offset:)`` (send the bytes
/// from this offset on) or ``decline(reason:)``; the sender's ``data(_:)`` messages, exactly
/// `size - offset` bytes in all; the receiver's ``verdict(_:)``. Either side may send
/// ``cancel(reason:)`` at any time and then reset the stream.
public enum ResourceMessage: Hashable, Sendable {
    case offer(ResourceOffer)
    case accept(offset: UInt64)
    case decline(reason: String)
    case data([UInt8])
    case verdict(ResourceVerdict)
    case cancel(reason: String)

    /// The type byte.
    public enum Kind: UInt8, Sendable, CaseIterable {
        case offer = 1
        case accept = 2
        case decline = 3
        case data = 4
        case verdict = 5
        case cancel = 6
    }

    public var kind: Kind {
        switch self {
        case .offer: .offer
        case .accept: .accept
        case .decline: .decline
        case .data: .data
        case .verdict: .verdict
        case .cancel: .cancel
        }
    }

    /// The message with its header, ready to write to the stream.
    ///
    /// - Throws: `invalidParameter` for a name over 255 bytes, a reason over
    ///   ``ResourceProtocol/maximumReasonBytes``, data over ``ResourceProtocol/maximumBodyBytes``,
    ///   or a SHA-256 that is not 32 bytes.
    public func encoded() throws(PeerLinkError) -> [UInt8] {
        var body = ByteWriter()
        switch self {
        case .offer(let offer):
            guard offer.sha256.count == 32 else {
                throw PeerLinkError(.invalidParameter, "an offer's SHA-256 is 32 bytes, not \(offer.sha256.count)")
            }
            let name = Array(offer.name.utf8)
            guard !name.isEmpty, name.count <= ResourceName.maximumBytes else {
                throw PeerLinkError(.invalidParameter, "an offered file name is 1 to \(ResourceName.maximumBytes) bytes of UTF-8, not \(name.count)")
            }
            body.u8(ResourceProtocol.version)
            body.append(offer.transferID.bytes)
            body.u64(offer.size)
            body.append(offer.sha256)
            body.u16(UInt16(name.count))
            body.append(name)
        case .accept(let offset):
            body.u64(offset)
        case .decline(let reason), .cancel(let reason):
            try body.reason(reason)
        case .data(let bytes):
            guard bytes.count <= ResourceProtocol.maximumBodyBytes else {
                throw PeerLinkError(.invalidParameter, "a DATA message carries at most \(ResourceProtocol.maximumBodyBytes) bytes, not \(bytes.count)")
            }
            body.append(bytes)
        case .verdict(let verdict):
            switch verdict {
            case .verified: body.u8(0)
            case .checksumMismatch: body.u8(1)
            case .error(let reason):
                body.u8(2)
                try body.reason(reason)
            }
        }
        var out = ByteWriter()
        out.u8(kind.rawValue)
        out.u32(UInt32(body.bytes.count))
        out.append(body.bytes)
        return out.bytes
    }

    /// Decodes one message body of type `kind`.
    ///
    /// - Throws: `unknown` with what is wrong, for a body that does not parse (a peer that does
    ///   not follow the protocol).
    public static func decode(kind: UInt8, body: ArraySlice<UInt8>) throws(PeerLinkError) -> ResourceMessage {
        guard let kind = Kind(rawValue: kind) else { throw malformed("unknown message type \(kind)") }
        var reader = ByteReader(body)
        let message: ResourceMessage
        switch kind {
        case .offer:
            guard let version = reader.u8() else { throw malformed("an empty offer") }
            guard version == ResourceProtocol.version else {
                throw PeerLinkError(.unsupported, "the peer offers a file with resource protocol version \(version); this version speaks \(ResourceProtocol.version): update PeerLink on both sides")
            }
            guard let id = reader.bytes(TransferID.byteCount), let size = reader.u64(), let sha = reader.bytes(32),
                let length = reader.u16(), let name = reader.bytes(Int(length))
            else { throw malformed("a truncated offer") }
            guard let text = String(validating: name, as: UTF8.self) else { throw malformed("an offered name that is not UTF-8") }
            message = .offer(ResourceOffer(transferID: try TransferID(bytes: id), name: text, size: size, sha256: sha))
        case .accept:
            guard let offset = reader.u64() else { throw malformed("a truncated accept") }
            message = .accept(offset: offset)
        case .decline:
            message = .decline(reason: try reader.reason())
        case .cancel:
            message = .cancel(reason: try reader.reason())
        case .data:
            message = .data(Array(body))
            reader.skipAll()
        case .verdict:
            switch reader.u8() {
            case 0: message = .verdict(.verified)
            case 1: message = .verdict(.checksumMismatch)
            case 2: message = .verdict(.error(try reader.reason()))
            case let code: throw malformed("an unknown verdict \(code.map(String.init) ?? "(none)")")
            }
        }
        guard reader.isAtEnd else { throw malformed("\(reader.remaining) bytes after a \(kind) message") }
        return message
    }

    /// The error for a peer that breaks the resource protocol: `unknown`, saying what it did.
    public static func violation(_ what: String) -> PeerLinkError {
        malformed(what)
    }

    static func malformed(_ what: String) -> PeerLinkError {
        PeerLinkError(.unknown, "the peer broke the resource protocol (\(what)): it may run an incompatible PeerLink")
    }
}

/// Splits the bytes of a resource stream into ``ResourceMessage``s, however the bytes arrive.
public struct ResourceMessageDecoder: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0

    public init() {}

    /// Adds bytes read from the stream.
    public mutating func append(_ bytes: [UInt8]) {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next whole message, or nil until more bytes arrive.
    ///
    /// - Throws: `unknown` for a body over ``ResourceProtocol/maximumBodyBytes`` or one that
    ///   does not parse.
    public mutating func next() throws(PeerLinkError) -> ResourceMessage? {
        let available = buffer.count - start
        guard available >= ResourceProtocol.headerBytes else { return nil }
        let kind = buffer[start]
        var length = 0
        for index in 1...4 { length = length << 8 | Int(buffer[start + index]) }
        guard length <= ResourceProtocol.maximumBodyBytes else {
            throw ResourceMessage.malformed("a message of \(length) bytes, over the limit of \(ResourceProtocol.maximumBodyBytes)")
        }
        guard available >= ResourceProtocol.headerBytes + length else { return nil }
        let bodyStart = start + ResourceProtocol.headerBytes
        let message = try ResourceMessage.decode(kind: kind, body: buffer[bodyStart..<bodyStart + length])
        start = bodyStart + length
        if start > 1 << 20 {
            buffer.removeFirst(start)
            start = 0
        }
        return message
    }

    /// Bytes received that do not yet make a whole message.
    public var pendingBytes: Int { buffer.count - start }
}

// MARK: - Byte helpers

struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u16(_ value: UInt16) { append(value.bigEndianBytes) }
    mutating func u32(_ value: UInt32) { append(value.bigEndianBytes) }
    mutating func u64(_ value: UInt64) { append(value.bigEndianBytes) }
    mutating func append(_ more: [UInt8]) { bytes.append(contentsOf: more) }

    mutating func reason(_ text: String) throws(PeerLinkError) {
        let utf8 = Array(text.utf8)
        guard utf8.count <= ResourceProtocol.maximumReasonBytes else {
            throw PeerLinkError(.invalidParameter, "a reason is at most \(ResourceProtocol.maximumReasonBytes) bytes of UTF-8, not \(utf8.count): shorten it")
        }
        u16(UInt16(utf8.count))
        append(utf8)
    }
}

struct ByteReader {
    private var bytes: ArraySlice<UInt8>

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
    }

    var isAtEnd: Bool { bytes.isEmpty }
    var remaining: Int { bytes.count }
    mutating func skipAll() { bytes = bytes[bytes.endIndex...] }

    mutating func bytes(_ count: Int) -> [UInt8]? {
        guard bytes.count >= count else { return nil }
        defer { bytes = bytes.dropFirst(count) }
        return Array(bytes.prefix(count))
    }

    mutating func u8() -> UInt8? { bytes(1)?.first }
    mutating func u16() -> UInt16? { bytes(2).map { UInt16(bigEndianBytes: $0) } }
    mutating func u64() -> UInt64? { bytes(8).map { UInt64(bigEndianBytes: $0) } }

    mutating func reason() throws(PeerLinkError) -> String {
        guard let length = u16(), let text = bytes(Int(length)) else { throw ResourceMessage.malformed("a truncated reason") }
        // The peer's words reach a terminal: escaped and cut (``PeerText``).
        return PeerText.sanitized(bytes: text, limit: PeerText.decodedReasonBytes)
    }
}

extension FixedWidthInteger {
    var bigEndianBytes: [UInt8] {
        (0..<Self.bitWidth / 8).reversed().map { shift in UInt8(truncatingIfNeeded: self >> (shift * 8)) }
    }

    init(bigEndianBytes bytes: [UInt8]) {
        self = bytes.reduce(0) { $0 << 8 | Self($1) }
    }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
