/// An ordered, reliable byte stream to one peer, as a transport provides it: a TCP connection,
/// an RFCOMM channel, an L2CAP channel (whose packets are concatenated), or an in-memory pipe in
/// tests. The link protocol (``LinkStateMachine``) runs on top; sessions never see sockets.
public protocol LinkChannel: AnyObject, Sendable {
    /// The transport's name as tools show it: `tcp`, `rfcomm`, `l2cap`, `memory`.
    var transport: String { get }
    /// The remote end, for logs and `/peers` (e.g. `tcp://10.99.0.11:40123`).
    var remoteDescription: String { get }
    /// The next bytes that arrived; an empty array at the end of the stream. Throws when the
    /// channel failed (reset, closed locally).
    func read() async throws -> [UInt8]
    /// Writes all of `bytes`; returns when the transport took them (back-pressure).
    func write(_ bytes: [UInt8]) async throws
    /// Closes both directions; a pending read returns or throws. Idempotent.
    func close()
}

/// A way to reach peers: listens for incoming links and dials endpoints.
///
/// `dial` throws a ``PeerLinkError`` with code `unsupported` for an endpoint of another transport,
/// so a composite transport can try the next one.
public protocol Transport: Sendable {
    var name: String { get }
    /// Dials `endpoint`, giving up after `timeout`.
    func dial(_ endpoint: Endpoint, timeout: Duration) async throws -> any LinkChannel
}

/// Incoming links of a transport that listens.
public protocol TransportListener: AnyObject, Sendable {
    /// Where peers can reach this listener (e.g. the TCP port to advertise).
    var localEndpoints: [Endpoint] { get }
    /// The next incoming link; throws once the listener is closed.
    func accept() async throws -> any LinkChannel
    func close()
}
