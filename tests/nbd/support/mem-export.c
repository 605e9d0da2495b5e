/*
 * An in-memory NBD backend for tests and the fuzzer: the export is an array
 * of 64 KiB blocks, NULL meaning "never written, reads as zero", so block
 * status and sparse reads have something real to report.  Not thread-safe:
 * it is served by one thread (the blocking transport) at a time.
 */
#include <errno.h>
#include <stdlib.h>

#include "nbd-support.h"

#define MEM_BLOCK (64u << 10)

struct mem_be {
	uint64_t size;
	size_t nblocks;
	uint8_t **blocks;
};

static int mem_pread(void *be, uint64_t off, void *buf, size_t len, uint32_t flags)
{
	struct mem_be *m = be;
	uint8_t *out = buf;

	while (len) {
		size_t bi = off / MEM_BLOCK, bo = off % MEM_BLOCK;
		size_t n = MEM_BLOCK - bo < len ? MEM_BLOCK - bo : len;
		if (m->blocks[bi])
			memcpy(out, m->blocks[bi] + bo, n);
		else
			memset(out, 0, n);
		out += n;
		off += n;
		len -= n;
	}
	return 0;
}

static int mem_pwrite(void *be, uint64_t off, const void *buf, size_t len,
		      uint32_t flags)
{
	struct mem_be *m = be;
	const uint8_t *in = buf;

	while (len) {
		size_t bi = off / MEM_BLOCK, bo = off % MEM_BLOCK;
		size_t n = MEM_BLOCK - bo < len ? MEM_BLOCK - bo : len;
		if (!m->blocks[bi]) {
			m->blocks[bi] = calloc(1, MEM_BLOCK);
			if (!m->blocks[bi])
				return -ENOMEM;
		}
		if (in) {
			memcpy(m->blocks[bi] + bo, in, n);
			in += n;
		} else {
			memset(m->blocks[bi] + bo, 0, n);
		}
		off += n;
		len -= n;
	}
	return 0;
}

static int mem_flush(void *be, uint32_t flags)
{
	return 0;
}

/* Zero [off, off+len): whole blocks are dropped when trimming is allowed. */
static int mem_zero(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	struct mem_be *m = be;

	while (len) {
		size_t bi = off / MEM_BLOCK, bo = off % MEM_BLOCK;
		uint64_t n = MEM_BLOCK - bo < len ? MEM_BLOCK - bo : len;
		if (m->blocks[bi]) {
			if (n == MEM_BLOCK && (flags & IOC_NBD_BE_MAY_TRIM)) {
				free(m->blocks[bi]);
				m->blocks[bi] = NULL;
			} else {
				memset(m->blocks[bi] + bo, 0, n);
			}
		}
		off += n;
		len -= n;
	}
	return 0;
}

static int mem_trim(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	return mem_zero(be, off, len, IOC_NBD_BE_MAY_TRIM);
}

static int mem_block_status(void *be, uint64_t off, uint64_t len, uint64_t *pnum,
			    uint32_t flags)
{
	struct mem_be *m = be;
	bool hole = !m->blocks[off / MEM_BLOCK];
	uint64_t n = 0;

	while (n < len) {
		uint64_t o = off + n;
		if (!m->blocks[o / MEM_BLOCK] != hole)
			break;
		uint64_t step = MEM_BLOCK - o % MEM_BLOCK;
		n += step < len - n ? step : len - n;
	}
	*pnum = n;
	return hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0;
}

static const struct ioc__nbd_backend_ops mem_ops = {
	.pread = mem_pread,
	.pwrite = mem_pwrite,
	.flush = mem_flush,
	.trim = mem_trim,
	.zero = mem_zero,
	.block_status = mem_block_status,
};

int ioc__nbd_mem_export_new(struct ioc__nbd_export **out, const char *name,
			    uint64_t size, bool read_only)
{
	struct ioc__nbd_export *e = calloc(1, sizeof(*e));
	struct mem_be *m = calloc(1, sizeof(*m));

	if (!e || !m)
		goto fail;
	m->size = size;
	m->nblocks = (size + MEM_BLOCK - 1) / MEM_BLOCK;
	m->blocks = calloc(m->nblocks ? m->nblocks : 1, sizeof(*m->blocks));
	e->name = strdup(name);
	if (!m->blocks || !e->name)
		goto fail;
	e->size = size;
	e->read_only = read_only;
	e->can_trim = e->can_zero = e->can_fast_zero = e->can_fua = true;
	e->can_cache = e->can_block_status = e->multi_conn = true;
	e->min_block = 1;
	e->pref_block = 4096;
	e->max_block = IOC_NBD_MAX_PAYLOAD;
	e->ops = &mem_ops;
	e->be = m;
	*out = e;
	return 0;
fail:
	if (m)
		free(m->blocks);
	free(m);
	if (e)
		free(e->name);
	free(e);
	return -ENOMEM;
}

void ioc__nbd_mem_export_free(struct ioc__nbd_export *e)
{
	struct mem_be *m;

	if (!e)
		return;
	m = e->be;
	for (size_t i = 0; i < m->nblocks; i++)
		free(m->blocks[i]);
	free(m->blocks);
	free(m);
	free(e->name);
	free(e->description);
	free(e);
}
