import Foundation
import PeerLink

/// `peerlink-bench --bluetooth`: for RFCOMM and L2CAP in turn, a raw socket and then an
/// encrypted session over the same kind of link between the same two adapters, the dialling
/// side sending.
struct BluetoothBench {
    let smoke: Bool
    let volume: Int
    let listenOn: String?
    let dialFrom: String?

    static func isAdapterName(_ name: String) -> Bool {
        name.hasPrefix("hci") && name.count > 3 && name.dropFirst(3).allSatisfy(\.isNumber)
    }

    func run(report: Report) async throws {
        let (listening, dialling) = try chooseAdapters()
        guard let listenAddress = BluetoothAddress(listening.address), let dialAddress = BluetoothAddress(dialling.address) else {
            throw BenchError("the adapters report addresses PeerLink cannot read: \(listening.address), \(dialling.address)")
        }
        let samples = smoke ? 10 : 200
        report.line(
            "peerlink-bench --bluetooth\(smoke ? " --smoke" : "") — \(listening.name) \(listening.address) listens, "
                + "\(dialling.name) \(dialling.address) dials and sends; \(ProcessInfo.processInfo.activeProcessorCount) CPUs, "
                + "\(Bench.buildKind) build")
        report.line("")
        for kind in BluetoothSocketKind.allCases {
            try await measure(kind, report: report, listenOn: listenAddress, dialFrom: dialAddress, dialling: dialling, samples: samples)
            report.line("")
        }
        report.line("raw: one non-blocking socket per side, measured right after the session row beside it, on the same")
        report.line("link; \(Report.size(volume)) of a pattern checked byte by byte at the receiver (RFCOMM: 64 KiB writes;")
        report.line("L2CAP: packets of the MTU). Connect times: each on a fresh link (paging included).")
        report.peakRSS()
    }

    /// One table: connect times on fresh links, then session and raw figures in turn (the raw
    /// socket is connected beside the session, on the same link), so that a machine whose load
    /// changes moves both columns of a row.
    private func measure(
        _ kind: BluetoothSocketKind, report: Report, listenOn: BluetoothAddress, dialFrom: BluetoothAddress,
        dialling: BluetoothAdapter, samples: Int
    ) async throws {
        let name = kind.rawValue.uppercased()
        let prefix = kind.rawValue.lowercased() + "_"
        try await waitForNoLink(dialling)
        let first = try RawBluetoothLink.connect(kind, listenOn: listenOn, dialFrom: dialFrom)
        first.close()
        try await waitForNoLink(dialling)
        let pair = try await SessionPair.bluetooth(kind, listenOn: listenOn, dialFrom: dialFrom, encryption: .required)
        let raw: RawBluetoothLink
        do {
            raw = try RawBluetoothLink.connect(kind, listenOn: listenOn, dialFrom: dialFrom)
        } catch {
            await pair.close()
            throw error
        }
        do {
            var title = "\(name) — encrypted session (Noise ChaChaPoly) next to a raw \(name) socket"
            if let mtu = raw.outgoingMTU {
                title += "; \(raw.retransmissionMode == true ? "ERTM" : "Basic mode"), MTU \(mtu) both"
            }
            report.section(title, baseline: "raw \(name)")
            report.duration(
                "connect (+ handshake, invitation)", key: prefix + "connect", encryption: .required, pair.connectTime,
                baseline: first.connectTime)
            for size in [1024, 64 * 1024] {
                let session = try await pair.throughput(messageSize: size, total: volume, inFlight: 256 << 10)
                report.throughput(
                    "\(Report.size(size)) messages, \(Report.size(volume))", key: prefix + "messages_\(Report.key(size))",
                    encryption: .required, bytes: volume, session: session, raw: try raw.throughput(total: volume))
            }
            let streamed = try await pair.streamThroughput(total: volume)
            report.throughput(
                "one stream of \(Report.size(volume))", key: prefix + "stream", encryption: .required, bytes: volume, session: streamed,
                raw: try raw.throughput(total: volume))
            let alone = try await pair.roundTrips(samples: samples, duringBulk: false)
            report.latency(
                "64 B round trip", key: prefix + "rtt", encryption: .required, session: alone, raw: try raw.roundTrips(size: 64, samples: samples))
            let loaded = try await pair.roundTrips(samples: samples, duringBulk: true)
            report.latency(
                "64 B round trip during a bulk stream", key: prefix + "rtt", suffix: "_under_bulk", encryption: .required, session: loaded,
                raw: nil)
        } catch {
            raw.close()
            await pair.close()
            throw error
        }
        raw.close()
        await pair.close()
    }

    /// The adapters named, or the first two that are up; errors say what to do.
    private func chooseAdapters() throws -> (listening: BluetoothAdapter, dialling: BluetoothAdapter) {
        let adapters: [BluetoothAdapter]
        do {
            adapters = try BluetoothAdapter.all()
        } catch {
            guard error.code == .unsupported else { throw error }
            throw BenchError(
                "this kernel has no Bluetooth (socket(AF_BLUETOOTH): address family not supported): run the Bluetooth "
                    + "benchmark in the VM lab, Hardware/bluetooth-bench.sh, whose two virtual adapters reach each other")
        }
        let up = adapters.filter(\.isUp)
        var listening = up.first { $0.name != dialFrom }
        if let listenOn { listening = try Self.adapter(named: listenOn, in: adapters) }
        var dialling = up.first { $0.name != listening?.name }
        if let dialFrom { dialling = try Self.adapter(named: dialFrom, in: adapters) }
        guard let listening, let dialling else {
            throw BenchError(
                "the Bluetooth benchmark needs two adapters that are up (this machine has \(up.count)): "
                    + "run it in the VM lab, Hardware/bluetooth-bench.sh")
        }
        return (listening, dialling)
    }

    private static func adapter(named name: String, in adapters: [BluetoothAdapter]) throws -> BluetoothAdapter {
        guard let adapter = adapters.first(where: { $0.name == name }) else {
            let names = adapters.map(\.name).joined(separator: ", ")
            throw BenchError("there is no adapter \(name) (this machine has \(names.isEmpty ? "none" : names))")
        }
        guard adapter.isUp else { throw BenchError("adapter \(name) is down: 'sudo hciconfig \(name) up'") }
        return adapter
    }

    /// Waits (at most 10 s) until `adapter` has no link left from the measurement before, so
    /// every connect time includes paging (the kernel keeps an idle ACL link a few seconds).
    private func waitForNoLink(_ adapter: BluetoothAdapter) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while Self.hasLink(adapter), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Whether the kernel lists a connection of `adapter` (`/sys/class/bluetooth/hciN:HANDLE`).
    private static func hasLink(_ adapter: BluetoothAdapter) -> Bool {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/sys/class/bluetooth")) ?? []
        return entries.contains { $0.hasPrefix(adapter.name + ":") }
    }
}
