import PeerLinkCore
import PeerLinkFiles

/// One direction of an in-memory byte pipe with a bounded buffer: a writer suspends while the
/// buffer is full (back-pressure, as a stream without credit). A waiting reader or writer ends
/// with `CancellationError` when its task is cancelled, as a session's stream does.
final class BytePipe: Sendable {
    private struct State {
        var chunks: [[UInt8]] = []
        var buffered = 0
        var finished = false
        var error: PeerLinkError?
        var reader: CheckedContinuation<Void, Never>?
        var writers: [CheckedContinuation<Void, Never>] = []
    }

    private let capacity: Int
    private let state = Locked(State())

    init(capacity: Int) {
        self.capacity = capacity
    }

    func write(_ bytes: [UInt8]) async throws {
        while true {
            try Task.checkCancellation()
            let outcome = state.withLock { state -> Result<Bool, PeerLinkError> in
                if let error = state.error { return .failure(error) }
                if state.finished { return .failure(PeerLinkError(.invalidParameter, "write after finish")) }
                guard state.buffered < capacity else { return .success(false) }
                state.chunks.append(bytes)
                state.buffered += bytes.count
                return .success(true)
            }
            switch outcome {
            case .failure(let error): throw error
            case .success(true):
                wakeReader()
                return
            case .success(false):
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let resumeNow = state.withLock { state -> Bool in
                            if state.error != nil || state.buffered < capacity || Task.isCancelled { return true }
                            state.writers.append(continuation)
                            return false
                        }
                        if resumeNow { continuation.resume() }
                    }
                } onCancel: {
                    wakeWriters()
                }
            }
        }
    }

    func read() async throws -> [UInt8]? {
        while true {
            try Task.checkCancellation()
            let outcome = state.withLock { state -> Result<[UInt8]??, PeerLinkError> in
                if let error = state.error { return .failure(error) }
                if !state.chunks.isEmpty {
                    let chunk = state.chunks.removeFirst()
                    state.buffered -= chunk.count
                    return .success(.some(chunk))
                }
                return .success(state.finished ? .some(nil) : nil)
            }
            switch outcome {
            case .failure(let error): throw error
            case .success(.some(let chunk)):
                wakeWriters()
                return chunk
            case .success(nil):
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let resumeNow = state.withLock { state -> Bool in
                            if state.error != nil || !state.chunks.isEmpty || state.finished || Task.isCancelled { return true }
                            state.reader = continuation
                            return false
                        }
                        if resumeNow { continuation.resume() }
                    }
                } onCancel: {
                    wakeReader()
                }
            }
        }
    }

    func finish() {
        state.withLock { $0.finished = true }
        wakeReader()
    }

    func fail(_ error: PeerLinkError) {
        state.withLock { state in
            if state.error == nil { state.error = error }
        }
        wakeReader()
        wakeWriters()
    }

    private func wakeReader() {
        state.withLock { state in
            defer { state.reader = nil }
            return state.reader
        }?.resume()
    }

    private func wakeWriters() {
        for writer in state.withLock({ state in
            defer { state.writers.removeAll() }
            return state.writers
        }) { writer.resume() }
    }
}

/// One end of an in-memory resource channel.
final class MemoryChannel: ResourceChannel {
    let incoming: BytePipe
    let outgoing: BytePipe
    /// Bytes this end wrote, in all.
    let written = Locked(0)

    init(incoming: BytePipe, outgoing: BytePipe) {
        self.incoming = incoming
        self.outgoing = outgoing
    }

    /// Two connected ends.
    static func pair(capacity: Int = 256 * 1024) -> (MemoryChannel, MemoryChannel) {
        let forward = BytePipe(capacity: capacity)
        let backward = BytePipe(capacity: capacity)
        return (MemoryChannel(incoming: backward, outgoing: forward), MemoryChannel(incoming: forward, outgoing: backward))
    }

    func write(_ bytes: [UInt8]) async throws {
        try await outgoing.write(bytes)
        written.withLock { $0 += bytes.count }
    }

    func finish() async throws {
        outgoing.finish()
    }

    /// A reset, as a stream's RST: both directions fail, the peer with the reason.
    func reset(reason: String) {
        outgoing.fail(PeerLinkError(.cancelled, reason))
        incoming.fail(PeerLinkError(.cancelled, reason))
    }

    func read() async throws -> [UInt8]? {
        try await incoming.read()
    }

    /// The link under the channel goes: both ends fail with `notConnected`.
    func cut() {
        let error = PeerLinkError(.notConnected, "the link went down")
        outgoing.fail(error)
        incoming.fail(error)
    }
}
