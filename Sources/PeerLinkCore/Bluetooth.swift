/// A Bluetooth device address (BD_ADDR), written as six colon-separated hex bytes, most
/// significant first: `00:AA:01:00:00:00`.
///
/// `bytes` holds the address in that written order; the kernel's `bdaddr_t` holds it reversed
/// (least significant byte first), which the socket layer converts.
public struct BluetoothAddress: Hashable, Sendable, Comparable, CustomStringConvertible, LosslessStringConvertible {
    public let bytes: [UInt8]

    /// The address from six bytes in written order.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 6 else { return nil }
        self.bytes = bytes
    }

    /// Parses `AA:BB:CC:DD:EE:FF` (either case; `-` is accepted in place of `:`).
    public init?(_ text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        let pieces = parts.count == 6 ? parts : text.split(separator: "-", omittingEmptySubsequences: false)
        guard pieces.count == 6 else { return nil }
        var bytes: [UInt8] = []
        for piece in pieces {
            guard piece.count == 2, piece.allSatisfy(\.isHexDigit), let byte = UInt8(piece, radix: 16) else { return nil }
            bytes.append(byte)
        }
        self.bytes = bytes
    }

    /// `00:00:00:00:00:00`: "any adapter" when binding.
    public static let any = BluetoothAddress(bytes: [0, 0, 0, 0, 0, 0])!

    public var description: String {
        bytes.map { byte in
            let hex = String(byte, radix: 16, uppercase: true)
            return hex.count == 1 ? "0" + hex : hex
        }.joined(separator: ":")
    }

    public static func < (lhs: BluetoothAddress, rhs: BluetoothAddress) -> Bool {
        lhs.bytes.lexicographicallyPrecedes(rhs.bytes)
    }
}

/// An RFCOMM server channel: 1 to 30.
public struct RFCOMMChannel: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let value: UInt8

    public static let range: ClosedRange<UInt8> = 1...30

    public init?(_ value: Int) {
        guard value >= Int(Self.range.lowerBound), value <= Int(Self.range.upperBound) else { return nil }
        self.value = UInt8(value)
    }

    public var description: String { String(value) }

    public static func < (lhs: RFCOMMChannel, rhs: RFCOMMChannel) -> Bool { lhs.value < rhs.value }
}

/// An L2CAP protocol/service multiplexer (PSM).
///
/// A valid PSM is odd in its low byte and even in its high byte (`psm & 0x0101 == 0x0001`).
/// PSMs below `0x1001` are assigned by the Bluetooth SIG (and binding one needs
/// `CAP_NET_BIND_SERVICE`); `0x1001` and above are dynamic, free for applications.
public struct L2CAPPSM: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let value: UInt16

    /// The first PSM of the dynamic range.
    public static let firstDynamic: UInt16 = 0x1001

    public init?(_ value: Int) {
        guard value > 0, value <= Int(UInt16.max), value & 0x0101 == 0x0001 else { return nil }
        self.value = UInt16(value)
    }

    /// Parses `0x1001` (hex) or `4097` (decimal).
    public init?(_ text: String) {
        let lower = text.lowercased()
        let parsed = lower.hasPrefix("0x") ? Int(lower.dropFirst(2), radix: 16) : Int(lower)
        guard let parsed else { return nil }
        self.init(parsed)
    }

    /// Whether the PSM is in the dynamic range (binding it needs no privilege).
    public var isDynamic: Bool { value >= Self.firstDynamic }

    /// `0x1001`: PSMs are written in hex.
    public var description: String {
        let hex = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }

    public static func < (lhs: L2CAPPSM, rhs: L2CAPPSM) -> Bool { lhs.value < rhs.value }
}
