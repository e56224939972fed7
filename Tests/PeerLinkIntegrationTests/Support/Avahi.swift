import Foundation
import Testing

/// Tests share one avahi-daemon (the lo-only one Hardware/daemons.sh started). Most only add
/// their own service types and run side by side (`shared`); a test that restarts the daemon takes
/// it for itself (`exclusive`): it waits until the running users are done and holds new ones
/// back, so its restart cannot break another test's scan.
actor AvahiDaemonGate {
    static let shared = AvahiDaemonGate()

    private var users = 0
    private var owned = false
    private var ownersWaiting = 0
    private var waiting: [CheckedContinuation<Void, Never>] = []

    private func enterShared() async {
        while owned || ownersWaiting > 0 { await withCheckedContinuation { waiting.append($0) } }
        users += 1
    }

    private func leaveShared() {
        users -= 1
        wakeAll()
    }

    private func enterExclusive() async {
        ownersWaiting += 1
        while owned || users > 0 { await withCheckedContinuation { waiting.append($0) } }
        ownersWaiting -= 1
        owned = true
    }

    private func leaveExclusive() {
        owned = false
        wakeAll()
    }

    private func wakeAll() {
        let woken = waiting
        waiting = []
        for continuation in woken { continuation.resume() }
    }

    /// Runs `body` alongside other users of the daemon.
    nonisolated func shared<T>(_ body: () async throws -> T) async throws -> T {
        await enterShared()
        do {
            let result = try await body()
            await leaveShared()
            return result
        } catch {
            await leaveShared()
            throw error
        }
    }

    /// Runs `body` with no other test using the daemon.
    nonisolated func exclusive<T>(_ body: () async throws -> T) async throws -> T {
        await enterExclusive()
        do {
            let result = try await body()
            await leaveExclusive()
            return result
        } catch {
            await leaveExclusive()
            throw error
        }
    }
}

/// Runs `body` as one of the tests sharing the real avahi-daemon.
func withSharedAvahi<T>(_ body: () async throws -> T) async throws -> T {
    try await AvahiDaemonGate.shared.shared(body)
}

// MARK: - avahi-browse

/// One service instance as `avahi-browse -rpt` reports it, after its `+`/`-`/`=` lines.
struct BrowsedService: Sendable, Equatable {
    var interface: String
    var protocolName: String
    var name: String
    var type: String
    var host: String?
    var address: String?
    var port: Int?
    var txt: [String]?

    /// TXT strings as key → value (the first of repeated keys, as RFC 6763 says).
    var txtDictionary: [String: String] {
        var result: [String: String] = [:]
        for string in txt ?? [] {
            let parts = string.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = String(parts[0])
            if result[key] == nil { result[key] = parts.count > 1 ? String(parts[1]) : "" }
        }
        return result
    }
}

enum AvahiBrowse {
    /// `avahi-browse -rpt _<service>._tcp` (bounded), reduced to the instances still there at
    /// the end: a `-` line after a `+` means the instance went away while browsing.
    /// With `resolve: false` (`-pt`), only the instances' names and where they were seen: no
    /// host, port or TXT. That is the way to ask whether an instance is gone: resolving one that
    /// is being withdrawn waits until Avahi's resolver gives up (seconds; more on a loaded host).
    static func services(_ service: String, resolve: Bool = true, timeout: Duration = .seconds(20)) async throws -> [BrowsedService] {
        guard let browse = TestHost.which("avahi-browse") else {
            throw HarnessError("avahi-browse is not installed (apt-get install avahi-utils, or Hardware/setup.sh)")
        }
        let result = try await runCommand(browse, [resolve ? "-rpt" : "-pt", "_\(service)._tcp"], timeout: timeout)
        guard result.status == 0 else {
            throw HarnessError("avahi-browse exited \(result.status): \(result.stderr)")
        }
        return parse(result.stdout)
    }

    static func parse(_ output: String) -> [BrowsedService] {
        var present: [String: BrowsedService] = [:]
        var order: [String] = []
        for line in output.split(separator: "\n") {
            let fields = line.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
            guard fields.count >= 6 else { continue }
            let key = fields[1] + ";" + fields[2] + ";" + fields[3]
            switch fields[0] {
            case "+":
                if present[key] == nil {
                    present[key] = BrowsedService(interface: fields[1], protocolName: fields[2], name: unescape(fields[3]), type: fields[4])
                    order.append(key)
                }
            case "-":
                present[key] = nil
            case "=":
                guard fields.count >= 10 else { continue }
                var service = present[key] ?? BrowsedService(interface: fields[1], protocolName: fields[2], name: unescape(fields[3]), type: fields[4])
                if present[key] == nil { order.append(key) }
                service.host = fields[6]
                service.address = fields[7]
                service.port = Int(fields[8])
                service.txt = txtStrings(fields[9...].joined(separator: ";"))
                present[key] = service
            default:
                continue
            }
        }
        return order.compactMap { present[$0] }
    }

    /// `"a=b" "c=d"` → ["a=b", "c=d"].
    static func txtStrings(_ field: String) -> [String] {
        var strings: [String] = []
        var current: String?
        for character in field {
            if character == "\"" {
                if let text = current {
                    strings.append(text)
                    current = nil
                } else {
                    current = ""
                }
            } else if current != nil {
                current!.append(character)
            }
        }
        return strings
    }

    /// avahi's escaping of instance names: `\032` (decimal) for a space, `\.` for a dot, ...
    static func unescape(_ text: String) -> String {
        var bytes: [UInt8] = []
        let source = Array(text.utf8)
        var index = 0
        while index < source.count {
            if source[index] == UInt8(ascii: "\\"), let value = decimalEscape(source, at: index + 1) {
                bytes.append(value)
                index += 4
            } else if source[index] == UInt8(ascii: "\\"), index + 1 < source.count {
                bytes.append(source[index + 1])
                index += 2
            } else {
                bytes.append(source[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func decimalEscape(_ bytes: [UInt8], at index: Int) -> UInt8? {
        guard index + 2 < bytes.count else { return nil }
        let digits = bytes[index...(index + 2)]
        guard digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        let value = digits.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) }
        return value <= 255 ? UInt8(value) : nil
    }
}

// MARK: - A D-Bus without avahi

/// A private dbus-daemon on a socket of its own, with nothing registered on it: point
/// DBUS_SYSTEM_BUS_ADDRESS at it and avahi-daemon is "not running" for that process only, while
/// the real one keeps serving the other tests. Stopped in deinit.
final class PrivateBus: Sendable {
    let address: String
    let directory: String
    private let daemon: ChildProcess

    init() async throws {
        guard let dbusDaemon = TestHost.which("dbus-daemon") else {
            throw HarnessError("dbus-daemon is not installed (apt-get install dbus, or Hardware/setup.sh)")
        }
        directory = TestHost.temporaryDirectory("peerlink-bus")
        let socket = directory + "/bus"
        let config = directory + "/bus.conf"
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>peerlink-test</type>
              <listen>unix:path=\(socket)</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """.write(toFile: config, atomically: true, encoding: .utf8)
        let child = try ChildProcess(dbusDaemon, ["--config-file=\(config)", "--nofork", "--print-address=1"])
        daemon = child
        // Generous: under a full parallel suite on two cores the daemon once took over 10 s to
        // print its address. This waits for a daemon to start; it measures nothing.
        address = try await child.waitForLine(timeout: .seconds(45)) { $0.hasPrefix("unix:") }
    }

    deinit {
        daemon.terminate()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

// MARK: - Hardware/daemons.sh

enum DaemonsScript {
    /// Runs `daemons.sh COMMAND` (bounded). It finishes even when the test is cancelled
    /// half-way: a restart must never stop after the stop.
    @discardableResult
    static func run(_ command: String, timeout: Duration = .seconds(30)) async throws -> String {
        guard let script = TestHost.daemonsScript else {
            throw HarnessError("PEERLINK_DAEMONS_SCRIPT is not set (Hardware/test.sh exports it)")
        }
        let result = try await runSpawned("/bin/bash", [script, command], timeout: timeout)
        guard result.status == 0 else {
            throw HarnessError("\(script) \(command) exited \(result.status):\n\(result.stdout)\n\(result.stderr)")
        }
        return result.stdout
    }

    /// Waits (bounded) until avahi-daemon answers again; starts it through the script if it does
    /// not, so a failed test never leaves the machine without its daemon.
    static func ensureAvahiRunning() {
        let check = TestHost.which("avahi-daemon").map { ($0, ["--check"]) }
        func running() -> Bool {
            guard let (daemon, arguments) = check else { return true }
            return runSynchronously(daemon, arguments, timeout: .seconds(5))?.status == 0
        }
        if running() { return }
        if let script = TestHost.daemonsScript {
            _ = runSynchronously("/bin/bash", [script, "start-avahi"], timeout: .seconds(30))
        }
    }
}
