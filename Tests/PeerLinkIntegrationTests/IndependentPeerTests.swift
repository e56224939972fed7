import Foundation
import PeerLink
import Testing

/// `peerlink chat` against a peer written in Python from the articles alone
/// (Tests/Interop/independent_peer.py, no code shared): the preface, the Noise handshake in both
/// roles, records and frames, invitations, and a pair carried over to a new link with nothing
/// lost. When an article and the code disagree, one of these fails.
@Suite(
    "interoperability with an independent implementation of the wire format",
    .enabled(if: TestHost.pythonHasNoise || TestHost.daemonsRequired, "\(TestHost.python) cannot import noise (Hardware/setup.sh --tests provides one that can)"))
struct IndependentPeerTests {
    static var script: String? { TestHost.repositoryRoot.map { $0 + "/Tests/Interop/independent_peer.py" } }

    /// Starts the independent peer with `arguments`.
    static func start(_ arguments: [String]) throws -> ChildProcess {
        let python = try #require(TestHost.pythonPath, "\(TestHost.python) not found")
        #expect(TestHost.pythonHasNoise, "\(python) cannot import noise and cryptography")
        let script = try #require(script, "the repository (Tests/Interop) is not next to this build")
        return try ChildProcess(python, ["-u", script] + arguments)
    }

    /// Starts the independent peer listening on a free loopback port; returns it and the port.
    static func listening(_ arguments: [String]) async throws -> (ChildProcess, String) {
        let peer = try start(["--listen", "127.0.0.1:0"] + arguments)
        let line = try await peer.waitForLine(containing: "listening on 127.0.0.1:", timeout: .seconds(20))
        let port = String(line.split(separator: ":").last ?? "")
        try #require(!port.isEmpty && port.allSatisfy(\.isNumber), "\(line)")
        return (peer, port)
    }

    /// `peerlink chat --name Swift` on the LAN (advertised, so avahi-daemon must run), and the
    /// TCP port it says it listens on.
    static func chatListening(service: String) async throws -> (ChildProcess, String) {
        let chat = try ChildProcess.peerlink(["chat", "--name", "Swift", "--service", service, "--transport", "lan"], withInput: true)
        let listening = try await chat.waitForStderrLine(containing: "Listening on tcp://", timeout: .seconds(30))
        let port = String((listening.split(separator: ":").last ?? "").prefix { $0.isNumber })
        if port.isEmpty { chat.terminate() }
        try #require(!port.isEmpty, "\(listening)")
        return (chat, port)
    }

    /// How many lines of `process`'s standard output contain `text`.
    static func count(_ text: String, in lines: [String]) -> Int { lines.count { $0.contains(text) } }

    @Test(
        "chat dials it: encrypted handshake as initiator, invitation, lines both ways, GO_AWAY 0 seen as a leave",
        .timeLimit(.minutes(1)), arguments: ["required", "none"])
    func chatDialsIt(encryption: String) async throws {
        let service = TestHost.uniqueServiceType("i")
        let (peer, port) = try await Self.listening([
            "--name", "Indie", "--service", service, "--encryption", encryption, "--reply",
            "--say", "hello from an independent peer", "--linger", "3", "--max-time", "30",
        ])
        defer { peer.terminate() }
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "Swift", "--service", service, "--encryption", encryption, "--transport", "lan", "--connect", "tcp://127.0.0.1:\(port)"],
            withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForLine(containing: "* Indie joined", timeout: .seconds(20))
        chat.type("hello from swift\n")
        _ = try await chat.waitForLine(containing: "Indie: echo: hello from swift", timeout: .seconds(10))
        #expect(chat.stdoutLines.contains("Indie: hello from an independent peer"), "\(chat.stdout)")
        _ = try await chat.waitForLine(containing: "* Indie left", timeout: .seconds(15))
        #expect(try await peer.waitForExit(timeout: .seconds(15)) == 0, "\(peer.stdout)")
        #expect(!chat.stderr.contains("Indie left:"), "a goodbye needs no reason: \(chat.stderr)")
        #expect(peer.stdout.contains("encryption on this link: \(encryption == "none" ? "off" : "on")"), "\(peer.stdout)")
        #expect(Self.count("complete: b'hello from swift'", in: peer.stdoutLines) == 1, "\(peer.stdout)")
        #expect(!peer.stdout.contains("LINK ENDED"), "the link ended before GO_AWAY: \(peer.stdout)")
        chat.closeInput()
        #expect(try await chat.waitForExit() == 0, "\(chat.stderr)")
    }

    @Test(
        "it dials chat and invites: chat as the handshake's responder and as the invitee; automatic mode declines another session",
        .timeLimit(.minutes(1)),
        .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (chat without --connect needs it to advertise)"))
    func itDialsChat() async throws {
        let service = TestHost.uniqueServiceType("i")
        let (chat, port) = try await Self.chatListening(service: service)
        defer { chat.terminate() }
        // An invitation into a session of its own (a random id): chat, in automatic mode, declines it.
        let stranger = try Self.start([
            "--dial", "127.0.0.1:\(port)", "--name", "Stranger", "--service", service, "--invite", "--max-time", "2",
        ])
        defer { stranger.terminate() }
        _ = try await stranger.waitForLine(containing: "CONTROL ver=2 flags=0x0 stream=0 len=6 DECLINE id=1", timeout: .seconds(20))
        #expect(try await stranger.waitForExit(timeout: .seconds(15)) == 0, "\(stranger.stdout)")
        // An invitation into the service's automatic session (Sessions article): accepted.
        let peer = try Self.start([
            "--dial", "127.0.0.1:\(port)", "--name", "Indie", "--service", service, "--auto", "--invite",
            "--say", "first line from the dialler", "--linger", "4", "--max-time", "30",
        ])
        defer { peer.terminate() }
        _ = try await chat.waitForLine(containing: "* Indie joined", timeout: .seconds(20))
        _ = try await chat.waitForLine(containing: "Indie: first line from the dialler", timeout: .seconds(10))
        chat.type("answer from swift\n")
        _ = try await chat.waitForLine(containing: "* Indie left", timeout: .seconds(15))
        #expect(try await peer.waitForExit(timeout: .seconds(15)) == 0, "\(peer.stdout)")
        #expect(Self.count("complete: b'answer from swift'", in: peer.stdoutLines) == 1, "\(peer.stdout)")
        #expect(Self.count("CONTROL ver=2 flags=0x0 stream=0 len=5 ACCEPT id=1", in: peer.stdoutLines) == 1, "chat accepted the invitation: \(peer.stdout)")
        #expect(!chat.stdout.contains("Stranger"), "\(chat.stdout)")
    }

    @Test(
        "files both ways over the resource protocol: offer, credit beyond the first window, SHA-256 verdict",
        .timeLimit(.minutes(1)))
    func filesBothWays() async throws {
        let service = TestHost.uniqueServiceType("i")
        let source = TestHost.temporaryDirectory("indie-files")
        let inbox = TestHost.temporaryDirectory("chat-inbox")
        // Larger than a stream's first window (256 KiB) each way, so credit must come back.
        func file(_ name: String, size: Int, seed: UInt64) throws -> (String, Data) {
            var state = seed
            let bytes = (0..<size).map { _ -> UInt8 in
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                return UInt8(truncatingIfNeeded: state >> 33)
            }
            let path = source + "/" + name
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            return (path, Data(bytes))
        }
        let (fromIndie, indieBytes) = try file("from-indie.bin", size: 700_001, seed: 1)
        let (fromChat, _) = try file("from-chat.bin", size: 600_003, seed: 2)
        let (peer, port) = try await Self.listening([
            "--name", "Indie", "--service", service, "--act", "1:sendfile=\(fromIndie)", "--max-time", "40",
        ])
        defer { peer.terminate() }
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "Swift", "--service", service, "--transport", "lan", "--dir", inbox, "--connect", "tcp://127.0.0.1:\(port)"],
            withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForLine(containing: "* Indie joined", timeout: .seconds(20))
        let saved = try await chat.waitForLine(containing: "* saved ", timeout: .seconds(20))
        #expect(saved.contains("(from Indie, 700001 bytes, SHA-256 verified)"), "\(saved)")
        #expect(FileManager.default.contents(atPath: inbox + "/from-indie.bin") == indieBytes)
        _ = try await peer.waitForLine(containing: "FILE sent, verdict 0 (verified)", timeout: .seconds(10))
        #expect(peer.stdout.contains("FILE offered") == false, "\(peer.stdout)")

        chat.type("/send \(fromChat)\n")
        let received = try await peer.waitForLine(containing: "FILE received: ", timeout: .seconds(20))
        #expect(received.hasSuffix("FILE received: from-chat.bin 600003 bytes, SHA-256 verified"), "\(received)")
        #expect(peer.stdout.contains("FILE offered: from-chat.bin 600003 bytes, transfer id as derived"), "\(peer.stdout)")
        _ = try await chat.waitForLine(containing: "* from-chat.bin verified by Indie", timeout: .seconds(10))
        chat.closeInput()
        #expect(try await chat.waitForExit() == 0, "\(chat.stderr)")
        #expect(!peer.stdout.contains("GO_AWAY code=1"), "no protocol error: \(peer.stdout)")
    }

    @Test(
        "a peer that offers 60 files at once and sends none of them: 8 are taken, the rest declined, descriptors stay bounded",
        .timeLimit(.minutes(1)))
    func offersWithoutDataAreBounded() async throws {
        let service = TestHost.uniqueServiceType("i")
        let inbox = TestHost.temporaryDirectory("chat-inbox")
        let (peer, port) = try await Self.listening([
            "--name", "Hoarder", "--service", service, "--act", "1:offers=60:100000", "--act", "6:goaway=0", "--max-time", "30",
        ])
        defer { peer.terminate() }
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "Swift", "--service", service, "--transport", "lan", "--dir", inbox, "--connect", "tcp://127.0.0.1:\(port)"],
            withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForLine(containing: "* Hoarder joined", timeout: .seconds(20))
        let before = try #require(HostileChatTests.openDescriptors(chat.pid))
        _ = try await peer.waitForLine(containing: "=== 60 offers of 100000 bytes sent", timeout: .seconds(10))
        // Both answers are awaited: a decline goes out at once, an acceptance once its partial
        // file is open, so the last acceptance may come after the last decline.
        let deadline = ContinuousClock.now + .seconds(15)
        while Self.count("resource DECLINE", in: peer.stdoutLines) < 60 - FileReceiver.maxTransfersPerPeer
            || Self.count("resource ACCEPT", in: peer.stdoutLines) < FileReceiver.maxTransfersPerPeer,
            ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(Self.count("resource DECLINE", in: peer.stdoutLines) == 60 - FileReceiver.maxTransfersPerPeer, "\(peer.stdout)")
        #expect(Self.count("resource ACCEPT", in: peer.stdoutLines) == FileReceiver.maxTransfersPerPeer, "\(peer.stdout)")
        #expect(peer.stdout.contains("at most \(FileReceiver.maxTransfersPerPeer) files from one peer at a time"), "\(peer.stdout)")
        let during = try #require(HostileChatTests.openDescriptors(chat.pid))
        #expect(during <= before + FileReceiver.maxTransfersPerPeer + 4, "descriptors: \(before) before, \(during) during")
        let partial = try FileManager.default.contentsOfDirectory(atPath: inbox).filter { $0.hasSuffix(".part") }
        #expect(partial.count == FileReceiver.maxTransfersPerPeer, "\(partial)")
        _ = try await chat.waitForLine(containing: "* Hoarder left", timeout: .seconds(20))
        #expect(chat.isRunning, "chat goes on")
        // What the user reads: a line for each file taken, a few for the declined ones.
        #expect(Self.count("receiving held-", in: chat.stderrLines) == FileReceiver.maxTransfersPerPeer, "\(chat.stderr)")
        let declines = Self.count("declined held-", in: chat.stderrLines)
        #expect(declines >= 1 && declines <= 4, "\(chat.stderr)")
    }

    /// A TCP port on 127.0.0.1 that nothing listens on right now.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        try #require(bound, "bind: errno \(errno)")
        return Int(UInt16(bigEndian: address.sin_port))
    }

    @Test(
        "chat --port listens where it is told: the peer dials that port; a port in use is one clear line",
        .timeLimit(.minutes(1)))
    func chatOnAPortOfItsChoice() async throws {
        let service = TestHost.uniqueServiceType("i")
        // Chat needs a peer to reach without avahi: the independent peer listens, chat dials it
        // and listens on the port it was given, where a second independent peer dials in.
        let (anchor, anchorPort) = try await Self.listening(["--name", "Anchor", "--service", service, "--auto", "--max-time", "20"])
        defer { anchor.terminate() }
        let port = try Self.freePort()
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "Swift", "--service", service, "--transport", "lan", "--port", String(port), "--connect", "tcp://127.0.0.1:\(anchorPort)"],
            withInput: true)
        defer { chat.terminate() }
        let listening = try await chat.waitForStderrLine(containing: "Listening on tcp://", timeout: .seconds(30))
        #expect(listening.hasSuffix(":\(port)"), "\(listening)")
        let peer = try Self.start([
            "--dial", "127.0.0.1:\(port)", "--name", "Indie", "--service", service, "--auto", "--invite",
            "--say", "dialled the port chat was given", "--linger", "2", "--max-time", "20",
        ])
        defer { peer.terminate() }
        _ = try await chat.waitForLine(containing: "Indie: dialled the port chat was given", timeout: .seconds(20))

        // A second chat asked for the same port: the LAN cannot run, and it says why.
        let second = try ChildProcess.peerlink(
            ["chat", "--name", "Other", "--service", service, "--transport", "lan", "--port", String(port), "--connect", "tcp://127.0.0.1:\(anchorPort)"],
            withInput: true)
        defer { second.terminate() }
        let line = try await second.waitForStderrLine(containing: "already in use", timeout: .seconds(30))
        #expect(line.contains("\(port)") && line.contains("choose another port"), "\(line)")
        second.closeInput()
        #expect(try await second.waitForExit() != 0, "\(second.stderr)")
    }

    /// The first group of the fingerprint the independent peer logs for itself.
    static func idGroup(of peer: ChildProcess) async throws -> String {
        let line = try await peer.waitForLine(containing: "our fingerprint ", timeout: .seconds(20))
        let grouped = line.components(separatedBy: "our fingerprint ").last ?? ""
        return String(grouped.prefix { $0 != "-" })
    }

    @Test(
        "two peers going by one name, or by chat's own, are told apart by their ids on standard output",
        .timeLimit(.minutes(1)),
        .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (chat without --connect needs it to advertise)"))
    func sharedNamesAreToldApart() async throws {
        let service = TestHost.uniqueServiceType("i")
        let (chat, port) = try await Self.chatListening(service: service)
        defer { chat.terminate() }
        func twin(_ arguments: [String]) throws -> ChildProcess {
            try Self.start(["--dial", "127.0.0.1:\(port)", "--service", service, "--auto", "--invite", "--max-time", "20"] + arguments)
        }
        let first = try twin(["--name", "Twin", "--say", "from the first", "--linger", "15", "--act", "6:say=the first again", "--act", "8:goaway=0"])
        defer { first.terminate() }
        let firstID = try await Self.idGroup(of: first)
        // Alone under its name, the first is shown as it calls itself.
        _ = try await chat.waitForLine(containing: "Twin: from the first", timeout: .seconds(20))
        let second = try twin(["--name", "Twin", "--say", "from the second", "--linger", "3"])
        defer { second.terminate() }
        let secondID = try await Self.idGroup(of: second)
        let mirror = try twin(["--name", "Swift", "--say", "from a mirror", "--linger", "3"])
        defer { mirror.terminate() }
        let mirrorID = try await Self.idGroup(of: mirror)
        _ = try await chat.waitForLine(containing: "Twin [\(secondID)]: from the second", timeout: .seconds(20))
        _ = try await chat.waitForLine(containing: "Swift [\(mirrorID)]: from a mirror", timeout: .seconds(20))
        // Once the name is shared, the first one's lines carry its id too.
        _ = try await chat.waitForLine(containing: "Twin [\(firstID)]: the first again", timeout: .seconds(20))
        for peer in [first, second, mirror] { _ = try await peer.waitForExit(timeout: .seconds(20)) }
        #expect(chat.stdoutLines.contains("* Twin joined"), "\(chat.stdout)")
        #expect(chat.stdoutLines.contains("* Twin [\(secondID)] joined"), "\(chat.stdout)")
        #expect(chat.stdoutLines.contains("* Swift [\(mirrorID)] joined"), "\(chat.stdout)")
        #expect(chat.stdoutLines.contains("* Twin [\(firstID)] left"), "\(chat.stdout)")
        #expect(!chat.stdoutLines.contains { $0.hasPrefix("Twin: ") && $0 != "Twin: from the first" }, "\(chat.stdout)")
    }

    @Test(
        "a pair carried over to a new link: what either side sent and the other never acknowledged arrives once, in order",
        .timeLimit(.minutes(1)))
    func continuityAcrossLinks() async throws {
        let service = TestHost.uniqueServiceType("i")
        // On the first link the peer stops taking frames (so chat must keep "one"), then keeps a
        // message of its own without writing it (as if the link lost it), then drops the link
        // without GO_AWAY. Chat dials again; both sides send what the other has not acknowledged.
        let (peer, port) = try await Self.listening([
            "--name", "Indie", "--service", service, "--links", "2",
            "--act", "0.5:noack", "--act", "4:phantom", "--act", "4.5:say=lost-on-link-1", "--act", "5:drop",
            "--act2", "1:say=on-link-2", "--act2", "4:goaway=0", "--max-time", "40",
        ])
        defer { peer.terminate() }
        let chat = try ChildProcess.peerlink(
            ["chat", "--name", "Swift", "--service", service, "--transport", "lan", "--connect", "tcp://127.0.0.1:\(port)"], withInput: true)
        defer { chat.terminate() }
        _ = try await chat.waitForLine(containing: "* Indie joined", timeout: .seconds(20))
        _ = try await peer.waitForLine(containing: "=== action noack", timeout: .seconds(10))
        chat.type("one\n")
        _ = try await peer.waitForLine(containing: "(not taken, not acknowledged", timeout: .seconds(10))
        _ = try await chat.waitForLine(containing: "Indie: on-link-2", timeout: .seconds(20))
        chat.type("two\n")
        _ = try await chat.waitForLine(containing: "* Indie left", timeout: .seconds(15))
        #expect(try await peer.waitForExit(timeout: .seconds(15)) == 0, "\(peer.stdout)")

        let received = chat.stdoutLines.filter { $0.hasPrefix("Indie: ") }
        #expect(received == ["Indie: lost-on-link-1", "Indie: on-link-2"], "\(chat.stdout)")
        #expect(Self.count("accepted link #2", in: peer.stdoutLines) == 1, "chat dialled again: \(peer.stdout)")
        #expect(Self.count("complete: b'one'", in: peer.stdoutLines) == 1, "\(peer.stdout)")
        #expect(Self.count("complete: b'two'", in: peer.stdoutLines) == 1, "\(peer.stdout)")
        let one = peer.stdoutLines.firstIndex { $0.contains("complete: b'one'") } ?? .max
        let two = peer.stdoutLines.firstIndex { $0.contains("complete: b'two'") } ?? .min
        #expect(one < two, "in order: \(peer.stdout)")
        #expect(!chat.stdout.contains("* Indie left\n* Indie joined"), "the peer never left between the links: \(chat.stdout)")
    }

    /// A well-behaved independent peer ("Anchor", answering every message with "echo: ...") for
    /// `seconds`, and `peerlink chat` joined with it and listening on a TCP port of its own, for
    /// a misbehaving peer to dial while the anchor shows that others are unaffected.
    static func chatBesideAnAnchor(service: String, seconds: Int) async throws -> (anchor: ChildProcess, chat: ChildProcess, port: Int) {
        let (anchor, anchorPort) = try await listening([
            "--name", "Anchor", "--service", service, "--auto", "--reply", "--max-time", String(seconds),
        ])
        do {
            // any free port, read back from chat (a port picked beforehand and released may be
            // taken by another process before chat binds it)
            let chat = try ChildProcess.peerlink(
                ["chat", "--name", "Swift", "--service", service, "--transport", "lan", "--connect", "tcp://127.0.0.1:\(anchorPort)"],
                withInput: true)
            do {
                let listening = try await chat.waitForStderrLine(containing: "Listening on tcp://", timeout: .seconds(30))
                let port = try #require(Int(String((listening.split(separator: ":").last ?? "").prefix { $0.isNumber })), "\(listening)")
                _ = try await chat.waitForLine(containing: "* Anchor joined", timeout: .seconds(20))
                return (anchor, chat, port)
            } catch {
                chat.terminate()
                throw error
            }
        } catch {
            anchor.terminate()
            throw error
        }
    }

    /// What a peer does wrong after its first line, and whether chat must end its link for it
    /// (`GO_AWAY` 1, a protocol error) or drop the frame and go on (the Wire Format article).
    /// (Bytes over a stream's window are left to `LinkTests`: chat's file receiver resets a
    /// stream of garbage at once, and frames for a reset stream are ignored, as they must be.)
    static let misbehaviours: [(act: String, closes: Bool)] = [
        ("unknown_type", true),  // frame type 9
        ("bad_version", true),  // a frame header of version 3
        ("badping", true),  // a PING of 4 bytes, not 8
        ("cut_record", true),  // a record whose last frame runs past its end
        ("empty_record", true),  // a record under the minimum length
        ("bad_ack", true),  // an ACK of frames never sent
        ("gap", false),  // a sequence number that skips one: dropped
        ("dup", false),  // the last sequenced frame again: dropped
    ]

    @Test(
        "a peer that breaks the wire format loses its own link, with code and reason; what it sent before arrives, another peer chats on",
        .timeLimit(.minutes(1)), arguments: misbehaviours.map(\.act))
    func aMisbehavingPeerAffectsOnlyItself(act: String) async throws {
        let closes = try #require(Self.misbehaviours.first { $0.act == act }).closes
        let service = TestHost.uniqueServiceType("i")
        let (anchor, chat, port) = try await Self.chatBesideAnAnchor(service: service, seconds: 40)
        defer { anchor.terminate() }
        defer { chat.terminate() }
        let peer = try Self.start([
            "--dial", "127.0.0.1:\(port)", "--name", "Rogue", "--service", service, "--auto", "--invite",
            "--say", "sent before misbehaving", "--act", "1.5:\(act)", "--act", "2.5:say=sent after misbehaving", "--max-time", "8",
        ])
        defer { peer.terminate() }
        _ = try await chat.waitForLine(containing: "Rogue: sent before misbehaving", timeout: .seconds(20))
        _ = try await peer.waitForLine(containing: "=== action \(act)", timeout: .seconds(10))
        if closes {
            let goAway = try await peer.waitForLine(containing: "peer said GO_AWAY code=1 ", timeout: .seconds(10))
            #expect(goAway.contains("reason='") && !goAway.contains("reason=''"), "a reason comes with the code: \(goAway)")
        } else {
            _ = try await chat.waitForLine(containing: "Rogue: sent after misbehaving", timeout: .seconds(10))
            #expect(!peer.stdout.contains("GO_AWAY code="), "\(peer.stdout)")
        }
        // The other peer chats on, and chat still takes lines.
        chat.type("still here\n")
        _ = try await chat.waitForLine(containing: "Anchor: echo: still here", timeout: .seconds(10))
        #expect(Self.count("Rogue: sent before misbehaving", in: chat.stdoutLines) == 1, "\(chat.stdout)")
        #expect(!chat.stdout.contains("after a gap") && !chat.stdout.contains("Rogue: duplicate"), "\(chat.stdout)")
        if closes {
            #expect(!chat.stdout.contains("Rogue: sent after misbehaving"), "\(chat.stdout)")
            // the user learns why it left, on standard error (standard output keeps its format)
            let left = try await chat.waitForStderrLine(containing: "peerlink: Rogue left: ", timeout: .seconds(10))
            #expect(left.contains("code 1 (protocol error)"), "\(left)")
            #expect(Self.count("* Rogue left", in: chat.stdoutLines) == 1, "\(chat.stdout)")
        }
        #expect(chat.isRunning, "chat goes on: \(chat.stderr)")
        chat.closeInput()
        #expect(try await chat.waitForExit() == 0, "\(chat.stderr)")
    }

    /// What a dialling peer gets wrong in its preface or handshake (independent_peer.py
    /// `--bad`), and what chat says on standard error when it refuses the link; nil: nothing is
    /// wrong that chat must refuse (a hello field it does not know, a payload in the first
    /// handshake message: both ignored), so the peer joins.
    static let badHandshakes: [(bad: String, refusal: String?)] = [
        ("magic", "not a PeerLink peer (code 1 (protocol error))"),
        ("verdict", "testing a refusal verdict (code 3 (service type mismatch))"),
        ("noname", "the hello has no display name (code 1"),
        ("longname", "display name is 64 bytes long: it must be 1 to 63 bytes of UTF-8 (code 1"),
        ("ctrlname", "display name contains a control, line-break or text-direction character"),
        ("dupfield", "the hello has two display names (code 1"),
        ("inc0", "the hello's incarnation is 0"),
        ("cutfield", "hello field 3 says 8 bytes, but only 3 follow (code 1"),
        ("unknownfield", nil),
        ("payload1", nil),
    ]

    @Test(
        "a peer whose preface or hello is wrong is refused before it joins, with what was wrong on stderr; a hello field chat does not know is skipped; another peer chats on",
        .timeLimit(.minutes(2)))
    func badHandshakesAreRefusedOneByOne() async throws {
        let service = TestHost.uniqueServiceType("i")
        let (anchor, chat, port) = try await Self.chatBesideAnAnchor(service: service, seconds: 90)
        defer { anchor.terminate() }
        defer { chat.terminate() }
        for (bad, refusal) in Self.badHandshakes {
            let peer = try Self.start([
                "--dial", "127.0.0.1:\(port)", "--name", "Rogue", "--service", service, "--auto", "--invite",
                "--say", "hello with \(bad)", "--bad", bad, "--max-time", "2",
            ])
            defer { peer.terminate() }
            if let refusal {
                let line = try await chat.waitForStderrLine(containing: refusal, timeout: .seconds(10))
                #expect(line.contains("before the handshake completed"), "\(bad): \(line)")
                _ = try await peer.waitForExit(timeout: .seconds(10))
                #expect(!peer.stdout.contains("*** connected"), "\(bad): \(peer.stdout)")
            } else {
                _ = try await chat.waitForLine(containing: ": hello with \(bad)", timeout: .seconds(10))
                #expect(try await peer.waitForExit(timeout: .seconds(10)) == 0, "\(bad): \(peer.stdout)")
            }
        }
        // A prologue that differs from the prefaces sent: the handshake cannot complete (the
        // peer fails to read chat's second message), and nothing of it reaches the chat.
        let forged = try Self.start([
            "--dial", "127.0.0.1:\(port)", "--name", "Rogue", "--service", service, "--auto", "--invite",
            "--say", "hello with prologue", "--bad", "prologue", "--max-time", "2",
        ])
        defer { forged.terminate() }
        #expect(try await forged.waitForExit(timeout: .seconds(10)) != 0, "\(forged.stdout)")
        #expect(!forged.stdout.contains("*** connected"), "\(forged.stdout)")

        chat.type("still here\n")
        _ = try await chat.waitForLine(containing: "Anchor: echo: still here", timeout: .seconds(10))
        #expect(Self.count("joined", in: chat.stdoutLines) == 3, "Anchor and the two peers nothing was wrong with: \(chat.stdout)")
        #expect(!chat.stdout.contains("hello with prologue"), "\(chat.stdout)")
        chat.closeInput()
        #expect(try await chat.waitForExit() == 0, "\(chat.stderr)")
    }
}
