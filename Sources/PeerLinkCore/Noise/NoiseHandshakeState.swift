import Crypto

/// A Noise HandshakeState (§5.3) for `25519_ChaChaPoly_SHA256`: runs one side of a handshake
/// pattern, message by message, then splits into transport cipher states.
///
/// ```swift
/// var initiator = NoiseHandshakeState.xx(initiator: true, prologue: prologue, staticKey: myKey)
/// let message1 = try initiator.writeMessage()
/// // … send message1, receive message2 …
/// _ = try initiator.readMessage(message2)
/// let message3 = try initiator.writeMessage()
/// var transport = try initiator.transport()
/// ```
///
/// Every call either completes or throws a ``NoiseError`` and leaves the state exactly as it was
/// (the work is done on a copy that replaces `self` only on success). Noise has no way to retry a
/// failed handshake message, so callers should abort the session on any error; the guarantee
/// is that nothing partly processed (a half-mixed hash, a stray key) can leak into later use.
public struct NoiseHandshakeState: Sendable {
    /// The pattern this handshake follows.
    public let pattern: NoiseHandshakePattern
    /// Whether this side sends the first message.
    public let isInitiator: Bool

    private var symmetric: NoiseSymmetricState
    private var localStatic: Curve25519.KeyAgreement.PrivateKey?
    private var localEphemeral: Curve25519.KeyAgreement.PrivateKey?
    /// `rs`: the peer's static public key, once known (from a pre-message or a handshake
    /// message). Only trust it after the handshake completes.
    public private(set) var remoteStaticKey: Curve25519.KeyAgreement.PublicKey?
    /// `re`: the peer's ephemeral public key, once received.
    public private(set) var remoteEphemeralKey: Curve25519.KeyAgreement.PublicKey?
    private var presharedKeys: [[UInt8]]
    private var nextPresharedKey = 0
    private var messageIndex = 0
    private var didSplit = false

    /// `Initialize(...)`: a handshake state ready for its first message.
    ///
    /// - Parameters:
    ///   - pattern: the handshake pattern.
    ///   - initiator: whether this side sends the first message.
    ///   - prologue: data both sides must agree on, mixed into `h` (an error shows up as a
    ///     decryption failure at the first encrypted message).
    ///   - staticKey: `s`, this side's static key pair, if the pattern sends or pre-knows it.
    ///   - ephemeralKey: `e`, **for test vectors only**: a fixed ephemeral key. Leave nil in real
    ///     use; a fresh one is generated when the pattern sends `e`.
    ///   - remoteStaticKey: `rs`, if the pattern has it in the peer's pre-message (`KK`, `IK` for
    ///     the initiator).
    ///   - remoteEphemeralKey: `re`, if the pattern has it in the peer's pre-message.
    ///   - presharedKeys: one 32-byte key per `psk` token, in order.
    /// - Throws: ``NoiseError/missingKeyMaterial(_:)`` when the pattern needs a key that is not
    ///   given; ``NoiseError/invalidKeyMaterial(_:)`` for a key the pattern has no place for or a
    ///   pre-shared key of the wrong size.
    public init(
        pattern: NoiseHandshakePattern,
        initiator: Bool,
        prologue: [UInt8] = [],
        staticKey: Curve25519.KeyAgreement.PrivateKey? = nil,
        ephemeralKey: Curve25519.KeyAgreement.PrivateKey? = nil,
        remoteStaticKey: Curve25519.KeyAgreement.PublicKey? = nil,
        remoteEphemeralKey: Curve25519.KeyAgreement.PublicKey? = nil,
        presharedKeys: [[UInt8]] = []
    ) throws(NoiseError) {
        let local = initiator ? pattern.initiatorPreMessage : pattern.responderPreMessage
        let remote = initiator ? pattern.responderPreMessage : pattern.initiatorPreMessage
        var localSends: Set<NoiseHandshakePattern.Token> = Set(local)
        var remoteSends: Set<NoiseHandshakePattern.Token> = Set(remote)
        for (index, tokens) in pattern.messages.enumerated() {
            if NoiseHandshakePattern.isFromInitiator(messageIndex: index) == initiator {
                localSends.formUnion(tokens)
            } else {
                remoteSends.formUnion(tokens)
            }
        }
        let role = initiator ? "initiator" : "responder"
        let name = pattern.name

        if localSends.contains(.s), staticKey == nil {
            throw .missingKeyMaterial("\(name) needs the \(role)'s static key")
        }
        if !localSends.contains(.s), staticKey != nil {
            throw .invalidKeyMaterial("\(name) does not use the \(role)'s static key")
        }
        if local.contains(.e), ephemeralKey == nil {
            throw .missingKeyMaterial("\(name) needs the \(role)'s ephemeral key before the handshake")
        }
        if !localSends.contains(.e), ephemeralKey != nil {
            throw .invalidKeyMaterial("\(name) does not use the \(role)'s ephemeral key")
        }
        if remote.contains(.s), remoteStaticKey == nil {
            throw .missingKeyMaterial("\(name) needs the peer's static key (rs) before the handshake")
        }
        if !remote.contains(.s), remoteStaticKey != nil {
            throw .invalidKeyMaterial(
                "\(name) \(remoteSends.contains(.s) ? "transmits" : "does not use") the peer's static key; do not pass rs"
            )
        }
        if remote.contains(.e), remoteEphemeralKey == nil {
            throw .missingKeyMaterial("\(name) needs the peer's ephemeral key (re) before the handshake")
        }
        if !remote.contains(.e), remoteEphemeralKey != nil {
            throw .invalidKeyMaterial("\(name) does not have re in a pre-message; do not pass it")
        }
        if presharedKeys.count < pattern.pskCount {
            throw .missingKeyMaterial("\(name) needs \(pattern.pskCount) pre-shared keys, got \(presharedKeys.count)")
        }
        if presharedKeys.count > pattern.pskCount {
            throw .invalidKeyMaterial("\(name) uses \(pattern.pskCount) pre-shared keys, got \(presharedKeys.count)")
        }
        for (index, psk) in presharedKeys.enumerated() where psk.count != 32 {
            throw .invalidKeyMaterial("pre-shared key \(index) is \(psk.count) bytes, not 32")
        }

        self.init(
            validated: pattern, initiator: initiator, prologue: prologue, staticKey: staticKey,
            ephemeralKey: ephemeralKey, remoteStaticKey: remoteStaticKey,
            remoteEphemeralKey: remoteEphemeralKey, presharedKeys: presharedKeys
        )
    }

    private init(
        validated pattern: NoiseHandshakePattern,
        initiator: Bool,
        prologue: [UInt8],
        staticKey: Curve25519.KeyAgreement.PrivateKey?,
        ephemeralKey: Curve25519.KeyAgreement.PrivateKey?,
        remoteStaticKey: Curve25519.KeyAgreement.PublicKey?,
        remoteEphemeralKey: Curve25519.KeyAgreement.PublicKey?,
        presharedKeys: [[UInt8]]
    ) {
        self.pattern = pattern
        isInitiator = initiator
        symmetric = NoiseSymmetricState(protocolName: pattern.protocolName)
        localStatic = staticKey
        localEphemeral = ephemeralKey
        self.remoteStaticKey = remoteStaticKey
        self.remoteEphemeralKey = remoteEphemeralKey
        self.presharedKeys = presharedKeys

        symmetric.mixHash(prologue)
        // Pre-messages: the initiator's keys first, then the responder's (§5.3).
        for (ofInitiator, tokens) in [(true, pattern.initiatorPreMessage), (false, pattern.responderPreMessage)] {
            let mine = ofInitiator == initiator
            for token in tokens {
                let key: Curve25519.KeyAgreement.PublicKey?
                switch token {
                case .e: key = mine ? ephemeralKey?.publicKey : remoteEphemeralKey
                case .s: key = mine ? staticKey?.publicKey : remoteStaticKey
                default: key = nil  // validated patterns have only e and s here
                }
                guard let key else { continue }
                let raw = NoiseCrypto.rawBytes(key)
                symmetric.mixHash(raw)
                if token == .e, pattern.isPSK { symmetric.mixKey(raw) }
            }
        }
    }

    /// PeerLink's handshake: `Noise_XX_25519_ChaChaPoly_SHA256` with `staticKey` as `s`.
    public static func xx(
        initiator: Bool,
        prologue: [UInt8] = [],
        staticKey: Curve25519.KeyAgreement.PrivateKey
    ) -> NoiseHandshakeState {
        NoiseHandshakeState(
            validated: .xx, initiator: initiator, prologue: prologue, staticKey: staticKey,
            ephemeralKey: nil, remoteStaticKey: nil, remoteEphemeralKey: nil, presharedKeys: []
        )
    }

    // MARK: - State

    /// The protocol name mixed into `h` first: `Noise_XX_25519_ChaChaPoly_SHA256`.
    public var protocolName: String { pattern.protocolName }

    /// `h`. After the last message it identifies this handshake (same value on both sides);
    /// usable for channel binding.
    public var handshakeHash: [UInt8] { symmetric.handshakeHash }

    /// This side's static public key, if it has one.
    public var localStaticPublicKey: Curve25519.KeyAgreement.PublicKey? { localStatic?.publicKey }

    /// This side's ephemeral public key, once chosen.
    public var localEphemeralPublicKey: Curve25519.KeyAgreement.PublicKey? { localEphemeral?.publicKey }

    /// The index (from 0) of the next handshake message.
    public var nextMessageIndex: Int { messageIndex }

    /// Whether every handshake message has been written or read.
    public var isComplete: Bool { messageIndex >= pattern.messages.count }

    /// Whether the next call should be ``writeMessage(payload:)`` (false when complete).
    public var isWriteTurn: Bool {
        !isComplete && NoiseHandshakePattern.isFromInitiator(messageIndex: messageIndex) == isInitiator
    }

    /// Whether the next call should be ``readMessage(_:)`` (false when complete).
    public var isReadTurn: Bool { !isComplete && !isWriteTurn }

    // MARK: - Messages

    /// `WriteMessage(payload, message_buffer)`: the next handshake message, carrying `payload`
    /// (encrypted once the handshake has a key; in clear before, so put nothing secret in it then).
    ///
    /// - Throws: ``NoiseError/outOfOrder(_:)`` if it is the peer's turn or the handshake is done;
    ///   ``NoiseError/messageTooLong(length:limit:)`` if the message would exceed 65535 bytes;
    ///   ``NoiseError/invalidPublicKey`` if a DH with the peer's key gives the all-zero secret.
    public mutating func writeMessage(payload: [UInt8] = []) throws(NoiseError) -> [UInt8] {
        guard !isComplete else { throw .outOfOrder("the handshake is complete; call split() or transport()") }
        guard isWriteTurn else {
            throw .outOfOrder("message \(messageIndex + 1) of \(pattern.name) is the peer's to write; read it first")
        }
        guard payload.count <= NoiseCrypto.maxMessageLength else {
            throw .messageTooLong(length: payload.count, limit: NoiseCrypto.maxMessageLength)
        }
        var next = self
        let message = try next.write(payload: payload)
        guard message.count <= NoiseCrypto.maxMessageLength else {
            throw .messageTooLong(length: message.count, limit: NoiseCrypto.maxMessageLength)
        }
        self = next
        return message
    }

    /// `ReadMessage(message, payload_buffer)`: processes the peer's next handshake message and
    /// returns its payload.
    ///
    /// - Throws: ``NoiseError/outOfOrder(_:)`` if it is this side's turn to write or the
    ///   handshake is done; ``NoiseError/messageTooLong(length:limit:)`` over 65535 bytes;
    ///   ``NoiseError/messageTooShort(needed:got:)`` if the message ends early;
    ///   ``NoiseError/decryptionFailed`` if anything encrypted fails authentication;
    ///   ``NoiseError/invalidPublicKey`` for a low-order public key.
    public mutating func readMessage(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard message.count <= NoiseCrypto.maxMessageLength else {
            throw .messageTooLong(length: message.count, limit: NoiseCrypto.maxMessageLength)
        }
        guard !isComplete else { throw .outOfOrder("the handshake is complete; call split() or transport()") }
        guard isReadTurn else {
            throw .outOfOrder("message \(messageIndex + 1) of \(pattern.name) is ours to write, not to read")
        }
        var next = self
        let payload = try next.read(message)
        self = next
        return payload
    }

    // MARK: - Split

    /// `Split()`, after the last handshake message: the two transport cipher states and the
    /// final handshake hash. Can be called once, so no cipher state is ever duplicated.
    ///
    /// - Throws: ``NoiseError/outOfOrder(_:)`` before the last message or on a second call.
    public mutating func split() throws(NoiseError) -> NoiseHandshakeResult {
        guard isComplete else {
            throw .outOfOrder("split() before the handshake is complete (next message: \(messageIndex + 1) of \(pattern.messages.count))")
        }
        guard !didSplit else { throw .outOfOrder("split() was already called for this handshake") }
        didSplit = true
        let (c1, c2) = symmetric.split()
        return NoiseHandshakeResult(
            initiatorToResponder: c1, responderToInitiator: c2, handshakeHash: symmetric.handshakeHash,
            remoteStaticKey: remoteStaticKey, isInitiator: isInitiator
        )
    }

    /// ``split()``, arranged as this side's send and receive ciphers.
    public mutating func transport() throws(NoiseError) -> NoiseTransport {
        NoiseTransport(try split())
    }

    // MARK: - Tokens

    private mutating func write(payload: [UInt8]) throws(NoiseError) -> [UInt8] {
        var buffer: [UInt8] = []
        for token in pattern.messages[messageIndex] {
            switch token {
            case .e:
                // A fixed key from the initializer (test vectors), or a fresh one. Validation
                // guarantees each side sends `e` at most once.
                let ephemeral = localEphemeral ?? Curve25519.KeyAgreement.PrivateKey()
                localEphemeral = ephemeral
                let raw = NoiseCrypto.rawBytes(ephemeral.publicKey)
                buffer += raw
                symmetric.mixHash(raw)
                if pattern.isPSK { symmetric.mixKey(raw) }
            case .s:
                guard let localStatic else { throw .missingKeyMaterial("no static key to send") }
                buffer += try symmetric.encryptAndHash(NoiseCrypto.rawBytes(localStatic.publicKey))
            case .ee, .es, .se, .ss:
                try mixDH(token)
            case .psk:
                try mixPresharedKey()
            }
        }
        buffer += try symmetric.encryptAndHash(payload)
        messageIndex += 1
        return buffer
    }

    private mutating func read(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        var reader = NoiseMessageReader(message)
        for token in pattern.messages[messageIndex] {
            switch token {
            case .e:
                guard remoteEphemeralKey == nil else { throw .outOfOrder("the peer sent 'e' twice") }
                let raw = try reader.take(NoiseCrypto.dhLength)
                remoteEphemeralKey = try NoiseCrypto.publicKey(raw)
                symmetric.mixHash(raw)
                if pattern.isPSK { symmetric.mixKey(raw) }
            case .s:
                guard remoteStaticKey == nil else { throw .outOfOrder("the peer sent 's' twice") }
                let length = NoiseCrypto.dhLength + (symmetric.hasKey ? NoiseCrypto.tagLength : 0)
                let encrypted = try reader.take(length)
                remoteStaticKey = try NoiseCrypto.publicKey(try symmetric.decryptAndHash(encrypted))
            case .ee, .es, .se, .ss:
                try mixDH(token)
            case .psk:
                try mixPresharedKey()
            }
        }
        let payload = try symmetric.decryptAndHash(reader.takeRest())
        messageIndex += 1
        return payload
    }

    /// `MixKey(DH(...))` for a DH token, with the keys each role uses (§5.3).
    private mutating func mixDH(_ token: NoiseHandshakePattern.Token) throws(NoiseError) {
        // es: the initiator's e with the responder's s; se: the initiator's s with the responder's e.
        let useLocalStatic: Bool
        let useRemoteStatic: Bool
        switch token {
        case .ee: (useLocalStatic, useRemoteStatic) = (false, false)
        case .es: (useLocalStatic, useRemoteStatic) = isInitiator ? (false, true) : (true, false)
        case .se: (useLocalStatic, useRemoteStatic) = isInitiator ? (true, false) : (false, true)
        default: (useLocalStatic, useRemoteStatic) = (true, true)
        }
        guard let privateKey = useLocalStatic ? localStatic : localEphemeral else {
            throw .missingKeyMaterial("'\(token)' needs this side's \(useLocalStatic ? "static" : "ephemeral") key")
        }
        guard let publicKey = useRemoteStatic ? remoteStaticKey : remoteEphemeralKey else {
            throw .missingKeyMaterial("'\(token)' needs the peer's \(useRemoteStatic ? "static" : "ephemeral") key")
        }
        symmetric.mixKey(try NoiseCrypto.dh(privateKey, publicKey))
    }

    private mutating func mixPresharedKey() throws(NoiseError) {
        guard nextPresharedKey < presharedKeys.count else {
            throw .missingKeyMaterial("no pre-shared key left for 'psk'")
        }
        symmetric.mixKeyAndHash(presharedKeys[nextPresharedKey])
        nextPresharedKey += 1
    }
}

/// What ``NoiseHandshakeState/split()`` returns: the transport cipher states and the identity of
/// the handshake.
public struct NoiseHandshakeResult: Sendable {
    /// `c1`: encrypts messages from the initiator to the responder.
    public var initiatorToResponder: NoiseCipherState
    /// `c2`: encrypts messages from the responder to the initiator.
    public var responderToInitiator: NoiseCipherState
    /// The final `h`, identical on both sides.
    public let handshakeHash: [UInt8]
    /// The peer's static public key, if the pattern has one: whoever holds its private key is
    /// the only party that could have completed this handshake.
    public let remoteStaticKey: Curve25519.KeyAgreement.PublicKey?
    /// Whether this side was the initiator.
    public let isInitiator: Bool
}
