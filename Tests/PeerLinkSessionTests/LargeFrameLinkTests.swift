import PeerLinkCore
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// Large frames between two links that both ask for them: written over a transport that
/// carries them well (TCP), cut to 16384 bytes over Bluetooth, and never to a side that did not ask.
@Suite("Link: large frames by transport", .timeLimit(.minutes(1)))
struct LargeFrameLinkTests {
    static func hello(_ name: String, large: Bool) -> Hello {
        Hello(displayName: try! DisplayName(name), maxFramePayload: large ? WireFormat.largeFramePayload : nil)
    }

    /// 100,000 bytes that differ from any shift of themselves by a frame's size.
    static let message = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 9) }

    /// A 100,000-byte message sent in one frame from Ana's link: the chunks Bo's link receives,
    /// and what each link says it writes.
    static func exchange(kind: TransportKind, anaLarge: Bool = true, boLarge: Bool = true) async throws -> (
        chunks: [Int], bytes: [UInt8], anaWrites: Int, boWrites: Int
    ) {
        let log = TestLog()
        let network = MemoryNetwork(bufferCapacity: 256 * 1024)
        let listener = try network.listen(name: "bo", kind: kind)
        defer { listener.close() }
        let transport = MemoryTransport(network: network, kind: kind)
        let dialed = try await transport.dial(.memory(name: "bo", kind: kind), timeout: .seconds(1))
        let accepted = try await listener.accept()
        let ana = Link(
            channel: dialed, role: .dialer, identity: .generate(), preface: LinkFixture.preface(.required),
            hello: hello("Ana", large: anaLarge), logger: log.logger)
        let bo = Link(
            channel: accepted, role: .listener, identity: .generate(), preface: LinkFixture.preface(.required),
            hello: hello("Bo", large: boLarge), logger: log.logger)
        let message = Self.message
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await ana.run() }
            group.addTask { await bo.run() }
            let anaWrites = try await ana.established.bulkFramePayload
            let boWrites = try await bo.established.bulkFramePayload
            // sequenced frames go through the pair's channels, as in a session; Bo's link then
            // hands the chunks it reads to its events
            _ = try await attachChannel(to: ana, local: .generate(), log: log)
            _ = try await attachChannel(to: bo, local: .generate(), log: log)
            // one frame larger than any link writes: cut where the link takes it
            try await ana.send(.message(id: 1, flags: .more, chunk: FramePayload(message[..<WireFormat.largeFramePayload])))
            try await ana.send(.message(id: 1, flags: [], chunk: FramePayload(message[WireFormat.largeFramePayload...])))
            var chunks: [Int] = []
            var bytes: [UInt8] = []
            var events = bo.events.makeAsyncIterator()
            while bytes.count < message.count, let event = await events.next() {
                guard case .frame(.message(1, _, let chunk)) = event else { continue }
                chunks.append(chunk.count)
                chunk.append(to: &bytes)
            }
            ana.close()
            bo.close()
            try await group.waitForAll()
            return (chunks, bytes, anaWrites, boWrites)
        }
    }

    @Test(arguments: ["tcp", "memory"] as [TransportKind])
    func overTCPBothAskingWriteLargeFrames(_ kind: TransportKind) async throws {
        let result = try await Self.exchange(kind: kind)
        #expect(result.anaWrites == 61440 && result.boWrites == 61440)
        #expect(result.chunks == [61440, 100_000 - 61440])
        #expect(result.bytes == Self.message)
    }

    @Test(arguments: ["rfcomm", "l2cap"] as [TransportKind])
    func overBluetoothFramesAreCutToTheSmallSize(_ kind: TransportKind) async throws {
        let result = try await Self.exchange(kind: kind)
        #expect(result.anaWrites == 16384 && result.boWrites == 16384)
        #expect(result.chunks == [16384, 16384, 16384, 12288, 16384, 16384, 5792])
        #expect(result.bytes == Self.message)
    }

    @Test(arguments: [(true, false), (false, true)])
    func aSideThatDoesNotAskGetsSmallFrames(_ anaLarge: Bool, _ boLarge: Bool) async throws {
        let result = try await Self.exchange(kind: "tcp", anaLarge: anaLarge, boLarge: boLarge)
        #expect(result.anaWrites == 16384 && result.boWrites == 16384)
        #expect(result.chunks.allSatisfy { $0 <= 16384 })
        #expect(result.bytes == Self.message)
    }
}
