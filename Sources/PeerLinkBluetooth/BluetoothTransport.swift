#if canImport(Glibc)
import Glibc
#endif
import Logging
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

    public func read(into buffer: inout [UInt8]) async throws -> Int {
        do {
            return try await connection.read(into: &buffer)
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
    public var kinds: Set<TransportKind> { [.rfcomm, .l2cap] }
    /// The adapter links leave from (``BluetoothAddress/any``: the kernel picks).
    public let adapter: BluetoothAddress
    /// L2CAP: the largest packet this side accepts (nil: the kernel's default, 672).
    public let incomingMTU: UInt16?
    let logger: Logger

    public init(adapter: BluetoothAddress = .any, incomingMTU: UInt16? = nil, logger: Logger = Logger(label: "peerlink.bluetooth")) {
        self.adapter = adapter
        self.incomingMTU = incomingMTU
        self.logger = logger
    }

    public func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel {
        BluetoothLinkChannel(try await connect(endpoint, timeout: timeout))
    }

    /// Dials `endpoint` and returns the connection itself (its MTUs, addresses).
    public func connect(_ endpoint: Endpoint, timeout: Duration) async throws(PeerLinkError) -> BluetoothConnection {
        guard let target = endpoint.bluetooth else {
            throw PeerLinkError(.unsupported, "the Bluetooth transport dials bt:// endpoints, not \(endpoint)")
        }
        let (kind, address, port) = (target.socketKind, target.address, target.portNumber)
        guard timeout > .zero else {
            throw PeerLinkError(.invalidParameter, "the dial timeout must be positive, not \(DurationText.seconds(timeout))")
        }
        try BluetoothErrors.requireAdapterUp(adapter)
        // bluetoothd and the device's SDP server are asked on threads of their own (BluetoothBonds).
        let bond = await BluetoothBonds.heldBond(with: address, from: adapter)
        do {
            return try await BluetoothConnection.connect(
                kind, to: address, port: port, from: adapter, incomingMTU: incomingMTU, timeout: timeout)
        } catch {
            // A refusal from a device this machine keeps a bond with, while its SDP server lists
            // that channel / PSM: the device dropped the bond (see BluetoothBonds). Heal, and dial once more.
            if let bond, let failure = error as? SystemError, [ECONNREFUSED, EACCES, EPERM, ECONNRESET].contains(failure.errno),
                await BluetoothBonds.serves(address, kind: kind, port: port, from: adapter)
            {
                do {
                    try await BluetoothBonds.remove(address, on: bond)
                    logger.info(
                        "removed this machine's stale pairing with the device: it no longer has it, and refused the link",
                        metadata: ["adapter": "\(bond)", "device": "\(address)", "link.remote": "\(endpoint)"])
                    return try await BluetoothConnection.connect(
                        kind, to: address, port: port, from: adapter, incomingMTU: incomingMTU, timeout: timeout)
                } catch {
                    throw BluetoothErrors.dial(error, endpoint: endpoint, kind: kind, port: port, adapter: adapter, timeout: timeout)
                }
            }
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
    /// The adapters held reachable while this listens (``BluetoothVisibilityHold``).
    private let holds: [BluetoothVisibilityHold]

    /// Listens on `port` (RFCOMM channel 1–30 or L2CAP PSM; 0: the kernel picks a free one) of
    /// the adapter with address `adapter` (``BluetoothAddress/any``: every adapter).
    ///
    /// With `reachable` (the default) and bluetoothd running, each adapter listened on is kept
    /// discoverable while the listener is open — stock bluetoothd makes an adapter connectable
    /// only for paired devices otherwise (``BluetoothVisibilityHold``). Pass false where the
    /// adapter's scan mode is managed otherwise.
    ///
    /// Holding an adapter asks bluetoothd over D-Bus on the caller's thread, which blocks until it
    /// answers (up to 25 s when it hangs); so does ``close()``, giving the adapter back. From
    /// async code, make and close it through ``PeerLinkPosix/runBlocking(_:_:)`` (a
    /// ``PeerNode`` made with `PeerNode.open` does).
    public init(
        _ kind: BluetoothSocketKind, adapter: BluetoothAddress = .any, port: UInt16 = 0, incomingMTU: UInt16? = nil,
        reachable: Bool = true
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
        let adapters = ((try? BluetoothAdapter.all()) ?? []).filter { candidate in
            adapter == .any ? candidate.isUp : BluetoothAddress(candidate.address) == adapter
        }
        var addresses = [adapter]
        if adapter == .any { addresses = adapters.compactMap { BluetoothAddress($0.address) } }
        localEndpoints = addresses.compactMap { kind.endpoint($0, port: port) }
        var holds: [BluetoothVisibilityHold] = []
        if reachable {
            do {
                for chosen in adapters {
                    if let hold = try BluetoothVisibilityHold.acquire(adapter: chosen.name) { holds.append(hold) }
                }
            } catch {
                holds.forEach { $0.release() }
                listener.close()
                throw error
            }
        }
        self.holds = holds
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

    public func close() {
        listener.close()
        holds.forEach { $0.release() }
    }
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
