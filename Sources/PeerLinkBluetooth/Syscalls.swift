internal import CBlueZ
#if canImport(Glibc)
import Glibc
#endif
import PeerLinkPosix

/// Every system and libbluetooth call of this target, one wrapper each. `EINTR` is retried here.
enum BTSys {
    /// Opens an HCI control socket; this is also how the kernel's Bluetooth support is detected.
    static func hciControlSocket() throws(SystemError) -> Int32 {
        while true {
            let fd = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_HCI)
            if fd >= 0 { return fd }
            if errno == EINTR { continue }
            throw SystemError("socket(AF_BLUETOOTH)", errno: errno)
        }
    }

    static func close(_ fd: Int32) { _ = Glibc.close(fd) }

    /// How many connections adapter `adapter` (`hciN`, or its address while it is up) holds now
    /// (`HCIGETCONNLIST`); nil when that cannot be read (no such adapter, no Bluetooth).
    static func connectionCount(adapter: String) -> Int? {
        let id = hci_devid(adapter)
        guard id >= 0, let fd = try? hciControlSocket() else { return nil }
        defer { close(fd) }
        while true {
            let count = peerlink_hci_connection_count(fd, id)
            if count >= 0 { return Int(count) }
            if errno != EINTR { return nil }
        }
    }

    static func deviceInfo(_ id: Int32) throws(SystemError) -> hci_dev_info {
        var info = hci_dev_info()
        while hci_devinfo(id, &info) < 0 {
            if errno == EINTR { continue }
            throw SystemError("hci_devinfo(hci\(id))", errno: errno)
        }
        return info
    }

    /// The adapter's friendly name, read with an HCI command; nil when that is not allowed.
    static func localName(_ id: Int32) -> String? {
        let dd = hci_open_dev(id)
        guard dd >= 0 else { return nil }
        defer { hci_close_dev(dd) }
        var name = [CChar](repeating: 0, count: 249)
        guard hci_read_local_name(dd, Int32(name.count), &name, 1000) >= 0 else { return nil }
        return String(decoding: name.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
    }

    static func addressString(_ address: bdaddr_t) -> String {
        var address = address
        var buffer = [CChar](repeating: 0, count: 18)
        _ = ba2str(&address, &buffer)
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
    }

    static func listDirectory(_ path: String) -> [String] {
        guard let directory = opendir(path) else { return [] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    static func readSmallFile(_ path: String) -> String? {
        guard let file = fopen(path, "r") else { return nil }
        defer { fclose(file) }
        var buffer = [CChar](repeating: 0, count: 256)
        guard fgets(&buffer, Int32(buffer.count), file) != nil else { return nil }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: Set<Character>) -> String {
        var text = Substring(self)
        while let first = text.first, set.contains(first) { text.removeFirst() }
        while let last = text.last, set.contains(last) { text.removeLast() }
        return String(text)
    }
}

extension Set where Element == Character {
    fileprivate static let whitespacesAndNewlines: Set<Character> = [" ", "\n", "\t", "\r"]
}
