import Logging
import PeerLinkCore
import PeerLinkSession
import Testing

/// A log handler that keeps every entry, so tests can check what a link logged.
final class TestLog: Sendable {
    struct Entry: Sendable {
        var level: Logger.Level
        var message: String
        var metadata: Logger.Metadata
    }

    private let entries = Locked<[Entry]>([])

    var logger: Logger {
        Logger(label: "peerlink.test") { _ in Handler(log: self) }
    }

    var all: [Entry] { entries.withLock { $0 } }

    /// The last `count` entries, one line each (message, then metadata sorted by key): for a
    /// failing test to show what the sessions did.
    func transcript(last count: Int) -> String {
        all.suffix(count).map { entry in
            let metadata = entry.metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            return "\(entry.level) \(entry.message) \(metadata)"
        }.joined(separator: "\n")
    }

    /// The "link closed" entries of the link whose channel is `remote` and whose role is `role`.
    func closings(remote: String, role: String) -> [Entry] {
        all.filter {
            $0.message == "link closed" && $0.metadata["link.remote"] == "\(remote)" && $0.metadata["link.role"] == "\(role)"
        }
    }

    fileprivate func append(_ entry: Entry) {
        entries.withLock { $0.append(entry) }
    }

    private struct Handler: LogHandler {
        let log: TestLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 })
            log.append(Entry(level: event.level, message: event.message.description, metadata: merged))
        }
    }
}

enum LinkFixture {
    static let chat = try! ServiceType("chat")

    static func preface(_ encryption: EncryptionPreference = .optional) -> LinkPreface {
        try! LinkPreface(encryption: encryption, service: chat)
    }

    static func hello(_ name: String) -> Hello {
        Hello(displayName: try! DisplayName(name))
    }

    /// A link with the fixture's service, named `name`.
    static func link(
        _ channel: any LinkChannel,
        _ role: LinkStateMachine.Role,
        _ identity: Identity,
        name: String,
        encryption: EncryptionPreference = .optional,
        policy: LinkPolicy = .default,
        expecting: Identity? = nil,
        clock: any Clock<Duration> = ContinuousClock(),
        closeTimeout: Duration = .seconds(2),
        log: TestLog
    ) -> Link {
        Link(
            channel: channel, role: role, identity: identity, preface: preface(encryption), hello: hello(name),
            policy: policy, expectedRemote: expecting?.fingerprint, clock: clock, closeTimeout: closeTimeout, logger: log.logger)
    }

    /// Closes two running links at the same moment and waits for both runs to return; how long
    /// that took. A watchdog cancels the runs after `limit` (cancelling a run ends its wait for
    /// the peer), so a pair that waits for each other shows as a duration of `limit`.
    static func closeTogether(_ first: Link, _ second: Link, runs: [Task<Void, Never>], limit: Duration = .seconds(10)) async -> Duration {
        let watchdog = Task {
            try await Task.sleep(for: limit)
            for run in runs { run.cancel() }
        }
        let closedAt = ContinuousClock.now
        first.close()
        second.close()
        for run in runs { await run.value }
        watchdog.cancel()
        return closedAt.duration(to: .now)
    }

    /// A frame of the link itself (a datagram: reliable messages and stream frames belong to a
    /// peer's channel) carrying `index` in 4 bytes, big-endian.
    static func message(_ index: Int) -> Frame {
        let value = UInt32(index)
        return .datagram([24, 16, 8, 0].map { UInt8(truncatingIfNeeded: value >> $0) })
    }

    /// The index a ``message(_:)`` frame carries, or nil for another event.
    static func index(of event: Link.Event?) -> Int? {
        guard case .frame(.datagram(let bytes))? = event, bytes.count == 4 else { return nil }
        return Int(bytes.reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
    }
}

extension AsyncStream<Link.Event>.Iterator {
    /// The next `count` events (fewer if the stream ends).
    mutating func next(_ count: Int) async -> [Link.Event] {
        var events: [Link.Event] = []
        for _ in 0..<count {
            guard let event = await next() else { break }
            events.append(event)
        }
        return events
    }

    /// Events up to and including `.closed` (at most `limit`), skipping frames.
    mutating func closure(limit: Int = 10_000) async -> (code: GoAwayCode, reason: String, byPeer: Bool)? {
        for _ in 0..<limit {
            guard let event = await next() else { return nil }
            if case .closed(let code, let reason, let byPeer) = event { return (code, reason, byPeer) }
        }
        return nil
    }
}

/// A peer driven by hand: a state machine over a bare channel, for peers that misbehave.
struct RawPeer {
    var machine: LinkStateMachine
    let channel: any LinkChannel
    /// Frames and the closure that arrived, in order (sequenced ones with their numbers).
    var events: [LinkOutput] = []
    /// The number the next sequenced frame it sends gets.
    var nextSequence: UInt64 = 1

    init(_ channel: any LinkChannel, name: String, expecting: Identity?) {
        self.channel = channel
        machine = LinkStateMachine(
            role: .dialer, identity: .generate(), preface: LinkFixture.preface(), hello: LinkFixture.hello(name),
            expectedRemote: expecting?.fingerprint)
    }

    /// Runs the handshake to the end (at most 20 reads). True once established.
    mutating func handshake() async throws -> Bool {
        var outputs = machine.start(at: .zero)
        for _ in 0..<20 {
            if try await carryOut(outputs) { return true }
            let bytes = try await channel.read()
            if bytes.isEmpty { return false }
            outputs = machine.receive(bytes, at: .zero)
        }
        return false
    }

    /// Reads once and feeds the machine; false at the end of the stream.
    mutating func readOnce() async throws -> Bool {
        let bytes = try await channel.read()
        if bytes.isEmpty { return false }
        _ = try await carryOut(machine.receive(bytes, at: .zero))
        return true
    }

    /// Sends one frame (after the handshake).
    mutating func send(_ frame: Frame) async throws {
        var sequence: UInt64?
        if frame.type.isSequenced {
            sequence = nextSequence
            nextSequence += 1
        }
        _ = try await carryOut(try machine.send(frame, sequence: sequence, at: .zero))
    }

    /// The frames that arrived, sequenced or not, in order.
    var frames: [Frame] {
        events.compactMap { output in
            switch output {
            case .frame(let frame), .sequenced(let frame, _): frame
            default: nil
            }
        }
    }

    /// Writes the sends, keeps the events; true if `.established` was among them.
    private mutating func carryOut(_ outputs: [LinkOutput]) async throws -> Bool {
        var established = false
        for output in outputs {
            switch output {
            case .send(let bytes): try await channel.write(bytes)
            case .established: established = true
            default: events.append(output)
            }
        }
        return established
    }
}

/// Reads `channel` until its end of stream (what was written before is dropped): true when the
/// other side closed it within `bound`; false otherwise (the channel is closed then, which ends
/// the read).
func readsToTheEnd(_ channel: any LinkChannel, within bound: Duration) async -> Bool {
    let timedOut = Latch()
    let timer = Task {
        try? await Task.sleep(for: bound)
        timedOut.fire()
        channel.close()
    }
    defer { timer.cancel() }
    while true {
        guard let bytes = try? await channel.read(), !bytes.isEmpty else { return !timedOut.isFired }
    }
}
