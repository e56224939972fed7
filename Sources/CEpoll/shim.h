// epoll(7) and eventfd(2), which the Glibc module does not bring in: PeerLinkPosix's I/O thread
// (Readiness), and how another thread wakes it for a job (IOThreadExecutor). Also flock(2),
// which Swift cannot call by its name (the struct of the same name hides it): IdentityStore's
// claim on an identity file.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>

static inline int peerlink_flock(int fd, int operation) { return flock(fd, operation); }
