import Foundation
import PeerLink
import PeerLinkTestSupport

/// Two sessions on two transports at once — the in-memory one and loopback TCP (ranked above
/// it) — told of each other by hand: they meet on the in-memory transport, ``offerTCP()`` makes
/// them find each other on TCP (they upgrade), ``takeTCPAway()`` closes the TCP listeners and
/// the link (they fail over back). `sender` sends files, `receiver` accepts every offer into its
/// directory. Each side's transport changes are recorded.
final class MovingPair: Sendable {
    let sender: PeerSession
    let receiver: PeerSession
    let received: AsyncStream<FileTransfer>
    private let network: MemoryNetwork
    private let tcp: [TCPTransportListener]
    private let memory: [any TransportListener]
    private let changes = Shared<[String]>([])
    private let left = Shared(false)
    private let tasks: Locked<[Task<Void, Never>]>

    init(directory: String) throws {
        let service = try ServiceType("moving-files")
        let network = MemoryNetwork()
        let tcp = [try TCPTransportListener(host: "127.0.0.1"), try TCPTransportListener(host: "127.0.0.1")]
        let memory: [any TransportListener] = [try network.listen(name: "sender"), try network.listen(name: "receiver")]
        (self.network, self.tcp, self.memory) = (network, tcp, memory)
        func session(_ name: String, _ index: Int) throws -> PeerSession {
            PeerSession(
                configuration: PeerSessionConfiguration(
                    identity: .generate(), displayName: try DisplayName(name), serviceType: service,
                    policy: SessionPolicy(automatic: true)),
                transports: [network.transport, TCPTransport()], listeners: [memory[index], tcp[index]])
        }
        sender = try session("sender", 0)
        receiver = try session("receiver", 1)
        let fileReceiver = FileReceiver(directory: directory)
        let (received, sink) = AsyncStream.makeStream(of: FileTransfer.self)
        self.received = received
        let (sender, receiver, changes, left) = (self.sender, self.receiver, self.changes, self.left)
        tasks = Locked([
            Task { await sender.run() },
            Task { await receiver.run() },
            Task {
                for await event in sender.events {
                    switch event {
                    case .peerTransportChanged(_, let transport, _): changes.update { $0.append(transport) }
                    case .peerStateChanged(_, .notConnected, _): left.update { $0 = true }
                    default: break
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
        tell(sender, about: receiver, at: memory[1].localEndpoints)
        tell(receiver, about: sender, at: memory[0].localEndpoints)
    }

    private func tell(_ session: PeerSession, about other: PeerSession, at endpoints: [Endpoint], updated: Bool = false) {
        let peer = DiscoveredPeer(id: other.localPeer, protocolVersion: 1, endpoints: endpoints, info: try! DiscoveryInfo())
        session.discovered(updated ? .updated(peer) : .found(peer))
    }

    /// The transports the sender reported the receiver on after the first, in order.
    var transportChanges: [String] { changes.value }
    /// Whether the receiver ever left the sender's session.
    var receiverLeft: Bool { left.value }

    /// The transport the sender's link to the receiver is on now.
    func currentTransport() async -> String? { await sender.info(for: receiver.localPeer)?.transport }

    /// Both find each other on TCP too (discovery's update): the pair upgrades.
    func offerTCP() {
        tell(sender, about: receiver, at: tcp[1].localEndpoints + memory[1].localEndpoints, updated: true)
        tell(receiver, about: sender, at: tcp[0].localEndpoints + memory[0].localEndpoints, updated: true)
    }

    /// TCP goes away under the pair: listeners closed, the active link's socket shut.
    func takeTCPAway() {
        for listener in tcp { listener.close() }
        sender.channel(for: receiver.localPeer)?.activeLink?.channel.close()
    }

    /// Waits (bounded) until the sender has the receiver connected on `transport`.
    func waitUntil(on transport: String, within limit: Duration = .seconds(20)) async throws {
        let deadline = ContinuousClock.now + limit
        while await currentTransport() != transport {
            guard ContinuousClock.now < deadline else {
                throw HarnessError("the pair was not on \(transport) within \(limit) (on \(await currentTransport() ?? "none"))")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    func close() async {
        await sender.disconnect()
        await receiver.disconnect()
        for listener in tcp { listener.close() }
        for listener in memory { listener.close() }
        for task in tasks.withLock({ $0 }) { task.cancel() }
    }
}
