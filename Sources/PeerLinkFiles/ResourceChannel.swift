import PeerLinkCore

/// An ordered, reliable byte stream to one peer that a file transfer runs over: a session's
/// `PeerStream` named ``PeerLinkCore/ResourceProtocol/streamName``, or a pipe in tests.
///
/// Errors the methods throw tell the transfer what happened: a ``PeerLinkCore/PeerLinkError``
/// with code `cancelled` means the peer reset the stream (its message carries the peer's
/// reason); any other error means the link went away, and a sender resumes once the peer is
/// back. A ``read()`` or ``write(_:)`` that waits must end (throwing `CancellationError`) when
/// its task is cancelled: a sender reads the receiver's answer while it writes, and cancels
/// the write when an answer comes before the last byte.
public protocol ResourceChannel: Sendable {
    /// Writes all of `bytes`, suspending while the peer cannot take more (back-pressure).
    func write(_ bytes: [UInt8]) async throws
    /// Half-closes: no more bytes from this side.
    func finish() async throws
    /// Abandons the stream in both directions, telling the peer why.
    func reset(reason: String)
    /// The next bytes from the peer; nil once the peer finished.
    func read() async throws -> [UInt8]?
}

/// Reads whole ``PeerLinkCore/ResourceMessage``s from a channel.
struct MessageReader: Sendable {
    let channel: any ResourceChannel
    private var decoder = ResourceMessageDecoder()

    init(_ channel: any ResourceChannel) {
        self.channel = channel
    }

    /// The next message; nil when the peer finished between messages.
    /// - Throws: what the channel throws, or a ``PeerLinkCore/PeerLinkError`` for a malformed
    ///   message or a stream that ends inside one.
    mutating func next() async throws -> ResourceMessage? {
        while true {
            if let message = try decoder.next() { return message }
            guard let bytes = try await channel.read() else {
                if decoder.pendingBytes > 0 {
                    throw PeerLinkError(.unknown, "the peer's resource stream ended inside a message: it may run an incompatible PeerLink")
                }
                return nil
            }
            decoder.append(bytes)
        }
    }
}

extension ResourceChannel {
    func send(_ message: ResourceMessage) async throws {
        try await write(try message.encoded())
    }
}
