import PeerLinkCore
import Testing

/// SplitMix64: a tiny seeded generator, so every random test of this target is reproducible.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &self) }
    }
}

/// How a byte stream is cut before it is fed to a decoder.
enum Granularity: Sendable, CustomTestStringConvertible {
    /// Every write arrives as one piece.
    case whole
    /// One byte at a time.
    case bytes
    /// Each write cut at random points (seeded).
    case random(seed: UInt64)

    var testDescription: String {
        switch self {
        case .whole: "whole"
        case .bytes: "byte by byte"
        case .random(let seed): "random cuts (seed \(seed))"
        }
    }

    static let all: [Granularity] = [.whole, .bytes, .random(seed: 1), .random(seed: 2), .random(seed: 3)]
}

enum Splits {
    /// `bytes` cut at the given offsets (sorted, deduplicated, inside the bytes).
    static func cut(_ bytes: [UInt8], at offsets: [Int]) -> [ArraySlice<UInt8>] {
        var pieces: [ArraySlice<UInt8>] = []
        var start = 0
        for offset in Set(offsets).sorted() where offset > 0 && offset < bytes.count {
            pieces.append(bytes[start..<offset])
            start = offset
        }
        pieces.append(bytes[start...])
        return pieces
    }

    /// The ways the decoder tests feed a stream: whole, byte by byte, at 50 random cut points at
    /// once, and split in two at each of 50 random points.
    static func replays(of bytes: [UInt8], seed: UInt64 = 0x5EED) -> [(name: String, pieces: [ArraySlice<UInt8>])] {
        var generator = SeededGenerator(seed: seed)
        var replays: [(String, [ArraySlice<UInt8>])] = [
            ("whole", [bytes[...]]),
            ("byte by byte", bytes.indices.map { bytes[$0..<$0 + 1] }),
        ]
        guard bytes.count > 1 else { return replays }
        let points = (0..<50).map { _ in Int.random(in: 1..<bytes.count, using: &generator) }
        replays.append(("50 random cut points", cut(bytes, at: points)))
        for point in points {
            replays.append(("split at \(point)", cut(bytes, at: [point])))
        }
        return replays
    }
}

enum WireFixture {
    static let chat = try! ServiceType("chat")

    static func preface(_ encryption: EncryptionPreference = .optional, versions: [UInt8] = WireFormat.supportedVersions, service: ServiceType = chat)
        -> LinkPreface
    {
        try! LinkPreface(versions: versions, encryption: encryption, service: service)
    }

    static func hello(_ name: String, session: SessionID? = nil) -> Hello {
        Hello(displayName: try! DisplayName(name), session: session)
    }

    static let session = SessionID(bytes: (1...16).map { UInt8($0) })!

    /// The frame header and payload exactly as given, with no check: for hostile input.
    /// A frame's bytes as written by hand: the 12-byte header, the sequence number when given
    /// (sequenced types carry one: DATA 0, WINDOW_UPDATE 1, MESSAGE 5), then the payload.
    static func rawFrame(
        version: UInt8 = WireFormat.version, type: UInt8, flags: UInt16 = 0, stream: UInt32 = 0, length: UInt32? = nil,
        sequence: UInt64? = nil, payload: [UInt8] = []
    ) -> [UInt8] {
        var bytes: [UInt8] = [version, type, UInt8(flags >> 8), UInt8(flags & 0xFF)]
        for value in [stream, length ?? UInt32(payload.count)] {
            bytes += [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
        }
        if let sequence { bytes += (0..<8).reversed().map { UInt8(truncatingIfNeeded: sequence >> (8 * UInt64($0))) } }
        return bytes + payload
    }

    static func record(_ body: [UInt8]) -> [UInt8] { Record.framed(body) }
}

extension Array where Element == UInt8 {
    /// Whether `needle` occurs as a contiguous run.
    func containsRun(_ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, needle.count <= count else { return needle.isEmpty }
        for start in 0...(count - needle.count) where self[start] == needle[0] {
            if Array(self[start..<start + needle.count]) == needle { return true }
        }
        return false
    }
}

extension [LinkOutput] {
    /// All bytes sent, joined.
    var sentBytes: [UInt8] {
        flatMap { output -> [UInt8] in
            if case .send(let bytes) = output { return bytes }
            return []
        }
    }

    /// Everything but the sends.
    var events: [LinkOutput] {
        filter {
            if case .send = $0 { return false }
            return true
        }
    }

    var closure: (code: GoAwayCode, reason: String, byPeer: Bool)? {
        for output in self {
            if case .closed(let code, let reason, let byPeer) = output { return (code, reason, byPeer) }
        }
        return nil
    }
}

/// Two link state machines wired back to back: what one sends, the other receives, cut as the
/// granularity says. A side that closes has its last bytes delivered, then an end of stream.
struct LinkPair {
    /// What the dialer expects the listener's fingerprint to be.
    enum Expectation {
        /// The listener's real fingerprint, as discovery would report it.
        case theListener
        /// Nothing: any peer will do.
        case anyone
        case fingerprint(Fingerprint)
    }

    var dialer: LinkStateMachine
    var listener: LinkStateMachine
    /// Everything but sends, per side, in order.
    var dialerEvents: [LinkOutput] = []
    var listenerEvents: [LinkOutput] = []
    /// The last sequence number each side gave a sequenced frame.
    var dialerSequence: UInt64 = 0
    var listenerSequence: UInt64 = 0
    /// Every byte each side ever sent.
    var dialerWire: [UInt8] = []
    var listenerWire: [UInt8] = []
    var now: Duration = .zero
    /// Deliver an end of stream to the peer of a side that closed.
    var deliversEnd = true

    private var toListener: [UInt8] = []
    private var toDialer: [UInt8] = []
    private var dialerClosed = false
    private var listenerClosed = false
    private var endSentToListener = false
    private var endSentToDialer = false
    private let granularity: Granularity
    private var generator: SeededGenerator

    let dialerIdentity: Identity
    let listenerIdentity: Identity

    init(
        dialer dialerPreface: LinkPreface = WireFixture.preface(),
        listener listenerPreface: LinkPreface = WireFixture.preface(),
        dialerHello: Hello = WireFixture.hello("Ana"),
        listenerHello: Hello = WireFixture.hello("Bo", session: WireFixture.session),
        dialerIdentity: Identity = .generate(),
        listenerIdentity: Identity = .generate(),
        dialerExpects: Expectation = .theListener,
        listenerExpects: Fingerprint? = nil,
        policy: LinkPolicy = .default,
        granularity: Granularity = .whole
    ) {
        self.dialerIdentity = dialerIdentity
        self.listenerIdentity = listenerIdentity
        let expectedByDialer: Fingerprint? =
            switch dialerExpects {
            case .theListener: listenerIdentity.fingerprint
            case .anyone: nil
            case .fingerprint(let fingerprint): fingerprint
            }
        dialer = LinkStateMachine(
            role: .dialer, identity: dialerIdentity, preface: dialerPreface, hello: dialerHello, policy: policy,
            expectedRemote: expectedByDialer)
        listener = LinkStateMachine(
            role: .listener, identity: listenerIdentity, preface: listenerPreface, hello: listenerHello, policy: policy,
            expectedRemote: listenerExpects)
        self.granularity = granularity
        let seed: UInt64 =
            switch granularity {
            case .random(let seed): seed
            default: 0
            }
        generator = SeededGenerator(seed: seed)
    }

    var dialerPeer: PeerID { dialer.localPeer }
    var listenerPeer: PeerID { listener.localPeer }

    /// Both sides start at `now` and talk until neither has anything left to say.
    mutating func connect() {
        absorbDialer(dialer.start(at: now))
        absorbListener(listener.start(at: now))
        pump()
    }

    mutating func absorbDialer(_ outputs: [LinkOutput]) {
        for output in outputs {
            switch output {
            case .send(let bytes):
                toListener += bytes
                dialerWire += bytes
            case .closed:
                dialerClosed = true
                dialerEvents.append(output)
            default:
                dialerEvents.append(output)
            }
        }
    }

    mutating func absorbListener(_ outputs: [LinkOutput]) {
        for output in outputs {
            switch output {
            case .send(let bytes):
                toDialer += bytes
                listenerWire += bytes
            case .closed:
                listenerClosed = true
                listenerEvents.append(output)
            default:
                listenerEvents.append(output)
            }
        }
    }

    /// Delivers everything in flight, both ways, until it is quiet.
    mutating func pump() {
        for _ in 0..<100_000 {
            if !toListener.isEmpty {
                let bytes = toListener
                toListener = []
                for piece in pieces(bytes) { absorbListener(listener.receive(piece, at: now)) }
            } else if !toDialer.isEmpty {
                let bytes = toDialer
                toDialer = []
                for piece in pieces(bytes) { absorbDialer(dialer.receive(piece, at: now)) }
            } else if deliversEnd, dialerClosed, !endSentToListener {
                endSentToListener = true
                absorbListener(listener.receiveEnd(at: now))
            } else if deliversEnd, listenerClosed, !endSentToDialer {
                endSentToDialer = true
                absorbDialer(dialer.receiveEnd(at: now))
            } else {
                return
            }
        }
        Issue.record("the link pair never went quiet")
    }

    /// Both sides' timers fire at `time`, then what they sent is delivered.
    mutating func tick(at time: Duration) {
        now = time
        absorbDialer(dialer.tick(at: time))
        absorbListener(listener.tick(at: time))
        pump()
    }

    /// Sends `frame` from the dialer; a sequenced frame gets the dialer's next number (1, 2, …).
    mutating func dialerSends(_ frame: Frame) throws {
        var sequence: UInt64?
        if frame.type.isSequenced {
            dialerSequence += 1
            sequence = dialerSequence
        }
        absorbDialer(try dialer.send(frame, sequence: sequence, at: now))
        pump()
    }

    mutating func listenerSends(_ frame: Frame) throws {
        var sequence: UInt64?
        if frame.type.isSequenced {
            listenerSequence += 1
            sequence = listenerSequence
        }
        absorbListener(try listener.send(frame, sequence: sequence, at: now))
        pump()
    }

    /// What the other side reports for `frames` sent in order by one side from its first
    /// sequenced frame on: sequenced frames numbered 1, 2, …, the others as they are.
    static func arrivals(_ frames: [Frame], numberedFrom first: UInt64 = 1) -> [LinkOutput] {
        var next = first
        return frames.map { frame in
            guard frame.type.isSequenced else { return .frame(frame) }
            defer { next += 1 }
            return .sequenced(frame, sequence: next)
        }
    }

    private mutating func pieces(_ bytes: [UInt8]) -> [ArraySlice<UInt8>] {
        switch granularity {
        case .whole:
            return [bytes[...]]
        case .bytes:
            return bytes.indices.map { bytes[$0..<$0 + 1] }
        case .random:
            guard bytes.count > 1 else { return [bytes[...]] }
            let count = Int.random(in: 0...min(8, bytes.count - 1), using: &generator)
            let points = (0..<count).map { _ in Int.random(in: 1..<bytes.count, using: &generator) }
            return Splits.cut(bytes, at: points)
        }
    }
}
