import Foundation
import PeerLink
import Testing

/// Two sessions over loopback TCP, told of each other by hand (no avahi-daemon needed),
/// encrypted as by default: `sender` sends files, `receiver` accepts every offer into its
/// directory. Every message each side receives is recorded with the time it arrived, and the
/// receiver answers each message that starts with `ping ` with the same text starting `pong `.
final class DirectPair: Sendable {
    let sender: PeerSession
    let receiver: PeerSession
    let fileReceiver: FileReceiver
    /// The receiver's transfers, one per accepted offer.
    let received: AsyncStream<FileTransfer>
    /// Messages the sender received, in order.
    let atSender = Inbox()
    /// Messages the receiver received, in order.
    let atReceiver = Inbox()
    private let listeners: [TCPTransportListener]
    private let tasks: Locked<[Task<Void, Never>]>

    init(directory: String) throws {
        let service = try ServiceType("direct-files")
        let senderListener = try TCPTransportListener(host: "127.0.0.1")
        let receiverListener = try TCPTransportListener(host: "127.0.0.1")
        listeners = [senderListener, receiverListener]
        sender = PeerSession(
            configuration: PeerSessionConfiguration(
                identity: .generate(), displayName: try DisplayName("sender"), serviceType: service,
                policy: SessionPolicy(automatic: true)),
            transport: TCPTransport(), listener: senderListener)
        receiver = PeerSession(
            configuration: PeerSessionConfiguration(
                identity: .generate(), displayName: try DisplayName("receiver"), serviceType: service,
                policy: SessionPolicy(automatic: true)),
            transport: TCPTransport(), listener: receiverListener)
        fileReceiver = FileReceiver(directory: directory)
        let (received, sink) = AsyncStream.makeStream(of: FileTransfer.self)
        self.received = received
        let (sender, receiver, fileReceiver) = (self.sender, self.receiver, self.fileReceiver)
        let (atSender, atReceiver) = (self.atSender, self.atReceiver)
        tasks = Locked([
            Task { await sender.run() },
            Task { await receiver.run() },
            Task { for await event in sender.events { atSender.record(event) } },
            Task {
                for await event in receiver.events {
                    atReceiver.record(event)
                    if case .message(let peer, let data, true) = event, data.starts(with: Array("ping ".utf8)) {
                        try? await receiver.send(Array("pong ".utf8) + data.dropFirst(5), to: [peer])
                    }
                }
            },
            Task {
                for await stream in receiver.incomingStreams {
                    Task {
                        guard let incoming = try? await fileReceiver.offer(on: stream) else { return }
                        sink.yield(incoming.accept())
                    }
                }
            },
        ])
        sender.discovered(.found(DiscoveredPeer(
            id: receiver.localPeer, protocolVersion: 1, endpoints: receiverListener.localEndpoints, info: try DiscoveryInfo())))
        receiver.discovered(.found(DiscoveredPeer(
            id: sender.localPeer, protocolVersion: 1, endpoints: senderListener.localEndpoints, info: try DiscoveryInfo())))
    }

    /// Waits until each side has the other connected.
    func waitConnected(timeout: Duration = .seconds(30)) async throws {
        let deadline = ContinuousClock.now + timeout
        while !(atSender.isConnected(receiver.localPeer) && atReceiver.isConnected(sender.localPeer)) {
            guard ContinuousClock.now < deadline else {
                throw HarnessError("the sessions did not connect within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Leaves both sessions, closes the listeners and ends the tasks.
    func close() async {
        await sender.disconnect()
        await receiver.disconnect()
        for listener in listeners { listener.close() }
        for task in tasks.withLock({ $0 }) { task.cancel() }
    }
}

/// What one session received: its reliable messages in order, with arrival times, and which
/// peers it has connected.
final class Inbox: Sendable {
    struct Message: Sendable {
        var text: String
        var time: ContinuousClock.Instant
    }

    private struct State {
        var messages: [Message] = []
        var connected: Set<PeerID> = []
    }

    private let state = Locked(State())

    func record(_ event: PeerSessionEvent) {
        state.withLock { state in
            switch event {
            case .message(_, let data, true):
                state.messages.append(Message(text: String(decoding: data, as: UTF8.self), time: .now))
            case .peerStateChanged(let peer, let peerState, _):
                if peerState == .connected { state.connected.insert(peer) } else { state.connected.remove(peer) }
            default:
                break
            }
        }
    }

    func isConnected(_ peer: PeerID) -> Bool { state.withLock { $0.connected.contains(peer) } }

    /// The messages that start with `prefix`, in the order they arrived.
    func messages(prefixed prefix: String) -> [Message] {
        state.withLock { $0.messages.filter { $0.text.hasPrefix(prefix) } }
    }

    /// Waits until `count` messages starting with `prefix` arrived.
    func wait(for count: Int, prefixed prefix: String, timeout: Duration = .seconds(30)) async throws {
        let deadline = ContinuousClock.now + timeout
        while messages(prefixed: prefix).count < count {
            guard ContinuousClock.now < deadline else {
                throw HarnessError("\(messages(prefixed: prefix).count) of \(count) \"\(prefix)\" messages arrived within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// The resident set size of this process, from `/proc/self/status` (`VmRSS`), in bytes.
func residentBytes() -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kibibytes = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap({ Int($0) })
    else { return nil }
    return kibibytes * 1024
}

/// A value shared between tasks.
final class Shared<Value: Sendable>: Sendable {
    private let lock: Locked<Value>

    init(_ value: Value) { lock = Locked(value) }

    var value: Value { lock.withLock { $0 } }

    func update(_ body: (inout Value) -> Void) { lock.withLock { body(&$0) } }
}

extension FileTransfer {
    /// The transfer's result; when it has not ended within `bound`, records an issue and
    /// cancels it, so a hang fails the test instead of stalling the run.
    func result(within bound: Duration, sourceLocation: SourceLocation = #_sourceLocation) async -> Result<TransferOutcome, TransferFailure> {
        let watchdog = Task {
            try await Task.sleep(for: bound)
            Issue.record("the \(direction) transfer of \(name) did not end within \(bound)", sourceLocation: sourceLocation)
            cancel(reason: "the test stopped waiting for it")
        }
        defer { watchdog.cancel() }
        return await result()
    }
}
