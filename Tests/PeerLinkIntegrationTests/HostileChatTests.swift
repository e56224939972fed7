import Foundation
import PeerLink
import PeerLinkTestSupport
import Testing

/// `peerlink chat --accept-all` attacked from loopback as in issue 11: connections from many
/// addresses, held in their handshake or completed with throwaway keys, at a lowered descriptor
/// limit. Bounded in count and time; loopback only.
@Suite("peerlink chat under attack", .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct HostileChatTests {
    /// The victim's descriptor limit, soft and hard (so raising it at start cannot escape it).
    static let descriptorLimit = 128

    /// Descriptors open in process `pid`, or nil once it is gone.
    static func openDescriptors(_ pid: pid_t) -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count
    }

    /// The victim's TCP endpoint, as a scan finds it.
    static func port(of name: String, service: String) async throws -> UInt16 {
        let peers = try await scanUntil(service: service, within: .seconds(30)) { $0.contains { $0.name == name } }
        for peer in peers where peer.name == name {
            for endpoint in peer.endpoints where endpoint.transport == "tcp" { return UInt16(endpoint.port) }
        }
        throw HarnessError("no TCP endpoint for \(name) in \(peers)")
    }

    @Test(
        "descriptor exhaustion at a lowered limit: the victim survives, keeps accepting, an honest peer chats through the attack, descriptors stay under the limit",
        .timeLimit(.minutes(3)))
    func descriptorExhaustion() async throws {
        let prlimit = try #require(TestHost.which("prlimit"), "prlimit (util-linux) is needed")
        let service = TestHost.uniqueServiceType("h")
        let serviceType = try ServiceType(service)
        let configHome = TestHost.temporaryDirectory()
        let victim = try ChildProcess(
            prlimit,
            ["--nofile=\(Self.descriptorLimit):\(Self.descriptorLimit)", "--", TestHost.peerlinkBinary, "chat", "--name", "Victim", "--service", service, "--accept-all"],
            environment: ["XDG_CONFIG_HOME": configHome], withInput: true)
        defer { victim.terminate() }
        try await victim.waitForStderrLine(containing: "Chatting as Victim", timeout: .seconds(30))
        let port = try await Self.port(of: "Victim", service: service)
        let baseline = try #require(Self.openDescriptors(victim.pid))
        let residentBefore = try #require(Self.peakResident(victim.pid))

        final class Tally: Sendable {
            let sockets = Locked<[AttackerSocket]>([])
            let failures = Locked(0)
            let highest = Locked(0)
        }
        let tally = Tally()
        let attackEnds = ContinuousClock.now + .seconds(25)
        let honest: ChildProcess
        do {
            honest = try await withThrowingTaskGroup(of: ChildProcess?.self) { group in
                // Four attackers, each cycling through 15 addresses of its own: two of three
                // connections held in their handshake, one completed with a throwaway key and
                // then left idle. At most 3000 connections in all.
                for attacker in 0..<4 {
                    group.addTask {
                        var count = 0
                        while ContinuousClock.now < attackEnds, count < 750 {
                            let source = "127.0.0.\(2 + attacker * 15 + count % 15)"
                            let attack: Attack = count % 3 == 2 ? .throwawayKey(hello: nil) : .slowLoris
                            do {
                                let socket = try await Attack.launch(attack, port: port, from: source, service: serviceType)
                                tally.sockets.withLock { $0.append(socket) }
                            } catch {
                                tally.failures.withLock { $0 += 1 }
                            }
                            count += 1
                            try await Task.sleep(for: .milliseconds(20))
                        }
                        return nil
                    }
                }
                // The victim's descriptors, every 50 ms.
                group.addTask {
                    while ContinuousClock.now < attackEnds + .seconds(2) {
                        guard let open = Self.openDescriptors(victim.pid) else { break }
                        tally.highest.withLock { $0 = max($0, open) }
                        try await Task.sleep(for: .milliseconds(50))
                    }
                    return nil
                }
                // While the attack runs, an honest peer joins and they talk.
                group.addTask {
                    try await Task.sleep(for: .seconds(5))
                    let honest = try ChildProcess.peerlink(["chat", "--name", "Honest", "--service", service], withInput: true)
                    try await honest.waitForLine(containing: "* Victim joined", timeout: .seconds(60))
                    try await victim.waitForLine(containing: "* Honest joined", timeout: .seconds(30))
                    honest.type("hello through the flood\n")
                    try await victim.waitForLine(containing: "Honest: hello through the flood", timeout: .seconds(30))
                    victim.type("and back\n")
                    try await honest.waitForLine(containing: "Victim: and back", timeout: .seconds(30))
                    #expect(ContinuousClock.now < attackEnds, "the honest exchange ended after the attack; it proves nothing")
                    return honest
                }
                var honest: ChildProcess?
                for try await result in group { if let result { honest = result } }
                return try #require(honest)
            }
        } catch {
            Issue.record("victim stderr:\n\(victim.stderr.suffix(4000))")
            throw error
        }
        defer { honest.terminate() }

        let attempts = tally.sockets.withLock { $0.count }
        let highest = tally.highest.withLock { $0 }
        #expect(victim.isRunning, "the victim died: exit status \(victim.terminationStatus ?? 0)\n\(victim.stderr.suffix(4000))")
        #expect(highest < Self.descriptorLimit, "the victim reached \(highest) descriptors of \(Self.descriptorLimit)")
        #expect(attempts > 500, "only \(attempts) attacking connections got through to the victim")
        #expect(!victim.stderr.contains("no longer accepting"), "\(victim.stderr.suffix(2000))")
        // Memory: the links in their handshake are capped and each holds at most a record's
        // buffer, so thousands of connections cost the victim a bounded few MiB.
        if let peak = Self.peakResident(victim.pid) {
            print("descriptor exhaustion: the victim's peak memory grew by \(peak - residentBefore) bytes")
            #expect(peak - residentBefore < 32 << 20, "the victim's peak memory grew by \(peak - residentBefore) bytes during the attack")
        }

        // Once the attackers are gone, descriptors come back down and new links are accepted.
        for socket in tally.sockets.withLock({ $0 }) { socket.close() }
        let settled = ContinuousClock.now + .seconds(20)
        while let open = Self.openDescriptors(victim.pid), open > baseline + 8, ContinuousClock.now < settled {
            try await Task.sleep(for: .milliseconds(200))
        }
        let after = try #require(Self.openDescriptors(victim.pid))
        #expect(after <= baseline + 8, "\(after) descriptors open after the attack; \(baseline) before")
        let probe = try await AttackerSocket.connect(to: port)
        defer { probe.close() }
        await probe.write(try LinkPreface(encryption: .optional, service: serviceType).encoded())
        let (answer, _) = await probe.readToEnd(timeout: .seconds(5), limit: 4)
        #expect(Array(answer.prefix(4)) == WireFormat.magic, "the victim no longer answers new links")
        honest.type("still here\n")
        try await victim.waitForLine(containing: "Honest: still here", timeout: .seconds(30))

        victim.type("/quit\n")
        #expect(try await victim.waitForExit() == 0, "\(victim.stderr.suffix(2000))")
        print("descriptor exhaustion: \(attempts) attacking connections, \(tally.failures.withLock { $0 }) failed to connect; victim descriptors: \(baseline) before, at most \(highest) (limit \(Self.descriptorLimit)), \(after) after")
    }

    /// The victim's peak resident memory (VmHWM) in bytes, or nil once it is gone.
    static func peakResident(_ pid: pid_t) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return line.split(separator: " ").dropFirst().first.flatMap { Int($0) }.map { $0 * 1024 }
        }
        return nil
    }

    @Test(
        "a member sending five 16 MiB messages does not hold up an honest line, and the victim prints a bounded part of each",
        .timeLimit(.minutes(3)))
    func largeMessages() async throws {
        let service = TestHost.uniqueServiceType("m")
        let configHome = TestHost.temporaryDirectory()
        let victim = try ChildProcess.peerlink(
            ["chat", "--name", "Victim", "--service", service, "--accept-all"], configHome: configHome, withInput: true)
        defer { victim.terminate() }
        try await victim.waitForStderrLine(containing: "Chatting as Victim", timeout: .seconds(30))
        let honest = try ChildProcess.peerlink(["chat", "--name", "Honest", "--service", service], withInput: true)
        defer { honest.terminate() }
        try await victim.waitForLine(containing: "* Honest joined", timeout: .seconds(60))
        let baseline = try #require(Self.peakResident(victim.pid))

        // The attacker: a peer that joins like any other and types five lines of 16 MiB (less
        // the newline), as a modified client would send them.
        let mallory = try ChildProcess.peerlink(["chat", "--name", "Mallory", "--service", service], withInput: true)
        defer { mallory.terminate() }
        try await victim.waitForLine(containing: "* Mallory joined", timeout: .seconds(60))
        try await mallory.waitForLine(containing: "* Honest joined", timeout: .seconds(60))
        let big = String(repeating: "A", count: WireFormat.maxMessageLength - 1) + "\n"
        for _ in 0..<5 { mallory.type(big) }
        // once the first has arrived, the honest peer speaks while the others are on their way
        try await victim.waitForLine(timeout: .seconds(60)) { $0.hasPrefix("Mallory: AAAA") }
        let started = ContinuousClock.now
        honest.type("an honest line\n")
        try await victim.waitForLine(containing: "Honest: an honest line", timeout: .seconds(60))
        let took = ContinuousClock.now - started
        // every big message is shown cut, and said to be cut
        var shown = 0
        for _ in 0..<60 where shown < 5 {
            shown = victim.stdoutLines.filter { $0.hasPrefix("Mallory: AAAA") && $0.contains("more bytes not shown") }.count
            if shown < 5 { try await Task.sleep(for: .milliseconds(500)) }
        }
        #expect(shown == 5, "\(shown) of 5 large messages shown")
        #expect(victim.stdoutLines.allSatisfy { $0.utf8.count <= ChatLimits.shownBytes + 200 }, "a line longer than the chat shows")
        let peak = try #require(Self.peakResident(victim.pid))
        // five 16 MiB messages arrive one after another: each is held while it is reassembled,
        // taken and printed; nothing piles up
        #expect(peak - baseline < 160 << 20, "the victim's peak memory grew by \(peak - baseline) bytes")
        #expect(victim.isRunning)
        print("large messages: the honest line arrived \(took) after it was typed, among 80 MiB from the attacker; victim peak memory \(baseline >> 20) MiB before, \(peak >> 20) MiB after")
        victim.type("/quit\n")
        #expect(try await victim.waitForExit() == 0, "\(victim.stderr.suffix(2000))")
    }

    /// What `peerlink chat` shows of one message (as in its ChatConsole).
    enum ChatLimits {
        static let shownBytes = 16 << 10
    }
}
