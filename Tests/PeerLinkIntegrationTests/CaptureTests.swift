import Foundation
import PeerLink
import Testing

/// Why a capture cannot be taken here, or nil.
private let captureMissing: String? = {
    if !TestHost.isRoot { return "capturing on lo needs root" }
    if TestHost.which("tcpdump") == nil { return "tcpdump is not installed (Hardware/setup.sh --tests installs it)" }
    if TestHost.which("timeout") == nil { return "timeout (coreutils) is not installed" }
    return nil
}()

/// Runs in CI (fails there when tcpdump is missing), and wherever tcpdump can run.
private let captureEnabled = captureMissing == nil || TestHost.daemonsRequired
private let captureReason: Comment = "no packet capture here: \(captureMissing ?? "?")"

/// What goes over the wire between two `peerlink chat`s on lo, captured with tcpdump: with
/// `--encryption required` the messages never appear in it; with `--encryption none` they do
/// (the control run, which proves the check can fail).
@Suite(
    "encryption on the wire: a tcpdump capture of two chats",
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"),
    .enabled(if: captureEnabled, captureReason))
struct CaptureTests {
    /// What one run captured, and the messages sent in it.
    struct Capture {
        var bytes: [UInt8]
        var secrets: [String]
        /// The `/peers` line each side printed about the other.
        var peerLines: [String]
        /// The port captured, and what tcpdump said: for failure messages.
        var port: Int
        var tcpdumpOutput: String

        var summary: String {
            "\(bytes.count) bytes captured on port \(port); /peers:\n\(peerLines.joined(separator: "\n"))\ntcpdump:\n\(tcpdumpOutput)"
        }
    }

    static func contains(_ haystack: [UInt8], _ needle: some StringProtocol) -> Bool {
        let pattern = Array(needle.utf8)
        guard !pattern.isEmpty, haystack.count >= pattern.count else { return false }
        for start in 0...(haystack.count - pattern.count) where haystack[start] == pattern[0] {
            if haystack[start..<(start + pattern.count)].elementsEqual(pattern) { return true }
        }
        return false
    }

    static func randomSecret() -> String {
        "secret-" + String((0..<20).map { _ in Array("abcdefghijklmnopqrstuvwxyz0123456789").randomElement()! })
    }

    /// Two chats with `encryption` on lo, one secret each way, everything on the listening
    /// chat's port captured from before the first byte to after the last.
    ///
    /// Only the peer with the smaller fingerprint invites (automatic mode), so the identities are
    /// made first and the one with the greater fingerprint listens: the only session link is
    /// dialled to its port, which is learnt with `peerlink scan` before the other chat starts.
    static func capture(encryption: String) async throws -> Capture {
        let service = TestHost.uniqueServiceType("e")
        let homes = (0..<2).map { _ in TestHost.temporaryDirectory("capture") }
        let fingerprints = try homes.map { try IdentityStore.loadOrCreate(at: $0 + "/peerlink/identity.json").identity.fingerprint }
        let (listenerHome, dialerHome) = fingerprints[0] > fingerprints[1] ? (homes[0], homes[1]) : (homes[1], homes[0])
        let options = ["--encryption", encryption]

        let listener = try ChildProcess.peerlink(
            ["chat", "--name", "Listener", "--service", service] + options, configHome: listenerHome, withInput: true)
        defer { listener.terminate() }
        let found = try await scanUntil(service: service) { $0.contains { $0.name == "Listener" } }
        let port = try #require(found.first { $0.name == "Listener" }?.endpoints.first { $0.transport == "tcp" }?.port)

        let file = TestHost.temporaryDirectory("pcap") + "/chat.pcap"
        // Bounded by timeout(1) even if this test dies; -Z root: root writes the file, in a
        // directory only root may write to; --immediate-mode: packets reach tcpdump as they come
        // (not a ring buffer block later: a SIGINT would drop what still waits there); -U: each
        // packet is written to the file as it comes; -s 8192 -B 16384: in immediate mode every slot
        // of the kernel's ring is one snapshot long, so the default (256 KiB snapshots in a 2 MiB
        // ring: 8 slots) dropped packets whenever tcpdump waited for a CPU; a chat's packets are
        // far smaller than 8 KiB, and 16 MiB hold 2048 of them.
        let tcpdump = try ChildProcess(
            TestHost.which("timeout")!,
            [
                "-s", "INT", "90", TestHost.which("tcpdump")!, "-i", "lo", "-n", "--immediate-mode", "-U", "-s", "8192", "-B", "16384", "-Z", "root", "-w", file,
                "tcp port \(port)",
            ])
        defer { tcpdump.terminate() }
        try await tcpdump.waitForStderrLine(containing: "listening on lo", timeout: .seconds(15))

        let dialer = try ChildProcess.peerlink(
            ["chat", "--name", "Dialer", "--service", service] + options, configHome: dialerHome, withInput: true)
        defer { dialer.terminate() }
        try await listener.waitForLine(containing: "* Dialer joined", timeout: .seconds(30))
        try await dialer.waitForLine(containing: "* Listener joined", timeout: .seconds(30))

        let secrets = [randomSecret(), randomSecret()]
        listener.type(secrets[0] + "\n")
        try await dialer.waitForLine(containing: "Listener: \(secrets[0])")
        dialer.type(secrets[1] + "\n")
        try await listener.waitForLine(containing: "Dialer: \(secrets[1])")
        listener.type("/peers\n")
        dialer.type("/peers\n")
        let peerLines = [
            try await listener.waitForStderrLine(containing: "  Dialer  "), try await dialer.waitForStderrLine(containing: "  Listener  "),
        ]

        for chat in [listener, dialer] { chat.closeInput() }
        for chat in [listener, dialer] { #expect(try await chat.waitForExit() == 0, "\(chat.command)\nstderr:\n\(chat.stderr)") }
        // The last packets (the chats' goodbyes) a moment to reach tcpdump.
        try await Task.sleep(for: .milliseconds(500))
        tcpdump.signal(SIGINT)
        let status = try await tcpdump.waitForExit(timeout: .seconds(10))
        #expect(status == 0, "tcpdump exited \(status):\n\(tcpdump.stderr)")
        #expect(tcpdump.stderrLines.contains("0 packets dropped by kernel"), "\(tcpdump.stderr)")
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: file)))
        return Capture(bytes: bytes, secrets: secrets, peerLines: peerLines, port: port, tcpdumpOutput: tcpdump.stderr)
    }

    @Test("with --encryption required the capture holds the session's traffic but none of the message bytes", .timeLimit(.minutes(2)))
    func requiredHidesMessages() async throws {
        let capture = try await Self.capture(encryption: "required")
        // A pcap file header is 24 bytes; packets follow.
        #expect(capture.bytes.count > 24 + 1000, "the capture is (nearly) empty: \(capture.summary)")
        #expect(Self.contains(capture.bytes, "PLNK"), "the link preface is missing: the capture did not see the session: \(capture.summary)")
        for secret in capture.secrets {
            #expect(!Self.contains(capture.bytes, secret), "\(secret) is readable in the capture")
        }
        for line in capture.peerLines {
            #expect(line.contains("encrypted") && !line.contains("NOT encrypted"), "\(line)")
        }
    }

    @Test("control: with --encryption none the same capture shows both messages in clear", .timeLimit(.minutes(2)))
    func noneShowsMessages() async throws {
        let capture = try await Self.capture(encryption: "none")
        #expect(Self.contains(capture.bytes, "PLNK"), "the link preface is missing: the capture did not see the session: \(capture.summary)")
        for secret in capture.secrets {
            #expect(Self.contains(capture.bytes, secret), "\(secret) is not in the unencrypted capture: \(capture.summary)")
        }
        for line in capture.peerLines {
            #expect(line.contains("NOT encrypted"), "\(line)")
        }
    }
}
