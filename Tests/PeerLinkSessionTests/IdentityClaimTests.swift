import Foundation
import PeerLinkCore
import PeerLinkPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Two `peerlink` processes with one identity look like one peer to everybody else, whose runs
/// keep replacing each other: the second one started is warned.
@Suite("Identity files: one process per identity")
struct IdentityClaimTests {
    static func temporaryIdentity() throws -> String {
        let directory = NSTemporaryDirectory() + "peerlink-claim-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = directory + "/identity.json"
        _ = try IdentityStore.loadOrCreate(at: path)
        return path
    }

    /// Locks `path` as another process would (an open file description of its own).
    static func lockElsewhere(_ path: String) -> Int32? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        guard IdentityStore.tryLock(fd) else {
            close(fd)
            return nil
        }
        return fd
    }

    @Test("the first claim holds the file until released; a claim while another holds it is a warning naming the file and what to do")
    func aSecondUserOfAnIdentityIsWarned() throws {
        let path = try Self.temporaryIdentity()
        defer { try? FileManager.default.removeItem(atPath: (path as NSString).deletingLastPathComponent) }

        #expect(IdentityStore.claim(path) == nil)
        #expect(IdentityStore.claim(path) == nil, "claimed again by the same process: nothing to say")
        #expect(Self.lockElsewhere(path) == nil, "the claim holds the file")
        IdentityStore.release(path)

        let other = try #require(Self.lockElsewhere(path), "released: free again")
        let warning = try #require(IdentityStore.claim(path))
        #expect(warning.contains(path) && warning.contains("--identity"), "\(warning)")
        close(other)
        #expect(IdentityStore.claim(path) == nil, "free again: claimed")
        IdentityStore.release(path)
    }

    @Test("a file that cannot be opened is no claim and no warning")
    func aMissingFileSaysNothing() {
        #expect(IdentityStore.claim("/nonexistent/peerlink/identity.json") == nil)
    }
}
