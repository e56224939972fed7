import Foundation
import Logging
import PeerLinkCore

/// Keeps an adapter reachable while PeerLink listens or advertises on it.
///
/// As distributions ship it, bluetoothd leaves an adapter powered but **not discoverable**, and
/// the kernel then pages (accepts connections) only for devices on its accept list — the ones
/// paired with. PeerLink peers do not pair (see *Bluetooth security* in the Architecture
/// article), so a listener on such an adapter cannot be reached, and an inquiry never finds it.
/// bluetoothd offers no unprivileged way to be connectable without being discoverable, so
/// while a hold exists the adapter is **discoverable** (which makes it connectable as well):
///
/// - the first hold on an adapter sets `Discoverable` through bluetoothd if it is off, and
///   remembers that it did;
/// - while holds exist it is set again whenever it goes off: bluetoothd's
///   `DiscoverableTimeout` (180 s by default) ran out, or the adapter was powered off and on;
/// - when the last hold goes, `Discoverable` is set back off — only if a hold turned it on.
///
/// Holds are counted per adapter in this process, so a listener and an advertiser on one adapter
/// share one. A process killed with a hold leaves the adapter discoverable until bluetoothd's
/// `DiscoverableTimeout` turns it off. Without bluetoothd there is nothing to hold: the
/// adapter's scan mode is whatever the kernel has (`hciconfig hciN piscan` sets it).
public final class BluetoothVisibilityHold: Sendable {
    let adapter: String
    private let released = Latch()

    init(adapter: String) { self.adapter = adapter }

    /// Holds the adapter `hciN` discoverable (so connectable) until ``release()``.
    ///
    /// The first hold on an adapter asks bluetoothd over D-Bus on the caller's thread, and the
    /// last ``release()`` gives the adapter back the same way: both block until bluetoothd
    /// answers (up to 25 s when it hangs). From async code, call them through
    /// ``PeerLinkPosix/runBlocking(_:_:)``.
    ///
    /// - Returns: nil when bluetoothd does not run (there is nothing to hold).
    /// - Throws: `unavailable` / `invalidParameter` when bluetoothd refuses, with what to do.
    public static func acquire(adapter: String) throws(PeerLinkError) -> BluetoothVisibilityHold? {
        try BluetoothVisibility.shared.hold(adapter)
    }

    /// Ends the hold. Idempotent; also done when the hold is released from memory.
    public func release() {
        guard released.fire() else { return }
        BluetoothVisibility.shared.release(adapter)
    }

    deinit { release() }

    /// A one-shot flag.
    private final class Latch: @unchecked Sendable {
        private let lock = NSLock()
        private var fired = false
        /// True the first time only.
        func fire() -> Bool { lock.withLock { defer { fired = true }; return !fired } }
    }
}

/// The holds of this process, per adapter (`hciN`).
final class BluetoothVisibility: @unchecked Sendable {
    static let shared = BluetoothVisibility()

    private struct Entry {
        var count: Int
        var connection: DBusConnection
        var subscription: Int?
        /// A hold set `Discoverable` (so the last one sets it back off).
        var turnedOn: Bool
    }

    private let lock = NSLock()
    private var entries: [String: Entry] = [:]
    /// Calls bluetoothd off the D-Bus dispatch thread (its signal handlers must return at once),
    /// and runs the last release's restore, so no reassertion is in flight when it closes the
    /// connection.
    private let queue = DispatchQueue(label: "peerlink.bluetooth.visibility")
    private let logger = Logger(label: "peerlink.bluetooth")

    /// Holds `adapter` (`hciN`) discoverable. Returns nil when bluetoothd does not run (nothing
    /// to hold); throws when bluetoothd refuses (no such adapter, not authorised).
    func hold(_ adapter: String) throws(PeerLinkError) -> BluetoothVisibilityHold? {
        lock.lock()
        if var entry = entries[adapter] {
            entry.count += 1
            entries[adapter] = entry
            lock.unlock()
            return BluetoothVisibilityHold(adapter: adapter)
        }
        lock.unlock()
        let connection: DBusConnection
        do {
            connection = try BlueZ.connect()
        } catch where error.code == .unavailable {
            logger.debug("no bluetoothd: the adapter's scan mode is left as it is", metadata: ["adapter": "\(adapter)"])
            return nil
        }
        let path = BlueZ.adapterPath(adapter)
        let turnedOn: Bool
        do {
            let properties = try connection.properties(destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface)
            turnedOn = try Self.makeDiscoverable(properties, path: path, on: connection)
        } catch {
            connection.close()
            throw BlueZ.map(error, doing: "making \(adapter) discoverable (so peers can connect to it)")
        }
        let subscription = try? connection.subscribe(
            DBusConnection.Match(
                sender: nil, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", path: path)
        ) { signal in
            guard signal.arguments.first?.string == BlueZ.adapterInterface,
                let changed = signal.arguments.dropFirst().first?.dictionary
            else { return }
            // Off again (timeout, power cycle), or powered on again: ask for it once more.
            if changed["Discoverable"]?.bool == false || changed["Powered"]?.bool == true {
                // (self is the process-wide registry: it lives as long as the process)
                self.queue.async { self.reassert(adapter) }
            }
        }
        lock.lock()
        defer { lock.unlock() }
        if var existing = entries[adapter] {
            // another thread got there first: keep its entry
            existing.count += 1
            existing.turnedOn = existing.turnedOn || turnedOn
            entries[adapter] = existing
            if let subscription { connection.unsubscribe(subscription) }
            connection.close()
        } else {
            entries[adapter] = Entry(count: 1, connection: connection, subscription: subscription, turnedOn: turnedOn)
            if turnedOn { logger.info("made the adapter discoverable while PeerLink uses it", metadata: ["adapter": "\(adapter)"]) }
        }
        return BluetoothVisibilityHold(adapter: adapter)
    }

    func release(_ adapter: String) {
        let last = lock.withLock { () -> Entry? in
            guard var entry = entries[adapter] else { return nil }
            entry.count -= 1
            if entry.count > 0 {
                entries[adapter] = entry
                return nil
            }
            entries[adapter] = nil
            return entry
        }
        guard let last else { return }
        // On the queue that reasserts: a reassertion already under way (its call to bluetoothd
        // on this connection) ends before the connection is closed; closing it under a call in
        // flight on another thread crashed libdbus. Later ones find no entry and do nothing.
        queue.sync { restore(adapter, last) }
    }

    /// Turns `adapter`'s `Discoverable` back off when a hold turned it on, and closes the
    /// connection of the last hold (on ``queue``).
    private func restore(_ adapter: String, _ last: Entry) {
        if let subscription = last.subscription { last.connection.unsubscribe(subscription) }
        if last.turnedOn {
            do {
                try last.connection.setProperty(
                    destination: BlueZ.service, path: BlueZ.adapterPath(adapter), interface: BlueZ.adapterInterface,
                    name: "Discoverable", .bool(false))
                logger.info("adapter no longer discoverable (as it was before)", metadata: ["adapter": "\(adapter)"])
            } catch {
                logger.debug("could not turn discoverable off again", metadata: ["adapter": "\(adapter)", "error": "\(error)"])
            }
        }
        last.connection.close()
    }

    /// Whether `adapter` is held by this process (for tests and `radios`).
    func isHeld(_ adapter: String) -> Bool { lock.withLock { entries[adapter] != nil } }

    private func reassert(_ adapter: String) {
        guard let connection = lock.withLock({ entries[adapter]?.connection }) else { return }
        let path = BlueZ.adapterPath(adapter)
        do {
            let properties = try connection.properties(destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface)
            if try Self.makeDiscoverable(properties, path: path, on: connection) {
                lock.withLock { entries[adapter]?.turnedOn = true }
                logger.debug("made the adapter discoverable again", metadata: ["adapter": "\(adapter)"])
            }
        } catch {
            logger.debug("could not make the adapter discoverable again", metadata: ["adapter": "\(adapter)", "error": "\(error)"])
        }
    }

    /// Sets `Discoverable` when the adapter is powered and not discoverable; true when it did.
    private static func makeDiscoverable(
        _ properties: [String: DBusValue], path: String, on connection: DBusConnection
    ) throws(DBusCallError) -> Bool {
        guard properties["Powered"]?.bool == true, properties["Discoverable"]?.bool != true else { return false }
        try connection.setProperty(
            destination: BlueZ.service, path: path, interface: BlueZ.adapterInterface, name: "Discoverable", .bool(true))
        return true
    }
}
