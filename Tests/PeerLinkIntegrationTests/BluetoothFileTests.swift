import Foundation
import PeerLink
import Testing

/// Files between two sessions in the VM lab: hci0 listens on RFCOMM and L2CAP, hci1 dials;
/// the sessions require encryption. A file arrives whole (its SHA-256); a transfer resumes
/// after hci0 goes down and comes back up.
@Suite(
    "Bluetooth files in the VM lab", .serialized, .enabled(if: BluetoothLab.enabled, BluetoothLab.reason),
    .timeLimit(.minutes(3)))
struct BluetoothFileTests {
    typealias Running = BluetoothSessionTests.Running

    /// The receiving side: every file stream hci0's session gets is accepted into `directory`.
    final class Receiving: Sendable {
        let directory = TestHost.temporaryDirectory("peerlink-bt-files")
        let received: AsyncStream<FileTransfer>
        let task: Task<Void, Never>

        init(_ session: PeerSession) {
            let (received, sink) = AsyncStream.makeStream(of: FileTransfer.self)
            self.received = received
            let fileReceiver = FileReceiver(directory: directory)
            task = Task {
                for await stream in session.incomingStreams {
                    Task {
                        guard let incoming = try? await fileReceiver.offer(on: stream) else { return }
                        sink.yield(incoming.accept())
                    }
                }
                sink.finish()
            }
        }

        /// The path of the first transfer that ends saved (bounded); earlier ones may end with a lost link.
        func saved(within limit: Duration = .seconds(60)) async throws -> String {
            try await withThrowingTaskGroup(of: String?.self) { group in
                group.addTask { [received] in
                    for await incoming in received {
                        if case .success(.received(let path)) = await incoming.result() { return path }
                    }
                    return nil
                }
                group.addTask {
                    try await Task.sleep(for: limit)
                    throw HarnessError("no file was saved within \(limit)")
                }
                defer { group.cancelAll() }
                guard let path = try await group.next() ?? nil else { throw HarnessError("the receiving session ended before a file was saved") }
                return path
            }
        }
    }

    /// The endpoint of hci0's listener of `kind`.
    static func endpoint(_ server: Running, _ kind: BluetoothSocketKind) throws -> Endpoint {
        try #require(server.session.listeners.flatMap(\.localEndpoints).first { $0.transport == kind.rawValue })
    }

    /// Connects hci1's session to hci0's and waits until both see the link.
    static func connect(_ client: Running, _ server: Running, _ endpoint: Endpoint) async throws -> PeerID {
        let peer = try await client.session.connect(to: endpoint)
        try await client.waitForState(peer, .connected)
        try await server.waitForState(client.session.localPeer, .connected)
        let info = try #require(await client.session.info(for: peer))
        #expect(info.transport == endpoint.transport)
        #expect(info.encrypted)
        return peer
    }

    @Test("1 MiB of random bytes arrives with the right SHA-256", arguments: BluetoothSocketKind.allCases)
    func oneMebibyte(_ kind: BluetoothSocketKind) async throws {
        try await Self.sendOneMebibyte(kind)
    }

    static func sendOneMebibyte(_ kind: BluetoothSocketKind) async throws {
        let (server, client) = try await BluetoothSessionTests.pair()
        let receiving = Receiving(server.session)
        do {
            let peer = try await Self.connect(client, server, try Self.endpoint(server, kind))
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 1))
            // nothing should drop here: a short window keeps a failure short
            let transfer = client.session.sendFile(file, to: peer, using: FileSender(resumeWindow: .seconds(10)))
            let ended = await transfer.updates.drain()
            #expect(ended == nil, "\(ended?.message ?? "")")
            #expect(try await transfer.result().get() == .sent)
            #expect(transfer.acceptedOffsets == [0])
            let path = try await receiving.saved()
            #expect(path == receiving.directory + "/payload.bin")
            let arrived = try await OutgoingFile.prepare(path: path)
            #expect(arrived.size == 1 << 20)
            #expect(arrived.sha256 == file.sha256)
        } catch {
            await client.stop()
            await server.stop()
            throw error
        }
        await client.stop()
        await server.stop()
    }

    // Last: it takes hci0 down and up again.
    //
    // Not in the default lab run: with link protocol v2 it failed in 4 of 7 lab runs, each time
    // in the emulated machine rather than in PeerLink — after hci0 was powered off and on and hci1
    // reset (what forgetDeadLinks does for the emulator), either bluetoothd died, or the guest
    // kernel's RFCOMM/L2CAP connects to hci0 stopped answering for good (a connect thread stuck
    // in the kernel; the test process could then not exit). The lab's other tests cover files
    // over both link kinds and failover; run this one with
    // `PEERLINK_LAB_ADAPTER_CYCLES=1 Hardware/bluetooth-lab.sh --filter resumeAfterAdapterDownAndUp`.
    @Test(
        "4 MiB: hci0 goes down mid-transfer and up again; after a new connect the transfer resumes",
        .enabled(
            if: TestHost.environment["PEERLINK_LAB_ADAPTER_CYCLES"] == "1",
            "powers adapters off and on under a transfer, which the emulated lab does not survive reliably: PEERLINK_LAB_ADAPTER_CYCLES=1 runs it"),
        arguments: BluetoothSocketKind.allCases)
    func resumeAfterAdapterDownAndUp(_ kind: BluetoothSocketKind) async throws {
        // The file sent again after the peer left: the session's reconnect grace is off, so the
        // lost link ends the pair at once (with the grace, the session would dial it again).
        let (server, client) = try await BluetoothSessionTests.pair(reconnectGrace: .zero)
        let receiving = Receiving(server.session)
        var adapterDown = false
        do {
            let endpoint = try Self.endpoint(server, kind)
            let file = try await OutgoingFile.prepare(path: try FilePair.makeFile(mebibytes: 4))
            let peer = try await Self.connect(client, server, endpoint)
            let transfer = client.session.sendFile(file, to: peer, using: FileSender(resumeWindow: .seconds(90)))
            let (cut, cutSink) = AsyncStream.makeStream(of: UInt64.self)
            let finished = Shared(false)
            let progress = Task {
                var signalled = false
                let ended = await transfer.updates.drain { progress in
                    if !signalled, progress.bytesDone >= 1 << 20 {
                        signalled = true
                        cutSink.yield(progress.bytesDone)
                    }
                }
                cutSink.finish()
                finished.update { $0 = true }
                return ended
            }
            var cuts = cut.makeAsyncIterator()
            guard let cutAt = await cuts.next() else {
                let ended = await progress.value
                throw HarnessError("the transfer ended before 1 MiB was sent: \(ended?.message ?? "it was sent whole")")
            }
            try await BluetoothLab.power(0, on: false)
            adapterDown = true
            try await client.waitForState(peer, .notConnected, within: .seconds(60))
            try await server.waitForState(client.session.localPeer, .notConnected, within: .seconds(60))
            try await BluetoothLab.power(0, on: true)
            adapterDown = false
            try await BluetoothLab.forgetDeadLinks(1)
            try await BluetoothLab.waitUntilNoLinks()
            try await BluetoothLab.waitUntilUp(0)
            try await BluetoothLab.waitUntilUp(1)
            _ = try await Self.reconnect(client, server, endpoint)
            // The emulator may cut a link between controllers that met before seconds after it
            // opens (see BluetoothLab.renewControllers): the sender then waits for the peer again,
            // as a user's would, and is connected again until the transfer is done (bounded).
            let deadline = ContinuousClock.now + .seconds(100)
            while !finished.value, ContinuousClock.now < deadline {
                if await client.session.info(for: peer) == nil {
                    try await BluetoothLab.waitUntilNoLinks()
                    _ = try await Self.reconnect(client, server, endpoint)
                }
                try await Task.sleep(for: .milliseconds(500))
            }

            let ended = await progress.value
            #expect(ended == nil, "\(ended?.message ?? "")")
            #expect(try await transfer.result().get() == .sent)
            let offsets = transfer.acceptedOffsets
            #expect(offsets.count >= 2, "hci0 went down after \(cutAt) bytes: \(offsets)")
            #expect(offsets.first == 0)
            #expect((offsets.last ?? 0) > 0, "resumed at the receiver's offset, not restarted from 0: \(offsets)")
            let path = try await receiving.saved()
            #expect(path == receiving.directory + "/payload.bin")
            let arrived = try await OutgoingFile.prepare(path: path)
            #expect(arrived.size == 4 << 20)
            #expect(arrived.sha256 == file.sha256)
            #expect(try FileManager.default.contentsOfDirectory(atPath: receiving.directory) == ["payload.bin"], "no partial files remain")
        } catch {
            if adapterDown {
                try? await BluetoothLab.power(0, on: true)
            }
            await client.stop()
            await server.stop()
            throw error
        }
        await client.stop()
        await server.stop()
    }

    /// Connects again after the adapter came back: bounded tries for up to 60 s (the first may
    /// come before hci0 takes connections again).
    static func reconnect(_ client: Running, _ server: Running, _ endpoint: Endpoint) async throws -> PeerID {
        let deadline = ContinuousClock.now + .seconds(60)
        var errors: [String] = []
        while true {
            do {
                return try await connect(client, server, endpoint)
            } catch {
                errors.append("\(error)")
                guard ContinuousClock.now < deadline else { break }
                try await Task.sleep(for: .seconds(2))
            }
        }
        throw HarnessError("hci1 could not connect to hci0 again within 60 s after it came back up: \(errors)")
    }
}
