import Foundation
import PeerLink
import Testing

/// The programs in Examples/, run as a user would (two copies, each with its own identity),
/// against the real avahi-daemon: they must keep doing what their READMEs show.
@Suite("Examples", .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct ExamplesTests {
    /// Starts `peerlink-example-NAME` with its own identity (a fresh XDG_CONFIG_HOME).
    static func example(_ name: String, _ arguments: [String], withInput: Bool = false) throws -> ChildProcess {
        try ChildProcess(
            TestHost.productsDirectory.appendingPathComponent("peerlink-example-\(name)").path, arguments,
            environment: ["XDG_CONFIG_HOME": TestHost.temporaryDirectory("example")], withInput: withInput)
    }

    @Test("Counter: a press on one side raises the other side's counter, and both sides see it", .timeLimit(.minutes(2)))
    func counter() async throws {
        let service = TestHost.uniqueServiceType("x")
        let ann = try Self.example("counter", ["--name", "Ann", "--service", service], withInput: true)
        let bob = try Self.example("counter", ["--name", "Bob", "--service", service], withInput: true)
        defer {
            ann.terminate()
            bob.terminate()
        }
        try await ann.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
        try await bob.waitForLine(containing: "* Ann joined", timeout: .seconds(30))

        ann.type("\n")
        try await bob.waitForLine(containing: "+ Ann pressed: my counter is 1")
        try await ann.waitForLine(containing: "= Bob's counter is 1 (mine is 0)")

        bob.type("+\n+\n")
        try await ann.waitForLine(containing: "+ Bob pressed: my counter is 2")
        try await bob.waitForLine(containing: "= Ann's counter is 2 (mine is 1)")
        #expect(!bob.stdoutLines.contains { $0.contains("my counter is 2") }, "Bob's own presses raised his counter:\n\(bob.stdout)")

        ann.type("quit\n")
        #expect(try await ann.waitForExit() == 0)
        try await bob.waitForLine(containing: "* Ann left")
        bob.closeInput()
        #expect(try await bob.waitForExit() == 0)
    }

    @Test("AutoMesh: two copies join each other without input, hear each other's heartbeat, and leave on SIGTERM", .timeLimit(.minutes(2)))
    func autoMesh() async throws {
        let service = TestHost.uniqueServiceType("m")
        let ann = try Self.example("automesh", ["--name", "Ann", "--service", service, "--interval", "0.5"])
        let bob = try Self.example("automesh", ["--name", "Bob", "--service", service, "--interval", "0.5"])
        defer {
            ann.terminate()
            bob.terminate()
        }
        try await ann.waitForLine(containing: "* Bob joined", timeout: .seconds(30))
        try await bob.waitForLine(containing: "* Ann joined", timeout: .seconds(30))
        #expect(ann.stdoutLines.contains { $0.hasSuffix("2 members: Ann (me), Bob") }, "\(ann.stdout)")
        try await ann.waitForLine(containing: "Bob: Bob is here")
        try await bob.waitForLine(containing: "Ann: Ann is here")

        ann.signal(SIGTERM)
        #expect(try await ann.waitForExit() == 0)
        try await bob.waitForLine(containing: "* Ann left; 1 member: Bob (me)")
        bob.signal(SIGINT)
        #expect(try await bob.waitForExit() == 0)
    }

    @Test("BrowseChat: browse, invite, accept, chat, end the chat, browse again", .timeLimit(.minutes(2)))
    func browseChat() async throws {
        let service = TestHost.uniqueServiceType("b")
        let ann = try Self.example("browsechat", ["--name", "Ann", "--service", service], withInput: true)
        let bob = try Self.example("browsechat", ["--name", "Bob", "--service", service], withInput: true)
        defer {
            ann.terminate()
            bob.terminate()
        }
        try await ann.waitForLine(containing: "+ [1] Bob ", timeout: .seconds(30))
        try await Self.invite(from: ann, "Ann", to: bob, "Bob")
        bob.type("y\n")
        try await ann.waitForLine(containing: "* Bob joined the chat", timeout: .seconds(15))
        try await bob.waitForLine(containing: "* Ann joined the chat", timeout: .seconds(15))

        ann.type("hello Bob\n")
        try await bob.waitForLine(containing: "Ann: hello Bob")
        bob.type("hi Ann\n")
        try await ann.waitForLine(containing: "Bob: hi Ann")

        ann.type("end\n")
        try await ann.waitForLine(containing: "chat ended; back to browsing")
        try await bob.waitForLine(containing: "* Ann left the chat")

        // Ann's new session can be invited again; she declines this time. It listens at a new
        // port: until Bob's discovery has seen it, his invitation fails ("nothing listens"), and
        // he invites again, as a person would.
        try await Self.invite(from: bob, "Bob", to: ann, "Ann")
        ann.type("n\n")
        try await bob.waitForLine(containing: "Ann did not join: declined")

        ann.type("quit\n")
        #expect(try await ann.waitForExit() == 0)
        bob.closeInput()
        #expect(try await bob.waitForExit() == 0)
    }

    @Test("MPCChat: Bob's browser finds Ann and invites her, her advertiser accepts, messages both ways over the LAN", .timeLimit(.minutes(2)))
    func mpcChat() async throws {
        let service = TestHost.uniqueServiceType("p")
        let ann = try Self.example("mpcchat", ["--name", "Ann", "--service", service], withInput: true)
        let bob = try Self.example("mpcchat", ["--name", "Bob", "--service", service, "--invite", "Ann"], withInput: true)
        defer {
            ann.terminate()
            bob.terminate()
        }
        try await bob.waitForLine(containing: "+ Ann found", timeout: .seconds(30))
        try await bob.waitForLine(containing: "* Ann connected", timeout: .seconds(30))
        try await ann.waitForLine(containing: "* Bob connected", timeout: .seconds(15))
        ann.type("hello Bob\n")
        bob.type("hi Ann\n")
        try await bob.waitForLine(containing: "Ann: hello Bob")
        try await ann.waitForLine(containing: "Bob: hi Ann")
        bob.closeInput()
        #expect(try await bob.waitForExit() == 0)
        try await ann.waitForLine(containing: "* Bob not connected", timeout: .seconds(15))
        ann.closeInput()
        #expect(try await ann.waitForExit() == 0)
    }

    /// Types `invite 1` into `inviter` until `invitee` shows the invitation prompt. An invitation
    /// that fails (the invitee's advertisement is not resolved yet, or names a port its previous
    /// session listened at) is sent again after half a second, as a person would; each try waits
    /// up to 15 s. A failure shows both transcripts.
    static func invite(from inviter: ChildProcess, _ inviterName: String, to invitee: ChildProcess, _ inviteeName: String) async throws {
        let inviteeBefore = invitee.stdoutLines.count
        for _ in 1...10 {
            let inviterBefore = inviter.stdoutLines.count
            inviter.type("invite 1\n")
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline {
                if invitee.stdoutLines.dropFirst(inviteeBefore).contains(where: { $0.hasPrefix("\(inviterName) (id ") && $0.hasSuffix("accept? [y/n]") }) {
                    return
                }
                if inviter.stdoutLines.dropFirst(inviterBefore).contains(where: { $0.hasPrefix("\(inviteeName) did not join: failed") || $0.hasPrefix("cannot invite") || $0.hasPrefix("nobody is") }) {
                    break
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        throw HarnessError("""
            \(inviteeName) never got \(inviterName)'s invitation.
            \(inviterName) stdout:
            \(inviter.stdout)
            \(inviterName) stderr:
            \(inviter.stderr)
            \(inviteeName) stdout:
            \(invitee.stdout)
            \(inviteeName) stderr:
            \(invitee.stderr)
            """)
    }
}
