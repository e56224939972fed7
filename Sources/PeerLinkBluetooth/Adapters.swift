internal import CBlueZ
#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// A local Bluetooth controller (HCI adapter).
public struct BluetoothAdapter: Hashable, Sendable, Codable {
    public var index: Int
    /// `hciN`.
    public var name: String
    public var address: String
    /// The controller's friendly name, when it could be read.
    public var friendlyName: String?
    public var isUp: Bool
    public var supportsBREDR: Bool
    public var supportsLE: Bool
    /// Accepting connections (page scan).
    public var isConnectable: Bool
    /// Visible to inquiries (inquiry scan).
    public var isDiscoverable: Bool
    public var rfkillSoftBlocked: Bool
    public var rfkillHardBlocked: Bool
    /// bluetoothd's `Powered` (nil when bluetoothd does not run).
    public var powered: Bool?
    /// bluetoothd's `Discoverable` (nil when bluetoothd does not run).
    public var discoverable: Bool?
    /// bluetoothd's `Pairable` (nil when bluetoothd does not run).
    public var pairable: Bool?

    public var isBlocked: Bool { rfkillSoftBlocked || rfkillHardBlocked }

    /// What to do about a block, for tools to print.
    public var unblockAdvice: String? {
        if rfkillHardBlocked { return "\(name) is blocked by a hardware switch: turn the radio on with the laptop's switch or key" }
        if rfkillSoftBlocked { return "\(name) is blocked by rfkill: run 'rfkill unblock bluetooth'" }
        return nil
    }

    /// The controllers of this machine. Throws `unsupported` when the kernel has no Bluetooth.
    public static func all() throws(PeerLinkError) -> [BluetoothAdapter] {
        let indices = try controllerIndices()
        let blocks = rfkillBlocks()
        var adapters: [BluetoothAdapter] = []
        for index in indices {
            guard let info = try? BTSys.deviceInfo(index) else { continue }
            let flags = info.flags
            let features = withUnsafeBytes(of: info.features) { Array($0) }
            let name = "hci\(index)"
            let block = blocks[name] ?? (soft: false, hard: false)
            adapters.append(
                BluetoothAdapter(
                    index: Int(index), name: name, address: BTSys.addressString(info.bdaddr),
                    friendlyName: flags & (UInt32(1) << UInt32(HCI_UP)) != 0 ? BTSys.localName(index) : nil,
                    isUp: flags & (UInt32(1) << UInt32(HCI_UP)) != 0,
                    supportsBREDR: features[4] & UInt8(LMP_NO_BREDR) == 0,
                    supportsLE: features[4] & UInt8(LMP_LE) != 0,
                    isConnectable: flags & (UInt32(1) << UInt32(HCI_PSCAN)) != 0,
                    isDiscoverable: flags & (UInt32(1) << UInt32(HCI_ISCAN)) != 0,
                    rfkillSoftBlocked: block.soft, rfkillHardBlocked: block.hard))
        }
        return adapters.sorted { $0.index < $1.index }
    }

    /// Each controller's name, address and whether it is up, from the kernel's own state (no
    /// HCI command, no rfkill look-up, nothing that waits): cheap enough for every dial. Throws
    /// `unsupported` when the kernel has no Bluetooth.
    static func brief() throws(PeerLinkError) -> [(name: String, address: BluetoothAddress?, isUp: Bool)] {
        try controllerIndices().compactMap { index in
            guard let info = try? BTSys.deviceInfo(index) else { return nil }
            return ("hci\(index)", BluetoothAddress(BTSys.addressString(info.bdaddr)), info.flags & (UInt32(1) << UInt32(HCI_UP)) != 0)
        }
    }

    /// The indices of the controllers (`N` of `hciN`), from sysfs, else the first four to try.
    private static func controllerIndices() throws(PeerLinkError) -> [Int32] {
        do {
            let fd = try BTSys.hciControlSocket()
            BTSys.close(fd)
        } catch {
            throw BluetoothErrors.map(error)
        }
        let indices = BTSys.listDirectory("/sys/class/bluetooth").compactMap { entry -> Int32? in
            guard entry.hasPrefix("hci"), !entry.contains(":") else { return nil }
            return Int32(entry.dropFirst(3))
        }
        return indices.isEmpty ? Array(0..<4) : indices
    }

    /// rfkill state by adapter name, from /sys/class/bluetooth/hciN/rfkillM.
    static func rfkillBlocks() -> [String: (soft: Bool, hard: Bool)] {
        var blocks: [String: (soft: Bool, hard: Bool)] = [:]
        for adapter in BTSys.listDirectory("/sys/class/bluetooth") where !adapter.contains(":") {
            for entry in BTSys.listDirectory("/sys/class/bluetooth/\(adapter)") where entry.hasPrefix("rfkill") {
                let base = "/sys/class/bluetooth/\(adapter)/\(entry)"
                blocks[adapter] = (
                    soft: BTSys.readSmallFile(base + "/soft") == "1",
                    hard: BTSys.readSmallFile(base + "/hard") == "1"
                )
            }
        }
        return blocks
    }
}

/// Maps system errors of Bluetooth calls to messages that say what to do.
enum BluetoothErrors {
    static func map(_ error: SystemError) -> PeerLinkError {
        switch error.errno {
        case EAFNOSUPPORT:
            return PeerLinkError(.unsupported, "this kernel has no Bluetooth support (\(error.call) failed: address family not supported). Load it with 'sudo modprobe bluetooth' or use a kernel built with Bluetooth; LAN discovery works without it")
        case EPERM, EACCES:
            return PeerLinkError(.unavailable, "\(error.call) was not permitted: this needs the CAP_NET_RAW capability (run as root, or 'sudo setcap cap_net_raw,cap_net_admin+ep' on the peerlink binary)")
        case ENODEV:
            return PeerLinkError(.unavailable, "no such Bluetooth adapter (\(error.call)): list adapters with 'peerlink radios'")
        default:
            return PeerLinkError(.unknown, "Bluetooth: \(error.description)")
        }
    }
}
