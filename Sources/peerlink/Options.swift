import ArgumentParser
import Foundation
import Logging
import PeerLink

/// Options shared by commands that act as a peer.
struct PeerOptions: ParsableArguments {
    @Option(help: "The identity file (default: $XDG_CONFIG_HOME/peerlink/identity.json). Created if missing.")
    var identity: String?

    @Flag(name: .shortAndLong, help: "Log what happens underneath, to standard error.")
    var verbose = false

    /// Loads or creates the identity, telling the user on standard error when it created one.
    func loadIdentity() throws(PeerLinkError) -> Identity {
        let path = identity ?? IdentityStore.defaultPath()
        let loaded = try IdentityStore.loadOrCreate(at: path)
        if loaded.created {
            printError("peerlink: created a new identity in \(loaded.path) (id \(loaded.identity.fingerprint.grouped))")
        }
        if let warning = loaded.warning { printError("peerlink: warning: \(warning)") }
        if let warning = IdentityStore.claim(loaded.path) { printError("peerlink: warning: \(warning)") }
        return loaded.identity
    }

    func makeLogger(_ label: String) -> Logger {
        PeerLinkLogging.bootstrap(verbose: verbose)
        return Logger(label: label)
    }
}

enum PeerLinkLogging {
    nonisolated(unsafe) private static var done = false

    /// The tool (never the library) decides where logs go: standard error, warnings and up
    /// unless --verbose.
    static func bootstrap(verbose: Bool) {
        guard !done else { return }
        done = true
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = verbose ? .debug : .warning
            return handler
        }
    }
}

extension PeerLinkCore.ValidationError {
    /// The same message, as an argument-parser validation error (exit status 64).
    var usageError: ArgumentParser.ValidationError { ArgumentParser.ValidationError(description) }
}

/// Waits until SIGINT or SIGTERM arrives; returns the signal number.
func waitForTerminationSignal() async -> Int32 {
    signal(SIGINT, SIG_IGN)
    signal(SIGTERM, SIG_IGN)
    return await withCheckedContinuation { continuation in
        let box = SignalBox(continuation)
        for number in [SIGINT, SIGTERM] {
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { box.fire(number) }
            source.resume()
            box.keep(source)
        }
    }
}

private final class SignalBox: @unchecked Sendable {
    private let lock = NSLock()
    private var continuation: CheckedContinuation<Int32, Never>?
    private var sources: [any DispatchSourceSignal] = []

    init(_ continuation: CheckedContinuation<Int32, Never>) {
        self.continuation = continuation
    }

    func keep(_ source: any DispatchSourceSignal) {
        lock.withLock { sources.append(source) }
    }

    func fire(_ number: Int32) {
        let pending = lock.withLock { () -> CheckedContinuation<Int32, Never>? in
            defer { continuation = nil }
            return continuation
        }
        pending?.resume(returning: number)
    }
}

extension TaskGroup where ChildTaskResult == Int32? {
    /// Waits for the first task that ends with an exit status (tasks that end with nil keep the
    /// run going), leaves the session (everyone is told), stops the other tasks, and returns the
    /// status: the end of every command that runs a session.
    mutating func firstStatus(thenLeave session: PeerSession) async -> Int32 {
        var status: Int32 = 0
        while let result = await next() {
            if let result {
                status = result
                break
            }
        }
        await session.disconnect()
        cancelAll()
        return status
    }
}
