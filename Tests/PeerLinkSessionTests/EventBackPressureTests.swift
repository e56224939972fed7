import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// An app that stops reading its session's events holds up the peers that send to it, not its
/// own memory: over `maximumQueuedMessageBytesPerPeer` the sender is held back (no ACKs), and
/// everything arrives, once and in order, when the app reads on. Loopback TCP, real clock.
@Suite("Events the app does not read", .timeLimit(.minutes(2)))
struct EventBackPressureTests {
    static let limit = 1 << 20
    static let chunk = 64 * 1024
    static let count = 200  // 12.5 MiB: more than the limit and the sender's 4 MiB window together

    @Test("a peer whose messages the app does not take is held back within its window, across a link failure; the others are not; nothing is lost once it reads")
    func heldBackThenDelivered() async throws {
        var limits = ResourceLimits.default
        limits.maximumQueuedMessageBytesPerPeer = Self.limit
        let reader = try HostilePeerTests.node("reader", log: TestLog(), limits: limits)
        let flooder = try HostilePeerTests.node("flooder", log: TestLog())
        let chatter = try HostilePeerTests.node("chatter", log: TestLog())
        let readerRuns = Task { await reader.run() }
        defer { reader.listener.close() }
        do {
        try await withRunning([flooder, chatter]) {
            for node in [reader, flooder, chatter] { node.find([reader, flooder, chatter]) }
            for node in [flooder, chatter] {
                try await node.log.wait("\(node.peer.displayName) connected to the reader", within: .seconds(30)) {
                    $0.state(of: reader.peer) == .connected
                }
            }
            for peer in [flooder.peer, chatter.peer] {
                while await reader.session.state(of: peer) != .connected { try await Task.sleep(for: .milliseconds(20)) }
            }
            // The flooder sends far more than the reader's app may leave unread.
            for index in 0..<Self.count {
                var message = [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: Self.chunk)
                message[0] = UInt8(index >> 8)
                message[1] = UInt8(index & 0xFF)
                try await flooder.session.send(message, to: [reader.peer])
            }
            try await eventually("the flooder held back", within: .seconds(20)) {
                reader.session.queuedMessageBytes(from: flooder.peer) > Self.limit
            }
            try await Task.sleep(for: .seconds(1))
            let queued = reader.session.queuedMessageBytes(from: flooder.peer)
            // the limit, the message that went over it, the sender's window and a frame of slack
            let bound = Self.limit + Self.chunk + Continuity.Policy.default.maxRetainedBytes + WireFormat.maxFramePayload + 64
            #expect(queued <= bound, "\(queued) bytes queued for the app; bound \(bound)")
            #expect(queued < Self.count * Self.chunk, "everything arrived: the flooder was not held back")
            // The flooder's link fails while it is held back: the pair comes back on a new link,
            // still held, and still nothing is lost.
            reader.session.channel(for: flooder.peer)?.activeLink?.channel.close()
            // Another peer's messages still arrive while the flooder is held back.
            for index in 1...20 { try await chatter.session.send(Array("chatter \(index)".utf8), to: [reader.peer]) }
            try await eventually("the chatter's messages queued for the app", within: .seconds(20)) {
                reader.session.queuedMessageBytes(from: chatter.peer) >= 20 * 9
            }
            // The app reads: every message arrives, once and in order.
            let reading = Task { await reader.log.record(reader.session.events) }
            defer { reading.cancel() }
            try await reader.log.wait("every message from the flooder", within: .seconds(120)) {
                $0.messages(from: flooder.peer).filter { $0.count == Self.chunk }.count >= Self.count
            }
            let received = reader.log.events.messages(from: flooder.peer).filter { $0.count == Self.chunk }
            #expect(received.count == Self.count)
            #expect(received.map { Int($0[0]) << 8 | Int($0[1]) } == Array(0..<Self.count), "out of order or repeated")
            #expect(reader.log.events.messages(from: chatter.peer).count == 20)
            try await eventually("nothing left queued", within: .seconds(10)) {
                reader.session.queuedMessageBytes(from: flooder.peer) == 0
            }
            #expect(await reader.session.state(of: flooder.peer) == .connected, "the flooder's link was closed")
        }
        } catch {
            await reader.session.disconnect()
            await readerRuns.value
            throw error
        }
        await reader.session.disconnect()
        await readerRuns.value
    }
}
