// AutoMesh: ad-hoc networking without anybody pressing anything. Every copy started with the
// same service type joins every other one it finds (automatic mode: up to 8 peers in a full
// mesh), prints who joins and leaves and how many are in the mesh, and every few seconds tells
// everyone it is still there. Ctrl-C (or SIGTERM) leaves the mesh cleanly.
import Foundation
import Logging
import PeerLink
import PeerLinkExampleSupport

let tool = "peerlink-example-automesh"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--interval SECONDS] [--transport T] [--identity PATH]
      --name NAME         the name the others see (default: this host's name)
      --service TYPE      the service type every member uses (default: mesh)
      --transport T       auto (the LAN and Bluetooth, the default), lan or bluetooth
      --interval SECONDS  how often to send "NAME is here" to everyone (default: 5)
      --identity PATH     the identity file (default: $XDG_CONFIG_HOME/peerlink/identity.json);
                          a second copy on the same machine needs its own
    Needs no input; Ctrl-C or SIGTERM leaves the mesh.
    """

@main
enum AutoMeshExample {
    enum Input: Sendable {
        case session(PeerSessionEvent)
        case sessionEnded
        case heartbeat
        case sameIdentityElsewhere
        case signal
    }

    static func main() async {
        let arguments = parseArguments(["--name", "--service", "--interval", "--transport", "--identity"], usage: usage)
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "mesh")
        let interval = validInterval(arguments["--interval"] ?? "5")
        let identity = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())
        let peer = await makePeer(
            identity, name: name, service: service, policy: SessionPolicy(automatic: true),
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
        Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                input.yield(.heartbeat)
            }
        }
        let signals = onTerminationSignals { input.yield(.signal) }
        warnIfIdentityAdvertisedElsewhere(peer) { input.yield(.sameIdentityElsewhere) }

        say("AutoMesh as \(name) (id \(session.localPeer.fingerprint.grouped)) on \(service.dnsSDType): joining every peer found.")
        say("1 member: \(name) (me). Ctrl-C leaves.")

        var members: [PeerID] = []  // connected, in the order they joined
        var status: Int32 = 0
        func roster() -> String {
            let names = ["\(name) (me)"] + members.map(\.displayName)
            return "\(names.count) member\(names.count == 1 ? "" : "s"): \(names.joined(separator: ", "))"
        }

        loop: for await next in inputs {
            switch next {
            case .session(.peerStateChanged(let other, .connected, _)):
                guard !members.contains(other) else { break }
                members.append(other)
                say("* \(other.displayName) joined (id \(other.fingerprint.grouped)); \(roster())")
            case .session(.peerStateChanged(let other, _, _)):
                guard let index = members.firstIndex(of: other) else { break }
                members.remove(at: index)
                say("* \(other.displayName) left; \(roster())")
            case .session(.message(let from, let data, _)):
                say("\(from.displayName): \(printable(data))")
            case .session(.invitationReceived(let invitation, let from, _)):
                // Automatic mode answers invitations into the mesh itself; what is left is
                // somebody inviting by hand into a session of their own.
                note("declined an invitation from \(from.displayName) into another session: staying in the mesh")
                try? await session.respond(to: invitation, accept: false)
            case .session(.linkFailed(_, let reason)):
                note(reason)
            case .session(.peerTransportChanged(let other, let transport, _)):
                note("\(other.displayName) now on \(transport)")
            case .session(.invitationResult):
                break
            case .heartbeat:
                guard !members.isEmpty else { break }
                // A member may leave between the look and the send; the next beat goes to who is left.
                try? await session.send(Array("\(name) is here".utf8), to: members)
            case .sameIdentityElsewhere:
                note(sameIdentityWarning)
            case .sessionEnded:
                note("the session ended unexpectedly")
                status = 1
                break loop
            case .signal:
                say("leaving the mesh")
                break loop
            }
        }
        await session.disconnect()
        await running.value
        withExtendedLifetime(signals) {}
        exit(status)
    }
}

func validInterval(_ text: String) -> Duration {
    guard let seconds = Double(text), seconds >= 0.1, seconds <= 3600 else {
        usageError("--interval: '\(text)' is not a number of seconds from 0.1 to 3600")
    }
    return .milliseconds(Int64(seconds * 1000))
}
