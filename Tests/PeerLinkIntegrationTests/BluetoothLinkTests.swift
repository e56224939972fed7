import Foundation
import Logging
import PeerLink
import Testing

/// RFCOMM and L2CAP links between the lab's two controllers, hci1 (client) → hci0 (server),
/// through the kernel's Bluetooth stack. Serialized: the last test takes an adapter down.
@Suite(
    "Bluetooth links in the VM lab", .serialized, .enabled(if: BluetoothLab.enabled, BluetoothLab.reason),
    .timeLimit(.minutes(3)))
struct BluetoothLinkTests {
    /// A listener on hci0 (port chosen by the kernel) and a connection to it from hci1.
    static func connectedPair(
        _ kind: BluetoothSocketKind, serverMTU: UInt16? = nil
    ) async throws -> (server: BluetoothConnection, client: BluetoothConnection, listener: BluetoothTransportListener) {
        let hci0 = try BluetoothLab.address(0)
        let hci1 = try BluetoothLab.address(1)
        let listener = try BluetoothTransportListener(kind, adapter: hci0, port: 0, incomingMTU: serverMTU)
        let endpoint = try #require(listener.localEndpoints.first)
        async let accepted = listener.acceptConnection()
        let client = try await BluetoothTransport(adapter: hci1).connect(endpoint, timeout: .seconds(20))
        let server = try await accepted
        #expect(client.remoteAddress == hci0)
        #expect(client.localAddress == hci1)
        #expect(server.remoteAddress == hci1)
        return (server, client, listener)
    }

    /// Reads from `connection` until `count` bytes arrived (or the end).
    static func readAll(_ connection: BluetoothConnection, count: Int) async throws -> (bytes: [UInt8], packets: [Int]) {
        var bytes: [UInt8] = []
        var packets: [Int] = []
        while bytes.count < count {
            let chunk = try await connection.read()
            if chunk.isEmpty { break }
            packets.append(chunk.count)
            bytes += chunk
        }
        return (bytes, packets)
    }

    @Test(arguments: BluetoothSocketKind.allCases)
    func echoAndOneMebibyte(_ kind: BluetoothSocketKind) async throws {
        let (server, client, listener) = try await Self.connectedPair(kind)
        defer {
            client.close()
            server.close()
            listener.close()
        }
        #expect(listener.port != 0, "the kernel picks a \(kind) port for 0 and getsockname reports it")
        // echo
        try await client.write(Array("hello over \(kind)".utf8))
        let hello = try await Self.readAll(server, count: "hello over \(kind)".utf8.count)
        try await server.write(hello.bytes)
        let echoed = try await Self.readAll(client, count: hello.bytes.count)
        #expect(String(decoding: echoed.bytes, as: UTF8.self) == "hello over \(kind)")
        // 1 MiB from hci1 to hci0, compared by SHA-256 (the lab's virtual controllers pass
        // 192-byte ACL packets one at a time, under emulation: one direction is enough)
        let bulk = BluetoothLab.pattern(1 << 20, seed: 1)
        async let sent: Void = client.write(bulk)
        let received = try await Self.readAll(server, count: bulk.count)
        try await sent
        #expect(BluetoothLab.digest(received.bytes) == BluetoothLab.digest(bulk))
        if kind == .l2cap, let mtu = client.outgoingMTU {
            #expect(received.packets.allSatisfy { $0 <= mtu }, "a packet larger than the MTU \(mtu) arrived")
        }
    }

    /// Two links over one Bluetooth connection, closed at the same moment, end at each other's
    /// `GO_AWAY`. RFCOMM and L2CAP have no half-close (`shutdown` ends both directions), so a
    /// link that sent its `GO_AWAY` and waits for the peer's end of the connection (so that the
    /// goodbye is not lost) waited for it until its close timeout when the peer did the same
    /// (2 s by default; ten minutes here, and a link still waiting after 20 s fails the test).
    @Test(arguments: BluetoothSocketKind.allCases)
    func linksClosedAtTheSameMomentEndAtOnce(_ kind: BluetoothSocketKind) async throws {
        let (server, client, listener) = try await Self.connectedPair(kind)
        defer { listener.close() }
        let preface = try LinkPreface(encryption: .required, service: ServiceType("chat"))
        let (ana, bo) = (Identity.generate(), Identity.generate())
        let quiet = Logger(label: "lab.link", factory: { _ in SwiftLogNoOpLogHandler() })
        let dialer = Link(
            channel: BluetoothLinkChannel(client), role: .dialer, identity: ana, preface: preface,
            hello: Hello(displayName: try DisplayName("Ana")), expectedRemote: bo.fingerprint, closeTimeout: .seconds(600),
            logger: quiet)
        let accepting = Link(
            channel: BluetoothLinkChannel(server), role: .listener, identity: bo, preface: preface,
            hello: Hello(displayName: try DisplayName("Bo")), closeTimeout: .seconds(600), logger: quiet)
        let runs = [Task { await dialer.run() }, Task { await accepting.run() }]
        // Cancelling a run ends its wait: what the watchdog does if the links wait.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(60))
            for run in runs { run.cancel() }
        }
        defer { watchdog.cancel() }
        _ = try await dialer.established
        _ = try await accepting.established
        let closedAt = ContinuousClock.now
        dialer.close()
        accepting.close()
        for run in runs { await run.value }
        let took = ContinuousClock.now - closedAt
        #expect(took < .seconds(20), "over \(kind) the links ended \(took) after both closed: they waited for each other")
    }

    /// An accept waits on the I/O thread, not a thread of its own: closing the listener (whose
    /// shutdown alone does not wake a waiter on a listening RFCOMM socket), or cancelling the
    /// waiting task, still ends it at once, and the listener accepts after a cancelled accept.
    @Test(arguments: BluetoothSocketKind.allCases)
    func acceptEndsWhenTheListenerClosesOrTheTaskIsCancelled(_ kind: BluetoothSocketKind) async throws {
        let hci0 = try BluetoothLab.address(0)
        let hci1 = try BluetoothLab.address(1)
        let listener = try BluetoothListener(kind, adapter: hci0)
        let waiting = Task { try await listener.accept() }
        try await Task.sleep(for: .milliseconds(200))
        let closedAt = ContinuousClock.now
        listener.close()
        // (the test's own cancellation, at its time limit, reaches the unstructured task too)
        await #expect(throws: (any Error).self) {
            _ = try await withTaskCancellationHandler { try await waiting.value } onCancel: { waiting.cancel() }
        }
        #expect(ContinuousClock.now - closedAt < .seconds(2), "accept ended \(ContinuousClock.now - closedAt) after close")

        let second = try BluetoothListener(kind, adapter: hci0)
        defer { second.close() }
        let cancelled = Task { try await second.accept() }
        try await Task.sleep(for: .milliseconds(200))
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { _ = try await cancelled.value }

        // the listener still accepts after a cancelled accept (one connection: an RFCOMM connect
        // right after the close of another between the same adapters answers EBUSY for a while)
        async let accepted = second.accept()
        let client = try await BluetoothConnection.connect(kind, to: hci0, port: second.port, from: hci1, timeout: .seconds(20))
        let server = try await accepted
        #expect(server.remoteAddress == hci1)
        client.close()
        server.close()
    }

    @Test func l2capPacketsNeverExceedTheNegotiatedMTU() async throws {
        let (server, client, listener) = try await Self.connectedPair(.l2cap, serverMTU: 672)
        defer {
            client.close()
            server.close()
            listener.close()
        }
        // The server asked for 672: that is the most the client may send it.
        #expect(client.outgoingMTU == 672)
        #expect(server.incomingMTU == 672)
        let record = BluetoothLab.pattern(16 * 1024, seed: 3)
        try await client.write(record)
        let received = try await Self.readAll(server, count: record.count)
        #expect(received.bytes == record, "the 16 KiB record arrives whole")
        #expect(received.packets.allSatisfy { $0 <= 672 }, "packets: \(received.packets)")
        #expect(received.packets.count == (record.count + 671) / 672, "each read is one packet: \(received.packets)")
    }

    // L2CAP's Basic mode has no flow control: a receiver whose socket buffer is full drops
    // what keeps arriving. PeerLink asks for Enhanced Retransmission Mode, which holds the
    // sender back instead.
    @Test func l2capReceiverThatFallsBehindLosesNothing() async throws {
        let (server, client, listener) = try await Self.connectedPair(.l2cap)
        let watchdog = Task {
            // a lost packet would leave the reader waiting for bytes that never come
            try await Task.sleep(for: .seconds(90))
            server.close()
        }
        defer {
            watchdog.cancel()
            client.close()
            server.close()
            listener.close()
        }
        #expect(client.retransmissionMode == true, "the dialled channel runs in ERTM")
        #expect(server.retransmissionMode == true, "the accepted channel runs in ERTM")
        let bulk = BluetoothLab.pattern(2 << 20, seed: 5)
        async let sent: Void = client.write(bulk)
        // The reader starts late, so the receiving socket's buffer fills first.
        try await Task.sleep(for: .seconds(3))
        let received = try await Self.readAll(server, count: bulk.count)
        try await sent
        #expect(BluetoothLab.digest(received.bytes) == BluetoothLab.digest(bulk))
    }

    @Test(arguments: [
        "bt://ADDR/rfcomm/29", "bt://ADDR/l2cap/0x1e01",
    ])
    func nobodyListeningIsAClearErrorNotAHang(_ template: String) async throws {
        let hci0 = try BluetoothLab.address(0)
        // hci0 connectable, as while any PeerLink listens on it (stock bluetoothd pages only
        // for paired devices otherwise): the refusal must come from the channel / PSM
        let reachable = try BluetoothVisibilityHold.acquire(adapter: "hci0")
        defer { reachable?.release() }
        let endpoint = try Endpoint(parsing: template.replacingOccurrences(of: "ADDR", with: hci0.description), schemes: [.bluetooth])
        let transport = BluetoothTransport(adapter: try BluetoothLab.address(1))
        let error = await #expect(throws: PeerLinkError.self) {
            _ = try await transport.connect(endpoint, timeout: .seconds(20))
        }
        #expect(error?.code == .unavailable, "\(String(describing: error))")
        #expect(error?.message.contains("nothing listens on") == true, "\(String(describing: error))")
        #expect(error?.message.contains(hci0.description) == true, "\(String(describing: error))")
    }

    @Test func aTakenChannelIsAClearError() throws {
        let hci0 = try BluetoothLab.address(0)
        let first = try BluetoothTransportListener(.rfcomm, adapter: hci0, port: 0)
        defer { first.close() }
        let error = #expect(throws: PeerLinkError.self) {
            try BluetoothTransportListener(.rfcomm, adapter: hci0, port: first.port).close()
        }
        #expect(error?.message.contains("already taken") == true, "\(String(describing: error))")
    }

    @Test func anAddressOfNoAdapterIsAClearError() throws {
        let error = #expect(throws: PeerLinkError.self) {
            try BluetoothTransportListener(.l2cap, adapter: BluetoothAddress("00:11:22:33:44:55")!, port: 0).close()
        }
        #expect(error?.message.contains("peerlink radios") == true, "\(String(describing: error))")
    }

    // Last: it takes hci1 down and up again.
    @Test(arguments: BluetoothSocketKind.allCases)
    func aDialFromAnAdapterThatIsDownSaysSo(_ kind: BluetoothSocketKind) async throws {
        let hci0 = try BluetoothLab.address(0)
        let listener = try BluetoothTransportListener(kind, adapter: hci0, port: 0)
        defer { listener.close() }
        let endpoint = try #require(listener.localEndpoints.first)
        let transport = BluetoothTransport(adapter: try BluetoothLab.address(1))
        try await BluetoothLab.power(1, on: false)
        let error = await #expect(throws: PeerLinkError.self) {
            _ = try await transport.connect(endpoint, timeout: .seconds(20))
        }
        try await BluetoothLab.power(1, on: true)
        #expect(error?.code == .unavailable, "\(String(describing: error))")
        #expect(error?.message.contains("adapter hci1") == true && error?.message.contains("is down") == true, "\(String(describing: error))")
        // (Dialling again once it is up is left out: bluetoothd forgets hci1's pairings as it
        // goes down, and the lab's emulated controllers refuse a second pairing; see
        // BluetoothLab.renewControllers.)
    }
}
