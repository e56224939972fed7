import Foundation
import PeerLink
import Testing

/// `peerlink chat` processes against the real avahi-daemon, driven through their standard input
/// and output as a script would (not a terminal: one line in is one message).
@Suite("peerlink chat", .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct ChatTests {
    static func chat(_ name: String, service: String, _ extra: [String] = []) throws -> ChildProcess {
        try ChildProcess.peerlink(["chat", "--name", name, "--service", service] + extra, withInput: true)
    }

    static func joinedLines(_ process: ChildProcess) -> [String] {
        process.stdoutLines.filter { $0.hasPrefix("* ") && $0.hasSuffix(" joined") }
    }

    /// Waits until `process` has printed `count` join lines.
    static func waitForJoins(_ process: ChildProcess, _ count: Int, timeout: Duration) async throws {
        let deadline = ContinuousClock.now + timeout
        while joinedLines(process).count < count {
            guard ContinuousClock.now < deadline else {
                throw HarnessError("\(process.command): \(joinedLines(process).count) of \(count) joins within \(timeout).\nstdout:\n\(process.stdout)\nstderr:\n\(process.stderr)")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    @Test("two chats exchange messages in order both ways, and leaving is seen", .timeLimit(.minutes(2)))
    func twoPeers() async throws {
        let service = TestHost.uniqueServiceType("c")
        let ann = try Self.chat("Ann", service: service)
        let bob = try Self.chat("Bob", service: service)
        try await ann.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
        try await bob.waitForLine(containing: "* Ann joined", timeout: .seconds(30))
        for index in 1...5 { ann.type("from Ann \(index)\n") }
        for index in 1...5 { bob.type("from Bob \(index)\n") }
        try await bob.waitForLine(containing: "Ann: from Ann 5")
        try await ann.waitForLine(containing: "Bob: from Bob 5")
        #expect(bob.stdoutLines.filter { $0.hasPrefix("Ann: ") } == (1...5).map { "Ann: from Ann \($0)" })
        #expect(ann.stdoutLines.filter { $0.hasPrefix("Bob: ") } == (1...5).map { "Bob: from Bob \($0)" })
        ann.type("/quit\n")
        #expect(try await ann.waitForExit() == 0)
        try await bob.waitForLine(containing: "* Ann left", timeout: .seconds(15))
        bob.closeInput()
        #expect(try await bob.waitForExit() == 0)
    }

    /// A chat killed by the signal is a lost link: its peers dial it again ("could not reach
    /// Ann ... is the peer still running?") for their reconnect grace. Handled, it says goodbye.
    @Test("Ctrl-C (SIGINT) and SIGTERM leave as /quit does: exit 0, peers see the leave and dial nobody", .timeLimit(.minutes(2)))
    func signalsLeave() async throws {
        let service = TestHost.uniqueServiceType("c")
        let bob = try Self.chat("Bob", service: service)
        defer { bob.terminate() }
        for (name, number) in [("Ann", SIGINT), ("Cid", SIGTERM)] {
            let peer = try Self.chat(name, service: service)
            defer { peer.terminate() }
            try await bob.waitForLine(containing: "* \(name) joined", timeout: .seconds(30))
            try await peer.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
            peer.type("bye from \(name)\n")
            try await bob.waitForLine(containing: "\(name): bye from \(name)")
            peer.signal(number)
            #expect(try await peer.waitForExit(timeout: .seconds(15)) == 0, "stderr: \(peer.stderr)")
            #expect(peer.stderr.contains(number == SIGINT ? "interrupted: leaving" : "terminated: leaving"))
            try await bob.waitForLine(containing: "* \(name) left", timeout: .seconds(10))
            // A lost link would be dialled again at once, and every 2 s.
            try await Task.sleep(for: .seconds(3))
            #expect(!bob.stderr.contains("could not reach \(name)"), "Bob's stderr:\n\(bob.stderr)")
        }
        bob.closeInput()
        #expect(try await bob.waitForExit() == 0)
    }

    @Test("lines read before anybody joined are sent at the end of input, then chat exits 0", .timeLimit(.minutes(2)))
    func scriptFlushesAtEndOfInput() async throws {
        let service = TestHost.uniqueServiceType("c")
        let writer = try Self.chat("Writer", service: service)
        for index in 1...3 { writer.type("line \(index)\n") }
        writer.closeInput()
        let reader = try Self.chat("Reader", service: service)
        try await reader.waitForLine(containing: "Writer: line 3", timeout: .seconds(30))
        #expect(reader.stdoutLines.filter { $0.hasPrefix("Writer: ") } == ["Writer: line 1", "Writer: line 2", "Writer: line 3"])
        #expect(try await writer.waitForExit() == 0)
        reader.closeInput()
        #expect(try await reader.waitForExit() == 0)
    }

    @Test("a peer killed with SIGKILL is seen leaving within 10 s; the others go on", .timeLimit(.minutes(2)))
    func killedPeerLeaves() async throws {
        let service = TestHost.uniqueServiceType("c")
        let peers = try ["Ann", "Bob", "Cid"].map { try Self.chat($0, service: service) }
        for peer in peers { try await Self.waitForJoins(peer, 2, timeout: .seconds(40)) }
        let killedAt = ContinuousClock.now
        peers[2].signal(SIGKILL)
        for peer in peers[0...1] {
            try await peer.waitForLine(containing: "* Cid left", timeout: .seconds(12))
        }
        #expect(ContinuousClock.now - killedAt <= .seconds(10))
        peers[0].type("still here\n")
        try await peers[1].waitForLine(containing: "Ann: still here")
        for peer in peers[0...1] {
            peer.closeInput()
            #expect(try await peer.waitForExit() == 0)
        }
    }

    @Test("encryption required on one side and refused on the other: both are told, nobody joins", .timeLimit(.minutes(2)))
    func encryptionRefused() async throws {
        let service = TestHost.uniqueServiceType("c")
        let strict = try Self.chat("Strict", service: service, ["--encryption", "required"])
        let plain = try Self.chat("Plain", service: service, ["--encryption", "none"])
        try await strict.waitForStderrLine(containing: "encrypt", timeout: .seconds(30))
        try await plain.waitForStderrLine(containing: "encrypt", timeout: .seconds(30))
        #expect(Self.joinedLines(strict).isEmpty)
        #expect(Self.joinedLines(plain).isEmpty)
        strict.closeInput()
        plain.closeInput()
        _ = try await strict.waitForExit()
        _ = try await plain.waitForExit()
    }

    @Test("eight chats started at once all reach 7 peers and stay connected for 30 s", .timeLimit(.minutes(3)))
    func eightPeerMesh() async throws {
        let service = TestHost.uniqueServiceType("c")
        let names = (1...8).map { "Peer\($0)" }
        let peers = try names.map { try Self.chat($0, service: service) }
        for peer in peers { try await Self.waitForJoins(peer, 7, timeout: .seconds(90)) }
        try await Task.sleep(for: .seconds(30))
        for (name, peer) in zip(names, peers) {
            let left = peer.stdoutLines.filter { $0.hasSuffix(" left") }
            #expect(left.isEmpty, "\(name) saw peers leave: \(left)")
            #expect(Self.joinedLines(peer).count == 7, "\(name): \(Self.joinedLines(peer))")
        }
        peers[0].type("hello mesh\n")
        for peer in peers.dropFirst() {
            try await peer.waitForLine(containing: "Peer1: hello mesh", timeout: .seconds(15))
        }
        for peer in peers { peer.closeInput() }
        for peer in peers { #expect(try await peer.waitForExit() == 0) }
    }
}
