// Counter: two peers, one button each. Pressing it (Enter, or `+` and Enter) adds one to the
// OTHER side's counter; each side shows its own counter and the other side's.
//
// The two find each other and connect on their own (automatic mode, a session of two). A press
// is the one-byte message "+"; whoever receives it adds one to its counter and answers with its
// new value, "=N", so the presser sees the other side's counter too.
import Foundation
import Logging
import PeerLink
import PeerLinkExampleSupport

let tool = "peerlink-example-counter"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--transport T] [--identity PATH]
      --name NAME      the name the other side sees (default: this host's name)
      --service TYPE   the service type both sides use (default: counter)
      --transport T    auto (the LAN and Bluetooth, the default), lan or bluetooth
      --identity PATH  the identity file (default: $XDG_CONFIG_HOME/peerlink/identity.json);
                       a second copy on the same machine needs its own
    Enter (or +) adds one to the other side's counter; quit (or the end of input) leaves.
    """

@main
enum CounterExample {
    /// Everything that can happen, merged into one stream so that one loop owns all the state.
    enum Input: Sendable {
        case line(String)
        case endOfInput
        case session(PeerSessionEvent)
        case sessionEnded
        case sameIdentityElsewhere
        case signal
        case giveUp
    }

    static func main() async {
        let arguments = parseArguments(["--name", "--service", "--transport", "--identity"], usage: usage)
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "counter")
        let identity = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())
        let peer = await makePeer(
            identity, name: name, service: service, policy: SessionPolicy(maximumPeers: 2, automatic: true),
            transports: validTransports(arguments["--transport"] ?? "auto"))
        let session = peer.session

        let (inputs, input) = AsyncStream.makeStream(of: Input.self)
        let running = Task {
            await peer.run()
            input.yield(.sessionEnded)
        }
        Task {
            for await event in sessionEvents(of: peer) { input.yield(.session(event)) }
        }
        let signals = onTerminationSignals { input.yield(.signal) }
        readLines { input.yield($0.map(Input.line) ?? .endOfInput) }
        warnIfIdentityAdvertisedElsewhere(peer) { input.yield(.sameIdentityElsewhere) }

        say("Counter as \(name) (id \(session.localPeer.fingerprint.grouped)) on \(service.dnsSDType).")
        say("Waiting for the other side. Enter (or +) adds one to its counter; quit leaves.")

        var counter: UInt64 = 0  // mine: only the other side raises it
        var others: [PeerID] = []  // connected (one at most: the session holds two)
        var presses = 0  // pressed, not sent yet
        var inputEnded = false
        var status: Int32 = 0

        loop: for await next in inputs {
            switch next {
            case .line(let line):
                switch line.trimmingCharacters(in: .whitespaces) {
                case "", "+":
                    presses += 1
                    if others.isEmpty { say("(nobody here yet: the press is sent when the other side joins)") }
                case "quit":
                    break loop
                default:
                    say("Enter or + presses the button; quit leaves")
                }
            case .endOfInput:
                inputEnded = true
                if presses > 0 {
                    Task {
                        try? await Task.sleep(for: .seconds(30))
                        input.yield(.giveUp)
                    }
                }
            case .session(.peerStateChanged(let other, .connected, _)):
                guard !others.contains(other) else { break }
                others.append(other)
                let code = await session.info(for: other)?.verificationCode ?? "?"
                say("* \(other.displayName) joined (id \(other.fingerprint.grouped), verification code \(code))")
                try? await session.send(Array("=\(counter)".utf8), to: [other])
            case .session(.peerStateChanged(let other, _, _)):
                guard let index = others.firstIndex(of: other) else { break }
                others.remove(at: index)
                say("* \(other.displayName) left")
            case .session(.message(let from, let data, _)):
                let text = String(decoding: data, as: UTF8.self)
                if text == "+" {
                    counter += 1
                    say("+ \(from.displayName) pressed: my counter is \(counter)")
                    try? await session.send(Array("=\(counter)".utf8), to: [from])
                } else if text.hasPrefix("="), let value = UInt64(text.dropFirst()) {
                    say("= \(from.displayName)'s counter is \(value) (mine is \(counter))")
                }
            case .session(.invitationReceived(let invitation, let from, _)):
                // Automatic mode answers invitations into the automatic session itself; what is
                // left is somebody inviting by hand into a session of their own.
                note("declined an invitation from \(from.displayName): this counter pairs up automatically")
                try? await session.respond(to: invitation, accept: false)
            case .session(.linkFailed(_, let reason)):
                note(reason)
            case .session(.peerTransportChanged(let other, let transport, _)):
                note("\(other.displayName) now on \(transport)")
            case .session(.invitationResult):
                break
            case .sessionEnded:
                note("the session ended unexpectedly")
                status = 1
                break loop
            case .sameIdentityElsewhere:
                note(sameIdentityWarning)
            case .signal:
                break loop
            case .giveUp:
                note("nobody joined within 30 s; \(presses) press\(presses == 1 ? "" : "es") not sent")
                status = 1
                break loop
            }
            // Presses go out once somebody is there to receive them.
            while presses > 0, !others.isEmpty {
                do {
                    try await session.send(Array("+".utf8), to: others)
                    presses -= 1
                } catch {
                    break  // the other side left between the look and the send
                }
            }
            if inputEnded && presses == 0 { break }
        }
        await session.disconnect()
        await running.value
        withExtendedLifetime(signals) {}
        exit(status)
    }
}
