import ArgumentParser
import Foundation
import PeerLink

struct Receive: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Receive files from nearby peers.",
        discussion: """
            Joins every peer found on the service and waits for files. Each offer shows the \
            sender, the file name and size; on a terminal you are asked whether to accept it, \
            with --accept-all every offer is accepted. When standard input is not a terminal and \
            --accept-all is not given, every offer is declined (the sender is told to ask for \
            --accept-all) — so a script never receives files by accident.

            Files are written to a hidden temporary file in --dir (default: the current \
            directory), checked against the sender's SHA-256, then moved into place. An existing \
            file is never overwritten: the new one is saved as "NAME (1).EXT" (then (2), ...). \
            A damaged file is removed. A transfer that stops early keeps what arrived; when the \
            same sender offers the same file again, it resumes from there.

            Runs until SIGINT or SIGTERM, or until --count files were received. Peers are found and \
            joined on every transport (--transport, default auto: the LAN and Bluetooth).
            """)

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8 (default: this host's name).")
    var name: String = ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "peerlink"

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens.")
    var service: String = ServiceType.default.value

    @Option(help: "The directory to save files in.")
    var dir: String = "."

    @Flag(help: "Accept every offer without asking.")
    var acceptAll = false

    @Option(help: "Exit 0 after this many files were received and verified.")
    var count: Int?

    @OptionGroup var peer: PeerOptions

    @OptionGroup var transports: TransportOptions

    func validate() throws {
        do {
            _ = try DisplayName(name)
            _ = try ServiceType(service)
        } catch {
            throw error.usageError
        }
        if let count, count < 1 { throw ArgumentParser.ValidationError("--count must be 1 or more") }
        guard PosixFile.isDirectory(dir) else {
            throw ArgumentParser.ValidationError("--dir \(dir) is not an existing directory: create it first")
        }
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.receive")
        let node = try await transports.automaticNode(peer: peer, name: name, service: service, logger: logger)
        let session = node.session
        let receiver = FileReceiver(directory: dir)
        let console = ChatConsole(interactive: isatty(0) == 1 && isatty(1) == 1)
        let acceptEverything = acceptAll
        let limit = count
        console.status("Receiving as \(name) (id \(session.localPeer.fingerprint.grouped)) on \(session.configuration.serviceType.dnsSDType) into \(dir)\(acceptAll ? ", accepting every file" : "")")
        let received = Counter()
        // The signal wait cannot be cancelled; a stream of it can, so the run can also end by --count.
        let (signals, signalSink) = AsyncStream.makeStream(of: Int32.self)
        Task.detached { signalSink.yield(await waitForTerminationSignal()) }
        let outcome: Int32 = await withTaskGroup(of: Int32?.self) { group in
            group.addTask {
                await node.run()
                return nil
            }
            group.addTask {
                for await event in node.events {
                    switch event {
                    case .session(.peerStateChanged(let id, .connected, _)): console.status("* \(id.displayName) joined")
                    case .session(.peerStateChanged(let id, .notConnected, _)): console.status("* \(id.displayName) left")
                    case .session(.invitationReceived(let invitation, _, _)): try? await session.respond(to: invitation, accept: true)
                    case .session(.linkFailed(_, let reason)): console.warning("peerlink: \(reason)")
                    default: break
                    }
                }
                return nil
            }
            group.addTask {
                for await _ in signals { return 0 }
                return nil
            }
            group.addTask {
                let crowded = CrowdedSenders()
                // Discarding: a finished transfer leaves nothing in the group.
                await withDiscardingTaskGroup { transfers in
                    for await stream in session.incomingStreams {
                        guard stream.name == ResourceProtocol.streamName else {
                            stream.reset(reason: "this peer only receives files")
                            continue
                        }
                        transfers.addTask {
                            guard let incoming = try? await receiver.offer(on: stream) else { return }
                            let from = incoming.peer.displayName
                            let kept = incoming.alreadyReceived
                            let what = "\(incoming.name) (\(TransferProgressView.bytes(incoming.size))) from \(from)"
                                + (kept > 0 ? ", resuming at \(TransferProgressView.bytes(kept))" : "")
                            if !acceptEverything {
                                guard console.interactive else {
                                    console.warning("peerlink: declined \(what): pass --accept-all to accept files when not on a terminal")
                                    await incoming.decline(reason: "the receiver is not on a terminal and was started without --accept-all")
                                    return
                                }
                                guard await console.ask("\(from) (id \(incoming.peer.fingerprint.grouped)) sends \(what). Accept? [y/N]") else {
                                    await incoming.decline(reason: "declined by the user")
                                    return
                                }
                            }
                            let transfer = incoming.accept()
                            let view = TransferProgressView(bar: false, output: { console.status($0) })
                            // "receiving" once the offer is taken: one declined at once gets no line.
                            switch await view.follow(transfer, label: incoming.name, started: { console.status("receiving \(what)") }) {
                            case .success(.received(let path)):
                                console.event("saved \(path) (\(incoming.size) bytes from \(from), SHA-256 verified)")
                                received.add()
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
                return nil
            }
            if let limit {
                group.addTask {
                    // Ends the run once --count files are in (polled: transfers run in their own tasks).
                    while received.value < limit { try? await Task.sleep(for: .milliseconds(100)) }
                    return 0
                }
            }
            return await group.firstStatus(thenLeave: session)
        }
        if outcome != 0 { throw ExitCode(outcome) }
    }
}

/// A count shared between tasks.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0

    func add() { lock.withLock { count += 1 } }
    var value: Int { lock.withLock { count } }
}
