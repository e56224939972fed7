import Foundation
import PeerLink

/// A TCP forwarder on 127.0.0.1: every connection to ``port`` is joined to `target`, byte for
/// byte both ways, until ``cut()`` closes every connection it carries (as a cable pulled, then
/// plugged back: new connections are forwarded again).
final class CuttableProxy: Sendable {
    let port: UInt16
    private let listener: TCPListener
    private let target: IPSocketAddress
    private let connections = Locked<[TCPConnection]>([])
    private let task = Locked<Task<Void, Never>?>(nil)
    /// Connections forwarded so far.
    let accepted = Locked(0)

    init(to targetPort: UInt16) throws {
        listener = try TCPListener(host: "127.0.0.1", port: 0)
        port = listener.port
        target = IPSocketAddress(host: "127.0.0.1", port: targetPort)!
        let accepting = Task { [self] in
            while !Task.isCancelled {
                guard let inbound = try? await listener.accept() else { return }
                guard let outbound = try? await TCPConnection.connect(to: target, timeout: .seconds(5)) else {
                    inbound.close()
                    continue
                }
                connections.withLock { $0 += [inbound, outbound] }
                accepted.withLock { $0 += 1 }
                for (from, to) in [(inbound, outbound), (outbound, inbound)] {
                    Task {
                        while let bytes = try? await from.read(), !bytes.isEmpty {
                            guard (try? await to.write(bytes)) != nil else { break }
                        }
                        from.close()
                        to.close()
                    }
                }
            }
        }
        task.withLock { $0 = accepting }
    }

    /// Closes every connection carried so far; the listener goes on accepting.
    func cut() {
        for connection in connections.withLock({ list in
            defer { list.removeAll() }
            return list
        }) { connection.close() }
    }

    func close() {
        task.withLock { $0 }?.cancel()
        listener.close()
        cut()
    }
}
