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
        "chat on a dual-stack LAN (avahi over IPv4 and IPv6): each peer, seen and resolved once per address family, joins once and the two chat both ways",
        .timeLimit(.minutes(2)))
    func chatOverDualStack() async throws {
        if let missing = NetLab.missingRequirement { Issue.record("\(missing)"); return }
        let service = TestHost.uniqueServiceType("d")
        try await withNetLab(hosts: 2, ipv6: true) { lab in
            let chats = try (1...2).map { try Self.chat(on: $0, of: lab, service: service) }
            defer { for chat in chats { chat.terminate() } }

            // Host 1's avahi resolves host 2's chat over both families: at its IPv4 address and
            // at its IPv6 link-local one. Otherwise this test would be one more IPv4-only run.
            let v4 = try await lab.address(of: 2)
            var resolved = ""
            var both = false
            let deadline = ContinuousClock.now + .seconds(40)
            while !both, ContinuousClock.now < deadline {
                resolved = try await lab.run(on: 1, ["avahi-browse", "-prt", "_\(service)._tcp"]).stdout
                let lines = resolved.split(separator: "\n").filter { $0.hasPrefix("=;eth0;") && $0.contains(";H2;") }
                both = lines.contains { $0.contains(";IPv4;") && $0.contains(";\(v4);") }
                    && lines.contains { $0.contains(";IPv6;") && $0.contains(";fe80::") }
                if !both { try await Task.sleep(for: .milliseconds(500)) }
            }
            #expect(both, "host 1's avahi-browse -prt, no resolution of H2 over both families:\n\(resolved)")

            for (index, chat) in chats.enumerated() {
                try await ChatTests.waitForJoins(chat, 1, timeout: .seconds(40))
                let other = index == 0 ? "H2" : "H1"
                chat.type("from H\(index + 1) over both families\n")
                try await chats[1 - index].waitForLine(containing: "H\(index + 1): from H\(index + 1) over both families", timeout: .seconds(20))
                chat.type("/peers\n")  // its answer goes to standard error when output is not a terminal
                let listed = try await chat.waitForStderrLine(containing: "  \(other)  ", timeout: .seconds(10))
                #expect(listed.contains("tcp://"), "host \(index + 1): /peers said \(listed)")
            }
            // The second sighting of each peer (the other family) merged into the first: one join,
            // nobody left, on either side.
            try await Task.sleep(for: .seconds(2))
            for (index, chat) in chats.enumerated() {
                let other = index == 0 ? "H2" : "H1"
                #expect(ChatTests.joinedLines(chat) == ["* \(other) joined"], "host \(index + 1):\n\(chat.stdout)")
                #expect(!chat.stdout.contains("* \(other) left"), "host \(index + 1):\n\(chat.stdout)")
            }
            for chat in chats { chat.closeInput() }
            for chat in chats {
                #expect(try await chat.waitForExit(timeout: .seconds(20)) == 0, "\(chat.command)\nstderr:\n\(chat.stderr)")
            }
        }
    }

    @Test(
        "chat across 3 hosts: a peer killed with SIGKILL is seen leaving within 10 s; a host whose cable is cut and plugged back within the grace stays in the session with nothing lost, and leaves once cut for longer than the grace",
        .timeLimit(.minutes(4)))
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

            // kill -9 the chat on host 3: the peerlink process itself, inside the namespace. Its
            // links end with a reset; the redial finds nothing listening: it left, at once.
            let victims = Self.chatPIDs(on: 3, of: lab)
            try #require(victims.count == 1, "one peerlink on host 3, found \(victims)")
            let killedAt = ContinuousClock.now
            kill(victims[0], SIGKILL)
            for chat in chats[0...1] {
                let delay = try await Self.delay(of: "* H3 left", in: chat, since: killedAt, timeout: .seconds(15))
                #expect(delay <= .seconds(10), "\(chat.command): H3 left \(delay) after the kill")
            }
            #expect(try await chats[2].waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)

            // Host 2's cable is pulled: no FIN, no RST; the keep-alive declares the link dead
            // after 8 s, and the reconnect grace (30 s) keeps H2 in the session. Lines typed
            // meanwhile wait. Plugged back in after 12 s, the pair is on a new link and every
            // line arrives, once, in order; nobody was reported gone.
            try await Task.sleep(for: .seconds(1))
            try await lab.control("cut", "2")
            let whileCut = (1...5).map { "while the cable is out \($0)" }
            for line in whileCut {
                chats[0].type(line + "\n")
                try await Task.sleep(for: .milliseconds(200))
            }
            try await Task.sleep(for: .seconds(11))
            try await lab.control("heal", "2")
            try await chats[0].waitForLine(containing: "* H2 now on tcp", timeout: .seconds(30))
            for line in whileCut { try await chats[1].waitForLine(containing: "H1: " + line, timeout: .seconds(15)) }
            let received = chats[1].stdoutLines.filter { $0.contains("while the cable is out") }
            #expect(
                received.count == whileCut.count && zip(received, whileCut).allSatisfy { $0.hasSuffix("H1: " + $1) },
                "every line once, in order:\n\(chats[1].stdout)")
            #expect(!chats[0].stdout.contains("* H2 left"), "\(chats[0].stdout)")
            #expect(!chats[1].stdout.contains("* H1 left"), "\(chats[1].stdout)")
            chats[1].type("back from host 2\n")
            try await chats[0].waitForLine(containing: "H2: back from host 2")

            // Cut again, for good: H2 is seen leaving once the keep-alive (8 s) and the grace
            // (30 s) are over, not before the grace.
            try await Task.sleep(for: .seconds(1))
            let cutAt = ContinuousClock.now
            try await lab.control("cut", "2")
            let delay = try await Self.delay(of: "* H2 left", in: chats[0], since: cutAt, timeout: .seconds(60))
            #expect(delay >= .seconds(30) && delay <= .seconds(45), "host 1 saw H2 leave \(delay) after the cut")
            let back = try await Self.delay(of: "* H1 left", in: chats[1], since: cutAt, timeout: .seconds(30))
            #expect(back <= .seconds(45), "host 2 saw H1 leave \(back) after the cut")

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
