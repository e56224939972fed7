import PeerLinkCore
import Testing

/// A peer for the session tests: its fingerprint is derived from its name, so the fingerprint
/// order of a set of names is fixed but unrelated to the names' order.
func sessionPeer(_ name: String) -> PeerID {
    PeerID(fingerprint: Fingerprint(publicKey: Array("session test peer \(name)".utf8)), displayName: name)
}

let sessionTestService = try! ServiceType("chat")

/// A fake network of ``SessionStateMachine``s: it carries out their actions — dials become links
/// (established first at the dialer, then at the listener, as in the real handshake), frames
/// travel in order on each link and direction, `closeLink` ends a link with `GO_AWAY` — and
/// delivers everything in an order drawn from a seeded generator: links, frames, pulls and
/// closes of different links interleave at random, and both peers of a pair may dial each
/// other at once. Time is virtual: every step takes `step`, and due deadlines are ticked.
struct SessionNet {
    struct Node {
        var peer: PeerID
        var machine: SessionStateMachine
        var events: [SessionEvent] = []
        var nextLink = 1
        /// Links announced with `.framesReady` and not yet drained to nil.
        var ready: Set<LinkID> = []
        /// What `nextDeadlineInPlace()` last gave (nil: never read).
        var deadlineRead: Duration?? = nil
    }

    struct End: Hashable {
        var node: Int
        var link: LinkID
    }

    enum Item {
        case established
        case frame(Frame)
        case closed(GoAwayCode, String)
    }

    struct Connection {
        var dialer: End
        var listener: End
        var dialPending = true
        /// Dialer → listener.
        var forward: [Item] = []
        /// Listener → dialer.
        var backward: [Item] = []
        var dialerClosed = false
        var listenerClosed = false
    }

    /// One `closeLink` a node asked for.
    struct Close {
        var node: Int
        var peer: Int
        var code: GoAwayCode
        var reason: String
    }

    /// A control frame delivered.
    struct ControlDelivery {
        var from: Int
        var to: Int
        var message: ControlMessage
    }

    private enum Step {
        case completeDial(Int)
        case failDial(Int)
        case deliverForward(Int)
        case deliverBackward(Int)
        case pull(node: Int, link: LinkID)
        case discover(Int)
    }

    var nodes: [Node] = []
    var connections: [Connection] = []
    var now: Duration = .zero
    var step: Duration = .milliseconds(1)
    var generator: SeededGenerator
    /// Dials from the first node to the second fail.
    var failingDials: Set<[Int]> = []
    /// Of those, dials that find nothing listening (`ECONNREFUSED`: the peer's process is gone).
    var refusedDials: Set<[Int]> = []
    /// Every dial asked for: from, to.
    var dials: [[Int]] = []
    /// Frames from the first node to the second are dropped (a silent peer).
    var droppedFrames: Set<[Int]> = []
    private var failures: [(from: Int, to: Int)] = []
    /// Discovery reports still to make: the first node finds the second.
    var discoveries: [(node: Int, found: Int)] = []
    var closes: [Close] = []
    var controlLog: [ControlDelivery] = []
    /// The incarnation each node's hellos carry (none: the links say nothing of it).
    var incarnations: [Int: Incarnation] = [:]
    var stepsTaken = 0

    init(_ names: [String], policy: SessionPolicy = .default, seed: UInt64 = 1, policies: [Int: SessionPolicy] = [:]) throws {
        generator = SeededGenerator(seed: seed)
        for (index, name) in names.enumerated() {
            let session = SessionID(bytes: [UInt8](repeating: UInt8(index + 1), count: 16))!
            let peer = sessionPeer(name)
            nodes.append(
                Node(
                    peer: peer,
                    machine: try SessionStateMachine(
                        localPeer: peer, serviceType: sessionTestService, policy: policies[index] ?? policy, sessionID: session)))
        }
    }

    func index(of peer: PeerID) -> Int {
        nodes.firstIndex { $0.peer == peer }!
    }

    func peer(_ node: Int) -> PeerID { nodes[node].peer }

    func machine(_ node: Int) -> SessionStateMachine { nodes[node].machine }

    func connected(_ node: Int) -> Set<Int> {
        Set(nodes[node].machine.connectedPeers.map(index(of:)))
    }

    // MARK: Driving the machines

    mutating func apply(_ node: Int, _ actions: [SessionAction]) {
        for action in actions {
            switch action {
            case .dial(let peer, _):
                let other = index(of: peer)
                dials.append([node, other])
                if failingDials.contains([node, other]) {
                    failures.append((node, other))
                } else {
                    let dialer = End(node: node, link: newLink(node))
                    let listener = End(node: other, link: newLink(other))
                    connections.append(Connection(dialer: dialer, listener: listener))
                }
            case .framesReady(let link):
                nodes[node].ready.insert(link)
            case .closeLink(let link, let code, let reason):
                nodes[node].ready.remove(link)
                guard let index = connectionIndex(node, link) else { continue }
                if connections[index].dialer == End(node: node, link: link) {
                    connections[index].dialerClosed = true
                    connections[index].backward = []
                    connections[index].forward.append(.closed(code, reason))
                    closes.append(Close(node: node, peer: connections[index].listener.node, code: code, reason: reason))
                } else {
                    connections[index].listenerClosed = true
                    connections[index].forward = []
                    connections[index].backward.append(.closed(code, reason))
                    closes.append(Close(node: node, peer: connections[index].dialer.node, code: code, reason: reason))
                }
            case .event(let event):
                nodes[node].events.append(event)
            }
        }
    }

    private mutating func newLink(_ node: Int) -> LinkID {
        defer { nodes[node].nextLink += 1 }
        return LinkID(nodes[node].nextLink)
    }

    private func connectionIndex(_ node: Int, _ link: LinkID) -> Int? {
        let end = End(node: node, link: link)
        return connections.lastIndex { $0.dialer == end || $0.listener == end }
    }

    /// A link the test opens itself, outside the state machines' dials (the owner's own dial):
    /// established at both ends in the network's order.
    mutating func openLink(from dialer: Int, to listener: Int) {
        connections.append(
            Connection(dialer: End(node: dialer, link: newLink(dialer)), listener: End(node: listener, link: newLink(listener))))
    }

    /// Runs until nothing is left to deliver (or `limit` steps).
    @discardableResult
    mutating func run(limit: Int = 2_000_000) -> Int {
        var taken = 0
        while taken < limit {
            tickDue()
            let steps = enabledSteps()
            guard !steps.isEmpty else { break }
            let chosen = steps[Int.random(in: 0..<steps.count, using: &generator)]
            now += step
            perform(chosen)
            taken += 1
        }
        stepsTaken += taken
        return taken
    }

    /// Lets virtual time pass until `target`, ticking every machine at each deadline on the way
    /// (and every `tickEvery`, like an owner's timer), delivering whatever that produces.
    mutating func advance(to target: Duration, tickEvery interval: Duration? = nil) {
        run()
        var nextRegular = interval.map { now + $0 }
        while now < target {
            // The session's runtime reads the deadline in place; it must be the getter's.
            for node in nodes.indices {
                let read = nodes[node].machine.nextDeadline
                #expect(nodes[node].machine.nextDeadlineInPlace() == read, "node \(node): the deadline read in place is not the one read by copy")
            }
            var next = nodes.compactMap(\.machine.nextDeadline).filter { $0 > now }.min() ?? target
            if let regular = nextRegular { next = min(next, regular) }
            now = min(max(next, now), target)
            if let regular = nextRegular, now >= regular, let interval { nextRegular = regular + interval }
            for node in nodes.indices { apply(node, nodes[node].machine.tick(at: now)) }
            run()
        }
    }

    mutating func advance(by duration: Duration, tickEvery interval: Duration? = nil) {
        advance(to: now + duration, tickEvery: interval)
    }

    private mutating func tickDue() {
        for node in nodes.indices {
            checkNoDeadlineCameEarlier(node)
            // read as the session's timer reads it, after every step
            let deadline = nodes[node].machine.nextDeadlineInPlace()
            nodes[node].deadlineRead = .some(deadline)
            if let deadline, deadline <= now {
                apply(node, nodes[node].machine.tick(at: now))
            }
        }
    }

    /// While the machine says no deadline can have come earlier since it was last read (the
    /// session's timer then skips reading it), none has.
    func checkNoDeadlineCameEarlier(_ node: Int) {
        guard case .some(let read) = nodes[node].deadlineRead, !nodes[node].machine.nextDeadlineMayBeEarlier,
            let current = nodes[node].machine.nextDeadline
        else { return }
        #expect(read.map { current >= $0 } ?? false, "node \(node): a deadline came earlier (\(current), read \(String(describing: read))) with only messages moving")
    }

    private func enabledSteps() -> [Step] {
        var steps: [Step] = []
        for (index, connection) in connections.enumerated() {
            if connection.dialPending { steps.append(.completeDial(index)) }
            if !connection.forward.isEmpty, !connection.listenerClosed { steps.append(.deliverForward(index)) }
            if !connection.backward.isEmpty, !connection.dialerClosed { steps.append(.deliverBackward(index)) }
        }
        for index in failures.indices { steps.append(.failDial(index)) }
        for index in discoveries.indices { steps.append(.discover(index)) }
        for node in nodes.indices {
            for link in nodes[node].ready.sorted() { steps.append(.pull(node: node, link: link)) }
        }
        return steps
    }

    private mutating func perform(_ step: Step) {
        switch step {
        case .completeDial(let index):
            connections[index].dialPending = false
            let connection = connections[index]
            connections[index].forward.append(.established)
            apply(
                connection.dialer.node,
                nodes[connection.dialer.node].machine.linkEstablished(
                    connection.dialer.link, peer: peer(connection.listener.node), dialedLocally: true,
                    incarnation: incarnations[connection.listener.node], at: now))
        case .discover(let index):
            let discovery = discoveries.remove(at: index)
            found(discovery.node, discovery.found)
        case .failDial(let index):
            let failure = failures.remove(at: index)
            let refused = refusedDials.contains([failure.from, failure.to])
            apply(
                failure.from,
                nodes[failure.from].machine.dialFailed(
                    peer(failure.to), reason: refused ? "nothing listens (test)" : "unreachable (test)", refused: refused, at: now))
        case .deliverForward(let index):
            let item = connections[index].forward.removeFirst()
            deliver(item, to: connections[index].listener, from: connections[index].dialer, connection: index)
        case .deliverBackward(let index):
            let item = connections[index].backward.removeFirst()
            deliver(item, to: connections[index].dialer, from: connections[index].listener, connection: index)
        case .pull(let node, let link):
            guard let frame = nodes[node].machine.nextFrame(for: link) else {
                nodes[node].ready.remove(link)
                return
            }
            guard let index = connectionIndex(node, link) else { return }
            guard !connections[index].dialerClosed, !connections[index].listenerClosed else { return }
            if connections[index].dialer == End(node: node, link: link) {
                connections[index].forward.append(.frame(frame))
            } else {
                connections[index].backward.append(.frame(frame))
            }
        }
    }

    private mutating func deliver(_ item: Item, to end: End, from other: End, connection index: Int) {
        switch item {
        case .established:
            apply(
                end.node,
                nodes[end.node].machine.linkEstablished(
                    end.link, peer: peer(other.node), dialedLocally: false, incarnation: incarnations[other.node], at: now))
        case .frame(let frame):
            if droppedFrames.contains([other.node, end.node]) { return }
            if case .control(let message) = frame { controlLog.append(ControlDelivery(from: other.node, to: end.node, message: message)) }
            apply(end.node, nodes[end.node].machine.frameReceived(frame, on: end.link, at: now))
        case .closed(let code, let reason):
            if connections[index].dialer == end {
                connections[index].dialerClosed = true
                connections[index].backward = []
            } else {
                connections[index].listenerClosed = true
                connections[index].forward = []
            }
            nodes[end.node].ready.remove(end.link)
            apply(end.node, nodes[end.node].machine.linkClosed(end.link, code: code, reason: reason, at: now))
        }
    }

    // MARK: App calls

    mutating func invite(_ from: Int, _ to: Int, context: [UInt8] = [], timeout: Duration? = nil) throws -> InvitationID {
        let (id, actions) = try nodes[from].machine.invite(peer(to), context: context, timeout: timeout, at: now)
        apply(from, actions)
        return id
    }

    mutating func respond(_ node: Int, _ invitation: InvitationID, accept: Bool) throws {
        apply(node, try nodes[node].machine.respond(to: invitation, accept: accept, at: now))
    }

    mutating func send(_ node: Int, _ data: [UInt8], to targets: [Int], reliable: Bool = true) throws {
        apply(node, try nodes[node].machine.send(data, to: targets.map(peer), reliable: reliable))
    }

    mutating func disconnect(_ node: Int) {
        apply(node, nodes[node].machine.disconnect(at: now))
    }

    /// Node `node`'s process restarts: it leaves (`GO_AWAY` 0 on every link), a fresh machine
    /// with the same identity and a new incarnation takes its place, the others' discovery loses
    /// it and finds it again (unless `rediscovered` is false: the test reports what they see),
    /// and it finds them.
    mutating func restart(_ node: Int, policy: SessionPolicy, rediscovered: Bool = true) throws {
        disconnect(node)
        run()
        let session = SessionID(bytes: [UInt8](repeating: UInt8(node + 1), count: 16))!
        nodes[node].machine = try SessionStateMachine(localPeer: peer(node), serviceType: sessionTestService, policy: policy, sessionID: session)
        nodes[node].events = []
        nodes[node].ready = []
        incarnations[node] = .random()
        for other in nodes.indices where other != node {
            if rediscovered {
                apply(other, nodes[other].machine.peerLost(peer(node), at: now))
                discoveries.append((other, node))
            }
            discoveries.append((node, other))
        }
    }

    /// Every node will find every other, at random moments of the run.
    mutating func discoverEveryone() {
        for node in nodes.indices {
            for other in nodes.indices where other != node { discoveries.append((node, other)) }
        }
    }

    mutating func found(_ node: Int, _ other: Int) {
        apply(node, nodes[node].machine.peerFound(peer(other), at: now))
    }

    /// Closes both ends of the live link between two nodes as a transport failure would
    /// (each side reports it with `code`).
    mutating func breakLinks(between a: Int, and b: Int, code: GoAwayCode = .keepAliveTimeout) {
        for index in connections.indices {
            let connection = connections[index]
            let pair = Set([connection.dialer.node, connection.listener.node])
            guard pair == Set([a, b]), !connection.dialPending else { continue }
            if !connection.dialerClosed {
                connections[index].dialerClosed = true
                nodes[connection.dialer.node].ready.remove(connection.dialer.link)
                apply(
                    connection.dialer.node,
                    nodes[connection.dialer.node].machine.linkClosed(connection.dialer.link, code: code, reason: "test cut", at: now))
            }
            if !connection.listenerClosed {
                connections[index].listenerClosed = true
                nodes[connection.listener.node].ready.remove(connection.listener.link)
                apply(
                    connection.listener.node,
                    nodes[connection.listener.node].machine.linkClosed(connection.listener.link, code: code, reason: "test cut", at: now))
            }
            connections[index].forward = []
            connections[index].backward = []
        }
    }

    // MARK: What happened

    func events(_ node: Int) -> [SessionEvent] { nodes[node].events }

    func received(_ node: Int) -> [(from: Int, data: [UInt8], reliable: Bool)] {
        nodes[node].events.compactMap {
            if case .messageReceived(let peer, let data, let reliable) = $0 { return (index(of: peer), data, reliable) }
            return nil
        }
    }

    /// The invitations node has been shown, oldest first.
    func invitationsReceived(_ node: Int) -> [(id: InvitationID, from: Int, context: [UInt8])] {
        nodes[node].events.compactMap {
            if case .invitationReceived(let id, let peer, let context) = $0 { return (id, index(of: peer), context) }
            return nil
        }
    }

    func results(_ node: Int) -> [InvitationID: InvitationOutcome] {
        var results: [InvitationID: InvitationOutcome] = [:]
        for event in nodes[node].events {
            if case .invitationResult(let id, _, let outcome) = event {
                #expect(results[id] == nil, "\(id) got two results")
                results[id] = outcome
            }
        }
        return results
    }

    /// Every state the node reported for `other`, in order.
    func states(_ node: Int, of other: Int) -> [PeerState] {
        nodes[node].events.compactMap {
            if case .peerStateChanged(let peer, let state, _) = $0, peer == self.peer(other) { return state }
            return nil
        }
    }

    /// `(node, peer)` pairs that went from connected to anything else.
    func drops() -> [(node: Int, peer: Int)] {
        var found: [(Int, Int)] = []
        for node in nodes.indices {
            for other in nodes.indices where other != node {
                let states = states(node, of: other)
                for (before, after) in zip(states, states.dropFirst()) where before == .connected && after != .connected {
                    found.append((node, other))
                }
            }
        }
        return found
    }

    func notConnectedEvents(_ node: Int) -> Int {
        nodes[node].events.filter {
            if case .peerStateChanged(_, .notConnected, _) = $0 { return true }
            return false
        }.count
    }

    /// Live links between two nodes (established at both ends, not closed).
    func liveLinks(between a: Int, and b: Int) -> Int {
        connections.filter {
            Set([$0.dialer.node, $0.listener.node]) == Set([a, b]) && !$0.dialPending && !$0.dialerClosed && !$0.listenerClosed
        }.count
    }
}
