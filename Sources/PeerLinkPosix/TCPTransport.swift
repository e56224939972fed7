#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore

/// A ``LinkChannel`` over one TCP connection.
///
/// Reads and writes that cannot go on at once wait on the process's I/O thread (see
/// ``TCPConnection``); `close()` unblocks a pending read, which then throws. Failures are
/// ``PeerLinkError``s whose messages say what to do.
public final class TCPLinkChannel: LinkChannel {
    public let transport = "tcp"
    public let remoteDescription: String
    /// The connection underneath.
    public let connection: TCPConnection

    public init(_ connection: TCPConnection) {
        self.connection = connection
        if let remote = connection.remote {
            remoteDescription = Endpoint.tcp(host: remote.host, port: remote.port).description
        } else {
            remoteDescription = "tcp://(unknown peer)"
        }
    }

    public func read() async throws -> [UInt8] {
        do {
            return try await connection.read()
        } catch {
            throw TCPErrors.link(error, remote: remoteDescription)
        }
    }

    public func read(into buffer: inout [UInt8]) async throws -> Int {
        do {
            return try await connection.read(into: &buffer)
        } catch {
            throw TCPErrors.link(error, remote: remoteDescription)
        }
    }

    public func write(_ bytes: [UInt8]) async throws {
        do {
            try await connection.write(bytes)
        } catch {
            throw TCPErrors.link(error, remote: remoteDescription)
        }
    }

    public func writeNow(_ bytes: [UInt8]) throws -> Int {
        do {
            return try connection.writeNow(bytes)
        } catch {
            throw TCPErrors.link(error, remote: remoteDescription)
        }
    }

    public func close() { connection.close() }

    /// Half-closes the connection: the peer reads the end of the stream after the last write.
    public func finishWriting() { connection.finishWriting() }

    /// 128 KiB (eight full frames): over TCP a batch is written faster than a message queued
    /// behind it notices (the kernel's socket buffers hold far more), and a bulk transfer makes
    /// a quarter of the system calls it would in 32 KiB batches.
    public var writeBatchLimit: Int { 8 * WireFormat.maxFramePayload }

    /// ``PeerLinkCore/WireFormat/largeFramePayload``: a frame of 60 KiB takes about 40 µs to
    /// cross loopback, and a quarter of the frames for a bulk transfer cost a quarter of the
    /// framing, sealing and bookkeeping.
    public var largestFramePayload: Int { WireFormat.largeFramePayload }
}

/// Dials `tcp://` endpoints. Other endpoints throw ``PeerLinkError`` with code `unsupported`,
/// so a composite transport can try the next transport.
public struct TCPTransport: Transport {
    public var name: String { "tcp" }
    public var kinds: Set<TransportKind> { [.tcp] }

    public init() {}

    public func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel {
        guard let target = endpoint.tcp else {
            throw PeerLinkError(.unsupported, "the TCP transport dials tcp:// endpoints, not \(endpoint)")
        }
        let (host, port) = (target.host, target.port)
        guard let address = IPSocketAddress(host: host, port: port) else {
            throw PeerLinkError(
                .invalidParameter,
                "'\(host)' is not a numeric IP address: give one such as 192.0.2.7, ::1 or fe80::1%eth0")
        }
        guard port != 0 else {
            throw PeerLinkError(.invalidParameter, "\(endpoint) has port 0: give the port the peer listens on")
        }
        guard timeout > .zero else {
            throw PeerLinkError(.invalidParameter, "the dial timeout must be positive, not \(TCPErrors.seconds(timeout))")
        }
        do {
            return TCPLinkChannel(try await TCPConnection.connect(to: address, timeout: timeout))
        } catch {
            throw TCPErrors.dial(error, endpoint: endpoint, timeout: timeout)
        }
    }
}

/// Incoming TCP links: a ``TCPListener`` as a ``TransportListener``.
public final class TCPTransportListener: TransportListener {
    /// Where peers reach this listener: the address listened on (`::` or `0.0.0.0` for all
    /// interfaces) and the port.
    public let localEndpoints: [Endpoint]
    public let port: UInt16
    private let listener: TCPListener

    /// Listens on `port` (0: any free port) on `host` (a numeric address of this machine, such
    /// as `127.0.0.1`; nil: all interfaces). `limits` say how many descriptors accepting keeps
    /// in reserve and how it backs off when the process has none left (see ``TCPListener``).
    public init(host: String? = nil, port: UInt16 = 0, limits: ResourceLimits = .default) throws(PeerLinkError) {
        do {
            listener = try TCPListener(host: host, port: port, limits: limits)
        } catch {
            throw TCPErrors.listen(error, host: host, port: port)
        }
        self.port = listener.port
        localEndpoints = [.tcp(host: listener.host, port: listener.port)]
    }

    public func accept() async throws -> any LinkChannel {
        do {
            return TCPLinkChannel(try await listener.accept())
        } catch {
            throw TCPErrors.accept(error, port: port)
        }
    }

    public func close() { listener.close() }

    /// Connections closed at once: to keep descriptors in reserve, or while the process had none.
    public var shedConnections: Int { listener.shedConnections }
}

/// Socket errors become ``PeerLinkError``s here, once, with messages that say what to do.
enum TCPErrors {
    static func dial(_ error: any Error, endpoint: Endpoint, timeout: Duration) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "the dial to \(endpoint)") }
        switch error.errno {
        case ECONNREFUSED:
            return .nothingListens("nothing listens at \(endpoint): is the peer still running?")
        case ETIMEDOUT:
            return PeerLinkError(
                .timedOut,
                "\(endpoint) did not answer within \(seconds(timeout)): check that both machines are on the same network")
        case EHOSTUNREACH, ENETUNREACH, EHOSTDOWN, ENETDOWN:
            return PeerLinkError(
                .unavailable,
                "\(endpoint) cannot be reached from this machine (\(strerror(error))): "
                    + "check that both machines are on the same network")
        case EADDRNOTAVAIL, EAFNOSUPPORT:
            return PeerLinkError(
                .unavailable,
                "this machine has no address from which to reach \(endpoint) (\(strerror(error))): "
                    + "check that its network interface is up")
        case EACCES, EPERM:
            return PeerLinkError(
                .unavailable, "the system refused to connect to \(endpoint) (\(strerror(error))): check the firewall rules")
        case EMFILE, ENFILE:
            return tooManyFiles
        default:
            return PeerLinkError(.unknown, "the dial to \(endpoint) failed: \(error)")
        }
    }

    static func link(_ error: any Error, remote: String) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "the link to \(remote)") }
        switch error.errno {
        case EBADF:
            return PeerLinkError(.notConnected, "the link to \(remote) was closed on this side")
        case ECONNRESET, EPIPE, ENOTCONN, ECONNABORTED:
            return PeerLinkError(
                .notConnected, "the peer at \(remote) reset the connection: it stopped, or its network went away")
        case ETIMEDOUT, EHOSTUNREACH, ENETUNREACH:
            return PeerLinkError(
                .timedOut, "the peer at \(remote) stopped answering (\(strerror(error))): check the network between the machines")
        default:
            return PeerLinkError(.unknown, "the link to \(remote) failed: \(error)")
        }
    }

    static func listen(_ error: SystemError, host: String?, port: UInt16) -> PeerLinkError {
        let place = host.map { "\($0) port \(port)" } ?? "port \(port)"
        switch error.errno {
        case EINVAL where error.call == "inet_pton":
            return PeerLinkError(
                .invalidParameter, "'\(host ?? "")' is not a numeric IP address: give one such as 127.0.0.1 or ::1")
        case EADDRINUSE:
            return PeerLinkError(
                .unavailable, "\(place) is already in use by another program: choose another port, or 0 for any free one")
        case EACCES, EPERM:
            return PeerLinkError(
                .unavailable, "\(place) is reserved for privileged programs: choose a port above 1023, or 0 for any free one")
        case EADDRNOTAVAIL:
            return PeerLinkError(
                .invalidParameter, "\(host ?? "the address") is not an address of this machine: listen on one of its addresses, or on all")
        case EAFNOSUPPORT:
            return PeerLinkError(.unavailable, "this machine does not speak that address family (\(strerror(error))): listen on another address")
        case EMFILE, ENFILE:
            return tooManyFiles
        default:
            return PeerLinkError(.unknown, "listening on \(place) failed: \(error)")
        }
    }

    static func accept(_ error: any Error, port: UInt16) -> PeerLinkError {
        guard let error = error as? SystemError else { return other(error, "accepting on port \(port)") }
        switch error.errno {
        case EBADF, EINVAL:
            return PeerLinkError(.notConnected, "the listener on port \(port) is closed")
        case EMFILE, ENFILE:
            return tooManyFiles
        default:
            return PeerLinkError(.unknown, "accepting a link on port \(port) failed: \(error)")
        }
    }

    static let tooManyFiles = PeerLinkError(
        .unavailable, "this process has too many open files: close links it no longer needs, or raise the limit (ulimit -n)")

    /// Errors other than a ``SystemError``: cancellation, or one already mapped.
    private static func other(_ error: any Error, _ what: String) -> PeerLinkError {
        if let error = error as? PeerLinkError { return error }
        if error is CancellationError { return PeerLinkError(.cancelled, "\(what) was cancelled") }
        return PeerLinkError(.unknown, "\(what) failed: \(error)")
    }

    private static func strerror(_ error: SystemError) -> String {
        String(cString: Glibc.strerror(error.errno))
    }

    /// A duration as people read it: `5 s`, `2.5 s`.
    static func seconds(_ duration: Duration) -> String {
        let (whole, attoseconds) = duration.components
        let milliseconds = attoseconds / 1_000_000_000_000_000
        guard milliseconds != 0 else { return "\(whole) s" }
        var fraction = String(milliseconds)
        while fraction.count < 3 { fraction = "0" + fraction }
        while fraction.hasSuffix("0") { fraction.removeLast() }
        return "\(whole).\(fraction) s"
    }
}
