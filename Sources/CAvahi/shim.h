// What Swift needs from libavahi-client, plus small shims for what it cannot import.
#ifndef PEERLINK_CAVAHI_SHIM_H
#define PEERLINK_CAVAHI_SHIM_H

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/address.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-common/timeval.h>

/// AVAHI_IF_UNSPEC / AVAHI_PROTO_UNSPEC are enum members Swift imports, but as the
/// wrong integer type for the function parameters; these keep call sites free of casts.
static inline AvahiIfIndex peerlink_avahi_if_unspec(void) { return AVAHI_IF_UNSPEC; }
static inline AvahiProtocol peerlink_avahi_proto_unspec(void) { return AVAHI_PROTO_UNSPEC; }

/// Runs `callback` once on the poll thread after `msec` milliseconds (the AvahiPoll vtable is a
/// struct of function pointers; calling through it is simpler in C).
static inline AvahiTimeout *peerlink_avahi_schedule(const AvahiPoll *api, unsigned msec, AvahiTimeoutCallback callback, void *userdata) {
    struct timeval tv;
    avahi_elapse_time(&tv, msec, 0);
    return api->timeout_new(api, &tv, callback, userdata);
}

static inline void peerlink_avahi_timeout_free(const AvahiPoll *api, AvahiTimeout *timeout) {
    api->timeout_free(timeout);
}

#endif
