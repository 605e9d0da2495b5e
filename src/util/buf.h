/*
 * Growing a heap buffer by doubling, for the byte queues that grow as
 * they fill: the QMP client's input and output, the NBD handshake's
 * output and block-status replies, the decompressor's staging.  Internal.
 */
#ifndef IOC_UTIL_BUF_H
#define IOC_UTIL_BUF_H

#include <stddef.h>

/* buf (*cap bytes) reallocated to at least need bytes: the capacity
 * doubled, from min when it is 0, until it holds need.  The new buffer,
 * *cap updated; or NULL when out of memory, buf and *cap unchanged. */
void *ioc__buf_grow(void *buf, size_t *cap, size_t need, size_t min);

#endif /* IOC_UTIL_BUF_H */
