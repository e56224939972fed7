internal import CAvahi
import Foundation
import Logging

/// What happens to a published service.
enum PublisherEvent: Sendable, Equatable {
    /// The service is on the network under this instance name.
    case established(name: String)
    /// Another service had the name; the service is being published again under a new one.
    case renamed(from: String, to: String)
    /// avahi-daemon went away; the service is published again when it returns.
    case daemonLost
    /// Publishing failed for good.
    case failed(String)
}

/// Publishes one DNS-SD service through an Avahi entry group, and keeps it published: a name
/// collision picks Avahi's alternative name, a daemon restart publishes again. ``stop()``
/// withdraws it (the daemon sends goodbye packets).
final class AvahiPublisher: @unchecked Sendable {
    let context: AvahiContext
    let type: String
    let port: UInt16
    let txt: [[UInt8]]
    let onEvent: @Sendable (PublisherEvent) -> Void
    /// Touched with the poll lock held, or on the poll thread.
    private(set) var name: String
    private var group: OpaquePointer?
    private var stopped = false

    init(context: AvahiContext, name: String, type: String, port: UInt16, txt: [[UInt8]], onEvent: @escaping @Sendable (PublisherEvent) -> Void) {
        self.context = context
        self.name = name
        self.type = type
        self.port = port
        self.txt = txt
        self.onEvent = onEvent
    }

    /// Starts publishing (asynchronously: the outcome arrives as events).
    func start() {
        context.withLock {
            context.observe(self) { [unowned self] state in self.clientStateChanged(state) }
            if context.state == AVAHI_CLIENT_S_RUNNING { register() }
        }
    }

    /// Withdraws the service.
    func stop() {
        context.withLock {
            stopped = true
            context.stopObserving(self)
            if let group {
                avahi_entry_group_free(group)
                self.group = nil
            }
        }
    }

    deinit {
        if !stopped { stop() }
    }

    private func clientStateChanged(_ state: AvahiClientState) {
        guard !stopped else { return }
        switch state {
        case AVAHI_CLIENT_S_RUNNING:
            register()
        case AVAHI_CLIENT_S_COLLISION, AVAHI_CLIENT_S_REGISTERING:
            // The host name is changing; the records are withdrawn and added again once it runs.
            if let group { avahi_entry_group_reset(group) }
        case AVAHI_CLIENT_CONNECTING:
            // The daemon is gone and with it the group; forget it and publish again on return.
            if let group { avahi_entry_group_free(group) }
            group = nil
            onEvent(.daemonLost)
        case AVAHI_CLIENT_FAILURE:
            onEvent(.failed("avahi client failed: \(context.lastError)"))
        default:
            break
        }
    }

    /// Creates the group if needed and adds the service; on the poll thread or with the lock.
    private func register() {
        guard let client = context.client else { return }
        if group == nil {
            group = avahi_entry_group_new(client, avahiGroupCallback, Unmanaged.passUnretained(self).toOpaque())
            guard group != nil else {
                onEvent(.failed("cannot create an Avahi entry group: \(context.lastError)"))
                return
            }
        }
        guard let group, avahi_entry_group_is_empty(group) != 0 else { return }
        var list: UnsafeMutablePointer<AvahiStringList>? = nil
        for string in txt.reversed() {  // the list is built by prepending
            list = string.withUnsafeBufferPointer { avahi_string_list_add_arbitrary(list, $0.baseAddress, $0.count) }
        }
        defer { avahi_string_list_free(list) }
        var result = avahi_entry_group_add_service_strlst(
            group, peerlink_avahi_if_unspec(), peerlink_avahi_proto_unspec(), AvahiPublishFlags(0),
            name, type, nil, nil, port, list)
        if result == AVAHI_ERR_COLLISION {
            // A local service of ours already has the name: pick the next one and try again.
            rename()
            return
        }
        if result == 0 { result = avahi_entry_group_commit(group) }
        if result < 0 {
            onEvent(.failed("cannot publish \(name) as \(type): \(String(cString: avahi_strerror(result)))"))
        }
    }

    private func rename() {
        let old = name
        if let alternative = avahi_alternative_service_name(old) {
            name = String(cString: alternative)
            avahi_free(alternative)
        }
        context.logger.info("service name collision, renamed", metadata: ["from": "\(old)", "to": "\(name)"])
        onEvent(.renamed(from: old, to: name))
        if let group { avahi_entry_group_reset(group) }
        register()
    }

    fileprivate func groupChanged(_ group: OpaquePointer?, _ state: AvahiEntryGroupState) {
        guard !stopped else { return }
        switch state {
        case AVAHI_ENTRY_GROUP_ESTABLISHED:
            onEvent(.established(name: name))
        case AVAHI_ENTRY_GROUP_COLLISION:
            rename()
        case AVAHI_ENTRY_GROUP_FAILURE:
            onEvent(.failed("publishing \(name) failed: \(context.lastError)"))
        default:
            break
        }
    }
}

private func avahiGroupCallback(_ group: OpaquePointer?, _ state: AvahiEntryGroupState, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    Unmanaged<AvahiPublisher>.fromOpaque(userdata).takeUnretainedValue().groupChanged(group, state)
}
