import ArgumentParser
import Foundation
import PeerLink
import Synchronization

struct Chat: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Chat with nearby peers.",
        discussion: """
            By default every peer found with the same service type joins without prompts (--auto). \
            With --invite NAME, this peer invites the peer called NAME; invitations from others are \
            asked about on a terminal, or accepted with --accept-all.

            With --refuse-unknown, only peers already in the known-peers file (next to the identity: \
            peers met before) are admitted; any other is refused right after its handshake, and both \
            sides print why. Meet a peer once without the flag to trust it.

            Typed lines go to every connected peer. Commands: /peers lists the peers with transport, \
            id and verification code; /send PATH sends a file to every connected peer (progress \
            lines while chat goes on, then "* NAME verified by PEER"); /quit leaves. Files peers \
            send are saved into --dir (default: the current directory; an existing file is never \
            overwritten: "NAME (1).EXT") and "* saved PATH (from PEER, ...)" says where.

            When standard input or output is not a terminal, chat is scriptable: one line in is one \
            message (lines read before anybody is connected wait for the first peer, up to --wait \
            seconds), each message received is printed as "NAME: TEXT", joins and leaves as \
            "* NAME joined" and "* NAME left"; at the end of input it sends what it read and exits 0.
            """)

    @Option(parsing: .unconditional, help: "The display name others see: 1 to 63 bytes of UTF-8.")
    var name: String

    @Option(parsing: .unconditional, help: "The service type: 1-15 lowercase letters, digits or hyphens.")
    var service: String = ServiceType.default.value

    @Option(parsing: .unconditional, help: "Invite the peer with this display name (instead of --auto).")
    var invite: String?

    @Flag(help: "Join every peer found, without prompts (the default).")
    var auto = false

    @Flag(help: "Accept every invitation without asking.")
    var acceptAll = false

    @Option(help: "Encryption: required (the default), optional (encrypts unless the other side refuses) or none.")
    var encryption: String = "required"

    @Flag(help: "Admit only peers met before (in the known-peers file); refuse every other peer.")
    var refuseUnknown = false

    @Option(help: "The directory files sent with /send by peers are saved in.")
    var dir: String = "."

    @Option(help: "Seconds to wait for a first peer when reading from a script before giving up.")
    var wait: Double = 30

    @OptionGroup var peer: PeerOptions

    @OptionGroup var links: ChatLinkOptions

    func validate() throws {
        do {
            _ = try DisplayName(name)
            _ = try ServiceType(service)
            if let invite { _ = try DisplayName(invite) }
        } catch {
            throw error.usageError
        }
        if invite != nil && auto {
            throw ArgumentParser.ValidationError("--invite and --auto exclude each other: pick one")
        }
        guard Self.preference(encryption) != nil else {
            throw ArgumentParser.ValidationError("--encryption must be none, optional or required, not '\(encryption)'")
        }
        guard PosixFile.isDirectory(dir) else {
            throw ArgumentParser.ValidationError("--dir \(dir) is not an existing directory: create it first")
        }
        guard wait > 0, wait <= 3600 else {
            throw ArgumentParser.ValidationError("--wait must be more than 0 and at most 3600 seconds")
        }
    }

    static func preference(_ text: String) -> EncryptionPreference? {
        switch text {
        case "none": return EncryptionPreference.none
        case "optional": return .optional
        case "required": return .required
        default: return nil
        }
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.chat")
        let interactive = isatty(0) == 1 && isatty(1) == 1
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let identityPath = peer.identity ?? IdentityStore.defaultPath()
        let knownPath = KnownPeersStore.defaultPath(identityPath: identityPath)
        let console = ChatConsole(interactive: interactive)
        let node: ChatNode
        let known: SharedKnownPeers
        do {
            let identity = try peer.loadIdentity()
            let shared = SharedKnownPeers(try KnownPeersStore.load(at: knownPath))
            known = shared
            var admit: (@Sendable (PeerID) -> Bool)?
            if refuseUnknown { admit = { candidate in shared.isKnown(candidate) } }
            var configuration = PeerSessionConfiguration(
                identity: identity, displayName: displayName, serviceType: serviceType,
                encryption: Self.preference(encryption) ?? .required,
                policy: SessionPolicy(automatic: invite == nil),
                // a Bluetooth page alone may take 5.12 s
                dialTimeout: links.wantsBluetooth ? .seconds(20) : .seconds(5), admit: admit)
            // Resource limits (issue 11): link caps this process's descriptors can hold.
            configuration.limits = configuration.limits.fitted(toDescriptorLimit: DescriptorLimit.current()?.soft ?? 1024)
            node = try ChatNode.make(configuration: configuration, links: links, console: console, logger: logger)
        } catch {
            throw fail(error)
        }
        let session = node.session
        console.status("Chatting as \(displayName) (id \(session.localPeer.fingerprint.grouped)) on \(serviceType.dnsSDType)\(invite.map { ", inviting \($0)" } ?? ", joining every peer found"). /peers lists peers, /quit leaves.")
        if refuseUnknown {
            let count = known.withLock { $0.entries.count }
            console.status("Admitting only the \(count) known peer\(count == 1 ? "" : "s") in \(knownPath); others are refused.")
        }

        let inviteName = invite
        let acceptEverything = acceptAll
        let waitLimit = Duration.milliseconds(Int(wait * 1000))
        let receiver = FileReceiver(directory: dir)
        let files = ChatFiles()

        let outcome: Int32 = await withTaskGroup(of: Int32?.self) { group in
            group.addTask {
                await node.run()
                return nil
            }
            // Events: joins, leaves, messages, invitations.
            group.addTask {
                var present: Set<PeerID> = []
                for await event in session.events {
                    switch event {
                    case .peerStateChanged(let id, .connected, _):
                        guard present.insert(id).inserted else { break }
                        // Resource limits (issue 11): the list is capped, and saved only when it changed.
                        let (meeting, snapshot) = known.withLock { known in
                            (known.record(id, at: Date().timeIntervalSince1970, limit: session.configuration.limits.maximumKnownPeers), known)
                        }
                        if meeting.changed { try? KnownPeersStore.save(snapshot, at: knownPath) }
                        let verdict = meeting.verdict
                        let code = await session.info(for: id)?.verificationCode
                        console.event("* \(id.displayName) joined")
                        switch verdict {
                        case .known:
                            break
                        case .new:
                            console.status("  new peer \(id.displayName): id \(id.fingerprint.grouped)\(code.map { ", verification code \($0)" } ?? "")")
                        case .nameConflict(let others):
                            console.warning("WARNING: \(id.displayName) arrived with a key you have not seen before (id \(id.fingerprint.grouped)); the \(id.displayName) you met earlier had id \(others.map(\.grouped).joined(separator: ", ")). It may be another device, or somebody else: compare the verification code \(code ?? "?") with them before you trust it.")
                        }
                    case .peerStateChanged(let id, _, _):
                        // Leaving `connected` is leaving the chat, whether or not a reconnection follows.
                        if present.remove(id) != nil { console.event("* \(id.displayName) left") }
                    case .message(let from, let data, _):
                        console.event("\(from.displayName): \(ChatConsole.printable(data))")
                    case .invitationReceived(let invitation, let from, _):
                        if acceptEverything {
                            try? await session.respond(to: invitation, accept: true)
                        } else if console.interactive {
                            let yes = await console.ask("\(from.displayName) (id \(from.fingerprint.grouped)) invites you to chat. Accept? [y/N]")
                            try? await session.respond(to: invitation, accept: yes)
                        } else {
                            console.status("declined an invitation from \(from.displayName): pass --accept-all to accept invitations when not on a terminal")
                            try? await session.respond(to: invitation, accept: false)
                        }
                    case .invitationResult(_, let peer, let result):
                        if case .accepted = result { break }
                        console.status("\(peer.displayName) did not join: \(result)")
                    case .linkFailed(_, let reason):
                        console.warning("peerlink: \(reason)")
                    }
                }
                return nil
            }
            // --invite NAME: watch the LAN for that name and invite it once found.
            if let inviteName {
                group.addTask {
                    await Self.inviteWhenFound(inviteName, session: session, serviceType: serviceType, console: console)
                    return nil
                }
            }
            // Files peers send (/send on their side): saved into --dir.
            group.addTask {
                await ChatFiles.receive(session: session, receiver: receiver, console: console)
                return nil
            }
            // --connect ENDPOINT: reach that peer, whoever it is.
            if let endpoint = links.endpoint {
                group.addTask { await ChatNode.connect(endpoint, session: session, console: console) }
            }
            // Input: lines to send, commands.
            group.addTask {
                await Self.readInput(session: session, console: console, waitLimit: waitLimit, files: files)
            }
            return await group.firstStatus(thenLeave: session)
        }
        if outcome != 0 { throw ExitCode(outcome) }
    }

    /// Reads lines until /quit or end of input; returns the exit status.
    static func readInput(session: PeerSession, console: ChatConsole, waitLimit: Duration, files: ChatFiles) async -> Int32 {
        var pending: [String] = []
        for await line in console.lines() {
            switch line.trimmingCharacters(in: .whitespaces) {
            case "/quit":
                return 0
            case "/peers":
                let peers = await session.connectedPeers()
                if peers.isEmpty { console.status("nobody connected yet") }
                for id in peers.sorted(by: { $0.displayName < $1.displayName }) {
                    let info = await session.info(for: id)
                    console.status("  \(id.displayName)  \(id.fingerprint.grouped)  \(info.map { "\($0.transport) \($0.remote)  \($0.encrypted ? "encrypted" : "NOT encrypted")  code \($0.verificationCode)" } ?? "")")
                }
                continue
            case let command where command.hasPrefix("/send "):
                files.send(path: String(command.dropFirst(6)).trimmingCharacters(in: .whitespaces), session: session, console: console)
                continue
            case let command where command.hasPrefix("/"):
                console.status("unknown command \(command): /peers lists peers, /send PATH sends a file, /quit leaves")
                continue
            default:
                break
            }
            pending.append(line)
            if console.interactive, await session.connectedPeers().isEmpty {
                console.status("(nobody connected yet: kept, sent when somebody joins)")
            }
            await flush(&pending, session: session, waitLimit: nil)
        }
        // End of input: let files being sent finish, then send what was read, waiting a bounded
        // time for a first peer.
        await files.waitUntilDone()
        if !pending.isEmpty {
            await flush(&pending, session: session, waitLimit: waitLimit)
            if !pending.isEmpty {
                console.warning("peerlink: nobody joined within \(waitLimit); \(pending.count) message\(pending.count == 1 ? "" : "s") not sent")
                return 1
            }
        }
        return 0
    }

    /// Sends pending lines to everyone connected; with a limit, waits up to it for a first peer.
    static func flush(_ pending: inout [String], session: PeerSession, waitLimit: Duration?) async {
        let clock = ContinuousClock()
        let deadline = waitLimit.map { clock.now + $0 }
        while !pending.isEmpty {
            let peers = await session.connectedPeers()
            if peers.isEmpty {
                guard let deadline, clock.now < deadline else { return }
                try? await Task.sleep(for: .milliseconds(100))
                continue
            }
            do {
                try await session.send(Array(pending[0].utf8), to: peers)
                pending.removeFirst()
            } catch {
                // A peer left between the look and the send: look again.
                if Task.isCancelled { return }
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    static func inviteWhenFound(_ name: String, session: PeerSession, serviceType: ServiceType, console: ChatConsole) async {
        let browser = LANBrowser(serviceType: serviceType, excluding: [session.localPeer.fingerprint])
        guard let events = try? browser.events() else { return }
        var invited: Set<PeerID> = []
        for await event in events {
            guard case .found(let found) = event, found.id.displayName == name, !invited.contains(found.id) else { continue }
            invited.insert(found.id)
            do {
                _ = try await session.invite(found.id)
                console.status("invited \(name) (id \(found.id.fingerprint.grouped))")
            } catch let error as PeerLinkError {
                console.warning("peerlink: cannot invite \(name): \(error.message)")
            } catch {
                console.warning("peerlink: cannot invite \(name): \(error)")
            }
        }
    }
}

/// The terminal or script on the other side of standard input and output.
final class ChatConsole: @unchecked Sendable {
    let interactive: Bool
    private let lock = NSLock()
    private var answer: CheckedContinuation<Bool, Never>?

    init(interactive: Bool) {
        self.interactive = interactive
    }

    /// A received message or a join/leave: standard output, one line.
    func event(_ line: String) { printLine(line) }

    /// Information for the person: standard output on a terminal, standard error in a script
    /// (so a script's output holds only messages, joins and leaves).
    func status(_ line: String) {
        if interactive { printLine(line) } else { printError(line) }
    }

    func warning(_ line: String) { printError(line) }

    /// Lines of standard input, read on a thread of their own. A line answering a pending
    /// question goes to the question instead.
    func lines() -> AsyncStream<String> {
        AsyncStream { continuation in
            let thread = Thread { [self] in
                while let line = readLine(strippingNewline: true) {
                    if let pending = takeAnswer() {
                        pending.resume(returning: line.lowercased().hasPrefix("y"))
                    } else {
                        continuation.yield(line)
                    }
                }
                takeAnswer()?.resume(returning: false)
                continuation.finish()
            }
            thread.name = "peerlink-stdin"
            thread.start()
        }
    }

    private func takeAnswer() -> CheckedContinuation<Bool, Never>? {
        lock.withLock {
            defer { answer = nil }
            return answer
        }
    }

    /// Asks a yes/no question on the terminal; the next input line answers it.
    func ask(_ question: String) async -> Bool {
        printLine(question)
        return await withCheckedContinuation { continuation in
            lock.withLock { answer = continuation }
        }
    }

    /// Text safe to print: invalid UTF-8 replaced, control characters (a hostile peer's terminal
    /// escape sequences) shown as '?'.
    static func printable(_ data: [UInt8]) -> String {
        String(decoding: data, as: UTF8.self).unicodeScalars.map { scalar in
            scalar.properties.generalCategory == .control && scalar != "\t" ? "?" : String(scalar)
        }.joined()
    }
}

/// The known peers, shared by the event loop (which remembers every peer met) and the admission
/// check of --refuse-unknown.
final class SharedKnownPeers: Sendable {
    private let peers: Mutex<KnownPeers>

    init(_ peers: KnownPeers) {
        self.peers = Mutex(peers)
    }

    func withLock<R: Sendable>(_ body: (inout KnownPeers) -> R) -> R {
        peers.withLock { body(&$0) }
    }

    func isKnown(_ peer: PeerID) -> Bool {
        peers.withLock { $0.isKnown(peer.fingerprint) }
    }
}
