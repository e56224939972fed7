#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A failed system call: which call, and the `errno` it set.
public struct SystemError: Error, Hashable, Sendable, CustomStringConvertible {
    public let call: String
    public let errno: Int32

    public init(_ call: String, errno: Int32) {
        self.call = call
        self.errno = errno
    }

    public var description: String { "\(call): \(String(cString: strerror(errno))) (errno \(errno))" }
}

/// Every system call of this target goes through one of these wrappers: `EINTR` is retried
/// here and nowhere else; other failures become a ``SystemError`` naming the call.
package enum Sys {
    @inline(__always)
    package static func retrying<T: BinaryInteger>(_ call: String, _ body: () -> T) throws(SystemError) -> T {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = Glibc.errno
            if code == EINTR { continue }
            throw SystemError(call, errno: code)
        }
    }

    package static func socket(_ domain: Int32, _ type: Int32, _ proto: Int32) throws(SystemError) -> Int32 {
        try retrying("socket") { Glibc.socket(domain, type | Int32(SOCK_CLOEXEC.rawValue), proto) }
    }

    package static func close(_ fd: Int32) {
        // Retrying close after EINTR is wrong on Linux (the descriptor is gone either way).
        _ = Glibc.close(fd)
    }

    package static func shutdown(_ fd: Int32, _ how: Int32) {
        _ = Glibc.shutdown(fd, how)
    }

    package static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) throws(SystemError) {
        var value = value
        _ = try retrying("setsockopt") { setsockopt(fd, level, name, &value, socklen_t(MemoryLayout<Int32>.size)) }
    }

    package static func getOption(_ fd: Int32, _ level: Int32, _ name: Int32) throws(SystemError) -> Int32 {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        _ = try retrying("getsockopt") { getsockopt(fd, level, name, &value, &length) }
        return value
    }

    package static func bind(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) throws(SystemError) {
        _ = try retrying("bind") { Glibc.bind(fd, address, length) }
    }

    package static func listen(_ fd: Int32, _ backlog: Int32) throws(SystemError) {
        _ = try retrying("listen") { Glibc.listen(fd, backlog) }
    }

    package static func accept(_ fd: Int32) throws(SystemError) -> Int32 {
        let accepted = try retrying("accept") { Glibc.accept(fd, nil, nil) }
        _ = fcntl(accepted, F_SETFD, FD_CLOEXEC)
        return accepted
    }

    /// Starts a connect on a non-blocking socket: true when it completed at once, false when in progress.
    package static func connectNonBlocking(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) throws(SystemError) -> Bool {
        while true {
            if Glibc.connect(fd, address, length) == 0 { return true }
            let code = Glibc.errno
            if code == EINTR { continue }
            if code == EINPROGRESS { return false }
            throw SystemError("connect", errno: code)
        }
    }

    /// Waits for `events` on one descriptor; returns the revents, or 0 on timeout.
    package static func poll(_ fd: Int32, events: Int16, timeoutMilliseconds: Int32) throws(SystemError) -> Int16 {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        let count = try retrying("poll") { Glibc.poll(&entry, 1, timeoutMilliseconds) }
        return count == 0 ? 0 : entry.revents
    }

    package static func getsockname(_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>, _ length: UnsafeMutablePointer<socklen_t>) throws(SystemError) {
        _ = try retrying("getsockname") { Glibc.getsockname(fd, address, length) }
    }

    package static func setNonBlocking(_ fd: Int32, _ on: Bool) throws(SystemError) {
        let flags = try retrying("fcntl") { fcntl(fd, F_GETFL) }
        _ = try retrying("fcntl") { fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) }
    }

    package static func getifaddrs() throws(SystemError) -> UnsafeMutablePointer<ifaddrs>? {
        var list: UnsafeMutablePointer<ifaddrs>?
        _ = try retrying("getifaddrs") { Glibc.getifaddrs(&list) }
        return list
    }

    package static func freeifaddrs(_ list: UnsafeMutablePointer<ifaddrs>?) {
        Glibc.freeifaddrs(list)
    }

    package static func fileStatus(_ path: String) throws(SystemError) -> Glibc.stat {
        var info = Glibc.stat()
        _ = try retrying("stat") { stat(path, &info) }
        return info
    }

    package static func fileSystemStatus(_ path: String) throws(SystemError) -> Glibc.statvfs {
        var info = Glibc.statvfs()
        _ = try retrying("statvfs") { statvfs(path, &info) }
        return info
    }

    /// Calls `body` with the name of each entry of the directory at `path` (`.` and `..` too).
    package static func forEachDirectoryEntry(_ path: String, _ body: (String) -> Void) throws(SystemError) {
        guard let directory = opendir(path) else { throw SystemError("opendir", errno: Glibc.errno) }
        defer { closedir(directory) }
        while let entry = readdir(directory) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) {
                String(cString: UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self))
            }
            body(name)
        }
    }

    package static func open(_ path: String, _ flags: Int32, _ mode: mode_t) throws(SystemError) -> Int32 {
        try retrying("open") { Glibc.open(path, flags | O_CLOEXEC, mode) }
    }

    package static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(SystemError) -> Int {
        try retrying("write") { Glibc.write(fd, buffer.baseAddress, buffer.count) }
    }

    package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(SystemError) -> Int {
        try retrying("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// Sends on a connected socket without blocking, with `MSG_NOSIGNAL`: a peer that is gone
    /// is `EPIPE`, never a `SIGPIPE` that kills the process. Returns how many bytes the kernel
    /// took, or nil when its buffer is full (would block).
    package static func send(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(SystemError) -> Int? {
        try wouldBlockAsNil { () throws(SystemError) -> Int in
            try retrying("send") { Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
        }
    }

    /// Receives from a connected socket without blocking: the byte count (0 at the end of the
    /// stream), or nil when nothing is there yet (would block).
    package static func receive(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(SystemError) -> Int? {
        try wouldBlockAsNil { () throws(SystemError) -> Int in
            try retrying("recv") { Glibc.recv(fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT)) }
        }
    }

    /// `EAGAIN` / `EWOULDBLOCK` as nil; every other failure is thrown.
    @inline(__always)
    package static func wouldBlockAsNil<T>(_ body: () throws(SystemError) -> T) throws(SystemError) -> T? {
        do throws(SystemError) {
            return try body()
        } catch where error.errno == EAGAIN || error.errno == EWOULDBLOCK {
            return nil
        }
    }

    /// Turns Nagle's algorithm off, so small records (pings, acks) leave at once.
    package static func setNoDelay(_ fd: Int32) throws(SystemError) {
        try setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
    }

    package static func getpeername(_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>, _ length: UnsafeMutablePointer<socklen_t>) throws(SystemError) {
        _ = try retrying("getpeername") { Glibc.getpeername(fd, address, length) }
    }

    package static func fsync(_ fd: Int32) throws(SystemError) {
        _ = try retrying("fsync") { Glibc.fsync(fd) }
    }

    package static func rename(_ from: String, _ to: String) throws(SystemError) {
        _ = try retrying("rename") { Glibc.rename(from, to) }
    }

    package static func mkdir(_ path: String, _ mode: mode_t) throws(SystemError) {
        _ = try retrying("mkdir") { Glibc.mkdir(path, mode) }
    }

    package static func unlink(_ path: String) {
        _ = Glibc.unlink(path)
    }

    /// The process's descriptor limit (`RLIMIT_NOFILE`): soft and hard.
    package static func descriptorLimit() throws(SystemError) -> (soft: UInt64, hard: UInt64) {
        var limit = rlimit()
        _ = try retrying("getrlimit") { getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) }
        return (UInt64(limit.rlim_cur), UInt64(limit.rlim_max))
    }

    /// Sets the soft descriptor limit (the hard one stays).
    package static func setSoftDescriptorLimit(_ soft: UInt64) throws(SystemError) {
        var limit = rlimit()
        _ = try retrying("getrlimit") { getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) }
        limit.rlim_cur = rlim_t(soft)
        _ = try retrying("setrlimit") { setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) }
    }

    /// Sleeps the calling thread (a blocking call's own thread, never a cooperative one) for
    /// `milliseconds`; a signal may end it early.
    package static func sleep(milliseconds: Int32) {
        var request = timespec(tv_sec: Int(milliseconds / 1000), tv_nsec: Int(milliseconds % 1000) * 1_000_000)
        _ = nanosleep(&request, nil)
    }

    /// Nanoseconds on the monotonic clock (the vDSO: no system call).
    package static func monotonicNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    /// The calling thread, to be told apart from others with ``isCurrentThread(_:)``.
    package static func currentThread() -> pthread_t { pthread_self() }

    /// Whether `thread` (from ``currentThread()``) is the calling thread.
    package static func isCurrentThread(_ thread: pthread_t) -> Bool { pthread_equal(thread, pthread_self()) != 0 }

    /// Names the calling thread as `top -H`, `perf` and debuggers show it (Linux keeps 15 bytes).
    /// Foundation's `Thread.name` does not reach the system's thread name on Linux: a thread
    /// that wants one names itself when it starts.
    package static func nameCurrentThread(_ name: String) {
        let fd = Glibc.open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array(name.utf8.prefix(15))
        _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }

    package static func gethostname() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard Glibc.gethostname(&buffer, buffer.count - 1) == 0 else { return "localhost" }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
    }
}
