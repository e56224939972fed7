import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import PeerLinkTestSupport
import Testing

/// Reliable messages arrive once each and in the order they were sent, however often the link
/// under them is replaced while they are on their way. Loopback TCP, real clock.
@Suite("Message order across link changes", .timeLimit(.minutes(2)))
struct MessageOrderTests {
    static let count = 800
    /// Three chunks each: a message is completed by its last chunk, which may come on another
    /// link than its first.
    static let size = 40 * 1024

    @Test("messages of several chunks sent while the receiver cuts the link again and again arrive once each, in order")
    func orderAcrossRepeatedCuts() async throws {
        let receiver = try HostilePeerTests.node("receiver", log: TestLog())
        let sender = try HostilePeerTests.node("sender", log: TestLog())
        defer {
            receiver.listener.close()
            sender.listener.close()
        }
        try await withRunning([receiver, sender]) {
            for node in [receiver, sender] { node.find([receiver, sender]) }
            try await receiver.log.wait("the sender connected", within: .seconds(30)) { $0.state(of: sender.peer) == .connected }
            try await sender.log.wait("the receiver connected", within: .seconds(30)) { $0.state(of: receiver.peer) == .connected }
            // Paced, so that the link is cut several times while messages are on their way.
            let sent = Locked(false)
            let sending = Task {
                defer { sent.withLock { $0 = true } }
                for index in 0..<Self.count {
                    var message = [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: Self.size)
                    message[0] = UInt8(index >> 8)
                    message[1] = UInt8(index & 0xFF)
                    try await sender.session.send(message, to: [receiver.peer])
                    if index % 10 == 9 { try await Task.sleep(for: .milliseconds(10)) }
                }
            }
            // Cuts while the messages flow: each ends the link under the pair, which comes back
            // on a new one within the grace; what was in flight is written again there.
            var cuts = 0
            while cuts < 12, !sent.withLock({ $0 }) {
                try await Task.sleep(for: .milliseconds(25))
                guard let link = receiver.session.channel(for: sender.peer)?.activeLink else { continue }
                link.channel.close()
                cuts += 1
            }
            #expect(cuts >= 2, "the link was cut \(cuts) times while messages were sent")
            try await sending.value
            try await receiver.log.wait("every message", within: .seconds(90)) {
                $0.messages(from: sender.peer).count >= Self.count
            }
            let received = receiver.log.events.messages(from: sender.peer)
            #expect(received.count == Self.count, "\(received.count) messages for \(Self.count) sent (\(cuts) cuts)")
            let order = received.map { Int($0[0]) << 8 | Int($0[1]) }
            #expect(order == Array(0..<Self.count), "out of order or repeated after \(cuts) cuts")
            #expect(received.allSatisfy { $0.count == Self.size })
            #expect(await receiver.session.state(of: sender.peer) == .connected)
        }
    }
}
