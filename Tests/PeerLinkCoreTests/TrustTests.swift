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
