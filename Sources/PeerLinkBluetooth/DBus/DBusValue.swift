/// A D-Bus value with its type, as it goes into or comes out of a message.
///
/// Containers carry the signatures of their elements, so an empty array still has a type.
/// Accessors (`string`, `bool`, `dictionary`, …) look through variants, so reading
/// `a{sv}` properties stays short.
enum DBusValue: Hashable, Sendable {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    /// A Unix file descriptor. Received ones are owned by the receiver, who must close them.
    case unixFD(Int32)
    case array(element: String, [DBusValue])
    case dictionary(key: String, value: String, [Entry])
    indirect case variant(DBusValue)
    case structure([DBusValue])

    struct Entry: Hashable, Sendable {
        var key: DBusValue
        var value: DBusValue
    }

    /// `a{sv}`, the shape of D-Bus property sets and option dictionaries.
    static func properties(_ values: [String: DBusValue]) -> DBusValue {
        .dictionary(key: "s", value: "v", values.keys.sorted().map { Entry(key: .string($0), value: .variant(values[$0]!)) })
    }

    /// `as`.
    static func strings(_ values: [String]) -> DBusValue { .array(element: "s", values.map(DBusValue.string)) }

    /// The D-Bus type signature of this value.
    var signature: String {
        switch self {
        case .byte: return "y"
        case .bool: return "b"
        case .int16: return "n"
        case .uint16: return "q"
        case .int32: return "i"
        case .uint32: return "u"
        case .int64: return "x"
        case .uint64: return "t"
        case .double: return "d"
        case .string: return "s"
        case .objectPath: return "o"
        case .signature: return "g"
        case .unixFD: return "h"
        case .array(let element, _): return "a" + element
        case .dictionary(let key, let value, _): return "a{" + key + value + "}"
        case .variant: return "v"
        case .structure(let fields): return "(" + fields.map(\.signature).joined() + ")"
        }
    }

    /// The value inside any number of variants.
    var unwrapped: DBusValue {
        if case .variant(let inner) = self { return inner.unwrapped }
        return self
    }

    var string: String? {
        switch unwrapped {
        case .string(let text), .objectPath(let text), .signature(let text): return text
        default: return nil
        }
    }

    var bool: Bool? {
        if case .bool(let value) = unwrapped { return value }
        return nil
    }

    /// Any integer type, widened.
    var integer: Int64? {
        switch unwrapped {
        case .byte(let value): return Int64(value)
        case .int16(let value): return Int64(value)
        case .uint16(let value): return Int64(value)
        case .int32(let value): return Int64(value)
        case .uint32(let value): return Int64(value)
        case .int64(let value): return value
        case .uint64(let value): return value <= UInt64(Int64.max) ? Int64(value) : nil
        default: return nil
        }
    }

    var array: [DBusValue]? {
        if case .array(_, let values) = unwrapped { return values }
        return nil
    }

    /// `as` as Swift strings.
    var stringArray: [String]? { array?.compactMap(\.string) }

    /// A dictionary with string (or object path) keys, such as `a{sv}` or `a{oa{sa{sv}}}`.
    var dictionary: [String: DBusValue]? {
        guard case .dictionary(_, _, let entries) = unwrapped else { return nil }
        var result: [String: DBusValue] = [:]
        for entry in entries {
            guard let key = entry.key.string else { return nil }
            result[key] = entry.value
        }
        return result
    }
}
