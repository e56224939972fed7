import PeerLinkCore

/// One file on its way to or from a peer: its progress as an async sequence, its result, and
/// a way to cancel it.
///
/// ```swift
/// let transfer = sender.send(file, to: peer)
/// do {
///     for try await progress in transfer.updates { print(progress.fraction, progress.bytesPerSecond) }
///     print("verified by the receiver")
/// } catch {
///     print(error.message)        // a TransferFailure: cancelled by the peer, declined, ...
/// }
/// ```
///
/// ``updates`` is for one consumer; it keeps only the newest few values when nobody reads,
/// and always ends with the transfer: normally on success, throwing the
/// ``TransferFailure`` otherwise. ``result()`` waits for the same end and may be called by
/// anyone, any number of times.
public final class FileTransfer: Sendable {
    public enum Direction: Sendable, Hashable { case sending, receiving }

    public let direction: Direction
    /// The file's name: as offered when sending, as saved when receiving (after sanitising
    /// and, when a file of that name existed, numbering).
    public let name: String
    public let size: UInt64
    public let peer: PeerID
    public let updates: TransferUpdates

    private let sink: AsyncStream<Result<TransferProgress, TransferFailure>>.Continuation
    private let state = Locked(State())
    private let done = Locked<[CheckedContinuation<Result<TransferOutcome, TransferFailure>, Never>]>([])

    private struct State {
        var channel: (any ResourceChannel)?
        var cancelReason: String?
        var result: Result<TransferOutcome, TransferFailure>?
        var offsets: [UInt64] = []
        var task: Task<Void, Never>?
    }

    init(direction: Direction, name: String, size: UInt64, peer: PeerID) {
        self.direction = direction
        self.name = name
        self.size = size
        self.peer = peer
        let (stream, sink) = AsyncStream.makeStream(
            of: Result<TransferProgress, TransferFailure>.self, bufferingPolicy: .bufferingNewest(16))
        self.updates = TransferUpdates(stream: stream)
        self.sink = sink
    }

    /// Stops the transfer: the stream is reset with `reason`, and the peer's transfer ends
    /// with "cancelled by the peer: REASON". A receiver keeps what it has (a later offer of the
    /// same file resumes); cancelling a finished transfer does nothing.
    public func cancel(reason: String = "cancelled") {
        let (channel, task) = state.withLock { state -> ((any ResourceChannel)?, Task<Void, Never>?) in
            guard state.result == nil, state.cancelReason == nil else { return (nil, nil) }
            state.cancelReason = reason
            return (state.channel, state.task)
        }
        channel?.reset(reason: reason)
        task?.cancel()
    }

    /// Waits for the end of the transfer.
    public func result() async -> Result<TransferOutcome, TransferFailure> {
        if let result = state.withLock({ $0.result }) { return result }
        return await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Result<TransferOutcome, TransferFailure>? in
                if state.result == nil { done.withLock { $0.append(continuation) } }
                return state.result
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// The offsets the receiver accepted at, one per offer: `[0]` for a transfer that never
    /// resumed, `[0, N]` for one that resumed once at N.
    public var acceptedOffsets: [UInt64] { state.withLock { $0.offsets } }

    // MARK: - For the sender and receiver

    var cancelReason: String? { state.withLock { $0.cancelReason } }

    /// Starts the work; `cancel` cancels its task.
    func start(_ work: @escaping @Sendable (FileTransfer) async -> Result<TransferOutcome, TransferFailure>) {
        let task = Task { [self] in
            finish(await work(self))
        }
        let cancelled = state.withLock { state -> Bool in
            state.task = task
            return state.cancelReason != nil
        }
        if cancelled { task.cancel() }
    }

    /// Makes `channel` the one `cancel` resets; false (and the channel reset) when the transfer
    /// was cancelled already.
    func use(_ channel: any ResourceChannel) -> Bool {
        let reason = state.withLock { state -> String? in
            if state.cancelReason == nil { state.channel = channel }
            return state.cancelReason
        }
        if let reason { channel.reset(reason: reason) }
        return reason == nil
    }

    func accepted(at offset: UInt64) {
        state.withLock { $0.offsets.append(offset) }
    }

    func report(_ progress: TransferProgress) {
        sink.yield(.success(progress))
    }

    private func finish(_ result: Result<TransferOutcome, TransferFailure>) {
        let waiting = state.withLock { state -> [CheckedContinuation<Result<TransferOutcome, TransferFailure>, Never>] in
            state.result = result
            state.channel = nil
            return done.withLock { list in
                defer { list.removeAll() }
                return list
            }
        }
        if case .failure(let failure) = result { sink.yield(.failure(failure)) }
        sink.finish()
        for continuation in waiting { continuation.resume(returning: result) }
    }

    /// What went wrong, from an error a channel threw: this side's cancel, the peer's reset,
    /// or a lost link.
    func failure(from error: any Error) -> TransferFailure {
        if let reason = cancelReason { return TransferFailure(.cancelled, "cancelled: \(reason)") }
        if let failure = error as? TransferFailure { return failure }
        if let error = error as? PeerLinkError {
            switch error.code {
            case .cancelled: return TransferFailure(.cancelledByPeer, "cancelled by the peer: \(Self.peerReason(error.message))")
            case .unknown where error.message.contains("resource protocol"), .unsupported:
                return TransferFailure(.protocolError, error.message)
            default: return TransferFailure(.linkLost, "the link to \(peer.displayName) went away: \(error.message)")
            }
        }
        return TransferFailure(.linkLost, "the link to \(peer.displayName) went away: \(error)")
    }
}

extension FileTransfer {
    /// The peer's own words in a reset's message ("stream "x" was reset by the peer: REASON").
    static func peerReason(_ message: String) -> String {
        guard let range = message.range(of: "reset by the peer: ", options: .backwards) else { return message }
        return String(message[range.upperBound...])
    }
}

/// The progress of one transfer: values until it ends, then the end — normally when the file
/// is verified, throwing a ``TransferFailure`` otherwise.
public struct TransferUpdates: AsyncSequence, Sendable {
    public typealias Element = TransferProgress
    public typealias Failure = TransferFailure

    let stream: AsyncStream<Result<TransferProgress, TransferFailure>>

    public func makeAsyncIterator() -> Iterator {
        Iterator(base: stream.makeAsyncIterator())
    }

    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncStream<Result<TransferProgress, TransferFailure>>.Iterator

        public mutating func next() async throws(TransferFailure) -> TransferProgress? {
            try await next(isolation: nil)
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(TransferFailure) -> TransferProgress? {
            switch await base.next(isolation: actor) {
            case nil: return nil
            case .success(let progress): return progress
            case .failure(let failure): throw failure
            }
        }
    }
}
