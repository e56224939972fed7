import Crypto

/// A Noise CipherState (§5.1): a ChaChaPoly key `k` (possibly empty) and a 64-bit nonce `n`.
///
/// The 96-bit ChaChaPoly nonce is 4 zero bytes followed by `n` in little-endian (§12.3).
/// `n` counts up by one per successful encryption or decryption; the value 2^64-1 is reserved,
/// so a state that reaches it throws ``NoiseError/nonceExhausted`` instead of ever reusing a
/// nonce. While `k` is empty, encryption and decryption pass data through unchanged, as the
/// spec requires for the first handshake messages.
///
/// A value type: copying a cipher state with a key and using both copies would reuse nonces,
/// so keep exactly one live copy per direction.
public struct NoiseCipherState: Sendable {
    /// The reserved nonce value 2^64-1.
    public static let reservedNonce: UInt64 = .max
    private var key: SymmetricKey?
    /// `n`: the nonce the next encryption or decryption will use.
    public private(set) var nonce: UInt64 = 0

    /// A cipher state with an empty key: encryption and decryption pass data through.
    public init() {}

    /// A cipher state with key `k` (32 bytes); `n` starts at 0.
    ///
    /// - Throws: ``NoiseError/invalidKeyMaterial(_:)`` if the key is not 32 bytes.
    public init(key: [UInt8]) throws(NoiseError) {
        try initializeKey(key)
    }

    /// A cipher state with the given 32-byte key, already known to have the right size.
    init(validKey: [UInt8]) {
        key = SymmetricKey(data: validKey)
    }

    /// `HasKey()`.
    public var hasKey: Bool { key != nil }

    /// `InitializeKey(key)`: sets `k` (nil for empty) and resets `n` to 0.
    public mutating func initializeKey(_ newKey: [UInt8]?) throws(NoiseError) {
        if let newKey {
            guard newKey.count == 32 else {
                throw .invalidKeyMaterial("a cipher key is 32 bytes, got \(newKey.count)")
            }
            key = SymmetricKey(data: newKey)
        } else {
            key = nil
        }
        nonce = 0
    }

    /// `SetNonce(nonce)`: for transports that deliver out of order and carry `n` explicitly,
    /// and for tests. Setting it to ``reservedNonce`` makes the state unusable.
    public mutating func setNonce(_ newNonce: UInt64) {
        nonce = newNonce
    }

    /// `EncryptWithAd(ad, plaintext)`: ciphertext followed by the 16-byte tag, or the plaintext
    /// itself if there is no key yet.
    public mutating func encryptWithAd(_ ad: [UInt8], plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard let key else { return plaintext }
        guard nonce != Self.reservedNonce else { throw .nonceExhausted }
        let sealed = try Self.encrypt(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
        nonce += 1
        return sealed
    }

    /// `EncryptWithAd(ad, plaintext)` that appends the ciphertext and tag (or the plaintext, with
    /// no key yet) to `output`, so a record is built in one buffer.
    public mutating func encryptWithAd(_ ad: [UInt8], plaintext: [UInt8], appendingTo output: inout [UInt8]) throws(NoiseError) {
        let start = output.count
        output.append(contentsOf: plaintext)
        try encryptWithAd(ad, inPlace: &output, from: start)
    }

    /// `EncryptWithAd(ad, plaintext)` of `buffer[start...]`, sealed where it lies: the
    /// ciphertext replaces the plaintext and the tag is appended (with no key yet, nothing
    /// changes). Frames encoded behind a record's length are sealed without a copy.
    ///
    /// - Throws: ``NoiseError/nonceExhausted``, or if the cipher itself fails; `buffer` is cut
    ///   back to `start` then.
    public mutating func encryptWithAd(_ ad: [UInt8], inPlace buffer: inout [UInt8], from start: Int) throws(NoiseError) {
        guard let key else { return }
        guard nonce != Self.reservedNonce else {
            buffer.removeSubrange(start...)
            throw .nonceExhausted
        }
        guard ChaChaPolyInPlace.seal(&buffer, from: start, key: key, nonce: nonce, ad: ad) else {
            throw .invalidKeyMaterial("ChaChaPoly encryption failed")
        }
        nonce += 1
    }

    /// `DecryptWithAd(ad, ciphertext)`: the plaintext, or the ciphertext itself if there is no
    /// key yet. On failure `n` is not advanced.
    public mutating func decryptWithAd(_ ad: [UInt8], ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        try decryptWithAd(ad, ciphertext: ciphertext[...])
    }

    /// `DecryptWithAd(ad, ciphertext)` of a part of a buffer (a record in what was read), so
    /// the ciphertext is not copied out first.
    public mutating func decryptWithAd(_ ad: [UInt8], ciphertext: ArraySlice<UInt8>) throws(NoiseError) -> [UInt8] {
        var opened: [UInt8] = []
        try decryptWithAd(ad, ciphertext: ciphertext, into: &opened)
        return opened
    }

    /// ``decryptWithAd(_:ciphertext:)`` into `output`, which holds only the plaintext afterwards
    /// (its storage is reused: a link opens every record into one buffer, and need not empty it
    /// between records). On failure `n` is not advanced and `output` is empty.
    public mutating func decryptWithAd(_ ad: [UInt8], ciphertext: ArraySlice<UInt8>, into output: inout [UInt8]) throws(NoiseError) {
        guard let key else {
            output.removeAll(keepingCapacity: true)
            output.append(contentsOf: ciphertext)
            return
        }
        guard nonce != Self.reservedNonce else {
            output.removeAll(keepingCapacity: true)
            throw .nonceExhausted
        }
        guard ciphertext.count >= NoiseCrypto.tagLength else {
            output.removeAll(keepingCapacity: true)
            throw .messageTooShort(needed: NoiseCrypto.tagLength, got: ciphertext.count)
        }
        guard ChaChaPolyInPlace.open(ciphertext, into: &output, key: key, nonce: nonce, ad: ad) else {
            throw .decryptionFailed
        }
        nonce += 1
    }

    /// `Rekey()` (§4.2, §11.3): `k` becomes the first 32 bytes of ENCRYPT(k, 2^64-1, empty,
    /// 32 zeros). `n` is unchanged. Does nothing without a key.
    public mutating func rekey() throws(NoiseError) {
        guard let key else { return }
        let next = try Self.encrypt(key: key, nonce: Self.reservedNonce, ad: [], plaintext: [UInt8](repeating: 0, count: 32))
        self.key = SymmetricKey(data: next.prefix(32))
    }

    private static func encrypt(key: SymmetricKey, nonce: UInt64, ad: [UInt8], plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        var sealed = plaintext
        guard ChaChaPolyInPlace.seal(&sealed, from: 0, key: key, nonce: nonce, ad: ad) else {
            // Only reachable if the cipher itself fails; report it rather than trap.
            throw .invalidKeyMaterial("ChaChaPoly encryption failed")
        }
        return sealed
    }
}
