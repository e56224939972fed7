// BrowseChat: the classic MultipeerConnectivity chat, in a terminal. It lists the peers nearby
// as they come and go, each with a number; `invite N` invites one; an invitation received asks
// "accept? [y/n]"; once connected, typed lines go to everyone in the chat; `end` ends the chat
// and goes back to browsing; `quit` leaves.
//
// Invitations are made and answered by the person (manual mode). A session is over once left,
// so `end` starts a new one, as an MPC app makes a new MCSession.
import Foundation
import Logging
import PeerLink
import PeerLinkExampleSupport

let tool = "peerlink-example-browsechat"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--transport T] [--identity PATH]
      --name NAME      the name the others see (default: this host's name)
      --service TYPE   the service type to browse and advertise (default: chat)
      --transport T    auto (the LAN and Bluetooth, the default), lan or bluetooth
      --identity PATH  the identity file (default: $XDG_CONFIG_HOME/peerlink/identity.json);
                       a second copy on the same machine needs its own
    \(commands)
    """
let commands = """
    Commands: invite N (invite peer [N]), list (who is nearby), end (end the chat), quit.
    Any other line is a chat message. An invitation asks accept? [y/n]: answer y or n.
    """

@main
enum BrowseChatExample {
    enum Input: Sendable {
        case line(String)
        case endOfInput
        case nearby(DiscoveryEvent)
        /// `generation` tells events of an ended session from those of the current one.
        case session(generation: Int, PeerSessionEvent)
        case sessionEnded(generation: Int)
        case signal
    }

    static func main() async {
        let arguments = parseArguments(["--name", "--service", "--transport", "--identity"], usage: usage)
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "chat")
        let identity = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())
        let manual = SessionPolicy(automatic: false)
        let transports = validTransports(arguments["--transport"] ?? "auto")

        let (inputs, input) = AsyncStream.makeStream(of: Input.self)
        /// Runs a peer (listeners, advertisements, session) and forwards its session's events.
        func start(_ peer: PeerNode, generation: Int) -> Task<Void, Never> {
            Task {
                for await event in sessionEvents(of: peer) { input.yield(.session(generation: generation, event)) }
            }
            return Task {
                await peer.run()
                input.yield(.sessionEnded(generation: generation))
            }
        }
        var generation = 0
        var peer = await makePeer(identity, name: name, service: service, policy: manual, transports: transports)
        var running = start(peer, generation: generation)
        var myPeers = [peer]

        // The browse list has a discovery of its own (every transport the peer runs, merged): it
        // outlives the sessions `end` replaces.
        let browsing = PeerDiscovery(
            modules: peer.modules.filter { peer.runningModules.contains($0.name) }, request: BrowseRequest(serviceType: service))
        Task {
            await browsing.run { event in
                if case .peer(let change) = event { input.yield(.nearby(change)) }
            }
        }
        let signals = onTerminationSignals { input.yield(.signal) }
        readLines { input.yield($0.map(Input.line) ?? .endOfInput) }

        say("BrowseChat as \(name) (id \(identity.fingerprint.grouped)) on \(service.dnsSDType).")
        say(commands)
        say("Looking for peers nearby…")

        var numbers: [Fingerprint: Int] = [:]  // one number per peer, kept if it goes and comes back
        var nearby: [Int: PeerID] = [:]  // who is around now, by number
        var members: [PeerID] = []  // in the chat, in the order they joined
        var invited: Set<PeerID> = []  // invitations sent, not answered yet
        var prompts: [(invitation: InvitationID, from: PeerID)] = []  // invitations to answer, oldest first
        var warnedSameIdentity = false
        var status: Int32 = 0

        func listing() -> String {
            if nearby.isEmpty { return "nobody nearby yet" }
            return nearby.keys.sorted().map { number in
                let other = nearby[number]!
                return "  [\(number)] \(other.displayName) (id \(other.fingerprint.grouped))\(members.contains(other) ? " — in the chat" : "")"
            }.joined(separator: "\n")
        }
        func ask() {
            guard let first = prompts.first else { return }
            say("\(first.from.displayName) (id \(first.from.fingerprint.grouped)) invites you to chat. accept? [y/n]")
        }

        loop: for await next in inputs {
            switch next {
            case .nearby(.found(let found)), .nearby(.updated(let found)):
                if found.id.fingerprint == identity.fingerprint {
                    // This peer itself, or a second copy started with the same identity file.
                    let elsewhere = found.endpoints.contains { endpoint in
                        !myPeers.contains { isOwnEndpoint(endpoint, of: $0) }
                    }
                    if elsewhere && !warnedSameIdentity {
                        warnedSameIdentity = true
                        note(sameIdentityWarning)
                    }
                    break
                }
                let number = numbers[found.id.fingerprint] ?? (numbers.values.max() ?? 0) + 1
                numbers[found.id.fingerprint] = number
                let wasNearby = nearby[number]
                nearby[number] = found.id
                if wasNearby == nil {
                    say("+ [\(number)] \(found.id.displayName) (id \(found.id.fingerprint.grouped)) is nearby: invite \(number) to chat")
                } else if wasNearby?.displayName != found.id.displayName {
                    say("~ [\(number)] \(wasNearby?.displayName ?? "") is now called \(found.id.displayName)")
                }
            case .nearby(.lost(let gone)):
                guard let number = numbers[gone.fingerprint], let other = nearby.removeValue(forKey: number) else { break }
                say("- [\(number)] \(other.displayName) is gone")

            case .line(let line):
                let text = line.trimmingCharacters(in: .whitespaces)
                if text == "quit" { break loop }
                if let prompt = prompts.first {
                    // The next line answers the oldest invitation.
                    let accept: Bool
                    switch text.lowercased() {
                    case "y", "yes": accept = true
                    case "n", "no": accept = false
                    default:
                        say("answer y or n first:")
                        ask()
                        continue loop
                    }
                    prompts.removeFirst()
                    do {
                        try await peer.session.respond(to: prompt.invitation, accept: accept)
                        say(accept ? "accepted: joining \(prompt.from.displayName)…" : "declined")
                    } catch {
                        say("cannot answer: \(message(error))")
                    }
                    ask()
                    continue loop
                }
                let words = text.split(separator: " ")
                switch words.first {
                case "invite":
                    guard words.count == 2, let number = Int(words[1]) else {
                        say("invite takes the number of a peer in the list: invite 1")
                        break
                    }
                    guard let other = nearby[number] else {
                        say("nobody is [\(number)] now:\n\(listing())")
                        break
                    }
                    do {
                        _ = try await peer.session.invite(other)
                        invited.insert(other)
                        say("invited \(other.displayName): waiting for an answer…")
                    } catch {
                        say("cannot invite \(other.displayName): \(message(error))")
                    }
                case "list" where words.count == 1:
                    say(listing())
                case "help" where words.count == 1:
                    say(commands)
                case "end" where words.count == 1:
                    guard !members.isEmpty || !invited.isEmpty else {
                        say("not in a chat: invite N starts one")
                        break
                    }
                    // Leave this session (everyone is told), then start a new one to be invited into.
                    await peer.session.disconnect()
                    await running.value
                    generation += 1
                    peer = await makePeer(identity, name: name, service: service, policy: manual, transports: transports)
                    running = start(peer, generation: generation)
                    myPeers.append(peer)
                    members = []
                    invited = []
                    prompts = []
                    say("chat ended; back to browsing:\n\(listing())")
                case nil:
                    break
                default:
                    guard !members.isEmpty else {
                        say("not in a chat: invite N starts one (list shows who is nearby)")
                        break
                    }
                    do {
                        try await peer.session.send(Array(line.utf8), to: members)
                    } catch {
                        say("not sent: \(message(error))")
                    }
                }
            case .endOfInput:
                break loop

            case .session(let from, _) where from != generation:
                break  // the tail of a session `end` left
            case .session(_, .peerStateChanged(let other, .connected, _)):
                invited.remove(other)
                guard !members.contains(other) else { break }
                members.append(other)
                let code = await peer.session.info(for: other)?.verificationCode ?? "?"
                say("* \(other.displayName) joined the chat (verification code \(code)). Type to talk; end ends the chat.")
            case .session(_, .peerStateChanged(let other, _, _)):
                guard let index = members.firstIndex(of: other) else { break }
                members.remove(at: index)
                say("* \(other.displayName) left the chat")
                if members.isEmpty { say("the chat is over: invite N starts another") }
            case .session(_, .invitationReceived(let invitation, let from, _)):
                prompts.append((invitation, from))
                if prompts.count == 1 { ask() }
            case .session(_, .invitationResult(_, let other, let outcome)):
                invited.remove(other)
                if outcome != .accepted { say("\(other.displayName) did not join: \(outcome)") }
            case .session(_, .message(let from, let data, _)):
                say("\(from.displayName): \(printable(data))")
            case .session(_, .peerTransportChanged(let other, let transport, _)):
                note("\(other.displayName) now on \(transport)")
            case .session(_, .linkFailed(_, let reason)):
                note(reason)
                // An invitation on screen may have ended (timed out, the inviter left).
                let waiting = Set(await peer.session.invitationsAwaitingAnswer())
                let shown = prompts.first
                prompts.removeAll { !waiting.contains($0.invitation) }
                if let shown, prompts.first?.invitation != shown.invitation {
                    say("(the invitation from \(shown.from.displayName) can no longer be answered)")
                    ask()
                }
            case .sessionEnded(let ended):
                guard ended == generation else { break }
                note("the session ended unexpectedly")
                status = 1
                break loop
            case .signal:
                break loop
            }
        }
        await peer.session.disconnect()
        await running.value
        withExtendedLifetime(signals) {}
        exit(status)
    }
}

func message(_ error: any Error) -> String {
    (error as? PeerLinkError)?.message ?? "\(error)"
}
