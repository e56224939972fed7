// Counter: two peers, one button each. Pressing it (Enter, or `+` and Enter) adds one to the
// OTHER side's counter; each side shows its own counter and the other side's.
//
// The two find each other and connect on their own (automatic mode, a session of two). A press
// is the one-byte message "+"; whoever receives it adds one to its counter and answers with its
// new value, "=N", so the presser sees the other side's counter too.
import Foundation
import Logging
import PeerLink

let tool = "peerlink-example-counter"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--identity PATH]
      --name NAME      the name the other side sees (default: this host's name)
      --service TYPE   the service type both sides use (default: counter)
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
        let arguments = parseArguments(["--name", "--service", "--identity"])
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "counter")
        let identity = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())
        let peer = makePeer(identity, name: name, service: service, policy: SessionPolicy(maximumPeers: 2, automatic: true))
        let session = peer.session

        let (inputs, input) = AsyncStream.makeStream(of: Input.self)
        let running = Task {
            await peer.run()
            input.yield(.sessionEnded)
        }
        Task {
            for await event in session.events { input.yield(.session(event)) }
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

// MARK: - The plumbing every example has: arguments, identity, signals, standard input.

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

/// Reads standard input on a thread of its own: each line, then nil at the end.
func readLines(_ handler: @escaping @Sendable (String?) -> Void) {
    Thread {
        while let line = readLine() { handler(line) }
        handler(nil)
    }.start()
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
