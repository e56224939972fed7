#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A value that only the holder of its lock may touch: PeerLink's one lock type.
///
/// It is a POSIX mutex (error-checking) rather than the standard library's `Mutex`: on Linux
/// `Mutex` is a bare futex, which ThreadSanitizer cannot see, so a TSan run of the suites
/// reported every access made under a lock as a race. A pthread mutex is what TSan (and
/// helgrind) understand, and uncontended it costs the same two atomic operations.
///
/// Taking the lock again on the thread that holds it stops the process with a message (it
/// would otherwise deadlock without a word): a lock is never held across a call that could
/// come back to it, and tests rely on this to prove it.
public final class Locked<Value>: @unchecked Sendable {
    @usableFromInline let mutex: UnsafeMutablePointer<pthread_mutex_t>
    /// Not checked for exclusive access at run time: the mutex already makes every access
    /// exclusive (and a second `withLock` on the same thread stops the process), so the
    /// dynamic check each `withLock` paid (about 2 % of a small-message profile) found nothing.
    @exclusivity(unchecked) @usableFromInline var value: Value

    public init(_ value: consuming sending Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ERRORCHECK))
        let status = pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        precondition(status == 0, "pthread_mutex_init failed (\(status))")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held and the value to read or change; returns what it returns.
    /// Inlinable: specialised where it is called, not looked up at run time per call.
    @inlinable
    public func withLock<Result, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        lock()
        defer { unlock() }
        return try body(&value)
    }

    @usableFromInline func lock() {
        let status = pthread_mutex_lock(mutex)
        if status == EDEADLK {
            fatalError("Recursive call to lock a Locked value: this thread already holds it")
        }
        precondition(status == 0, "pthread_mutex_lock failed (\(status))")
    }

    @usableFromInline func unlock() {
        let status = pthread_mutex_unlock(mutex)
        precondition(status == 0, "pthread_mutex_unlock failed (\(status))")
    }
}
