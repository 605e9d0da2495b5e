/*
 * Growing a heap buffer by doubling, for the byte queues that grow as
 * they fill: the QMP client's input and output, the NBD handshake's
 * output and block-status replies, the decompressor's staging; and the
 * arrays that grow by one element or a few at a time (the seek table, the
 * qcow2 refcount decrements waiting for a writeback).  Internal.
 */
#ifndef IOC_UTIL_BUF_H
#define IOC_UTIL_BUF_H

#include <stddef.h>

/* buf (*cap bytes) reallocated to at least need bytes: the capacity
 * doubled, from min when it is 0, until it holds need.  The new buffer,
 * *cap updated; or NULL when out of memory or past what a size_t holds,
 * buf and *cap unchanged. */
void *ioc__buf_grow(void *buf, size_t *cap, size_t need, size_t min);

/* The same for an array of elem-byte elements: *cap, need and min count
 * elements.  NULL too when the array would not fit in a size_t. */
void *ioc__array_grow(void *a, size_t *cap, size_t need, size_t min, size_t elem);

#endif /* IOC_UTIL_BUF_H */
