import PeerLinkCore
import Testing

@Suite("Session: random operations keep the invariants", .ownThread)
struct SessionChaosTests {
    /// Random peers (3 to 9), limits and modes; random invitations, answers, cut links, extra
    /// links opened by the owner, failing dials, disconnects, discovery churn and messages, in
    /// random orders and times. Throughout: nobody holds more peers than its limit. At the end,
    /// after two quiet minutes: every connection is mutual and has a link, nobody is left
    /// *connecting* unless an app has not answered yet, and no message arrived twice.
    @Test(arguments: Array(1...60) as [UInt64])
    func invariantsHold(seed: UInt64) throws {
        let (played, context, maximumPeers) = try Self.play(seed: seed)
        var net = played
        net.failingDials = []
        net.advance(by: .seconds(120), tickEvery: .seconds(1))

        for node in net.nodes.indices {
            #expect(net.connected(node).count <= maximumPeers - 1, "\(context)")
            for other in net.connected(node) {
                #expect(net.connected(other).contains(node), "\(context): \(node) → \(other) is not mutual")
                #expect(net.liveLinks(between: node, and: other) >= 1, "\(context): \(node)–\(other) connected without a link")
            }
            for other in net.nodes.indices where other != node && net.machine(node).state(of: net.peer(other)) == .connecting {
                // Only while the other app has not answered (automatic peers retry).
                #expect(!net.machine(other).invitationsAwaitingAnswer.isEmpty, "\(context): \(node) stuck connecting to \(other)")
            }
            let serials = net.received(node).filter { $0.data.count >= 4 }.map { Array($0.data.prefix(4)) }
            #expect(Set(serials).count == serials.count, "\(context): a message arrived twice at \(node)")
        }
    }

    /// The random operations of one seed, checking the peer limit as they go. With
    /// `settlingFully`, every input settles in full (the state machine's fast path for
    /// messages off).
    static func play(seed: UInt64, settlingFully: Bool = false) throws -> (SessionNet, String, Int) {
        var random = SeededGenerator(seed: seed &* 977)
        let count = Int.random(in: 3...9, using: &random)
        let maximumPeers = Int.random(in: 3...8, using: &random)
        let automatic = Bool.random(using: &random)
        let context = "seed \(seed), \(count) peers, at most \(maximumPeers), automatic \(automatic)"
        var net = try SessionNet(
            (0..<count).map { "chaos\($0)" }, policy: SessionPolicy(maximumPeers: maximumPeers, automatic: automatic), seed: seed)
        if settlingFully { for node in net.nodes.indices { net.nodes[node].machine.settlesEveryInputFully = true } }
        if automatic { net.discoverEveryone() }
        var serial: UInt32 = 0
        for round in 0..<80 {
            let a = Int.random(in: 0..<count, using: &random)
            var b = Int.random(in: 0..<count, using: &random)
            if b == a { b = (a + 1) % count }
            switch Int.random(in: 0..<10, using: &random) {
            case 0, 1, 2: _ = try? net.invite(a, b, timeout: .seconds(Int64.random(in: 1...40, using: &random)))
            case 3: net.breakLinks(between: a, and: b)
            case 4: if round % 7 == 0 { net.disconnect(a) }
            case 5: net.openLink(from: a, to: b)
            case 6:
                serial += 1
                let filler = [UInt8](repeating: 1, count: Int.random(in: 0...40000, using: &random))
                let bytes = withUnsafeBytes(of: serial.bigEndian, Array.init) + filler
                _ = try? net.send(a, bytes, to: [b], reliable: Bool.random(using: &random))
            case 7: net.failingDials = Bool.random(using: &random) ? [[a, b]] : []
            case 8:
                if automatic {
                    net.apply(a, net.nodes[a].machine.peerLost(net.peer(b), at: net.now))
                    net.found(a, b)
                }
            default: break
            }
            net.run(limit: Int.random(in: 0...200, using: &random))
            for node in net.nodes.indices {
                for waiting in net.machine(node).invitationsAwaitingAnswer where Bool.random(using: &random) {
                    _ = try? net.respond(node, waiting, accept: Bool.random(using: &random))
                }
            }
            if Bool.random(using: &random) { net.advance(by: .seconds(Int64.random(in: 0...5, using: &random))) }
            for node in net.nodes.indices { #expect(net.connected(node).count <= maximumPeers - 1, "\(context)") }
        }
        return (net, context, maximumPeers)
    }

    /// The fast path for messages (`settle(movingMessagesOf:)`) is an optimization only: the
    /// same operations with every input settled in full give every peer the same events, the
    /// same closes and the same control messages, in the same order.
    @Test(arguments: Array(1...30) as [UInt64])
    func theFastPathChangesNothing(seed: UInt64) throws {
        var fast = try Self.play(seed: seed).0
        var full = try Self.play(seed: seed, settlingFully: true).0
        fast.failingDials = []
        full.failingDials = []
        fast.advance(by: .seconds(120), tickEvery: .seconds(1))
        full.advance(by: .seconds(120), tickEvery: .seconds(1))
        for node in fast.nodes.indices {
            #expect(fast.events(node).map { "\($0)" } == full.events(node).map { "\($0)" }, "seed \(seed), node \(node)")
        }
        #expect(fast.closes.map { "\($0)" } == full.closes.map { "\($0)" }, "seed \(seed)")
        #expect(fast.controlLog.map { "\($0)" } == full.controlLog.map { "\($0)" }, "seed \(seed)")
        #expect(fast.stepsTaken == full.stepsTaken, "seed \(seed)")
    }
}
