#if canImport(Glibc)
import Glibc
#endif
import Foundation
import PeerLinkCore

/// Where identities live on disk, and how they are read and created.
///
/// The default is `$XDG_CONFIG_HOME/peerlink/identity.json` (`~/.config/peerlink/identity.json`
/// when `XDG_CONFIG_HOME` is unset). A missing file is created with a new identity, mode 0600, in a
/// directory of mode 0700. A file that exists but cannot be read or is not an identity is an error
/// naming the path: an identity is never silently replaced.
public enum IdentityStore {
    /// The default identity file for this user.
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let config = environment["XDG_CONFIG_HOME"], config.hasPrefix("/") {
            return config + "/peerlink/identity.json"
        }
        let home = environment["HOME"] ?? NSHomeDirectory()
        return home + "/.config/peerlink/identity.json"
    }

    /// What loading found, besides the identity.
    public struct Loaded: Sendable {
        public var identity: Identity
        public var path: String
        public var created: Bool
        /// Set when the file can be read by other users; tools print it as a warning.
        public var warning: String?
    }

    /// The identity files this process claimed, open (the claim lasts while they are).
    private static let claimed = Locked<[String: Int32]>([:])

    /// Claims the identity file at `path` for this process: an advisory lock held until the
    /// process ends. Returns a warning when another process holds it already (a second
    /// `peerlink` started with the same identity): peers cannot tell two sessions of one
    /// identity apart, and take them for one peer whose runs keep replacing each other. Nil when
    /// the claim holds, was made before, or the file cannot be locked (nothing to say then).
    public static func claim(_ path: String) -> String? {
        claimed.withLock { claimed -> String? in
            guard claimed[path] == nil, let fd = try? Sys.open(path, O_RDONLY, 0) else { return nil }
            guard let locked = try? Sys.tryLockExclusive(fd) else {
                Sys.close(fd)
                return nil
            }
            guard locked else {
                Sys.close(fd)
                return "another process on this machine uses the identity in \(path): its peers cannot tell the two apart and take them for one peer restarting again and again; give one of them an identity of its own (--identity FILE)"
            }
            claimed[path] = fd
            return nil
        }
    }

    /// An exclusive lock on `fd`'s file, as a claim takes it (tests stand in for another
    /// process with it): false when it is held elsewhere or cannot be taken.
    public static func tryLock(_ fd: Int32) -> Bool {
        (try? Sys.tryLockExclusive(fd)) ?? false
    }

    /// Ends this process's claim on `path` (tests; a tool keeps its claim until it exits).
    public static func release(_ path: String) {
        claimed.withLock { claimed in
            if let fd = claimed.removeValue(forKey: path) { Sys.close(fd) }
        }
    }

    /// Reads the identity at `path`, creating a new one if no file exists there.
    public static func loadOrCreate(at path: String) throws(PeerLinkError) -> Loaded {
        do {
            let info = try Sys.fileStatus(path)
            let identity = try read(path)
            var warning: String?
            if info.st_mode & 0o077 != 0 {
                warning = "identity file \(path) can be read by other users (mode \(String(info.st_mode & 0o777, radix: 8))): run chmod 600 \(path)"
            }
            return Loaded(identity: identity, path: path, created: false, warning: warning)
        } catch let error as SystemError where error.errno == ENOENT {
            let identity = Identity.generate()
            try create(identity, at: path)
            return Loaded(identity: identity, path: path, created: true, warning: nil)
        } catch let error as SystemError {
            throw PeerLinkError(.unavailable, "cannot read identity file \(path): \(error.description); check its permissions or pass --identity PATH")
        } catch let error as PeerLinkError {
            throw error
        } catch {
            throw PeerLinkError(.unknown, "cannot read identity file \(path): \(error)")
        }
    }

    static func read(_ path: String) throws(PeerLinkError) -> Identity {
        let data: Data
        do {
            data = try readFile(path)
        } catch {
            throw PeerLinkError(.unavailable, "cannot read identity file \(path): \(error); check its permissions or pass --identity PATH")
        }
        do {
            return try Identity(fileContents: data)
        } catch {
            throw PeerLinkError(.invalidParameter, "identity file \(path) is corrupt: \(error.description). It was left untouched; move it away to create a new identity, or pass --identity PATH")
        }
    }

    /// Writes a new identity file atomically (a temporary file, fsync, rename), mode 0600.
    public static func create(_ identity: Identity, at path: String) throws(PeerLinkError) {
        let directory = (path as NSString).deletingLastPathComponent
        do {
            try makeDirectories(directory.isEmpty ? "." : directory)
            let temporary = path + ".tmp-\(getpid())"
            let fd = try Sys.open(temporary, O_WRONLY | O_CREAT | O_EXCL, 0o600)
            do {
                let contents = identity.fileContents()
                try contents.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) throws in
                    var offset = 0
                    while offset < buffer.count {
                        offset += try Sys.write(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]))
                    }
                }
                try Sys.fsync(fd)
                Sys.close(fd)
            } catch {
                Sys.close(fd)
                Sys.unlink(temporary)
                throw error
            }
            // Never overwrite: link-or-fail semantics would be ideal; a rename onto an existing
            // file only happens if another process created it in the meantime.
            if (try? Sys.fileStatus(path)) != nil {
                Sys.unlink(temporary)
                return
            }
            try Sys.rename(temporary, path)
        } catch {
            throw PeerLinkError(.unavailable, "cannot create identity file \(path): \(error); choose a writable place with --identity PATH")
        }
    }

    static func makeDirectories(_ directory: String) throws(SystemError) {
        if (try? Sys.fileStatus(directory)) != nil { return }
        let parent = (directory as NSString).deletingLastPathComponent
        if !parent.isEmpty && parent != directory { try makeDirectories(parent) }
        do {
            try Sys.mkdir(directory, 0o700)
        } catch {
            if error.errno != EEXIST { throw error }
        }
    }

    static func readFile(_ path: String) throws -> Data {
        let fd = try Sys.open(path, O_RDONLY, 0)
        defer { Sys.close(fd) }
        var data = Data()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = try chunk.withUnsafeMutableBytes { buffer in try Sys.read(fd, buffer) }
            if count == 0 { break }
            data.append(contentsOf: chunk[..<count])
            if data.count > 1 << 20 { break }  // no identity file is this large
        }
        return data
    }
}
