/*
 * iocore-nbd --inject-faults: the block layer's fault hook, driven from the
 * command line, for tests that need a real server to fail on purpose.
 */
#ifndef IOC_NBD_INJECT_H
#define IOC_NBD_INJECT_H

#include "iocore/blk.h"

/* Parse one rule (see inject.c) and add it.  Returns 0, or -EINVAL with a
 * message in err. */
int nbd_inject_add(const char *spec, char *err, size_t errlen);
/* Install the rules added so far on blk (no-op when there are none). */
void nbd_inject_install(struct ioc_blk *blk);

#endif
