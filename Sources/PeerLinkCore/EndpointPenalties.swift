/// Endpoints whose last dial or handshake failed lately, bounded in number and age: a dialler
/// tries them after the others (``ordered(_:at:)``), so an address that leads nowhere or to
/// somebody else delays a peer at most once in ``memory``. Times are any monotonic clock's.
public struct EndpointPenalties: Sendable {
    /// How long a failure keeps an endpoint at the back.
    public static let memory: Duration = .seconds(300)
    /// At most this many endpoints are remembered (the oldest failure is forgotten first).
    public static let capacity = 256

    private var failures: [Endpoint: Duration] = [:]

    public init() {}

    /// How many endpoints are remembered.
    public var count: Int { failures.count }

    /// `endpoint`'s dial or handshake failed at `now`.
    public mutating func failed(_ endpoint: Endpoint, at now: Duration) {
        failures[endpoint] = now
        guard failures.count > Self.capacity else { return }
        failures = failures.filter { now - $0.value < Self.memory }
        while failures.count > Self.capacity, let oldest = failures.min(by: { $0.value < $1.value }) {
            failures[oldest.key] = nil
        }
    }

    /// A link through `endpoint` completed its handshake: it is dialled in its turn again.
    public mutating func worked(_ endpoint: Endpoint) {
        failures[endpoint] = nil
    }

    /// `endpoints` in their order, those that failed within ``memory`` moved to the back
    /// (the one that failed longest ago first among them).
    public func ordered(_ endpoints: [Endpoint], at now: Duration) -> [Endpoint] {
        guard !failures.isEmpty else { return endpoints }
        var fine: [Endpoint] = []
        var failed: [(Endpoint, Duration)] = []
        for endpoint in endpoints {
            if let when = failures[endpoint], now - when < Self.memory {
                failed.append((endpoint, when))
            } else {
                fine.append(endpoint)
            }
        }
        return fine + failed.sorted { $0.1 < $1.1 }.map(\.0)
    }
}
