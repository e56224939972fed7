import Foundation
import PeerLinkCore
import PeerLinkPosix
import PeerLinkSession
import Testing

#if canImport(Glibc)
import Glibc
#endif

// Attackers for hostile-peer tests, reusable by any test of a limit: raw TCP clients bound to a
// loopback source address of their choice (127.0.0.2, 127.0.0.3, … stand for other hosts), and
// scripts of what they send. Loopback only; every wait bounded; every socket closed.

/// A raw TCP client socket, blocking calls run off the cooperative pool (``runBlocking(_:_:)``).
final class RawSocket: @unchecked Sendable {
    private let lock = NSLock()
    private var fd: Int32

    private init(fd: Int32) {
        self.fd = fd
    }

    deinit { close() }

    /// Connects to `host`:`port` from `source` (a loopback address such as `127.0.0.2`; nil:
    /// the kernel's choice), giving up after `timeout`.
    static func connect(
        to port: UInt16, host: String = "127.0.0.1", from source: String? = nil, timeout: Duration = .seconds(5)
    ) async throws -> RawSocket {
        try await runBlocking("attacker-connect") { () throws -> RawSocket in
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { throw AttackError("socket: errno \(errno)") }
            let raw = RawSocket(fd: fd)
            if let source {
                var address = try Self.address(source, port: 0)
                let bound = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                guard bound == 0 else { throw AttackError("bind \(source): errno \(errno)") }
            }
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            var address = try Self.address(host, port: port)
            let result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if result != 0 {
                guard errno == EINPROGRESS else { throw AttackError("connect: errno \(errno)") }
                var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                let milliseconds = Int32(timeout.components.seconds * 1000)
                guard poll(&entry, 1, milliseconds) == 1 else { throw AttackError("connect: timed out") }
                var error: Int32 = 0
                var length = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
                guard error == 0 else { throw AttackError("connect: errno \(error)") }
            }
            return raw
        }
    }

    private static func address(_ host: String, port: UInt16) throws -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { throw AttackError("not an IPv4 address: \(host)") }
        return address
    }

    /// Writes what the socket takes within `timeout`; false when the peer is gone or it would
    /// not take it all in time (a victim that stopped reading).
    @discardableResult
    func write(_ bytes: [UInt8], timeout: Duration = .seconds(5)) async -> Bool {
        let fd = lock.withLock { self.fd }
        guard fd >= 0 else { return false }
        return (try? await runBlocking("attacker-write") { () -> Bool in
            var offset = 0
            let deadline = ContinuousClock.now + timeout
            while offset < bytes.count {
                let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if sent > 0 {
                    offset += sent
                    continue
                }
                guard sent < 0, errno == EAGAIN || errno == EINTR, ContinuousClock.now < deadline else { return false }
                var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&entry, 1, 100)
            }
            return true
        }) ?? false
    }

    /// Reads until the peer ends the connection or `timeout` passes: what arrived, and whether
    /// the end (EOF or reset) was seen.
    func readToEnd(timeout: Duration, limit: Int = 1 << 20) async -> (bytes: [UInt8], ended: Bool) {
        let fd = lock.withLock { self.fd }
        guard fd >= 0 else { return ([], true) }
        return (try? await runBlocking("attacker-read") { () -> ([UInt8], Bool) in
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline, received.count < limit {
                var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&entry, 1, 100) == 1 else { continue }
                let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if count > 0 {
                    received += buffer[..<count]
                } else if count == 0 || (errno != EAGAIN && errno != EINTR) {
                    return (received, true)
                }
            }
            return (received, false)
        }) ?? ([], false)
    }

    func close() {
        let fd = lock.withLock { () -> Int32 in
            defer { self.fd = -1 }
            return self.fd
        }
        if fd >= 0 { Glibc.close(fd) }
    }
}

struct AttackError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// What an attacker sends on a fresh connection, before any authentication.
enum Attack: Sendable, CustomStringConvertible {
    /// Connects and sends nothing.
    case silent
    /// A valid preface, then nothing.
    case prefaceOnly
    /// Preface, verdict 0 and 10 of the 32 bytes of Noise message 1, then nothing: a handshake
    /// held open as long as the victim allows.
    case slowLoris
    /// A refusing verdict whose reason tries to act on the victim's terminal.
    case refusingVerdict(reason: String)
    /// Preface, verdict 0, then `count` records that are no Noise message at all.
    case recordFlood(count: Int)
    /// Preface, verdict 0, then a handshake record of the largest length and only part of it.
    case oversizedRecord

    var description: String {
        switch self {
        case .silent: "silent"
        case .prefaceOnly: "preface only"
        case .slowLoris: "slow loris"
        case .refusingVerdict: "refusing verdict"
        case .recordFlood(let count): "\(count) records before authentication"
        case .oversizedRecord: "oversized record"
        }
    }

    /// The bytes it sends, for a victim serving `service`.
    func bytes(service: ServiceType) -> [UInt8] {
        let preface = (try? LinkPreface(encryption: .optional, service: service).encoded()) ?? []
        switch self {
        case .silent:
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
}

extension Attack {
    /// Opens a connection from `source` and sends the attack; the socket stays open (for a
    /// slow loris, until the victim closes it).
    static func launch(_ attack: Attack, port: UInt16, from source: String?, service: ServiceType) async throws -> RawSocket {
        let socket = try await RawSocket.connect(to: port, from: source)
        let bytes = attack.bytes(service: service)
        if !bytes.isEmpty { await socket.write(bytes) }
        return socket
    }
}

/// A short hostile text: what a refusing peer would like a terminal to do.
enum InjectionText {
    static let reason =
        "\r* mallory joined\n\u{1B}]0;owned\u{07}\u{1B}[2J\u{1B}[31mred\u{9B}0m\u{202E}txt.exe\u{1B}]8;;http://x\u{1B}\\"

    /// Whether `text` holds anything a terminal would act on.
    static func isRaw(_ text: String) -> Bool {
        text.unicodeScalars.contains { $0 != "\\" && PeerText.needsEscape($0) }
    }
}
