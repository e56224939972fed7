// mallopt(3) and its parameters from the C library's <malloc.h> (not part of the Glibc
// module): PeerLinkPosix's heap tuning (HeapTuning).
#include <malloc.h>
