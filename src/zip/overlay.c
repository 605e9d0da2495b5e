/*
 * Copy-on-write overlay: makes a read-only compressed image (image.c)
 * writable without touching it, as a qcow2 file over a backing file does, in
 * one sparse file of our own.
 *
 * Problem: people boot VMs from compressed golden images or repair
 * compressed backups in place; the base must stay as it is (shared, or a
 * backup), flushed writes must survive a crash, and a 4 KiB write must not
 * rewrite a compressed frame.
 *
 * Design: the overlay holds a 4 KiB header (magic, version, cluster size,
 * the base's sizes, CRC32), an allocation map of one byte per 64 KiB cluster
 * (BASE: read the image; DATA: read the overlay; ZERO: reads as zeroes
 * whatever the base holds), then from a 1 MiB aligned offset the data area,
 * cluster N at data_off + N * 64 KiB, sparse where never written.  Writes:
 * whole clusters are written, then marked DATA; a partial write to a cluster
 * not yet DATA first builds the whole cluster (the base's bytes, or zeroes
 * if ZERO), merges the new bytes and writes it (copy-before-write), then
 * marks it DATA.  These state changes run under one coroutine mutex
 * (alloc_lock), so two writes to halves of one base cluster cannot both copy
 * it and lose each other's bytes; writes to DATA clusters go straight to the
 * file in parallel.  WRITE_ZEROES and TRIM make whole clusters ZERO and
 * punch them out of the data area, and write parts of clusters as zeroes
 * (copying a base cluster first), so both read as zeroes over any base data.
 *
 * Crash safety (flush and FUA mean durable): only flush writes the map,
 * holding alloc_lock throughout: fdatasync, the map, fdatasync again.  A
 * cluster turns DATA in memory only after its bytes are written, and none
 * changes state during a flush, so the map on disk never names a cluster
 * whose bytes are not durable.  After kill -9 a cluster written since the
 * last flush may read as before (its map byte is old), the unflushed
 * contract; whatever a flush acknowledged is there.  The map is rewritten
 * whole; a torn write leaves each byte old or new, both safe, so it carries
 * no checksum.  The base is opened read-only and never written.
 *
 * Rejected: 4 KiB tracking with read-merge (64x the map, and a cluster's
 * reads would mix sources per block); a separate map file (two files to keep
 * in step, or to lose one of); a journal (the in-place map with the flush
 * ordering above is already crash safe here).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "iocore/blk.h"
#include "iocore/co.h"
#include "iocore/zip.h"
#include "codec.h"

#define OVL_MAGIC       "IOCOVL01"
#define OVL_VERSION     1u
#define OVL_CLUSTER     (64u << 10)
#define OVL_HEADER      4096u
#define OVL_DATA_ALIGN  (1u << 20)

enum { C_BASE = 0, C_DATA = 1, C_ZERO = 2 };

/* On-disk header, little-endian (we only build on little-endian hosts,
 * as the rest of the zip formats' readers assume). */
struct ovl_header {
	char magic[8];
	uint32_t version;
	uint32_t cluster;
	uint64_t size;          /* image (decompressed base) size */
	uint64_t base_frames;   /* identity of the base, checked at open */
	uint64_t map_off, map_len, data_off;
	uint32_t crc;           /* CRC32 of everything above */
} __attribute__((packed));

struct ioc_zip_overlay {
	struct ioc_zip_image *base;
	struct ioc_blk *blk;
	uint64_t size, nclusters, map_off, data_off;
	_Atomic uint8_t *map;           /* release store after the data
					 * write; acquire load by readers */
	uint8_t *map_buf;               /* flush's snapshot */
	bool map_dirty;                 /* under alloc_lock */
	_Atomic uint64_t nstate[3];     /* clusters in each state: changed
					 * under alloc_lock, read by reports
					 * (relaxed: statistics) */
	struct ioc_co_mutex alloc_lock;
};

static uint32_t header_crc(const struct ovl_header *h)
{
	return (uint32_t)crc32(0, (const Bytef *)h, offsetof(struct ovl_header, crc));
}

static int create_file(const char *path, const struct ovl_header *h, char *msg, size_t msglen)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	uint8_t page[OVL_HEADER] = { 0 };
	int r = 0;

	if (fd < 0)
		return ioc__zip_say(msg, msglen, -errno, "%s: %s", path, strerror(errno));
	memcpy(page, h, sizeof(*h));
	/* The map (all BASE) is the hole after the header; the size makes
	 * the data area exist, sparse. */
	if (ftruncate(fd, (off_t)(h->data_off + h->size)) < 0 ||
	    pwrite(fd, page, sizeof(page), 0) != (ssize_t)sizeof(page) || fdatasync(fd) < 0)
		r = ioc__zip_say(msg, msglen, -errno, "%s: %s", path, strerror(errno));
	close(fd);
	return r;
}

int ioc_zip_overlay_open(struct ioc_zip_overlay **out, struct ioc_zip_image *base,
			 const char *path, char *msg, size_t msglen)
{
	struct ioc_zip_image_info bi;
	struct ioc_zip_overlay *ov;
	struct ovl_header h = { 0 }, want = { 0 };
	uint64_t count[3] = { 0 };
	struct ioc_blk_opts bo = { 0 };
	struct stat st;
	int fd, r;

	*out = NULL;
	ioc_zip_image_get_info(base, &bi);
	memcpy(want.magic, OVL_MAGIC, 8);
	want.version = OVL_VERSION;
	want.cluster = OVL_CLUSTER;
	want.size = bi.size;
	want.base_frames = bi.frames;
	want.map_off = OVL_HEADER;
	want.map_len = (bi.size + OVL_CLUSTER - 1) / OVL_CLUSTER;
	want.data_off = (OVL_HEADER + want.map_len + OVL_DATA_ALIGN - 1) /
			OVL_DATA_ALIGN * OVL_DATA_ALIGN;
	want.crc = header_crc(&want);

	if (stat(path, &st) < 0 || st.st_size == 0) {
		r = create_file(path, &want, msg, msglen);
		if (r < 0)
			return r;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ioc__zip_say(msg, msglen, -errno, "%s: %s", path, strerror(errno));
	r = pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) ? 0 : -EBADMSG;
	if (r == 0 && (memcmp(h.magic, OVL_MAGIC, 8) || h.crc != header_crc(&h)))
		r = ioc__zip_say(msg, msglen, -EBADMSG, "%s: not an overlay (bad magic or header checksum)",
			path);
	else if (r == 0 && h.version != OVL_VERSION)
		r = ioc__zip_say(msg, msglen, -ENOTSUP, "%s: overlay version %u not supported", path,
			h.version);
	else if (r == 0 && memcmp(&h, &want, sizeof(h)))
		r = ioc__zip_say(msg, msglen, -EINVAL,
			"%s: overlay made for another base (%llu bytes in %llu frames; "
			"this one has %llu bytes in %llu frames)", path,
			(unsigned long long)h.size, (unsigned long long)h.base_frames,
			(unsigned long long)want.size, (unsigned long long)want.base_frames);
	else if (r < 0)
		ioc__zip_say(msg, msglen, r, "%s: short header", path);
	if (r < 0) {
		close(fd);
		return r;
	}
	ov = calloc(1, sizeof(*ov));
	if (!ov) {
		close(fd);
		return -ENOMEM;
	}
	ov->base = base;
	ov->size = h.size;
	ov->nclusters = h.map_len;
	ov->map_off = h.map_off;
	ov->data_off = h.data_off;
	ioc_co_mutex_init(&ov->alloc_lock);
	ov->map = calloc(h.map_len ? h.map_len : 1, 1);
	ov->map_buf = malloc(h.map_len ? h.map_len : 1);
	if (!ov->map || !ov->map_buf) {
		r = -ENOMEM;
		goto fail;
	}
	if (h.map_len && pread(fd, ov->map_buf, h.map_len, (off_t)h.map_off) != (ssize_t)h.map_len) {
		r = ioc__zip_say(msg, msglen, -EBADMSG, "%s: map truncated", path);
		goto fail;
	}
	for (uint64_t i = 0; i < h.map_len; i++) {
		if (ov->map_buf[i] > C_ZERO) {
			r = ioc__zip_say(msg, msglen, -EBADMSG, "%s: map entry %llu has state %u", path,
				(unsigned long long)i, ov->map_buf[i]);
			goto fail;
		}
		atomic_init(&ov->map[i], ov->map_buf[i]);
		count[ov->map_buf[i]]++;
	}
	for (int k = 0; k < 3; k++)
		atomic_init(&ov->nstate[k], count[k]);
	close(fd);
	fd = -1;
	r = ioc_blk_open(&ov->blk, path, &bo);
	if (r < 0) {
		ioc__zip_say(msg, msglen, r, "%s: %s", path, ioc_strerror(r));
		goto fail;
	}
	*out = ov;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	ioc_zip_overlay_close(ov);
	return r;
}

void ioc_zip_overlay_close(struct ioc_zip_overlay *ov)
{
	if (!ov)
		return;
	if (ov->blk)
		ioc_blk_close(ov->blk);
	free(ov->map);
	free(ov->map_buf);
	free(ov);
}

uint64_t ioc_zip_overlay_size(struct ioc_zip_overlay *ov)
{
	return ov->size;
}

void ioc_zip_overlay_get_info(struct ioc_zip_overlay *ov, struct ioc_zip_overlay_info *info)
{
	struct ioc_blk_info bi;

	memset(info, 0, sizeof(*info));
	ioc_blk_get_info(ov->blk, &bi);
	info->path = bi.path;
	info->size = ov->size;
	info->cluster_size = OVL_CLUSTER;
	/* Pair with set_state()'s counts; statistics, they order nothing. */
	info->clusters_written = atomic_load_explicit(&ov->nstate[C_DATA], memory_order_relaxed);
	info->clusters_zero = atomic_load_explicit(&ov->nstate[C_ZERO], memory_order_relaxed);
}

static int state(struct ioc_zip_overlay *ov, uint64_t c)
{
	/* Pairs with the release store in set_state(): a DATA state seen
	 * here comes after the data write that preceded it. */
	return atomic_load_explicit(&ov->map[c], memory_order_acquire);
}

static void set_state(struct ioc_zip_overlay *ov, uint64_t c, int st)
{
	/* Relaxed: the only writer holds alloc_lock. */
	int old = atomic_load_explicit(&ov->map[c], memory_order_relaxed);

	if (old != st) {
		atomic_fetch_sub_explicit(&ov->nstate[old], 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&ov->nstate[st], 1, memory_order_relaxed);
	}
	atomic_store_explicit(&ov->map[c], (uint8_t)st, memory_order_release);
	ov->map_dirty = true;
}

static uint64_t cl_start(uint64_t c) { return c * OVL_CLUSTER; }

static uint64_t cl_end(struct ioc_zip_overlay *ov, uint64_t c)
{
	uint64_t e = (c + 1) * OVL_CLUSTER;

	return e < ov->size ? e : ov->size;
}

static int ioc_coroutine_fn data_write(struct ioc_zip_overlay *ov, uint64_t off,
				       const void *buf, size_t len)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };

	return ioc_blk_co_pwritev(ov->blk, ov->data_off + off, &iov, 1, 0);
}

static int ioc_coroutine_fn data_read(struct ioc_zip_overlay *ov, uint64_t off, void *buf,
				      size_t len)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	return ioc_blk_co_preadv(ov->blk, ov->data_off + off, &iov, 1, 0);
}

/* Write [off, off + len) (buf, or zeroes when buf is NULL) inside cluster
 * c, which the caller found not DATA: build the whole cluster, write it,
 * mark it DATA.  Takes alloc_lock. */
static int ioc_coroutine_fn cow_cluster(struct ioc_zip_overlay *ov, uint64_t c, uint64_t off,
					const uint8_t *buf, size_t len)
{
	uint64_t cs = cl_start(c), ce = cl_end(ov, c);
	uint8_t *tmp = NULL;
	int st, r = 0;

	ioc_co_mutex_lock(&ov->alloc_lock);
	st = state(ov, c);
	if (st == C_DATA) {
		/* Another write allocated it meanwhile. */
		ioc_co_mutex_unlock(&ov->alloc_lock);
		if (buf)
			return data_write(ov, off, buf, len);
		return ioc_blk_co_write_zeroes(ov->blk, ov->data_off + off, len, 0);
	}
	if (st == C_ZERO && !buf)
		goto out;
	tmp = malloc(OVL_CLUSTER);
	if (!tmp) {
		r = -ENOMEM;
		goto out;
	}
	if (st == C_ZERO)
		memset(tmp, 0, (size_t)(ce - cs));
	else
		r = ioc_zip_image_co_pread(ov->base, cs, tmp, (size_t)(ce - cs), 0);
	if (r < 0)
		goto out;
	if (buf)
		memcpy(tmp + (off - cs), buf, len);
	else
		memset(tmp + (off - cs), 0, len);
	r = data_write(ov, cs, tmp, (size_t)(ce - cs));
	if (r == 0)
		set_state(ov, c, C_DATA);
out:
	ioc_co_mutex_unlock(&ov->alloc_lock);
	free(tmp);
	return r;
}

int ioc_coroutine_fn ioc_zip_overlay_co_flush(struct ioc_zip_overlay *ov, uint32_t flags)
{
	int r;

	/* Held throughout: no cluster changes state between the first
	 * fdatasync and the map write (see the essay). */
	ioc_co_mutex_lock(&ov->alloc_lock);
	r = ioc_blk_co_flush(ov->blk, 0);
	if (r == 0 && ov->map_dirty) {
		struct iovec iov = { .iov_base = ov->map_buf, .iov_len = ov->nclusters };

		for (uint64_t i = 0; i < ov->nclusters; i++)
			ov->map_buf[i] = (uint8_t)state(ov, i);
		r = ioc_blk_co_pwritev(ov->blk, ov->map_off, &iov, 1, 0);
		if (r == 0)
			r = ioc_blk_co_flush(ov->blk, 0);
		if (r == 0)
			ov->map_dirty = false;
	}
	ioc_co_mutex_unlock(&ov->alloc_lock);
	return r;
}

/* A write's or a zeroing's flags and range: 0 or -EINVAL. */
static int check_write(const struct ioc_zip_overlay *ov, uint64_t off, uint64_t len,
		       uint32_t flags)
{
	uint64_t end = off + len;

	return (flags & ~IOC_ZIP_OVERLAY_FUA) || end < off || end > ov->size ? -EINVAL : 0;
}

int ioc_coroutine_fn ioc_zip_overlay_co_pwrite(struct ioc_zip_overlay *ov, uint64_t off,
					       const void *buf, size_t len, uint32_t flags)
{
	const uint8_t *p = buf;
	uint64_t end = off + len;
	int r = check_write(ov, off, len, flags);

	while (off < end && r == 0) {
		uint64_t c = off / OVL_CLUSTER, ce = cl_end(ov, c);
		uint64_t run_end = off;

		if (state(ov, c) == C_DATA) {
			/* Already ours: write the run of DATA clusters. */
			while (run_end < end && state(ov, run_end / OVL_CLUSTER) == C_DATA)
				run_end = cl_end(ov, run_end / OVL_CLUSTER);
			if (run_end > end)
				run_end = end;
			r = data_write(ov, off, p, (size_t)(run_end - off));
		} else if (off == cl_start(c) && end >= ce) {
			/* Whole clusters not yet ours: write them, then claim
			 * them (after the data, under the lock). */
			while (run_end < end && cl_end(ov, run_end / OVL_CLUSTER) <= end &&
			       state(ov, run_end / OVL_CLUSTER) != C_DATA)
				run_end = cl_end(ov, run_end / OVL_CLUSTER);
			r = data_write(ov, off, p, (size_t)(run_end - off));
			if (r == 0) {
				ioc_co_mutex_lock(&ov->alloc_lock);
				for (uint64_t i = off / OVL_CLUSTER; i * OVL_CLUSTER < run_end; i++)
					set_state(ov, i, C_DATA);
				ioc_co_mutex_unlock(&ov->alloc_lock);
			}
		} else {
			run_end = ce < end ? ce : end;
			r = cow_cluster(ov, c, off, p, (size_t)(run_end - off));
		}
		p += run_end - off;
		off = run_end;
	}
	if (r == 0 && (flags & IOC_ZIP_OVERLAY_FUA))
		r = ioc_zip_overlay_co_flush(ov, 0);
	return r;
}

int ioc_coroutine_fn ioc_zip_overlay_co_zero(struct ioc_zip_overlay *ov, uint64_t off,
					     uint64_t len, uint32_t flags)
{
	uint64_t end = off + len;
	int r = check_write(ov, off, len, flags);

	while (off < end && r == 0) {
		uint64_t c = off / OVL_CLUSTER, ce = cl_end(ov, c);
		uint64_t run_end = ce < end ? ce : end;

		if (off == cl_start(c) && end >= ce) {
			/* Whole cluster: ZERO, and its bytes punched out. */
			ioc_co_mutex_lock(&ov->alloc_lock);
			bool was_data = state(ov, c) == C_DATA;

			if (state(ov, c) != C_ZERO)
				set_state(ov, c, C_ZERO);
			ioc_co_mutex_unlock(&ov->alloc_lock);
			if (was_data)
				r = ioc_blk_co_discard(ov->blk, ov->data_off + off, ce - off, 0);
		} else if (state(ov, c) == C_DATA) {
			r = ioc_blk_co_write_zeroes(ov->blk, ov->data_off + off, run_end - off, 0);
		} else {
			r = cow_cluster(ov, c, off, NULL, (size_t)(run_end - off));
		}
		off = run_end;
	}
	if (r == 0 && (flags & IOC_ZIP_OVERLAY_FUA))
		r = ioc_zip_overlay_co_flush(ov, 0);
	return r;
}

int ioc_coroutine_fn ioc_zip_overlay_co_pread(struct ioc_zip_overlay *ov, uint64_t off,
					      void *buf, size_t len, uint32_t flags)
{
	uint8_t *p = buf;
	uint64_t end = off + len;
	int r = 0;

	if (flags || end < off || end > ov->size)
		return -EINVAL;
	while (off < end && r == 0) {
		int st = state(ov, off / OVL_CLUSTER);
		uint64_t run_end = cl_end(ov, off / OVL_CLUSTER);

		while (run_end < end && state(ov, run_end / OVL_CLUSTER) == st)
			run_end = cl_end(ov, run_end / OVL_CLUSTER);
		if (run_end > end)
			run_end = end;
		if (st == C_DATA)
			r = data_read(ov, off, p, (size_t)(run_end - off));
		else if (st == C_ZERO)
			memset(p, 0, (size_t)(run_end - off));
		else
			r = ioc_zip_image_co_pread(ov->base, off, p, (size_t)(run_end - off), 0);
		p += run_end - off;
		off = run_end;
	}
	return r;
}

int ioc_zip_overlay_block_status(struct ioc_zip_overlay *ov, uint64_t off, uint64_t len,
				 uint64_t *pnum, uint32_t flags)
{
	uint64_t end, run_end;
	int st;

	if (flags || off >= ov->size)
		return -EINVAL;
	if (len > ov->size - off)
		len = ov->size - off;
	end = off + len;
	st = state(ov, off / OVL_CLUSTER);
	run_end = cl_end(ov, off / OVL_CLUSTER);
	while (run_end < end && state(ov, run_end / OVL_CLUSTER) == st)
		run_end = cl_end(ov, run_end / OVL_CLUSTER);
	if (run_end > end)
		run_end = end;
	*pnum = run_end - off;
	if (st == C_DATA)
		return IOC_ZIP_STATUS_OVERLAY;
	if (st == C_ZERO)
		return IOC_ZIP_STATUS_OVERLAY | IOC_ZIP_STATUS_ZERO;
	return ioc_zip_image_block_status(ov->base, off, run_end - off, pnum, 0);
}
