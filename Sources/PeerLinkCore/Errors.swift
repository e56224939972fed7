/// The error every PeerLink API throws at its public boundary.
///
/// `code` follows MultipeerConnectivity's error codes so an MPC developer can switch on the same
/// cases; `message` is written for the person at the keyboard: what went wrong and what to do.
public struct PeerLinkError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Hashable, Sendable, CaseIterable {
        case unknown
        case notConnected
        case invalidParameter
        case unsupported
        case timedOut
        case cancelled
        case unavailable
    }

    public var code: Code
    public var message: String
    /// A dial's error when the far end answered that nothing listens at the address
    /// (`ECONNREFUSED`): the machine is there, the peer's session is not (code `unavailable`).
    public var nothingListens: Bool

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
        nothingListens = false
    }

    /// A dial refused because nothing listens at the address (``nothingListens``).
    public static func nothingListens(_ message: String) -> PeerLinkError {
        var error = PeerLinkError(.unavailable, message)
        error.nothingListens = true
        return error
    }

    public var description: String { message }

    /// Whether `error` only says that a task was cancelled: Swift's `CancellationError`, or the
    /// `cancelled` code the transports map it to (a cancelled read, write, dial or accept over
    /// TCP or Bluetooth).
    package static func isCancellation(_ error: any Error) -> Bool {
        error is CancellationError || (error as? PeerLinkError)?.code == .cancelled
    }
}
