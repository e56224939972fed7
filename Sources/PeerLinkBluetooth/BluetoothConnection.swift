#if canImport(Glibc)
import Glibc
#endif
import PeerLinkCore
import PeerLinkPosix

/// A connected RFCOMM or L2CAP socket.
///
/// RFCOMM is a byte stream: ``read()`` returns what arrived, ``write(_:)`` sends it all.
/// L2CAP (`SOCK_SEQPACKET`) keeps packet boundaries: each ``read()`` returns exactly one packet,
/// and ``write(_:)`` splits its bytes into packets of at most ``outgoingMTU`` (the largest packet
/// the peer accepts, negotiated when the channel was set up).
///
/// Reads and writes never block a thread: a call that would block waits for the socket on
/// PeerLink's one I/O thread. At most one read and one write at a time. Failures are ``SystemError``s; ``BluetoothLinkChannel``
/// turns them into ``PeerLinkError``s that say what to do.
public final class BluetoothConnection: Sendable {
    public let kind: BluetoothSocketKind
    /// The adapter this end uses.
    public let localAddress: BluetoothAddress
    /// The device at the other end.
    public let remoteAddress: BluetoothAddress
    /// The channel / PSM of the link: the one dialled, or the one accepted on.
    public let port: UInt16
    /// Whether the link was accepted (not dialled) by this side.
    public let isIncoming: Bool
    /// L2CAP: the largest packet this side may send (the peer's incoming MTU); nil for RFCOMM.
    public let outgoingMTU: Int?
    /// L2CAP: the largest packet this side accepts; nil for RFCOMM.
    public let incomingMTU: Int?
    /// L2CAP: whether the channel runs in Enhanced Retransmission Mode (flow-controlled and
    /// retransmitting; what PeerLink asks for) rather than Basic mode (a peer without ERTM),
    /// where a receiver that falls behind loses packets; nil for RFCOMM (always reliable).
    public let retransmissionMode: Bool?
    private let descriptor: Descriptor

    /// Takes over a connected socket.
    init(fd: Int32, kind: BluetoothSocketKind, port: UInt16, incoming: Bool) throws(SystemError) {
        let local = try BTSocket.name(fd, kind, peer: false)
        let remote = try BTSocket.name(fd, kind, peer: true)
        self.kind = kind
        self.localAddress = local.0
        self.remoteAddress = remote.0
        self.port = port
        self.isIncoming = incoming
        if kind == .l2cap {
            let options = try BTSocket.channelOptions(fd)
            outgoingMTU = options.outgoing
            incomingMTU = options.incoming
            retransmissionMode = options.retransmission
        } else {
            outgoingMTU = nil
            incomingMTU = nil
            retransmissionMode = nil
        }
        descriptor = Descriptor(fd)
    }

    /// The endpoint dialled, `bt://ADDR/rfcomm/CHANNEL` or `bt://ADDR/l2cap/PSM`; nil for an
    /// incoming link (where the peer itself listens is not known from it).
    public var remoteEndpoint: Endpoint? { isIncoming ? nil : kind.endpoint(remoteAddress, port: port) }

    /// Whether ``close()`` was called.
    public var isClosed: Bool { descriptor.isClosed }

    /// Shuts the link down both ways and closes it; a blocked read or write returns.
    public func close() { descriptor.close() }

    /// RFCOMM: the next bytes that arrived; L2CAP: the next packet. An empty array at the end.
    ///
    /// - Throws: a ``SystemError`` when the link failed or was closed on this side (`EBADF`),
    ///   `CancellationError` when the task is cancelled.
    public func read() async throws -> [UInt8] {
        // A packet is never larger than the incoming MTU (at most 65535): one read, one packet.
        try await descriptor.receive(maxCount: incomingMTU ?? 65536)
    }

    /// ``read()`` into the front of `buffer`, grown first to the most one read may bring (the
    /// incoming MTU over L2CAP, so a packet is never cut): how many bytes arrived, 0 at the end.
    /// A caller that passes the same buffer every time has its storage reused, with no
    /// allocation per read.
    ///
    /// - Throws: as ``read()`` does.
    public func read(into buffer: inout [UInt8]) async throws -> Int {
        try await descriptor.receive(into: &buffer, maxCount: incomingMTU ?? 65536)
    }

    /// Writes all of `bytes` (L2CAP: in packets of at most ``outgoingMTU``); returns once the
    /// kernel took the last of them.
    ///
    /// - Throws: a ``SystemError`` when the link is gone (never a `SIGPIPE`) or was closed on
    ///   this side, `CancellationError` when the task is cancelled (then close the link: part of
    ///   `bytes` may have been sent).
    public func write(_ bytes: [UInt8]) async throws {
        // RFCOMM takes any slice; a SEQPACKET send is one packet, all of it or nothing.
        try await descriptor.send(bytes, inPiecesOf: outgoingMTU)
    }

    /// Connects to `address` at `port` (RFCOMM channel or L2CAP PSM) from the adapter with
    /// address `adapter` (``BluetoothAddress/any``: the kernel picks), giving up after `timeout`.
    ///
    /// - Parameter incomingMTU: L2CAP: the largest packet this side accepts (nil: the kernel's
    ///   default, 672 on BR/EDR).
    /// - Throws: a ``SystemError`` (`ETIMEDOUT` after `timeout`), `CancellationError`.
    public static func connect(
        _ kind: BluetoothSocketKind, to address: BluetoothAddress, port: UInt16,
        from adapter: BluetoothAddress = .any, incomingMTU: UInt16? = nil, timeout: Duration
    ) async throws -> BluetoothConnection {
        // The kernel can keep a Bluetooth connect (or the close of one) waiting with no
        // timeout of its own when the controller lost the device mid-link: past the timeout
        // (and a little for the close), the caller goes on and the thread cleans up when it returns.
        try await runBlockingAbandonable("peerlink-bt-connect", limit: timeout + .seconds(2), discard: { $0.close() }) {
            flag throws -> BluetoothConnection in
            let fd = try BTSocket.open(kind)
            do {
                if adapter != .any {
                    try BTSocket.bind(fd, kind, adapter, port: 0)
                }
                if kind == .l2cap { try BTSocket.prepareL2CAP(fd, incomingMTU: incomingMTU) }
                try Sys.setNonBlocking(fd, true)
                let done = try BTSocket.withAddress(kind, address, port: port) { pointer, length throws(SystemError) in
                    try Sys.connectNonBlocking(fd, pointer, length)
                }
                if !done { try finishConnect(fd, timeout: timeout, cancellation: flag) }
                return try BluetoothConnection(fd: fd, kind: kind, port: port, incoming: false)
            } catch {
                Sys.close(fd)
                throw error
            }
        }
    }
}

/// A listening RFCOMM or L2CAP socket on one adapter, or on all.
public final class BluetoothListener: Sendable {
    public let kind: BluetoothSocketKind
    /// The adapter listened on (``BluetoothAddress/any``: every adapter).
    public let adapter: BluetoothAddress
    /// The channel / PSM taken: the one asked for, or the one the kernel picked for 0.
    public let port: UInt16
    private let descriptor: Descriptor

    /// Listens on `port` (RFCOMM channel 1–30 or L2CAP PSM; 0: the kernel picks a free one) of
    /// the adapter with address `adapter` (``BluetoothAddress/any``: every adapter).
    ///
    /// - Parameter incomingMTU: L2CAP: the largest packet accepted links take (nil: the
    ///   kernel's default, 672 on BR/EDR).
    public init(
        _ kind: BluetoothSocketKind, adapter: BluetoothAddress = .any, port: UInt16 = 0, incomingMTU: UInt16? = nil
    ) throws(SystemError) {
        let fd = try BTSocket.open(kind)
        do {
            try BTSocket.bind(fd, kind, adapter, port: port)
            if kind == .l2cap { try BTSocket.prepareL2CAP(fd, incomingMTU: incomingMTU) }
            // RFCOMM picks a free channel for 0 here, at listen; L2CAP picked a PSM at bind.
            try Sys.listen(fd, 16)
            try Sys.setNonBlocking(fd, true)
            self.port = try BTSocket.name(fd, kind, peer: false).1
        } catch {
            Sys.close(fd)
            throw error
        }
        self.kind = kind
        self.adapter = adapter
        self.descriptor = Descriptor(fd)
    }

    /// Waits for the next link: tried at once, and while none is pending, parked on the I/O
    /// thread that serves every link's reads and writes (no thread of its own, no polling), as
    /// TCP's accept. Throws once the listener is closed (`close()` shuts the socket down, which
    /// ends the wait), and `CancellationError` when the task is cancelled.
    public func accept() async throws -> BluetoothConnection {
        while true {
            try Task.checkCancellation()
            let fd = try descriptor.acquire("accept")
            defer { descriptor.release() }
            guard let accepted = try Self.acceptNow(fd) else {
                try await Readiness.shared.wait(for: fd, events: Int16(POLLIN))
                continue
            }
            if accepted < 0 { continue }  // gone before it was accepted: try again at once
            do {
                return try BluetoothConnection(fd: accepted, kind: kind, port: port, incoming: true)
            } catch {
                // gone before it could be looked at: wait for the next one
                Sys.close(accepted)
            }
        }
    }

    /// One `accept` on the non-blocking socket: the new descriptor, nil when none is pending,
    /// -1 when one was aborted before it was taken.
    private static func acceptNow(_ fd: Int32) throws(SystemError) -> Int32? {
        do throws(SystemError) {
            return try Sys.wouldBlockAsNil { () throws(SystemError) in try Sys.accept(fd) }
        } catch where error.errno == ECONNABORTED || error.errno == EPROTO {
            return -1
        }
    }

    /// Stops listening; a pending ``accept()`` throws.
    public func close() { descriptor.close() }
}
