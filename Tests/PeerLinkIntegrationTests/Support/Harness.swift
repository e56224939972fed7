import Foundation
import PeerLink
import Testing

/// Facts about the machine the integration tests run on, and the switches that gate them.
enum TestHost {
    /// The directory holding the built products (`peerlink` sits next to the test bundle).
    static let productsDirectory: URL = {
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = executable.deletingLastPathComponent()
        // On Linux the test runner is `<products>/<Package>PackageTests.xctest`.
        if directory.pathExtension == "xctest" { directory = directory.deletingLastPathComponent() }
        return directory
    }()

    static var peerlinkBinary: String { productsDirectory.appendingPathComponent("peerlink").path }

    static let environment = ProcessInfo.processInfo.environment

    /// In CI (or with PEERLINK_REQUIRE_DAEMONS=1) a missing daemon fails the tests that need it
    /// instead of skipping them, so a broken set-up can never pass as "skipped".
    static var daemonsRequired: Bool {
        environment["PEERLINK_REQUIRE_DAEMONS"] == "1" || environment["CI"] == "true"
    }

    /// Whether avahi-daemon answers. Asked in a child process (`avahi-daemon --check`, else
    /// `peerlink radios --json`), never in the test process itself: a bug in the Avahi glue must
    /// fail a test, not crash the whole test run before a single test could say what is wrong.
    static let avahiRunning: Bool = {
        if let daemon = which("avahi-daemon") ?? ["/usr/sbin/avahi-daemon", "/sbin/avahi-daemon"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) {
            return runSynchronously(daemon, ["--check"], timeout: .seconds(10))?.status == 0
        }
        guard let radios = runSynchronously(peerlinkBinary, ["radios", "--json"], timeout: .seconds(10)), radios.status == 0,
            let object = try? JSONSerialization.jsonObject(with: Data(radios.stdout.utf8)) as? [String: Any],
            let avahi = object["avahi"] as? [String: Any]
        else { return false }
        return avahi["running"] as? Bool == true
    }()

    /// Tests that need avahi-daemon run when it runs, and always when daemons are required.
    static var avahiTestsEnabled: Bool { avahiRunning || daemonsRequired }

    static let isRoot: Bool = getuid() == 0

    /// Hardware/daemons.sh, when the test command exported it (it started the daemons).
    static var daemonsScript: String? { environment["PEERLINK_DAEMONS_SCRIPT"] }

    /// Hardware/netlab.sh, exported by the test command.
    static var netlabScript: String? {
        environment["PEERLINK_NETLAB_SCRIPT"] ?? repositoryRoot.map { $0 + "/Hardware/netlab.sh" }
    }

    /// The package root, found from this source file's location.
    static let repositoryRoot: String? = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<4 { url = url.deletingLastPathComponent() }
        return FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) ? url.path : nil
    }()

    /// A Python with `zeroconf` (and `noiseprotocol`), exported by the test command.
    static var python: String { environment["PEERLINK_PYTHON"] ?? "python3" }

    /// The interpreter as an absolute path (ChildProcess needs one), if it exists.
    static var pythonPath: String? { python.hasPrefix("/") ? python : which(python) }

    /// Whether `python` can `import zeroconf` (asked once, in a child process).
    static let pythonHasZeroconf: Bool = {
        guard let python = pythonPath else { return false }
        return runSynchronously(python, ["-c", "import zeroconf"], timeout: .seconds(20))?.status == 0
    }()

    /// Whether `python` can run the independent peer (`import noise, cryptography`; asked once).
    static let pythonHasNoise: Bool = {
        guard let python = pythonPath else { return false }
        return runSynchronously(python, ["-c", "import noise.connection, cryptography"], timeout: .seconds(20))?.status == 0
    }()

    /// Whether this kernel has Bluetooth sockets (`socket(AF_BLUETOOTH)` succeeds).
    static let kernelHasBluetooth: Bool = {
        let afBluetooth: Int32 = 31
        let btprotoHCI: Int32 = 1
        let fd = socket(afBluetooth, Int32(SOCK_RAW.rawValue), btprotoHCI)
        if fd >= 0 {
            close(fd)
            return true
        }
        return errno != EAFNOSUPPORT
    }()

    static func which(_ program: String) -> String? {
        for directory in (environment["PATH"] ?? "/usr/sbin:/usr/bin:/sbin:/bin").split(separator: ":") {
            let path = "\(directory)/\(program)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    /// A service type no other test uses, so tests can run in parallel against one daemon.
    static func uniqueServiceType(_ prefix: String = "t") -> String {
        let letters = "abcdefghijklmnopqrstuvwxyz0123456789"
        let suffix = String((0..<8).map { _ in letters.randomElement()! })
        return String((prefix + "-" + suffix).prefix(15))
    }

    /// One directory per test run holding every temporary directory of the run; removed when
    /// the test process exits.
    static let runDirectory: String = {
        let path = NSTemporaryDirectory() + "peerlink-integ-\(getpid())"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(atPath: TestHost.runDirectory) }
        return path
    }()

    /// A fresh directory (e.g. a config directory, so each process gets its own identity).
    static func temporaryDirectory(_ label: String = "peerlink-test") -> String {
        let path = runDirectory + "/\(label)-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// A random fingerprint as PeerLink prints it: 16 lowercase base32 characters.
    static func randomFingerprint() -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")
        return String((0..<16).map { _ in alphabet.randomElement()! })
    }
}

/// A child process with its output collected line by line, for driving `peerlink` (or other
/// tools) as a user would. Always bounded: every wait takes a timeout; deinit kills the process.
///
/// Started with posix_spawn rather than Foundation's `Process`, whose children inherit the
/// spawning thread's signal mask (Dispatch threads block SIGINT and SIGTERM, so a child would
/// ignore the very signals the tests send) and whose exit is noticed only through Dispatch
/// and a socket a daemonizing grandchild keeps open. Here the child gets an empty signal mask and
/// default handlers, no file descriptor but 0-2, and is reaped with waitpid by whoever asks.
final class ChildProcess: @unchecked Sendable {
    /// A line of output and when it arrived.
    struct Line: Sendable {
        var text: String
        var time: ContinuousClock.Instant
    }

    let pid: pid_t
    let command: String
    private let lock = NSLock()
    private var exitStatus: Int32?
    /// What the reader threads collected; they hold this, never the ChildProcess, so that
    /// releasing the ChildProcess kills the child (deinit) even while its pipes are open.
    private let output = Output()

    private final class Output: @unchecked Sendable {
        let lock = NSLock()
        var outLines: [Line] = []
        var errLines: [Line] = []
        var openStreams = 2

        func append(_ lines: [Line], error: Bool) {
            lock.withLock {
                if error { errLines += lines } else { outLines += lines }
            }
        }

        func close(last: Line?, error: Bool) {
            lock.withLock {
                if let last { if error { errLines.append(last) } else { outLines.append(last) } }
                openStreams -= 1
            }
        }
    }

    /// Starts `executable` with `arguments`; `environment` entries are added to this process's.
    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], withInput: Bool = false) throws {
        command = ([executable] + arguments).joined(separator: " ")
        var input: [Int32] = [-1, -1]
        if withInput {
            guard pipe(&input) == 0 else { throw HarnessError("pipe: errno \(errno)") }
            inputFD = input[1]
        }
        var out: [Int32] = [-1, -1]
        var err: [Int32] = [-1, -1]
        // (Children get only fds 0-2, so no close-on-exec flag is needed on these.)
        guard pipe(&out) == 0 else { throw HarnessError("pipe: errno \(errno)") }
        guard pipe(&err) == 0 else {
            close(out[0])
            close(out[1])
            throw HarnessError("pipe: errno \(errno)")
        }
        let spawned = Spawn.start(
            executable, arguments, environment: environment, stdin: withInput ? input[0] : nil,
            stdout: .descriptor(out[1]), stderr: .descriptor(err[1]))
        close(out[1])
        close(err[1])
        if withInput { close(input[0]) }
        guard let spawned else {
            close(out[0])
            close(err[0])
            throw HarnessError("cannot start \(executable) (errno \(errno))")
        }
        pid = spawned
        startReader(out[0], error: false)
        startReader(err[0], error: true)
    }

    /// Starts the built `peerlink` with its own identity in a fresh config directory.
    static func peerlink(_ arguments: [String], configHome: String = TestHost.temporaryDirectory(), environment: [String: String] = [:], withInput: Bool = false) throws -> ChildProcess {
        var env = environment
        env["XDG_CONFIG_HOME"] = configHome
        return try ChildProcess(TestHost.peerlinkBinary, arguments, environment: env, withInput: withInput)
    }

    /// The write end of the child's standard input (with `withInput`), until ``closeInput()``.
    private var inputFD: Int32 = -1

    /// Writes text to the child's standard input.
    func type(_ text: String) {
        guard inputFD >= 0 else { return }
        Glibc.signal(SIGPIPE, SIG_IGN)  // a child that died must fail the test, not kill it
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { write(inputFD, $0.baseAddress, $0.count) }
            if written <= 0 { return }
            offset += written
        }
    }

    /// Ends the child's standard input.
    func closeInput() {
        if inputFD >= 0 { close(inputFD) }
        inputFD = -1
    }

    /// A thread of its own reads each pipe (blocking reads: no Dispatch involved), so lines are
    /// time-stamped when they arrive even while test threads are busy.
    private func startReader(_ fd: Int32, error: Bool) {
        let output = output
        let thread = Thread {
            var partial = Data()
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = read(fd, &buffer, buffer.count)
                if count < 0 && errno == EINTR { continue }
                let now = ContinuousClock.now
                if count <= 0 {
                    output.close(last: partial.isEmpty ? nil : Line(text: String(decoding: partial, as: UTF8.self), time: now), error: error)
                    break
                }
                partial.append(contentsOf: buffer[0..<count])
                var lines: [Line] = []
                while let newline = partial.firstIndex(of: 0x0A) {
                    lines.append(Line(text: String(decoding: partial[partial.startIndex..<newline], as: UTF8.self), time: now))
                    partial = Data(partial[partial.index(after: newline)...])
                }
                output.append(lines, error: error)
            }
            close(fd)
        }
        thread.name = "peerlink-test-reader"
        thread.start()
    }

    var timedStdoutLines: [Line] { output.lock.withLock { output.outLines } }
    var stdoutLines: [String] { timedStdoutLines.map(\.text) }
    var stderrLines: [String] { output.lock.withLock { output.errLines.map(\.text) } }
    var stdout: String { stdoutLines.joined(separator: "\n") }
    var stderr: String { stderrLines.joined(separator: "\n") }
    private var outputClosed: Bool { output.lock.withLock { output.openStreams <= 0 } }

    /// Reaps the child if it has exited; its exit status then (128 + N for signal N, as a shell
    /// reports it), nil while it runs.
    private func poll() -> Int32? {
        lock.withLock {
            if let exitStatus { return exitStatus }
            var status: Int32 = 0
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid {
                exitStatus = Spawn.exitStatus(status)
            } else if reaped < 0 && errno == ECHILD {
                exitStatus = -1
            }
            return exitStatus
        }
    }

    var isRunning: Bool { poll() == nil }

    /// The exit status (128 + N for signal N); nil while running.
    var terminationStatus: Int32? { poll() }

    /// Waits until a line of standard output (from the `after`-th on) satisfies `match`; returns
    /// it with the time it arrived.
    @discardableResult
    func waitForTimedLine(after: Int = 0, timeout: Duration = .seconds(15), where match: (String) -> Bool) async throws -> Line {
        let deadline = ContinuousClock.now + timeout
        func find() -> Line? { timedStdoutLines.dropFirst(after).first { match($0.text) } }
        while ContinuousClock.now < deadline {
            if let line = find() { return line }
            if let status = poll() {
                // One last look after the final output arrives.
                await waitForOutputToClose()
                if let line = find() { return line }
                throw HarnessError("\(command) exited (status \(status)) before printing the expected line.\nstdout:\n\(stdout)\nstderr:\n\(stderr)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw HarnessError("\(command): no expected line within \(timeout).\nstdout:\n\(stdout)\nstderr:\n\(stderr)")
    }

    @discardableResult
    func waitForLine(after: Int = 0, timeout: Duration = .seconds(15), where match: (String) -> Bool) async throws -> String {
        try await waitForTimedLine(after: after, timeout: timeout, where: match).text
    }

    @discardableResult
    func waitForLine(containing text: String, after: Int = 0, timeout: Duration = .seconds(15)) async throws -> String {
        try await waitForLine(after: after, timeout: timeout) { $0.contains(text) }
    }

    /// Waits until a line of standard error contains `text`.
    @discardableResult
    func waitForStderrLine(containing text: String, timeout: Duration = .seconds(15)) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let line = stderrLines.first(where: { $0.contains(text) }) { return line }
            if let status = poll() {
                await waitForOutputToClose()
                if let line = stderrLines.first(where: { $0.contains(text) }) { return line }
                throw HarnessError("\(command) exited (status \(status)) before printing \"\(text)\" on stderr.\nstdout:\n\(stdout)\nstderr:\n\(stderr)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw HarnessError("\(command): no \"\(text)\" on stderr within \(timeout).\nstdout:\n\(stdout)\nstderr:\n\(stderr)")
    }

    func signal(_ number: Int32) {
        if isRunning { kill(pid, number) }
    }

    /// Waits for the process to exit; kills it and throws if it does not in time.
    @discardableResult
    func waitForExit(timeout: Duration = .seconds(30)) async throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let status = poll() {
                await waitForOutputToClose()
                return status
            }
            if ContinuousClock.now >= deadline {
                kill(pid, SIGKILL)
                throw HarnessError("\(command) did not exit within \(timeout).\nstdout:\n\(stdout)\nstderr:\n\(stderr)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Lets the pipes drain after exit (bounded: a grandchild may hold them open).
    private func waitForOutputToClose() async {
        let deadline = ContinuousClock.now + .seconds(2)
        while !outputClosed && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    /// SIGTERM, then SIGKILL if it is still there after `grace`. Synchronous, so it also works
    /// in clean-up paths of a cancelled test.
    func terminate(grace: Duration = .seconds(3)) {
        guard isRunning else { return }
        kill(pid, SIGTERM)
        let deadline = ContinuousClock.now + grace
        while isRunning && ContinuousClock.now < deadline { usleep(10_000) }
        killAndReap()
    }

    private func killAndReap() {
        guard isRunning else { return }
        kill(pid, SIGKILL)
        lock.withLock {
            guard exitStatus == nil else { return }
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
            exitStatus = Spawn.exitStatus(status)
        }
    }

    deinit {
        closeInput()
        killAndReap()
    }
}

extension ChildProcess {
    /// The id `peerlink advertise` prints (`(id abcd-efgh-ijkl-mnop)`), ungrouped as scan prints it.
    func advertisedID(timeout: Duration = .seconds(15)) async throws -> String {
        let line = try await waitForLine(containing: "(id ", timeout: timeout)
        guard let range = line.range(of: #"\(id ([a-z2-7-]+)\)"#, options: .regularExpression) else {
            throw HarnessError("no id in: \(line)")
        }
        return line[range].dropFirst(4).dropLast().filter { $0 != "-" }
    }
}

/// Runs a command to completion and returns its status and output.
func runCommand(_ executable: String, _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(60)) async throws -> (status: Int32, stdout: String, stderr: String) {
    let child = try ChildProcess(executable, arguments, environment: environment)
    let status = try await child.waitForExit(timeout: timeout)
    return (status, child.stdout, child.stderr)
}

/// Runs `peerlink` with a fresh identity (unless `configHome` is given) to completion.
func runPeerlink(_ arguments: [String], configHome: String = TestHost.temporaryDirectory(), environment: [String: String] = [:], timeout: Duration = .seconds(30)) async throws -> (status: Int32, stdout: String, stderr: String) {
    var env = environment
    env["XDG_CONFIG_HOME"] = configHome
    return try await runCommand(TestHost.peerlinkBinary, arguments, environment: env, timeout: timeout)
}

/// Runs a command to completion, blocking this thread: for gates evaluated once and for clean-up
/// that must finish even when the test's task is cancelled. Output goes to files, not pipes.
/// Killed after `timeout`; nil if it could not start or had to be killed.
func runSynchronously(_ executable: String, _ arguments: [String], environment: [String: String] = [:], timeout: Duration) -> (status: Int32, stdout: String, stderr: String)? {
    guard let child = SpawnedProcess(executable, arguments, environment: environment) else { return nil }
    let deadline = ContinuousClock.now + timeout
    while !child.poll() {
        if ContinuousClock.now >= deadline {
            child.kill()
            return nil
        }
        usleep(20_000)
    }
    return child.result
}

/// Runs a command to completion with its output in files, for commands that leave daemons
/// behind (`netlab.sh up`, `daemons.sh restart-avahi`: a daemon holding a pipe would keep the
/// output open forever). Waits for at most `timeout`, even if the test is cancelled meanwhile
/// (a half-done `up` or restart must not be abandoned).
func runSpawned(_ executable: String, _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(60)) async throws -> (status: Int32, stdout: String, stderr: String) {
    guard let child = SpawnedProcess(executable, arguments, environment: environment) else {
        throw HarnessError("cannot start \(executable)")
    }
    let deadline = ContinuousClock.now + timeout
    while !child.poll() {
        if ContinuousClock.now >= deadline {
            child.kill()
            throw HarnessError("\(([executable] + arguments).joined(separator: " ")) did not finish within \(timeout)")
        }
        // Not cancellable on purpose; bounded by the deadline.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { continuation.resume() }
        }
    }
    return child.result!
}

/// A child started with posix_spawn (see ``Spawn``) whose output goes to files, reaped with
/// waitpid by whoever polls it.
final class SpawnedProcess: @unchecked Sendable {
    let pid: pid_t
    private let directory: String
    private(set) var result: (status: Int32, stdout: String, stderr: String)?

    init?(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) {
        directory = NSTemporaryDirectory() + "peerlink-spawn-\(UUID().uuidString)"
        guard (try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)) != nil,
            let pid = Spawn.start(executable, arguments, environment: environment, stdout: .file(directory + "/out"), stderr: .file(directory + "/err"))
        else {
            try? FileManager.default.removeItem(atPath: directory)
            return nil
        }
        self.pid = pid
    }

    /// True once the child has exited (and `result` is set).
    func poll() -> Bool {
        if result != nil { return true }
        var status: Int32 = 0
        let reaped = waitpid(pid, &status, WNOHANG)
        if reaped == 0 || (reaped < 0 && errno == EINTR) { return false }
        let stdout = Self.text(ofFile: directory + "/out")
        let stderr = Self.text(ofFile: directory + "/err")
        result = (reaped < 0 ? -1 : Spawn.exitStatus(status), stdout, stderr)
        try? FileManager.default.removeItem(atPath: directory)
        return true
    }

    /// The whole file at `path` as UTF-8 text (empty when it cannot be opened), read with
    /// read(2): LeakSanitizer reports a buffer of every `String(contentsOfFile:)` call (inside
    /// Foundation's file reading), which buried a sanitizer run's own findings.
    static func text(ofFile path: String) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "" }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += chunk[..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    func kill() {
        guard result == nil else { return }
        Glibc.kill(pid, SIGKILL)
        var status: Int32 = 0
        _ = waitpid(pid, &status, 0)
        result = (128 + SIGKILL, "", "")
        try? FileManager.default.removeItem(atPath: directory)
    }

    deinit { kill() }
}

/// posix_spawn with what a child of the tests needs.
enum Spawn {
    enum Output {
        case file(String)
        case descriptor(Int32)
    }

    /// Starts a child: standard input /dev/null, output as given, no other file descriptor
    /// (so a daemon it starts never holds a test's pipes open), an empty signal mask and default
    /// signal handlers (the spawning thread may block or ignore signals; the child must not).
    static func start(_ executable: String, _ arguments: [String], environment: [String: String], stdin: Int32? = nil, stdout: Output, stderr: Output) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let stdin {
            posix_spawn_file_actions_adddup2(&actions, stdin, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        for (target, output) in [(Int32(1), stdout), (Int32(2), stderr)] {
            switch output {
            case .file(let path): posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            case .descriptor(let fd): posix_spawn_file_actions_adddup2(&actions, fd, target)
            }
        }
        if let closeFrom = SpawnSupport.addCloseFrom { _ = closeFrom(&actions, 3) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigfillset(&defaults)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var env = ProcessInfo.processInfo.environment
        for (key, value) in environment { env[key] = value }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard result == 0 else {
            errno = result
            return nil
        }
        return pid
    }

    /// A waitpid status as a shell reports it: the exit code, or 128 + the signal.
    static func exitStatus(_ status: Int32) -> Int32 {
        status & 0x7F == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    }
}

enum SpawnSupport {
    typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32

    /// glibc's posix_spawn_file_actions_addclosefrom_np (2.34 and later; not in the Swift overlay).
    static let addCloseFrom: AddCloseFrom? = {
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: AddCloseFrom.self)
    }()
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// MARK: - What `peerlink scan --json` prints

/// One peer of `peerlink scan --json` (and of a `--watch --json` found/updated line).
struct ScannedPeer: Decodable, Sendable, Equatable {
    struct Endpoint: Decodable, Sendable, Equatable {
        var transport: String
        var host: String
        var port: Int
    }
    var name: String
    var id: String
    var endpoints: [Endpoint]
    var info: [String: String]
}

/// One line of `peerlink scan --watch --json`.
struct WatchLine: Decodable, Sendable {
    var event: String
    var peer: ScannedPeer?
    var name: String?
    var id: String?

    /// The line parsed, or nil when it is not a watch event.
    static func parse(_ line: String) -> WatchLine? {
        try? JSONDecoder().decode(WatchLine.self, from: Data(line.utf8))
    }

    /// The peer's id, whatever the event.
    var peerID: String? { peer?.id ?? id }
}

/// `peerlink scan --lan --json` for `service`, which must exit 0; the peers it printed.
func scanPeers(service: String, timeout: Double = 3, environment: [String: String] = [:]) async throws -> [ScannedPeer] {
    let scan = try await runPeerlink(
        ["scan", "--lan", "--service", service, "--timeout", String(timeout), "--json"], environment: environment,
        timeout: .seconds(Int64(timeout) + 20))
    guard scan.status == 0 else {
        throw HarnessError("peerlink scan exited \(scan.status).\nstdout:\n\(scan.stdout)\nstderr:\n\(scan.stderr)")
    }
    do {
        return try JSONDecoder().decode([ScannedPeer].self, from: Data(scan.stdout.utf8))
    } catch {
        throw HarnessError("peerlink scan --json printed something that is not a JSON array of peers (\(error)):\n\(scan.stdout)")
    }
}

/// Scans again and again (bounded by `within`) until `accept` says yes; returns the last result.
func scanUntil(service: String, within: Duration = .seconds(20), scanTimeout: Double = 2, _ accept: ([ScannedPeer]) -> Bool) async throws -> [ScannedPeer] {
    let deadline = ContinuousClock.now + within
    var peers = try await scanPeers(service: service, timeout: scanTimeout)
    while !accept(peers) && ContinuousClock.now < deadline {
        try await Task.sleep(for: .milliseconds(200))
        peers = try await scanPeers(service: service, timeout: scanTimeout)
    }
    return peers
}
