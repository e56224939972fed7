/// Everything that can go wrong in a Noise handshake or on a Noise transport.
///
/// Every failure caused by bytes from the network is reported as one of these cases, never as a
/// trap: a hostile peer can make a handshake fail, but cannot crash the process. After any error
/// from ``NoiseHandshakeState`` or ``NoiseTransport`` the session should be torn down (Noise
/// has no recovery from a failed message); the states are left exactly as they were before the
/// failing call, so nothing half-processed is ever used.
public enum NoiseError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The authentication tag did not verify: the message was tampered with, truncated, sent
    /// under different keys, or is out of order.
    case decryptionFailed
    /// A message ended before the part the pattern expects next (`needed` bytes, `got` left).
    case messageTooShort(needed: Int, got: Int)
    /// A message, or the plaintext that would become one, exceeds the Noise limit of
    /// 65535 bytes (`limit` is the allowance for what was passed in).
    case messageTooLong(length: Int, limit: Int)
    /// A call made when the handshake is not in the state for it: writing when it is the peer's
    /// turn, reading when it is ours, anything after the last message, or splitting before it.
    case outOfOrder(String)
    /// The pattern needs a key that was not supplied (for example `KK` without the peer's static
    /// key), or a pre-shared key is missing.
    case missingKeyMaterial(String)
    /// A key was supplied that is malformed (a pre-shared key that is not 32 bytes) or that the
    /// pattern does not use at this point.
    case invalidKeyMaterial(String)
    /// Diffie-Hellman with the peer's public key gave the all-zero secret: the key is a
    /// low-order point, which no honest peer sends.
    case invalidPublicKey
    /// The cipher's 64-bit nonce reached 2^64-1, which Noise reserves; the session must end
    /// (or rekey and restart with fresh keys at a higher layer).
    case nonceExhausted
    /// A handshake pattern given as data breaks one of the rules of Noise §7.3.
    case invalidPattern(String)

    public var description: String {
        switch self {
        case .decryptionFailed:
            "Noise: a message failed authentication (tampered, truncated, or not from the expected peer)"
        case .messageTooShort(let needed, let got):
            "Noise: a message is too short: \(needed) more bytes expected, \(got) left"
        case .messageTooLong(let length, let limit):
            "Noise: \(length) bytes is over the limit of \(limit) bytes for one message"
        case .outOfOrder(let what):
            "Noise: out of order: \(what)"
        case .missingKeyMaterial(let what):
            "Noise: missing key material: \(what)"
        case .invalidKeyMaterial(let what):
            "Noise: invalid key material: \(what)"
        case .invalidPublicKey:
            "Noise: the peer's public key is invalid (a low-order point giving an all-zero shared secret)"
        case .nonceExhausted:
            "Noise: the nonce is exhausted; this cipher state must not be used any more"
        case .invalidPattern(let why):
            "Noise: invalid handshake pattern: \(why)"
        }
    }
}
