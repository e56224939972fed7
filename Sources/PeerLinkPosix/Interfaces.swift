#if canImport(Glibc)
import Glibc
#endif

/// A network interface as `peerlink radios` shows it.
public struct NetworkInterface: Hashable, Sendable, Codable {
    public var name: String
    public var index: UInt32
    public var isUp: Bool
    public var isRunning: Bool
    public var isLoopback: Bool
    public var supportsMulticast: Bool
    /// Numeric addresses with prefix length, e.g. `10.99.0.11/24`, `fe80::1%eth0/64`.
    public var addresses: [String]

    /// All interfaces of this network namespace, in index order.
    public static func all() throws(SystemError) -> [NetworkInterface] {
        guard let list = try Sys.getifaddrs() else { return [] }
        defer { Sys.freeifaddrs(list) }
        var byName: [String: NetworkInterface] = [:]
        var cursor: UnsafeMutablePointer<ifaddrs>? = list
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            let name = String(cString: entry.pointee.ifa_name)
            let flags = entry.pointee.ifa_flags
            var interface = byName[name] ?? NetworkInterface(
                name: name, index: if_nametoindex(name),
                isUp: flags & UInt32(IFF_UP) != 0,
                isRunning: flags & UInt32(IFF_RUNNING) != 0,
                isLoopback: flags & UInt32(IFF_LOOPBACK) != 0,
                supportsMulticast: flags & UInt32(IFF_MULTICAST) != 0,
                addresses: [])
            if let address = entry.pointee.ifa_addr {
                let family = Int32(address.pointee.sa_family)
                if family == AF_INET || family == AF_INET6 {
                    let ip = IPSocketAddress(UnsafePointer(address))
                    let prefix = entry.pointee.ifa_netmask.map { Self.prefixLength(UnsafePointer($0), family: family) }
                    interface.addresses.append(prefix.map { "\(ip.host)/\($0)" } ?? ip.host)
                }
            }
            byName[name] = interface
        }
        return byName.values.sorted { $0.index < $1.index }
    }

    static func prefixLength(_ mask: UnsafePointer<sockaddr>, family: Int32) -> Int {
        let bytes: [UInt8]
        if family == AF_INET {
            let v4 = UnsafeRawPointer(mask).load(as: sockaddr_in.self)
            bytes = withUnsafeBytes(of: v4.sin_addr) { Array($0) }
        } else {
            let v6 = UnsafeRawPointer(mask).load(as: sockaddr_in6.self)
            bytes = withUnsafeBytes(of: v6.sin6_addr) { Array($0) }
        }
        return bytes.reduce(0) { $0 + $1.nonzeroBitCount }
    }
}

/// This machine's host name.
public var localHostName: String { Sys.gethostname() }
