import Foundation
import PeerLinkCore
import PeerLinkSession

/// The sending end of a stream ``MultipeerSession/startStream(withName:toPeer:)`` opened: a
/// Foundation `OutputStream` over a ``PeerLinkSession/PeerStream``.
///
/// ```swift
/// let output = try session.startStream(withName: "audio", toPeer: bob)
/// output.open()
/// Thread {                                          // a thread of its own: writes block
///     while let chunk = nextChunk() {                // [UInt8], from the app
///         var rest = chunk[...]
///         while !rest.isEmpty {
///             let written = rest.withUnsafeBufferPointer { output.write($0.baseAddress!, maxLength: $0.count) }
///             guard written > 0 else { return }      // output.streamError says why
///             rest = rest.dropFirst(written)
///         }
///     }
///     output.close()                                 // FIN once every byte is out
/// }.start()
/// ```
///
/// - **Writes block.** ``write(_:maxLength:)`` copies into a buffer of 256 KiB and returns at
///   once while there is room; when the buffer is full it blocks the calling thread until the
///   peer's reader makes room (back-pressure). It may write fewer bytes than asked: write the
///   rest next. Never call it from Swift concurrency's cooperative threads (a task, an actor):
///   blocking one of them can stall the whole process. From async code use the async API,
///   ``PeerLinkSession/PeerSession/openStream(named:to:)``, whose ``PeerLinkSession/PeerStream``
///   suspends instead.
/// - **Errors.** When the stream cannot be opened (the peer left, refused it, 256 streams open)
///   or breaks (the link closed, the reader reset it), ``write(_:maxLength:)`` returns -1,
///   ``streamStatus`` is `.error` and ``streamError`` a ``PeerLinkCore/PeerLinkError`` saying why.
/// - **Ends.** ``close()`` sends `FIN` after the bytes written (without waiting for them to
///   leave); releasing the stream unclosed does the same.
/// - **No run-loop events.** The stream's `delegate` is never called and scheduling it on a run
///   loop does nothing: check ``hasSpaceAvailable`` or just write, on a thread of your own.
///
/// Its methods may be called from any thread (its state is behind a lock), although Foundation
/// does not mark streams `Sendable`.
public final class MultipeerOutputStream: OutputStream {
    /// The stream's name, as given to ``MultipeerSession/startStream(withName:toPeer:)``.
    public let name: String
    /// The peer it goes to.
    public let peer: MultipeerPeerID
    private let pipe: OutgoingPipe

    init(name: String, peer: MultipeerPeerID, open: @escaping @Sendable () async throws -> PeerStream) {
        self.name = name
        self.peer = peer
        pipe = OutgoingPipe()
        super.init(toMemory: ())
        let pipe = pipe
        Task { await pipe.pump(open: open) }
    }

    /// Not available: streams to peers come from ``MultipeerSession/startStream(withName:toPeer:)``.
    @available(*, unavailable, message: "open streams to peers with MultipeerSession.startStream(withName:toPeer:)")
    public required init(toMemory: ()) {
        preconditionFailure("MultipeerOutputStream: open streams with MultipeerSession.startStream(withName:toPeer:)")
    }

    deinit {
        pipe.close()
    }

    public override func open() { pipe.open() }

    /// Sends `FIN` after everything written; later writes fail.
    public override func close() { pipe.close() }

    public override var streamStatus: Stream.Status { pipe.status }

    public override var streamError: (any Error)? { pipe.error }

    /// True while a write would not block: open, no error, room in the buffer.
    public override var hasSpaceAvailable: Bool { pipe.hasSpace }

    /// Queues up to `len` bytes; blocks while the buffer is full. Returns how many were taken
    /// (at least 1 when `len` is), 0 for `len` 0, or -1 when the stream is not open or broke
    /// (see ``streamError``).
    public override func write(_ buffer: UnsafePointer<UInt8>, maxLength len: Int) -> Int {
        pipe.write(UnsafeBufferPointer(start: buffer, count: max(0, len)))
    }

    public override func property(forKey key: Stream.PropertyKey) -> AnyObject? { nil }

    public override func setProperty(_ property: AnyObject?, forKey key: Stream.PropertyKey) -> Bool { false }

    public override func schedule(in aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {}

    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {}
}

/// The receiving end of a stream a peer opened, handed to
/// ``MultipeerSessionDelegate/session(_:didReceive:withName:fromPeer:)``: a Foundation
/// `InputStream` over a ``PeerLinkSession/PeerStream``.
///
/// - **Reads block.** ``read(_:maxLength:)`` returns the bytes that arrived (up to `len`), and
///   blocks the calling thread while none did; it returns 0 once the peer closed its end and
///   every byte was read. Never call it from Swift concurrency's cooperative threads (a task,
///   an actor); from async code use the async API (``PeerLinkSession/PeerSession/incomingStreams``,
///   `for try await chunk in stream.chunks`), which suspends instead.
/// - **Back-pressure.** At most 256 KiB wait here unread, and as much in the link's window:
///   a reader that stops reading stops the writer.
/// - **Errors.** When the writer resets the stream or the link closes before its end,
///   ``read(_:maxLength:)`` returns -1 (after the bytes that arrived), ``streamStatus`` is
///   `.error` and ``streamError`` a ``PeerLinkCore/PeerLinkError`` saying why.
/// - **Ends.** ``close()`` before the end resets the stream (the writer's next write fails with
///   "reset by the peer"), as does releasing it unread; ``reset(reason:)`` says why.
/// - **No run-loop events.** The stream's `delegate` is never called and scheduling it on a run
///   loop does nothing: read on a thread of your own.
///
/// Its methods may be called from any thread (its state is behind a lock), although Foundation
/// does not mark streams `Sendable`.
public final class MultipeerInputStream: InputStream {
    /// The name the peer gave the stream.
    public let name: String
    /// The peer it comes from.
    public let peer: MultipeerPeerID
    private let pipe: IncomingPipe

    init(_ stream: PeerStream) {
        name = stream.name
        peer = MultipeerPeerID(stream.peer)
        pipe = IncomingPipe(stream)
        super.init(data: Data())
    }

    deinit {
        pipe.close(reason: "the reader released the stream")
    }

    public override func open() { pipe.open() }

    /// Resets the stream unless it ended already.
    public override func close() { pipe.close(reason: "the reader closed the stream") }

    /// Resets the stream (unless it ended already): the writer's writes fail with
    /// "reset by the peer: REASON".
    public func reset(reason: String) { pipe.close(reason: reason) }

    public override var streamStatus: Stream.Status { pipe.status }

    public override var streamError: (any Error)? { pipe.error }

    /// True when bytes wait to be read (a read would not block).
    public override var hasBytesAvailable: Bool { pipe.hasBytes }

    /// Copies up to `len` bytes that arrived into `buffer`; blocks while none did. Returns how
    /// many, 0 at the end of the stream (or for `len` 0), -1 when the stream is not open or broke
    /// (see ``streamError``).
    public override func read(_ buffer: UnsafeMutablePointer<UInt8>, maxLength len: Int) -> Int {
        pipe.read(into: UnsafeMutableBufferPointer(start: buffer, count: max(0, len)))
    }

    /// No direct access to the buffer: always false.
    public override func getBuffer(
        _ buffer: UnsafeMutablePointer<UnsafeMutablePointer<UInt8>?>, length len: UnsafeMutablePointer<Int>
    ) -> Bool { false }

    public override func property(forKey key: Stream.PropertyKey) -> AnyObject? { nil }

    public override func setProperty(_ property: AnyObject?, forKey key: Stream.PropertyKey) -> Bool { false }

    public override func schedule(in aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {}

    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {}
}

/// The bytes between the blocking side of a stream (the app's thread) and the task that moves
/// them to or from the ``PeerLinkSession/PeerStream``.
private enum PipeBounds {
    /// The most bytes that wait in a pipe.
    static let capacity = 256 * 1024
    /// The most bytes handed to the peer stream at once.
    static let chunk = 64 * 1024
}

/// What an output stream's writers and its pump share; every field is read and written with
/// `condition` locked (hence unchecked).
private final class OutgoingPipe: @unchecked Sendable {
    private let condition = NSCondition()
    private var opened = false
    private var closed = false
    private var finished = false
    private var failure: PeerLinkError?
    private var buffer: [UInt8] = []
    private var head = 0
    /// The pump, waiting for bytes (or the close).
    private var waiting: CheckedContinuation<Void, Never>?

    private var pending: Int { buffer.count - head }

    var status: Stream.Status {
        locked {
            if failure != nil { return .error }
            if closed { return .closed }
            return opened ? .open : .notOpen
        }
    }

    var error: (any Error)? { locked { failure } }

    var hasSpace: Bool { locked { opened && !closed && failure == nil && pending < PipeBounds.capacity } }

    func open() {
        locked { opened = true }
    }

    func close() {
        let pump = locked { () -> CheckedContinuation<Void, Never>? in
            closed = true
            condition.broadcast()
            defer { waiting = nil }
            return waiting
        }
        pump?.resume()
    }

    func write(_ bytes: UnsafeBufferPointer<UInt8>) -> Int {
        guard !bytes.isEmpty else { return 0 }
        condition.lock()
        while opened, !closed, failure == nil, pending >= PipeBounds.capacity { condition.wait() }
        guard opened, !closed, failure == nil else {
            condition.unlock()
            return -1
        }
        if head > 0, head == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            head = 0
        }
        let count = min(bytes.count, PipeBounds.capacity - pending)
        buffer.append(contentsOf: bytes.prefix(count))
        let pump = waiting
        waiting = nil
        condition.unlock()
        pump?.resume()
        return count
    }

    /// Opens the peer stream, then moves the bytes written to it until the close (then `FIN`)
    /// or a failure.
    func pump(open: @Sendable () async throws -> PeerStream) async {
        let stream: PeerStream
        do {
            stream = try await open()
        } catch {
            fail(error)
            return
        }
        while true {
            guard let chunk = await next() else { break }
            do {
                try await stream.write(chunk)
            } catch {
                fail(error)
                stream.reset(reason: "the writer's stream failed")
                return
            }
        }
        do {
            try await stream.finish()
        } catch {
            fail(error)
        }
    }

    /// The next bytes to send; nil once closed and drained (or failed).
    private func next() async -> [UInt8]? {
        while true {
            let taken = locked { () -> [UInt8]?? in
                if failure != nil { return .some(nil) }
                if pending > 0 {
                    let end = head + min(pending, PipeBounds.chunk)
                    let chunk = Array(buffer[head..<end])
                    head = end
                    if head > PipeBounds.capacity {
                        buffer.removeFirst(head)
                        head = 0
                    }
                    condition.broadcast()
                    return .some(chunk)
                }
                return closed ? .some(nil) : nil
            }
            if let taken { return taken }
            await withCheckedContinuation { continuation in
                let ready = locked { () -> Bool in
                    if pending > 0 || closed || failure != nil { return true }
                    waiting = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        }
    }

    private func fail(_ error: any Error) {
        locked {
            failure = failure ?? (error as? PeerLinkError ?? PeerLinkError(.unknown, "the stream failed: \(error)"))
            condition.broadcast()
        }
    }

    private func locked<T>(_ body: () -> T) -> T {
        condition.lock()
        defer { condition.unlock() }
        return body()
    }
}

/// What an input stream's reader and its pump share; every field is read and written with
/// `condition` locked (hence unchecked).
private final class IncomingPipe: @unchecked Sendable {
    private let stream: PeerStream
    private let condition = NSCondition()
    private var opened = false
    private var closed = false
    /// The peer's `FIN` arrived.
    private var ended = false
    private var failure: PeerLinkError?
    private var buffer: [UInt8] = []
    private var head = 0
    /// The pump, waiting for room in the buffer.
    private var waiting: CheckedContinuation<Void, Never>?
    private var pumping: Task<Void, Never>?

    init(_ stream: PeerStream) {
        self.stream = stream
    }

    private var pending: Int { buffer.count - head }

    var status: Stream.Status {
        locked {
            if closed { return .closed }
            if pending == 0, failure != nil { return .error }
            if pending == 0, ended { return .atEnd }
            return opened ? .open : .notOpen
        }
    }

    var error: (any Error)? { locked { pending == 0 ? failure : nil } }

    var hasBytes: Bool { locked { opened && !closed && pending > 0 } }

    func open() {
        let start = locked { () -> Bool in
            guard !opened, !closed else { return false }
            opened = true
            return true
        }
        guard start else { return }
        let task = Task { await pump() }
        locked { pumping = task }
    }

    func close(reason: String) {
        let (reset, pump, task) = locked { () -> (Bool, CheckedContinuation<Void, Never>?, Task<Void, Never>?) in
            guard !closed else { return (false, nil, nil) }
            closed = true
            condition.broadcast()
            defer { waiting = nil }
            return (!ended && failure == nil, waiting, pumping)
        }
        if reset { stream.reset(reason: reason) }
        pump?.resume()
        task?.cancel()
    }

    func read(into target: UnsafeMutableBufferPointer<UInt8>) -> Int {
        guard !target.isEmpty else { return 0 }
        condition.lock()
        while opened, !closed, pending == 0, !ended, failure == nil { condition.wait() }
        guard opened, !closed else {
            condition.unlock()
            return -1
        }
        guard pending > 0 else {
            condition.unlock()
            return failure == nil ? 0 : -1
        }
        let count = min(target.count, pending)
        _ = target.initialize(from: buffer[head..<(head + count)])
        head += count
        if head == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            head = 0
        }
        let pump = waiting
        waiting = nil
        condition.unlock()
        pump?.resume()
        return count
    }

    /// Reads the peer stream into the buffer while it has room, until the end, a failure, or
    /// the close.
    private func pump() async {
        while true {
            await withCheckedContinuation { continuation in
                let ready = locked { () -> Bool in
                    if pending < PipeBounds.capacity || closed { return true }
                    waiting = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
            if locked({ closed }) { return }
            do {
                let chunk = try await stream.read()
                locked {
                    if let chunk {
                        if head > 0, pending == 0 || head >= PipeBounds.capacity {
                            buffer.removeFirst(head)
                            head = 0
                        }
                        buffer.append(contentsOf: chunk)
                    } else {
                        ended = true
                    }
                    condition.broadcast()
                }
                if chunk == nil { return }
            } catch {
                locked {
                    if !closed {
                        failure = error as? PeerLinkError ?? PeerLinkError(.unknown, "the stream failed: \(error)")
                    }
                    condition.broadcast()
                }
                return
            }
        }
    }

    private func locked<T>(_ body: () -> T) -> T {
        condition.lock()
        defer { condition.unlock() }
        return body()
    }
}
