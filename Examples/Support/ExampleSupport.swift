// What every example needs besides PeerLink itself: arguments, identity, signals, standard input,
// printing. Shared so each example's file holds only what it shows.
import Dispatch
import Foundation
import Logging
import PeerLink

/// The program's name, as it was started.
public let programName = URL(fileURLWithPath: CommandLine.arguments.first ?? "example").lastPathComponent

/// Text safe to print: invalid UTF-8 replaced, control characters shown as '?'.
public func printable(_ data: [UInt8]) -> String {
    String(decoding: data, as: UTF8.self).unicodeScalars.map { scalar in
        scalar.properties.generalCategory == .control && scalar != "\t" ? "?" : String(scalar)
    }.joined()
}


/// `--key VALUE` or `--key=VALUE` for the keys given; `-h`/`--help` prints the usage.
public func parseArguments(_ keys: Set<String>, usage: String) -> [String: String] {
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

public func validName(_ text: String) -> DisplayName {
    do { return try DisplayName(text) } catch { usageError("--name: \(error.description)") }
}

public func validService(_ text: String) -> ServiceType {
    do { return try ServiceType(text) } catch { usageError("--service: \(error.description)") }
}

public func usageError(_ message: String) -> Never {
    note(message)
    note("run with --help for the usage")
    exit(64)
}

/// A line of output, written at once (also when standard output is a pipe).
public func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// A message for the person at the keyboard, on standard error.
public func note(_ message: String) {
    FileHandle.standardError.write(Data("\(programName): \(message)\n".utf8))
}

/// Exits with the error's message: 64 for invalid input, 69 for a missing service
/// (avahi-daemon not running), 1 for anything else.
public func fail(_ error: PeerLinkError) -> Never {
    note(error.message)
    switch error.code {
    case .invalidParameter: exit(64)
    case .unavailable: exit(69)
    default: exit(1)
    }
}

public func hostName() -> String {
    var buffer = [CChar](repeating: 0, count: 256)
    guard gethostname(&buffer, buffer.count - 1) == 0 else { return "peer" }
    return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
}

/// Loads the identity at `path`, creating it if missing. Also keeps the library's logs below
/// warnings off the screen (the program, not the library, decides where logs go).
public func loadIdentity(at path: String) -> Identity {
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

public func validTransports(_ text: String) -> TransportChoice {
    do { return try TransportChoice(parsing: text) } catch { usageError("--transport: \(error.message)") }
}

/// A peer on `transports` (the LAN and Bluetooth by default): listeners, advertisements and
/// browsers on each, feeding one session. A transport that cannot run here is a note; none at
/// all ends the program. Made with `PeerNode.open`, which waits for bluetoothd and avahi-daemon
/// on a thread of its own.
public func makePeer(
    _ identity: Identity, name: DisplayName, service: ServiceType, policy: SessionPolicy, transports: TransportChoice = .auto
) async -> PeerNode {
    do throws(PeerLinkError) {
        let node = try await PeerNode.open(
            configuration: PeerNodeConfiguration(
                identity: identity, displayName: name, serviceType: service, transports: transports, policy: policy))
        for notice in node.notices {
            if case .unavailable(let facility, let error) = notice.what {
                note("\(notice.label) \(facility == .links ? "skipped" : "discovery is off"): \(error.message)")
            }
        }
        return node
    } catch {
        fail(error)
    }
}

/// The session events of `node`'s events (the rest is for tools that show transports).
public func sessionEvents(of node: PeerNode) -> AsyncStream<PeerSessionEvent> {
    AsyncStream { continuation in
        let task = Task {
            for await event in node.events {
                if case .session(let event) = event { continuation.yield(event) }
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
    }
}

/// Whether `endpoint` is one of `node`'s own listeners (a TCP listener on every interface is
/// known by its port).
public func isOwnEndpoint(_ endpoint: Endpoint, of node: PeerNode) -> Bool {
    let own = node.session.listeners.flatMap(\.localEndpoints)
    if let tcp = endpoint.tcp { return own.contains { $0.tcp?.port == tcp.port } }
    return own.contains(endpoint)
}

/// Calls `handler` on SIGINT or SIGTERM instead of dying, so the peer can leave cleanly.
public func onTerminationSignals(_ handler: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
    [SIGINT, SIGTERM].map { number in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler(handler: handler)
        source.resume()
        return source
    }
}

/// Reads standard input on a thread of its own: each line, then nil at the end.
public func readLines(_ handler: @escaping @Sendable (String?) -> Void) {
    Thread {
        while let line = readLine() { handler(line) }
        handler(nil)
    }.start()
}

public let sameIdentityWarning = """
    another program advertises this same identity: two copies with one identity never see each \
    other. Give the second copy its own, e.g. --identity /tmp/second-identity.json
    """

/// Watches every transport of `peer` for its own identity at an endpoint that is not its own (a
/// second copy started with the same identity file) and calls `handler` once if it turns up.
public func warnIfIdentityAdvertisedElsewhere(_ peer: PeerNode, _ handler: @escaping @Sendable () -> Void) {
    let mine = peer.localPeer.fingerprint
    let running = peer.modules.filter { peer.runningModules.contains($0.name) }
    let discovery = PeerDiscovery(modules: running, request: BrowseRequest(serviceType: peer.configuration.session.serviceType))
    Task {
        let once = WarnOnce()
        await discovery.run { event in
            guard case .peer(let change) = event else { return }
            switch change {
            case .found(let found), .updated(let found):
                if found.id.fingerprint == mine, found.endpoints.contains(where: { !isOwnEndpoint($0, of: peer) }), once.first() {
                    handler()
                }
            case .lost:
                break
            }
        }
    }
}

private final class WarnOnce: @unchecked Sendable {
    private let lock = NSLock()
    private var warned = false

    func first() -> Bool {
        lock.withLock {
            defer { warned = true }
            return !warned
        }
    }
}
