internal import CAvahi
import Foundation
import Logging

/// What a DNS-SD browse reports, before PeerLink interprets the TXT record.
enum BrowserEvent: Sendable, Equatable {
    /// A service instance was resolved (or resolved again with new data).
    case resolved(source: String, name: String, host: String, address: String, port: UInt16, txt: [[UInt8]])
    /// A service instance went away.
    case removed(source: String)
    /// Avahi has reported what it knows for now.
    case allForNow
    /// Browsing failed; the browser is restarted when the daemon runs again.
    case failed(String)
}

/// Browses one DNS-SD service type through Avahi and keeps a resolver on every instance found,
/// so address, port and TXT changes are reported too. Survives daemon restarts: it browses again
/// when the client runs again, and instances not seen again are reported removed.
final class AvahiBrowser: @unchecked Sendable {
    let context: AvahiContext
    let type: String
    let onEvent: @Sendable (BrowserEvent) -> Void
    /// Touched with the poll lock held, or on the poll thread.
    private var browser: OpaquePointer?
    private var resolvers: [String: OpaquePointer] = [:]
    /// Instances known before a daemon restart and not yet seen again.
    private var stale: Set<String> = []
    private var stopped = false

    init(context: AvahiContext, type: String, onEvent: @escaping @Sendable (BrowserEvent) -> Void) {
        self.context = context
        self.type = type
        self.onEvent = onEvent
    }

    func start() {
        context.withLock {
            context.observe(self) { [unowned self] state in self.clientStateChanged(state) }
            if context.state == AVAHI_CLIENT_S_RUNNING || context.state == AVAHI_CLIENT_S_REGISTERING {
                browse()
            }
        }
    }

    func stop() {
        context.withLock {
            stopped = true
            context.stopObserving(self)
            freeAll()
        }
    }

    deinit {
        if !stopped { stop() }
    }

    private func freeAll() {
        for resolver in resolvers.values { avahi_service_resolver_free(resolver) }
        resolvers = [:]
        if let browser { avahi_service_browser_free(browser) }
        browser = nil
    }

    private func clientStateChanged(_ state: AvahiClientState) {
        guard !stopped else { return }
        switch state {
        case AVAHI_CLIENT_S_RUNNING:
            if browser == nil { browse() }
        case AVAHI_CLIENT_CONNECTING:
            // The daemon is gone, and with it our browser and resolvers. Keep what we knew; what
            // is not seen again once the daemon is back is reported removed then.
            stale.formUnion(resolvers.keys)
            freeAll()
        case AVAHI_CLIENT_FAILURE:
            onEvent(.failed("avahi client failed: \(context.lastError)"))
        default:
            break
        }
    }

    private func browse() {
        guard let client = context.client else { return }
        browser = avahi_service_browser_new(
            client, peerlink_avahi_if_unspec(), peerlink_avahi_proto_unspec(), type, nil, AvahiLookupFlags(0),
            avahiBrowseCallback, Unmanaged.passUnretained(self).toOpaque())
        if browser == nil {
            onEvent(.failed("cannot browse \(type): \(context.lastError)"))
        }
    }

    static func source(interface: AvahiIfIndex, protocol: AvahiProtocol, name: String, domain: String) -> String {
        "\(interface)/\(`protocol`)/\(domain)/\(name)"
    }

    fileprivate func browseEvent(
        interface: AvahiIfIndex, protocol: AvahiProtocol, event: AvahiBrowserEvent,
        name: String, type: String, domain: String
    ) {
        guard !stopped else { return }
        let key = Self.source(interface: interface, protocol: `protocol`, name: name, domain: domain)
        switch event {
        case AVAHI_BROWSER_NEW:
            stale.remove(key)
            guard resolvers[key] == nil, let client = context.client else { return }
            // The address asked for is of the family the instance was seen over (`protocol`, not
            // "any"): a peer heard over IPv4 multicast takes IPv4 connections on that link, where
            // "any" let avahi answer with whichever of the host's addresses came first — its IPv6
            // one too, on which a peer listening on IPv4 alone is never reached (seen on loopback
            // after avahi-daemon started: ::1 for a listener on 127.0.0.1). A dual-stack peer is
            // seen over both, once each, and known at both addresses.
            let resolver = avahi_service_resolver_new(
                client, interface, `protocol`, name, type, domain, `protocol`, AvahiLookupFlags(0),
                avahiResolveCallback, Unmanaged.passUnretained(self).toOpaque())
            if let resolver {
                resolvers[key] = resolver
            } else {
                context.logger.debug("cannot resolve \(name): \(context.lastError)")
            }
        case AVAHI_BROWSER_REMOVE:
            if let resolver = resolvers.removeValue(forKey: key) { avahi_service_resolver_free(resolver) }
            onEvent(.removed(source: key))
        case AVAHI_BROWSER_ALL_FOR_NOW:
            for key in stale { onEvent(.removed(source: key)) }
            stale = []
            onEvent(.allForNow)
        case AVAHI_BROWSER_FAILURE:
            onEvent(.failed("browsing \(type) failed: \(context.lastError)"))
        default:
            break
        }
    }

    fileprivate func resolveEvent(
        interface: AvahiIfIndex, protocol: AvahiProtocol, event: AvahiResolverEvent,
        name: String, domain: String, host: String, address: UnsafePointer<AvahiAddress>?, port: UInt16,
        txt: UnsafeMutablePointer<AvahiStringList>?
    ) {
        guard !stopped else { return }
        let key = Self.source(interface: interface, protocol: `protocol`, name: name, domain: domain)
        guard event == AVAHI_RESOLVER_FOUND, let address else {
            context.logger.debug("resolving \(name) failed: \(context.lastError)")
            return
        }
        var buffer = [CChar](repeating: 0, count: Int(AVAHI_ADDRESS_STR_MAX))
        avahi_address_snprint(&buffer, buffer.count, address)
        var text = String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
        if address.pointee.proto == AVAHI_PROTO_INET6, text.lowercased().hasPrefix("fe80:") {
            var name = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
            if if_indextoname(UInt32(interface), &name) != nil {
                text += "%" + String(decoding: name.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self)
            }
        }
        var strings: [[UInt8]] = []
        var cursor = txt
        while let entry = cursor {
            let size = avahi_string_list_get_size(entry)
            if let bytes = avahi_string_list_get_text(entry) {
                strings.append(Array(UnsafeBufferPointer(start: bytes, count: size)))
            }
            cursor = avahi_string_list_get_next(entry)
        }
        onEvent(.resolved(source: key, name: name, host: host, address: text, port: port, txt: strings))
    }
}

private func avahiBrowseCallback(
    _ browser: OpaquePointer?, _ interface: AvahiIfIndex, _ protocol: AvahiProtocol, _ event: AvahiBrowserEvent,
    _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?,
    _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?
) {
    guard let userdata else { return }
    Unmanaged<AvahiBrowser>.fromOpaque(userdata).takeUnretainedValue().browseEvent(
        interface: interface, protocol: `protocol`, event: event,
        name: name.map { String(cString: $0) } ?? "", type: type.map { String(cString: $0) } ?? "",
        domain: domain.map { String(cString: $0) } ?? "")
}

private func avahiResolveCallback(
    _ resolver: OpaquePointer?, _ interface: AvahiIfIndex, _ protocol: AvahiProtocol, _ event: AvahiResolverEvent,
    _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?,
    _ host: UnsafePointer<CChar>?, _ address: UnsafePointer<AvahiAddress>?, _ port: UInt16,
    _ txt: UnsafeMutablePointer<AvahiStringList>?, _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?
) {
    guard let userdata else { return }
    Unmanaged<AvahiBrowser>.fromOpaque(userdata).takeUnretainedValue().resolveEvent(
        interface: interface, protocol: `protocol`, event: event,
        name: name.map { String(cString: $0) } ?? "", domain: domain.map { String(cString: $0) } ?? "",
        host: host.map { String(cString: $0) } ?? "", address: address, port: port, txt: txt)
}
