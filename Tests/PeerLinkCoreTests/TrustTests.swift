import Foundation
import PeerLinkCore
import Testing

@Suite("Known peers: trust on first use")
struct KnownPeersTests {
    let alice = Identity.generate().fingerprint
    let impostor = Identity.generate().fingerprint
    let bob = Identity.generate().fingerprint

    @Test func firstMeetingIsNewThenKnown() {
        var peers = KnownPeers()
        #expect(peers.meet(PeerID(fingerprint: alice, displayName: "Alice"), at: 1) == .new)
        #expect(peers.meet(PeerID(fingerprint: alice, displayName: "Alice"), at: 2) == .known)
        #expect(peers.entries[alice]?.firstSeen == 1)
    }

    @Test func aKnownNameWithAnotherKeyIsFlagged() {
        var peers = KnownPeers()
        _ = peers.meet(PeerID(fingerprint: alice, displayName: "Alice"), at: 1)
        _ = peers.meet(PeerID(fingerprint: bob, displayName: "Bob"), at: 1)
        #expect(peers.meet(PeerID(fingerprint: impostor, displayName: "Alice"), at: 2) == .nameConflict(knownFingerprints: [alice]))
        // Once met, the second key is known too (the user was warned once).
        #expect(peers.meet(PeerID(fingerprint: impostor, displayName: "Alice"), at: 3) == .known)
    }

    @Test func aKnownKeyWithANewNameIsStillKnown() {
        var peers = KnownPeers()
        _ = peers.meet(PeerID(fingerprint: alice, displayName: "Alice"), at: 1)
        #expect(peers.meet(PeerID(fingerprint: alice, displayName: "Alice's laptop"), at: 2) == .known)
        #expect(peers.entries[alice]?.displayName == "Alice's laptop")
    }

    @Test func fileRoundTripAndCorruption() throws {
        var peers = KnownPeers()
        _ = peers.meet(PeerID(fingerprint: alice, displayName: "Alice"), at: 1)
        _ = peers.meet(PeerID(fingerprint: bob, displayName: "Bob"), at: 2)
        #expect(KnownPeers(fileContents: peers.fileContents()) == peers)
        #expect(KnownPeers(fileContents: Data("garbage".utf8)) == nil)
        #expect(KnownPeers(fileContents: Data()) == nil)
    }

    @Test("throwaway keys cannot grow the list past its cap: the least recently seen go first, trusted peers stay")
    func capped() throws {
        let day = KnownPeers.lastSeenResolution
        var peers = KnownPeers(entries: [
            KnownPeers.Entry(fingerprint: alice, displayName: "Alice", firstSeen: 0, trusted: true),
            KnownPeers.Entry(fingerprint: bob, displayName: "Bob", firstSeen: 0),
        ])
        // Bob was seen again on day 2; throwaway keys arrive on days 0 to 4.
        #expect(peers.record(PeerID(fingerprint: bob, displayName: "Bob"), at: 2 * day, limit: 10).changed)
        var forgotten: [Fingerprint] = []
        var throwaway: [Fingerprint] = []
        for index in 0..<1000 {
            let key = Identity.generate().fingerprint
            throwaway.append(key)
            let meeting = peers.record(PeerID(fingerprint: key, displayName: "x\(index)"), at: Double(index / 200) * day + 1, limit: 10)
            #expect(meeting.verdict == .new && meeting.changed)
            forgotten += meeting.forgotten
            #expect(peers.entries.count <= 10)
        }
        #expect(peers.entries.count == 10)
        #expect(peers.isKnown(alice), "a trusted peer was forgotten")
        #expect(!peers.isKnown(bob), "Bob was seen before the last throwaway keys")
        #expect(forgotten.count == 992 && forgotten.contains(bob))
        // The newest are kept.
        #expect(peers.isKnown(throwaway.last!))
        // Trusted peers are never forgotten, even beyond the cap.
        var trustedOnly = KnownPeers(entries: (0..<5).map {
            KnownPeers.Entry(fingerprint: Identity.generate().fingerprint, displayName: "t\($0)", firstSeen: 0, trusted: true)
        })
        let meeting = trustedOnly.record(PeerID(fingerprint: bob, displayName: "Bob"), at: 1, limit: 3)
        #expect(meeting.forgotten.isEmpty && trustedOnly.entries.count == 6)
    }

    @Test("meeting a known peer again the same day changes nothing to save")
    func unchangedIsNotSaved() {
        let day = KnownPeers.lastSeenResolution
        var peers = KnownPeers()
        #expect(peers.record(PeerID(fingerprint: alice, displayName: "Alice"), at: 10 * day + 5, limit: 10).changed)
        let saved = peers.fileContents()
        for second in stride(from: 10.0 * day + 6, to: 11 * day, by: 3600) {
            #expect(!peers.record(PeerID(fingerprint: alice, displayName: "Alice"), at: second, limit: 10).changed)
        }
        #expect(peers.fileContents() == saved)
        #expect(peers.record(PeerID(fingerprint: alice, displayName: "Alice"), at: 11 * day + 1, limit: 10).changed)
        #expect(peers.record(PeerID(fingerprint: alice, displayName: "Alice 2"), at: 11 * day + 2, limit: 10).changed)
    }

    @Test("a file written before last-seen times and trust marks still reads; trust marks round-trip")
    func olderFiles() throws {
        let text = """
            {"format": "peerlink-known-peers", "version": 1, "peers": [
              {"fingerprint": "\(alice)", "displayName": "Alice", "firstSeen": 100},
              {"fingerprint": "\(bob)", "displayName": "Bob", "firstSeen": 200, "lastSeen": 300, "trusted": true}]}
            """
        let peers = try #require(KnownPeers(fileContents: Data(text.utf8)))
        #expect(peers.entries[alice]?.lastSeen == 100 && peers.entries[alice]?.trusted == false)
        #expect(peers.entries[bob]?.lastSeen == 300 && peers.entries[bob]?.trusted == true)
        #expect(KnownPeers(fileContents: peers.fileContents()) == peers)
        let written = String(decoding: peers.fileContents(), as: UTF8.self)
        #expect(written.components(separatedBy: "trusted").count == 2, "only the trusted entry says so")
    }
}

@Suite("Verification code")
struct VerificationCodeTests {
    @Test func sixDigitsInTwoGroups() {
        let code = VerificationCode.digits(handshakeHash: [UInt8](repeating: 7, count: 32))
        #expect(code.count == 7)
        #expect(code.filter(\.isNumber).count == 6)
        #expect(code[code.index(code.startIndex, offsetBy: 3)] == " ")
    }

    @Test func sameHashSameCodeDifferentHashDifferentCode() {
        let a = VerificationCode.digits(handshakeHash: [UInt8](0..<32))
        #expect(a == VerificationCode.digits(handshakeHash: [UInt8](0..<32)))
        let different = (0..<50).map { i in VerificationCode.digits(handshakeHash: [UInt8](repeating: UInt8(i), count: 32)) }
        #expect(Set(different).count > 45)
    }
}
