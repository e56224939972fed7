import ArgumentParser
import Foundation
import Logging
import PeerLink

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

            Typed lines go to every connected peer, each as one reliable message (its UTF-8 bytes, \
            without the newline); any message or datagram a peer sends is printed. Commands: /peers lists the peers with id, the link \
            in use (transport and address), encryption, verification code, and every transport the \
            peer is reachable on; /send PATH sends a file to every connected peer (progress \
            lines while chat goes on, then "* NAME verified by PEER"); /quit leaves. Files peers \
            send are saved into --dir (default: the current directory; an existing file is never \
            overwritten: "NAME (1).EXT") and "* saved PATH (from PEER, ...)" says where.

            --transport auto (the default) runs the LAN and Bluetooth together: a peer found on both \
            is one peer, reached on its best transport (--prefer, default tcp,l2cap,rfcomm); a \
            transport that cannot run here is one line on standard error and the others go on. \
            With Bluetooth, chat listens on RFCOMM and L2CAP on one adapter (--adapter, default the \
            first that is up); --connect reaches a peer at an endpoint, whoever it is. When no \
            transport can advertise (no avahi-daemon, no Bluetooth), chat stops with exit 69 unless \
            --connect gives it a peer to reach: then it listens on the port it prints ("Listening \
            on ...") and others can --connect to it.

            When standard input or output is not a terminal, chat is scriptable: one line in is one \
            message (lines read before anybody is connected wait for the first peer, up to --wait \
            seconds), each message received is printed as "NAME: TEXT", joins and leaves as \
            "* NAME joined" and "* NAME left"; at the end of input it sends what it read, waits (up \
            to 10 s) until every peer acknowledged it, even one whose link is being replaced, and exits 0. \
            A NAME that two peers go by (or that is yours, or a known peer's arriving with a new key) is \
            followed by the first group of the peer's id: "NAME [abcd]".

            Ctrl-C (SIGINT) or SIGTERM leaves as /quit does, without waiting for acknowledgements, \
            and exits 0: peers see "* NAME left" at once. A second one exits at once.
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

    @OptionGroup var transports: TransportOptions

    @Option(help: ArgumentHelp(
        "Connect to the peer at this endpoint, whoever it is: bt://ADDR/rfcomm/CHANNEL, bt://ADDR/l2cap/PSM or tcp://HOST:PORT.",
        valueName: "endpoint"))
    var connect: String?

    @Option(help: ArgumentHelp("The Bluetooth adapter to use, hciN (default: the first one that is up).", valueName: "hciN"))
    var adapter: String?

    @Option(help: ArgumentHelp("Listen for RFCOMM links on this channel, 1 to 30 (default: a free one).", valueName: "channel"))
    var rfcommChannel: Int?

    @Option(help: ArgumentHelp("Listen for L2CAP links on this PSM, 0x1001 and up, odd (default: a free one).", valueName: "psm"))
    var l2capPsm: String?

    @Option(help: ArgumentHelp(
        "Listen for TCP links on this port, 1 to 65535 (default: a free one): for a firewall, or for peers that --connect to a known port.",
        valueName: "port"))
    var port: Int?

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
        if let connect {
            do {
                _ = try endpoint(connect)
            } catch {
                throw ArgumentParser.ValidationError("--connect: \(error.message)")
            }
        }
        try validateAdapter(adapter)
        if let port, !(1...65535).contains(port) {
            throw ArgumentParser.ValidationError("--port must be 1 to 65535, not \(port) (leave it out for any free port)")
        }
        if let rfcommChannel, RFCOMMChannel(rfcommChannel) == nil {
            throw ArgumentParser.ValidationError("--rfcomm-channel must be 1 to 30, not \(rfcommChannel)")
        }
        if let l2capPsm {
            guard let psm = L2CAPPSM(l2capPsm) else {
                throw ArgumentParser.ValidationError(
                    "--l2cap-psm must be a PSM such as 0x1001: odd in its low byte, even in its high byte; not '\(l2capPsm)'")
            }
            guard psm.isDynamic else {
                throw ArgumentParser.ValidationError(
                    "--l2cap-psm \(psm) is reserved (below 0x1001, needs CAP_NET_BIND_SERVICE): use a dynamic PSM such as 0x1001")
            }
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

    /// The transports chosen, the Bluetooth one (and with --port the LAN one) configured with the options.
    func choice(logger: Logger) -> TransportChoice {
        let choice = transports.transport.configuring(
            bluetoothModule(
                adapter: adapter, channel: rfcommChannel.flatMap(RFCOMMChannel.init), psm: l2capPsm.flatMap(L2CAPPSM.init), logger: logger))
        guard let port else { return choice }
        return choice.configuring(LANTransportModule(port: UInt16(port), logger: logger))
    }

    /// `--connect`'s text as an endpoint, read by the schemes of every standard transport and of
    /// the chosen ones (an endpoint of a transport not chosen is refused when connecting, with why).
    func endpoint(_ text: String) throws(PeerLinkError) -> Endpoint {
        let logger = Logger(label: "peerlink.chat")
        for module in StandardTransports.modules(logger: logger) + choice(logger: logger).modules(logger: logger) {
            module.registerEndpointSchemes()
        }
        return try Endpoint(parsing: text)
    }

    func run() async throws {
        let logger = peer.makeLogger("peerlink.chat")
        let interactive = isatty(0) == 1 && isatty(1) == 1
        let displayName = try DisplayName(name)
        let serviceType = try ServiceType(service)
        let identityPath = peer.identity ?? IdentityStore.defaultPath()
        let knownPath = KnownPeersStore.defaultPath(identityPath: identityPath)
        let console = ChatConsole(interactive: interactive)
        let target = try connect.map { text throws(PeerLinkError) in try endpoint(text) }
        let node: PeerNode
        do {
            let identity = try peer.loadIdentity()
            var session = PeerSessionConfiguration(
                identity: identity, displayName: displayName, serviceType: serviceType,
                encryption: Self.preference(encryption) ?? .required, policy: SessionPolicy(automatic: invite == nil))
            // link caps this process's descriptors can hold
            session.limits = session.limits.fitted(toDescriptorLimit: DescriptorLimit.current()?.soft ?? 1024)
            let configuration = PeerNodeConfiguration(
                session: session,
                transports: choice(logger: logger), ranking: transports.prefer,
                // Reached at an explicit endpoint, chat runs even where nobody can find it.
                discoveryRequired: target == nil, knownPeersPath: knownPath, admitOnlyKnownPeers: refuseUnknown)
            node = try await PeerNode.open(configuration: configuration, logger: logger)
        } catch {
            throw fail(error)
        }
        let session = node.session
        console.status("Chatting as \(displayName) (id \(session.localPeer.fingerprint.grouped)) on \(serviceType.dnsSDType)\(invite.map { ", inviting \($0)" } ?? ", joining every peer found"). /peers lists peers, /quit leaves.")
        console.status(TransportWording.summary(node))
        if refuseUnknown {
            let count = node.knownPeers.entries.count
            console.status("Admitting only the \(count) known peer\(count == 1 ? "" : "s") in \(knownPath); others are refused.")
        }

        let inviteName = invite
        let acceptEverything = acceptAll
        let waitLimit = Duration.milliseconds(Int(wait * 1000))
        let receiver = FileReceiver(directory: dir)
        let files = ChatFiles()

        // Ctrl-C or SIGTERM leaves as /quit does: a process killed by the signal would be a lost
        // link to its peers, which they dial again for their reconnect grace. The signal wait
        // cannot be cancelled; a stream of it can, so the run can end otherwise too.
        let (signals, signalSink) = AsyncStream.makeStream(of: Int32.self)
        Task.detached { signalSink.yield(await waitForTerminationSignal()) }

        let failures = RecentFailures()
        let outcome: Int32 = await withTaskGroup(of: Int32?.self) { group in
            group.addTask {
                await node.run()
                return nil
            }
            group.addTask {
                for await number in signals {
                    console.status("\(number == SIGINT ? "interrupted" : "terminated"): leaving (once more to quit at once)")
                    Task.detached { Foundation.exit(128 + (await waitForTerminationSignal())) }
                    return 0
                }
                return nil
            }
            // Everything that happens, printed in one place.
            group.addTask {
                let printer = ChatEvents(console: console, session: session, acceptAll: acceptEverything, failures: failures)
                for await event in node.events { await printer.show(event) }
                return nil
            }
            // --invite NAME: invite every peer of that name found, on any transport.
            if let inviteName {
                group.addTask {
                    await node.invitePeers(named: inviteName)
                    return nil
                }
            }
            // Files peers send (/send on their side): saved into --dir.
            group.addTask {
                await ChatFiles.receive(session: session, receiver: receiver, console: console)
                return nil
            }
            // --connect ENDPOINT: reach that peer, whoever it is.
            if let target {
                group.addTask { await Self.connect(target, node: node, console: console, failures: failures) }
            }
            // Input: lines to send, commands.
            group.addTask {
                await Self.readInput(node: node, console: console, waitLimit: waitLimit, files: files)
            }
            return await group.firstStatus(thenLeave: session)
        }
        if outcome != 0 { throw ExitCode(outcome) }
    }

    /// `--connect`: connects to the endpoint once the node runs; returns an exit status when
    /// that failed and nobody else is connected either (nil: connected, or chatting with peers
    /// that came another way, which a failed `--connect` does not end).
    static func connect(_ endpoint: Endpoint, node: PeerNode, console: ChatConsole, failures: RecentFailures) async -> Int32? {
        let status: Int32
        do {
            let peer = try await node.connect(to: endpoint)
            console.status("connected to \(peer.displayName) (id \(peer.fingerprint.grouped)) at \(endpoint)")
            return nil
        } catch let error as PeerLinkError {
            // The link's failure may have been told already (the session's event): then only
            // what it means here.
            console.warning(
                failures.first(error.message)
                    ? "peerlink: cannot connect to \(endpoint): \(error.message)" : "peerlink: cannot connect to \(endpoint) (see above)")
            status = error.code == .invalidParameter ? ExitStatus.usage : ExitStatus.code(for: error)
        } catch {
            console.warning("peerlink: cannot connect to \(endpoint): \(error)")
            status = ExitStatus.failure
        }
        if status != ExitStatus.usage, await !node.connectedPeerStatuses().isEmpty {
            console.status("going on with the peers connected")
            return nil
        }
        return status
    }

    /// Reads lines until /quit or end of input; returns the exit status.
    static func readInput(node: PeerNode, console: ChatConsole, waitLimit: Duration, files: ChatFiles) async -> Int32 {
        let session = node.session
        var pending: [String] = []
        for await line in console.lines() {
            switch line.trimmingCharacters(in: .whitespaces) {
            case "/quit":
                await waitUntilDelivered(session: session, console: console)
                return 0
            case "/peers":
                let statuses = await node.connectedPeerStatuses()
                if statuses.isEmpty { console.status("nobody connected yet") }
                for status in statuses { console.status(ChatEvents.peerLine(status)) }
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
                console.warning(
                    "peerlink: no peer was connected within \(waitLimit) of the end of input; \(pending.count) message\(pending.count == 1 ? "" : "s") not sent"
                )
                return 1
            }
        }
        await waitUntilDelivered(session: session, console: console)
        return 0
    }

    /// How long chat, leaving, waits for its last lines to reach a peer whose link is being
    /// replaced (a cable cut and plugged back, a move between Bluetooth and the LAN).
    static let deliveryLinger: Duration = .seconds(10)

    /// Before leaving: every peer acknowledged every line, or `deliveryLinger` passed (then a
    /// warning; the lines were sent, a peer that comes back later will not get them).
    static func waitUntilDelivered(session: PeerSession, console: ChatConsole) async {
        if await session.waitUntilDelivered(within: deliveryLinger) { return }
        console.warning(
            "peerlink: a peer has not acknowledged the last lines within \(deliveryLinger) (its link is down); leaving anyway")
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
}

/// What chat shows of a node's events — every line about peers, transports and invitations is
/// worded here — and its answers to invitations.
///
/// In a script, standard output holds only messages (`NAME: TEXT`) and joins and leaves
/// (`* NAME joined`, `* NAME left`); the rest goes to standard error. A name that more than one
/// peer of this chat has gone by (or that is this peer's own) is followed by the first group of
/// the peer's id, `NAME [abcd]`, from the moment it is shared, and so is a known name that
/// arrived with a new key (the WARNING on standard error): a second peer calling itself Alice
/// cannot pass its lines off as the first one's.
final class ChatEvents: @unchecked Sendable {
    let console: ChatConsole
    let session: PeerSession
    let acceptAll: Bool
    /// Peers shown as joined (and not since as left).
    private var present: Set<PeerID> = []
    /// The ids of the peers that joined this chat under each display name.
    private var namesJoined: [String: Set<Fingerprint>] = [:]
    private let told = ToldProblems()
    private let failures: RecentFailures

    init(console: ChatConsole, session: PeerSession, acceptAll: Bool, failures: RecentFailures = RecentFailures()) {
        self.console = console
        self.session = session
        self.acceptAll = acceptAll
        self.failures = failures
    }

    /// `/peers`: `  NAME  ID  KIND REMOTE  encrypted  code 123 456  reachable on tcp, l2cap, rfcomm`:
    /// the link in use first, then every transport the peer is reachable on, best first.
    static func peerLine(_ status: NodePeerStatus) -> String {
        let id = status.peer
        let link = status.link.map { "\($0.transport) \($0.remote)  \($0.encrypted ? "encrypted" : "NOT encrypted")  code \($0.verificationCode)" } ?? ""
        let reachable = status.transports.map(\.rawValue).joined(separator: ", ")
        return "  \(id.displayName)  \(id.fingerprint.grouped)  \(link)  reachable on \(reachable.isEmpty ? "-" : reachable)"
    }

    /// Shows one event (called for each, in order, from one task).
    func show(_ event: PeerNodeEvent) async {
        switch event {
        case .session(let event):
            await show(event)
        case .met(let id, let verdict, let code):
            switch verdict {
            case .known:
                break
            case .new:
                console.status("  new peer \(id.displayName): id \(id.fingerprint.grouped)\(code.map { ", verification code \($0)" } ?? "")")
            case .nameConflict(let others):
                // From here on its lines carry its id: the name is not enough to tell them apart.
                namesJoined[id.displayName, default: []].formUnion(others)
                console.warning("WARNING: \(id.displayName) arrived with a key you have not seen before (id \(id.fingerprint.grouped)); the \(id.displayName) you met earlier had id \(others.map(\.grouped).joined(separator: ", ")). It may be another device, or somebody else: compare the verification code \(code ?? "?") with them before you trust it.")
            }
        case .transport(let notice):
            show(notice)
        case .invitedByName(let peer, .success):
            console.status("invited \(peer.displayName) (id \(peer.fingerprint.grouped))")
        case .invitedByName(let peer, .failure(let error)):
            console.warning("peerlink: cannot invite \(peer.displayName): \(error.message)")
        case .discovery:
            break
        }
    }

    /// How a peer is named on standard output: its display name, and the first group of its id
    /// when another peer of this chat, or this peer, goes by that name too.
    func label(_ id: PeerID) -> String {
        let name = id.displayName
        let shared = (namesJoined[name]?.subtracting([id.fingerprint]).isEmpty == false) || name == session.localPeer.displayName
        return shared ? "\(name) [\(id.fingerprint.grouped.prefix { $0 != "-" })]" : name
    }

    /// Why a peer left, when that is worth a line on standard error: not for a peer that said
    /// goodbye (`GO_AWAY` 0, `LEAVE`) or when this chat is the one leaving; yes for a link that
    /// failed, was closed for a protocol error, or could not be made again.
    static func leaveNote(_ reason: String?) -> String? {
        guard let reason, !reason.isEmpty else { return nil }
        let ordinary = [
            "code \(GoAwayCode.normal)", "it left the session", "the local peer left the session",
        ]
        return ordinary.contains { reason.contains($0) } ? nil : reason
    }

    private func show(_ event: PeerSessionEvent) async {
        switch event {
        case .peerStateChanged(let id, .connected, _):
            if present.insert(id).inserted {
                namesJoined[id.displayName, default: []].insert(id.fingerprint)
                console.event("* \(label(id)) joined")
            }
        case .peerStateChanged(let id, _, let reason):
            // Leaving `connected` is leaving the chat, whether or not a reconnection follows.
            if present.remove(id) != nil {
                console.event("* \(label(id)) left")
                if let note = Self.leaveNote(reason) { console.warning("peerlink: \(label(id)) left: \(note)") }
            }
        case .message(let from, let data, _):
            console.event("\(label(from)): \(ChatConsole.printable(data))")
        case .invitationReceived(let invitation, let from, _):
            if acceptAll {
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
        case .peerTransportChanged(let id, let transport, _):
            // The link moved (failover, upgrade, reconnect); the peer never left.
            if present.contains(id) { console.event("* \(label(id)) now on \(transport)") }
        case .linkFailed(_, let reason):
            if failures.first(reason) { console.warning("peerlink: \(reason)") }
        }
    }

    private func show(_ notice: TransportNotice) {
        switch notice.what {
        case .listening(let place, let endpoints):
            console.status(TransportWording.listening(place: place, endpoints: endpoints))
        case .advertising(let summary):
            console.status("Advertising \(summary); scanning for peers")
        case .advertisement(.renamed(let from, let to)):
            console.status("\(notice.label): the name \"\(from)\" is taken; advertising as \"\(to)\"")
        case .advertisement(.daemonUnavailable(let daemon)):
            console.warning("peerlink: \(daemon) went away; advertising again once it is back")
        case .advertisement(.failed(let error)):
            console.warning("peerlink: \(notice.label): advertising failed: \(error.message)")
        case .advertisement(.published), .browsing:
            break
        case .unavailable:
            if let line = TransportWording.problem(notice), told.first(line, module: notice.module) {
                console.warning("peerlink: \(line)")
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
                Sys.nameCurrentThread("peerlink-stdin")
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

    /// The most of one message a line shows (bytes of UTF-8); the rest is counted, not printed.
    static let shownBytes = 16 << 10

    /// Text safe to print, in time linear in what is shown: at most ``shownBytes`` of the
    /// message (cut at a character, the number of bytes left out said after it), invalid UTF-8
    /// replaced, and every character that could act on a terminal (controls, C1, line
    /// separators, text-direction overrides: ``PeerLinkCore/PeerText/needsEscape(_:)``, tab
    /// and backslash aside) shown as '?'.
    static func printable(_ data: [UInt8]) -> String {
        var end = min(data.count, shownBytes)
        // back to the start of a UTF-8 sequence, so the cut does not leave half a character
        if end < data.count {
            var back = end
            while back > 0, end - back < 3, data[back] & 0xC0 == 0x80 { back -= 1 }
            if data[back] & 0xC0 != 0x80 { end = back }
        }
        var scalars = String.UnicodeScalarView()
        scalars.reserveCapacity(end)
        for scalar in String(decoding: data[..<end], as: UTF8.self).unicodeScalars {
            scalars.append(scalar == "\t" || scalar == "\\" || !PeerText.needsEscape(scalar) ? scalar : "?")
        }
        let shown = String(scalars)
        return end < data.count ? shown + " … (\(data.count - end) more bytes not shown)" : shown
    }
}
