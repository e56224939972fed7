import Crypto
import Foundation
import PeerLinkCore
import Testing

// MARK: - Helpers

/// Hex in both directions, strict: anything but pairs of hex digits is a test failure, not a crash.
enum NoiseHex {
    static func decode(_ text: String) throws -> [UInt8] {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { throw NoiseTestFailure("odd-length hex: \(text.prefix(40))") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else {
                throw NoiseTestFailure("not hex: \(text.prefix(40))")
            }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    static func encode(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    private static func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

struct NoiseTestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

enum NoiseKeys {
    static func privateKey(_ hex: String) throws -> Curve25519.KeyAgreement.PrivateKey {
        try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: NoiseHex.decode(hex))
    }

    static func publicKey(_ hex: String) throws -> Curve25519.KeyAgreement.PublicKey {
        try Curve25519.KeyAgreement.PublicKey(rawRepresentation: NoiseHex.decode(hex))
    }

    /// Fixed keys so failures are reproducible.
    static let alice = try! privateKey(String(repeating: "a1", count: 32))
    static let bob = try! privateKey(String(repeating: "b2", count: 32))

    /// Low-order points: the all-zero point (order 4 as a u-coordinate: 0), the point of order 8
    /// from the brief, and u = 1 (order 1).
    static let lowOrderPoints: [[UInt8]] = [
        [UInt8](repeating: 0, count: 32),
        try! NoiseHex.decode("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
        [1] + [UInt8](repeating: 0, count: 31),
    ]
}

/// A completed XX handshake between two fresh parties, with the messages for reuse.
struct NoiseXXRun {
    var initiator: NoiseHandshakeState
    var responder: NoiseHandshakeState
    var messages: [[UInt8]] = []

    static let prologue = Array("PeerLink noise tests".utf8)

    init(payloads: [[UInt8]] = [[], [], []]) throws {
        initiator = NoiseHandshakeState.xx(initiator: true, prologue: Self.prologue, staticKey: NoiseKeys.alice)
        responder = NoiseHandshakeState.xx(initiator: false, prologue: Self.prologue, staticKey: NoiseKeys.bob)
        let message1 = try initiator.writeMessage(payload: payloads[0])
        messages.append(message1)
        _ = try responder.readMessage(message1)
        let message2 = try responder.writeMessage(payload: payloads[1])
        messages.append(message2)
        _ = try initiator.readMessage(message2)
        let message3 = try initiator.writeMessage(payload: payloads[2])
        messages.append(message3)
        _ = try responder.readMessage(message3)
    }

    /// Fresh states positioned before message `index` (0, 1 or 2) of a new run: the reader of
    /// that message, and the message itself.
    static func reader(beforeMessage index: Int, payload: [UInt8] = []) throws -> (reader: NoiseHandshakeState, message: [UInt8]) {
        var initiator = NoiseHandshakeState.xx(initiator: true, prologue: prologue, staticKey: NoiseKeys.alice)
        var responder = NoiseHandshakeState.xx(initiator: false, prologue: prologue, staticKey: NoiseKeys.bob)
        let message1 = try initiator.writeMessage(payload: index == 0 ? payload : [])
        if index == 0 { return (responder, message1) }
        _ = try responder.readMessage(message1)
        let message2 = try responder.writeMessage(payload: index == 1 ? payload : [])
        if index == 1 { return (initiator, message2) }
        _ = try initiator.readMessage(message2)
        let message3 = try initiator.writeMessage(payload: payload)
        return (responder, message3)
    }
}

// MARK: - Test vectors

/// The cacophony vectors for `*_25519_ChaChaPoly_SHA256`, read from disk (never embedded).
enum NoiseTestVectors {
    static let fileName = "noise-vectors-25519-chachapoly-sha256.json"
    static let isCI = ProcessInfo.processInfo.environment["CI"] == "true"

    /// Where the file may be: `$PEERLINK_TESTDATA` (the directory, or the file itself), then the
    /// copy kept next to these tests (`Vectors/`), then `<package root>/../shared/testdata/`.
    static var candidates: [URL] {
        var urls: [URL] = []
        if let configured = ProcessInfo.processInfo.environment["PEERLINK_TESTDATA"], !configured.isEmpty {
            let url = URL(fileURLWithPath: configured)
            urls.append(url.pathExtension == "json" ? url : url.appendingPathComponent(fileName))
        }
        urls.append(
            URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                .appendingPathComponent("Vectors", isDirectory: true).appendingPathComponent(fileName))
        let packageRoot = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent()  // PeerLinkCoreTests
            .deletingLastPathComponent()  // Tests
            .deletingLastPathComponent()  // package root
        urls.append(
            packageRoot.deletingLastPathComponent()
                .appendingPathComponent("shared/testdata", isDirectory: true)
                .appendingPathComponent(fileName)
                .standardizedFileURL
        )
        return urls
    }

    static let url: URL? = candidates.first { FileManager.default.isReadableFile(atPath: $0.path) }

    /// Run the vector tests if the file is there, and also in CI, where its absence is a failure.
    static let shouldRun = url != nil || isCI

    static let skipReason: Comment =
        "\(fileName) not found (looked in: \(candidates.map(\.path).joined(separator: ", "))); set PEERLINK_TESTDATA"

    static func load() throws -> NoiseVectorFile {
        guard let url else {
            throw NoiseTestFailure(
                "Noise test vectors missing: \(fileName) not found in \(candidates.map(\.path).joined(separator: " or ")). "
                    + "Check out the shared test data beside the repository or set PEERLINK_TESTDATA to its directory."
            )
        }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(NoiseVectorFile.self, from: Data(contentsOf: url))
    }

    static let protocolNames = [
        "Noise_NN_25519_ChaChaPoly_SHA256",
        "Noise_KK_25519_ChaChaPoly_SHA256",
        "Noise_IK_25519_ChaChaPoly_SHA256",
        "Noise_XX_25519_ChaChaPoly_SHA256",
        "Noise_XXpsk3_25519_ChaChaPoly_SHA256",
    ]
}

struct NoiseVectorFile: Decodable {
    var source: String
    var vectors: [NoiseVector]
}

struct NoiseVector: Decodable {
    struct Message: Decodable {
        var payload: String
        var ciphertext: String
    }

    var protocolName: String
    var initPrologue: String
    var initEphemeral: String
    var initStatic: String?
    var initRemoteStatic: String?
    var initPsks: [String]?
    var respPrologue: String
    var respEphemeral: String
    var respStatic: String?
    var respRemoteStatic: String?
    var respPsks: [String]?
    var handshakeHash: String
    var messages: [Message]

    func state(initiator: Bool) throws -> NoiseHandshakeState {
        guard let pattern = NoiseHandshakePattern.named(protocolName) else {
            throw NoiseTestFailure("no built-in pattern for \(protocolName)")
        }
        let prologue = initiator ? initPrologue : respPrologue
        let ephemeral = initiator ? initEphemeral : respEphemeral
        let staticKey = initiator ? initStatic : respStatic
        let remoteStatic = initiator ? initRemoteStatic : respRemoteStatic
        let psks = initiator ? initPsks : respPsks
        return try NoiseHandshakeState(
            pattern: pattern,
            initiator: initiator,
            prologue: NoiseHex.decode(prologue),
            staticKey: staticKey.map(NoiseKeys.privateKey),
            ephemeralKey: NoiseKeys.privateKey(ephemeral),
            remoteStaticKey: remoteStatic.map(NoiseKeys.publicKey),
            presharedKeys: (psks ?? []).map(NoiseHex.decode)
        )
    }
}

@Suite("Noise: cacophony test vectors, 25519_ChaChaPoly_SHA256")
struct NoiseVectorTests {
    /// One row per protocol: both sides run with the vector's keys; every handshake message,
    /// the handshake hash, and every transport message after the split must match byte for byte.
    @Test(
        "handshake, hash and transport match the vector",
        .enabled(if: NoiseTestVectors.shouldRun, NoiseTestVectors.skipReason),
        arguments: NoiseTestVectors.protocolNames
    )
    func vector(_ protocolName: String) throws {
        let file = try NoiseTestVectors.load()
        let matching = file.vectors.filter { $0.protocolName == protocolName }
        try #require(matching.count == 1, "expected exactly one vector for \(protocolName), found \(matching.count)")
        let vector = matching[0]

        var initiator = try vector.state(initiator: true)
        var responder = try vector.state(initiator: false)
        #expect(initiator.protocolName == protocolName)
        let handshakeLength = initiator.pattern.messages.count
        try #require(vector.messages.count > handshakeLength, "the vector has no transport messages")

        // After the split: raw cipher states (c1 sends initiator → responder, c2 the other way),
        // and NoiseTransport on both sides, each checked against the same bytes.
        var c1Sender: NoiseCipherState?
        var c1Receiver: NoiseCipherState?
        var c2Sender: NoiseCipherState?
        var c2Receiver: NoiseCipherState?
        var initiatorTransport: NoiseTransport?
        var responderTransport: NoiseTransport?

        for (index, message) in vector.messages.enumerated() {
            let payload = try NoiseHex.decode(message.payload)
            let expected = try NoiseHex.decode(message.ciphertext)
            let fromInitiator = index % 2 == 0
            let label = "\(protocolName) message \(index) (\(fromInitiator ? "initiator → responder" : "responder → initiator"))"

            if index < handshakeLength {
                #expect(initiator.isWriteTurn == fromInitiator, "\(label)")
                #expect(responder.isWriteTurn == !fromInitiator, "\(label)")
                let written: [UInt8]
                let read: [UInt8]
                if fromInitiator {
                    written = try initiator.writeMessage(payload: payload)
                    read = try responder.readMessage(written)
                } else {
                    written = try responder.writeMessage(payload: payload)
                    read = try initiator.readMessage(written)
                }
                #expect(NoiseHex.encode(written) == message.ciphertext.lowercased(), "\(label): handshake ciphertext")
                #expect(read == payload, "\(label): handshake payload")

                if index == handshakeLength - 1 {
                    #expect(initiator.isComplete && responder.isComplete)
                    let initiatorResult = try initiator.split()
                    let responderResult = try responder.split()
                    #expect(NoiseHex.encode(initiatorResult.handshakeHash) == vector.handshakeHash.lowercased(), "initiator's h")
                    #expect(NoiseHex.encode(responderResult.handshakeHash) == vector.handshakeHash.lowercased(), "responder's h")
                    #expect(initiator.handshakeHash == initiatorResult.handshakeHash)
                    c1Sender = initiatorResult.initiatorToResponder
                    c2Receiver = initiatorResult.responderToInitiator
                    c1Receiver = responderResult.initiatorToResponder
                    c2Sender = responderResult.responderToInitiator
                    initiatorTransport = NoiseTransport(initiatorResult)
                    responderTransport = NoiseTransport(responderResult)

                    // The static keys each side learned or was given are the peer's.
                    if let initStatic = vector.initStatic {
                        let expected = try NoiseKeys.privateKey(initStatic).publicKey.rawRepresentation
                        #expect(responder.remoteStaticKey?.rawRepresentation == expected)
                        #expect(responderResult.remoteStaticKey?.rawRepresentation == expected)
                    } else {
                        #expect(responder.remoteStaticKey == nil)
                    }
                    if let respStatic = vector.respStatic {
                        let expected = try NoiseKeys.privateKey(respStatic).publicKey.rawRepresentation
                        #expect(initiator.remoteStaticKey?.rawRepresentation == expected)
                        #expect(initiatorResult.remoteStaticKey?.rawRepresentation == expected)
                    } else {
                        #expect(initiator.remoteStaticKey == nil)
                    }
                }
            } else {
                // Seal first and compare, so a wrong byte is reported as such before any decryption.
                let sealedRaw = try fromInitiator ? encrypt(&c1Sender, payload) : encrypt(&c2Sender, payload)
                let sealedTransport = try fromInitiator ? seal(&initiatorTransport, payload) : seal(&responderTransport, payload)
                #expect(NoiseHex.encode(sealedRaw) == message.ciphertext.lowercased(), "\(label): transport ciphertext (cipher state)")
                #expect(NoiseHex.encode(sealedTransport) == message.ciphertext.lowercased(), "\(label): transport ciphertext (NoiseTransport)")
                let openedRaw = try fromInitiator ? decrypt(&c1Receiver, expected) : decrypt(&c2Receiver, expected)
                let openedTransport = try fromInitiator ? open(&responderTransport, expected) : open(&initiatorTransport, expected)
                #expect(openedRaw == payload, "\(label): transport plaintext (cipher state)")
                #expect(openedTransport == payload, "\(label): transport plaintext (NoiseTransport)")
            }
        }
    }

    /// Every vector in the file is one this suite runs, so none is silently ignored.
    @Test(
        "the file holds exactly the five expected protocols",
        .enabled(if: NoiseTestVectors.shouldRun, NoiseTestVectors.skipReason)
    )
    func fileCoverage() throws {
        let file = try NoiseTestVectors.load()
        #expect(file.vectors.map(\.protocolName).sorted() == NoiseTestVectors.protocolNames.sorted())
        #expect(!file.source.isEmpty)
    }

    // `encryptWithAd` is mutating; these keep the bookkeeping of optional states readable.
    private func encrypt(_ state: inout NoiseCipherState?, _ plaintext: [UInt8]) throws -> [UInt8] {
        var unwrapped = try #require(state)
        defer { state = unwrapped }
        return try unwrapped.encryptWithAd([], plaintext: plaintext)
    }

    private func decrypt(_ state: inout NoiseCipherState?, _ ciphertext: [UInt8]) throws -> [UInt8] {
        var unwrapped = try #require(state)
        defer { state = unwrapped }
        return try unwrapped.decryptWithAd([], ciphertext: ciphertext)
    }

    private func seal(_ transport: inout NoiseTransport?, _ plaintext: [UInt8]) throws -> [UInt8] {
        var unwrapped = try #require(transport)
        defer { transport = unwrapped }
        return try unwrapped.seal(plaintext)
    }

    private func open(_ transport: inout NoiseTransport?, _ ciphertext: [UInt8]) throws -> [UInt8] {
        var unwrapped = try #require(transport)
        defer { transport = unwrapped }
        return try unwrapped.open(ciphertext)
    }
}

// MARK: - Primitives

@Suite("Noise: cipher and symmetric state")
struct NoisePrimitiveTests {
    static let key = [UInt8](0..<32)

    /// The nonce is 4 zero bytes and then n in little-endian, checked against ChaChaPoly directly.
    @Test func nonceLayout() throws {
        var state = try NoiseCipherState(key: Self.key)
        let n: UInt64 = 0x0102_0304_0506_0708
        state.setNonce(n)
        let ad = Array("ad".utf8)
        let plaintext = Array("the nonce layout".utf8)
        let ours = try state.encryptWithAd(ad, plaintext: plaintext)
        let nonce = try ChaChaPoly.Nonce(data: [0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1])
        let box = try ChaChaPoly.seal(plaintext, using: SymmetricKey(data: Self.key), nonce: nonce, authenticating: ad)
        #expect(ours == Array(box.ciphertext) + Array(box.tag))
        #expect(state.nonce == n + 1)
    }

    @Test func withoutKeyDataPassesThrough() throws {
        var state = NoiseCipherState()
        #expect(!state.hasKey)
        #expect(try state.encryptWithAd([1], plaintext: [1, 2, 3]) == [1, 2, 3])
        #expect(try state.decryptWithAd([1], ciphertext: [4, 5]) == [4, 5])
        #expect(state.nonce == 0)
    }

    @Test func keyMustBe32Bytes() {
        #expect(throws: NoiseError.self) { try NoiseCipherState(key: [UInt8](repeating: 1, count: 31)) }
        #expect(throws: NoiseError.self) { try NoiseCipherState(key: [UInt8](repeating: 1, count: 33)) }
    }

    /// 2^64-1 is reserved: the last usable nonce is 2^64-2, then every call fails and nothing changes.
    @Test func nonceExhaustion() throws {
        var sender = try NoiseCipherState(key: Self.key)
        var receiver = try NoiseCipherState(key: Self.key)
        sender.setNonce(.max - 1)
        receiver.setNonce(.max - 1)
        let last = try sender.encryptWithAd([], plaintext: [42])
        #expect(try receiver.decryptWithAd([], ciphertext: last) == [42])
        #expect(sender.nonce == NoiseCipherState.reservedNonce)
        #expect(throws: NoiseError.nonceExhausted) { try sender.encryptWithAd([], plaintext: [1]) }
        #expect(throws: NoiseError.nonceExhausted) { try receiver.decryptWithAd([], ciphertext: last) }
        #expect(sender.nonce == .max)

        // The same through NoiseTransport.
        var nearlySpent = try NoiseCipherState(key: Self.key)
        nearlySpent.setNonce(.max - 1)
        var transport = try NoiseTransport(sending: nearlySpent, receiving: try NoiseCipherState(key: Self.key), handshakeHash: [])
        _ = try transport.seal([1])
        #expect(throws: NoiseError.nonceExhausted) { try transport.seal([2]) }
    }

    @Test func failedDecryptionDoesNotAdvanceNonce() throws {
        var sender = try NoiseCipherState(key: Self.key)
        var receiver = try NoiseCipherState(key: Self.key)
        let sealed = try sender.encryptWithAd([9], plaintext: [1, 2, 3])
        #expect(throws: NoiseError.decryptionFailed) { try receiver.decryptWithAd([8], ciphertext: sealed) }
        #expect(receiver.nonce == 0)
        #expect(throws: NoiseError.messageTooShort(needed: 16, got: 15)) { try receiver.decryptWithAd([9], ciphertext: Array(sealed.prefix(15))) }
        #expect(try receiver.decryptWithAd([9], ciphertext: sealed) == [1, 2, 3])
        #expect(receiver.nonce == 1)
    }

    /// Opening into a buffer gives what opening into a new array gives, reuses the buffer's
    /// storage, and on failure leaves the buffer empty and the nonce where it was.
    @Test func decryptionIntoABuffer() throws {
        var sender = try NoiseCipherState(key: Self.key)
        var receiver = try NoiseCipherState(key: Self.key)
        var check = try NoiseCipherState(key: Self.key)
        var output: [UInt8] = []
        output.reserveCapacity(4096)
        let storage = output.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
        for size in [0, 1, 100, 2000, 50, 3000, 3000] {
            let plaintext = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let sealed = try sender.encryptWithAd([5], plaintext: plaintext)
            try receiver.decryptWithAd([5], ciphertext: sealed[...], into: &output)
            #expect(output == plaintext)
            #expect(try check.decryptWithAd([5], ciphertext: sealed) == plaintext)
            #expect(output.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) } == storage)
        }
        let sealed = try sender.encryptWithAd([9], plaintext: [1, 2, 3])
        #expect(throws: NoiseError.decryptionFailed) { try receiver.decryptWithAd([8], ciphertext: sealed[...], into: &output) }
        #expect(output.isEmpty)
        #expect(receiver.nonce == 7)
        try receiver.decryptWithAd([9], ciphertext: sealed[...], into: &output)
        #expect(output == [1, 2, 3])
        #expect(receiver.nonce == 8)
        var keyless = NoiseCipherState()
        try keyless.decryptWithAd([], ciphertext: [4, 5][...], into: &output)
        #expect(output == [4, 5])
    }

    /// Sealing in place gives swift-crypto's `ChaChaPoly.seal` bytes for every size up to the
    /// largest record, leaves what precedes the plaintext alone, and opens again.
    @Test(arguments: [0, 1, 63, 64, 65, 1000, 16384, 61460, NoiseTransport.maxPlaintextLength])
    func sealingInPlace(size: Int) throws {
        var sender = try NoiseCipherState(key: Self.key)
        sender.setNonce(0x0102_0304)
        var receiver = try NoiseCipherState(key: Self.key)
        receiver.setNonce(0x0102_0304)
        let ad = Array("record".utf8)
        let prefix: [UInt8] = [0xAA, 0xBB, 0xCC]
        let plaintext = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 5) }
        var buffer = prefix + plaintext
        try sender.encryptWithAd(ad, inPlace: &buffer, from: prefix.count)
        let nonce = try ChaChaPoly.Nonce(data: [0, 0, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0])
        let box = try ChaChaPoly.seal(plaintext, using: SymmetricKey(data: Self.key), nonce: nonce, authenticating: ad)
        #expect(buffer == prefix + Array(box.ciphertext) + Array(box.tag))
        #expect(sender.nonce == 0x0102_0305)
        #expect(try receiver.decryptWithAd(ad, ciphertext: buffer[prefix.count...]) == plaintext)
    }

    /// A record's frames sealed where they lie through the transport: past the limit nothing is
    /// sealed, the buffer is cut back to where they started and the nonce does not move.
    @Test func transportSealsInPlaceWithinTheLimit() throws {
        let sending = try NoiseCipherState(key: Self.key)
        var transport = try NoiseTransport(sending: sending, receiving: try NoiseCipherState(key: Self.key), handshakeHash: [])
        var buffer: [UInt8] = [1, 2] + [UInt8](repeating: 7, count: NoiseTransport.maxPlaintextLength + 1)
        #expect(throws: NoiseError.messageTooLong(length: NoiseTransport.maxPlaintextLength + 1, limit: NoiseTransport.maxPlaintextLength)) {
            try transport.seal(inPlace: &buffer, from: 2)
        }
        #expect(buffer == [1, 2])
        #expect(transport.sendCipher.nonce == 0)
        buffer += [9, 9, 9]
        try transport.seal(inPlace: &buffer, from: 2)
        var check = try NoiseCipherState(key: Self.key)
        #expect(Array(buffer.prefix(2)) == [1, 2])
        #expect(try check.decryptWithAd([], ciphertext: buffer[2...]) == [9, 9, 9])
        #expect(transport.sendCipher.nonce == 1)
    }

    /// Rekey: k becomes the first 32 bytes of ENCRYPT(k, 2^64-1, empty, 32 zeros); n is kept.
    @Test func rekey() throws {
        var state = try NoiseCipherState(key: Self.key)
        state.setNonce(5)
        try state.rekey()
        #expect(state.nonce == 5)
        let nonce = try ChaChaPoly.Nonce(data: [0, 0, 0, 0] + [UInt8](repeating: 0xFF, count: 8))
        let box = try ChaChaPoly.seal([UInt8](repeating: 0, count: 32), using: SymmetricKey(data: Self.key), nonce: nonce)
        var expected = try NoiseCipherState(key: Array(box.ciphertext))
        expected.setNonce(5)
        #expect(try state.encryptWithAd([], plaintext: [7]) == (try expected.encryptWithAd([], plaintext: [7])))
    }

    /// Names of up to 32 bytes are padded, longer ones hashed; ck starts equal to h.
    @Test func protocolNameToHash() {
        let short = NoiseSymmetricState(protocolName: "Noise_XX_25519_ChaChaPoly_SHA256")
        #expect(short.handshakeHash == Array("Noise_XX_25519_ChaChaPoly_SHA256".utf8))
        #expect(short.chainingKey == short.handshakeHash)
        let shorter = NoiseSymmetricState(protocolName: "Noise_NN")
        #expect(shorter.handshakeHash == Array("Noise_NN".utf8) + [UInt8](repeating: 0, count: 24))
        let long = NoiseSymmetricState(protocolName: "Noise_XXpsk3_25519_ChaChaPoly_SHA256")
        #expect(long.handshakeHash == Array(SHA256.hash(data: Array("Noise_XXpsk3_25519_ChaChaPoly_SHA256".utf8))))
        #expect(!long.hasKey)
    }

    /// Noise's HKDF is RFC 5869 HKDF with the chaining key as salt and empty info: cross-check
    /// mixKey, mixKeyAndHash and split against swift-crypto's HKDF.
    @Test func hkdfMatchesRFC5869() throws {
        var state = NoiseSymmetricState(protocolName: "Noise_XX_25519_ChaChaPoly_SHA256")
        let ck0 = state.chainingKey
        let ikm = Array("input key material".utf8)
        state.mixKey(ikm)
        let expected = HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: ikm), salt: ck0, outputByteCount: 64)
            .withUnsafeBytes { Array($0) }
        #expect(state.chainingKey == Array(expected.prefix(32)))
        var probe = try NoiseCipherState(key: Array(expected.suffix(32)))
        var copy = state
        #expect(try copy.encryptAndHash([1, 2]) == (try probe.encryptWithAd(state.handshakeHash, plaintext: [1, 2])))

        let ck1 = state.chainingKey
        let h1 = state.handshakeHash
        state.mixKeyAndHash(ikm)
        let three = HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: ikm), salt: ck1, outputByteCount: 96)
            .withUnsafeBytes { Array($0) }
        #expect(state.chainingKey == Array(three[0..<32]))
        #expect(state.handshakeHash == Array(SHA256.hash(data: h1 + three[32..<64])))

        let ck2 = state.chainingKey
        var (c1, c2) = state.split()
        let splitKeys = HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: [UInt8]()), salt: ck2, outputByteCount: 64)
            .withUnsafeBytes { Array($0) }
        var k1 = try NoiseCipherState(key: Array(splitKeys.prefix(32)))
        var k2 = try NoiseCipherState(key: Array(splitKeys.suffix(32)))
        #expect(try c1.encryptWithAd([], plaintext: [3]) == (try k1.encryptWithAd([], plaintext: [3])))
        #expect(try c2.encryptWithAd([], plaintext: [3]) == (try k2.encryptWithAd([], plaintext: [3])))
    }
}

// MARK: - Patterns

@Suite("Noise: handshake patterns as data")
struct NoisePatternTests {
    @Test(arguments: NoiseHandshakePattern.all.map(\.name))
    func builtInsPassValidation(_ name: String) throws {
        let pattern = try #require(NoiseHandshakePattern.named(name))
        let rebuilt = try NoiseHandshakePattern(
            name: pattern.name, initiatorPreMessage: pattern.initiatorPreMessage,
            responderPreMessage: pattern.responderPreMessage, messages: pattern.messages)
        #expect(rebuilt == pattern)
        #expect(NoiseHandshakePattern.named(pattern.name) == pattern)
        #expect(NoiseHandshakePattern.named(pattern.protocolName) == pattern)
    }

    @Test func names() {
        #expect(NoiseHandshakePattern.xx.protocolName == "Noise_XX_25519_ChaChaPoly_SHA256")
        #expect(NoiseHandshakePattern.xxpsk3.protocolName == "Noise_XXpsk3_25519_ChaChaPoly_SHA256")
        #expect(NoiseHandshakePattern.xxpsk3.pskCount == 1 && NoiseHandshakePattern.xxpsk3.isPSK)
        #expect(!NoiseHandshakePattern.xx.isPSK)
        #expect(NoiseHandshakePattern.named("XK") == nil)
        #expect(NoiseHandshakePattern.xx.description == "XX:\n  -> e\n  <- e, ee, s, es\n  -> s, se")
        #expect(NoiseHandshakePattern.kk.description.contains("  -> s\n  <- s\n  ...\n"))
    }

    /// A pattern that is not built in works from data alone: NK (responder's static key known).
    @Test func newPatternIsData() throws {
        let nk = try NoiseHandshakePattern(name: "NK", responderPreMessage: [.s], messages: [[.e, .es], [.e, .ee]])
        var initiator = try NoiseHandshakeState(pattern: nk, initiator: true, remoteStaticKey: NoiseKeys.bob.publicKey)
        var responder = try NoiseHandshakeState(pattern: nk, initiator: false, staticKey: NoiseKeys.bob)
        #expect(try responder.readMessage(try initiator.writeMessage(payload: [1])) == [1])
        #expect(try initiator.readMessage(try responder.writeMessage(payload: [2])) == [2])
        var a = try initiator.transport()
        var b = try responder.transport()
        #expect(try b.open(try a.seal([3])) == [3])
        #expect(a.handshakeHash == b.handshakeHash)
    }

    @Test(arguments: [
        ("e twice", [], [], [[NoiseHandshakePattern.Token.e], [.e, .ee], [.e]]),
        ("DH before the key", [], [], [[.e, .es], [.e, .ee]]),
        ("DH twice", [], [], [[.e], [.e, .ee, .ee]]),
        ("DH token in a pre-message", [.ee], [], [[.e]]),
        ("pre-message key sent again", [.s], [], [[.e, .s]]),
        ("no messages", [], [], []),
        ("psk encryption before e", [], [], [[.psk, .s], [.e]]),
        ("se without ee (rule 4)", [], [.e], [[.e, .s, .se]]),
    ] as [(String, [NoiseHandshakePattern.Token], [NoiseHandshakePattern.Token], [[NoiseHandshakePattern.Token]])])
    func invalidPatterns(_ label: String, _ initiatorPre: [NoiseHandshakePattern.Token], _ responderPre: [NoiseHandshakePattern.Token], _ messages: [[NoiseHandshakePattern.Token]]) {
        #expect(throws: NoiseError.self, "\(label)") {
            try NoiseHandshakePattern(name: "Bad", initiatorPreMessage: initiatorPre, responderPreMessage: responderPre, messages: messages)
        }
    }

    @Test func missingAndSuperfluousKeys() {
        let psk = [UInt8](repeating: 7, count: 32)
        func check(_ expectedCase: (NoiseError) -> Bool, _ label: String, _ make: () throws(NoiseError) -> NoiseHandshakeState) {
            do {
                _ = try make()
                Issue.record("\(label): no error")
            } catch {
                #expect(expectedCase(error), "\(label): \(error)")
            }
        }
        let missing: (NoiseError) -> Bool = { if case .missingKeyMaterial = $0 { true } else { false } }
        let invalid: (NoiseError) -> Bool = { if case .invalidKeyMaterial = $0 { true } else { false } }
        check(missing, "KK without rs") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .kk, initiator: true, staticKey: NoiseKeys.alice)
        }
        check(missing, "KK without s") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .kk, initiator: false, remoteStaticKey: NoiseKeys.alice.publicKey)
        }
        check(missing, "IK initiator without rs") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .ik, initiator: true, staticKey: NoiseKeys.alice)
        }
        check(missing, "XX without s") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .xx, initiator: false)
        }
        check(missing, "XXpsk3 without psk") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .xxpsk3, initiator: true, staticKey: NoiseKeys.alice)
        }
        check(invalid, "XXpsk3 with a 31-byte psk") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .xxpsk3, initiator: true, staticKey: NoiseKeys.alice, presharedKeys: [Array(psk.prefix(31))])
        }
        check(invalid, "XXpsk3 with two psks") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .xxpsk3, initiator: true, staticKey: NoiseKeys.alice, presharedKeys: [psk, psk])
        }
        check(invalid, "NN with a static key") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .nn, initiator: true, staticKey: NoiseKeys.alice)
        }
        check(invalid, "XX with rs (it is transmitted)") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .xx, initiator: true, staticKey: NoiseKeys.alice, remoteStaticKey: NoiseKeys.bob.publicKey)
        }
        check(invalid, "IK responder with rs") { () throws(NoiseError) in
            try NoiseHandshakeState(pattern: .ik, initiator: false, staticKey: NoiseKeys.bob, remoteStaticKey: NoiseKeys.alice.publicKey)
        }
    }
}

// MARK: - Handshake behaviour

@Suite("Noise: XX handshake and transport")
struct NoiseHandshakeTests {
    @Test func xxConvenienceRoundTrip() throws {
        var run = try NoiseXXRun(payloads: [Array("one".utf8), Array("two".utf8), Array("three".utf8)])
        #expect(run.initiator.isComplete && run.responder.isComplete)
        #expect(!run.initiator.isWriteTurn && !run.initiator.isReadTurn)
        #expect(run.initiator.remoteStaticKey?.rawRepresentation == NoiseKeys.bob.publicKey.rawRepresentation)
        #expect(run.responder.remoteStaticKey?.rawRepresentation == NoiseKeys.alice.publicKey.rawRepresentation)
        #expect(run.initiator.localStaticPublicKey?.rawRepresentation == NoiseKeys.alice.publicKey.rawRepresentation)
        #expect(run.initiator.handshakeHash == run.responder.handshakeHash)
        #expect(run.messages.map(\.count) == [32 + 3, 32 + 48 + 3 + 16, 48 + 5 + 16])
        // The first message carries its payload in clear (there is no key yet), the others don't.
        #expect(run.messages[0].suffix(3) == ArraySlice("one".utf8))

        var alice = try run.initiator.transport()
        var bob = try run.responder.transport()
        #expect(alice.handshakeHash == bob.handshakeHash)
        #expect(alice.remoteStaticKey?.rawRepresentation == NoiseKeys.bob.publicKey.rawRepresentation)
        for round in 0..<5 {
            let ping = Array("ping \(round)".utf8)
            #expect(try bob.open(try alice.seal(ping)) == ping)
            let pong = Array("pong \(round)".utf8)
            #expect(try alice.open(try bob.seal(pong)) == pong)
        }
        #expect(try bob.open(try alice.seal([])) == [])

        // Rekey in step on both ends keeps the channel working; out of step breaks it.
        try alice.rekeySending()
        try bob.rekeyReceiving()
        #expect(try bob.open(try alice.seal([1, 2, 3])) == [1, 2, 3])
        try alice.rekeySending()
        #expect(throws: NoiseError.decryptionFailed) { try bob.open(try alice.seal([4])) }
    }

    @Test func freshEphemeralsMakeEachHandshakeDifferent() throws {
        let first = try NoiseXXRun()
        let second = try NoiseXXRun()
        #expect(first.messages[0] != second.messages[0])
        #expect(first.initiator.handshakeHash != second.initiator.handshakeHash)
    }

    @Test func prologueMismatchFails() throws {
        var initiator = NoiseHandshakeState.xx(initiator: true, prologue: [1], staticKey: NoiseKeys.alice)
        var responder = NoiseHandshakeState.xx(initiator: false, prologue: [2], staticKey: NoiseKeys.bob)
        _ = try responder.readMessage(try initiator.writeMessage())
        #expect(throws: NoiseError.decryptionFailed) { try initiator.readMessage(try responder.writeMessage()) }
    }

    @Test func wrongPreSharedKeyFails() throws {
        let good = [UInt8](repeating: 1, count: 32)
        let bad = [UInt8](repeating: 2, count: 32)
        var initiator = try NoiseHandshakeState(pattern: .xxpsk3, initiator: true, staticKey: NoiseKeys.alice, presharedKeys: [good])
        var responder = try NoiseHandshakeState(pattern: .xxpsk3, initiator: false, staticKey: NoiseKeys.bob, presharedKeys: [bad])
        _ = try responder.readMessage(try initiator.writeMessage())
        _ = try initiator.readMessage(try responder.writeMessage())
        #expect(throws: NoiseError.decryptionFailed) { try responder.readMessage(try initiator.writeMessage()) }
    }

    @Test func outOfTurnCalls() throws {
        var initiator = NoiseHandshakeState.xx(initiator: true, staticKey: NoiseKeys.alice)
        var responder = NoiseHandshakeState.xx(initiator: false, staticKey: NoiseKeys.bob)
        #expect(initiator.isWriteTurn && responder.isReadTurn)
        #expect(throws: NoiseError.self) { try responder.writeMessage() }
        #expect(throws: NoiseError.self) { try initiator.readMessage([UInt8](repeating: 9, count: 32)) }
        #expect(throws: NoiseError.self) { try initiator.split() }
        #expect(throws: NoiseError.self) { try initiator.transport() }
        let message1 = try initiator.writeMessage()
        #expect(throws: NoiseError.self) { try initiator.writeMessage() }  // twice in a row
        _ = try responder.readMessage(message1)
        #expect(throws: NoiseError.self) { try responder.readMessage(message1) }  // reading again
        let message2 = try responder.writeMessage()
        _ = try initiator.readMessage(message2)
        let message3 = try initiator.writeMessage()
        _ = try responder.readMessage(message3)
        for state in [initiator, responder] {
            var state = state
            #expect(throws: NoiseError.self) { try state.writeMessage() }
            #expect(throws: NoiseError.self) { try state.readMessage(message3) }
            _ = try state.split()
            #expect(throws: NoiseError.self) { try state.split() }  // once only: no duplicated cipher states
        }
        do {
            _ = try responder.writeMessage()
            Issue.record("write after the handshake did not throw")
        } catch {
            guard case .outOfOrder = error else { Issue.record("expected outOfOrder, got \(error)"); return }
        }
    }

    /// Each byte of each authenticated handshake message, flipped, is an error; the reader is
    /// unchanged by the failure and then accepts the genuine message.
    @Test(arguments: [1, 2])
    func tamperedHandshakeMessage(_ index: Int) throws {
        var (reader, message) = try NoiseXXRun.reader(beforeMessage: index, payload: Array("payload".utf8))
        for position in message.indices {
            var tampered = message
            tampered[position] ^= 0x01
            #expect(throws: NoiseError.self, "byte \(position)") { try reader.readMessage(tampered) }
        }
        #expect(try reader.readMessage(message) == Array("payload".utf8))
    }

    @Test func tamperedTransportMessage() throws {
        var run = try NoiseXXRun()
        var alice = try run.initiator.transport()
        var bob = try run.responder.transport()
        let sealed = try alice.seal(Array("transport".utf8))
        for position in sealed.indices {
            var tampered = sealed
            tampered[position] ^= 0x80
            #expect(throws: NoiseError.decryptionFailed, "byte \(position)") { try bob.open(tampered) }
        }
        for length in 0..<sealed.count {
            #expect(throws: NoiseError.self, "length \(length)") { try bob.open(Array(sealed.prefix(length))) }
        }
        #expect(try bob.open(sealed) == Array("transport".utf8))
        // Replay is caught: the nonce moved on.
        #expect(throws: NoiseError.decryptionFailed) { try bob.open(sealed) }
    }

    /// Every truncation of the first XX messages is an error (or, for the unauthenticated first
    /// message, a shorter clear payload once the 32-byte key is complete); none crashes.
    @Test(arguments: [0, 1, 2])
    func truncatedHandshakeMessages(_ index: Int) throws {
        let payload = Array("truncate me".utf8)
        var (reader, message) = try NoiseXXRun.reader(beforeMessage: index, payload: payload)
        for length in 0..<message.count {
            let truncated = Array(message.prefix(length))
            if index == 0, length >= 32 {
                // Message 1 of XX is `e` plus a clear payload: nothing authenticates it (by design).
                var copy = reader
                #expect(try copy.readMessage(truncated) == Array(payload.prefix(length - 32)))
            } else {
                #expect(throws: NoiseError.self, "message \(index + 1) cut to \(length) bytes") { try reader.readMessage(truncated) }
            }
        }
        #expect(try reader.readMessage(message) == payload)
    }

    @Test func truncatedEmptyFirstMessageNamesTheShortfall() throws {
        var (reader, message) = try NoiseXXRun.reader(beforeMessage: 0)
        #expect(message.count == 32)
        #expect(throws: NoiseError.messageTooShort(needed: 32, got: 31)) { try reader.readMessage(Array(message.prefix(31))) }
        #expect(throws: NoiseError.messageTooShort(needed: 32, got: 0)) { try reader.readMessage([]) }
    }

    @Test func messagesOverTheLimit() throws {
        var (reader, _) = try NoiseXXRun.reader(beforeMessage: 1)
        #expect(throws: NoiseError.messageTooLong(length: 65536, limit: 65535)) {
            try reader.readMessage([UInt8](repeating: 0, count: 65536))
        }

        var initiator = NoiseHandshakeState.xx(initiator: true, staticKey: NoiseKeys.alice)
        #expect(throws: NoiseError.messageTooLong(length: 65536, limit: 65535)) {
            try initiator.writeMessage(payload: [UInt8](repeating: 0, count: 65536))
        }
        // Payload fits on its own, but with `e` the message is one byte over: refused, state unchanged.
        #expect(throws: NoiseError.messageTooLong(length: 65536, limit: 65535)) {
            try initiator.writeMessage(payload: [UInt8](repeating: 0, count: 65535 - 32 + 1))
        }
        #expect(initiator.nextMessageIndex == 0)
        let exact = try initiator.writeMessage(payload: [UInt8](repeating: 0, count: 65535 - 32))
        #expect(exact.count == 65535)

        var run = try NoiseXXRun()
        var alice = try run.initiator.transport()
        var bob = try run.responder.transport()
        #expect(throws: NoiseError.messageTooLong(length: 65520, limit: 65519)) {
            try alice.seal([UInt8](repeating: 0, count: NoiseTransport.maxPlaintextLength + 1))
        }
        let largest = try alice.seal([UInt8](repeating: 0xAB, count: NoiseTransport.maxPlaintextLength))
        #expect(largest.count == NoiseTransport.maxMessageLength)
        #expect(try bob.open(largest).count == NoiseTransport.maxPlaintextLength)
        #expect(throws: NoiseError.messageTooLong(length: 65536, limit: 65535)) {
            try bob.open([UInt8](repeating: 0, count: 65536))
        }
    }

    /// 200 random messages per stage, from a seeded generator: each is an error (only message 1
    /// of XX, which nothing authenticates, accepts any 32 bytes or more), and none disturbs the
    /// state: the genuine message still completes the handshake afterwards.
    @Test func randomGarbageAtEveryStage() throws {
        var generator = SeededGenerator(seed: 0x5EED_0F_4015E)
        func garbage() -> [UInt8] {
            let length: Int =
                switch Int.random(in: 0..<10, using: &generator) {
                case 0: Int.random(in: 0..<32, using: &generator)
                case 1: Int.random(in: 1000..<3000, using: &generator)
                case 2: [32, 48, 64, 80, 96, 111, 112, 128].randomElement(using: &generator) ?? 0
                default: Int.random(in: 0..<200, using: &generator)
                }
            return generator.bytes(length)
        }

        for stage in 0..<3 {
            var (reader, message) = try NoiseXXRun.reader(beforeMessage: stage)
            for _ in 0..<200 {
                let junk = garbage()
                if stage == 0, junk.count >= 32 {
                    var copy = reader
                    _ = try? copy.readMessage(junk)  // may succeed (any 32 bytes is an `e`), must not crash
                } else {
                    #expect(throws: NoiseError.self, "stage \(stage), \(junk.count) bytes") { try reader.readMessage(junk) }
                }
            }
            _ = try reader.readMessage(message)
        }

        // Authenticated from the first message on: IK and KK refuse garbage at message 1 too.
        for pattern in [NoiseHandshakePattern.ik, .kk] {
            var responder = try NoiseHandshakeState(
                pattern: pattern, initiator: false, staticKey: NoiseKeys.bob,
                remoteStaticKey: pattern == .kk ? NoiseKeys.alice.publicKey : nil)
            for _ in 0..<200 {
                let junk = garbage()
                #expect(throws: NoiseError.self, "\(pattern.name), \(junk.count) bytes") { try responder.readMessage(junk) }
            }
        }

        // Transport: every random message fails to authenticate; the genuine one still opens.
        var run = try NoiseXXRun()
        var alice = try run.initiator.transport()
        var bob = try run.responder.transport()
        for _ in 0..<200 {
            let junk = garbage()
            #expect(throws: NoiseError.self) { try bob.open(junk) }
        }
        #expect(try bob.open(try alice.seal([5])) == [5])
    }

    /// A hostile peer's low-order ephemeral key: the DH it enters gives the all-zero secret,
    /// reported as invalidPublicKey, wherever in the handshake it comes.
    @Test(arguments: NoiseKeys.lowOrderPoints)
    func lowOrderEphemeral(_ point: [UInt8]) throws {
        // As the initiator's `e` in XX: accepted on reading (no DH yet); the responder's `ee` fails.
        var (responder, _) = try NoiseXXRun.reader(beforeMessage: 0)
        _ = try responder.readMessage(point)
        #expect(throws: NoiseError.invalidPublicKey) { try responder.writeMessage() }

        // As the responder's `e` in XX message 2: `ee` fails on reading.
        var (initiator, genuine) = try NoiseXXRun.reader(beforeMessage: 1)
        #expect(throws: NoiseError.invalidPublicKey) { try initiator.readMessage(point + genuine.dropFirst(32)) }

        // As the initiator's `e` in KK and IK message 1: `es` fails on reading.
        for pattern in [NoiseHandshakePattern.kk, .ik] {
            var state = try NoiseHandshakeState(
                pattern: pattern, initiator: false, staticKey: NoiseKeys.bob,
                remoteStaticKey: pattern == .kk ? NoiseKeys.alice.publicKey : nil)
            #expect(throws: NoiseError.invalidPublicKey, "\(pattern.name)") { try state.readMessage(point + [UInt8](repeating: 0, count: 80)) }
        }
    }

    /// A low-order point given as the peer's pre-known static key (IK): the initiator's `es`
    /// fails when writing message 1, and the state is left before message 1.
    @Test func lowOrderRemoteStaticKey() throws {
        var initiator = try NoiseHandshakeState(pattern: .ik, initiator: true, staticKey: NoiseKeys.alice, remoteStaticKey: try NoiseKeys.publicKey(NoiseHex.encode(NoiseKeys.lowOrderPoints[1])))
        #expect(throws: NoiseError.invalidPublicKey) { try initiator.writeMessage() }
        #expect(initiator.nextMessageIndex == 0)
    }
}
