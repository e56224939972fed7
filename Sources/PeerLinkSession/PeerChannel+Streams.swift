@_spi(Runtime) import PeerLinkCore

// The streams of a pair of peers: the StreamTable's accounting under the channel's lock, the
// bytes that arrived and were not read yet, and the tasks waiting for credit, room, bytes or an
// accept. They belong to the channel, not a link: a stream goes on across a link change.

/// The runtime side of one stream.
struct StreamSlot {
    let name: String
    /// Chunks that arrived and were not read yet (at most the stream's window).
    var inbox = FIFO<[UInt8]>()
    /// The peer accepted it (streams the peer opened are accepted when they arrive).
    var accepted: Bool
    /// The peer sent `FIN`: reads end once the inbox is empty.
    var remoteFinished = false
    /// This side sent `FIN`.
    var localFinished = false
    /// Why the stream ended other than by `FIN`: a reset (either side) or the link's end.
    var failure: PeerLinkError?
    /// The failure came from a reset: unread bytes are dropped.
    var wasReset = false
    /// Its `PeerStream` is gone: nobody can read it or learn how it ended any more.
    var released = false

    var hasUnread: Bool { !inbox.isEmpty }

    mutating func takeChunk() -> [UInt8]? { inbox.removeFirst() }
}

/// A task waiting for something to change on a stream (nil: on any stream, such as room in the
/// channel's data lane).
struct StreamWaiter {
    let stream: UInt32?
    /// Resumes the task: to look again (nil), or with an error.
    let resume: @Sendable ((any Error)?) -> Void
}

extension PeerChannel {
    // MARK: - Incoming

    /// A `DATA` or `WINDOW_UPDATE` from the peer (under the lock): the table's accounting, then
    /// the runtime's. Returns the rule the peer broke, if it did (the link closes then).
    func receiveStreamFrame(_ frame: Frame, in state: inout State) -> WireError? {
        forgetReleasedStreams(in: &state)
        let outcome: StreamTable.Outcome
        do throws(WireError) {
            outcome = try state.streams.receive(frame)
        } catch {
            return error
        }
        for frame in outcome.frames { state.scheduler.enqueue(frame) }
        if !outcome.frames.isEmpty, let active = state.active { state.outbox.add { active.wakeWriterFromChannel() } }
        for event in outcome.events {
            switch event {
            case .opened(let id, let name):
                state.slots[id] = StreamSlot(name: name, accepted: true)
                let stream = PeerStream(channel: self, id: id, name: name, peer: peer, isOutgoing: false)
                state.outbox.add { self.streamOpened(stream) }
            case .accepted(let id):
                state.slots[id]?.accepted = true
                wakeStreamWaiters(&state, stream: id)
            case .data(let id, let bytes):
                state.slots[id]?.inbox.append(bytes)
                wakeStreamWaiters(&state, stream: id)
            case .finished(let id):
                state.slots[id]?.remoteFinished = true
                wakeStreamWaiters(&state, stream: id)
            case .reset(let id, let reason):
                state.scheduler.dropStream(id)
                if var slot = state.slots[id] {
                    slot.failure =
                        slot.accepted
                        ? PeerLinkError(.cancelled, "stream \"\(slot.name)\" was reset by the peer: \(reason)")
                        : PeerLinkError(.unavailable, "the peer refused stream \"\(slot.name)\": \(reason)")
                    slot.wasReset = true
                    slot.inbox = FIFO()
                    state.slots[id] = slot
                }
                wakeStreamWaiters(&state, stream: id)
            case .credit(let id):
                wakeStreamWaiters(&state, stream: id)
            }
        }
        for event in outcome.events {
            switch event {
            case .finished(let id), .reset(let id, _): forgetIfReleased(id, in: &state)
            default: break
            }
        }
        return nil
    }

    /// The app let go of stream `id` (its `PeerStream` is gone): its slot goes once the stream is
    /// over both ways (a stream finished on this side keeps its data going). Noted only: the
    /// channel looks at it the next time it takes its lock for streams.
    func streamReleased(_ id: UInt32) {
        releasedStreams.withLock { $0.append(id) }
    }

    /// Marks the streams whose `PeerStream` went away, forgetting those that are over.
    func forgetReleasedStreams(in state: inout State) {
        let released = releasedStreams.withLock { ids -> [UInt32] in
            defer { ids = [] }
            return ids
        }
        for id in released {
            state.slots[id]?.released = true
            forgetIfReleased(id, in: &state)
        }
    }

    /// Removes the slot of stream `id` once its `PeerStream` is gone and the stream is over
    /// (no longer in the table): a long-lived channel keeps no trace of the streams it carried.
    func forgetIfReleased(_ id: UInt32, in state: inout State) {
        guard let slot = state.slots[id], slot.released, state.streams[id] == nil else { return }
        state.slots[id] = nil
    }

    /// The channel is over (under the lock): every stream still going ends with `error`; bytes
    /// that arrived can still be read.
    func endStreams(in state: inout State, error: PeerLinkError) {
        _ = state.streams.removeAll()
        for id in state.slots.keys {
            guard var slot = state.slots[id], slot.failure == nil else { continue }
            let finishedBothWays = slot.remoteFinished && slot.localFinished
            guard !finishedBothWays else { continue }
            slot.failure = PeerLinkError(
                .notConnected, "stream \"\(slot.name)\" ended: \(error.message); open it again once the peer is connected")
            state.slots[id] = slot
        }
        wakeStreamWaiters(&state, stream: nil, all: true)
    }

    /// Wakes the active link's writer (once the lock is released): frames are waiting.
    func wakeWriter(_ state: inout State) {
        guard let active = state.active else { return }
        state.outbox.add { active.wakeWriterFromChannel() }
    }

    /// Resumes the tasks waiting on `stream` (and those waiting on any stream); with `all`,
    /// every waiting task. They look again, once the lock is released.
    func wakeStreamWaiters(_ state: inout State, stream: UInt32?, all: Bool = false) {
        guard !state.streamWaiters.isEmpty else { return }
        var woken: [StreamWaiter] = []
        for (key, waiter) in state.streamWaiters where all || waiter.stream == nil || waiter.stream == stream {
            state.streamWaiters[key] = nil
            woken.append(waiter)
        }
        guard !woken.isEmpty else { return }
        state.outbox.add { [woken] in for waiter in woken { waiter.resume(nil) } }
    }

    // MARK: - Waiting

    /// Runs `poll` under the lock until it returns a value (or throws), sleeping between tries
    /// until something changes on `stream` (`waitsForRoom`: or room frees in the data lane).
    private func waitUntil<T: Sendable>(
        stream id: UInt32, waitsForRoom: Bool = false,
        _ poll: (inout State) throws(PeerLinkError) -> T?
    ) async throws -> T {
        // Most calls find their value at once (data to read, credit and room to write): no
        // continuation, no cancellation handler, no suspension. (A value found is returned
        // whether or not the task is cancelled, as below.)
        if let value = try state.withLockThenDeliver({ state throws(PeerLinkError) in try poll(&state) }) {
            return value
        }
        while true {
            let key = state.withLock { state -> Int in
                state.nextStreamWaiter += 1
                return state.nextStreamWaiter
            }
            let value: T? = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T?, any Error>) in
                    // The poll and the registration happen under one lock: no change is missed.
                    let outcome = state.withLockThenDeliver { state -> Result<T?, PeerLinkError>? in
                        do throws(PeerLinkError) {
                            if let value = try poll(&state) { return .success(value) }
                        } catch {
                            return .failure(error)
                        }
                        if Task.isCancelled { return nil }
                        state.streamWaiters[key] = StreamWaiter(stream: waitsForRoom ? nil : id) { error in
                            if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: nil) }
                        }
                        return .success(nil)
                    }
                    switch outcome {
                    case .success(let value?): continuation.resume(returning: value)
                    case .failure(let error): continuation.resume(throwing: error)
                    case nil: continuation.resume(throwing: CancellationError())
                    case .success(nil): break
                    }
                }
            } onCancel: {
                state.withLock { $0.streamWaiters.removeValue(forKey: key) }?.resume(CancellationError())
            }
            if let value { return value }
        }
    }
}

extension PeerChannel {
    // MARK: - Operations behind PeerStream

    /// Opens a stream named `name` to the peer and waits for the peer to accept it.
    ///
    /// - Throws: ``PeerLinkError`` `notConnected` once the channel is over (the peer left);
    ///   `invalidParameter` for a name that is empty or over 255 bytes; `unavailable` with 256
    ///   streams open, or when the peer refused the stream.
    public func openStream(named name: String) async throws -> PeerStream {
        let stream = try beginStream(named: name)
        try await waitUntilAccepted(stream)
        return stream
    }

    /// Opens a stream named `name`: queues its `SYN` at once and returns the stream. Wait for
    /// the peer's answer with ``waitUntilAccepted(_:)``.
    ///
    /// - Throws: ``PeerLinkError`` `notConnected` once the channel is over; `invalidParameter`
    ///   for a bad name; `unavailable` with too many streams open.
    func beginStream(named name: String) throws(PeerLinkError) -> PeerStream {
        try state.withLockThenDeliver { state throws(PeerLinkError) -> PeerStream in
            if let closure = state.closure {
                throw PeerLinkError(.notConnected, "\(peer) is not connected (\(closure.message)): open the stream once it is connected again")
            }
            forgetReleasedStreams(in: &state)
            let (id, syn) = try state.streams.open(name: name)
            state.slots[id] = StreamSlot(name: name, accepted: false)
            state.scheduler.enqueue(syn)
            wakeWriter(&state)
            return PeerStream(channel: self, id: id, name: name, peer: peer, isOutgoing: true)
        }
    }

    /// Waits for the peer to accept `stream`. Cancelling the wait resets the stream.
    ///
    /// - Throws: ``PeerLinkError`` `unavailable` when the peer refused it (its `RST`),
    ///   `notConnected` when the channel ended first, `CancellationError`.
    func waitUntilAccepted(_ stream: PeerStream) async throws {
        do {
            _ = try await waitUntil(stream: stream.id) { state throws(PeerLinkError) -> Bool? in
                guard let slot = state.slots[stream.id] else { return true }
                if let failure = slot.failure { throw failure }
                return slot.accepted ? true : nil
            }
        } catch is CancellationError {
            resetStream(stream.id, reason: "the opener stopped waiting for the stream to be accepted")
            throw CancellationError()
        }
    }

    /// Queues `bytes` on stream `id` in frames of at most ``WireFormat/largeFramePayload`` (cut
    /// again where a link that takes less writes them, ``FrameScheduler/next(maxPayload:)``), as
    /// many at each turn of the lock as credit and room allow, and wakes the writer once for
    /// them: a 64 KiB write goes to the socket in the writer's batches (two of the default 32 KiB,
    /// one over TCP), not a system call per frame.
    func writeStream(_ id: UInt32, _ bytes: [UInt8]) async throws {
        var written = 0
        repeat {
            let offset = written
            let sent = try await waitUntil(stream: id, waitsForRoom: true) { state throws(PeerLinkError) -> Int? in
                guard let slot = state.slots[id] else { throw PeerLinkError(.notConnected, "stream \(id) is not open") }
                if let failure = slot.failure { throw failure }
                guard !slot.localFinished else {
                    throw PeerLinkError(.invalidParameter, "stream \"\(slot.name)\" was finished: nothing more can be written to it")
                }
                guard offset < bytes.count else { return 0 }
                var queued = 0
                while offset + queued < bytes.count {
                    let room = maxQueuedDataBytes - state.scheduler.queuedDataBytes
                    guard room > 0 else { break }
                    let start = offset + queued
                    let wanted = min(bytes.count - start, WireFormat.largeFramePayload, room)
                    let credit = state.streams.takeCredit(id, upTo: wanted)
                    guard credit > 0 else { break }
                    // the write itself, or a part of it sharing its storage: not copied
                    state.scheduler.enqueue(.data(stream: id, flags: [], payload: FramePayload(bytes, start..<start + credit)))
                    queued += credit
                }
                guard queued > 0 else { return nil }
                state.peakQueuedDataBytes = max(state.peakQueuedDataBytes, state.scheduler.queuedDataBytes)
                wakeWriter(&state)
                return queued
            }
            written += sent
        } while written < bytes.count
    }

    /// Queues `FIN` on stream `id`, after everything written before.
    func finishStream(_ id: UInt32) throws(PeerLinkError) {
        try state.withLockThenDeliver { state throws(PeerLinkError) in
            guard var slot = state.slots[id] else { throw PeerLinkError(.notConnected, "stream \(id) is not open") }
            if let failure = slot.failure { throw failure }
            guard !slot.localFinished else {
                throw PeerLinkError(.invalidParameter, "stream \"\(slot.name)\" was finished already")
            }
            let fin = try state.streams.finish(id)
            slot.localFinished = true
            state.slots[id] = slot
            state.scheduler.enqueue(fin)
            forgetIfReleased(id, in: &state)
            wakeWriter(&state)
        }
    }

    /// Resets stream `id` both ways: `RST` with `reason` (ahead of its data still waiting,
    /// which is dropped), and this side's readers and writers throw `cancelled`.
    func resetStream(_ id: UInt32, reason: String) {
        state.withLockThenDeliver { state in
            guard var slot = state.slots[id], slot.failure == nil || !slot.wasReset else { return }
            if let rst = state.streams.reset(id, reason: reason) {
                state.scheduler.enqueue(rst)
            }
            if slot.failure == nil {
                slot.failure = PeerLinkError(.cancelled, "stream \"\(slot.name)\" was reset on this side: \(reason)")
                slot.wasReset = true
                slot.inbox = FIFO()
                state.slots[id] = slot
            }
            forgetIfReleased(id, in: &state)
            wakeStreamWaiters(&state, stream: id)
            wakeWriter(&state)
        }
    }

    /// The next chunk of stream `id`, nil after the peer's `FIN`; reading grants the peer
    /// credit back.
    func readStream(_ id: UInt32) async throws -> [UInt8]? {
        let chunk = try await waitUntil(stream: id) { state throws(PeerLinkError) -> StreamRead? in
            guard var slot = state.slots[id] else { throw PeerLinkError(.notConnected, "stream \(id) is not open") }
            if slot.wasReset, let failure = slot.failure { throw failure }
            if let chunk = slot.takeChunk() {
                state.slots[id] = slot
                if let update = state.streams.consumed(id, count: chunk.count, at: clock.now()) {
                    state.scheduler.enqueue(update)
                    wakeWriter(&state)
                }
                return .chunk(chunk)
            }
            if slot.remoteFinished { return .end }
            if let failure = slot.failure { throw failure }
            return nil
        }
        if case .chunk(let bytes) = chunk { return bytes }
        return nil
    }

    /// Streams open to the peer (both directions), bytes received and not read yet, and the
    /// streams kept track of (open, or ended and still held by the app).
    var streamCounts: (open: Int, unreadBytes: Int, tracked: Int) {
        state.withLock { state in
            forgetReleasedStreams(in: &state)
            let unread = state.slots.values.reduce(0) { total, slot in
                total + slot.inbox.reduce(0) { $0 + $1.count }
            }
            return (state.streams.entries.count, unread, state.slots.count)
        }
    }
}

enum StreamRead: Sendable {
    case chunk([UInt8])
    case end
}
