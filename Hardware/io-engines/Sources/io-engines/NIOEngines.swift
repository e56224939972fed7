import NIOCore
import NIOPosix

/// SwiftNIO used the way a link would use it without being rewritten: `NIOAsyncChannel`, whose
/// inbound stream and outbound writer tasks on the cooperative pool await, while the channel
/// itself lives on an event loop (`MultiThreadedEventLoopGroup.singleton`: one per CPU).
struct NIOAsyncEngine: Engine {
    let name = "nio-async"
    typealias Connection = NIOAsyncChannel<ByteBuffer, ByteBuffer>

    func bulk(total: Int, chunk: Int) async throws -> Double {
        try await Self.withPair { clientIn, clientOut, serverIn, _ in
            let start = ContinuousClock.now
            let reader = Task { try await Self.drain(serverIn, total: total) }
            let data = ByteBuffer(repeating: 0xA5, count: chunk)
            var sent = 0
            while sent < total {
                let count = min(chunk, total - sent)
                try await clientOut.write(count == chunk ? data : data.getSlice(at: 0, length: count)!)
                sent += count
            }
            guard try await reader.value == total else { throw MeasureError("nio-async: bytes lost") }
            _ = clientIn
            return seconds(ContinuousClock.now - start)
        }
    }

    func smallWrites(count: Int, size: Int) async throws -> Double {
        try await Self.withPair { _, clientOut, serverIn, _ in
            let start = ContinuousClock.now
            let reader = Task { try await Self.drain(serverIn, total: count * size) }
            let message = ByteBuffer(repeating: 0x5A, count: size)
            for _ in 0..<count { try await clientOut.write(message) }
            guard try await reader.value == count * size else { throw MeasureError("nio-async: bytes lost") }
            return seconds(ContinuousClock.now - start)
        }
    }

    func roundTrips(samples: Int, size: Int) async throws -> [Double] {
        try await Self.withPair { clientIn, clientOut, serverIn, serverOut in
            let echo = Task {
                var echoed = 0
                for try await bytes in serverIn {
                    try await serverOut.write(bytes)
                    echoed += bytes.readableBytes
                    if echoed >= samples * size { break }
                }
            }
            let message = ByteBuffer(repeating: 0x5A, count: size)
            var replies = clientIn.makeAsyncIterator()
            var times: [Double] = []
            times.reserveCapacity(samples)
            for _ in 0..<samples {
                let start = ContinuousClock.now
                try await clientOut.write(message)
                var got = 0
                while got < size {
                    guard let bytes = try await replies.next() else { throw MeasureError("nio-async: echo ended") }
                    got += bytes.readableBytes
                }
                times.append(seconds(ContinuousClock.now - start))
            }
            try await echo.value
            return times
        }
    }

    /// A connected loopback pair: `body` gets the client's inbound stream and outbound writer,
    /// then the server's; both channels are closed when it returns.
    static func withPair<T: Sendable>(
        _ body: @Sendable (
            NIOAsyncChannelInboundStream<ByteBuffer>, NIOAsyncChannelOutboundWriter<ByteBuffer>,
            NIOAsyncChannelInboundStream<ByteBuffer>, NIOAsyncChannelOutboundWriter<ByteBuffer>
        ) async throws -> T
    ) async throws -> T {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture { try Connection(wrappingChannelSynchronously: channel) }
            }
        guard let port = server.channel.localAddress?.port else { throw MeasureError("nio: no port") }
        let client = try await ClientBootstrap(group: group)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture { try Connection(wrappingChannelSynchronously: channel) }
            }
        return try await server.executeThenClose { accepted in
            var children = accepted.makeAsyncIterator()
            guard let child = try await children.next() else { throw MeasureError("nio: nothing accepted") }
            return try await client.executeThenClose { clientIn, clientOut in
                try await child.executeThenClose { serverIn, serverOut in
                    try await body(clientIn, clientOut, serverIn, serverOut)
                }
            }
        }
    }

    static func drain(_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>, total: Int) async throws -> Int {
        var got = 0
        for try await bytes in inbound {
            got += bytes.readableBytes
            if got >= total { break }
        }
        return got
    }
}

/// SwiftNIO at its best: channel handlers on the event loops, no task in between. Using it this
/// way means a link's state machine and its reader and writer run as handlers on an event loop.
struct NIOHandlerEngine: Engine {
    let name = "nio-handler"

    func bulk(total: Int, chunk: Int) async throws -> Double {
        try await Self.oneWay(total: total, piece: chunk, flushEach: false)
    }

    func smallWrites(count: Int, size: Int) async throws -> Double {
        try await Self.oneWay(total: count * size, piece: size, flushEach: true)
    }

    func roundTrips(samples: Int, size: Int) async throws -> [Double] {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(EchoHandler()) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        guard let port = server.localAddress?.port else { throw MeasureError("nio: no port") }
        let client = try await ClientBootstrap(group: group)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connect(host: "127.0.0.1", port: port).get()
        defer { client.close(promise: nil) }
        let done = client.eventLoop.makePromise(of: [Double].self)
        try await client.eventLoop.submit {
            try client.pipeline.syncOperations.addHandler(PingHandler(samples: samples, size: size, done: done))
        }.get()
        return try await done.futureResult.get()
    }

    /// `total` bytes from client to server, written `piece` bytes per write while the channel
    /// is writable; `flushEach`: a flush (a system call) after every write.
    static func oneWay(total: Int, piece: Int, flushEach: Bool) async throws -> Double {
        let group = MultiThreadedEventLoopGroup.singleton
        let received = group.any().makePromise(of: Int.self)
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(CountingHandler(total: total, done: received))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        guard let port = server.localAddress?.port else { throw MeasureError("nio: no port") }
        let client = try await ClientBootstrap(group: group)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connect(host: "127.0.0.1", port: port).get()
        defer { client.close(promise: nil) }
        let start = ContinuousClock.now
        try await client.eventLoop.submit {
            try client.pipeline.syncOperations.addHandler(WritingHandler(total: total, piece: piece, flushEach: flushEach))
        }.get()
        guard try await received.futureResult.get() == total else { throw MeasureError("nio-handler: bytes lost") }
        return seconds(ContinuousClock.now - start)
    }
}

/// Counts what arrives; done once `total` bytes did (or the channel closed).
private final class CountingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let total: Int
    private let done: EventLoopPromise<Int>
    private var got = 0

    init(total: Int, done: EventLoopPromise<Int>) {
        self.total = total
        self.done = done
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        got += unwrapInboundIn(data).readableBytes
        if got == total { done.succeed(got) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        done.succeed(got)
        context.fireChannelInactive()
    }
}

/// Writes `total` bytes in `piece`-byte buffers while the channel is writable.
private final class WritingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let total: Int
    private let buffer: ByteBuffer
    private let flushEach: Bool
    private var sent = 0

    init(total: Int, piece: Int, flushEach: Bool) {
        self.total = total
        self.buffer = ByteBuffer(repeating: 0xA5, count: piece)
        self.flushEach = flushEach
    }

    func handlerAdded(context: ChannelHandlerContext) { pump(context) }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { pump(context) }
        context.fireChannelWritabilityChanged()
    }

    private func pump(_ context: ChannelHandlerContext) {
        while context.channel.isWritable && sent < total {
            let count = min(buffer.readableBytes, total - sent)
            let piece = count == buffer.readableBytes ? buffer : buffer.getSlice(at: 0, length: count)!
            if flushEach {
                context.writeAndFlush(wrapOutboundOut(piece), promise: nil)
            } else {
                context.write(wrapOutboundOut(piece), promise: nil)
            }
            sent += count
        }
        if !flushEach { context.flush() }
    }
}

/// Writes back what arrives.
private final class EchoHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.writeAndFlush(data, promise: nil)
    }
}

/// Sends `size` bytes, waits for them to come back, `samples` times; the times in seconds.
private final class PingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let samples: Int
    private let size: Int
    private let done: EventLoopPromise<[Double]>
    private let message: ByteBuffer
    private var times: [Double] = []
    private var got = 0
    private var started = ContinuousClock.now

    init(samples: Int, size: Int, done: EventLoopPromise<[Double]>) {
        self.samples = samples
        self.size = size
        self.done = done
        self.message = ByteBuffer(repeating: 0x5A, count: size)
        times.reserveCapacity(samples)
    }

    func handlerAdded(context: ChannelHandlerContext) { ping(context) }

    private func ping(_ context: ChannelHandlerContext) {
        started = ContinuousClock.now
        context.writeAndFlush(wrapOutboundOut(message), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        got += unwrapInboundIn(data).readableBytes
        guard got >= size else { return }
        got -= size
        times.append(seconds(ContinuousClock.now - started))
        if times.count == samples {
            done.succeed(times)
        } else {
            ping(context)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        done.fail(MeasureError("nio-handler: echo ended after \(times.count) round trips"))
        context.fireChannelInactive()
    }
}
