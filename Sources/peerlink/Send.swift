import ArgumentParser
import Foundation
import PeerLink

struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send files to a nearby peer; exits 0 once it verified every file.",
        discussion: """
            Waits (up to --timeout seconds) for the peer called NAME to appear on the service, joins \
            it, and sends the files one after the other. Each file is offered with its name, size \
            and SHA-256; the receiver checks the SHA-256 before it keeps the file. On a terminal a \
            progress bar shows rate and ETA; otherwise one progress line a second goes to standard \
            output. If the link drops, the transfer resumes where the receiver stopped once the \
            peer is back (within 60 s); sending the same file again later also resumes.

            Exit status: 0 when the receiver verified every file; 1 when a file was declined, \
            cancelled, damaged or not delivered; 64 for a bad argument or unreadable file; 69 when \
            no transport can run (avahi-daemon not running, no Bluetooth).

            The peer is looked for on every transport (--transport, default auto: the LAN and \
            Bluetooth) and reached on the best one it is found on (--prefer).
            """)

    @Argument(help: "The files to send.")
    var files: [String]

    @Option(parsing: .unconditional, help: "The display name of the peer to send to.")
    var to: String

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8 (default: this host's name).")
    var name: String = ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "peerlink"

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens.")
    var service: String = ServiceType.default.value

    @Option(help: "Seconds to wait for the peer to appear and connect.")
    var timeout: Double = 30

    @OptionGroup var peer: PeerOptions

    @OptionGroup var transports: TransportOptions

    func validate() throws {
        do {
            _ = try DisplayName(name)
            _ = try DisplayName(to)
            _ = try ServiceType(service)
        } catch {
            throw error.usageError
        }
        guard timeout > 0, timeout <= 86400 else {
            throw ArgumentParser.ValidationError("--timeout must be more than 0 and at most 86400 seconds")
        }
        guard !files.isEmpty else { throw ArgumentParser.ValidationError("name at least one file to send") }
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.send")
        // Hash every file first: a missing or unreadable file fails before anybody is bothered.
        var outgoing: [OutgoingFile] = []
        for path in files {
            do {
                outgoing.append(try await OutgoingFile.prepare(path: path))
            } catch {
                printError("peerlink: \(error.message)")
                throw ExitCode(ExitStatus.usage)
            }
        }
        let node = try await transports.automaticNode(peer: peer, name: name, service: service, logger: logger)
        let session = node.session
        let prepared = outgoing
        let target = to
        let waitLimit = Duration.milliseconds(Int(timeout * 1000))
        let interactive = isatty(1) == 1
        let status: Int32 = await withTaskGroup(of: Int32?.self) { group in
            group.addTask {
                await node.run()
                return nil
            }
            let found = PeerWaiter()
            group.addTask {
                for await event in node.events {
                    switch event {
                    case .session(.peerStateChanged(let id, .connected, _)) where id.displayName == target:
                        found.connected(id)
                    case .session(.invitationReceived(let invitation, let from, _)):
                        try? await session.respond(to: invitation, accept: from.displayName == target)
                    case .session(.linkFailed(_, let reason)):
                        printError("peerlink: \(reason)")
                    default:
                        break
                    }
                }
                return nil
            }
            group.addTask {
                printError("peerlink: waiting for \(target) on \(session.configuration.serviceType.dnsSDType) (up to \(Int(timeout)) s)")
                guard let receiver = await found.wait(limit: waitLimit) else {
                    printError("peerlink: \(target) did not appear within \(Int(timeout)) s: check that `peerlink receive --name \(target)` runs on the same network and service (--service), or raise --timeout")
                    return ExitStatus.failure
                }
                printError("peerlink: connected to \(target) (id \(receiver.fingerprint.grouped))")
                var failures = 0
                let view = TransferProgressView(bar: interactive, output: { printLine($0) })
                for file in prepared {
                    let transfer = session.sendFile(file, to: receiver)
                    switch await view.follow(transfer, label: file.name) {
                    case .success:
                        printLine("\(file.name): verified by \(target) (\(file.size) bytes, SHA-256 \(file.sha256.prefix(8).map { String(format: "%02x", $0) }.joined())…)")
                    case .failure(let failure):
                        failures += 1
                        printError("peerlink: \(file.name): \(failure.message)")
                    }
                }
                return failures == 0 ? 0 : ExitStatus.failure
            }
            return await group.firstStatus(thenLeave: session)
        }
        if status != 0 { throw ExitCode(status) }
    }
}

/// The first connected peer of a name, set by the event loop, polled by the sender.
final class PeerWaiter: @unchecked Sendable {
    private let lock = NSLock()
    private var peer: PeerID?

    func connected(_ id: PeerID) {
        lock.withLock { if peer == nil { peer = id } }
    }

    /// The peer, or nil when none connected within `limit`.
    func wait(limit: Duration) async -> PeerID? {
        let clock = ContinuousClock()
        let deadline = clock.now + limit
        while clock.now < deadline {
            if let peer = lock.withLock({ peer }) { return peer }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return lock.withLock { peer }
    }
}
