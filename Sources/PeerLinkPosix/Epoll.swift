#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
internal import CEpoll

/// epoll(7) and eventfd(2), for ``Readiness`` alone: the C header is imported here and in
/// Readiness.swift only.
extension Sys {
    /// A new epoll instance (close-on-exec).
    static func epollCreate() throws(SystemError) -> Int32 {
        try retrying("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) }
    }

    /// Arms `fd` in `epoll` for `events`, its registration kept: modified if it is there, added
    /// if it is not (a descriptor leaves an epoll set by itself when it is closed).
    static func epollArm(_ epoll: Int32, _ fd: Int32, events: UInt32) throws(SystemError) {
        var event = epoll_event()
        event.events = events
        event.data.fd = fd
        if epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event) == 0 { return }
        guard Glibc.errno == ENOENT else { throw SystemError("epoll_ctl", errno: Glibc.errno) }
        _ = try retrying("epoll_ctl") { epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) }
    }

    /// Waits for events of `epoll`, without a limit (or none at all with `block` false); 0 when
    /// a signal interrupted the wait.
    static func epollWait(_ epoll: Int32, into events: UnsafeMutableBufferPointer<epoll_event>, block: Bool = true) throws(SystemError) -> Int {
        let count = epoll_wait(epoll, events.baseAddress, Int32(events.count), block ? -1 : 0)
        if count >= 0 { return Int(count) }
        if Glibc.errno == EINTR { return 0 }
        throw SystemError("epoll_wait", errno: Glibc.errno)
    }

    /// A new eventfd (non-blocking, close-on-exec), counting from zero.
    static func eventCounter() throws(SystemError) -> Int32 {
        try retrying("eventfd") { eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC)) }
    }

    /// Adds one to the eventfd `fd` (which makes it readable); a counter already full stays so.
    static func signal(_ fd: Int32) {
        var one: UInt64 = 1
        _ = Glibc.write(fd, &one, 8)
    }

    /// Reads the eventfd `fd` back to zero (nothing when it is zero).
    static func drainCounter(_ fd: Int32) {
        var value: UInt64 = 0
        _ = Glibc.read(fd, &value, 8)
    }
}

// flock(2) comes through the same C module (the Glibc module does not bring it in).
extension Sys {
    /// An exclusive advisory lock on `fd`'s file without waiting: false when another open file
    /// description holds one.
    package static func tryLockExclusive(_ fd: Int32) throws(SystemError) -> Bool {
        while true {
            if peerlink_flock(fd, LOCK_EX | LOCK_NB) == 0 { return true }
            let code = Glibc.errno
            if code == EINTR { continue }
            if code == EWOULDBLOCK { return false }
            throw SystemError("flock", errno: code)
        }
    }
}
