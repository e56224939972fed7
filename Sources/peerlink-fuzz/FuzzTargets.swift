import Foundation
import PeerLinkBluetooth
import PeerLinkCore

/// One fuzz target: a decoder (or a state machine) that reads bytes from the network or from
/// disk, fed arbitrary bytes. It must never trap, hang or grow without bound; where a decoder
/// can re-encode what it read, the target also checks that the round trip agrees — a failed
/// check is a crash (`preconditionFailure`), which libFuzzer records with its input.
struct FuzzTarget: Sendable {
    let name: String
    let summary: String
    let run: @Sendable ([UInt8]) -> Void
    /// Real encodings to start the corpus from.
    let seeds: @Sendable () -> [[UInt8]]
}

/// Fails the run (libFuzzer keeps the input as a crash) when a property does not hold.
func check(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
    if !condition() { preconditionFailure("fuzz check failed: \(message())") }
}

/// Bytes taken from the front of a fuzz input, for targets that need numbers as well as data.
struct FuzzInput {
    private var bytes: ArraySlice<UInt8>

    init(_ bytes: [UInt8]) { self.bytes = bytes[...] }

    var rest: [UInt8] { Array(bytes) }
    var isEmpty: Bool { bytes.isEmpty }

    mutating func byte() -> UInt8 {
        guard let first = bytes.first else { return 0 }
        bytes = bytes.dropFirst()
        return first
    }

    mutating func take(_ count: Int) -> [UInt8] {
        let taken = Array(bytes.prefix(count))
        bytes = bytes.dropFirst(taken.count)
        return taken
    }

    /// `data` cut at points a generator seeded with `seed` chooses (pieces of 1 to 64 bytes):
    /// the same cuts for the same input, every time.
    static func cut(_ data: [UInt8], seed: UInt8) -> [[UInt8]] {
        var state = UInt64(seed) &* 0x9E37_79B9_7F4A_7C15 | 1
        var pieces: [[UInt8]] = []
        var index = 0
        while index < data.count {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let size = Int(state >> 58) + 1
            pieces.append(Array(data[index..<min(data.count, index + size)]))
            index += size
        }
        return pieces
    }

    /// The input cut into pieces whose sizes the input's own bytes choose (1 to 256): a size
    /// byte, then that many bytes, and so on.
    mutating func pieces() -> [[UInt8]] {
        var pieces: [[UInt8]] = []
        while !bytes.isEmpty {
            let size = Int(byte()) + 1
            pieces.append(take(size))
        }
        return pieces
    }
}

enum Fixtures {
    /// `frame`'s bytes, numbered `sequence` when its type is sequenced (link protocol 2).
    static func encoded(_ frame: Frame, sequence: UInt64 = 1) -> [UInt8] {
        try! frame.encoded(sequence: frame.type.isSequenced ? sequence : nil)
    }

    static let service = try! ServiceType("chat")
    static let preface = try! LinkPreface(encryption: .optional, service: service)
    static let plainPreface = try! LinkPreface(encryption: .none, service: service)
    static let hello = Hello(displayName: try! DisplayName("fuzz"), session: SessionID(bytes: [UInt8](repeating: 7, count: 16)))
    static let identity = Identity(privateKey: try! .init(rawRepresentation: [UInt8](repeating: 0x42, count: 32)))
    static let peer = PeerID(fingerprint: Identity.generate().fingerprint, displayName: "peer")

    /// A listener and a dialer link without encryption, established with each other: the
    /// listener's state after the handshake, reused (copied) for every input.
    static let establishedListener: LinkStateMachine = {
        var dialer = LinkStateMachine(role: .dialer, identity: .generate(), preface: plainPreface, hello: hello)
        var listener = LinkStateMachine(role: .listener, identity: identity, preface: plainPreface, hello: hello)
        var toListener = sent(dialer.start(at: .zero))
        var toDialer = sent(listener.start(at: .zero))
        for _ in 0..<10 where listener.state != .established || dialer.state != .established {
            let forDialer = toDialer
            toDialer = sent(listener.receive(toListener, at: .zero))
            toListener = sent(dialer.receive(forDialer, at: .zero))
        }
        precondition(listener.state == .established, "the fixture's handshake did not complete")
        return listener
    }()

    static func sent(_ outputs: [LinkOutput]) -> [UInt8] {
        outputs.reduce(into: []) { bytes, output in if case .send(let sent) = output { bytes += sent } }
    }

    static let sampleFrames: [Frame] = [
        .ping(flags: .syn, opaque: 42), .goAway(code: .sessionFull, reason: "eight is enough"),
        .message(id: 1, flags: .more, chunk: FramePayload("hello".utf8)), .datagram(Array("dgram".utf8)),
        .control(.invite(invitation: 7, session: SessionID(bytes: [UInt8](repeating: 1, count: 16))!, timeoutMilliseconds: 30000, context: [1, 2])),
        .control(.accept(invitation: 7)), .control(.decline(invitation: 7, reason: .sessionFull)),
        .control(.members(session: SessionID(bytes: [UInt8](repeating: 1, count: 16))!, members: [ControlMessage.Member(fingerprint: peer.fingerprint, displayName: try! DisplayName("peer"))])),
        .control(.join(session: SessionID(bytes: [UInt8](repeating: 1, count: 16))!)),
        .control(.leave(session: SessionID(bytes: [UInt8](repeating: 1, count: 16))!)),
        .data(stream: 1, flags: .syn, payload: FramePayload("photo.jpg".utf8)), .data(stream: 1, flags: [], payload: [1, 2, 3]),
        .data(stream: 1, flags: .rst, payload: FramePayload("gone".utf8)), .windowUpdate(stream: 1, flags: .ack, credit: 65536),
    ]
}
