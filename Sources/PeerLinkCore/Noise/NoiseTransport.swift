import Crypto

/// The transport phase of a Noise session: one cipher state for sending, one for receiving,
/// and the 65535-byte limit on every message.
///
/// Messages must be opened in the order they were sealed (the nonce is implicit); the
/// underlying link (TCP, RFCOMM) is reliable and ordered, and any loss, reordering, replay or
/// tampering shows up as ``NoiseError/decryptionFailed``, after which the session must end.
public struct NoiseTransport: Sendable {
    /// The largest Noise message on the wire.
    public static let maxMessageLength = 65535
    /// The largest plaintext one message can carry (the limit minus the 16-byte tag).
    public static let maxPlaintextLength = maxMessageLength - 16

    /// Encrypts what this side sends (`c1` for the initiator, `c2` for the responder).
    public private(set) var sendCipher: NoiseCipherState
    /// Decrypts what the peer sends.
    public private(set) var receiveCipher: NoiseCipherState
    /// The handshake hash `h`, identical on both sides.
    public let handshakeHash: [UInt8]
    /// The peer's authenticated static public key, if the pattern had one.
    public let remoteStaticKey: Curve25519.KeyAgreement.PublicKey?

    /// This side's transport from a finished handshake.
    public init(_ handshake: NoiseHandshakeResult) {
        if handshake.isInitiator {
            sendCipher = handshake.initiatorToResponder
            receiveCipher = handshake.responderToInitiator
        } else {
            sendCipher = handshake.responderToInitiator
            receiveCipher = handshake.initiatorToResponder
        }
        handshakeHash = handshake.handshakeHash
        remoteStaticKey = handshake.remoteStaticKey
    }

    /// A transport from two keyed cipher states (for example restored, or with a chosen nonce).
    ///
    /// - Throws: ``NoiseError/missingKeyMaterial(_:)`` if either state has no key: a transport
    ///   never sends in clear.
    public init(
        sending: NoiseCipherState,
        receiving: NoiseCipherState,
        handshakeHash: [UInt8],
        remoteStaticKey: Curve25519.KeyAgreement.PublicKey? = nil
    ) throws(NoiseError) {
        guard sending.hasKey, receiving.hasKey else {
            throw .missingKeyMaterial("a transport needs keyed cipher states in both directions")
        }
        sendCipher = sending
        receiveCipher = receiving
        self.handshakeHash = handshakeHash
        self.remoteStaticKey = remoteStaticKey
    }

    /// Encrypts one message (empty associated data).
    ///
    /// - Throws: ``NoiseError/messageTooLong(length:limit:)`` above ``maxPlaintextLength``
    ///   bytes; ``NoiseError/nonceExhausted`` after 2^64-1 messages.
    public mutating func seal(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard plaintext.count <= Self.maxPlaintextLength else {
            throw .messageTooLong(length: plaintext.count, limit: Self.maxPlaintextLength)
        }
        return try sendCipher.encryptWithAd([], plaintext: plaintext)
    }

    /// Encrypts one message (empty associated data), appending it to `output`.
    ///
    /// - Throws: as ``seal(_:)``; nothing is appended then.
    public mutating func seal(_ plaintext: [UInt8], appendingTo output: inout [UInt8]) throws(NoiseError) {
        guard plaintext.count <= Self.maxPlaintextLength else {
            throw .messageTooLong(length: plaintext.count, limit: Self.maxPlaintextLength)
        }
        try sendCipher.encryptWithAd([], plaintext: plaintext, appendingTo: &output)
    }

    /// Encrypts `buffer[start...]` as one message where it lies (empty associated data): the
    /// ciphertext replaces the plaintext and the tag is appended, so a record's frames are
    /// sealed where they were encoded.
    ///
    /// - Throws: as ``seal(_:)``; `buffer` is cut back to `start` then.
    public mutating func seal(inPlace buffer: inout [UInt8], from start: Int) throws(NoiseError) {
        let length = buffer.count - start
        guard length <= Self.maxPlaintextLength else {
            buffer.removeSubrange(start...)
            throw .messageTooLong(length: length, limit: Self.maxPlaintextLength)
        }
        try sendCipher.encryptWithAd([], inPlace: &buffer, from: start)
    }

    /// Decrypts the peer's next message.
    ///
    /// - Throws: ``NoiseError/messageTooLong(length:limit:)`` above 65535 bytes;
    ///   ``NoiseError/messageTooShort(needed:got:)`` below the 16-byte tag;
    ///   ``NoiseError/decryptionFailed`` if it does not authenticate;
    ///   ``NoiseError/nonceExhausted``.
    public mutating func open(_ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        try open(ciphertext[...])
    }

    /// ``open(_:)`` of a part of a buffer (not copied out first).
    public mutating func open(_ ciphertext: ArraySlice<UInt8>) throws(NoiseError) -> [UInt8] {
        var plaintext: [UInt8] = []
        try open(ciphertext, into: &plaintext)
        return plaintext
    }

    /// ``open(_:)`` of a part of a buffer into `plaintext`, whose storage is reused; on failure
    /// `plaintext` is empty.
    public mutating func open(_ ciphertext: ArraySlice<UInt8>, into plaintext: inout [UInt8]) throws(NoiseError) {
        guard ciphertext.count <= Self.maxMessageLength else {
            plaintext.removeAll(keepingCapacity: true)
            throw .messageTooLong(length: ciphertext.count, limit: Self.maxMessageLength)
        }
        try receiveCipher.decryptWithAd([], ciphertext: ciphertext, into: &plaintext)
    }

    /// Rekeys the sending direction (§11.3); the peer must rekey its receiving direction at the
    /// same point in the stream.
    public mutating func rekeySending() throws(NoiseError) {
        try sendCipher.rekey()
    }

    /// Rekeys the receiving direction to match the peer's ``rekeySending()``.
    public mutating func rekeyReceiving() throws(NoiseError) {
        try receiveCipher.rekey()
    }
}
