import Crypto
import Foundation
import PeerLinkCore
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Interop with an independent Noise implementation: the python `noiseprotocol` package, run as
/// a child process that speaks 2-byte big-endian length-prefixed frames on its stdin/stdout.
@Suite("Noise: interop with python noiseprotocol (XX)")
struct NoiseInteropTests {
    static let prologue = Array("PeerLink Noise interop v1".utf8)

    @Test(
        "Swift initiator, Python responder",
        .enabled(if: NoisePython.shouldRun, NoisePython.skipReason),
        .timeLimit(.minutes(1))
    )
    func swiftInitiates() throws {
        try runInterop(swiftIsInitiator: true)
    }

    @Test(
        "Python initiator, Swift responder",
        .enabled(if: NoisePython.shouldRun, NoisePython.skipReason),
        .timeLimit(.minutes(1))
    )
    func pythonInitiates() throws {
        try runInterop(swiftIsInitiator: false)
    }

    private func runInterop(swiftIsInitiator: Bool) throws {
        try NoisePython.requireAvailable()
        let peer = try NoisePythonPeer(role: swiftIsInitiator ? "responder" : "initiator", prologue: Self.prologue)
        defer { peer.finish() }

        let ourKey = Curve25519.KeyAgreement.PrivateKey()
        var handshake = NoiseHandshakeState.xx(initiator: swiftIsInitiator, prologue: Self.prologue, staticKey: ourKey)
        var sentPayloads: [String] = []
        var receivedPayloads: [[UInt8]] = []
        var expectedFromPython: [[UInt8]] = []
        for index in 0..<3 {
            if handshake.isWriteTurn {
                let payload = Array("swift handshake payload \(index)".utf8)
                sentPayloads.append(NoiseHex.encode(payload))
                try peer.send(try handshake.writeMessage(payload: payload))
            } else {
                expectedFromPython.append(Array("python handshake payload \(index)".utf8))
                receivedPayloads.append(try handshake.readMessage(try peer.receive()))
            }
        }
        #expect(handshake.isComplete)
        #expect(receivedPayloads == expectedFromPython)

        // Python's view, sent in clear right after the handshake.
        let info = try JSONDecoder().decode(NoisePythonPeer.Info.self, from: Data(try peer.receive()))
        #expect(info.h == NoiseHex.encode(handshake.handshakeHash), "handshake hashes differ")
        #expect(info.rs == NoiseHex.encode(ourKey.publicKey.rawRepresentation), "Python saw another static key for us")
        #expect(handshake.remoteStaticKey.map { NoiseHex.encode($0.rawRepresentation) } == info.s, "we saw another static key for Python")
        #expect(info.payloads == sentPayloads)

        // Transport: each message goes to Python, which answers with the plaintext reversed.
        var transport = try handshake.transport()
        #expect(transport.handshakeHash == handshake.handshakeHash)
        var generator = SeededGenerator(seed: swiftIsInitiator ? 1 : 2)
        let messages: [[UInt8]] = [
            Array("hello from swift".utf8),
            [],
            generator.bytes(1000),
            generator.bytes(NoiseTransport.maxPlaintextLength),
            Array("last one".utf8),
        ]
        for (index, message) in messages.enumerated() {
            try peer.send(try transport.seal(message))
            let reply = try transport.open(try peer.receive())
            #expect(reply == Array(message.reversed()), "transport message \(index) (\(message.count) bytes)")
        }
    }
}

/// Finding the interpreter and checking that `import noise` works, once.
enum NoisePython {
    static let isCI = ProcessInfo.processInfo.environment["CI"] == "true"

    /// `$PEERLINK_PYTHON` (exported by Hardware/test.sh), else `python3` from PATH.
    static var command: (executable: String, arguments: [String]) {
        let configured = ProcessInfo.processInfo.environment["PEERLINK_PYTHON"] ?? ""
        let name = configured.isEmpty ? "python3" : configured
        return name.contains("/") ? (name, []) : ("/usr/bin/env", [name])
    }

    /// nil when `import noise` works, else why not.
    static let unavailableReason: String? = {
        let (executable, arguments) = command
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments + ["-c", "from noise.connection import NoiseConnection, Keypair"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do {
            try process.run()
        } catch {
            return "cannot run \(([executable] + arguments).joined(separator: " ")): \(error)"
        }
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
            return "\(executable) -c 'import noise' did not finish in 20 s"
        }
        return process.terminationStatus == 0
            ? nil
            : "\(([executable] + arguments).joined(separator: " ")) cannot import noise (pip install noiseprotocol, or set PEERLINK_PYTHON)"
    }()

    /// Run when available, and in CI always, where unavailability is a failure.
    static let shouldRun = unavailableReason == nil || isCI

    static var skipReason: Comment { "python noiseprotocol unavailable: \(unavailableReason ?? "?")" }

    static func requireAvailable() throws {
        if let unavailableReason {
            throw NoiseTestFailure("CI=true but python noiseprotocol is unavailable: \(unavailableReason)")
        }
    }
}

/// The python side of an interop run, as a child process. Frames are exchanged over a Unix
/// socket pair given to the child as stdin and stdout (a socket, so a dead child gives EPIPE
/// instead of SIGPIPE); every read is bounded by a timeout.
final class NoisePythonPeer {
    struct Info: Decodable {
        /// Python's handshake hash, its static public key, the static key it received, and the
        /// handshake payloads it read, all hex.
        var h: String
        var s: String
        var rs: String
        var payloads: [String]
    }

    static let script = #"""
        import json, os, sys
        from noise.connection import NoiseConnection, Keypair

        source, sink = sys.stdin.buffer, sys.stdout.buffer

        def read_frame():
            header = source.read(2)
            if len(header) < 2:
                return None
            length = int.from_bytes(header, "big")
            data = source.read(length)
            if len(data) != length:
                sys.exit("short frame")
            return bytes(data)

        def write_frame(data):
            sink.write(len(data).to_bytes(2, "big") + bytes(data))
            sink.flush()

        role, prologue = sys.argv[1], bytes.fromhex(sys.argv[2])
        conn = NoiseConnection.from_name(b"Noise_XX_25519_ChaChaPoly_SHA256")
        if role == "initiator":
            conn.set_as_initiator()
        else:
            conn.set_as_responder()
        conn.set_prologue(prologue)
        conn.set_keypair_from_private_bytes(Keypair.STATIC, os.urandom(32))
        conn.start_handshake()
        handshake = conn.noise_protocol.handshake_state  # kept: the connection drops it when done
        payloads = []
        for index in range(3):
            if (index % 2 == 0) == (role == "initiator"):
                write_frame(conn.write_message(b"python handshake payload %d" % index))
            else:
                frame = read_frame()
                if frame is None:
                    sys.exit("EOF during the handshake")
                payloads.append(bytes(conn.read_message(frame)).hex())
        if not conn.handshake_finished:
            sys.exit("handshake not finished after 3 messages")
        write_frame(json.dumps({
            "h": bytes(conn.get_handshake_hash()).hex(),
            "s": conn.noise_protocol.keypairs["s"].public_bytes.hex(),
            "rs": handshake.rs.public_bytes.hex(),
            "payloads": payloads,
        }).encode())
        while True:
            frame = read_frame()
            if frame is None:
                break
            write_frame(conn.encrypt(bytes(reversed(conn.decrypt(frame)))))
        """#

    private let process = Process()
    private let socket: Int32
    private let directory: URL
    private let stderrURL: URL
    private var finished = false

    init(role: String, prologue: [UInt8]) throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("peerlink-noise-interop-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let scriptURL = directory.appendingPathComponent("noise_peer.py")
        try Data(Self.script.utf8).write(to: scriptURL)
        stderrURL = directory.appendingPathComponent("stderr.txt")
        try Data().write(to: stderrURL)

        var fds: [Int32] = [-1, -1]
        #if canImport(Glibc)
            let streamType = Int32(SOCK_STREAM.rawValue)
        #else
            let streamType = SOCK_STREAM
        #endif
        guard socketpair(AF_UNIX, streamType, 0, &fds) == 0 else {
            throw NoiseTestFailure("socketpair failed: errno \(errno)")
        }
        socket = fds[0]
        let childEnd = fds[1]
        _ = fcntl(socket, F_SETFD, FD_CLOEXEC)
        #if canImport(Darwin)
            var one: Int32 = 1
            _ = setsockopt(socket, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif

        let childHandle = FileHandle(fileDescriptor: childEnd, closeOnDealloc: false)
        let (executable, arguments) = NoisePython.command
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments + [scriptURL.path, role, NoiseHex.encode(prologue)]
        process.standardInput = childHandle
        process.standardOutput = childHandle
        process.standardError = try FileHandle(forWritingTo: stderrURL)
        do {
            try process.run()
        } catch {
            close(childEnd)
            close(socket)
            throw error
        }
        close(childEnd)
    }

    deinit { finish() }

    /// What the child wrote to stderr so far (for failure messages).
    var stderrText: String {
        (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? ""
    }

    func send(_ frame: [UInt8]) throws {
        guard frame.count <= 65535 else { throw NoiseTestFailure("frame of \(frame.count) bytes") }
        let bytes = [UInt8(frame.count >> 8), UInt8(frame.count & 0xFF)] + frame
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { buffer -> Int in
                guard let base = buffer.baseAddress else { return 0 }
                #if canImport(Glibc)
                    return Glibc.send(socket, base + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
                #else
                    return Darwin.send(socket, base + offset, buffer.count - offset, 0)
                #endif
            }
            if sent < 0 {
                if errno == EINTR { continue }
                throw NoiseTestFailure("sending to python failed: errno \(errno); python stderr: \(stderrText)")
            }
            offset += sent
        }
    }

    func receive(timeout: Duration = .seconds(15)) throws -> [UInt8] {
        let deadline = ContinuousClock.now + timeout
        let header = try readExactly(2, deadline: deadline)
        let length = Int(header[0]) << 8 | Int(header[1])
        return try readExactly(length, deadline: deadline)
    }

    private func readExactly(_ count: Int, deadline: ContinuousClock.Instant) throws -> [UInt8] {
        var result: [UInt8] = []
        result.reserveCapacity(count)
        var chunk = [UInt8](repeating: 0, count: 65536)
        while result.count < count {
            let remaining = deadline - ContinuousClock.now
            let milliseconds = Int32(clamping: remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000)
            guard milliseconds > 0 else {
                throw NoiseTestFailure("timed out waiting for python (\(result.count)/\(count) bytes); python stderr: \(stderrText)")
            }
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 {
                if errno == EINTR { continue }
                throw NoiseTestFailure("poll failed: errno \(errno)")
            }
            if ready == 0 { continue }  // the deadline check above ends the loop
            let wanted = min(count - result.count, chunk.count)
            let received = chunk.withUnsafeMutableBytes { recv(socket, $0.baseAddress, wanted, 0) }
            if received < 0 {
                if errno == EINTR { continue }
                throw NoiseTestFailure("reading from python failed: errno \(errno); python stderr: \(stderrText)")
            }
            if received == 0 {
                throw NoiseTestFailure("python closed the connection (\(result.count)/\(count) bytes); python stderr: \(stderrText)")
            }
            result += chunk.prefix(received)
        }
        return result
    }

    /// Ends the exchange: EOF to the child, a few seconds to exit, then SIGTERM. Idempotent.
    func finish() {
        guard !finished else { return }
        finished = true
        _ = shutdown(socket, Int32(SHUT_WR))
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        close(socket)
        try? FileManager.default.removeItem(at: directory)
    }
}
