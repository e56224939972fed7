import Foundation
import Testing

/// Runs in CI (fails there if the lab cannot run), and wherever the lab's needs are met.
private let labEnabled = NetLab.missingRequirement == nil || TestHost.daemonsRequired
private let labReason: Comment = "the namespace lab cannot run here: \(NetLab.missingRequirement ?? "?")"

/// `peerlink chat` on three hosts of the namespace lab: each with its own avahi-daemon, its own
/// address, and a cable that can be pulled.
@Suite("several hosts: chat in the namespace lab (Hardware/netlab.sh)", .enabled(if: labEnabled, labReason))
struct MultiHostChatTests {
    /// `peerlink chat` on host `host` of `lab`, as "H<host>", with standard input piped.
    ///
    /// `netlab.sh exec` runs `nsenter`, which execs the command: the chat is a child of the
    /// script's bash (``ChildProcess/pid``), not that process itself; see ``chatPIDs(on:of:)``.
    static func chat(on host: Int, of lab: NetLab, service: String) throws -> ChildProcess {
        try ChildProcess(
            "/bin/bash", [lab.script, "exec", String(host), TestHost.peerlinkBinary, "chat", "--name", "H\(host)", "--service", service],
            environment: lab.environment.merging(["XDG_CONFIG_HOME": TestHost.temporaryDirectory("h\(host)")]) { $1 },
            withInput: true)
    }

    /// The pids of the `peerlink` processes running in host `host`'s network namespace.
    static func chatPIDs(on host: Int, of lab: NetLab) -> [pid_t] {
        guard let ip = TestHost.which("ip"), let listed = runSynchronously(ip, ["netns", "pids", "\(lab.prefix)-h\(host)"], timeout: .seconds(10))
        else { return [] }
        return listed.stdout.split(separator: "\n").compactMap { pid_t($0.trimmingCharacters(in: .whitespaces)) }.filter { pid in
            let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) ?? ""
            return comm.trimmingCharacters(in: .whitespacesAndNewlines) == "peerlink"
        }
    }

    /// Waits until `line` is printed on standard output; returns how long after `since` it came.
    static func delay(of line: String, in chat: ChildProcess, since: ContinuousClock.Instant, timeout: Duration) async throws -> Duration {
        let seen = try await chat.waitForTimedLine(timeout: timeout) { $0 == line }
        return since.duration(to: seen.time)
    }

    @Test(
        "chat across 3 hosts; a peer killed with SIGKILL and a host whose cable is cut are each seen leaving within 10 s",
        .timeLimit(.minutes(2)))
    func chatKillAndCut() async throws {
        if let missing = NetLab.missingRequirement { Issue.record("\(missing)"); return }
        let service = TestHost.uniqueServiceType("m")
        var prefix = ""
        try await withNetLab(hosts: 3) { lab in
            prefix = lab.prefix
            let chats = try (1...3).map { try Self.chat(on: $0, of: lab, service: service) }
            defer { for chat in chats { chat.terminate() } }
            for (index, chat) in chats.enumerated() {
                try await ChatTests.waitForJoins(chat, 2, timeout: .seconds(40))
                let others = (1...3).filter { $0 != index + 1 }.map { "* H\($0) joined" }
                #expect(Set(ChatTests.joinedLines(chat)) == Set(others), "host \(index + 1): \(chat.stdout)")
            }

            // A message from host 1 reaches hosts 2 and 3 (across the lab's bridge).
            chats[0].type("hello from host 1\n")
            for chat in chats[1...] { try await chat.waitForLine(containing: "H1: hello from host 1") }

            // kill -9 the chat on host 3: the peerlink process itself, inside the namespace.
            let victims = Self.chatPIDs(on: 3, of: lab)
            try #require(victims.count == 1, "one peerlink on host 3, found \(victims)")
            let killedAt = ContinuousClock.now
            kill(victims[0], SIGKILL)
            for chat in chats[0...1] {
                let delay = try await Self.delay(of: "* H3 left", in: chat, since: killedAt, timeout: .seconds(15))
                #expect(delay <= .seconds(10), "\(chat.command): H3 left \(delay) after the kill")
            }
            #expect(try await chats[2].waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)

            // Host 2's cable is pulled: no FIN, no RST; only the keep-alive can tell. It declares a
            // link dead 8 s after the last thing received (a ping may arrive just before the
            // cut), which leaves 2 s for scheduling noise. Count from before the cut command.
            try await Task.sleep(for: .seconds(1))
            let cutAt = ContinuousClock.now
            try await lab.control("cut", "2")
            let delay = try await Self.delay(of: "* H2 left", in: chats[0], since: cutAt, timeout: .seconds(15))
            #expect(delay <= .seconds(10), "host 1 saw H2 leave \(delay) after the cut")
            let back = try await Self.delay(of: "* H1 left", in: chats[1], since: cutAt, timeout: .seconds(15))
            #expect(back <= .seconds(10), "host 2 saw H1 leave \(back) after the cut")

            // Both survivors still end cleanly at the end of their input.
            for chat in chats[0...1] { chat.closeInput() }
            for chat in chats[0...1] {
                #expect(try await chat.waitForExit(timeout: .seconds(20)) == 0, "\(chat.command)\nstderr:\n\(chat.stderr)")
            }
            #expect((1...3).allSatisfy { Self.chatPIDs(on: $0, of: lab).isEmpty })
        }
        #expect(!prefix.isEmpty)
        let left = NetLab.namespaces().filter { $0.hasPrefix(prefix + "-") }
        #expect(left.isEmpty, "namespaces left behind: \(left)")
    }
}
