#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// A ``LinkChannel`` over one RFCOMM or L2CAP connection.
///
/// Over L2CAP the link's byte stream is carried in packets of at most the outgoing MTU; the
/// records in it are length-prefixed, so the receiver needs no packet boundaries to find them.
public final class BluetoothLinkChannel: LinkChannel {
    /// `rfcomm` or `l2cap`.
    public let transport: String
    public let remoteDescription: String
    /// The connection underneath.
    public let connection: BluetoothConnection

    public init(_ connection: BluetoothConnection) {
        self.connection = connection
        transport = connection.kind.rawValue
        // dialled: the endpoint; accepted: the device, and the channel / PSM it came in on
        remoteDescription = connection.remoteEndpoint?.description
            ?? "bt://\(connection.remoteAddress)/\(connection.kind.rawValue) (in on \(connection.kind.portDescription(connection.port)))"
    }

    public func read() async throws -> [UInt8] {
        do {
            return try await connection.read()
        } catch {
            throw BluetoothErrors.link(error, remote: remoteDescription)
        }
    }

    public func write(_ bytes: [UInt8]) async throws {
        do {
            try await connection.write(bytes)
        } catch {
            throw BluetoothErrors.link(error, remote: remoteDescription)
        }
    }

    public func close() { connection.close() }
}

/// Dials `bt://ADDR/rfcomm/CHANNEL` and `bt://ADDR/l2cap/PSM` endpoints from one adapter (or
/// whichever the kernel picks). Other endpoints throw ``PeerLinkError`` with code `unsupported`.
public struct BluetoothTransport: Transport {
    public var name: String { "bluetooth" }
    /// The adapter links leave from (``BluetoothAddress/any``: the kernel picks).
    public let adapter: BluetoothAddress
    /// L2CAP: the largest packet this side accepts (nil: the kernel's default, 672).
    public let incomingMTU: UInt16?

    public init(adapter: BluetoothAddress = .any, incomingMTU: UInt16? = nil) {
        self.adapter = adapter
        self.incomingMTU = incomingMTU
    }

    public func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel {
        BluetoothLinkChannel(try await connect(endpoint, timeout: timeout))
    }

    /// Dials `endpoint` and returns the connection itself (its MTUs, addresses).
    public func connect(_ endpoint: Endpoint, timeout: Duration) async throws(PeerLinkError) -> BluetoothConnection {
        let kind: BluetoothSocketKind
        let address: BluetoothAddress
        let port: UInt16
        switch endpoint {
        case .rfcomm(let remote, let channel):
            (kind, address, port) = (.rfcomm, remote, UInt16(channel.value))
        case .l2cap(let remote, let psm):
            (kind, address, port) = (.l2cap, remote, psm.value)
        default:
            throw PeerLinkError(.unsupported, "the Bluetooth transport dials bt:// endpoints, not \(endpoint)")
        }
        guard timeout > .zero else {
            throw PeerLinkError(.invalidParameter, "the dial timeout must be positive, not \(DurationText.seconds(timeout))")
        }
        try BluetoothErrors.requireLocalAdapter(adapter)
        do {
            return try await BluetoothConnection.connect(
                kind, to: address, port: port, from: adapter, incomingMTU: incomingMTU, timeout: timeout)
        } catch {
            throw BluetoothErrors.dial(error, endpoint: endpoint, kind: kind, port: port, adapter: adapter, timeout: timeout)
        }
    }
}

/// Incoming RFCOMM or L2CAP links: a ``BluetoothListener`` as a ``TransportListener``.
public final class BluetoothTransportListener: TransportListener {
    /// Where peers reach this listener: the adapter's address (each adapter that is up, when
    /// listening on all) with the channel / PSM.
    public let localEndpoints: [Endpoint]
    public let kind: BluetoothSocketKind
    /// The channel / PSM taken (the kernel's pick when 0 was asked for).
    public let port: UInt16
    private let listener: BluetoothListener

    /// Listens on `port` (RFCOMM channel 1–30 or L2CAP PSM; 0: the kernel picks a free one) of
    /// the adapter with address `adapter` (``BluetoothAddress/any``: every adapter).
    public init(
        _ kind: BluetoothSocketKind, adapter: BluetoothAddress = .any, port: UInt16 = 0, incomingMTU: UInt16? = nil
    ) throws(PeerLinkError) {
        try BluetoothErrors.requireLocalAdapter(adapter)
        do {
            listener = try BluetoothListener(kind, adapter: adapter, port: port, incomingMTU: incomingMTU)
        } catch {
            throw BluetoothErrors.listen(error, kind: kind, adapter: adapter, port: port)
        }
        self.kind = kind
        let port = listener.port
        self.port = port
        var addresses = [adapter]
        if adapter == .any {
            addresses = ((try? BluetoothAdapter.all()) ?? []).filter(\.isUp).compactMap { BluetoothAddress($0.address) }
        }
        localEndpoints = addresses.compactMap { kind.endpoint($0, port: port) }
    }

    public func accept() async throws -> any LinkChannel {
        BluetoothLinkChannel(try await acceptConnection())
    }

    /// The next incoming connection itself (its MTUs, addresses).
    public func acceptConnection() async throws(PeerLinkError) -> BluetoothConnection {
        do {
            return try await listener.accept()
        } catch {
            throw BluetoothErrors.accept(error, kind: kind, port: port)
        }
    }

    public func close() { listener.close() }
}

/// A duration as people read it: `5 s`, `2.5 s`.
enum DurationText {
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
