import PeerLinkCore

/// Which devices a ``BluetoothBrowser`` round asks for PeerLink records (SDP), so that browsing
/// does not page every device nearby every few seconds: each search opens a baseband link to
/// the device (a page), which costs its radio and ours airtime, and its battery.
///
/// A device that has ever published a PeerLink record is asked every round: its answer is what
/// tells a peer present from one gone. A device that never has (a phone, a headset, a machine
/// without PeerLink running) is asked when first seen, then again after 2 and 4 rounds, and
/// from then on every ``maximumInterval`` rounds — at once, though, when its name or class of
/// device changes (a machine whose owner starts PeerLink often renames nothing, so the growing
/// interval bounds how late such a peer is found: about ``maximumInterval`` rounds).
struct SDPSearchSchedule: Sendable {
    /// The most rounds between two searches of a device that never published a record.
    static let maximumInterval = 6

    private struct Quiet: Sendable {
        var nextRound: Int
        var interval: Int
        var name: String?
        var deviceClass: UInt32?
    }

    /// Devices that published a PeerLink record at some point.
    private var serving: Set<BluetoothAddress> = []
    /// Devices that never did, with when to ask them again.
    private var quiet: [BluetoothAddress: Quiet] = [:]
    /// The most devices remembered either way (a crowded place, or a hostile neighbour that
    /// makes up addresses): the oldest quiet ones are forgotten first, and are then asked as
    /// new.
    static let capacity = 1024

    /// How many devices it remembers, either way.
    var remembered: Int { serving.count + quiet.count }

    /// Whether round `round` asks `device`.
    func shouldSearch(_ device: BluetoothDevice, round: Int) -> Bool {
        if serving.contains(device.address) { return true }
        guard let entry = quiet[device.address] else { return true }
        // a name or class not known in one of the two rounds is no change (a round may see a
        // device before its name is read)
        if Self.differ(entry.name, device.name) || Self.differ(entry.deviceClass, device.deviceClass) { return true }
        return round >= entry.nextRound
    }

    private static func differ<T: Equatable>(_ a: T?, _ b: T?) -> Bool {
        guard let a, let b else { return false }
        return a != b
    }

    /// What round `round` saw: each device it asked, and those it did not.
    mutating func took(_ entries: [(entry: BluetoothScanEntry, searched: Bool, published: Bool)], round: Int) {
        for scanned in entries {
            if scanned.searched {
                searched(scanned.entry.device, published: scanned.published, round: round)
            } else {
                saw(scanned.entry.device)
            }
        }
    }

    /// A round saw `device` without asking it: a name or class learnt meanwhile is kept, to
    /// tell a later change by.
    mutating func saw(_ device: BluetoothDevice) {
        guard var entry = quiet[device.address] else { return }
        entry.name = entry.name ?? device.name
        entry.deviceClass = entry.deviceClass ?? device.deviceClass
        quiet[device.address] = entry
    }

    /// Round `round` asked `device`: `published` whether it answered with a PeerLink record
    /// (of any peer, the browser's own excluded or not).
    mutating func searched(_ device: BluetoothDevice, published: Bool, round: Int) {
        if published || serving.contains(device.address) {
            quiet[device.address] = nil
            if serving.count < Self.capacity { serving.insert(device.address) }
            return
        }
        let before = quiet[device.address]
        let interval = before.map { min($0.interval * 2, Self.maximumInterval) } ?? 2
        quiet[device.address] = Quiet(
            nextRound: round + interval, interval: interval, name: device.name ?? before?.name,
            deviceClass: device.deviceClass ?? before?.deviceClass)
        if quiet.count > Self.capacity, let oldest = quiet.min(by: { $0.value.nextRound < $1.value.nextRound }) {
            quiet[oldest.key] = nil
        }
    }
}
