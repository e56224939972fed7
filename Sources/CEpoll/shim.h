// epoll(7) and eventfd(2), which the Glibc module does not bring in: PeerLinkPosix's I/O thread
// (Readiness), and how another thread wakes it for a job (IOThreadExecutor).
#include <sys/epoll.h>
#include <sys/eventfd.h>
