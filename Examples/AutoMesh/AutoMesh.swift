// AutoMesh: ad-hoc networking without anybody pressing anything. Every copy started with the
// same service type joins every other one it finds (automatic mode: up to 8 peers in a full
// mesh), prints who joins and leaves and how many are in the mesh, and every few seconds tells
// everyone it is still there. Ctrl-C (or SIGTERM) leaves the mesh cleanly.
import Foundation
import Logging
import PeerLink

let tool = "peerlink-example-automesh"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--interval SECONDS] [--identity PATH]
      --name NAME         the name the others see (default: this host's name)
      --service TYPE      the service type every member uses (default: mesh)
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
        let arguments = parseArguments(["--name", "--service", "--interval", "--identity"])
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "mesh")
        let interval = validInterval(arguments["--interval"] ?? "5")
        let identity = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())
        let peer = makePeer(identity, name: name, service: service, policy: SessionPolicy(automatic: true))
        let session = peer.session

        let (inputs, input) = AsyncStream.makeStream(of: Input.self)
        let running = Task {
            await peer.run()
            input.yield(.sessionEnded)
        }
        Task {
            for await event in session.events { input.yield(.session(event)) }
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

/// Text safe to print: invalid UTF-8 replaced, control characters (a hostile peer's terminal
/// escape sequences) shown as '?'.
func printable(_ data: [UInt8]) -> String {
    String(decoding: data, as: UTF8.self).unicodeScalars.map { scalar in
        scalar.properties.generalCategory == .control && scalar != "\t" ? "?" : String(scalar)
    }.joined()
}

// MARK: - The plumbing every example has: arguments, identity, signals.

/// `--key VALUE` or `--key=VALUE` for the keys given; `-h`/`--help` prints the usage.
func parseArguments(_ keys: Set<String>) -> [String: String] {
    var values: [String: String] = [:]
    var rest = CommandLine.arguments.dropFirst()
    while let argument = rest.popFirst() {
        if argument == "-h" || argument == "--help" {
            say(usage)
            exit(0)
        }
        let parts = argument.split(separator: "=", maxSplits: 1).map(String.init)
        guard let key = parts.first, keys.contains(key) else { usageError("unknown argument '\(argument)'") }
        guard let value = parts.count == 2 ? parts[1] : rest.popFirst() else { usageError("\(key) needs a value") }
        values[key] = value
    }
    return values
}

func validName(_ text: String) -> DisplayName {
    do { return try DisplayName(text) } catch { usageError("--name: \(error.description)") }
}

func validService(_ text: String) -> ServiceType {
    do { return try ServiceType(text) } catch { usageError("--service: \(error.description)") }
}

func usageError(_ message: String) -> Never {
    note(message)
    FileHandle.standardError.write(Data((usage + "\n").utf8))
    exit(64)
}

/// A line of output, written at once (also when standard output is a pipe).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// A message for the person at the keyboard, on standard error.
func note(_ message: String) {
    FileHandle.standardError.write(Data("\(tool): \(message)\n".utf8))
}

/// Exits with the error's message: 64 for invalid input, 69 for a missing service
/// (avahi-daemon not running), 1 for anything else.
func fail(_ error: PeerLinkError) -> Never {
    note(error.message)
    switch error.code {
    case .invalidParameter: exit(64)
    case .unavailable: exit(69)
    default: exit(1)
    }
}

func hostName() -> String {
    var buffer = [CChar](repeating: 0, count: 256)
    guard gethostname(&buffer, buffer.count - 1) == 0 else { return "peer" }
    return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
}

/// Loads the identity at `path`, creating it if missing. Also keeps the library's logs below
/// warnings off the screen (the program, not the library, decides where logs go).
func loadIdentity(at path: String) -> Identity {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = .warning
        return handler
    }
    do throws(PeerLinkError) {
        let loaded = try IdentityStore.loadOrCreate(at: path)
        if loaded.created { note("created a new identity in \(loaded.path)") }
        if let warning = loaded.warning { note("warning: \(warning)") }
        return loaded.identity
    } catch {
        fail(error)
    }
}

/// A peer on the LAN: a TCP listener, its DNS-SD advertisement, and a browser feeding a session.
func makePeer(_ identity: Identity, name: DisplayName, service: ServiceType, policy: SessionPolicy) -> LANPeer {
    do throws(PeerLinkError) {
        return try LANPeer(
            configuration: PeerSessionConfiguration(identity: identity, displayName: name, serviceType: service, policy: policy))
    } catch {
        fail(error)
    }
}

/// Calls `handler` on SIGINT or SIGTERM instead of dying, so the peer can leave cleanly.
func onTerminationSignals(_ handler: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
    [SIGINT, SIGTERM].map { number in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler(handler: handler)
        source.resume()
        return source
    }
}

let sameIdentityWarning = """
    another program advertises this same identity: two copies with one identity never see each \
    other. Give the second copy its own, e.g. --identity /tmp/second-identity.json
    """

/// Watches the LAN for this peer's own identity at a port that is not its own (a second copy
/// started with the same identity file) and calls `handler` once if it turns up.
func warnIfIdentityAdvertisedElsewhere(_ peer: LANPeer, _ handler: @escaping @Sendable () -> Void) {
    let mine = peer.session.localPeer.fingerprint
    let port = peer.listener.port
    let browser = LANBrowser(serviceType: peer.browser.serviceType)
    Task {
        guard let events = try? browser.events() else { return }
        for await event in events {
            switch event {
            case .found(let found), .updated(let found):
                let elsewhere = found.endpoints.contains { endpoint in
                    if case .tcp(_, let other) = endpoint { other != port } else { false }
                }
                if found.id.fingerprint == mine && elsewhere {
                    handler()
                    return
                }
            case .lost:
                break
            }
        }
    }
}
