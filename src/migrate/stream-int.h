/*
 * Internals shared by the migration stream's codec (stream.c) and its
 * receiver (receive.c); not part of the interface of stream.h.
 */
#ifndef IOCORE_MIGRATE_STREAM_INT_H
#define IOCORE_MIGRATE_STREAM_INT_H

#include <zstd.h>

#include "stream.h"

/* Blocks of an image: the last one may be short. */
uint64_t ioc__mig_nblocks(uint64_t image_size, uint32_t block_size);

/* ioc_mig_payload_decode() without the data CRC check, decoding zstd with
 * dctx when it is not NULL.  For DATA_RAW, out may be payload itself. */
int ioc__mig_payload_decode(const struct ioc_mig_rec *r, const void *payload,
			    void *out, ZSTD_DCtx *dctx, const char **why);

#endif
