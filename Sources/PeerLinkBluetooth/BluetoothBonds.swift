import Logging
import PeerLinkCore
import PeerLinkPosix

/// Bonds (stored pairings) bluetoothd holds, for the one case PeerLink touches them: a bond the
/// other device no longer has.
///
/// PeerLink's own links never bond (``BTSocket/open(_:)``: security level *low*, pairing
/// without bonding). A bond between two PeerLink machines comes from their users (paired in
/// the desktop's Bluetooth settings, with `bluetoothctl pair`). When one side removes it
/// (`bluetoothctl remove`, "Forget this device") and the other keeps it, the pair can no
/// longer link over Bluetooth:
///
/// - the side that kept the bond dials with its old key; the other has none ("PIN or key
///   missing"), the authentication fails and the connect is refused;
/// - the side without a bond dials and pairs afresh; the side with the bond refuses to pair
///   again with a device it holds a bond for (bluetoothd's `JustWorksRepairing = never`, the
///   default), so that connect fails too.
///
/// PeerLink heals it from the side that kept the bond: when a dial to a device this machine
/// holds a bond with is refused although the device's SDP server lists a service on that
/// channel or PSM — so something listens there, and the refusal came from the security check
/// — the bond is stale: PeerLink removes it through bluetoothd (`Adapter1.RemoveDevice`, what
/// `bluetoothctl remove` does) and dials once more, pairing without bonding. The other
/// direction needs no healing of its own: automatic mode's fallback
/// (``PeerLinkCore/SessionPolicy/automaticFallback``) makes the side with the bond dial.
///
/// Each function is called from a dial (async) and runs its D-Bus calls or its SDP search on a
/// thread of its own (``PeerLinkPosix/runBlocking(_:_:)``): they block until bluetoothd or the
/// device answers (up to 25 s, 10 s for the search), and the dialling task waits suspended.
enum BluetoothBonds {
    /// The adapter (`hciN`) whose bluetoothd holds a bond with `device`, when it is not
    /// connected now (a connected device shows `Paired` during a link's pairing without bonding
    /// too). nil without bluetoothd, or without a bond. `bus`: the system bus (tests pass their own).
    static func heldBond(
        with device: BluetoothAddress, from adapter: BluetoothAddress, bus: String = DBusConnection.systemBusAddress
    ) async -> String? {
        await runBlocking("peerlink-bt-bonds") { findHeldBond(with: device, from: adapter, bus: bus) }
    }

    /// ``heldBond(with:from:bus:)`` on the calling thread.
    private static func findHeldBond(with device: BluetoothAddress, from adapter: BluetoothAddress, bus: String) -> String? {
        guard let connection = try? BlueZ.connect(address: bus) else { return nil }
        defer { connection.close() }
        guard let objects = try? connection.managedObjects(destination: BlueZ.service) else { return nil }
        var adapterByPath: [String: String] = [:]
        for (path, interfaces) in objects {
            if let properties = interfaces[BlueZ.adapterInterface], let address = properties["Address"]?.string {
                adapterByPath[path] = address
            }
        }
        for (_, interfaces) in objects {
            guard let properties = interfaces[BlueZ.deviceInterface], properties["Address"]?.string == device.description,
                properties["Paired"]?.bool == true, properties["Connected"]?.bool != true,
                let adapterPath = properties["Adapter"]?.string, let adapterAddress = adapterByPath[adapterPath]
            else { continue }
            if adapter != .any, BluetoothAddress(adapterAddress) != adapter { continue }
            return String(adapterPath.split(separator: "/").last ?? "")
        }
        return nil
    }

    /// Whether the device's SDP server lists a service on `kind`'s `port` (asked through `local`).
    static func serves(_ device: BluetoothAddress, kind: BluetoothSocketKind, port: UInt16, from local: BluetoothAddress) async -> Bool {
        await runBlocking("peerlink-sdp") { searchServes(device, kind: kind, port: port, from: local) }
    }

    /// ``serves(_:kind:port:from:)`` on the calling thread.
    private static func searchServes(_ device: BluetoothAddress, kind: BluetoothSocketKind, port: UInt16, from local: BluetoothAddress) -> Bool {
        let records: [[UInt16: SDPElement]]
        do {
            records = try SDPClient.search(
                at: device, from: local, pattern: [BluetoothUUID(short: UInt32(PeerLinkServiceRecord.l2capUUID))],
                timeout: .seconds(10))
        } catch {
            return false
        }
        for record in records {
            let served = PeerLinkServiceRecord.servedPorts(record)
            switch kind {
            case .rfcomm: if served.channels.contains(where: { UInt16($0.value) == port }) { return true }
            case .l2cap: if served.psms.contains(where: { $0.value == port }) { return true }
            }
        }
        return false
    }

    /// Removes the bond (and bluetoothd's record of the device) on `adapter` (`hciN`).
    static func remove(_ device: BluetoothAddress, on adapter: String) async throws(PeerLinkError) {
        try await runBlocking("peerlink-bt-bonds") { () throws(PeerLinkError) -> Void in try removeBond(device, on: adapter) }
    }

    /// ``remove(_:on:)`` on the calling thread.
    private static func removeBond(_ device: BluetoothAddress, on adapter: String) throws(PeerLinkError) {
        let connection = try BlueZ.connect()
        defer { connection.close() }
        let path = BlueZ.adapterPath(adapter) + "/dev_" + device.description.replacingOccurrences(of: ":", with: "_")
        do {
            _ = try connection.call(
                destination: BlueZ.service, path: BlueZ.adapterPath(adapter), interface: BlueZ.adapterInterface,
                method: "RemoveDevice", [.objectPath(path)])
        } catch {
            throw BlueZ.map(error, doing: "removing the stale pairing with \(device)")
        }
    }
}
