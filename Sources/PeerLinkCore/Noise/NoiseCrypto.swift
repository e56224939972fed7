import Crypto

/// The concrete functions of `25519_ChaChaPoly_SHA256` (Noise revision 34, §4 and §12), and the
/// byte reader the handshake uses on untrusted input.
enum NoiseCrypto {
    /// DHLEN: the size of a Curve25519 public key and of a DH output.
    static let dhLength = 32
    /// HASHLEN for SHA-256.
    static let hashLength = 32
    /// The size of the ChaChaPoly authentication tag.
    static let tagLength = 16
    /// The largest Noise message, handshake or transport.
    static let maxMessageLength = 65535

    static func hash(_ data: [UInt8]) -> [UInt8] {
        Array(SHA256.hash(data: data))
    }

    static func hmac(key: [UInt8], _ data: [UInt8]) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: data, using: SymmetricKey(data: key)))
    }

    /// HKDF as Noise §4.3 defines it on top of HMAC-HASH: two or three outputs of HASHLEN bytes.
    static func hkdf(chainingKey: [UInt8], inputKeyMaterial: [UInt8]) -> ([UInt8], [UInt8]) {
        let tempKey = hmac(key: chainingKey, inputKeyMaterial)
        let output1 = hmac(key: tempKey, [0x01])
        let output2 = hmac(key: tempKey, output1 + [0x02])
        return (output1, output2)
    }

    static func hkdf3(chainingKey: [UInt8], inputKeyMaterial: [UInt8]) -> ([UInt8], [UInt8], [UInt8]) {
        let tempKey = hmac(key: chainingKey, inputKeyMaterial)
        let output1 = hmac(key: tempKey, [0x01])
        let output2 = hmac(key: tempKey, output1 + [0x02])
        let output3 = hmac(key: tempKey, output2 + [0x03])
        return (output1, output2, output3)
    }

    /// X25519. A result of all zeros (the peer sent a low-order point) is an error: swift-crypto,
    /// like CryptoKit, returns it without complaint, so the check is made here.
    static func dh(
        _ privateKey: Curve25519.KeyAgreement.PrivateKey,
        _ publicKey: Curve25519.KeyAgreement.PublicKey
    ) throws(NoiseError) -> [UInt8] {
        let secret: [UInt8]
        do {
            secret = try privateKey.sharedSecretFromKeyAgreement(with: publicKey).withUnsafeBytes { Array($0) }
        } catch {
            throw .invalidPublicKey
        }
        // Accumulate instead of returning early: no timing difference between secrets.
        var accumulated: UInt8 = 0
        for byte in secret { accumulated |= byte }
        guard secret.count == dhLength, accumulated != 0 else { throw .invalidPublicKey }
        return secret
    }

    static func publicKey(_ bytes: [UInt8]) throws(NoiseError) -> Curve25519.KeyAgreement.PublicKey {
        guard bytes.count == dhLength else { throw .messageTooShort(needed: dhLength, got: bytes.count) }
        do {
            return try Curve25519.KeyAgreement.PublicKey(rawRepresentation: bytes)
        } catch {
            throw .invalidPublicKey
        }
    }

    static func rawBytes(_ key: Curve25519.KeyAgreement.PublicKey) -> [UInt8] {
        Array(key.rawRepresentation)
    }
}

/// Reads a message front to back, checking every length before it takes bytes.
struct NoiseMessageReader {
    private var remaining: ArraySlice<UInt8>

    init(_ message: [UInt8]) {
        remaining = message[...]
    }

    var count: Int { remaining.count }

    mutating func take(_ count: Int) throws(NoiseError) -> [UInt8] {
        guard count >= 0, remaining.count >= count else {
            throw .messageTooShort(needed: count, got: remaining.count)
        }
        let taken = Array(remaining.prefix(count))
        remaining = remaining.dropFirst(count)
        return taken
    }

    mutating func takeRest() -> [UInt8] {
        let rest = Array(remaining)
        remaining = []
        return rest
    }
}
