// io-engines: PeerLink's reactor against SwiftNIO's and blocking sockets, loopback TCP, one run.
//
// usage: io-engines [--volume BYTES] [--messages N] [--samples N] [--runs N] [--smoke]
//
// Three measurements, each run --runs times with the engines taking turns (so a change in the
// machine's load reaches every engine), the median printed with its ratio to the raw engine:
//   bulk     --volume bytes (default 1 GiB) one way, written 64 KiB per call
//   64 B     --messages (default 200,000) writes of 64 bytes, one call each, one way
//   rtt      --samples (default 20,000) 64-byte round trips, one at a time: p50 and p99
// and the processor time the whole process used for each (user + system, every thread).
import Foundation

#if canImport(Glibc)
import Glibc
#endif

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("io-engines: \(message)\n".utf8))
    exit(2)
}

var volume = 1 << 30
var messages = 200_000
var samples = 20_000
var runs = 3
let arguments = Array(CommandLine.arguments.dropFirst())
var position = 0
while position < arguments.count {
    let argument = arguments[position]
    position += 1
    if argument == "--smoke" {
        (volume, messages, samples, runs) = (16 << 20, 5_000, 500, 1)
        continue
    }
    guard ["--volume", "--messages", "--samples", "--runs"].contains(argument) else { fail("unknown argument \(argument)") }
    guard position < arguments.count, let value = Int(arguments[position]), value > 0 else {
        fail("\(argument) takes a positive number")
    }
    position += 1
    switch argument {
    case "--volume": volume = value
    case "--messages": messages = value
    case "--samples": samples = value
    default: runs = value
    }
}

let engines: [any Engine] = [RawEngine(), PeerLinkEngine(), NIOAsyncEngine(), NIOHandlerEngine()]

struct Figures {
    var bulk: [Double] = []  // B/s
    var bulkCPU: [Double] = []  // processor seconds per GiB
    var small: [Double] = []  // msg/s
    var smallCPU: [Double] = []  // processor µs per message
    var p50: [Double] = []
    var p99: [Double] = []
    var rttCPU: [Double] = []  // processor µs per round trip
}

#if DEBUG
let build = "debug"
#else
let build = "release"
#endif
print("io-engines: loopback TCP, \(build) build, \(ProcessInfo.processInfo.activeProcessorCount) CPUs; "
    + "\(runs) run(s), engines in turn; bulk \(volume >> 20) MiB, \(messages) × 64 B, \(samples) round trips")

var figures = Array(repeating: Figures(), count: engines.count)
for run in 0..<runs {
    // Each run starts with a different engine.
    for step in 0..<engines.count {
        let index = (step + run) % engines.count
        let engine = engines[index]
        var cpu = processorSeconds()
        let bulkSeconds = try await engine.bulk(total: volume, chunk: 65536)
        figures[index].bulk.append(Double(volume) / bulkSeconds)
        figures[index].bulkCPU.append((processorSeconds() - cpu) / (Double(volume) / Double(1 << 30)))

        cpu = processorSeconds()
        let smallSeconds = try await engine.smallWrites(count: messages, size: 64)
        figures[index].small.append(Double(messages) / smallSeconds)
        figures[index].smallCPU.append((processorSeconds() - cpu) / Double(messages) * 1e6)

        cpu = processorSeconds()
        let times = try await engine.roundTrips(samples: samples, size: 64).sorted()
        figures[index].rttCPU.append((processorSeconds() - cpu) / Double(samples) * 1e6)
        figures[index].p50.append(percentile(times, 0.5))
        figures[index].p99.append(percentile(times, 0.99))
        FileHandle.standardError.write(Data("  run \(run + 1) \(engine.name): done\n".utf8))
    }
}

func rate(_ value: Double, _ unit: String) -> String {
    if value >= 1e9 { return String(format: "%.2f G%@", value / 1e9, unit) }
    if value >= 1e6 { return String(format: "%.1f M%@", value / 1e6, unit) }
    if value >= 1e3 { return String(format: "%.1f k%@", value / 1e3, unit) }
    return String(format: "%.0f %@", value, unit)
}
func micro(_ value: Double) -> String { String(format: "%.0f µs", value * 1e6) }
func pad(_ text: String, _ width: Int) -> String {
    text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
}

let rows: [(String, (Figures) -> [Double], (Double) -> String)] = [
    ("bulk, 64 KiB writes", \.bulk, { rate($0, "B/s") }),
    ("  processor s per GiB", \.bulkCPU, { String(format: "%.2f s", $0) }),
    ("64 B writes", \.small, { rate($0, "msg/s") }),
    ("  processor µs per write", \.smallCPU, { String(format: "%.2f µs", $0) }),
    ("64 B round trip p50", \.p50, micro),
    ("64 B round trip p99", \.p99, micro),
    ("  processor µs per round trip", \.rttCPU, { String(format: "%.1f µs", $0) }),
]
print("")
print(pad("measurement", 32) + engines.map { pad($0.name, 24) }.joined())
for (title, value, format) in rows {
    let raw = median(value(figures[0]))
    var line = pad(title, 32)
    for index in engines.indices {
        let figure = median(value(figures[index]))
        var cell = format(figure)
        if index > 0 { cell += String(format: " (%.2f×)", figure / raw) }
        line += pad(cell, 24)
    }
    print(line)
}
if runs > 1 {
    print("\nEvery run, in order (the table gives the medians):")
    for (title, value, format) in rows where !title.hasPrefix(" ") {
        for index in engines.indices {
            print("  " + pad(title, 22) + pad(engines[index].name, 13) + value(figures[index]).map(format).joined(separator: ", "))
        }
    }
}
print("\nRatios are against raw (blocking sockets, a thread per side) in the same run: above 1 is faster "
    + "for rates, slower for times and processor use.")
