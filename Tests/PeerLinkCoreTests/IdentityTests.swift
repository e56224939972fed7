import Crypto
import Foundation
import PeerLinkCore
import Testing

/// Known values, computed independently once with Python:
/// `base64.b32encode(hashlib.sha256(key).digest()[:10]).decode().lower()`.
enum KnownKeys {
    static let zeroToThirtyOne: [UInt8] = Array(0..<32)
    static let zeroToThirtyOneFingerprint = "mmg42klgyqzwneis"
    static let allOnesFingerprint = "v6lbg5qpojrv7pnu"  // 32 × 0xff
    static let allZerosFingerprint = "mzuhvlpymk6xo3ep"  // 32 × 0x00

    /// RFC 7748 §6.1: Alice's X25519 private key, and the public key it gives.
    static let alicePrivateBase64 = "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo="
    static let alicePublicBase64 = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="
    static let alicePublicHex = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    static let aliceFingerprint = "gagjzfqdxevewopn"
    /// RFC 7748 §6.1: Bob's public key.
    static let bobPublicBase64 = "3p7bfXt9wbTTW2HC7OQ1Nz+DQ8hbeGdNrfx+FG+IK08="
}

// MARK: - Fingerprint

@Suite("Fingerprint: 80 bits of SHA-256 in lowercase base32")
struct FingerprintTests {
    static let alphabet = Set("abcdefghijklmnopqrstuvwxyz234567")

    @Test(arguments: [
        (KnownKeys.zeroToThirtyOne, KnownKeys.zeroToThirtyOneFingerprint),
        ([UInt8](repeating: 0xFF, count: 32), KnownKeys.allOnesFingerprint),
        ([UInt8](repeating: 0x00, count: 32), KnownKeys.allZerosFingerprint),
    ])
    func knownValues(_ key: [UInt8], _ expected: String) {
        let fingerprint = Fingerprint(publicKey: key)
        #expect(fingerprint.value == expected)
        #expect(fingerprint.description == expected)
        #expect(Fingerprint(publicKey: Data(key)) == fingerprint)
        #expect(fingerprint.value.count == Fingerprint.length)
        #expect(fingerprint.value.allSatisfy(Self.alphabet.contains))
    }

    /// Independent of the pinned strings: the first 80 bits of Crypto's SHA-256, decoded back from base32.
    @Test func isTheFirstTenBytesOfSHA256() {
        for seed in 0..<20 {
            let key = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ seed &* 13) }
            let fingerprint = Fingerprint(publicKey: key)
            #expect(fingerprint.value.count == 16)
            #expect(Self.base32Decode(fingerprint.value) == Array(SHA256.hash(data: key).prefix(10)))
        }
    }

    @Test func deterministicAndDistinct() {
        #expect(Fingerprint(publicKey: KnownKeys.zeroToThirtyOne) == Fingerprint(publicKey: KnownKeys.zeroToThirtyOne))
        var other = KnownKeys.zeroToThirtyOne
        other[31] ^= 1
        #expect(Fingerprint(publicKey: other) != Fingerprint(publicKey: KnownKeys.zeroToThirtyOne))
    }

    /// Held as integers, a fingerprint still orders, compares and hashes as its text does (the
    /// order decides ties between peers on both ends of a link, whatever build each runs).
    @Test func ordersAndComparesAsItsText() {
        var generator = SystemRandomNumberGenerator()
        let characters = Array("abcdefghijklmnopqrstuvwxyz234567")
        var texts = ["2222222222222222", "7777777777777777", "aaaaaaaaaaaaaaaa", "zzzzzzzzzzzzzzzz", "zzzzzzzzzzzz2222", "aaaaaaaaaaaa7777"]
        for _ in 0..<300 {
            // Many share a prefix, so later digits decide too.
            let prefix = String((0..<Int.random(in: 0...15, using: &generator)).map { characters[$0 % 2] })
            texts.append(prefix + String((prefix.count..<16).map { _ in characters.randomElement(using: &generator)! }))
        }
        let fingerprints = texts.map { Fingerprint($0)! }
        for (fingerprint, text) in zip(fingerprints, texts) {
            #expect(fingerprint.value == text)
            #expect(fingerprint.description == text)
        }
        for (a, textA) in zip(fingerprints, texts) {
            for (b, textB) in zip(fingerprints.prefix(40), texts.prefix(40)) {
                #expect((a < b) == (textA < textB), "\(textA) < \(textB)")
                #expect((a == b) == (textA == textB))
                if a == b { #expect(a.hashValue == b.hashValue) }
            }
        }
        #expect(Set(fingerprints).count == Set(texts).count)
    }

    @Test func grouped() {
        let fingerprint = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)
        #expect(fingerprint.grouped == "mmg4-2klg-yqzw-neis")
        #expect(Fingerprint(fingerprint.grouped) == fingerprint)
    }

    @Test(arguments: [
        "mmg42klgyqzwneis",
        "MMG42KLGYQZWNEIS",
        "Mmg42KlgYqzwNeis",
        "mmg4-2klg-yqzw-neis",
        "MMG4-2KLG-YQZW-NEIS",
        "mmg4 2klg yqzw neis",
        " mmg42klgyqzwneis ",
    ])
    func parses(_ text: String) throws {
        let parsed = try #require(Fingerprint(text))
        #expect(parsed.value == KnownKeys.zeroToThirtyOneFingerprint)
        #expect(parsed == Fingerprint(publicKey: KnownKeys.zeroToThirtyOne))
    }

    @Test func parseRoundTrip() {
        for seed in 0..<20 {
            let fingerprint = Fingerprint(publicKey: [UInt8](repeating: UInt8(seed), count: 32))
            #expect(Fingerprint(fingerprint.value) == fingerprint)
            #expect(Fingerprint(fingerprint.grouped) == fingerprint)
            #expect(Fingerprint(fingerprint.value.uppercased()) == fingerprint)
        }
    }

    @Test(arguments: [
        "",
        "mmg42klgyqzwnei",  // 15
        "mmg42klgyqzwneiss",  // 17
        "mmg42klgyqzwneis-a",
        "mmg42klgyqzwnei0",  // 0, 1, 8, 9 are not base32
        "mmg42klgyqzwnei1",
        "mmg42klgyqzwnei8",
        "mmg42klgyqzwnei9",
        "mmg42klgyqzwnei=",
        "mmg42klgyqzwnei_",
        "mmg42klgyqzwneié",
        "mmg42klgyqzwne\u{0}s",
        "mmg42klgyqzwneis\n",
        "----------------",
        "0000000000000000",
    ])
    func rejects(_ text: String) {
        #expect(Fingerprint(text) == nil)
    }

    @Test func codableAsAString() throws {
        let fingerprint = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)
        let json = try JSONEncoder().encode([fingerprint])
        #expect(String(decoding: json, as: UTF8.self) == "[\"mmg42klgyqzwneis\"]")
        #expect(try JSONDecoder().decode([Fingerprint].self, from: json) == [fingerprint])
        #expect(try JSONDecoder().decode([Fingerprint].self, from: Data("[\"MMG4-2KLG-YQZW-NEIS\"]".utf8)) == [fingerprint])
        #expect(throws: Swift.DecodingError.self) {
            try JSONDecoder().decode([Fingerprint].self, from: Data("[\"not a fingerprint\"]".utf8))
        }
    }

    @Test func ordersByValue() {
        let a = Fingerprint("aaaaaaaaaaaaaaaa")!
        let b = Fingerprint("baaaaaaaaaaaaaaa")!
        #expect(a < b)
        #expect([b, a].sorted() == [a, b])
    }

    /// RFC 4648 base32 decoding (lowercase, no padding), for checking the encoder.
    static func base32Decode(_ text: String) -> [UInt8] {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")
        var buffer = 0
        var bits = 0
        var output: [UInt8] = []
        for character in text {
            buffer = (buffer << 5) | alphabet.firstIndex(of: character)!
            bits += 5
            if bits >= 8 {
                output.append(UInt8((buffer >> (bits - 8)) & 0xFF))
                bits -= 8
            }
        }
        return output
    }
}

// MARK: - Identity

/// The bytes of a JSON object with these members.
private func identityFile(_ fields: String) -> Data { Data("{\(fields)}".utf8) }

@Suite("Identity: a Curve25519 key pair and its file")
struct IdentityTests {
    static var aliceFile: Data {
        identityFile(
            #""format": "peerlink-identity", "version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)", "publicKey": "\#(KnownKeys.alicePublicBase64)""#)
    }

    @Test func generatedIdentitySurvivesItsFile() throws {
        let identity = Identity.generate()
        #expect(identity.publicKey.count == 32)
        let data = identity.fileContents()
        let read = try Identity(fileContents: data)
        #expect(read.publicKey == identity.publicKey)
        #expect(read.fingerprint == identity.fingerprint)
        #expect(read.privateKey.rawRepresentation == identity.privateKey.rawRepresentation)
    }

    @Test func fileFormat() throws {
        let identity = Identity.generate()
        let data = identity.fileContents()
        #expect(data.last == 0x0A)
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(Set(object.keys) == ["format", "version", "privateKey", "publicKey"])
        #expect(object["format"] as? String == "peerlink-identity")
        #expect(object["version"] as? Int == 1)
        let privateKey = try #require(object["privateKey"] as? String)
        #expect(Data(base64Encoded: privateKey) == identity.privateKey.rawRepresentation)
        let publicKey = try #require(object["publicKey"] as? String)
        #expect(Data(base64Encoded: publicKey) == Data(identity.publicKey))
    }

    @Test func knownKey() throws {
        let raw = try #require(Data(base64Encoded: KnownKeys.alicePrivateBase64))
        let identity = Identity(privateKey: try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: raw))
        #expect(identity.publicKey.map { String(format: "%02x", $0) }.joined() == KnownKeys.alicePublicHex)
        #expect(identity.fingerprint.value == KnownKeys.aliceFingerprint)
        #expect(identity.fingerprint == Fingerprint(publicKey: identity.publicKey))

        let fromFile = try Identity(fileContents: Self.aliceFile)
        #expect(fromFile.fingerprint.value == KnownKeys.aliceFingerprint)
        #expect(try Identity(fileContents: fromFile.fileContents()).fingerprint.value == KnownKeys.aliceFingerprint)
    }

    /// The public key is informative: a file without it is still read.
    @Test func publicKeyFieldIsOptional() throws {
        let data = identityFile(
            #""format": "peerlink-identity", "version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)""#)
        #expect(try Identity(fileContents: data).fingerprint.value == KnownKeys.aliceFingerprint)
    }

    @Test(arguments: [
        (Data(), IdentityFileProblem.notAnIdentityFile),
        (Data("not json".utf8), .notAnIdentityFile),
        (Data("{}".utf8), .notAnIdentityFile),
        (Data("[]".utf8), .notAnIdentityFile),
        (Data("null".utf8), .notAnIdentityFile),
        (Data([0xFF, 0xFE, 0x00]), .notAnIdentityFile),
        (identityFile(#""format": "ssh-key", "version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)""#), .notAnIdentityFile),
        (identityFile(#""version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)""#), .notAnIdentityFile),
        (identityFile(#""format": "peerlink-identity", "version": "1", "privateKey": "\#(KnownKeys.alicePrivateBase64)""#), .notAnIdentityFile),
        (identityFile(#""format": "peerlink-identity", "version": 2, "privateKey": "\#(KnownKeys.alicePrivateBase64)""#), .unsupportedVersion(2)),
        (identityFile(#""format": "peerlink-identity", "version": 0, "privateKey": "\#(KnownKeys.alicePrivateBase64)""#), .unsupportedVersion(0)),
        // A later version may lay the file out differently; it is still recognised as ours.
        (identityFile(#""format": "peerlink-identity", "version": 2, "keys": {"x25519": "..."}"#), .unsupportedVersion(2)),
        (identityFile(#""format": "peerlink-identity", "version": 1"#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": 42"#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": "\#(Data(count: 31).base64EncodedString())""#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": "\#(Data(count: 33).base64EncodedString())""#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": """#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": "not base64!""#), .badPrivateKey),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)", "publicKey": "\#(KnownKeys.bobPublicBase64)""#), .publicKeyMismatch),
        (identityFile(#""format": "peerlink-identity", "version": 1, "privateKey": "\#(KnownKeys.alicePrivateBase64)", "publicKey": "garbage""#), .publicKeyMismatch),
    ] as [(Data, IdentityFileProblem)])
    func rejectsCorruptFiles(_ data: Data, _ problem: IdentityFileProblem) {
        #expect(throws: problem) { try Identity(fileContents: data) }
    }

    @Test(arguments: [
        (IdentityFileProblem.notAnIdentityFile, ["peerlink-identity"]),
        (.unsupportedVersion(2), ["version 2", "version 1"]),
        (.badPrivateKey, ["32 bytes", "base64"]),
        (.publicKeyMismatch, ["public key"]),
    ] as [(IdentityFileProblem, [String])])
    func problemDescriptions(_ problem: IdentityFileProblem, _ fragments: [String]) {
        for fragment in fragments { #expect(problem.description.contains(fragment)) }
    }

    @Test func generatedIdentitiesDiffer() {
        let a = Identity.generate()
        let b = Identity.generate()
        #expect(a.publicKey != b.publicKey)
        #expect(a.fingerprint != b.fingerprint)
        #expect(a.privateKey.rawRepresentation != b.privateKey.rawRepresentation)
    }
}

// MARK: - PeerID

@Suite("PeerID: a peer is its fingerprint, the name is a label")
struct PeerIDTests {
    static let one = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)
    static let two = Fingerprint(publicKey: [UInt8](repeating: 0xFF, count: 32))

    @Test func sameFingerprintDifferentNamesAreEqual() {
        let a = PeerID(fingerprint: Self.one, displayName: "Ana")
        let b = PeerID(fingerprint: Self.one, displayName: "Ana's laptop")
        #expect(a == b)
        #expect(a.hashValue == b.hashValue)
        #expect(Set([a, b]).count == 1)
    }

    @Test func sameNameDifferentFingerprintsAreDifferentPeers() {
        let a = PeerID(fingerprint: Self.one, displayName: "Ana")
        let b = PeerID(fingerprint: Self.two, displayName: "Ana")
        #expect(a != b)
        #expect(Set([a, b]).count == 2)
    }

    @Test func fromIdentity() throws {
        let identity = Identity.generate()
        let peer = PeerID(identity: identity, displayName: try DisplayName("Zoë"))
        #expect(peer.fingerprint == identity.fingerprint)
        #expect(peer.displayName == "Zoë")
        #expect(peer.description == "Zoë [\(identity.fingerprint.value)]")
    }
}
