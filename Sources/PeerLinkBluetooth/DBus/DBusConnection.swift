internal import CDBus
import Foundation
import PeerLinkCore
import PeerLinkPosix

/// An error reply (or a local failure) of a D-Bus call: the D-Bus error name and its text.
struct DBusCallError: Error, Hashable, Sendable, CustomStringConvertible {
    var name: String
    var message: String

    static let serviceUnknown = "org.freedesktop.DBus.Error.ServiceUnknown"
    static let nameHasNoOwner = "org.freedesktop.DBus.Error.NameHasNoOwner"
    static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
    static let noReply = "org.freedesktop.DBus.Error.NoReply"
    static let timeout = "org.freedesktop.DBus.Error.Timeout"
    static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
    static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
    static let noMemory = "org.freedesktop.DBus.Error.NoMemory"
    static let disconnected = "org.freedesktop.DBus.Error.Disconnected"

    var description: String { "\(name): \(message)" }

    /// The destination has no owner on the bus: the service is not running.
    var isServiceMissing: Bool { name == Self.serviceUnknown || name == Self.nameHasNoOwner }

    init(name: String, message: String) {
        self.name = name
        self.message = message
    }

    /// Takes the error out of a libdbus `DBusError` and frees it.
    init(taking error: inout DBusError) {
        name = error.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed"
        message = error.message.map { String(cString: $0) } ?? ""
        dbus_error_free(&error)
    }
}

/// A signal as delivered to a subscriber.
struct DBusSignal: Sendable {
    var sender: String
    var path: String
    var interface: String
    var member: String
    var arguments: [DBusValue]
}

/// A method call to an exported object, and how to answer it.
struct DBusMethodCall: Sendable {
    var path: String
    var interface: String
    var member: String
    var arguments: [DBusValue]
}

enum DBusReply: Sendable {
    case success([DBusValue])
    case error(name: String, message: String)
}

/// One private connection to a D-Bus bus through libdbus-1, with a dispatch thread for signals
/// and exported objects.
///
/// Method calls block the calling thread until the reply (libdbus, initialised for threads,
/// lets them run while the dispatch thread reads). The dispatch thread starts with the first
/// subscription or exported object and runs until ``close()``; signal handlers and exported
/// objects' handlers run on it, so they must return quickly.
final class DBusConnection: @unchecked Sendable {
    private let connection: OpaquePointer
    /// The connection's unique bus name (`:1.42`).
    let uniqueName: String
    private let lock = NSLock()
    private var subscriptions: [Int: Subscription] = [:]
    private var exported: [String: ExportedObject] = [:]
    /// Objects unexported while the dispatch thread may still run their handler: released once
    /// it stopped (``close()``, or `deinit` when the last handler closed the connection).
    private var retired: [ExportedObject] = []
    /// The dispatch thread will run no handler any more: unexported objects go at once.
    private var handlersOver = false
    private var nextToken = 0
    private var thread: Thread?
    private var stopping = false
    private var closed = false
    private let stopped = DispatchSemaphore(value: 0)

    struct Match: Hashable, Sendable {
        var sender: String?
        var interface: String
        var member: String?
        var path: String?
        /// Matches the path and every path below it.
        var pathNamespace: String?

        /// The bus-side match rule.
        var rule: String {
            var parts = ["type='signal'", "interface='\(interface)'"]
            if let sender { parts.append("sender='\(sender)'") }
            if let member { parts.append("member='\(member)'") }
            if let path { parts.append("path='\(path)'") }
            if let pathNamespace { parts.append("path_namespace='\(pathNamespace)'") }
            return parts.joined(separator: ",")
        }

        func matches(_ signal: DBusSignal) -> Bool {
            guard signal.interface == interface else { return false }
            if let member, member != signal.member { return false }
            if let path, path != signal.path { return false }
            if let pathNamespace, pathNamespace != "/",
                signal.path != pathNamespace, !signal.path.hasPrefix(pathNamespace + "/")
            {
                return false
            }
            return true
        }
    }

    private struct Subscription {
        var match: Match
        var handler: @Sendable (DBusSignal) -> Void
    }

    fileprivate final class ExportedObject {
        let handler: @Sendable (DBusMethodCall) -> DBusReply
        init(handler: @escaping @Sendable (DBusMethodCall) -> DBusReply) { self.handler = handler }
    }

    /// The system bus libdbus connects to (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket).
    static var systemBusAddress: String {
        ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"] ?? "unix:path=/run/dbus/system_bus_socket"
    }

    /// Connects to the system bus. Throws `unavailable` saying how to start D-Bus when it does not answer.
    static func system() throws(PeerLinkError) -> DBusConnection {
        try open(address: systemBusAddress)
    }

    /// Connects to the bus at `address` (`unix:path=...`) and registers on it.
    static func open(address: String) throws(PeerLinkError) -> DBusConnection {
        _ = threadsReady
        var error = DBusError()
        dbus_error_init(&error)
        guard let connection = dbus_connection_open_private(address, &error) else {
            let failure = DBusCallError(taking: &error)
            throw PeerLinkError(.unavailable, "the D-Bus system bus at \(address) does not answer (\(failure.message)). Start it with 'sudo systemctl start dbus' (without systemd: 'sudo Hardware/daemons.sh start' from the PeerLink repository)")
        }
        dbus_connection_set_exit_on_disconnect(connection, 0)
        guard dbus_bus_register(connection, &error) != 0 else {
            let failure = DBusCallError(taking: &error)
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            if failure.name == DBusCallError.accessDenied {
                throw PeerLinkError(.unavailable, "the D-Bus bus at \(address) refused this user (\(failure.message)): check the bus's policy files in /etc/dbus-1/system.d")
            }
            throw PeerLinkError(.unavailable, "cannot register on the D-Bus bus at \(address): \(failure.message)")
        }
        let unique = dbus_bus_get_unique_name(connection).map { String(cString: $0) } ?? ""
        let result = DBusConnection(connection: connection, uniqueName: unique)
        guard dbus_connection_add_filter(connection, signalFilter, Unmanaged.passUnretained(result).toOpaque(), nil) != 0 else {
            throw PeerLinkError(.unknown, "cannot install the D-Bus signal filter (out of memory)")
        }
        return result
    }

    /// libdbus must know threads are in use before its first object is made.
    private static let threadsReady: Bool = dbus_threads_init_default() != 0

    private init(connection: OpaquePointer, uniqueName: String) {
        self.connection = connection
        self.uniqueName = uniqueName
    }

    deinit {
        close()
        releaseRetired()
        dbus_connection_remove_filter(connection, signalFilter, Unmanaged.passUnretained(self).toOpaque())
        dbus_connection_unref(connection)
    }

    /// Stops the dispatch thread and closes the connection. Idempotent. Bus-side state of this
    /// connection (exported objects, match rules, names) goes with it.
    func close() {
        let (wasClosed, running, onDispatchThread) = lock.withLock { () -> (Bool, Bool, Bool) in
            defer {
                closed = true
                stopping = true
            }
            return (closed, thread != nil, thread === Thread.current)
        }
        if wasClosed { return }
        if running && !onDispatchThread { stopped.wait() }
        dbus_connection_close(connection)
        // A handler that closed the connection is still running: deinit releases them then.
        if !onDispatchThread { releaseRetired() }
    }

    private func releaseRetired() {
        let objects = lock.withLock { () -> [ExportedObject] in
            handlersOver = true
            defer { retired = [] }
            return retired
        }
        for object in objects { Unmanaged.passUnretained(object).release() }
    }

    // MARK: Method calls

    /// Calls a method and waits for its reply (at most `timeout`).
    func call(
        destination: String, path: String, interface: String, method: String,
        _ arguments: [DBusValue] = [], timeout: Duration = .seconds(25)
    ) throws(DBusCallError) -> [DBusValue] {
        guard let message = dbus_message_new_method_call(destination, path, interface, method) else {
            throw DBusCallError(name: DBusCallError.noMemory, message: "cannot create a D-Bus message")
        }
        defer { dbus_message_unref(message) }
        guard DBusMessageCodec.append(arguments, to: message) else {
            throw DBusCallError(name: DBusCallError.noMemory, message: "cannot append the arguments of \(interface).\(method)")
        }
        var error = DBusError()
        dbus_error_init(&error)
        let milliseconds = Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        guard let reply = dbus_connection_send_with_reply_and_block(connection, message, milliseconds, &error) else {
            throw DBusCallError(taking: &error)
        }
        defer { dbus_message_unref(reply) }
        return DBusMessageCodec.arguments(of: reply)
    }

    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"

    /// `org.freedesktop.DBus.Properties.Get`.
    func property(destination: String, path: String, interface: String, name: String) throws(DBusCallError) -> DBusValue {
        let reply = try call(destination: destination, path: path, interface: Self.propertiesInterface, method: "Get", [.string(interface), .string(name)])
        guard let value = reply.first else {
            throw DBusCallError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "Get \(interface).\(name) returned nothing")
        }
        return value.unwrapped
    }

    /// `org.freedesktop.DBus.Properties.Set`.
    func setProperty(destination: String, path: String, interface: String, name: String, _ value: DBusValue) throws(DBusCallError) {
        _ = try call(destination: destination, path: path, interface: Self.propertiesInterface, method: "Set", [.string(interface), .string(name), .variant(value)])
    }

    /// `org.freedesktop.DBus.Properties.GetAll`, variants unwrapped.
    func properties(destination: String, path: String, interface: String) throws(DBusCallError) -> [String: DBusValue] {
        let reply = try call(destination: destination, path: path, interface: Self.propertiesInterface, method: "GetAll", [.string(interface)])
        return (reply.first?.dictionary ?? [:]).mapValues(\.unwrapped)
    }

    /// `org.freedesktop.DBus.ObjectManager.GetManagedObjects`: object path → interface → property → value.
    func managedObjects(destination: String, path: String = "/") throws(DBusCallError) -> [String: [String: [String: DBusValue]]] {
        let reply = try call(destination: destination, path: path, interface: Self.objectManagerInterface, method: "GetManagedObjects")
        var objects: [String: [String: [String: DBusValue]]] = [:]
        for (objectPath, interfaces) in reply.first?.dictionary ?? [:] {
            var byInterface: [String: [String: DBusValue]] = [:]
            for (interface, properties) in interfaces.dictionary ?? [:] {
                byInterface[interface] = (properties.dictionary ?? [:]).mapValues(\.unwrapped)
            }
            objects[objectPath] = byInterface
        }
        return objects
    }

    // MARK: Signals

    /// Delivers matching signals to `handler` on the dispatch thread until ``unsubscribe(_:)``.
    func subscribe(_ match: Match, handler: @escaping @Sendable (DBusSignal) -> Void) throws(DBusCallError) -> Int {
        var error = DBusError()
        dbus_error_init(&error)
        dbus_bus_add_match(connection, match.rule, &error)
        if dbus_error_is_set(&error) != 0 { throw DBusCallError(taking: &error) }
        let token = lock.withLock { () -> Int in
            nextToken += 1
            subscriptions[nextToken] = Subscription(match: match, handler: handler)
            return nextToken
        }
        startDispatching()
        return token
    }

    /// Sends a signal from `path`.
    func emit(path: String, interface: String, member: String, _ arguments: [DBusValue] = []) throws(DBusCallError) {
        guard let message = dbus_message_new_signal(path, interface, member) else {
            throw DBusCallError(name: DBusCallError.noMemory, message: "cannot create a D-Bus signal")
        }
        defer { dbus_message_unref(message) }
        guard DBusMessageCodec.append(arguments, to: message), dbus_connection_send(connection, message, nil) != 0 else {
            throw DBusCallError(name: DBusCallError.noMemory, message: "cannot send the signal \(interface).\(member)")
        }
        dbus_connection_flush(connection)
    }

    func unsubscribe(_ token: Int) {
        guard let subscription = lock.withLock({ subscriptions.removeValue(forKey: token) }) else { return }
        // No reply wanted: a NULL error makes the call asynchronous.
        dbus_bus_remove_match(connection, subscription.match.rule, nil)
        dbus_connection_flush(connection)
    }

    fileprivate func deliver(_ signal: DBusSignal) {
        let handlers = lock.withLock { subscriptions.values.filter { $0.match.matches(signal) }.map(\.handler) }
        for handler in handlers { handler(signal) }
    }

    // MARK: Exported objects

    /// Answers method calls to `path` with `handler` (on the dispatch thread) until ``unexport(path:)``.
    func export(path: String, handler: @escaping @Sendable (DBusMethodCall) -> DBusReply) throws(DBusCallError) {
        let object = ExportedObject(handler: handler)
        var vtable = DBusObjectPathVTable()
        vtable.message_function = objectMessageFunction
        var error = DBusError()
        dbus_error_init(&error)
        let context = Unmanaged.passRetained(object).toOpaque()
        guard dbus_connection_try_register_object_path(connection, path, &vtable, context, &error) != 0 else {
            Unmanaged<ExportedObject>.fromOpaque(context).release()
            throw DBusCallError(taking: &error)
        }
        lock.withLock { exported[path] = object }
        startDispatching()
    }

    /// Stops answering calls to `path`. The handler may still be running on the dispatch thread
    /// (libdbus hands it the object before this unregisters it): the object is kept until
    /// ``close()`` has stopped that thread.
    func unexport(path: String) {
        let taken = lock.withLock { () -> (object: ExportedObject, releaseNow: Bool)? in
            guard let object = exported.removeValue(forKey: path) else { return nil }
            if !handlersOver { retired.append(object) }
            return (object, handlersOver)
        }
        guard let taken else { return }
        dbus_connection_unregister_object_path(connection, path)
        if taken.releaseNow { Unmanaged.passUnretained(taken.object).release() }
    }

    // MARK: Dispatch thread

    private func startDispatching() {
        let start = lock.withLock { () -> Bool in
            guard thread == nil, !stopping else { return false }
            let thread = Thread { [unowned self] in
                Sys.nameCurrentThread("peerlink-dbus")
                self.dispatchLoop()
            }
            self.thread = thread
            return true
        }
        if start { lock.withLock { thread }?.start() }
    }

    private func dispatchLoop() {
        // A short poll: a method call from another thread waits for the I/O path at most this long.
        while !lock.withLock({ stopping }) {
            if dbus_connection_read_write_dispatch(connection, 20) == 0 { break }  // disconnected
        }
        stopped.signal()
    }
}

/// libdbus filter: every incoming message passes here on the dispatch thread.
private func signalFilter(_ connection: OpaquePointer?, _ message: OpaquePointer?, _ context: UnsafeMutableRawPointer?) -> DBusHandlerResult {
    guard let message, let context, dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_SIGNAL else {
        return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
    }
    let owner = Unmanaged<DBusConnection>.fromOpaque(context).takeUnretainedValue()
    func text(_ pointer: UnsafePointer<CChar>?) -> String { pointer.map { String(cString: $0) } ?? "" }
    let signal = DBusSignal(
        sender: text(dbus_message_get_sender(message)), path: text(dbus_message_get_path(message)),
        interface: text(dbus_message_get_interface(message)), member: text(dbus_message_get_member(message)),
        arguments: DBusMessageCodec.arguments(of: message))
    owner.deliver(signal)
    return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
}

/// libdbus object-path handler: a method call to an exported object.
private func objectMessageFunction(_ connection: OpaquePointer?, _ message: OpaquePointer?, _ context: UnsafeMutableRawPointer?) -> DBusHandlerResult {
    guard let connection, let message, let context, dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_METHOD_CALL else {
        return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
    }
    let object = Unmanaged<DBusConnection.ExportedObject>.fromOpaque(context).takeUnretainedValue()
    func text(_ pointer: UnsafePointer<CChar>?) -> String { pointer.map { String(cString: $0) } ?? "" }
    let call = DBusMethodCall(
        path: text(dbus_message_get_path(message)), interface: text(dbus_message_get_interface(message)),
        member: text(dbus_message_get_member(message)), arguments: DBusMessageCodec.arguments(of: message))
    let reply: OpaquePointer?
    switch object.handler(call) {
    case .success(let values):
        reply = dbus_message_new_method_return(message)
        if let reply { DBusMessageCodec.append(values, to: reply) }
    case .error(let name, let text):
        reply = dbus_message_new_error(message, name, text)
    }
    if dbus_message_get_no_reply(message) == 0, let reply {
        dbus_connection_send(connection, reply, nil)
    }
    if let reply { dbus_message_unref(reply) }
    return DBUS_HANDLER_RESULT_HANDLED
}
