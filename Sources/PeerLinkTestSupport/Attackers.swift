#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Foundation
import PeerLinkCore
import PeerLinkPosix

// Attackers for hostile-peer tests of anything that listens for PeerLink links: raw TCP clients
// bound to a loopback source address of their choice (127.0.0.2, 127.0.0.3, … stand for other
// hosts, so per-address limits can be tested on one machine), scripts of what they send before
// authenticating, and a Noise-speaking attacker with a throwaway key. Meant for loopback only;
// every wait is bounded.

/// A raw TCP client socket. Its blocking calls run on threads of their own
/// (``PeerLinkPosix/runBlocking(_:_:)``), never on the cooperative pool.
public final class AttackerSocket: @unchecked Sendable {
    private let lock = NSLock()
    private var fd: Int32

    private init(fd: Int32) {
        self.fd = fd
    }

    deinit { close() }

    /// Connects to `host`:`port` (IPv4) from `source` (a loopback address such as `127.0.0.2`;
    /// nil: the kernel's choice), giving up after `timeout`.
    public static func connect(
        to port: UInt16, host: String = "127.0.0.1", from source: String? = nil, timeout: Duration = .seconds(5)
    ) async throws -> AttackerSocket {
        guard let address = IPSocketAddress(host: host, port: port), address.family == .ipv4 else {
            throw AttackError("not an IPv4 address: \(host)")
        }
        let local = try source.map { source throws -> IPSocketAddress in
            guard let local = IPSocketAddress(host: source, port: 0), local.family == .ipv4 else {
                throw AttackError("not an IPv4 address: \(source)")
            }
            return local
        }
        return try await runBlocking("attacker-connect") { () throws -> AttackerSocket in
            let socket = AttackerSocket(fd: try Sys.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0))
            let fd = socket.fd
            if let local {
                try local.withSockAddr { pointer, length throws(SystemError) in try Sys.bind(fd, pointer, length) }
            }
            try Sys.setNonBlocking(fd, true)
            let done = try address.withSockAddr { pointer, length throws(SystemError) in try Sys.connectNonBlocking(fd, pointer, length) }
            if !done { try finishConnect(fd, timeout: timeout, cancellation: nil) }
            return socket
        }
    }

    /// Writes all of `bytes` within `timeout`; false when the peer is gone or did not take them
    /// in time (a victim that stopped reading).
    @discardableResult
    public func write(_ bytes: [UInt8], timeout: Duration = .seconds(5)) async -> Bool {
        let fd = lock.withLock { self.fd }
        guard fd >= 0 else { return false }
        return (try? await runBlocking("attacker-write") { () throws -> Bool in
            var offset = 0
            let deadline = ContinuousClock.now + timeout
            while offset < bytes.count {
                let sent = try bytes[offset...].withUnsafeBytes { buffer throws(SystemError) in try Sys.send(fd, buffer) }
                if let sent {
                    offset += sent
                    continue
                }
                guard ContinuousClock.now < deadline else { return false }
                _ = try Sys.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: 100)
            }
            return true
        }) ?? false
    }

    /// Reads until the peer ends the connection, `limit` bytes arrived, or `timeout` passed:
    /// what arrived, and whether the end (end of stream or reset) was seen.
    public func readToEnd(timeout: Duration, limit: Int = 1 << 20) async -> (bytes: [UInt8], ended: Bool) {
        let fd = lock.withLock { self.fd }
        guard fd >= 0 else { return ([], true) }
        return await runBlocking("attacker-read") { () -> ([UInt8], Bool) in
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline, received.count < limit {
                do {
                    let count = try buffer.withUnsafeMutableBytes { buffer throws(SystemError) in try Sys.receive(fd, buffer) }
                    guard let count else {
                        _ = try Sys.poll(fd, events: Int16(POLLIN), timeoutMilliseconds: 100)
                        continue
                    }
                    if count == 0 { return (received, true) }
                    received += buffer[..<count]
                } catch {
                    return (received, true)  // reset
                }
            }
            return (received, false)
        }
    }

    public func close() {
        let fd = lock.withLock { () -> Int32 in
            defer { self.fd = -1 }
            return self.fd
        }
        if fd >= 0 { Sys.close(fd) }
    }
}

public struct AttackError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// What an attacker sends on a fresh connection.
public enum Attack: Sendable, CustomStringConvertible {
    /// Connects and sends nothing.
    case silent
    /// A valid preface, then nothing.
    case prefaceOnly
    /// Preface, verdict 0 and 10 of the 32 bytes of Noise message 1, then nothing: a handshake
    /// held open as long as the victim allows.
    case slowLoris
    /// A refusing verdict whose reason is `reason`.
    case refusingVerdict(reason: String)
    /// Preface, verdict 0, then `count` records that are no Noise message at all.
    case recordFlood(count: Int)
    /// Preface, verdict 0, then a handshake record of the largest length and only part of it.
    case oversizedRecord
    /// The whole handshake with a throwaway key, `hello` as its hello (nil: a valid one), then
    /// nothing.
    case throwawayKey(hello: [UInt8]?)

    public var description: String {
        switch self {
        case .silent: "silent"
        case .prefaceOnly: "preface only"
        case .slowLoris: "slow loris"
        case .refusingVerdict: "refusing verdict"
        case .recordFlood(let count): "\(count) records before authentication"
        case .oversizedRecord: "oversized record"
        case .throwawayKey(let hello): hello == nil ? "throwaway key" : "throwaway key with a crafted hello"
        }
    }

    /// The bytes sent at once, for a victim serving `service` (none for ``throwawayKey(hello:)``,
    /// which talks).
    public func bytes(service: ServiceType) -> [UInt8] {
        let preface = (try? LinkPreface(encryption: .optional, service: service).encoded()) ?? []
        switch self {
        case .silent, .throwawayKey:
            return []
        case .prefaceOnly:
            return preface
        case .slowLoris:
            return preface + [0, 0x00, 0x20] + [UInt8](repeating: 7, count: 10)
        case .refusingVerdict(let reason):
            return preface + Verdict.refuse(code: .sessionFull, reason: reason).encoded()
        case .recordFlood(let count):
            var bytes = preface + [0]
            for index in 0..<count { bytes += Record.framed([UInt8](repeating: UInt8(truncatingIfNeeded: index), count: 48)) }
            return bytes
        case .oversizedRecord:
            return preface + [0, 0xFF, 0xFF] + [UInt8](repeating: 0xAB, count: 4096)
        }
    }

    /// Opens a connection to `port` on `host` from `source` and carries the attack out; the
    /// socket stays open (a slow loris until the victim closes it).
    public static func launch(
        _ attack: Attack, port: UInt16, host: String = "127.0.0.1", from source: String?, service: ServiceType
    ) async throws -> AttackerSocket {
        let socket = try await AttackerSocket.connect(to: port, host: host, from: source)
        switch attack {
        case .throwawayKey(let hello):
            let valid = Hello(displayName: try DisplayName("throwaway")).encoded()
            try await handshake(on: socket, service: service, hello: hello ?? valid)
        default:
            let bytes = attack.bytes(service: service)
            if !bytes.isEmpty { await socket.write(bytes) }
        }
        return socket
    }

    /// Runs the handshake as a dialer with a fresh key, sending `hello` (any bytes) in message 3.
    static func handshake(on socket: AttackerSocket, service: ServiceType, hello: [UInt8]) async throws {
        let preface = try LinkPreface(encryption: .optional, service: service).encoded()
        await socket.write(preface + [0])
        var received: [UInt8] = []
        var noise: NoiseHandshakeState?
        for _ in 0..<100 where noise == nil {
            let (bytes, ended) = await socket.readToEnd(timeout: .milliseconds(100), limit: 1)
            received += bytes
            if let (victim, length) = try? LinkPreface.parse(prefix: received[...]), received.count > length {
                guard received[length] == 0 else { throw AttackError("the victim refused: verdict \(received[length])") }
                let prologue = WireFormat.prologueLabel + preface + victim.encoded()
                var state = NoiseHandshakeState.xx(initiator: true, prologue: prologue, staticKey: Identity.generate().privateKey)
                await socket.write(Record.framed(try state.writeMessage()))
                noise = state
                received.removeFirst(length + 1)
            } else if ended {
                throw AttackError("the victim closed before its preface")
            }
        }
        guard var noise else { throw AttackError("no preface from the victim") }
        for _ in 0..<100 {
            if let (body, length) = try Record.parse(prefix: received[...], maxLength: WireFormat.maxHandshakeMessageLength) {
                _ = try noise.readMessage(Array(body))
                received.removeFirst(length)
                await socket.write(Record.framed(try noise.writeMessage(payload: hello)))
                return
            }
            let (bytes, ended) = await socket.readToEnd(timeout: .milliseconds(100), limit: 1)
            received += bytes
            if ended { throw AttackError("the victim closed before handshake message 2") }
        }
        throw AttackError("no handshake message 2 from the victim")
    }
}

/// Text a hostile peer would like a terminal to act on, and a check that none of it got through.
public enum InjectionText {
    /// A fake join line after a carriage return, a window title (OSC), a cleared screen and
    /// colours (CSI, also as the C1 byte), a right-to-left override, a hyperlink.
    public static let reason =
        "\r* mallory joined\n\u{1B}]0;owned\u{07}\u{1B}[2J\u{1B}[31mred\u{9B}0m\u{202E}txt.exe\u{1B}]8;;http://x\u{1B}\\"

    /// Whether `text` holds anything a terminal would act on.
    public static func isRaw(_ text: String) -> Bool {
        text.unicodeScalars.contains { $0 != "\\" && PeerText.needsEscape($0) }
    }
}
