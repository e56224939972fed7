/// A Noise SymmetricState (§5.2): the chaining key `ck`, the handshake hash `h`, and the
/// CipherState the handshake encrypts with.
public struct NoiseSymmetricState: Sendable {
    /// `ck`.
    public private(set) var chainingKey: [UInt8]
    /// `h`: after the handshake, a unique identifier of it (for channel binding).
    public private(set) var handshakeHash: [UInt8]
    /// The handshake's CipherState.
    public private(set) var cipherState: NoiseCipherState

    /// `InitializeSymmetric(protocol_name)`: `h` is the name padded with zeros to HASHLEN if it
    /// fits, else its hash; `ck = h`; no key.
    public init(protocolName: String) {
        let name = Array(protocolName.utf8)
        if name.count <= NoiseCrypto.hashLength {
            handshakeHash = name + [UInt8](repeating: 0, count: NoiseCrypto.hashLength - name.count)
        } else {
            handshakeHash = NoiseCrypto.hash(name)
        }
        chainingKey = handshakeHash
        cipherState = NoiseCipherState()
    }

    /// `HasKey()` of the inner CipherState.
    public var hasKey: Bool { cipherState.hasKey }

    /// `MixKey(input_key_material)`: `ck, temp_k = HKDF(ck, ikm, 2)`; the cipher gets `temp_k`.
    public mutating func mixKey(_ inputKeyMaterial: [UInt8]) {
        let (newChainingKey, tempKey) = NoiseCrypto.hkdf(chainingKey: chainingKey, inputKeyMaterial: inputKeyMaterial)
        chainingKey = newChainingKey
        cipherState = NoiseCipherState(validKey: tempKey)
    }

    /// `MixHash(data)`: `h = HASH(h || data)`.
    public mutating func mixHash(_ data: [UInt8]) {
        handshakeHash = NoiseCrypto.hash(handshakeHash + data)
    }

    /// `MixKeyAndHash(input_key_material)` (for pre-shared keys): `ck, temp_h, temp_k =
    /// HKDF(ck, ikm, 3)`; `MixHash(temp_h)`; the cipher gets `temp_k`.
    public mutating func mixKeyAndHash(_ inputKeyMaterial: [UInt8]) {
        let (newChainingKey, tempHash, tempKey) = NoiseCrypto.hkdf3(chainingKey: chainingKey, inputKeyMaterial: inputKeyMaterial)
        chainingKey = newChainingKey
        mixHash(tempHash)
        cipherState = NoiseCipherState(validKey: tempKey)
    }

    /// `EncryptAndHash(plaintext)`: encrypts with `h` as associated data, then mixes the
    /// ciphertext into `h`.
    public mutating func encryptAndHash(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let ciphertext = try cipherState.encryptWithAd(handshakeHash, plaintext: plaintext)
        mixHash(ciphertext)
        return ciphertext
    }

    /// `DecryptAndHash(ciphertext)`: decrypts with `h` as associated data, then mixes the
    /// ciphertext into `h`.
    public mutating func decryptAndHash(_ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let plaintext = try cipherState.decryptWithAd(handshakeHash, ciphertext: ciphertext)
        mixHash(ciphertext)
        return plaintext
    }

    /// `Split()`: two CipherStates from `HKDF(ck, empty, 2)`: the first for messages from the
    /// initiator to the responder, the second for the other direction.
    public func split() -> (initiatorToResponder: NoiseCipherState, responderToInitiator: NoiseCipherState) {
        let (key1, key2) = NoiseCrypto.hkdf(chainingKey: chainingKey, inputKeyMaterial: [])
        return (NoiseCipherState(validKey: key1), NoiseCipherState(validKey: key2))
    }
}
