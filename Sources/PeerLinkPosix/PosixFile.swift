#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// An open regular file: the few operations file transfers need, each a ``SystemError``
/// naming the call when it fails. Not thread-safe; one owner at a time. Closes on deinit.
public final class PosixFile: @unchecked Sendable {
    public let path: String
    private var fd: Int32

    private init(path: String, fd: Int32) {
        self.path = path
        self.fd = fd
    }

    deinit {
        if fd >= 0 { Sys.close(fd) }
    }

    /// Opens an existing file for reading.
    public static func openForReading(_ path: String) throws(SystemError) -> PosixFile {
        let fd = try Sys.open(path, O_RDONLY, 0)
        let file = PosixFile(path: path, fd: fd)
        var info = Glibc.stat()
        _ = try Sys.retrying("fstat") { fstat(fd, &info) }
        guard info.st_mode & S_IFMT == S_IFREG else { throw SystemError("open", errno: info.st_mode & S_IFMT == S_IFDIR ? EISDIR : EINVAL) }
        return file
    }

    /// Opens (creating it with `mode` when missing) a file for reading and writing, keeping
    /// what it holds.
    public static func openForUpdate(_ path: String, mode: mode_t = 0o600) throws(SystemError) -> PosixFile {
        PosixFile(path: path, fd: try Sys.open(path, O_RDWR | O_CREAT, mode))
    }

    /// Reads up to `count` bytes at `offset`; fewer only at the end of the file.
    public func read(at offset: UInt64, count: Int) throws(SystemError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let fd = self.fd
            let got = try Sys.retrying("pread") {
                bytes.withUnsafeMutableBytes { buffer in
                    pread(fd, buffer.baseAddress! + done, count - done, off_t(offset) + off_t(done))
                }
            }
            if got == 0 { break }
            done += got
        }
        bytes.removeLast(count - done)
        return bytes
    }

    /// Writes all of `bytes` at `offset`.
    public func write(_ bytes: [UInt8], at offset: UInt64) throws(SystemError) {
        var done = 0
        while done < bytes.count {
            let fd = self.fd
            done += try Sys.retrying("pwrite") {
                bytes.withUnsafeBytes { buffer in
                    pwrite(fd, buffer.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done))
                }
            }
        }
    }

    /// The file's length in bytes.
    public func length() throws(SystemError) -> UInt64 {
        var info = Glibc.stat()
        _ = try Sys.retrying("fstat") { fstat(fd, &info) }
        return UInt64(info.st_size)
    }

    /// Cuts (or extends with zeros) the file to `length` bytes.
    public func truncate(to length: UInt64) throws(SystemError) {
        _ = try Sys.retrying("ftruncate") { ftruncate(fd, off_t(length)) }
    }

    /// Waits until what was written is on the storage device.
    public func sync() throws(SystemError) {
        try Sys.fsync(fd)
    }

    public func close() {
        if fd >= 0 { Sys.close(fd) }
        fd = -1
    }

    // MARK: - Paths

    /// Moves `from` to `to` (same directory) atomically — the name appears with the whole
    /// file or not at all — and never replaces an existing `to`: `link(2)`, which fails with
    /// `EEXIST` when `to` exists, then `unlink(2)` of `from`. On a file system without hard
    /// links (FAT) it checks that `to` is free, then `rename(2)`s.
    public static func moveNoReplace(_ from: String, to: String) throws(SystemError) {
        if Glibc.link(from, to) == 0 {
            Sys.unlink(from)
            return
        }
        let code = Glibc.errno
        guard code == EPERM || code == EOPNOTSUPP else { throw SystemError("link", errno: code) }
        guard !exists(to) else { throw SystemError("rename", errno: EEXIST) }
        try Sys.rename(from, to)
    }

    /// Removes a file; a missing file is not an error.
    public static func remove(_ path: String) {
        Sys.unlink(path)
    }

    /// The length of the regular file at `path`; nil when there is none.
    public static func length(of path: String) -> UInt64? {
        guard let info = try? Sys.fileStatus(path), info.st_mode & S_IFMT == S_IFREG else { return nil }
        return UInt64(info.st_size)
    }

    /// The size of the file system that holds `path`, the bytes an unprivileged process may
    /// still write there (`statvfs`: blocks, and free blocks for non-root, times the fragment
    /// size), and its device number (`st_dev`, one per mounted file system); nil when it cannot be asked, is mounted read-only, or
    /// reports no size at all (`/proc`, `/sys`): writing there says what is wrong.
    public static func space(at path: String) -> (available: UInt64, total: UInt64, fileSystem: UInt64)? {
        guard let info = try? Sys.fileSystemStatus(path), info.f_blocks > 0, info.f_flag & UInt(ST_RDONLY) == 0,
            let device = try? Sys.fileStatus(path).st_dev
        else { return nil }
        func bytes(_ blocks: UInt64) -> UInt64 {
            let (product, overflow) = blocks.multipliedReportingOverflow(by: UInt64(info.f_frsize))
            return overflow ? .max : product
        }
        return (bytes(UInt64(info.f_bavail)), bytes(UInt64(info.f_blocks)), UInt64(device))
    }

    /// The entries of the directory at `path` whose names `matching` accepts, each with when it
    /// was last modified (nanoseconds since the epoch); nil when the directory cannot be read.
    public static func entries(in path: String, matching: (String) -> Bool) -> [(name: String, modified: Int64)]? {
        var names: [String] = []
        do {
            try Sys.forEachDirectoryEntry(path) { name in
                if matching(name) { names.append(name) }
            }
        } catch {
            return nil
        }
        let prefix = path == "/" ? "/" : path + "/"
        return names.compactMap { name in
            guard let info = try? Sys.fileStatus(prefix + name) else { return nil }
            return (name, Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec))
        }
    }

    /// Whether anything (file, directory, link) exists at `path`.
    public static func exists(_ path: String) -> Bool {
        var info = Glibc.stat()
        return lstat(path, &info) == 0
    }

    /// Whether `path` is a directory.
    public static func isDirectory(_ path: String) -> Bool {
        guard let info = try? Sys.fileStatus(path) else { return false }
        return info.st_mode & S_IFMT == S_IFDIR
    }

    /// The whole file at `path`, for small files (records); nil when it cannot be read.
    public static func contents(of path: String, limit: Int = 4096) -> [UInt8]? {
        guard let file = try? openForReading(path) else { return nil }
        return try? file.read(at: 0, count: limit)
    }

    /// Writes `bytes` to `path` (replacing it) and syncs it.
    public static func write(_ bytes: [UInt8], to path: String) throws(SystemError) {
        let file = PosixFile(path: path, fd: try Sys.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600))
        try file.write(bytes, at: 0)
        try file.sync()
        file.close()
    }
}
