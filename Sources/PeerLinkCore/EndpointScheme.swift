
/// Why a text is not an endpoint of a scheme: a short reason ("the port is missing"), which
/// ``Endpoint/init(parsing:)`` completes with the text and the accepted forms.
public struct EndpointSyntaxError: Error, Hashable, Sendable {
    public var reason: String

    public init(_ reason: String) {
        self.reason = reason
    }
}

/// How a transport's endpoints are written: a URL scheme (`tcp`, `bt`, `memory`), the forms to
/// show people, and the parser. A transport target defines its schemes next to its endpoint
/// type and registers them (``register(_:)``), so that ``Endpoint/init(parsing:)`` — and with it
/// `peerlink chat --connect` — reads its endpoints without anything else knowing them.
public struct EndpointScheme: Sendable {
    /// What comes before `://`, in lowercase.
    public let name: String
    /// The accepted forms, as a person would type them (`tcp://HOST:PORT`).
    public let forms: [String]
    /// Reads the text after `NAME://`.
    public let parse: @Sendable (Substring) throws(EndpointSyntaxError) -> Endpoint

    public init(name: String, forms: [String], parse: @escaping @Sendable (Substring) throws(EndpointSyntaxError) -> Endpoint) {
        self.name = name.lowercased()
        self.forms = forms
        self.parse = parse
    }

    private static let registry = Locked<[String: EndpointScheme]>([:])

    /// Makes ``Endpoint/init(parsing:)`` read `scheme`'s texts. Registering a scheme of the same
    /// name again replaces it. Callable from any thread.
    public static func register(_ scheme: EndpointScheme) {
        registry.withLock { $0[scheme.name] = scheme }
    }

    /// Every registered scheme, by name.
    public static var registered: [EndpointScheme] {
        registry.withLock { $0.values.sorted { $0.name < $1.name } }
    }
}

extension Endpoint {
    /// Parses what ``description`` prints, for every registered ``EndpointScheme``: with the
    /// standard transports `tcp://127.0.0.1:4000`, `tcp://[::1]:4000`,
    /// `bt://00:AA:01:00:00:00/rfcomm/5`, `bt://00:AA:01:00:00:00/l2cap/0x1001`. The error says
    /// which part is wrong and shows the accepted forms.
    public init(parsing text: String) throws(PeerLinkError) {
        try self.init(parsing: text, schemes: EndpointScheme.registered)
    }

    /// Parses `text` with the given schemes only.
    public init(parsing text: String, schemes: [EndpointScheme]) throws(PeerLinkError) {
        let forms = schemes.flatMap(\.forms)
        let accepted = forms.isEmpty
            ? "no transport that reads endpoints is registered in this program"
            : "use " + (forms.count == 1 ? forms[0] : forms.dropLast().joined(separator: ", ") + " or " + forms.last!)
        func bad(_ why: String) -> PeerLinkError {
            PeerLinkError(.invalidParameter, "'\(text)' is not an endpoint: \(why); \(accepted)")
        }
        guard let separator = text.range(of: "://") else { throw bad("it has no scheme (such as tcp://)") }
        let name = text[..<separator.lowerBound].lowercased()
        guard let scheme = schemes.first(where: { $0.name == name }) else { throw bad("unknown scheme '\(name)'") }
        do {
            self = try scheme.parse(text[separator.upperBound...])
        } catch {
            throw bad(error.reason)
        }
    }
}
