import ArgumentParser
import Foundation
import Logging
import PeerLink

#if canImport(Glibc)
import Glibc
#endif

/// The PeerLink benchmark: sessions over loopback TCP (or, with `--bluetooth`, over RFCOMM and
/// L2CAP between two local adapters), each figure next to a raw baseline measured in the same
/// run. Build it in release mode: `swift run -c release peerlink-bench`.
@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peerlink-bench",
        abstract: "Measure PeerLink sessions against raw sockets on the same link, in this run.",
        discussion: """
            By default, over loopback TCP: throughput for 64 B, 1 KiB, 64 KiB and 1 MiB messages \
            (encrypted and not) next to raw TCP with the ratio; small-message round trips (p50/p99) \
            alone and during a bulk transfer; found-to-connected time; 8-peer mesh formation time; \
            peak RSS. Traffic stays on 127.0.0.1.

            With --bluetooth, over RFCOMM and L2CAP from one local adapter to another (a listener \
            on --listen-on, a dialler on --dial-from): connect time, throughput of encrypted 1 KiB \
            and 64 KiB messages and of one stream, and 64 B round trips, each next to a raw socket \
            of the same kind between the same adapters. Needs a kernel with Bluetooth and two \
            adapters that reach each other: the VM lab has them (Hardware/bluetooth-bench.sh).
            """)

    @Flag(help: "A short run (CI): small volumes, few samples. The figures are not meaningful.")
    var smoke = false

    @Option(help: "Bytes moved per throughput measurement (default: 64 MiB, 2 MiB with --smoke; over Bluetooth 4 MiB, 128 KiB with --smoke).")
    var volume: Int?

    @Flag(help: "Measure RFCOMM and L2CAP between two local Bluetooth adapters instead of loopback TCP.")
    var bluetooth = false

    @Flag(help: "Print one JSON object (build, transport, rows of measurement, encryption, value, unit, baseline) instead of the table.")
    var json = false

    @Option(
        help: ArgumentHelp(
            "Over TCP, only these measurements (comma-separated): \(Self.measurements.joined(separator: ", ")). For profiling one path; io_thread is measured only when named.",
            valueName: "names"))
    var only: String?

    @Option(help: ArgumentHelp("Over TCP, only sessions with this encryption: required or none.", valueName: "required|none"))
    var encryption: String?

    /// What `--only` can name over TCP (`rtt` and `rtt_under_bulk` give their p50 and p99 rows;
    /// `io_thread`, 64 B and 64 KiB messages and round trips with both sessions and their apps
    /// on PeerLink's I/O thread, ``IOThreadExecutor``).
    static let measurements = [
        "aead_limit", "connect", "messages_64B", "messages_1KiB", "messages_64KiB", "messages_1MiB", "stream", "rtt",
        "rtt_under_bulk", "io_thread", "mesh8",
    ]

    /// What a run without `--only` measures: all but `io_thread`, whose two more sessions (and
    /// the I/O thread's own heap) would raise the run's peak RSS above earlier runs'.
    static let defaultMeasurements = measurements.filter { $0 != "io_thread" }

    /// The measurements `--only` leaves in (``defaultMeasurements`` without it).
    var chosen: Set<String> {
        guard let only else { return Set(Self.defaultMeasurements) }
        return Set(only.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
    }

    @Option(
        name: .customLong("listen-on"),
        help: ArgumentHelp("With --bluetooth: the adapter of the listening side (default: the first one that is up).", valueName: "hciN"))
    var listenOn: String?

    @Option(
        name: .customLong("dial-from"),
        help: ArgumentHelp("With --bluetooth: the adapter of the dialling side, which sends (default: the next one that is up).", valueName: "hciN"))
    var dialFrom: String?

    func validate() throws {
        if !bluetooth, listenOn != nil || dialFrom != nil {
            throw ValidationError("--listen-on and --dial-from choose Bluetooth adapters: add --bluetooth")
        }
        for (option, name) in [("--listen-on", listenOn), ("--dial-from", dialFrom)] {
            guard let name else { continue }
            guard BluetoothBench.isAdapterName(name) else {
                throw ValidationError("\(option) takes an adapter name such as hci0, not '\(name)' ('hciconfig' lists them)")
            }
        }
        if bluetooth, only != nil || encryption != nil {
            throw ValidationError("--only and --encryption choose among the TCP measurements: leave out --bluetooth")
        }
        if let unknown = chosen.subtracting(Self.measurements).sorted().first {
            throw ValidationError("--only takes measurement names (\(Self.measurements.joined(separator: ", "))), not '\(unknown)'")
        }
        if let encryption, encryption != "required", encryption != "none" {
            throw ValidationError("--encryption is required or none, not '\(encryption)'")
        }
        if let listenOn, listenOn == dialFrom {
            throw ValidationError("--listen-on and --dial-from must name two different adapters (a link needs two ends)")
        }
        // at least one of the largest messages
        let least = bluetooth ? 64 << 10 : 1 << 20
        if let volume, volume < least {
            throw ValidationError("--volume must be at least \(least) bytes\(bluetooth ? " with --bluetooth" : ""), not \(volume)")
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .warning
            return handler
        }
        if bluetooth {
            let report = Report(transport: "bluetooth", json: json)
            try await BluetoothBench(
                smoke: smoke, volume: volume ?? (smoke ? 128 << 10 : 4 << 20), listenOn: listenOn, dialFrom: dialFrom
            ).run(report: report)
            report.finish()
            return
        }
        let volume = self.volume ?? (smoke ? 2 << 20 : 64 << 20)
        let samples = smoke ? 20 : 500
        let report = Report(transport: "tcp", json: json)
        report.line("peerlink-bench\(smoke ? " --smoke" : "") — loopback TCP, \(ProcessInfo.processInfo.activeProcessorCount) CPUs, \(Self.buildKind) build")
        // What the sessions' first link would do anyway, done first so that it can be said.
        let heap = HeapTuning.apply()
        var hint = ""
        if case .tuned = heap { hint = " (PEERLINK_HEAP_TUNING=off: glibc's defaults)" }
        report.line("heap: \(heap)\(hint)")
        report.line("")

        let chosen = self.chosen
        // The cipher's own limit on this machine, the ceiling of every encrypted figure below.
        if chosen.contains("aead_limit") {
            report.section("the AEAD alone (one core, no I/O)", baseline: "")
            report.aeadLimit(try AEADLimit.measure(seconds: smoke ? 0.05 : 1))
            report.line("")
        }

        let pairWork = chosen.subtracting(["aead_limit", "mesh8"])
        for encryption in [EncryptionPreference.required, .none] where !pairWork.isEmpty {
            if let only = self.encryption, only != (encryption == .none ? "none" : "required") { continue }
            let label = encryption == .none ? "plain" : "encrypted"
            let pair = try await SessionPair.loopback(encryption: encryption)
            report.section("\(label) session (Noise ChaChaPoly\(encryption == .none ? " off" : ""))", baseline: "raw TCP")
            if chosen.contains("connect") {
                report.duration("found → connected", key: "connect", encryption: encryption, pair.connectTime, baseline: nil)
            }
            for size in [64, 1024, 64 * 1024, 1024 * 1024] where chosen.contains("messages_\(Report.key(size))") {
                // Small messages cost per message: move less of them.
                let total = size < 1024 ? volume / 16 : size < 64 * 1024 ? volume / 4 : volume
                let session = try await pair.throughput(messageSize: size, total: total)
                let raw = try RawTCP.throughput(messageSize: size, total: total)
                report.throughput(
                    "\(Report.size(size)) messages", key: "messages_\(Report.key(size))", encryption: encryption,
                    bytes: total, messageSize: size < 1024 ? size : nil, session: session, raw: raw)
            }
            if chosen.contains("stream") {
                let streamed = try await pair.streamThroughput(total: volume)
                let rawStream = try RawTCP.throughput(messageSize: 64 * 1024, total: volume)
                report.throughput(
                    "one stream of \(Report.size(volume))", key: "stream", encryption: encryption, bytes: volume, session: streamed,
                    raw: rawStream)
            }
            if chosen.contains("rtt") {
                let alone = try await pair.roundTrips(samples: samples, duringBulk: false)
                let rawRTT = try RawTCP.roundTrips(size: 64, samples: samples)
                report.latency("64 B round trip", key: "rtt", encryption: encryption, session: alone, raw: rawRTT)
            }
            if chosen.contains("rtt_under_bulk") {
                let loaded = try await pair.roundTrips(samples: samples, duringBulk: true)
                report.latency(
                    "64 B round trip during a bulk stream", key: "rtt", suffix: "_under_bulk", encryption: encryption, session: loaded,
                    raw: nil)
            }
            await pair.close()
            if chosen.contains("io_thread") {
                // The same measurements with both sessions, their event loops and the sending
                // task preferring the I/O thread: what an app that opts in sees.
                let pair = try await SessionPair.loopback(encryption: encryption, executor: IOThreadExecutor.shared)
                let total = volume / 16
                let session = try await pair.throughput(messageSize: 64, total: total)
                let raw = try RawTCP.throughput(messageSize: 64, total: total)
                report.throughput(
                    "64 B messages, on the I/O thread", key: "messages_64B_io_thread", encryption: encryption, bytes: total,
                    messageSize: 64, session: session, raw: raw)
                // Bulk too: what a transfer costs an app that opted in.
                let large = try await pair.throughput(messageSize: 64 * 1024, total: volume)
                let rawLarge = try RawTCP.throughput(messageSize: 64 * 1024, total: volume)
                report.throughput(
                    "64 KiB messages, on the I/O thread", key: "messages_64KiB_io_thread", encryption: encryption, bytes: volume,
                    session: large, raw: rawLarge)
                let times = try await pair.roundTrips(samples: samples, duringBulk: false)
                let rawRTT = try RawTCP.roundTrips(size: 64, samples: samples)
                report.latency(
                    "64 B round trip, on the I/O thread", key: "rtt", suffix: "_io_thread", encryption: encryption, session: times,
                    raw: rawRTT)
                await pair.close()
            }
            report.line("")
        }

        if chosen.contains("mesh8") {
            let mesh = try await Mesh.form(peers: 8)
            report.section("mesh", baseline: "")
            report.duration("8-peer mesh formation (encrypted)", key: "mesh8", encryption: .required, mesh, baseline: nil)
            report.line("")
        }
        report.peakRSS()
        report.finish()
    }

    static var buildKind: String {
        isDebug ? "debug (use -c release for real figures)" : "release"
    }

    static var isDebug: Bool {
        #if DEBUG
        true
        #else
        false
        #endif
    }
}

/// Two connected sessions: `a` sends, `b` receives and echoes.
struct SessionPair {
    let a: BenchPeer
    let b: BenchPeer
    let tasks: [Task<Void, Never>]
    let connectTime: Duration
    /// What the sessions' tasks, their event loops and the measuring calls prefer to run on
    /// (nil: Swift's global executor, as an app that does not choose).
    var executor: (any TaskExecutor)? = nil

    /// Two automatic sessions on 127.0.0.1, each told of the other by a discovery report.
    static func loopback(encryption: EncryptionPreference, executor: (any TaskExecutor)? = nil) async throws -> SessionPair {
        let a = try BenchPeer("bench-a", encryption: encryption)
        let b = try BenchPeer("bench-b", encryption: encryption)
        let tasks = [Task(executorPreference: executor) { await a.run() }, Task(executorPreference: executor) { await b.run() }]
        let start = ContinuousClock.now
        a.session.discovered(.found(b.discovered))
        b.session.discovered(.found(a.discovered))
        try await withDeadline(.seconds(20), "the two sessions did not connect") {
            await a.waitForConnected(1)
            await b.waitForConnected(1)
        }
        return SessionPair(a: a, b: b, tasks: tasks, connectTime: ContinuousClock.now - start, executor: executor)
    }

    /// `b` listens for `kind` links on adapter `listenOn`; `a`, on adapter `dialFrom`, connects
    /// to it (``PeerSession/connect(to:context:timeout:)``: dial, handshake, invitation).
    static func bluetooth(
        _ kind: BluetoothSocketKind, listenOn: BluetoothAddress, dialFrom: BluetoothAddress, encryption: EncryptionPreference
    ) async throws -> SessionPair {
        let listener = try BluetoothTransportListener(kind, adapter: listenOn)
        let b = try BenchPeer(
            "bench-\(kind)-listener", encryption: encryption, transports: [BluetoothTransport(adapter: listenOn)],
            listeners: [listener], dialTimeout: .seconds(30))
        let a = try BenchPeer(
            "bench-\(kind)-dialler", encryption: encryption, transports: [BluetoothTransport(adapter: dialFrom)], listeners: [],
            dialTimeout: .seconds(30))
        let tasks = [Task { await a.run() }, Task { await b.run() }]
        let pair = SessionPair(a: a, b: b, tasks: tasks, connectTime: .zero)
        do {
            guard let endpoint = b.endpoints.first else { throw BenchError("the \(kind) listener on \(listenOn) has no endpoint") }
            try await withDeadline(.seconds(10), "the sessions did not start") {
                while !a.session.isRunning || !b.session.isRunning { try await Task.sleep(for: .milliseconds(5)) }
            }
            let start = ContinuousClock.now
            try await withDeadline(.seconds(60), "the \(kind) sessions did not connect") {
                _ = try await a.session.connect(to: endpoint, timeout: .seconds(30))
                await a.waitForConnected(1)
                await b.waitForConnected(1)
            }
            return SessionPair(a: a, b: b, tasks: tasks, connectTime: ContinuousClock.now - start)
        } catch {
            await pair.close()
            throw error
        }
    }

    /// Seconds to move `total` bytes from a to b as messages of `size`, at most `inFlight` bytes
    /// (or 4 messages) sent and not yet received: `send` queues without limit, and a deep queue
    /// measures the queue.
    ///
    /// Over TCP the default is what a session keeps unacknowledged for a peer before it holds
    /// back new frames (4 MiB): the session's own limit, and no more than the raw baseline's
    /// socket buffers may hold on loopback (up to 4 MiB to send and several MiB to receive by
    /// Linux's defaults). Until 2026-11-27 it was 256 KiB, a throttle of the benchmark's own
    /// that the raw baseline did not have. Bluetooth passes 256 KiB: its sockets buffer far less.
    func throughput(messageSize size: Int, total: Int, inFlight: Int = Continuity.Policy.default.maxRetainedBytes) async throws -> Double {
        try await withTaskExecutorPreference(executor) { try await sendMessages(size: size, total: total, inFlight: inFlight) }
    }

    private func sendMessages(size: Int, total: Int, inFlight: Int) async throws -> Double {
        let count = max(1, total / size)
        let base = b.bytesReceived
        let window = max(inFlight, 4 * size)
        let message = [UInt8](repeating: 0xA5, count: size)
        let start = ContinuousClock.now
        try await withDeadline(.seconds(300), "bulk messages did not arrive") {
            var sent = 0
            for _ in 0..<count {
                if sent - (b.bytesReceived - base) > window { await b.waitForBytes(base + sent - window / 2) }
                try await a.session.send(message, to: [b.peer])
                sent += size
            }
            await b.waitForBytes(base + count * size)
        }
        return seconds(ContinuousClock.now - start)
    }

    /// Seconds to move `total` bytes from a to b over one stream (64 KiB writes; the stream's
    /// credit window is the only limit).
    func streamThroughput(total: Int) async throws -> Double {
        let base = b.bytesReceived
        let chunk = [UInt8](repeating: 0x5A, count: 64 * 1024)
        let start = ContinuousClock.now
        try await withDeadline(.seconds(300), "the stream's bytes did not arrive") {
            let stream = try await a.session.openStream(named: "bench", to: b.peer)
            var sent = 0
            while sent < total {
                try await stream.write(chunk)
                sent += chunk.count
            }
            try await stream.finish()
            await b.waitForBytes(base + sent)
        }
        return seconds(ContinuousClock.now - start)
    }

    /// Round trips of 64-byte messages, optionally while a stream from a to b runs at full speed.
    func roundTrips(samples: Int, duringBulk: Bool) async throws -> [Double] {
        try await withTaskExecutorPreference(executor) { try await pingAndWait(samples: samples, duringBulk: duringBulk) }
    }

    private func pingAndWait(samples: Int, duringBulk: Bool) async throws -> [Double] {
        let bulk: Task<Void, Never>? = duringBulk ? Task { [a, b] in
            guard let stream = try? await a.session.openStream(named: "bulk", to: b.peer) else { return }
            let chunk = [UInt8](repeating: 0xA5, count: 64 * 1024)
            var sent = 0
            // Bounded: at most 4 GiB, and it stops when the samples are done.
            while !Task.isCancelled, sent < 4 << 30 {
                guard (try? await stream.write(chunk)) != nil else { return }
                sent += chunk.count
            }
            stream.reset(reason: "the measurement is over")
        } : nil
        defer { bulk?.cancel() }
        if duringBulk { try await Task.sleep(for: .milliseconds(200)) }
        // One deadline for all the pings: a deadline of its own for each (a task group with a
        // sleeping task, as until 2026-11-27) sent each ping from a child task and set up a timer
        // while it was on its way, work the raw echo does not do.
        return try await withDeadline(.seconds(30 + samples / 10), "\(samples) pings were not all answered") { [a, b] in
            var times: [Double] = []
            times.reserveCapacity(samples)
            for _ in 0..<samples { times.append(seconds(try await a.roundTrip(to: b.peer))) }
            return times
        }
    }

    func close() async {
        await a.session.disconnect()
        await b.session.disconnect()
        for task in tasks { await task.value }
    }
}

enum Mesh {
    /// Time from every peer learning of every other to every peer connected to all others.
    static func form(peers count: Int) async throws -> Duration {
        let peers = try (0..<count).map { try BenchPeer("mesh-\($0)", encryption: .required) }
        let tasks = peers.map { peer in Task { await peer.run() } }
        let start = ContinuousClock.now
        for peer in peers {
            for other in peers where other !== peer { peer.session.discovered(.found(other.discovered)) }
        }
        try await withDeadline(.seconds(60), "the \(count)-peer mesh did not form") {
            for peer in peers { await peer.waitForConnected(count - 1) }
        }
        let elapsed = ContinuousClock.now - start
        for peer in peers { await peer.session.disconnect() }
        for task in tasks { await task.value }
        return elapsed
    }
}

/// Runs `body`, failing with `what` when it takes longer than `limit`.
func withDeadline<T: Sendable>(
    _ limit: Duration, _ what: String, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw BenchError("\(what) within \(limit)") }
        return value
    }
}

/// The results: a table printed as it grows, or (with `--json`) one JSON object at the end.
final class Report: Sendable {
    /// One measurement as `--json` prints it.
    struct Row: Encodable, Sendable {
        let measurement: String
        let encryption: String?
        let value: Double
        /// "B/s", "msg/s", "s" or "B".
        let unit: String
        /// The raw figure measured in the same run, when there is one.
        let baseline: Double?

        enum CodingKeys: String, CodingKey { case measurement, encryption, value, unit, baseline }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(measurement, forKey: .measurement)
            try container.encode(encryption, forKey: .encryption)  // null when it does not apply
            try container.encode(value, forKey: .value)
            try container.encode(unit, forKey: .unit)
            try container.encode(baseline, forKey: .baseline)  // null when nothing raw was measured
        }
    }

    private struct Document: Encodable {
        let build: String
        let transport: String
        let rows: [Row]
    }

    let transport: String
    let json: Bool
    private let rows = Locked<[Row]>([])

    init(transport: String, json: Bool) {
        self.transport = transport
        self.json = json
    }

    var measured: [Row] { rows.withLock { $0 } }

    func line(_ text: String) {
        if !json { print(text) }
    }

    func section(_ title: String, baseline: String) {
        line("\(title)")
        line("  " + pad("measurement", 42) + pad("PeerLink", 16) + pad(baseline, 16) + (baseline.isEmpty ? "" : "ratio"))
    }

    func row(_ name: String, _ session: String, _ raw: String, _ ratio: String) {
        line("  " + pad(name, 42) + pad(session, 16) + pad(raw, 16) + ratio)
    }

    private func record(_ measurement: String, _ encryption: EncryptionPreference?, _ value: Double, _ unit: String, baseline: Double?) {
        let encryption = encryption.map { $0 == .none ? "none" : "required" }
        rows.withLock {
            $0.append(Row(measurement: measurement, encryption: encryption, value: value, unit: unit, baseline: baseline))
        }
    }

    /// `bytes` moved in `session` seconds next to the same bytes raw in `raw` seconds; with
    /// `messageSize`, recorded as messages a second rather than bytes.
    func throughput(
        _ name: String, key: String, encryption: EncryptionPreference?, bytes: Int, messageSize: Int? = nil, session: Double, raw: Double
    ) {
        let s = Double(bytes) / session
        let r = Double(bytes) / raw
        var shown = Self.rate(s)
        if let messageSize {
            let perSecond = s / Double(messageSize)
            shown = String(format: "%.0f msg/s", perSecond)
            row(name, shown, String(format: "%.0f msg/s", r / Double(messageSize)), String(format: "%.2f", s / r))
            record(key, encryption, perSecond, "msg/s", baseline: r / Double(messageSize))
            return
        }
        row(name, shown, Self.rate(r), String(format: "%.2f", s / r))
        record(key, encryption, s, "B/s", baseline: r)
    }

    /// Round trips: `key`_p50 and `key`_p99 (each followed by `suffix`), in seconds.
    func latency(
        _ name: String, key: String, suffix: String = "", encryption: EncryptionPreference?, session: [Double], raw: [Double]?
    ) {
        let s = Self.percentiles(session)
        let r = raw.map(Self.percentiles)
        row(name + " p50", Self.us(s.p50), r.map { Self.us($0.p50) } ?? "", r.map { String(format: "%.2f", s.p50 / $0.p50) } ?? "")
        row(name + " p99", Self.us(s.p99), r.map { Self.us($0.p99) } ?? "", r.map { String(format: "%.2f", s.p99 / $0.p99) } ?? "")
        record("\(key)_p50\(suffix)", encryption, s.p50, "s", baseline: r?.p50)
        record("\(key)_p99\(suffix)", encryption, s.p99, "s", baseline: r?.p99)
    }

    /// A time (connect, mesh formation), next to a raw one when there is one.
    func duration(_ name: String, key: String, encryption: EncryptionPreference?, _ value: Duration, baseline: Duration?) {
        let v = durationSeconds(value)
        let b = baseline.map(durationSeconds)
        row(name, Self.ms(value), baseline.map(Self.ms) ?? "", b.map { String(format: "%.2f", v / $0) } ?? "")
        record(key, encryption, v, "s", baseline: b)
    }

    func aeadLimit(_ bytesPerSecond: Double) {
        row("ChaChaPoly sealing 16 KiB in place", Self.rate(bytesPerSecond), "", "")
        record("aead_limit", nil, bytesPerSecond, "B/s", baseline: nil)
    }

    func peakRSS() {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        line("peak RSS: \(usage.ru_maxrss / 1024) MiB")
        record("rss_peak", nil, Double(usage.ru_maxrss) * 1024, "B", baseline: nil)
    }

    /// With `--json`: prints the JSON object of every row recorded.
    func finish() {
        guard json else { return }
        let document = Document(build: Bench.isDebug ? "debug" : "release", transport: transport, rows: measured)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(document), let text = String(data: data, encoding: .utf8) else {
            // Only a NaN or an infinity cannot be encoded: a measurement that took no time.
            print(#"{"error": "a measurement could not be written as JSON (a figure was not finite)"}"#)
            return
        }
        print(text)
    }

    static func percentiles(_ values: [Double]) -> (p50: Double, p99: Double) {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return (0, 0) }
        func at(_ q: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count - 1) * q + 0.5))] }
        return (at(0.5), at(0.99))
    }

    static func rate(_ bytesPerSecond: Double) -> String {
        bytesPerSecond >= 1e9 ? String(format: "%.2f GB/s", bytesPerSecond / 1e9) : String(format: "%.1f MB/s", bytesPerSecond / 1e6)
    }

    static func us(_ seconds: Double) -> String {
        seconds >= 0.001 ? String(format: "%.1f ms", seconds * 1e3) : String(format: "%.0f µs", seconds * 1e6)
    }
    static func ms(_ duration: Duration) -> String { String(format: "%.1f ms", durationSeconds(duration) * 1000) }
    static func size(_ bytes: Int) -> String { bytes >= 1 << 20 ? "\(bytes >> 20) MiB" : bytes >= 1024 ? "\(bytes >> 10) KiB" : "\(bytes) B" }
    /// A size as a measurement name has it: 64B, 1KiB, 64KiB, 1MiB.
    static func key(_ bytes: Int) -> String { size(bytes).replacingOccurrences(of: " ", with: "") }

    private func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }
}
