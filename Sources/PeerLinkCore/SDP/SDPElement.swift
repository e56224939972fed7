/// A Service Discovery Protocol data element (Bluetooth Core, Vol 3, Part B, §3): the typed
/// values SDP records and SDP PDUs are made of.
///
/// Each element starts with a header byte: the type (5 bits) then a size index (3 bits) —
/// 0 to 4 for 1, 2, 4, 8 or 16 bytes of data, 5 to 7 for an 8-, 16- or 32-bit length that
/// follows. Sizes the encoder picks are the smallest that fit.
public indirect enum SDPElement: Hashable, Sendable {
    case null
    case uint8(UInt8)
    case uint16(UInt16)
    case uint32(UInt32)
    case uint64(UInt64)
    case int8(Int8)
    case int16(Int16)
    case int32(Int32)
    case int64(Int64)
    case uuid16(UInt16)
    case uuid32(UInt32)
    case uuid128(BluetoothUUID)
    /// Text: bytes, by convention UTF-8 (SDP does not enforce it).
    case text([UInt8])
    case bool(Bool)
    case sequence([SDPElement])
    case alternative([SDPElement])
    case url([UInt8])
    /// A 128-bit integer or other element PeerLink does not interpret: type, size index and data.
    case other(type: UInt8, data: [UInt8])

    /// Why bytes are not a data element.
    public enum DecodingError: Error, Hashable, Sendable, CustomStringConvertible {
        case truncated(needed: Int, available: Int)
        case badSize(type: UInt8, sizeIndex: UInt8)
        case tooDeep

        public var description: String {
            switch self {
            case .truncated(let needed, let available):
                return "SDP data element needs \(needed) bytes, only \(available) are left"
            case .badSize(let type, let sizeIndex):
                return "SDP data element of type \(type) cannot have size index \(sizeIndex)"
            case .tooDeep:
                return "SDP data elements nested more than 16 deep"
            }
        }
    }

    /// The UUID as 128 bits, whatever its size on the wire (16- and 32-bit UUIDs are aliases
    /// within the Bluetooth base UUID).
    public var uuid: BluetoothUUID? {
        switch self {
        case .uuid16(let value): return BluetoothUUID(short: UInt32(value))
        case .uuid32(let value): return BluetoothUUID(short: value)
        case .uuid128(let value): return value
        default: return nil
        }
    }

    /// Any unsigned or signed integer, widened (not 128-bit ones).
    public var integer: Int64? {
        switch self {
        case .uint8(let value): return Int64(value)
        case .uint16(let value): return Int64(value)
        case .uint32(let value): return Int64(value)
        case .uint64(let value): return value <= UInt64(Int64.max) ? Int64(value) : nil
        case .int8(let value): return Int64(value)
        case .int16(let value): return Int64(value)
        case .int32(let value): return Int64(value)
        case .int64(let value): return value
        default: return nil
        }
    }

    /// The elements of a sequence or alternative.
    public var elements: [SDPElement]? {
        switch self {
        case .sequence(let elements), .alternative(let elements): return elements
        default: return nil
        }
    }

    public var textBytes: [UInt8]? {
        if case .text(let bytes) = self { return bytes }
        return nil
    }

    // MARK: Encoding

    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        encode(into: &out)
        return out
    }

    public func encode(into out: inout [UInt8]) {
        func fixed(_ type: UInt8, _ bytes: [UInt8]) {
            let index: UInt8
            switch bytes.count {
            case 1: index = 0
            case 2: index = 1
            case 4: index = 2
            case 8: index = 3
            default: index = 4
            }
            out.append(type << 3 | index)
            out += bytes
        }
        func variable(_ type: UInt8, _ bytes: [UInt8]) {
            if bytes.count <= 0xFF {
                out += [type << 3 | 5, UInt8(bytes.count)]
            } else if bytes.count <= 0xFFFF {
                out += [type << 3 | 6] + Self.bigEndian(UInt16(bytes.count))
            } else {
                out += [type << 3 | 7] + Self.bigEndian(UInt32(bytes.count))
            }
            out += bytes
        }
        switch self {
        case .null: out.append(0)
        case .uint8(let v): fixed(1, [v])
        case .uint16(let v): fixed(1, Self.bigEndian(v))
        case .uint32(let v): fixed(1, Self.bigEndian(v))
        case .uint64(let v): fixed(1, Self.bigEndian(v))
        case .int8(let v): fixed(2, [UInt8(bitPattern: v)])
        case .int16(let v): fixed(2, Self.bigEndian(UInt16(bitPattern: v)))
        case .int32(let v): fixed(2, Self.bigEndian(UInt32(bitPattern: v)))
        case .int64(let v): fixed(2, Self.bigEndian(UInt64(bitPattern: v)))
        case .uuid16(let v): fixed(3, Self.bigEndian(v))
        case .uuid32(let v): fixed(3, Self.bigEndian(v))
        case .uuid128(let v): fixed(3, v.bytes)
        case .text(let bytes): variable(4, bytes)
        case .bool(let v): fixed(5, [v ? 1 : 0])
        case .sequence(let elements), .alternative(let elements):
            var body: [UInt8] = []
            for element in elements { element.encode(into: &body) }
            variable(self.isSequence ? 6 : 7, body)
        case .url(let bytes): variable(8, bytes)
        case .other(let type, let data):
            if [1, 2, 4, 8, 16].contains(data.count) && type != 4 && type < 6 { fixed(type, data) } else { variable(type, data) }
        }
    }

    private var isSequence: Bool {
        if case .sequence = self { return true }
        return false
    }

    static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }

    // MARK: Decoding

    /// Decodes one element at the start of `bytes`; returns it and the bytes it took.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(DecodingError) -> (element: SDPElement, length: Int) {
        try decode(bytes, depth: 0)
    }

    /// Decodes `bytes` as exactly one element.
    public init(decoding bytes: [UInt8]) throws(DecodingError) {
        let (element, _) = try Self.decode(bytes[...])
        self = element
    }

    private static func decode(_ bytes: ArraySlice<UInt8>, depth: Int) throws(DecodingError) -> (element: SDPElement, length: Int) {
        guard depth <= 16 else { throw .tooDeep }
        guard let header = bytes.first else { throw .truncated(needed: 1, available: 0) }
        let type = header >> 3
        let index = header & 0x07
        var offset = 1
        let size: Int
        func need(_ count: Int) throws(DecodingError) {
            guard bytes.count >= offset + count else { throw .truncated(needed: offset + count, available: bytes.count) }
        }
        func integer(_ count: Int) -> Int {
            bytes.dropFirst(offset).prefix(count).reduce(0) { $0 << 8 | Int($1) }
        }
        switch index {
        case 0...4:
            size = type == 0 ? 0 : 1 << Int(index)
        case 5, 6, 7:
            let lengthBytes = 1 << Int(index - 5)
            try need(lengthBytes)
            size = integer(lengthBytes)
            offset += lengthBytes
        default:
            throw .badSize(type: type, sizeIndex: index)
        }
        try need(size)
        let data = Array(bytes.dropFirst(offset).prefix(size))
        let total = offset + size
        func number() -> UInt64 { data.reduce(0) { $0 << 8 | UInt64($1) } }
        let element: SDPElement
        switch (type, index) {
        case (0, 0): element = .null
        case (1, 0): element = .uint8(UInt8(number()))
        case (1, 1): element = .uint16(UInt16(number()))
        case (1, 2): element = .uint32(UInt32(number()))
        case (1, 3): element = .uint64(number())
        case (2, 0): element = .int8(Int8(bitPattern: UInt8(number())))
        case (2, 1): element = .int16(Int16(bitPattern: UInt16(number())))
        case (2, 2): element = .int32(Int32(bitPattern: UInt32(number())))
        case (2, 3): element = .int64(Int64(bitPattern: number()))
        case (3, 1): element = .uuid16(UInt16(number()))
        case (3, 2): element = .uuid32(UInt32(number()))
        case (3, 4): element = .uuid128(BluetoothUUID(bytes: data)!)
        case (4, 5...7): element = .text(data)
        case (5, 0): element = .bool(data[0] != 0)
        case (6, 5...7), (7, 5...7):
            var children: [SDPElement] = []
            var rest = data[...]
            while !rest.isEmpty {
                let (child, length) = try decode(rest, depth: depth + 1)
                children.append(child)
                rest = rest.dropFirst(length)
            }
            element = type == 6 ? .sequence(children) : .alternative(children)
        case (8, 5...7): element = .url(data)
        case (0, _), (1, 5...7), (2, 5...7), (3, _), (4, _), (5, _), (6, _), (7, _), (8, _):
            // Integers have fixed sizes (indices 0 to 4): one with a length is malformed.
            throw .badSize(type: type, sizeIndex: index)
        default: element = .other(type: type, data: data)
        }
        return (element, total)
    }
}
