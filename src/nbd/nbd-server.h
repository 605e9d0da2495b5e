/*
 * Private interface between the NBD server's files (server.c, conn.c,
 * export-blk.c).
 */
#ifndef IOC_NBD_SERVER_H
#define IOC_NBD_SERVER_H

#include <stdatomic.h>

#include "iocore/nbd.h"
#include "nbd-proto.h"

int ioc__nbd_blk_export_new(struct ioc__nbd_export **out,
			    const struct ioc_nbd_export_opts *opts);
void ioc__nbd_blk_export_free(struct ioc__nbd_export *e);

#endif /* IOC_NBD_SERVER_H */
