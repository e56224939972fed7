internal import CAvahi
import Foundation
import Logging
import PeerLinkCore

/// One connection to avahi-daemon: an Avahi client driven by Avahi's own poll thread.
///
/// Every call into libavahi-client from another thread holds the poll lock (``withLock(_:)``);
/// Avahi's callbacks run on the poll thread with the lock already held. The client is created
/// with `AVAHI_CLIENT_NO_FAIL`, so when the daemon restarts it reconnects by itself; publishers
/// and browsers watch the client state and rebuild their objects when it runs again.
final class AvahiContext: @unchecked Sendable {
    typealias StateObserver = (AvahiClientState) -> Void

    let poll: OpaquePointer
    private(set) var client: OpaquePointer?
    let logger: Logger
    /// Observers of the client state, touched only on the poll thread or with the lock held.
    private var observers: [ObjectIdentifier: StateObserver] = [:]
    private var lastState: AvahiClientState = AVAHI_CLIENT_CONNECTING
    private var started = false
    private var reconnecting = false

    private init(poll: OpaquePointer, logger: Logger) {
        self.poll = poll
        self.logger = logger
    }

    /// Connects to avahi-daemon. Throws `unavailable` with what to do when it is not running.
    static func connect(logger: Logger) throws(PeerLinkError) -> AvahiContext {
        guard let poll = avahi_threaded_poll_new() else {
            throw PeerLinkError(.unknown, "cannot create the Avahi event loop (out of memory?)")
        }
        // From here on, deinit frees whatever the context owns, on every path.
        let context = AvahiContext(poll: poll, logger: logger)
        var error: Int32 = 0
        let asked = ContinuousClock.now
        guard context.makeClient(&error) else {
            throw PeerLinkError(.unavailable, busUnreachableMessage(String(cString: avahi_strerror(error))))
        }
        // With NO_FAIL a missing daemon leaves the client waiting in CONNECTING; at start-up that
        // means the daemon is not running — found at once — or that it holds its bus name and
        // never answered (a hung or stopped daemon), found when libdbus gave up on the reply.
        if context.lastState == AVAHI_CLIENT_CONNECTING {
            let waited = asked.duration(to: .now)
            throw PeerLinkError(.unavailable, waited >= unansweredAfter ? hungDaemonMessage(waited: waited) : missingDaemonMessage())
        }
        guard avahi_threaded_poll_start(poll) == 0 else {
            throw PeerLinkError(.unknown, "cannot start the Avahi event thread")
        }
        context.started = true
        return context
    }

    /// Creates the client (NO_FAIL: it waits for a missing daemon instead of failing).
    private func makeClient(_ error: inout Int32) -> Bool {
        client = nil
        let created = avahi_client_new(
            avahi_threaded_poll_get(poll), AVAHI_CLIENT_NO_FAIL, avahiClientCallback,
            Unmanaged.passUnretained(self).toOpaque(), &error)
        guard let created else { return false }
        client = created
        lastState = avahi_client_get_state(created)
        return true
    }

    static let daemonAdvice =
        "Start it with 'sudo systemctl start avahi-daemon' (on a machine without systemd: 'sudo Hardware/daemons.sh start' from the PeerLink repository)"

    /// The system bus address libdbus uses.
    static var systemBusAddress: String {
        ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"] ?? "unix:path=/run/dbus/system_bus_socket"
    }

    static func busUnreachableMessage(_ detail: String) -> String {
        "avahi-daemon cannot be reached: the system D-Bus at \(systemBusAddress) does not answer (\(detail)). Start D-Bus and avahi-daemon with 'sudo systemctl start dbus avahi-daemon' (without systemd: 'sudo Hardware/daemons.sh start' from the PeerLink repository)"
    }

    static func missingDaemonMessage() -> String {
        "avahi-daemon is not running. \(daemonAdvice)"
    }

    /// How long a client's start may wait before it says the daemon hangs rather than that it
    /// is missing: a missing daemon is known in milliseconds, a silent one when libdbus stops
    /// waiting for the reply (25 s).
    static let unansweredAfter: Duration = .seconds(10)

    static func hungDaemonMessage(waited: Duration) -> String {
        "avahi-daemon does not answer: it holds its D-Bus name but gave no reply in \(waited.components.seconds) s (it hangs, or was stopped). "
            + "Restart it with 'sudo systemctl restart avahi-daemon' (on a machine without systemd: stop it and run 'sudo Hardware/daemons.sh start' from the PeerLink repository)"
    }

    deinit {
        if started { avahi_threaded_poll_stop(poll) }
        if let client { avahi_client_free(client) }
        avahi_threaded_poll_free(poll)
    }

    /// Runs `body` holding the poll lock. Never call from an Avahi callback (the lock is held there).
    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        return try body()
    }

    /// The client state; with the lock held or on the poll thread.
    var state: AvahiClientState { lastState }

    /// Adds an observer of client state changes; with the lock held or on the poll thread.
    func observe(_ owner: AnyObject, _ observer: @escaping StateObserver) {
        observers[ObjectIdentifier(owner)] = observer
    }

    func stopObserving(_ owner: AnyObject) {
        observers[ObjectIdentifier(owner)] = nil
    }

    /// The error of the last failed call, as text.
    var lastError: String {
        guard let client else { return "no client" }
        return String(cString: avahi_strerror(avahi_client_errno(client)))
    }

    fileprivate func clientChanged(_ client: OpaquePointer?, _ state: AvahiClientState) {
        // During avahi_client_new the callback runs before `self.client` is set.
        if self.client == nil { self.client = client }
        if state == AVAHI_CLIENT_FAILURE, let client, avahi_client_errno(client) == AVAHI_ERR_DISCONNECTED {
            // The daemon went away. libavahi-client only waits for a daemon that is missing at
            // start; a running one that leaves takes the client down with it. Tell everyone the
            // daemon is gone (they drop their entry groups and browsers), then build a new client
            // that waits for the daemon to come back; the client cannot be freed from its own
            // callback, so that happens in a moment on this same thread.
            logger.info("avahi-daemon went away; waiting for it to come back")
            notify(AVAHI_CLIENT_CONNECTING)
            scheduleReconnect()
            return
        }
        switch state {
        case AVAHI_CLIENT_S_RUNNING: logger.debug("avahi client running")
        case AVAHI_CLIENT_CONNECTING: logger.info("waiting for avahi-daemon")
        case AVAHI_CLIENT_FAILURE: logger.warning("avahi client failed: \(lastError)")
        default: break
        }
        notify(state)
    }

    private func notify(_ state: AvahiClientState) {
        guard state != lastState else { return }
        lastState = state
        for observer in observers.values { observer(state) }
    }

    private func scheduleReconnect() {
        guard !reconnecting else { return }
        reconnecting = true
        _ = peerlink_avahi_schedule(avahi_threaded_poll_get(poll), 0, avahiReconnectCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    fileprivate func reconnect(_ timeout: OpaquePointer?) {
        if let timeout { peerlink_avahi_timeout_free(avahi_threaded_poll_get(poll), timeout) }
        reconnecting = false
        if let client { avahi_client_free(client) }
        client = nil
        var error: Int32 = 0
        if makeClient(&error) {
            // The new client may already run (a quick restart); observers rebuild on RUNNING.
            let state = lastState
            lastState = AVAHI_CLIENT_CONNECTING
            notify(state)
        } else {
            logger.warning("cannot reconnect to avahi-daemon: \(String(cString: avahi_strerror(error))); trying again in 1 s")
            reconnecting = true
            _ = peerlink_avahi_schedule(avahi_threaded_poll_get(poll), 1000, avahiReconnectCallback, Unmanaged.passUnretained(self).toOpaque())
        }
    }
}

private func avahiClientCallback(_ client: OpaquePointer?, _ state: AvahiClientState, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    Unmanaged<AvahiContext>.fromOpaque(userdata).takeUnretainedValue().clientChanged(client, state)
}

private func avahiReconnectCallback(_ timeout: OpaquePointer?, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    Unmanaged<AvahiContext>.fromOpaque(userdata).takeUnretainedValue().reconnect(timeout)
}

/// The state of avahi-daemon as this machine's tools report it.
public struct AvahiDaemonStatus: Sendable, Hashable, Codable {
    public var running: Bool
    /// The daemon's host name (e.g. `raspberrypi.local`) when it runs.
    public var hostName: String?
    public var version: String?
    /// What is wrong and what to do, when it does not run.
    public var problem: String?

    /// Asks the daemon.
    public static func query() -> AvahiDaemonStatus {
        do {
            let context = try AvahiContext.connect(logger: Logger(label: "peerlink.lan"))
            return context.withLock {
                guard let client = context.client else {
                    return AvahiDaemonStatus(running: false, hostName: nil, version: nil, problem: AvahiContext.missingDaemonMessage())
                }
                return AvahiDaemonStatus(
                    running: true,
                    hostName: avahi_client_get_host_name_fqdn(client).map { String(cString: $0) },
                    version: avahi_client_get_version_string(client).map { String(cString: $0) },
                    problem: nil)
            }
        } catch {
            return AvahiDaemonStatus(running: false, hostName: nil, version: nil, problem: error.message)
        }
    }
}
