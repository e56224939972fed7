import Foundation
import PeerLink
import Testing

/// Trust in `peerlink chat`: the known-peers file next to the identity, `--refuse-unknown`, and
/// the loud warning when a known name arrives with a new key. Each peer keeps its config
/// directory (identity and known peers) across the runs of a test, as a user's would.
@Suite("peerlink chat: trust", .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct ChatTrustTests {
    static func chat(_ name: String, service: String, home: String, _ extra: [String] = []) throws -> ChildProcess {
        try ChildProcess.peerlink(["chat", "--name", name, "--service", service] + extra, configHome: home, withInput: true)
    }

    /// Ends both chats (end of input) and checks they exit 0.
    static func finish(_ chats: ChildProcess...) async throws {
        for chat in chats { chat.closeInput() }
        for chat in chats { #expect(try await chat.waitForExit() == 0, "\(chat.command)\nstderr:\n\(chat.stderr)") }
    }

    /// Two chats that meet: both print the other's join.
    static func meet(_ first: (String, String), _ second: (String, String), service: String) async throws -> (ChildProcess, ChildProcess) {
        let one = try chat(first.0, service: service, home: first.1)
        let two = try chat(second.0, service: service, home: second.1)
        try await one.waitForLine(containing: "* \(second.0) joined", timeout: .seconds(45))
        try await two.waitForLine(containing: "* \(first.0) joined", timeout: .seconds(45))
        return (one, two)
    }

    @Test("--refuse-unknown refuses a peer never met (both sides say why, nobody joins); once met, it is admitted", .timeLimit(.minutes(2)))
    func refuseUnknown() async throws {
        let service = TestHost.uniqueServiceType("r")
        let annHome = TestHost.temporaryDirectory("ann")
        let bobHome = TestHost.temporaryDirectory("bob")

        // 1. Strangers: Ann admits only peers she knows, and she knows nobody.
        do {
            let ann = try Self.chat("Ann", service: service, home: annHome, ["--refuse-unknown"])
            let bob = try Self.chat("Bob", service: service, home: bobHome)
            try await ann.waitForStderrLine(containing: "Admitting only the 0 known peers")
            let refusal = try await ann.waitForStderrLine(containing: "refused Bob (id ", timeout: .seconds(30))
            #expect(refusal.contains("not a known peer"), "\(refusal)")
            let heard = try await bob.waitForStderrLine(containing: "not a known peer", timeout: .seconds(15))
            #expect(heard.contains("Ann (id ") && heard.contains("refused the link"), "\(heard)")
            // Give a join that should not happen a moment to show up.
            try await Task.sleep(for: .seconds(2))
            #expect(ChatTests.joinedLines(ann).isEmpty, "\(ann.stdout)")
            #expect(ChatTests.joinedLines(bob).isEmpty, "\(bob.stdout)")
            try await Self.finish(ann, bob)
        }

        // 2. They meet once without the flag: each remembers the other.
        do {
            let (ann, bob) = try await Self.meet(("Ann", annHome), ("Bob", bobHome), service: service)
            try await Self.finish(ann, bob)
            let known = try KnownPeersStore.load(at: annHome + "/peerlink/known-peers.json")
            #expect(known.entries.values.map(\.displayName) == ["Bob"])
        }

        // 3. The same two again, Ann with the flag: Bob is known now, so he is admitted.
        do {
            let ann = try Self.chat("Ann", service: service, home: annHome, ["--refuse-unknown"])
            let bob = try Self.chat("Bob", service: service, home: bobHome)
            try await ann.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
            try await bob.waitForLine(containing: "* Ann joined", timeout: .seconds(30))
            bob.type("hello again\n")
            try await ann.waitForLine(containing: "Bob: hello again")
            #expect(!ann.stderr.contains("not a known peer"), "\(ann.stderr)")
            #expect(!bob.stderr.contains("not a known peer"), "\(bob.stderr)")
            #expect(ann.stderrLines.contains { $0.contains("Admitting only the 1 known peer ") }, "\(ann.stderr)")
            try await Self.finish(ann, bob)
        }
    }

    @Test("a different key under a name met before gets a loud WARNING", .timeLimit(.minutes(2)))
    func nameConflictWarning() async throws {
        let service = TestHost.uniqueServiceType("w")
        let bobHome = TestHost.temporaryDirectory("bob")

        // Bob meets the real Ann.
        do {
            let (ann, bob) = try await Self.meet(("Ann", TestHost.temporaryDirectory("ann")), ("Bob", bobHome), service: service)
            // The note comes with the join, on stderr: read as it arrives, not at once.
            let note = try await bob.waitForStderrLine(containing: "new peer Ann", timeout: .seconds(10))
            #expect(note.contains("new peer Ann: id "), "\(note)")
            try await Self.finish(ann, bob)
        }

        // Another "Ann" (a new identity) turns up.
        let (impostor, bob) = try await Self.meet(("Ann", TestHost.temporaryDirectory("ann2")), ("Bob", bobHome), service: service)
        let warning = try await bob.waitForStderrLine(containing: "WARNING", timeout: .seconds(10))
        #expect(warning.contains("Ann arrived with a key you have not seen before"), "\(warning)")
        #expect(!impostor.stderr.contains("WARNING"), "the newcomer never met Bob: nothing to warn about\n\(impostor.stderr)")
        // From the warning on, the newcomer's lines carry its id: "Ann" alone is not enough.
        let id = try #require(warning.components(separatedBy: "(id ").dropFirst().first?.prefix { $0 != "-" })
        impostor.type("it is me, Ann\n")
        _ = try await bob.waitForLine(containing: "Ann [\(id)]: it is me, Ann", timeout: .seconds(10))
        #expect(!bob.stdoutLines.contains("Ann: it is me, Ann"), "\(bob.stdout)")
        try await Self.finish(impostor, bob)
    }
}
