internal import CBlueZ
import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix

/// A nearby Bluetooth Classic device, as a scan saw it.
public struct BluetoothDevice: Hashable, Sendable {
    public var address: BluetoothAddress
    /// The name the device gives, which anyone nearby may choose: escaped where it could act on
    /// a terminal (``PeerLinkCore/PeerText``).
    public var name: String?
    /// The 24-bit Class of Device, when known.
    public var deviceClass: UInt32?
    /// Signal strength in dBm, when known.
    public var rssi: Int?

    public init(address: BluetoothAddress, name: String? = nil, deviceClass: UInt32? = nil, rssi: Int? = nil) {
        self.address = address
        // A Bluetooth name is at most 248 bytes; escaping may lengthen it a little.
        self.name = name.map { PeerText.sanitized($0, limit: 512) }
        self.deviceClass = deviceClass
        self.rssi = rssi
    }
}

/// Finds nearby BR/EDR devices: through bluetoothd's discovery when it runs, else with an HCI
/// inquiry. Neither needs privileges (the kernel's HCI command filter lets any user inquire and
/// read remote names); a system that refuses them gets an error naming CAP_NET_RAW.
public enum BluetoothScanner {
    public enum Method: String, Sendable {
        case bluetoothd
        case hciInquiry = "hci-inquiry"
    }

    /// Scans for about `duration` on `adapter` (`hciN`; default: the first powered one).
    ///
    /// Every call to bluetoothd (D-Bus: each blocks until bluetoothd answers, up to 25 s when it
    /// hangs) and the HCI inquiry run on threads of their own
    /// (``PeerLinkPosix/runBlocking(_:_:)``); the calling task waits suspended, and sleeps through
    /// the discovery window, so no cooperative thread waits for the radio or the daemon.
    public static func scan(
        adapter: String? = nil, duration: Duration, logger: Logger = Logger(label: "peerlink.bluetooth")
    ) async throws(PeerLinkError) -> (devices: [BluetoothDevice], method: Method, adapter: BluetoothAddress) {
        let connection: DBusConnection
        do throws(PeerLinkError) {
            connection = try await runBlocking("peerlink-bluez") { () throws(PeerLinkError) -> DBusConnection in try BlueZ.connect() }
        } catch {
            logger.debug("bluetoothd unavailable, using HCI inquiry", metadata: ["reason": "\(error.message)"])
            do {
                let (devices, local) = try await inquiry(adapter: adapter, duration: duration)
                return (devices, .hciInquiry, local)
            } catch let inquiryError {
                // Both ways failed: say why bluetoothd could not be used too.
                throw PeerLinkError(inquiryError.code, "\(inquiryError.message) (bluetoothd, which needs no privilege, could not be used either: \(error.message))")
            }
        }
        do throws(PeerLinkError) {
            let chosen = try await runBlocking("peerlink-bluez") { () throws(PeerLinkError) -> BluetoothDaemonAdapter in
                let chosen = try BluetoothDaemon.chooseAdapter(adapter, on: connection)
                try BluetoothDaemon.powerOn(chosen, on: connection)
                return chosen
            }
            let devices = try await discover(on: connection, adapter: chosen, duration: duration)
            await BlueZ.close(connection)
            return (devices, .bluetoothd, BluetoothAddress(chosen.address) ?? .any)
        } catch {
            await BlueZ.close(connection)
            throw error
        }
    }

    /// bluetoothd discovery: BR/EDR filter, StartDiscovery, devices from InterfacesAdded /
    /// PropertiesChanged and the object tree, StopDiscovery. The calls run on threads of their
    /// own (they block until bluetoothd answers); the discovery window between them is a
    /// `Task.sleep`.
    static func discover(on connection: DBusConnection, adapter: BluetoothDaemonAdapter, duration: Duration) async throws(PeerLinkError) -> [BluetoothDevice] {
        let path = BlueZ.adapterPath(adapter.name)
        let seen = SeenAddresses()
        do throws(DBusCallError) {
            let subscriptions = try await runBlocking("peerlink-bluez") { () throws(DBusCallError) -> [Int] in
                var subscriptions: [Int] = []
                do throws(DBusCallError) {
                    subscriptions.append(
                        try connection.subscribe(.init(sender: BlueZ.service, interface: DBusConnection.objectManagerInterface, member: "InterfacesAdded")) { signal in
                            if let object = signal.arguments.first?.string, object.hasPrefix(path + "/") { seen.insert(object) }
                        })
                    subscriptions.append(
                        try connection.subscribe(.init(sender: BlueZ.service, interface: DBusConnection.propertiesInterface, member: "PropertiesChanged", pathNamespace: path)) { signal in
                            if signal.arguments.first?.string == BlueZ.deviceInterface, signal.arguments.dropFirst().first?.dictionary?["RSSI"] != nil {
                                seen.insert(signal.path)
                            }
                        })
                    _ = try connection.call(destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface, method: "SetDiscoveryFilter", [.properties(["Transport": .string("bredr")])])
                    _ = try connection.call(destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface, method: "StartDiscovery")
                    return subscriptions
                } catch {
                    for token in subscriptions { connection.unsubscribe(token) }
                    throw error
                }
            }
            try? await Task.sleep(for: duration)
            let objects = try await runBlocking("peerlink-bluez") { () throws(DBusCallError) -> [String: [String: [String: DBusValue]]] in
                defer { for token in subscriptions { connection.unsubscribe(token) } }
                // Read the tree before stopping: bluetoothd forgets RSSIs when discovery ends.
                let objects = try connection.managedObjects(destination: BlueZ.service)
                _ = try? connection.call(destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface, method: "StopDiscovery")
                return objects
            }
            let seenPaths = seen.all
            return objects.compactMap { objectPath, interfaces -> BluetoothDevice? in
                guard objectPath.hasPrefix(path + "/"), let device = interfaces[BlueZ.deviceInterface],
                    let address = device["Address"]?.string.flatMap(BluetoothAddress.init)
                else { return nil }
                let rssi = device["RSSI"]?.integer.map(Int.init)
                // Devices bluetoothd remembers from before count only when seen in this scan.
                guard rssi != nil || seenPaths.contains(objectPath) else { return nil }
                return BluetoothDevice(address: address, name: device["Name"]?.string, deviceClass: device["Class"]?.integer.map { UInt32(truncatingIfNeeded: $0) }, rssi: rssi)
            }.sorted { $0.address < $1.address }
        } catch {
            throw BlueZ.map(error, doing: "discovering devices with \(adapter.name)")
        }
    }

    private final class SeenAddresses: @unchecked Sendable {
        private let lock = NSLock()
        private var paths: Set<String> = []
        func insert(_ path: String) { _ = lock.withLock { paths.insert(path) } }
        var all: Set<String> { lock.withLock { paths } }
    }

    /// HCI inquiry through libbluetooth, then each device's name, on a thread of its own: the
    /// calls block for the whole inquiry and every name request (a detached task would block a
    /// cooperative thread as much).
    static func inquiry(adapter: String?, duration: Duration) async throws(PeerLinkError) -> ([BluetoothDevice], BluetoothAddress) {
        try await runBlocking("peerlink-hci-inquiry") { () throws(PeerLinkError) -> ([BluetoothDevice], BluetoothAddress) in
            do throws(SystemError) {
                return try BTSys.inquiry(adapter: adapter, duration: duration)
            } catch {
                throw BluetoothErrors.map(error)
            }
        }
    }
}

extension BTSys {
    /// `hci_inquiry` for about `duration` (in units of 1.28 s, 1 to 48), then
    /// `hci_read_remote_name` for each device found.
    static func inquiry(adapter: String?, duration: Duration) throws(SystemError) -> ([BluetoothDevice], BluetoothAddress) {
        // A kernel without Bluetooth shows here, with its own message.
        close(try hciControlSocket())
        let id: Int32
        if let adapter {
            id = hci_devid(adapter)
            guard id >= 0 else { throw SystemError("hci_devid(\(adapter))", errno: ENODEV) }
        } else {
            id = hci_get_route(nil)
            guard id >= 0 else { throw SystemError("hci_get_route", errno: ENODEV) }
        }
        let info = try deviceInfo(id)
        let local = BluetoothAddress(addressString(info.bdaddr)) ?? .any
        let units = Int32(min(48, max(1, (Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18) / 1.28)))
        var found: UnsafeMutablePointer<inquiry_info>? = nil
        let count = hci_inquiry(id, units, 255, nil, &found, Int(IREQ_CACHE_FLUSH))
        guard count >= 0 else { throw SystemError("hci_inquiry(hci\(id))", errno: errno) }
        defer { bt_free(found) }
        let dd = hci_open_dev(id)
        guard dd >= 0 else { throw SystemError("hci_open_dev(hci\(id))", errno: errno) }
        defer { hci_close_dev(dd) }
        var devices: [BluetoothDevice] = []
        for index in 0..<Int(count) {
            guard var entry = found?[index] else { continue }
            let address = BluetoothAddress(addressString(entry.bdaddr)) ?? .any
            let deviceClass = UInt32(entry.dev_class.2) << 16 | UInt32(entry.dev_class.1) << 8 | UInt32(entry.dev_class.0)
            var name = [CChar](repeating: 0, count: 249)
            var text: String?
            if hci_read_remote_name(dd, &entry.bdaddr, Int32(name.count), &name, 5000) == 0 {
                text = String(decoding: name.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
            }
            devices.append(BluetoothDevice(address: address, name: text, deviceClass: deviceClass))
        }
        return (devices.sorted { $0.address < $1.address }, local)
    }
}
