import Crypto

/// A 128-bit UUID as Bluetooth uses it (SDP service classes, protocols).
public struct BluetoothUUID: Hashable, Sendable, CustomStringConvertible, Comparable {
    public let bytes: [UInt8]

    public init?(bytes: [UInt8]) {
        guard bytes.count == 16 else { return nil }
        self.bytes = bytes
    }

    /// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (either case).
    public init?(_ text: String) {
        let hex = text.filter { $0 != "-" }
        guard text.count == 36, hex.count == 32, hex.allSatisfy(\.isHexDigit) else { return nil }
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        self.bytes = bytes
    }

    /// A 16- or 32-bit Bluetooth UUID within the Bluetooth base UUID
    /// `0000xxxx-0000-1000-8000-00805F9B34FB`.
    public init(short: UInt32) {
        bytes = SDPElement.bigEndian(short) + [0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0x80, 0x5F, 0x9B, 0x34, 0xFB]
    }

    /// A name-based UUID, version 5 (RFC 9562 §5.5): SHA-1 of the namespace's bytes followed by
    /// the name's, the first 16 bytes of the digest with version and variant bits set.
    public init(version5Namespace namespace: BluetoothUUID, name: String) {
        var digest = Array(Insecure.SHA1.hash(data: namespace.bytes + Array(name.utf8)).prefix(16))
        digest[6] = digest[6] & 0x0F | 0x50
        digest[8] = digest[8] & 0x3F | 0x80
        bytes = digest
    }

    /// RFC 9562's namespace for names that are URLs (`6ba7b811-9dad-11d1-80b4-00c04fd430c8`).
    public static let urlNamespace = BluetoothUUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8")!

    /// Lowercase with dashes, as BlueZ prints and parses UUIDs.
    public var description: String {
        let hex = bytes.map { byte in
            let text = String(byte, radix: 16)
            return text.count == 1 ? "0" + text : text
        }.joined()
        let characters = Array(hex)
        let groups = [0..<8, 8..<12, 12..<16, 16..<20, 20..<32]
        return groups.map { String(characters[$0]) }.joined(separator: "-")
    }

    public static func < (lhs: BluetoothUUID, rhs: BluetoothUUID) -> Bool {
        lhs.bytes.lexicographicallyPrecedes(rhs.bytes)
    }
}

extension ServiceType {
    /// The SDP service class under which PeerLink peers of this service type advertise over
    /// Bluetooth: the version 5 UUID of the name `peerlink:<type>` in RFC 9562's URL namespace.
    /// Every PeerLink implementation derives the same UUID from the same type, with no registry.
    public var bluetoothServiceClass: BluetoothUUID {
        BluetoothUUID(version5Namespace: .urlNamespace, name: "peerlink:" + value)
    }
}
