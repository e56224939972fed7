import Foundation
import PeerLink

/// Files in `peerlink chat`: `/send PATH` to every connected peer, and files peers send, saved.
final class ChatFiles: @unchecked Sendable {
    private let lock = NSLock()
    private var active = 0

    /// Sends the file at `path` to every connected peer, in a task of its own: progress lines
    /// as status, then "* NAME verified by PEER" (or the failure) for each peer.
    func send(path: String, session: PeerSession, console: ChatConsole) {
        guard !path.isEmpty else {
            console.status("/send needs a path: /send PATH")
            return
        }
        lock.withLock { active += 1 }
        Task {
            defer { lock.withLock { active -= 1 } }
            let file: OutgoingFile
            do throws(TransferFailure) {
                file = try await OutgoingFile.prepare(path: path)
            } catch {
                console.warning("peerlink: \(error.message)")
                return
            }
            let peers = await session.connectedPeers()
            guard !peers.isEmpty else {
                console.status("nobody connected: \(file.name) not sent")
                return
            }
            console.status("sending \(file.name) (\(TransferProgressView.bytes(file.size))) to \(peers.map(\.displayName).sorted().joined(separator: ", "))")
            await withTaskGroup(of: Void.self) { group in
                for peer in peers {
                    group.addTask {
                        let transfer = session.sendFile(file, to: peer)
                        let view = TransferProgressView(bar: false, output: { console.status($0) })
                        switch await view.follow(transfer, label: "\(file.name) to \(peer.displayName)") {
                        case .success: console.event("* \(file.name) verified by \(peer.displayName)")
                        case .failure(let failure): console.warning("peerlink: \(file.name) to \(peer.displayName): \(failure.message)")
                        }
                    }
                }
            }
        }
    }

    /// Returns once no /send is in progress.
    func waitUntilDone() async {
        while lock.withLock({ active }) > 0 { try? await Task.sleep(for: .milliseconds(100)) }
    }

    /// Accepts every file a chat peer sends (they are members of the chat already) and saves it
    /// with `receiver`, printing where.
    static func receive(session: PeerSession, receiver: FileReceiver, console: ChatConsole) async {
        let crowded = CrowdedSenders()
        // Discarding: a finished transfer leaves nothing in the group.
        await withDiscardingTaskGroup { group in
            for await stream in session.incomingStreams {
                guard stream.name == ResourceProtocol.streamName else {
                    stream.reset(reason: "chat only takes file transfers on streams")
                    continue
                }
                group.addTask {
                    guard let incoming = try? await receiver.offer(on: stream) else { return }
                    let from = incoming.peer.displayName
                    let view = TransferProgressView(bar: false, output: { console.status($0) })
                    // "receiving" once the offer is taken (its first progress): an offer declined
                    // at once gets no line of its own.
                    let started = {
                        console.status("receiving \(incoming.name) (\(TransferProgressView.bytes(incoming.size))) from \(from)")
                    }
                    switch await view.follow(incoming.accept(), label: "\(incoming.name) from \(from)", started: started) {
                    case .success(.received(let path)):
                        console.event("* saved \(path) (from \(from), \(incoming.size) bytes, SHA-256 verified)")
                    case .success(.sent):
                        break
                    case .failure(let failure) where failure.kind == .declined:
                        crowded.tell(failure, from: incoming.peer, on: console)
                    case .failure(let failure):
                        console.warning("peerlink: \(incoming.name) from \(from): \(failure.message)")
                    }
                }
            }
        }
    }
}

/// Offers a receiver declined because their sender has as many files in transfer as it takes
/// (``FileReceiver/maxTransfersPerPeer``): one line per sender every 2 s, not one per offer (a
/// peer may offer hundreds).
final class CrowdedSenders: Sendable {
    private let recent = RecentFailures()

    func tell(_ failure: TransferFailure, from peer: PeerID, on console: ChatConsole) {
        guard recent.first(peer.fingerprint.value) else { return }
        console.warning("peerlink: \(failure.message); more offers of theirs declined in the next 2 s get no line")
    }
}
