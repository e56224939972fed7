import PeerLinkCore

/// An adapter as bluetoothd sees it (`org.bluez.Adapter1`).
public struct BluetoothDaemonAdapter: Hashable, Sendable, Codable {
    /// `hciN`.
    public var name: String
    public var address: String
    public var alias: String?
    public var powered: Bool
    public var discoverable: Bool
    public var pairable: Bool
    public var discovering: Bool
}

/// bluetoothd, for what only it does: adapter power and modes, discovery, SDP records.
public enum BluetoothDaemon {
    /// The adapters bluetoothd manages. Throws `unavailable` when D-Bus or bluetoothd is not running.
    ///
    /// It asks bluetoothd over D-Bus on the caller's thread, blocking until it answers (up to 25 s
    /// when it hangs); from async code, call it through ``PeerLinkPosix/runBlocking(_:_:)``.
    public static func adapters() throws(PeerLinkError) -> [BluetoothDaemonAdapter] {
        let connection = try BlueZ.connect()
        defer { connection.close() }
        return try adapters(on: connection)
    }

    static func adapters(on connection: DBusConnection) throws(PeerLinkError) -> [BluetoothDaemonAdapter] {
        let objects: [String: [String: [String: DBusValue]]]
        do {
            objects = try connection.managedObjects(destination: BlueZ.service)
        } catch {
            throw BlueZ.map(error, doing: "listing adapters")
        }
        return objects.compactMap { path, interfaces -> BluetoothDaemonAdapter? in
            guard let adapter = interfaces[BlueZ.adapterInterface] else { return nil }
            return BluetoothDaemonAdapter(
                name: String(path.split(separator: "/").last ?? ""), address: adapter["Address"]?.string ?? "",
                alias: adapter["Alias"]?.string, powered: adapter["Powered"]?.bool ?? false,
                discoverable: adapter["Discoverable"]?.bool ?? false, pairable: adapter["Pairable"]?.bool ?? false,
                discovering: adapter["Discovering"]?.bool ?? false)
        }.sorted { $0.name.count == $1.name.count ? $0.name < $1.name : $0.name.count < $1.name.count }
    }

    /// The adapter to use: `name` (`hciN`) if given, else the first powered one, else the first.
    static func chooseAdapter(_ name: String?, on connection: DBusConnection) throws(PeerLinkError) -> BluetoothDaemonAdapter {
        let all = try adapters(on: connection)
        if let name {
            guard let adapter = all.first(where: { $0.name == name }) else {
                let known = all.map(\.name).joined(separator: ", ")
                throw PeerLinkError(.invalidParameter, "bluetoothd has no adapter \(name) (it has: \(known.isEmpty ? "none" : known)): list adapters with 'peerlink radios'")
            }
            return adapter
        }
        guard let adapter = all.first(where: \.powered) ?? all.first else {
            throw PeerLinkError(.unavailable, "bluetoothd has no Bluetooth adapter: plug one in, or check 'rfkill list' and 'peerlink radios'")
        }
        return adapter
    }

    /// Powers the adapter on unless it already is.
    static func powerOn(_ adapter: BluetoothDaemonAdapter, on connection: DBusConnection) throws(PeerLinkError) {
        guard !adapter.powered else { return }
        do {
            try connection.setProperty(
                destination: BlueZ.service, path: BlueZ.adapterPath(adapter.name), interface: BlueZ.adapterInterface, name: "Powered",
                .bool(true))
        } catch {
            throw BlueZ.map(error, doing: "powering on \(adapter.name)")
        }
    }
}

extension BluetoothAdapter {
    /// The controllers with bluetoothd's view added (powered, discoverable, pairable) when it
    /// runs; `daemonProblem` says why it is missing otherwise. The HCI listing is the base.
    /// Blocks while bluetoothd answers, as ``BluetoothDaemon/adapters()`` does.
    public static func allWithDaemon() throws(PeerLinkError) -> (adapters: [BluetoothAdapter], daemonProblem: String?) {
        var adapters = try all()
        do {
            let daemon = try BluetoothDaemon.adapters()
            for index in adapters.indices {
                guard let state = daemon.first(where: { $0.name == adapters[index].name }) else { continue }
                adapters[index].powered = state.powered
                adapters[index].discoverable = state.discoverable
                adapters[index].pairable = state.pairable
            }
            return (adapters, nil)
        } catch {
            return (adapters, error.message)
        }
    }
}
