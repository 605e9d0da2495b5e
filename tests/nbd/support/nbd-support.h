/*
 * Test support for the NBD protocol core, built as a static library that
 * tests and the fuzzer link (not part of libiocore): an in-memory export
 * and a blocking transport that serves one socket on the calling thread.
 */
#ifndef IOC_NBD_SUPPORT_H
#define IOC_NBD_SUPPORT_H

#include "nbd-proto.h"

/* The in-memory backend.  size bytes, sparse by 64 KiB blocks.  Returns 0
 * or -ENOMEM. */
int ioc__nbd_mem_export_new(struct ioc__nbd_export **out, const char *name,
			    uint64_t size, bool read_only);
void ioc__nbd_mem_export_free(struct ioc__nbd_export *exp);

/* Blocking transport: serve one connected socket on the calling thread
 * until the client leaves.  Returns 0 on a clean end, or -errno. */
int ioc__nbd_serve_sync(int fd, const struct ioc__nbd_cfg *cfg);

#endif /* IOC_NBD_SUPPORT_H */
