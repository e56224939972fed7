internal import CDBus
#if canImport(Glibc)
import Glibc
#endif

/// Writes ``DBusValue``s into a libdbus message and reads them back out, with libdbus's
/// iterators. Iterators live in heap memory of their own, so no Swift copy ever moves one that
/// libdbus still points into.
enum DBusMessageCodec {
    static let typeInvalid: Int32 = 0
    static func code(_ character: Character) -> Int32 { Int32(character.asciiValue!) }

    /// Appends `values` as the message's arguments. Returns false when libdbus ran out of memory.
    @discardableResult
    static func append(_ values: [DBusValue], to message: OpaquePointer) -> Bool {
        withIterator { iter in
            dbus_message_iter_init_append(message, iter)
            return values.allSatisfy { append($0, to: iter) }
        }
    }

    /// The message's arguments.
    static func arguments(of message: OpaquePointer) -> [DBusValue] {
        withIterator { iter in
            guard dbus_message_iter_init(message, iter) != 0 else { return [] }
            return readAll(iter)
        }
    }

    private static func withIterator<T>(_ body: (UnsafeMutablePointer<DBusMessageIter>) -> T) -> T {
        let iter = UnsafeMutablePointer<DBusMessageIter>.allocate(capacity: 1)
        iter.initialize(to: DBusMessageIter())
        defer { iter.deallocate() }
        return body(iter)
    }

    private static func appendBasic<T: BitwiseCopyable>(_ type: Character, _ value: T, to iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        var value = value
        return withUnsafeMutableBytes(of: &value) { dbus_message_iter_append_basic(iter, code(type), $0.baseAddress) != 0 }
    }

    private static func appendText(_ type: Character, _ text: String, to iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        text.withCString { pointer in
            var pointer: UnsafePointer<CChar>? = pointer
            return dbus_message_iter_append_basic(iter, code(type), &pointer) != 0
        }
    }

    private static func appendContainer(
        _ type: Character, signature: String?, to iter: UnsafeMutablePointer<DBusMessageIter>,
        _ body: (UnsafeMutablePointer<DBusMessageIter>) -> Bool
    ) -> Bool {
        withIterator { sub in
            let opened: Bool
            if let signature {
                opened = signature.withCString { dbus_message_iter_open_container(iter, code(type), $0, sub) != 0 }
            } else {
                opened = dbus_message_iter_open_container(iter, code(type), nil, sub) != 0
            }
            guard opened else { return false }
            guard body(sub) else {
                dbus_message_iter_abandon_container(iter, sub)
                return false
            }
            return dbus_message_iter_close_container(iter, sub) != 0
        }
    }

    private static func append(_ value: DBusValue, to iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        switch value {
        case .byte(let v): return appendBasic("y", v, to: iter)
        case .bool(let v): return appendBasic("b", dbus_bool_t(v ? 1 : 0), to: iter)
        case .int16(let v): return appendBasic("n", v, to: iter)
        case .uint16(let v): return appendBasic("q", v, to: iter)
        case .int32(let v): return appendBasic("i", v, to: iter)
        case .uint32(let v): return appendBasic("u", v, to: iter)
        case .int64(let v): return appendBasic("x", v, to: iter)
        case .uint64(let v): return appendBasic("t", v, to: iter)
        case .double(let v): return appendBasic("d", v, to: iter)
        case .unixFD(let v): return appendBasic("h", v, to: iter)
        case .string(let v): return appendText("s", v, to: iter)
        case .objectPath(let v): return appendText("o", v, to: iter)
        case .signature(let v): return appendText("g", v, to: iter)
        case .array(let element, let values):
            return appendContainer("a", signature: element, to: iter) { sub in values.allSatisfy { append($0, to: sub) } }
        case .dictionary(let key, let valueType, let entries):
            return appendContainer("a", signature: "{" + key + valueType + "}", to: iter) { sub in
                entries.allSatisfy { entry in
                    appendContainer("e", signature: nil, to: sub) { pair in
                        append(entry.key, to: pair) && append(entry.value, to: pair)
                    }
                }
            }
        case .variant(let inner):
            return appendContainer("v", signature: inner.signature, to: iter) { sub in append(inner, to: sub) }
        case .structure(let fields):
            return appendContainer("r", signature: nil, to: iter) { sub in fields.allSatisfy { append($0, to: sub) } }
        }
    }

    /// Every value from the iterator's position to the end of its container.
    private static func readAll(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> [DBusValue] {
        var values: [DBusValue] = []
        while dbus_message_iter_get_arg_type(iter) != typeInvalid {
            if let value = read(iter) { values.append(value) }
            dbus_message_iter_next(iter)
        }
        return values
    }

    private static func readBasic<T: BitwiseCopyable>(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ initial: T) -> T {
        var value = initial
        withUnsafeMutableBytes(of: &value) { dbus_message_iter_get_basic(iter, $0.baseAddress) }
        return value
    }

    private static func readText(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> String {
        var pointer: UnsafePointer<CChar>? = nil
        dbus_message_iter_get_basic(iter, &pointer)
        return pointer.map { String(cString: $0) } ?? ""
    }

    private static func signature(of iter: UnsafeMutablePointer<DBusMessageIter>) -> String {
        guard let raw = dbus_message_iter_get_signature(iter) else { return "" }
        defer { dbus_free(raw) }
        return String(cString: raw)
    }

    private static func recurse<T>(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ body: (UnsafeMutablePointer<DBusMessageIter>) -> T) -> T {
        withIterator { sub in
            dbus_message_iter_recurse(iter, sub)
            return body(sub)
        }
    }

    private static func read(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> DBusValue? {
        let type = dbus_message_iter_get_arg_type(iter)
        switch UnicodeScalar(UInt8(truncatingIfNeeded: type)) {
        case "y": return .byte(readBasic(iter, UInt8(0)))
        case "b": return .bool(readBasic(iter, dbus_bool_t(0)) != 0)
        case "n": return .int16(readBasic(iter, Int16(0)))
        case "q": return .uint16(readBasic(iter, UInt16(0)))
        case "i": return .int32(readBasic(iter, Int32(0)))
        case "u": return .uint32(readBasic(iter, UInt32(0)))
        case "x": return .int64(readBasic(iter, Int64(0)))
        case "t": return .uint64(readBasic(iter, UInt64(0)))
        case "d": return .double(readBasic(iter, Double(0)))
        case "h": return .unixFD(readBasic(iter, Int32(-1)))
        case "s": return .string(readText(iter))
        case "o": return .objectPath(readText(iter))
        case "g": return .signature(readText(iter))
        case "v": return recurse(iter) { sub in read(sub).map(DBusValue.variant) }
        case "r": return recurse(iter) { sub in .structure(readAll(sub)) }
        case "a":
            let full = signature(of: iter)  // "a..." of this array
            let element = String(full.dropFirst())
            if element.hasPrefix("{") {
                let inner = String(element.dropFirst().dropLast())
                let keyType = String(inner.prefix(1))
                let valueType = String(inner.dropFirst())
                return recurse(iter) { sub in
                    var entries: [DBusValue.Entry] = []
                    while dbus_message_iter_get_arg_type(sub) != typeInvalid {
                        let pair = recurse(sub) { readAll($0) }
                        if pair.count == 2 { entries.append(DBusValue.Entry(key: pair[0], value: pair[1])) }
                        dbus_message_iter_next(sub)
                    }
                    return .dictionary(key: keyType, value: valueType, entries)
                }
            }
            return recurse(iter) { sub in .array(element: element, readAll(sub)) }
        default:
            return nil
        }
    }
}

/// The codec's reading side fed raw bytes, for the fuzzer (`peerlink-fuzz dbus`): bytes that
/// libdbus accepts as a marshalled message (`dbus_message_demarshal`, which validates them as it
/// would a message from the bus) are read with ``DBusMessageCodec/arguments(of:)``.
package enum DBusFuzzing {
    /// How many arguments the codec read, or nil when libdbus refused the bytes.
    package static func readArguments(ofMarshalled bytes: [UInt8]) -> Int? {
        var error = DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        let message = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { dbus_message_demarshal($0.baseAddress, Int32(buffer.count), &error) }
        }
        guard let message else { return nil }
        defer { dbus_message_unref(message) }
        return DBusMessageCodec.arguments(of: message).count
    }

    /// A marshalled method call carrying `values`, for seed inputs.
    package static func marshalledSample() -> [UInt8] {
        guard let message = dbus_message_new_method_call("org.bluez", "/org/bluez/hci0", "org.freedesktop.DBus.Properties", "GetAll") else { return [] }
        defer { dbus_message_unref(message) }
        let values: [DBusValue] = [
            .string("org.bluez.Adapter1"), .uint32(0x5A020C), .bool(true), .objectPath("/org/bluez/hci0/dev_00_AA_01_00_00_00"),
            .strings(["0000110a-0000-1000-8000-00805f9b34fb"]),
            .properties(["Name": .string("pi"), "RSSI": .int16(-40), "Class": .uint32(0x5A020C)]),
            .array(element: "y", [.byte(1), .byte(2)]), .structure([.int64(-1), .double(0.5), .signature("a{sv}")]),
        ]
        DBusMessageCodec.append(values, to: message)
        dbus_message_set_serial(message, 1)
        var buffer: UnsafeMutablePointer<CChar>?
        var length: Int32 = 0
        guard dbus_message_marshal(message, &buffer, &length) != 0, let buffer else { return [] }
        defer { dbus_free(buffer) }
        return buffer.withMemoryRebound(to: UInt8.self, capacity: Int(length)) { Array(UnsafeBufferPointer(start: $0, count: Int(length))) }
    }
}
