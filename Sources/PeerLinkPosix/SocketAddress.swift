#if canImport(Glibc)
import Glibc
#endif

/// An IPv4 or IPv6 socket address, as a value. IPv6 link-local addresses keep their zone
/// (the interface index), written `fe80::1%eth0`.
public struct IPSocketAddress: Hashable, Sendable, CustomStringConvertible {
    public enum Family: Hashable, Sendable { case ipv4, ipv6 }

    public let host: String
    public let port: UInt16
    let storage: Storage

    enum Storage: Hashable, Sendable {
        case v4(UInt32)  // network byte order
        case v6([UInt8], scope: UInt32)
    }

    public var family: Family {
        if case .v4 = storage { return .ipv4 }
        return .ipv6
    }

    /// Parses a numeric host (`10.99.0.11`, `::1`, `fe80::1%eth0`). Returns nil for names.
    public init?(host: String, port: UInt16) {
        self.port = port
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            storage = .v4(v4.s_addr)
            self.host = host
            return
        }
        var text = host
        var scope: UInt32 = 0
        if let percent = host.firstIndex(of: "%") {
            text = String(host[..<percent])
            let zone = String(host[host.index(after: percent)...])
            scope = UInt32(zone) ?? if_nametoindex(zone)
            if scope == 0 { return nil }
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        storage = .v6(withUnsafeBytes(of: v6) { Array($0) }, scope: scope)
        self.host = host
    }

    init(_ address: UnsafePointer<sockaddr>) {
        if Int32(address.pointee.sa_family) == AF_INET {
            let v4 = UnsafeRawPointer(address).load(as: sockaddr_in.self)
            storage = .v4(v4.sin_addr.s_addr)
            port = UInt16(bigEndian: v4.sin_port)
            host = Self.format(family: AF_INET, v4.sin_addr)
        } else {
            let v6 = UnsafeRawPointer(address).load(as: sockaddr_in6.self)
            storage = .v6(withUnsafeBytes(of: v6.sin6_addr) { Array($0) }, scope: v6.sin6_scope_id)
            port = UInt16(bigEndian: v6.sin6_port)
            var text = Self.format(family: AF_INET6, v6.sin6_addr)
            // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d; show them as IPv4.
            if text.hasPrefix("::ffff:"), text.contains(".") { text.removeFirst(7) }
            if v6.sin6_scope_id != 0 {
                var name = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
                if if_indextoname(v6.sin6_scope_id, &name) != nil {
                    text += "%" + String(decoding: name.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
                } else {
                    text += "%\(v6.sin6_scope_id)"
                }
            }
            host = text
        }
    }

    static func format(family: Int32, _ address: in_addr) -> String {
        withUnsafeBytes(of: address) { format(family: family, bytes: $0) }
    }

    static func format(family: Int32, _ address: in6_addr) -> String {
        withUnsafeBytes(of: address) { format(family: family, bytes: $0) }
    }

    static func format(family: Int32, bytes: UnsafeRawBufferPointer) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        _ = inet_ntop(family, bytes.baseAddress, &buffer, socklen_t(buffer.count))
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
    }

    /// Calls `body` with a `sockaddr` for this address.
    package func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws(SystemError) -> R) throws(SystemError) -> R {
        switch storage {
        case .v4(let raw):
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = raw
            return try withUnsafePointer(to: &address) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socket throws(SystemError) in
                    try body(socket, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        case .v6(let bytes, let scope):
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            address.sin6_scope_id = scope
            withUnsafeMutableBytes(of: &address.sin6_addr) { $0.copyBytes(from: bytes) }
            return try withUnsafePointer(to: &address) { pointer throws(SystemError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socket throws(SystemError) in
                    try body(socket, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        }
    }

    public var description: String {
        family == .ipv6 ? "[\(host)]:\(port)" : "\(host):\(port)"
    }
}
