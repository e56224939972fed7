import Foundation
import PeerLinkCore
@testable import PeerLinkBluetooth
import Testing

@Suite("D-Bus client (libdbus-1) against a real dbus-daemon", .serialized, .enabled(if: TestHost.which("dbus-daemon") != nil, "dbus-daemon is not installed (apt-get install dbus)"))
struct DBusTests {
    @Test func callsTheBusAndReadsItsProperties() async throws {
        let bus = try await PrivateBus()
        _ = bus
        let connection = try DBusConnection.open(address: bus.address)
        defer { connection.close() }
        #expect(connection.uniqueName.hasPrefix(":"))
        let names = try connection.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames")
        let list = try #require(names.first?.stringArray)
        #expect(list.contains("org.freedesktop.DBus"))
        #expect(list.contains(connection.uniqueName))
        let features = try connection.property(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", name: "Interfaces")
        #expect(features.stringArray != nil, "\(features)")
        let all = try connection.properties(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus")
        #expect(all["Interfaces"] == features)
    }

    /// Every kind of value goes out in a call and comes back in the reply unchanged.
    @Test func anExportedObjectEchoesEveryType() async throws {
        let bus = try await PrivateBus()
        _ = bus
        let server = try DBusConnection.open(address: bus.address)
        defer { server.close() }
        let client = try DBusConnection.open(address: bus.address)
        defer { client.close() }
        try server.export(path: "/org/peerlink/test") { call in
            call.member == "Echo" ? .success(call.arguments) : .error(name: "org.peerlink.Error.Unknown", message: "no method \(call.member)")
        }
        let values: [DBusValue] = [
            .byte(255), .bool(true), .int16(-2), .uint16(65535), .int32(-3), .uint32(4_000_000_000), .int64(-5), .uint64(6),
            .double(1.5), .string("Zoë 👩‍💻"), .objectPath("/org/bluez/hci0"), .signature("a{sv}"),
            .strings([]), .strings(["a", "b"]),
            .properties(["Transport": .string("bredr"), "RSSI": .int16(-60), "UUIDs": .strings(["x"])]),
            .dictionary(key: "o", value: "a{sv}", [.init(key: .objectPath("/a"), value: .properties([:]))]),
            .variant(.variant(.uint32(7))),
            .structure([.string("s"), .uint8Array([1, 2, 3])]),
        ]
        let reply = try client.call(destination: server.uniqueName, path: "/org/peerlink/test", interface: "org.peerlink.Test", method: "Echo", values)
        #expect(reply == values)
        #expect(reply.map(\.signature) == values.map(\.signature))
        #expect(throws: DBusCallError.self) {
            try client.call(destination: server.uniqueName, path: "/org/peerlink/test", interface: "org.peerlink.Test", method: "Other")
        }
        do {
            _ = try client.call(destination: server.uniqueName, path: "/org/peerlink/test", interface: "org.peerlink.Test", method: "Other")
        } catch {
            #expect(error.name == "org.peerlink.Error.Unknown")
            #expect(error.message == "no method Other")
        }
        server.unexport(path: "/org/peerlink/test")
        #expect(throws: DBusCallError.self) {
            try client.call(destination: server.uniqueName, path: "/org/peerlink/test", interface: "org.peerlink.Test", method: "Echo")
        }
    }

    /// libdbus hands a call's handler its object before an `unexport` on another thread takes
    /// the path away, so the object (and what its handler holds) must outlive the unexport
    /// until the dispatch thread is stopped: it goes when the connection closes.
    @Test func anUnexportedObjectLivesUntilTheConnectionCloses() async throws {
        final class Held: Sendable {}
        let bus = try await PrivateBus()
        _ = bus
        let server = try DBusConnection.open(address: bus.address)
        defer { server.close() }
        var held: Held? = Held()
        weak let watched = held
        try server.export(path: "/org/peerlink/test") { [held] _ in
            _ = held
            return .success([])
        }
        held = nil
        #expect(watched != nil)
        server.unexport(path: "/org/peerlink/test")
        #expect(watched != nil, "released while the dispatch thread could still be running its handler")
        server.close()
        #expect(watched == nil, "still held after the connection closed")
    }

    @Test func signalsReachMatchingSubscribersOnly() async throws {
        let bus = try await PrivateBus()
        _ = bus
        let emitter = try DBusConnection.open(address: bus.address)
        defer { emitter.close() }
        let listener = try DBusConnection.open(address: bus.address)
        defer { listener.close() }
        let (stream, continuation) = AsyncStream<DBusSignal>.makeStream()
        let token = try listener.subscribe(.init(interface: DBusConnection.propertiesInterface, member: "PropertiesChanged", pathNamespace: "/org/bluez/hci0")) { continuation.yield($0) }
        // Outside the namespace (a sibling with the same prefix), then inside it.
        try emitter.emit(path: "/org/bluez/hci01", interface: DBusConnection.propertiesInterface, member: "PropertiesChanged", [.string("org.bluez.Device1"), .properties(["RSSI": .int16(-1)]), .strings([])])
        try emitter.emit(path: "/org/bluez/hci0/dev_00_AA_01_01_00_01", interface: DBusConnection.propertiesInterface, member: "PropertiesChanged", [.string("org.bluez.Device1"), .properties(["RSSI": .int16(-42)]), .strings([])])
        var iterator = stream.makeAsyncIterator()
        let signal = try #require(await iterator.next())
        #expect(signal.path == "/org/bluez/hci0/dev_00_AA_01_01_00_01")
        #expect(signal.sender == emitter.uniqueName)
        #expect(signal.arguments.dropFirst().first?.dictionary?["RSSI"]?.integer == -42)
        listener.unsubscribe(token)
        continuation.finish()
    }

    @Test func noBluetoothdIsAClearError() async throws {
        let bus = try await PrivateBus()
        _ = bus
        let connection = try DBusConnection.open(address: bus.address)
        defer { connection.close() }
        do {
            _ = try connection.managedObjects(destination: BlueZ.service)
            Issue.record("a call to org.bluez on a bus without bluetoothd succeeded")
        } catch {
            #expect(error.isServiceMissing, "\(error)")
            let mapped = BlueZ.map(error, doing: "listing adapters")
            #expect(mapped.code == .unavailable)
            #expect(mapped.message.contains("bluetoothd is not running"), "\(mapped.message)")
            #expect(mapped.message.contains("systemctl start bluetooth"), "\(mapped.message)")
        }
    }

    /// A bluetoothd that holds its name and answers nothing (seen in the lab: blocked in an
    /// `accept` of its own) is told apart from one that is not running, with what to do.
    @Test func aBluetoothdThatHangsIsAClearError() async throws {
        let bus = try await PrivateBus()
        let silent = try DBusConnection.open(address: bus.address)
        defer { silent.close() }
        let owned = try silent.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            method: "RequestName", [.string(BlueZ.service), .uint32(0)])
        #expect(owned.first?.integer == 1, "RequestName: \(owned)")  // primary owner
        let connection = try DBusConnection.open(address: bus.address)
        defer { connection.close() }
        do {
            _ = try connection.call(
                destination: BlueZ.service, path: "/", interface: DBusConnection.objectManagerInterface, method: "GetManagedObjects",
                timeout: .milliseconds(300))
            Issue.record("a call to a name whose owner never answers succeeded")
        } catch {
            let mapped = BlueZ.map(error, doing: "listing adapters")
            #expect(mapped.code == .timedOut)
            #expect(mapped.message.contains("bluetoothd did not answer listing adapters in time"), "\(mapped.message)")
            #expect(mapped.message.contains("sudo systemctl restart bluetooth"), "\(mapped.message)")
        }
        _ = bus
    }

    @Test func noBusIsAClearError() throws {
        let directory = TestHost.temporaryDirectory("peerlink-nobus")
        do {
            _ = try DBusConnection.open(address: "unix:path=\(directory)/missing")
            Issue.record("connected to a bus that does not exist")
        } catch {
            #expect(error.code == .unavailable)
            #expect(error.message.contains("does not answer"), "\(error.message)")
            #expect(error.message.contains("systemctl start dbus"), "\(error.message)")
        }
    }

    /// A bluetoothd that answers nothing — a connection that owns `org.bluez` and never reads —
    /// keeps more bond look-ups (what every Bluetooth dial asks first) waiting than Swift has
    /// cooperative threads, and this task still runs meanwhile: the D-Bus calls wait on threads
    /// of their own. (Were they made on the cooperative threads, the look-ups would hold every one
    /// of them until their calls time out after 25 s, and they could not all wait at once.)
    @Test(.timeLimit(.minutes(2)))
    func aStalledBluetoothdHoldsNoCooperativeThread() async throws {
        let bus = try await PrivateBus()
        let stalled = try DBusConnection.open(address: bus.address)
        defer { stalled.close() }
        let owner = try stalled.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "RequestName",
            [.string(BlueZ.service), .uint32(4)])
        #expect(owner.first == .uint32(1), "the stalled bluetoothd owns \(BlueZ.service): \(owner)")
        let watcher = try DBusConnection.open(address: bus.address)
        defer { watcher.close() }

        let lookUps = max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)
        let answered = Locked(0)
        let device = try #require(BluetoothAddress("00:AA:01:00:00:01"))
        let tasks = (0..<lookUps).map { _ in
            Task {
                let bond = await BluetoothBonds.heldBond(with: device, from: .any, bus: bus.address)
                answered.withLock { $0 += 1 }
                return bond
            }
        }
        // Every look-up has its own connection to the bus: wait until all are there at once
        // (besides the stalled bluetoothd and the watcher).
        var connected = 0
        for _ in 0..<1000 {
            let names = try watcher.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames")
            connected = (names.first?.stringArray ?? []).filter { $0.hasPrefix(":") }.count - 2
            if connected >= lookUps { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(connected == lookUps, "\(connected) of \(lookUps) look-ups were waiting for bluetoothd at once")
        #expect(answered.withLock { $0 } == 0, "a look-up came back although bluetoothd never answered")

        // The stalled bluetoothd leaves the bus: the bus answers the pending calls with an
        // error, and each look-up finds no bond.
        stalled.close()
        for task in tasks { #expect(await task.value == nil) }
        #expect(answered.withLock { $0 } == lookUps)
        _ = bus
    }

    /// `peerlink scan --bluetooth` with a system bus that has no bluetoothd falls back to an HCI
    /// inquiry; on a kernel without Bluetooth both reasons are in the one error line.
    @Test(.enabled(if: !TestHost.kernelHasBluetooth, "this kernel has Bluetooth: the inquiry fallback would run"), .timeLimit(.minutes(1)))
    func scanWithoutBluetoothdOrKernelSaysBoth() async throws {
        let bus = try await PrivateBus()
        _ = bus
        let result = try await runPeerlink(["scan", "--bluetooth", "--timeout", "1"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
        #expect(result.status == 69, "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains("no Bluetooth support"), "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains("bluetoothd is not running"), "stderr:\n\(result.stderr)")
    }
}

extension DBusValue {
    static func uint8Array(_ bytes: [UInt8]) -> DBusValue { .array(element: "y", bytes.map(DBusValue.byte)) }
}
