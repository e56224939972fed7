import Crypto
@_spi(Runtime) import PeerLinkCore
import Testing

/// A pair of peers sending reliable messages, stream bytes and a file both ways over links that
/// fail, change transport (a new link carries the pair while the old one still delivers what it
/// had in flight) and come back after a while with none — 1,000 seeded schedules on a manual
/// clock. Each side is what a session's pair channel is made of: a ``Continuity`` and a
/// ``FrameScheduler``, with frames sealed into records by the wire codec. Whatever the schedule:
/// every reliable message arrives once, in order; every stream byte once; every file's SHA-256
/// is right.
@Suite("Continuity: seeded schedules of link failures, transport changes and reconnects", .ownThread)
struct ContinuitySimulationTests {
    @Test(arguments: 1...1000)
    func nothingLostRepeatedOrReordered(seed: Int) throws {
        var simulation = PairSimulation(seed: UInt64(seed))
        try simulation.run()
        for side in 0..<2 {
            let other = 1 - side
            let context = "seed \(seed), side \(side): \(simulation.summary)"
            let sent = simulation.sides[side], received = simulation.sides[other]
            let messagesRight = received.messagesReceived == sent.messagesSent
            #expect(messagesRight, "\(context): \(received.messagesReceived.count) of \(sent.messagesSent.count) messages taken, not all as sent")
            let streamRight = received.streamReceived == sent.streamSent
            #expect(streamRight, "\(context): \(received.streamReceived.count) of \(sent.streamSent.count) stream bytes, not all as sent")
            #expect(received.streamFinished, "\(context): the file's FIN did not arrive")
            let fileRight = Array(SHA256.hash(data: received.fileReceived)) == Array(SHA256.hash(data: sent.file))
            #expect(fileRight, "\(context): the file arrived as \(received.fileReceived.count) of \(sent.file.count) bytes, SHA-256 differs")
            #expect(simulation.sides[side].continuity.retainedCount == 0, "\(context): everything sent was acknowledged")
        }
    }
}

/// One side of the simulated pair.
struct SimulatedSide {
    var continuity: Continuity
    var scheduler = FrameScheduler()
    /// Reliable messages sent (whole), and those taken from the peer, in order.
    var messagesSent: [[UInt8]] = []
    var messagesReceived: [[UInt8]] = []
    var partial: [UInt32: [UInt8]] = [:]
    var nextMessage: UInt32 = 1
    /// Stream 1 (bytes) and stream 3 (a file, then FIN).
    var streamSent: [UInt8] = []
    var streamReceived: [UInt8] = []
    var streamFinished = false
    var file: [UInt8] = []
    var fileOffset = 0
    /// The file was handed over whole (its last piece, with FIN, is queued).
    var fileQueued = false
    var fileReceived: [UInt8] = []
    /// The link this side writes on (index into the simulation's links).
    var active: Int?
}

/// A link: records in flight each way (FIFO), and whether it still carries them.
struct SimulatedLink {
    var inFlight: [[[UInt8]]] = [[], []]  // [from side] → records, oldest first
    var open = true
}

struct PairSimulation {
    var random: SeededGenerator
    var sides: [SimulatedSide]
    var links: [SimulatedLink] = []
    var now = Duration.zero
    var failures = 0
    var changes = 0
    var outages = 0
    /// The schedule of faults ends here; then the pair runs undisturbed until all is through.
    let faultSteps: Int
    var faulting = true

    init(seed: UInt64) {
        random = SeededGenerator(seed: seed &* 0x9E37_79B9)
        func policy(_ random: inout SeededGenerator) -> Continuity.Policy {
            Continuity.Policy(
                ackEveryFrames: Int.random(in: 1...48, using: &random), ackEveryBytes: Int.random(in: 1024...128 * 1024, using: &random),
                ackDelay: .milliseconds(Int.random(in: 1...60, using: &random)),
                maxRetainedBytes: Int.random(in: 24 * 1024...512 * 1024, using: &random))
        }
        sides = [SimulatedSide(continuity: Continuity(policy: policy(&random))), SimulatedSide(continuity: Continuity(policy: policy(&random)))]
        for side in 0..<2 {
            sides[side].file = Self.bytes(Int.random(in: 0...64 * 1024, using: &random), using: &random)
        }
        faultSteps = Int.random(in: 200...800, using: &random)
    }

    var summary: String { "\(failures) link failures, \(changes) transport changes, \(outages) outages, \(links.count) links" }

    mutating func run() throws {
        openLink()
        var step = 0
        while step < faultSteps + 200_000 {
            step += 1
            now += .milliseconds(Int64.random(in: 0...15, using: &random))
            let faults = step < faultSteps
            faulting = faults
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<3 where faults: failLink()
            case 3..<6 where faults: changeTransport()
            case 6 where faults: outage()
            case 7..<12 where faults: closeDrainedOldLinks()
            case 12..<30 where faults: produce(Int.random(in: 0..<2, using: &random))
            case 30..<60: write(Int.random(in: 0..<2, using: &random))
            default: deliver()
            }
            if !faults {
                if sides.contains(where: { $0.active == nil }) { openLink() }
                if isQuiet { break }
            }
        }
        #expect(isQuiet, "the pair did not settle: \(summary)")
    }

    /// Nothing left to write, in flight, or unacknowledged, and every source is spent.
    var isQuiet: Bool {
        sides.allSatisfy { side in
            side.scheduler.isEmpty && side.continuity.retainedCount == 0 && side.fileQueued
        } && links.allSatisfy { $0.inFlight[0].isEmpty && $0.inFlight[1].isEmpty }
            && sides.allSatisfy { $0.continuity.acknowledgmentDeadline == nil && !$0.continuity.acknowledgmentPending }
    }

    // MARK: Traffic

    /// `count` seeded bytes, eight from each draw.
    static func bytes(_ count: Int, using random: inout SeededGenerator) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var index = 0
        while index < count {
            var word = random.next()
            for _ in 0..<min(8, count - index) {
                bytes[index] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                index += 1
            }
        }
        return bytes
    }

    mutating func fastBytes(_ count: Int) -> [UInt8] { Self.bytes(count, using: &random) }

    /// The app of `side` sends something: a message, stream bytes, or the next piece of its file.
    mutating func produce(_ side: Int) {
        switch Int.random(in: 0..<3, using: &random) {
        case 0:
            let large = Int.random(in: 0..<10, using: &random) == 0
            let message = fastBytes(Int.random(in: 0...(large ? 40_000 : 3_000), using: &random))
            let id = sides[side].nextMessage
            sides[side].nextMessage += 1
            sides[side].messagesSent.append(message)
            var offset = 0
            repeat {
                let end = min(message.count, offset + Int.random(in: 1...WireFormat.maxFramePayload, using: &random))
                sides[side].scheduler.enqueue(
                    .message(id: id, flags: end < message.count ? [.more] : [], chunk: FramePayload(message[offset..<end])))
                offset = end
            } while offset < message.count
        case 1:
            let bytes = fastBytes(Int.random(in: 1...WireFormat.maxFramePayload, using: &random))
            sides[side].streamSent += bytes
            sides[side].scheduler.enqueue(.data(stream: 1, flags: [], payload: FramePayload(bytes)))
        default:
            produceFile(side)
        }
    }

    mutating func produceFile(_ side: Int) {
        guard !sides[side].fileQueued else { return }
        let file = sides[side].file
        let offset = sides[side].fileOffset
        let end = min(file.count, offset + Int.random(in: 1...WireFormat.maxFramePayload, using: &random))
        sides[side].fileOffset = end
        sides[side].fileQueued = end == file.count
        sides[side].scheduler.enqueue(.data(stream: 3, flags: end == file.count ? [.fin] : [], payload: FramePayload(file[offset..<end])))
    }

    /// `side` writes a record on its link, as a pair channel's active link does: an `ACK` if
    /// one is due (or owed and frames go now), then kept frames again, then new ones.
    mutating func write(_ side: Int) {
        if !faulting { produceFile(side) }
        guard let link = sides[side].active, links[link].open else { return }
        let limit = Int.random(in: 1...65_000, using: &random)
        var scheduler = sides[side].scheduler
        var frames = sides[side].continuity.nextFrames(from: &scheduler, limit: limit)
        sides[side].scheduler = scheduler
        if let through = sides[side].continuity.acknowledgment(at: now, piggyback: !frames.isEmpty) {
            frames.insert((.ack(receivedThrough: through), nil), at: 0)
        }
        guard !frames.isEmpty else { return }
        var record: [UInt8] = []
        for (frame, sequence) in frames { record += try! frame.encoded(sequence: sequence) }
        links[link].inFlight[side].append(record)
    }

    /// The oldest record in flight on a random open link, in a random direction, arrives.
    mutating func deliver() {
        let candidates = links.indices.flatMap { link in (0..<2).map { (link, $0) } }.filter { links[$0.0].open && !links[$0.0].inFlight[$0.1].isEmpty }
        guard let (link, from) = candidates.randomElement(using: &random) else { return }
        let record = links[link].inFlight[from].removeFirst()
        let to = 1 - from
        for (frame, sequence) in try! Frame.decodeRecord(record[...]) {
            if case .ack(let through) = frame {
                let known = sides[to].continuity.acknowledge(through: through)
                #expect(known, "an ACK for frames never sent")
                continue
            }
            guard let sequence else { continue }
            guard sides[to].continuity.receive(sequence, size: FrameScheduler.size(of: frame), at: now) == .accepted else { continue }
            take(frame, at: to)
        }
    }

    mutating func take(_ frame: Frame, at side: Int) {
        switch frame {
        case .message(let id, let flags, let chunk):
            sides[side].partial[id, default: []] += chunk.array
            if !flags.contains(.more) { sides[side].messagesReceived.append(sides[side].partial.removeValue(forKey: id)!) }
        case .data(1, _, let payload):
            sides[side].streamReceived += payload.array
        case .data(3, let flags, let payload):
            #expect(!sides[side].streamFinished, "bytes after the file's FIN")
            sides[side].fileReceived += payload.array
            if flags.contains(.fin) { sides[side].streamFinished = true }
        default:
            Issue.record("an unexpected frame: \(frame)")
        }
    }

    // MARK: Faults

    /// A new link starts carrying the pair (both sides write on it from now on).
    mutating func openLink() {
        links.append(SimulatedLink())
        for side in 0..<2 {
            sides[side].active = links.count - 1
            sides[side].continuity.linkStarted()
        }
    }

    /// The active link fails: what it had in flight is lost; the pair reconnects at once.
    mutating func failLink() {
        guard let link = sides[0].active else { return }
        failures += 1
        links[link].open = false
        links[link].inFlight = [[], []]
        openLink()
    }

    /// Make-before-break: a new link carries the pair, the old one still delivers what it has
    /// in flight (until it is closed later, or fails).
    mutating func changeTransport() {
        changes += 1
        openLink()
    }

    /// Every link fails and none comes for a while (seconds on the clock): the sides keep
    /// producing; then a new link.
    mutating func outage() {
        outages += 1
        for link in links.indices {
            links[link].open = false
            links[link].inFlight = [[], []]
        }
        for side in 0..<2 {
            sides[side].active = nil
            for _ in 0..<Int.random(in: 0...6, using: &random) { produce(side) }
        }
        now += .seconds(Int64.random(in: 1...20, using: &random))
        openLink()
    }

    /// Old links whose records all arrived close (drained).
    mutating func closeDrainedOldLinks() {
        for link in links.indices where link != sides[0].active && links[link].inFlight.allSatisfy(\.isEmpty) {
            links[link].open = false
        }
    }
}

