import Foundation

// peerlink-fuzz: libFuzzer targets for every decoder that reads bytes from the network or disk.
//
// Built the normal way it replays inputs through a target once each — to reproduce a crash, or to
// check a corpus — and writes seed corpora from real encodings:
//
//     peerlink-fuzz --list
//     peerlink-fuzz TARGET FILE-OR-DIRECTORY...      replays every input
//     peerlink-fuzz --seeds DIRECTORY                writes DIRECTORY/TARGET/seed-N for every target
//
// Built with `-sanitize=fuzzer,address -DPEERLINK_FUZZING` (Hardware/fuzz.sh) it is libFuzzer
// itself: `peerlink-fuzz TARGET [libFuzzer options] [CORPUS...]`, or PEERLINK_FUZZ_TARGET=TARGET
// with libFuzzer's own command line (what libFuzzer's -fork and -jobs children get).

#if PEERLINK_FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

/// The target libFuzzer runs, chosen once before it starts.
nonisolated(unsafe) var selected: FuzzTarget?

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    selected?.run(bytes)
    return 0
}
#endif

@main
enum PeerLinkFuzz {
    static func main() {
        var arguments = CommandLine.arguments
        let program = arguments.removeFirst()
        if arguments.first == "--list" || arguments.isEmpty && ProcessInfo.processInfo.environment["PEERLINK_FUZZ_TARGET"] == nil {
            for target in Catalog.targets { print("\(target.name.padding(toLength: 18, withPad: " ", startingAt: 0)) \(target.summary)") }
            return
        }
        if arguments.first == "--seeds" {
            guard arguments.count == 2 else { fail("usage: \(program) --seeds DIRECTORY") }
            writeSeeds(into: arguments[1])
            return
        }
        // The target: the first argument, else the environment (libFuzzer's children).
        var name = ProcessInfo.processInfo.environment["PEERLINK_FUZZ_TARGET"]
        if let first = arguments.first, Catalog.named(first) != nil {
            name = first
            arguments.removeFirst()
            setenv("PEERLINK_FUZZ_TARGET", first, 1)
        }
        guard let name, let target = Catalog.named(name) else {
            fail("unknown fuzz target '\(arguments.first ?? "")': see \(program) --list")
        }
        #if PEERLINK_FUZZING
        selected = target
        var cArguments = ([program] + arguments).map { strdup($0) }
        cArguments.append(nil)
        var argc = CInt(cArguments.count - 1)
        let status = cArguments.withUnsafeMutableBufferPointer { buffer -> CInt in
            var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = buffer.baseAddress
            return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOneInput(data, size) }
        }
        exit(status)
        #else
        replay(target, arguments)
        #endif
    }

    /// Runs every file given (directories: every file in them) through `target` once.
    static func replay(_ target: FuzzTarget, _ paths: [String]) {
        var count = 0
        for path in paths {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { fail("no such file: \(path)") }
            let files = isDirectory.boolValue
                ? ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted().map { path + "/" + $0 }
                : [path]
            for file in files {
                guard let data = FileManager.default.contents(atPath: file) else { continue }
                target.run(Array(data))
                count += 1
            }
        }
        print("peerlink-fuzz: \(target.name): \(count) inputs replayed, no crash")
    }

    static func writeSeeds(into directory: String) {
        for target in Catalog.targets {
            let folder = directory + "/" + target.name
            try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            for (index, seed) in target.seeds().enumerated() {
                target.run(seed)
                _ = FileManager.default.createFile(atPath: "\(folder)/seed-\(index + 1)", contents: Data(seed))
            }
        }
        print("peerlink-fuzz: seeds for \(Catalog.targets.count) targets in \(directory)")
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("peerlink-fuzz: \(message)\n".utf8))
        exit(64)
    }
}
