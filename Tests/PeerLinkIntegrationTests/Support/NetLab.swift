import Foundation
import Testing

/// A namespace lab of Hardware/netlab.sh: N hosts, each with its own dbus + avahi, joined by a
/// bridge on 10.99.0.0/24. Every lab gets its own LAB_PREFIX and LAB_DIR, so test runs (and
/// other people's labs) never collide; ``down()`` is synchronous and idempotent and also runs
/// from deinit, so the lab is torn down on every path, a failed or cancelled test included.
final class NetLab: @unchecked Sendable {
    let prefix: String
    let directory: String
    let script: String
    let hosts: Int
    /// Whether the hosts' avahi-daemons run over IPv6 as well as IPv4 (`LAB_IPV6=1`).
    let ipv6: Bool
    private let lock = NSLock()
    private var torn = false

    /// The environment every netlab.sh call of this lab gets.
    var environment: [String: String] { ["LAB_PREFIX": prefix, "LAB_DIR": directory, "LAB_IPV6": ipv6 ? "1" : "0"] }

    private init(prefix: String, directory: String, script: String, hosts: Int, ipv6: Bool) {
        self.prefix = prefix
        self.directory = directory
        self.script = script
        self.hosts = hosts
        self.ipv6 = ipv6
    }

    /// Why the lab cannot run here, or nil when it can.
    static var missingRequirement: String? {
        if !TestHost.isRoot { return "the namespace lab needs root (network namespaces, mounts)" }
        for tool in ["ip", "nsenter", "unshare", "avahi-daemon", "dbus-daemon"] where TestHost.which(tool) == nil {
            return "\(tool) is not installed (Hardware/setup.sh installs what the lab needs)"
        }
        guard let script = TestHost.netlabScript else { return "PEERLINK_NETLAB_SCRIPT is not set and the repository root was not found" }
        if !FileManager.default.fileExists(atPath: script) { return "\(script) does not exist" }
        return nil
    }

    /// Namespace names currently in `ip netns list`.
    static func namespaces() -> [String] {
        guard let ip = TestHost.which("ip"), let list = runSynchronously(ip, ["netns", "list"], timeout: .seconds(10)) else { return [] }
        return list.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").first.map(String.init) }
    }

    /// A prefix of 5 characters ("pt" + 3 random letters) that no namespace uses yet.
    static func freshPrefix() -> String {
        let existing = namespaces()
        let letters = Array("abcdefghijklmnopqrstuvwxyz")
        for _ in 0..<50 {
            let prefix = "pt" + String((0..<3).map { _ in letters.randomElement()! })
            if !existing.contains(where: { $0.hasPrefix(prefix + "-") }) { return prefix }
        }
        return "pt" + String((0..<3).map { _ in letters.randomElement()! })
    }

    /// Brings up a lab of `hosts` hosts (avahi over IPv6 too with `ipv6`: a dual-stack LAN, where
    /// every service is seen and resolved once per address family); tears it down again if that
    /// fails.
    static func up(hosts: Int, ipv6: Bool = false) async throws -> NetLab {
        if let missing = missingRequirement { throw HarnessError(missing) }
        let prefix = freshPrefix()
        let directory = "/tmp/peerlink-it-\(prefix)-\(UUID().uuidString.prefix(8).lowercased())"
        let lab = NetLab(prefix: prefix, directory: directory, script: TestHost.netlabScript!, hosts: hosts, ipv6: ipv6)
        do {
            // Not runCommand: the daemons `up` starts would keep Foundation from seeing it exit.
            let result = try await runSpawned("/bin/bash", [lab.script, "up", String(hosts)], environment: lab.environment, timeout: .seconds(60))
            guard result.status == 0 else {
                throw HarnessError("netlab.sh up \(hosts) failed (LAB_PREFIX=\(prefix)):\n\(result.stdout)\n\(result.stderr)")
            }
        } catch {
            lab.down()
            throw error
        }
        return lab
    }

    /// Starts `command` on host `host` in the background (`netlab.sh exec`).
    func start(on host: Int, _ command: [String], environment: [String: String] = [:]) throws -> ChildProcess {
        try ChildProcess("/bin/bash", [script, "exec", String(host)] + command, environment: self.environment.merging(environment) { $1 })
    }

    /// Runs `command` on host `host` to completion.
    func run(on host: Int, _ command: [String], environment: [String: String] = [:], timeout: Duration = .seconds(30)) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await runCommand("/bin/bash", [script, "exec", String(host)] + command, environment: self.environment.merging(environment) { $1 }, timeout: timeout)
    }

    /// Runs a netlab.sh subcommand of this lab (`addr 1`, `cut 1`, ...), which must succeed.
    @discardableResult
    func control(_ arguments: String...) async throws -> String {
        let result = try await runSpawned("/bin/bash", [script] + arguments, environment: environment, timeout: .seconds(30))
        guard result.status == 0 else {
            throw HarnessError("netlab.sh \(arguments.joined(separator: " ")) exited \(result.status):\n\(result.stdout)\n\(result.stderr)")
        }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func address(of host: Int) async throws -> String { try await control("addr", String(host)) }

    /// Tears the lab down (once): stops everything in it, removes namespaces and mounts.
    @discardableResult
    func down() -> String {
        let first = lock.withLock { () -> Bool in
            defer { torn = true }
            return !torn
        }
        guard first else { return "" }
        let result = runSynchronously("/bin/bash", [script, "down"], environment: environment, timeout: .seconds(60))
        if let mountpoint = TestHost.which("mountpoint"), runSynchronously(mountpoint, ["-q", directory], timeout: .seconds(5))?.status != 0 {
            try? FileManager.default.removeItem(atPath: directory)
        }
        return (result?.stdout ?? "") + (result?.stderr ?? "netlab.sh down timed out")
    }

    /// Namespaces of this lab that still exist.
    var leftoverNamespaces: [String] { Self.namespaces().filter { $0.hasPrefix(prefix + "-") } }

    deinit { down() }
}

/// Runs `body` with a fresh lab of `hosts` hosts, torn down afterwards whatever happens.
func withNetLab<T>(hosts: Int, ipv6: Bool = false, _ body: (NetLab) async throws -> T) async throws -> T {
    let lab = try await NetLab.up(hosts: hosts, ipv6: ipv6)
    do {
        let result = try await body(lab)
        lab.down()
        return result
    } catch {
        lab.down()
        throw error
    }
}
