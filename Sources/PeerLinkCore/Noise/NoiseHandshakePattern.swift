/// A Noise handshake pattern (§7) as data: the pre-messages and the token list of each message.
///
/// Messages alternate, the first from the initiator (`->`), the next from the responder (`<-`),
/// and so on. A new pattern is a new value, not new code: the handshake state interprets the
/// tokens. ``init(name:initiatorPreMessage:responderPreMessage:messages:)`` checks the validity
/// rules of §7.3 and §9.3, so a pattern that would leak or misuse keys is refused up front.
///
/// ```
/// XX:                      XXpsk3:
///   -> e                     -> e
///   <- e, ee, s, es          <- e, ee, s, es
///   -> s, se                 -> s, se, psk
/// ```
public struct NoiseHandshakePattern: Hashable, Sendable, CustomStringConvertible {
    /// A token of a message pattern (§7.1, §9.1).
    public enum Token: String, Hashable, Sendable, CaseIterable, CustomStringConvertible {
        /// The sender's ephemeral public key, in clear (mixed into `h`; into the key as well in
        /// PSK handshakes).
        case e
        /// The sender's static public key, encrypted once there is a key.
        case s
        /// DH between the two ephemeral keys.
        case ee
        /// DH between the initiator's ephemeral key and the responder's static key.
        case es
        /// DH between the initiator's static key and the responder's ephemeral key.
        case se
        /// DH between the two static keys.
        case ss
        /// The next pre-shared key is mixed into the key and the hash.
        case psk

        public var description: String { rawValue }

        var isDH: Bool {
            switch self {
            case .ee, .es, .se, .ss: true
            case .e, .s, .psk: false
            }
        }
    }

    /// The name as it appears in the protocol name: `XX`, `XXpsk3`.
    public let name: String
    /// Public keys of the initiator the responder knows before the handshake (`e` and/or `s`).
    public let initiatorPreMessage: [Token]
    /// Public keys of the responder the initiator knows before the handshake (`e` and/or `s`).
    public let responderPreMessage: [Token]
    /// The handshake messages, alternating initiator → responder, responder → initiator, ….
    public let messages: [[Token]]

    /// A pattern from its parts, checked against the rules of Noise §7.3 and §9.3.
    ///
    /// - Throws: ``NoiseError/invalidPattern(_:)`` naming the broken rule.
    public init(
        name: String,
        initiatorPreMessage: [Token] = [],
        responderPreMessage: [Token] = [],
        messages: [[Token]]
    ) throws(NoiseError) {
        self.init(unchecked: name, initiatorPreMessage, responderPreMessage, messages)
        try validate()
    }

    private init(unchecked name: String, _ initiatorPre: [Token], _ responderPre: [Token], _ messages: [[Token]]) {
        self.name = name
        initiatorPreMessage = initiatorPre
        responderPreMessage = responderPre
        self.messages = messages
    }

    /// The full protocol name with this library's functions: `Noise_XX_25519_ChaChaPoly_SHA256`.
    public var protocolName: String { "Noise_\(name)_25519_ChaChaPoly_SHA256" }

    /// How many `psk` tokens the pattern has (the number of pre-shared keys it needs).
    public var pskCount: Int { messages.joined().filter { $0 == .psk }.count }

    /// Whether this is a PSK handshake, in which `e` tokens also call `MixKey` (§9.2).
    public var isPSK: Bool { pskCount > 0 }

    /// Whether message `index` (counting from 0) is written by the initiator.
    public static func isFromInitiator(messageIndex index: Int) -> Bool { index % 2 == 0 }

    public var description: String {
        var lines = ["\(name):"]
        if !initiatorPreMessage.isEmpty { lines.append("  -> \(initiatorPreMessage.map(\.rawValue).joined(separator: ", "))") }
        if !responderPreMessage.isEmpty { lines.append("  <- \(responderPreMessage.map(\.rawValue).joined(separator: ", "))") }
        if !initiatorPreMessage.isEmpty || !responderPreMessage.isEmpty { lines.append("  ...") }
        for (index, tokens) in messages.enumerated() {
            let arrow = Self.isFromInitiator(messageIndex: index) ? "->" : "<-"
            lines.append("  \(arrow) \(tokens.map(\.rawValue).joined(separator: ", "))")
        }
        return lines.joined(separator: "\n")
    }

    // MARK: - The patterns PeerLink knows

    /// `NN`: no static keys; anonymous on both sides.
    public static let nn = NoiseHandshakePattern(unchecked: "NN", [], [], [[.e], [.e, .ee]])
    /// `KK`: both static keys known to the other side in advance.
    public static let kk = NoiseHandshakePattern(unchecked: "KK", [.s], [.s], [[.e, .es, .ss], [.e, .ee, .se]])
    /// `IK`: the initiator knows the responder's static key and sends its own, encrypted, at once.
    public static let ik = NoiseHandshakePattern(unchecked: "IK", [], [.s], [[.e, .es, .s, .ss], [.e, .ee, .se]])
    /// `XX`: both static keys sent during the handshake, both encrypted. PeerLink's pattern.
    public static let xx = NoiseHandshakePattern(unchecked: "XX", [], [], [[.e], [.e, .ee, .s, .es], [.s, .se]])
    /// `XXpsk3`: `XX` with a pre-shared key mixed in at the end of the third message.
    public static let xxpsk3 = NoiseHandshakePattern(
        unchecked: "XXpsk3", [], [], [[.e], [.e, .ee, .s, .es], [.s, .se, .psk]])

    /// Every built-in pattern.
    public static let all: [NoiseHandshakePattern] = [.nn, .kk, .ik, .xx, .xxpsk3]

    /// The built-in pattern with this name (`"XX"`) or full protocol name
    /// (`"Noise_XX_25519_ChaChaPoly_SHA256"`), or nil.
    public static func named(_ name: String) -> NoiseHandshakePattern? {
        all.first { $0.name == name || $0.protocolName == name }
    }

    // MARK: - Validation (§7.3, §9.3)

    func validate() throws(NoiseError) {
        guard !name.isEmpty, name.unicodeScalars.allSatisfy({ $0.isASCII && $0 != "_" }) else {
            throw .invalidPattern("the name must be non-empty ASCII without '_'")
        }
        guard !messages.isEmpty else { throw .invalidPattern("a handshake has at least one message") }
        var sent: [Bool: Set<Token>] = [true: [], false: []]  // keyed by "is initiator"
        for (isInitiator, pre) in [(true, initiatorPreMessage), (false, responderPreMessage)] {
            for token in pre {
                guard token == .e || token == .s else {
                    throw .invalidPattern("pre-messages hold only 'e' and 's', found '\(token)'")
                }
                guard sent[isInitiator, default: []].insert(token).inserted else {
                    throw .invalidPattern("'\(token)' appears twice in a pre-message")
                }
            }
        }
        var dhDone: Set<Token> = []
        var pskSeen = false
        for (index, tokens) in messages.enumerated() {
            let sender = Self.isFromInitiator(messageIndex: index)
            for token in tokens {
                switch token {
                case .e, .s:
                    guard sent[sender, default: []].insert(token).inserted else {
                        throw .invalidPattern("message \(index + 1) sends '\(token)' a second time")
                    }
                    if token == .s, pskSeen, !sent[sender, default: []].contains(.e) {
                        throw .invalidPattern("message \(index + 1) encrypts after 'psk' before its sender sent 'e'")
                    }
                case .ee, .es, .se, .ss:
                    let (initiatorKey, responderKey): (Token, Token) =
                        switch token {
                        case .ee: (.e, .e)
                        case .es: (.e, .s)
                        case .se: (.s, .e)
                        default: (.s, .s)
                        }
                    guard sent[true, default: []].contains(initiatorKey), sent[false, default: []].contains(responderKey) else {
                        throw .invalidPattern("message \(index + 1) uses '\(token)' before both keys were sent")
                    }
                    guard dhDone.insert(token).inserted else {
                        throw .invalidPattern("'\(token)' appears twice")
                    }
                case .psk:
                    pskSeen = true
                }
            }
            if pskSeen, !sent[sender, default: []].contains(.e) {
                throw .invalidPattern("message \(index + 1) has an encrypted payload after 'psk' but its sender sent no 'e'")
            }
            try Self.checkEncryptionAllowed(isInitiator: sender, dhDone: dhDone, where: "message \(index + 1)")
        }
        try Self.checkEncryptionAllowed(isInitiator: true, dhDone: dhDone, where: "the initiator's transport messages")
        try Self.checkEncryptionAllowed(isInitiator: false, dhDone: dhDone, where: "the responder's transport messages")
    }

    /// §7.3 rule 4: after a DH involving the local static key, a party encrypts only once the
    /// matching DH with its ephemeral key has also been done.
    private static func checkEncryptionAllowed(isInitiator: Bool, dhDone: Set<Token>, where place: String) throws(NoiseError) {
        let rules: [(done: Token, required: Token)] =
            isInitiator ? [(.se, .ee), (.ss, .es)] : [(.es, .ee), (.ss, .se)]
        for rule in rules where dhDone.contains(rule.done) && !dhDone.contains(rule.required) {
            throw .invalidPattern("\(place): '\(rule.done)' without '\(rule.required)' before encrypting")
        }
    }
}
