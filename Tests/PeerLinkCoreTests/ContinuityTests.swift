import PeerLinkCore
import Testing

@Suite("Continuity: sequence numbers, acknowledgements and resending across links")
struct ContinuityTests {
    static func chunk(_ index: Int) -> Frame { .message(id: UInt32(index), flags: [], chunk: [UInt8(truncatingIfNeeded: index)]) }

    @Test func framesAreNumberedInOrderAndKeptUntilAcknowledged() {
        var sender = Continuity()
        for index in 1...5 {
            let sequence = sender.stamp(Self.chunk(index), size: 30)
            #expect(sequence == UInt64(index))
        }
        #expect(sender.retainedCount == 5 && sender.retainedBytes == 150)
        let first = sender.acknowledge(through: 3)
        #expect(first)
        #expect(sender.retained(after: 0).map(\.sequence) == [4, 5])
        #expect(sender.retainedBytes == 60)
        // an old or repeated acknowledgement changes nothing; one beyond what was sent is refused
        let repeated = sender.acknowledge(through: 2)
        #expect(repeated)
        #expect(sender.retainedCount == 2)
        let beyond = sender.acknowledge(through: 9)
        #expect(!beyond)
        #expect(sender.retainedCount == 2)
    }

    @Test func aNewLinkGetsEveryKeptFrameAgainFromWhatArrived() {
        var sender = Continuity()
        for index in 1...6 { _ = sender.stamp(Self.chunk(index), size: 10) }
        _ = sender.acknowledge(through: 2)
        // the receiver says (in its first ACK on the new link) that 4 arrived: 5 and 6 go again
        #expect(sender.retained(after: 4).map(\.sequence) == [5, 6])
        #expect(sender.retained(after: 0).map(\.frame) == (3...6).map(Self.chunk))
    }

    @Test func theReceiverTakesEachFrameOnceInOrderAndAcknowledgesCopiesAndGapsAtOnce() {
        var receiver = Continuity()
        var arrivals: [Continuity.Arrival] = []
        arrivals.append(receiver.receive(1, size: 10, at: .zero))
        arrivals.append(receiver.receive(2, size: 10, at: .zero))
        var ack = receiver.acknowledgment(at: .zero)
        #expect(ack == nil, "not due yet")
        arrivals.append(receiver.receive(2, size: 10, at: .zero))
        ack = receiver.acknowledgment(at: .zero)
        #expect(ack == 2, "a copy is answered at once")
        arrivals.append(receiver.receive(4, size: 10, at: .zero))
        #expect(receiver.received == 2)
        ack = receiver.acknowledgment(at: .zero)
        #expect(ack == 2)
        arrivals.append(receiver.receive(3, size: 10, at: .zero))
        arrivals.append(receiver.receive(4, size: 10, at: .zero))
        #expect(arrivals == [.accepted, .accepted, .duplicate, .gap, .accepted, .accepted])
        #expect(receiver.received == 4)
    }

    @Test func acknowledgementsAreBatched() {
        var receiver = Continuity(policy: .init(ackEveryFrames: 4, ackEveryBytes: 1000, ackDelay: .milliseconds(20)))
        var ack: UInt64?
        // by count
        for sequence in 1...3 { _ = receiver.receive(UInt64(sequence), size: 10, at: .zero) }
        ack = receiver.acknowledgment(at: .milliseconds(1))
        #expect(ack == nil)
        _ = receiver.receive(4, size: 10, at: .milliseconds(1))
        ack = receiver.acknowledgment(at: .milliseconds(1))
        #expect(ack == 4)
        // by time: due 20 ms after the first frame not acknowledged
        _ = receiver.receive(5, size: 10, at: .milliseconds(100))
        #expect(receiver.acknowledgmentDeadline == .milliseconds(120))
        ack = receiver.acknowledgment(at: .milliseconds(119))
        #expect(ack == nil)
        ack = receiver.acknowledgment(at: .milliseconds(120))
        #expect(ack == 5)
        #expect(receiver.acknowledgmentDeadline == nil)
        // by bytes
        _ = receiver.receive(6, size: 1000, at: .milliseconds(200))
        ack = receiver.acknowledgment(at: .milliseconds(200))
        #expect(ack == 6)
        // a new link: what arrived is said at once
        receiver.linkStarted()
        ack = receiver.acknowledgment(at: .milliseconds(201))
        #expect(ack == 6)
        ack = receiver.acknowledgment(at: .milliseconds(202))
        #expect(ack == nil)
    }

    @Test func theSenderStopsAtTheRetainedLimit() {
        var sender = Continuity(policy: .init(maxRetainedBytes: 100_000))
        var sent = 0
        while sender.canSend, sent < 1000 {
            _ = sender.stamp(Self.chunk(sent), size: 16_000)
            sent += 1
        }
        #expect(sent == 7)
        _ = sender.acknowledge(through: 3)
        #expect(sender.canSend)
    }

    /// Frames sent over links that fail at random points, resent on the next link from what the
    /// receiver acknowledged: every frame is taken exactly once, in order.
    @Test(arguments: 1...200)
    func randomLinkChangesLoseAndRepeatNothing(seed: Int) {
        var random = SeededGenerator(seed: UInt64(seed))
        var sender = Continuity(policy: .init(ackEveryFrames: 1 + Int(random.next() % 8)))
        var receiver = Continuity()
        var taken: [UInt64] = []
        var toSend = 1
        let total = 300
        var inFlight: [(UInt64, Frame)] = []   // the current link, in order
        var now = Duration.zero
        var rounds = 0
        while taken.count < total, rounds < 100_000 {
            rounds += 1
            now += .milliseconds(1)
            switch random.next() % 10 {
            case 0:
                // the link fails: what was in flight is lost; a new link starts
                inFlight.removeAll(keepingCapacity: true)
                receiver.linkStarted()
                if let ack = receiver.acknowledgment(at: now) {
                    _ = sender.acknowledge(through: ack)
                    inFlight += sender.retained(after: ack).map { ($0.sequence, $0.frame) }
                }
            case 1, 2, 3, 4:
                if toSend <= total, sender.canSend {
                    let frame = Self.chunk(toSend)
                    inFlight.append((sender.stamp(frame, size: 20), frame))
                    toSend += 1
                }
            default:
                if !inFlight.isEmpty {
                    let (sequence, _) = inFlight.removeFirst()
                    if receiver.receive(sequence, size: 20, at: now) == .accepted { taken.append(sequence) }
                }
                if let ack = receiver.acknowledgment(at: now) { _ = sender.acknowledge(through: ack) }
            }
        }
        #expect(taken == (1...UInt64(total)).map { $0 }, "seed \(seed)")
    }
}

@Suite("Continuity held back while the app is behind")
struct ContinuityHoldTests {
    @Test func acknowledgementsStopAtTheHoldPointAndResumeOnRelease() {
        var receiver = Continuity()
        for sequence in 1...3 { #expect(receiver.receive(UInt64(sequence), size: 100, at: .zero) == .accepted) }
        receiver.hold()
        #expect(receiver.heldAt == 3)
        for sequence in 4...10 { #expect(receiver.receive(UInt64(sequence), size: 100, at: .zero) == .accepted) }
        #expect(receiver.bytesPastHold == 700)
        // what arrived before the hold is acknowledged, once; nothing after it
        #expect(receiver.acknowledgment(at: .seconds(1), piggyback: true) == 3)
        #expect(receiver.acknowledgment(at: .seconds(2), piggyback: true) == nil)
        // a new link learns the hold point again
        receiver.linkStarted()
        #expect(receiver.acknowledgment(at: .seconds(3)) == 3)
        #expect(receiver.acknowledgment(at: .seconds(4)) == nil)
        // caught up: everything that arrived is acknowledged at once
        receiver.release()
        #expect(receiver.heldAt == nil && receiver.bytesPastHold == 0)
        #expect(receiver.acknowledgmentPending)
        #expect(receiver.acknowledgment(at: .seconds(5)) == 10)
    }

    @Test func aHeldReceiverStopsTheSenderAtItsWindow() {
        let policy = Continuity.Policy(maxRetainedBytes: 64 * 1024)
        var sender = Continuity(policy: policy)
        var receiver = Continuity(policy: policy)
        receiver.hold()
        var sent = 0
        while sender.canSend, sent < 1000 {
            let sequence = sender.stamp(.datagram([]), size: 1024)
            _ = receiver.receive(sequence, size: 1024, at: .zero)
            if let through = receiver.acknowledgment(at: .seconds(1)) { _ = sender.acknowledge(through: through) }
            sent += 1
        }
        #expect(!sender.canSend)
        #expect(receiver.bytesPastHold <= policy.maxRetainedBytes + 1024)
    }
}
