// epoll(7), which the Glibc module does not bring in: PeerLinkPosix's I/O thread (Readiness).
#include <sys/epoll.h>
