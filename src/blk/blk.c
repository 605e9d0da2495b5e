/*
 * iocore block layer: the request path shared by every driver and backend.
 *
 * Problem: the cheapest correct syscalls for "read these bytes of this
 * image", from any I/O thread, allocating nothing per request and never
 * blocking the loop, so that a page-cache hit costs no switch or loop trip.
 *
 * Design: a struct blk_req embedded in the caller's ioc_blk_req (or on the
 * coroutine's stack) goes validate -> [fast path] -> [track] -> [bounce] ->
 * backend attempt(s) -> finish (copy-out, untrack) -> callback.  This file
 * validates, tracks, bounces and dispatches; the backends (blk-uring.c,
 * blk-threads.c) run attempts; request.c, below both, holds what they share.
 * - Fast path (cache=writeback reads; splice_read to a pipe and map_* too):
 *   preadv2(RWF_NOWAIT) inline, a short hit going on asynchronously; a
 *   per-image credit spares workloads that never hit (probing one in 32).
 *   Lacking RWF_NOWAIT (tmpfs), cachestat(2); tmpfs without swap needs none.
 * - Backend per request: io_uring on the current loop's ring (one enter per
 *   iteration), else the loop's pool, which also takes what io_uring cannot
 *   say cheaply (ioctls, write-zeroes fallbacks, read-modify-write).
 * - One short-transfer accounting for every backend (ioc__blk_rw_account),
 *   so injected short transfers run the real code.  Past EOF reads zeroes.
 * - cache=none: alignment from STATX_DIOALIGN, else BLKSSZGET, else probes.
 *   Misaligned requests bounce; a write misaligned in offset or length is a
 *   pool read-modify-write that waits for, and blocks, overlapping writes.
 * - Completion: the coroutine API's direct_cb skips the yield for a request
 *   done in submission; callbacks go via a task, never inside the submit.
 * - Write-back errors reach only the next fsync ("fsyncgate"), so the first
 *   a sync reports (flush errors but -ENOMEM; -EIO of FUA writes and write-
 *   zeroes), injected or real, fails every later flush and FUA request until
 *   close, even after a good sync; reads and plain writes go on, for rescue.
 *
 * Rejected: a per-request coroutine in the library (QEMU's blk_aio_*, over
 * linux-aio, io_uring or a pool: a switch and a loop trip even for a hit);
 * linux-aio (async only with O_DIRECT; io_uring supersedes it); tracking
 * every request (only cache=none writes need it); retrying a failed sync or
 * forgetting its error after a good flush (both lie).  Cost: a hit is one
 * preadv2 (bench/blk/NOTES.md), an unset fault hook a branch, cache=none
 * tracking a mutex round trip and an O(queue depth) scan per write.  The
 * null driver completes every attempt at once.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "iocore/co.h"
#include "iocore/pool.h"
#include "blk-int.h"

#define FP_CREDIT_MAX 16
#define FP_PROBE_EVERY 32

static uint64_t iov_total(const struct iovec *iov, int iovcnt)
{
	uint64_t n = 0;

	for (int i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}


/* ---- open / close / info --------------------------------------------- */

/* Probe the O_DIRECT alignment the way the kernel reports it: the smallest
 * read size (then buffer address) that is not refused with -EINVAL.  A
 * hole reads as zeroes without reaching the disk, so it accepts anything:
 * the probe reads the first data, and a file without any (empty, or a
 * fresh sparse image) gets the page size.  Only for kernels without
 * STATX_DIOALIGN (before 6.1) and qemu's user-mode emulation, whose statx
 * leaves those fields zero. */
static void probe_alignment(struct ioc_blk *blk)
{
	static const uint32_t sizes[] = { 1, 512, 1024, 2048, 4096 };
	const size_t max = 4096;
	char *buf = NULL;
	off_t at;

	blk->req_align = blk->mem_align = max;
	if (blk_size(blk) == 0)
		return;
	at = lseek(blk->fd, 0, SEEK_DATA);
	if (at < 0)
		return;
	at &= ~(off_t)(max - 1);
	if (posix_memalign((void **)&buf, max, 2 * max))
		return;
	for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++) {
		if (pread(blk->fd, buf, sizes[i], at) >= 0 || errno != EINVAL) {
			blk->req_align = sizes[i];
			break;
		}
	}
	/* The buffer probe reads a whole page's worth, so that every
	 * misaligned start crosses a page boundary: the kernel takes a
	 * misaligned buffer that fits in one page (one segment) and refuses
	 * the same address for a longer read, so a 512-byte probe found
	 * mem_align 1 and later multi-page reads failed with EINVAL. */
	size_t n = max;

	for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++) {
		if (pread(blk->fd, buf + sizes[i], n, at) >= 0 || errno != EINVAL) {
			blk->mem_align = sizes[i];
			break;
		}
	}
	free(buf);
}

static void discover_alignment(struct ioc_blk *blk)
{
	struct statx stx;

	if (!blk->o_direct) {
		blk->mem_align = blk->req_align = 1;
		return;
	}
#ifdef STATX_DIOALIGN
	if (statx(blk->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
		blk->mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 1;
		blk->req_align = stx.stx_dio_offset_align;
		return;
	}
#else
	(void)stx;
#endif
	if (blk->is_blockdev) {
		int ssz = 0;

		if (ioctl(blk->fd, BLKSSZGET, &ssz) == 0 && ssz > 0) {
			blk->req_align = blk->mem_align = (uint32_t)ssz;
			return;
		}
	}
	probe_alignment(blk);
}

/* ---- shared mapping ------------------------------------------------- */

/*
 * ioc_blk_map_read(): a read of tmpfs without swap served from a shared
 * mapping, so that the caller's sendmsg copies page cache -> socket once,
 * where preadv copied page cache -> buffer and sendmsg buffer -> socket;
 * the preadv (a syscall and a page-cache lookup per read) is gone.  Only
 * for an image fully allocated at open: a read fault on a tmpfs hole
 * allocates a page, so a large sparse image could fill memory by being
 * read.  Page tables are filled MAP_FILL (64 KiB) at a time
 * (MADV_POPULATE_READ) the first time a piece is asked for, so the
 * kernel's copy takes no page fault per page.  Rejected: an mmap per read
 * (dearer than the preadv); MAP_POPULATE of the whole image at open
 * (start-up time that grows with the image, for pages perhaps never
 * read); filling 2 MiB at a time (one madvise per huge page, but where
 * 4 KiB pages map the range, 512 of them: 1024 first 4 KiB reads at
 * random in 1 GiB took 140 ms of CPU, 11 ms filling 64 KiB); copying
 * out of the mapping in user space: a file cut short under it would
 * raise SIGBUS there, where the kernel's copy fails with EFAULT.  The
 * mapping starts on a 2 MiB boundary: ranges in huge pages (huge.c) are
 * then mapped by one entry each, and the kernel's copy takes no TLB miss
 * per 4 KiB page (with 4 KiB pages the one copy left cost about what the
 * two it replaced did).
 * Writable images are mapped writable, for ioc_blk_map_write() (below).
 * Cost: address space the size of the image, page tables (2 MiB per GiB
 * read in 4 KiB pages, 4 KiB per GiB in huge pages), a bit per 64 KiB.
 */
#define MAP_CHUNK (2u << 20)  /* the mapping's alignment */
#define MAP_FILL  (64u << 10) /* page tables filled this much at a time */
#define MAP_BITS  64u         /* pieces per map_filled word */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static void map_setup(struct ioc_blk *blk, const struct stat *st)
{
	uint64_t size = (uint64_t)st->st_size;
	uint64_t per_word = (uint64_t)MAP_FILL * MAP_BITS;
	void *p;

	if (!S_ISREG(st->st_mode) || !blk->never_waits || blk->o_direct ||
	    !blk->fast_path || size == 0 || size > SIZE_MAX / 2 ||
	    (uint64_t)st->st_blocks * 512 < size)
		return;
	blk->map_filled = calloc((size_t)((size + per_word - 1) / per_word),
				 sizeof(*blk->map_filled));
	if (!blk->map_filled)
		return; /* best effort: reads go the ordinary way */
	/* At a 2 MiB-aligned address, so that ranges the huge-page pass
	 * regrouped (huge.c) are mapped by one page-table entry each: the
	 * kernel's copy out of them then takes no TLB miss per 4 KiB. */
	p = mmap(NULL, (size_t)size + MAP_CHUNK, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p != MAP_FAILED) {
		uint8_t *lo = p, *at = (uint8_t *)(((uintptr_t)p + MAP_CHUNK - 1) &
						   ~(uintptr_t)(MAP_CHUNK - 1));
		size_t tail = (size_t)(lo + size + MAP_CHUNK - (at + size));

		if (at > lo)
			munmap(lo, (size_t)(at - lo));
		if (tail)
			munmap(at + size, tail);
		/* Writable unless the image is read-only: ioc_blk_map_write(). */
		p = mmap(at, (size_t)size, blk->read_only ? PROT_READ : PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_FIXED, blk->fd, 0);
		if (p == MAP_FAILED)
			munmap(at, (size_t)size);
	}
	if (p == MAP_FAILED) {
		free(blk->map_filled);
		blk->map_filled = NULL;
		return;
	}
	blk->map = p;
	blk->map_len = size;
}

/* The page tables of the pieces under [offset, offset + len) filled;
 * false: not now (cut short, no memory). */
static bool map_fill(struct ioc_blk *blk, uint64_t offset, size_t len)
{
	for (uint64_t k = offset / MAP_FILL; k <= (offset + len - 1) / MAP_FILL; k++) {
		_Atomic uint64_t *w = &blk->map_filled[k / MAP_BITS];
		uint64_t bit = 1ull << (k % MAP_BITS);
		uint64_t at = k * MAP_FILL;
		size_t n = blk->map_len - at < MAP_FILL ? (size_t)(blk->map_len - at)
							 : MAP_FILL;

		/* Relaxed load and fetch_or, paired with each other only: a
		 * hint.  Two threads that both see the bit clear fill the
		 * piece twice, which costs time, not correctness. */
		if (atomic_load_explicit(w, memory_order_relaxed) & bit)
			continue;
		if (madvise((void *)(blk->map + at), n, MADV_POPULATE_READ) < 0 &&
		    errno != EINVAL)
			return false; /* cut short, or no memory: not now */
		/* EINVAL: a kernel without MADV_POPULATE_READ (before 5.14);
		 * pages then fault in one by one. */
		atomic_fetch_or_explicit(w, bit, memory_order_relaxed);
	}
	return true;
}

/* Whether [offset, offset + len) may be lent now (ioc_blk_map_read()). */
static bool map_ok(struct ioc_blk *blk, uint64_t offset, size_t len)
{
	/* Relaxed: pairs with the stores in ioc_blk_map_fault() and
	 * map_stop(); a thread that lends once more after the first takes
	 * the same fallback, after the second reads zeroes from a hole. */
	return blk->map && !atomic_load_explicit(&blk->map_broken, memory_order_relaxed) &&
	       blk->never_waits && blk->fast_path && !blk->fault &&
	       len != 0 && offset <= blk->map_len && len <= blk->map_len - offset &&
	       offset + len <= blk_size(blk);
}

const void *ioc_blk_map_read(struct ioc_blk *blk, uint64_t offset, size_t len)
{
	if (!map_ok(blk, offset, len) || !map_fill(blk, offset, len))
		return NULL;
	return blk->map + offset;
}

/*
 * Writes into the mapping: a caller that receives a WRITE's payload from a
 * socket has the kernel copy it straight into the page cache, one copy
 * with no write(2) after it, where a receive into a buffer and a pwritev
 * made two.  The rules of map_read, plus a writable image and no FUA (the
 * mapping has no durable write).  Dirty bitmaps are prepared here, before
 * the bytes land, and marked by ioc_blk_map_written().  A file cut short
 * meanwhile makes the kernel's copy fail with EFAULT, never a SIGBUS.
 */
void *ioc_blk_map_write(struct ioc_blk *blk, uint64_t offset, size_t len, uint32_t flags)
{
	if (blk->read_only || flags != 0 || /* FUA: the mapping has no durable write */
	    !map_ok(blk, offset, len) || !map_fill(blk, offset, len) ||
	    blk_dirty_prepare(blk, offset, len) < 0)
		return NULL;
	return (void *)(blk->map + offset);
}

int ioc_blk_map_written(struct ioc_blk *blk, uint64_t offset, size_t len)
{
	/* Release: pairs with the exchange in map_touch(). */
	atomic_store_explicit(&blk->map_touched, true, memory_order_release);
	return blk_dirty_mark(blk, offset, len);
}

/* Bytes stored through a shared mapping of tmpfs leave the file's mtime
 * alone (no write(2) runs, and tmpfs has no page_mkwrite hook), so tools
 * that look at it (backups, make) would miss them.  A flush or the close
 * sets it, once for every write through the mapping since the last:
 * one syscall per flush, not one per write.  Acq_rel: pairs with the
 * release store in ioc_blk_map_written(). */
static void map_touch(struct ioc_blk *blk)
{
	static const struct timespec now[2] = {
		{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_NOW },
	};

	if (atomic_exchange_explicit(&blk->map_touched, false, memory_order_acq_rel))
		(void)futimens(blk->fd, now); /* best effort: the data is in */
}

int ioc_blk_map_store(struct ioc_blk *blk, uint64_t offset, const void *buf, size_t len)
{
	return ioc__blk_pwrite_full(blk->fd, buf, len, offset);
}

int ioc_blk_map_fault(struct ioc_blk *blk, uint64_t offset, void *buf, size_t len)
{
	/* Relaxed: pairs with the load in ioc_blk_map_read(). */
	atomic_store_explicit(&blk->map_broken, true, memory_order_relaxed);
	return ioc__blk_pread_full(blk->fd, buf, len, offset);
}

int ioc_blk_open(struct ioc_blk **out, const char *path,
		 const struct ioc_blk_opts *opts)
{
	static const struct ioc_blk_opts defaults;
	struct ioc_blk *blk;
	struct stat st;
	int ret;

	*out = NULL;
	if (!opts)
		opts = &defaults;
	blk = calloc(1, sizeof(*blk));
	if (!blk)
		return -ENOMEM;
	blk->fd = -1;
	blk->driver = opts->driver;
	blk->read_only = opts->read_only;
	blk->fast_path = !opts->no_fast_path;
	blk->null_read_zeroes = opts->null_read_zeroes;
	blk->null_latency_ns = opts->null_latency_ns > 0 ? opts->null_latency_ns : 0;
	atomic_init(&blk->caps, BLK_CAP_PUNCH | BLK_CAP_ZERO_RANGE |
		    BLK_CAP_DSYNC | BLK_CAP_NOWAIT | BLK_CAP_ALLOC |
		    BLK_CAP_CACHESTAT | BLK_CAP_SPLICE);
	atomic_init(&blk->fp_credit, FP_CREDIT_MAX);
	atomic_init(&blk->map_broken, false);
	atomic_init(&blk->data_seq, 0);
	atomic_init(&blk->data_start, 0);
	atomic_init(&blk->data_end, 0);
	atomic_init(&blk->data_gen, 0);
	ret = pthread_mutex_init(&blk->track_lock, NULL);
	if (ret) {
		free(blk);
		return -ret;
	}
	ret = pthread_mutex_init(&blk->data_lock, NULL);
	if (ret) {
		pthread_mutex_destroy(&blk->track_lock);
		free(blk);
		return -ret;
	}

	if (opts->aio == IOC_BLK_AIO_AUTO) {
		struct ioc_loop *loop = ioc_loop_current();

		blk->aio = (!loop || ioc_loop_has_uring(loop)) ?
			IOC_BLK_AIO_IO_URING : IOC_BLK_AIO_THREADS;
	} else {
		blk->aio = opts->aio;
	}

	if (blk->driver == IOC_BLK_DRIVER_NULL) {
		atomic_init(&blk->size, opts->null_size);
		blk->mem_align = blk->req_align = blk->dev_align = 1;
		blk->opt_align = 4096;
		blk->fast_path = false;
		*out = blk;
		return 0;
	}
	if (blk->driver != IOC_BLK_DRIVER_FILE || !path) {
		ret = -EINVAL;
		goto fail;
	}

	int flags = (blk->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;

	if (opts->cache == IOC_BLK_CACHE_NONE) {
		flags |= O_DIRECT;
		blk->o_direct = true;
		blk->fast_path = false; /* a direct read cannot be non-blocking */
	}
	blk->path = strdup(path);
	if (!blk->path) {
		ret = -ENOMEM;
		goto fail;
	}
	blk->fd = open(path, flags);
	if (blk->fd < 0) {
		ret = -errno;
		goto fail;
	}
	if (fstat(blk->fd, &st) < 0) {
		ret = -errno;
		goto fail;
	}
	if (S_ISBLK(st.st_mode)) {
		uint64_t sz = 0;
		unsigned int io_opt = 0;

		int ssz = 0;

		blk->is_blockdev = true;
		blk->dev_align = ioctl(blk->fd, BLKSSZGET, &ssz) == 0 && ssz > 0 ?
			(uint32_t)ssz : 512;
		if (ioctl(blk->fd, BLKGETSIZE64, &sz) < 0) {
			ret = -errno;
			goto fail;
		}
		atomic_init(&blk->size, sz);
		if (ioctl(blk->fd, BLKIOOPT, &io_opt) == 0 && io_opt)
			blk->opt_align = io_opt;
	} else if (S_ISREG(st.st_mode)) {
		blk->dev_align = 1;
		atomic_init(&blk->size, (uint64_t)st.st_size);
	} else {
		ret = -EINVAL;
		goto fail;
	}
	if (!blk->opt_align)
		blk->opt_align = st.st_blksize > 0 ? (uint32_t)st.st_blksize : 4096;
	{
		/* tmpfs pages live in memory unless swapped out: with no swap
		 * (as of open; a later swapon is not noticed), a read of a
		 * tmpfs file never waits for I/O. */
		struct statfs sfs;
		struct sysinfo si;

		blk->never_waits = fstatfs(blk->fd, &sfs) == 0 &&
			sfs.f_type == TMPFS_MAGIC && sysinfo(&si) == 0 &&
			si.totalswap == 0;
	}
	map_setup(blk, &st);
	discover_alignment(blk);
	if (blk->opt_align < blk->req_align)
		blk->opt_align = blk->req_align;
	ioc__blk_huge_start(blk);
	*out = blk;
	return 0;
fail:
	if (blk->fd >= 0)
		close(blk->fd);
	pthread_mutex_destroy(&blk->track_lock);
	pthread_mutex_destroy(&blk->data_lock);
	free(blk->path);
	free(blk);
	return ret;
}

void ioc_blk_close(struct ioc_blk *blk)
{
	if (!blk)
		return;
	assert(!blk->tracked);
	ioc__blk_huge_stop(blk);
	/* Relaxed: no request is in flight, so none creates a writer now. */
	ioc_pool_free(atomic_load_explicit(&blk->writer, memory_order_relaxed));
	ioc__blk_dirty_close(blk);
	if (blk->map) {
		map_touch(blk);
		munmap((void *)blk->map, (size_t)blk->map_len);
	}
	free(blk->map_filled);
	if (blk->fd >= 0)
		close(blk->fd);
	free(blk->path);
	pthread_mutex_destroy(&blk->track_lock);
	pthread_mutex_destroy(&blk->data_lock);
	free(blk);
}

void ioc_blk_get_info(struct ioc_blk *blk, struct ioc_blk_info *info)
{
	bool null = blk->driver == IOC_BLK_DRIVER_NULL;

	memset(info, 0, sizeof(*info));
	info->size = blk_size(blk);
	info->min_align = blk->req_align;
	info->opt_align = blk->opt_align;
	info->read_only = blk->read_only;
	info->can_discard = !blk->read_only;
	info->can_zero = !blk->read_only;
	info->can_fua = !blk->read_only;
	info->can_block_status = !null && !blk->is_blockdev;
	info->is_blockdev = blk->is_blockdev;
	info->aio = null ? "null" :
		blk->aio == IOC_BLK_AIO_THREADS ? "threads" : "io_uring";
	info->path = blk->path;
	info->direct = blk->o_direct;
}

int64_t ioc_blk_size(struct ioc_blk *blk)
{
	return (int64_t)blk_size(blk);
}

void ioc__blk_set_fault(struct ioc_blk *blk, ioc__blk_fault_fn *fn, void *opaque)
{
	blk->fault = fn;
	blk->fault_opaque = opaque;
}

void ioc__blk_set_fast_how(struct ioc_blk *blk, enum blk_fast_how how)
{
	blk->never_waits = how == BLK_FAST_PLAIN;
	/* Relaxed: set while no request is in flight, like the fault hook. */
	if (how == BLK_FAST_NOWAIT)
		atomic_fetch_or_explicit(&blk->caps, BLK_CAP_NOWAIT, memory_order_relaxed);
	if (how == BLK_FAST_CACHESTAT) {
		blk_cap_clear(blk, BLK_CAP_NOWAIT);
		atomic_fetch_or_explicit(&blk->caps, BLK_CAP_CACHESTAT,
					 memory_order_relaxed);
	}
}


/* ---- tracking for cache=none ----------------------------------------- */

static bool track_conflict(const struct blk_req *a, const struct blk_req *b)
{
	uint64_t al = a->blk->req_align;
	uint64_t a0 = align_down(a->offset, al), a1 = align_up(a->offset + a->len, al);
	uint64_t b0 = align_down(b->offset, al), b1 = align_up(b->offset + b->len, al);

	return (a->rmw || b->rmw || a->rmw_track || b->rmw_track) &&
		a0 < b1 && b0 < a1;
}

static void blk_dispatch(struct blk_req *r);

static void track_restart_task(struct ioc_task *task)
{
	struct blk_req *r = ioc_container_of(task, struct blk_req, u.task);

	blk_dispatch(r);
}

/*
 * Returns true when r may proceed (it is now tracked); false when it was
 * queued behind a conflicting request, which restarts it when it ends.
 *
 * The wait/wake handshake: a waiter links itself onto the blocker's
 * waiters list under track_lock, and track_end() (request.c) unlinks the
 * blocker and takes that list under the same lock.  So either the waiter's scan ran
 * before the unlink and its link is in the list track_end() takes (it is
 * restarted), or the scan ran after and did not see the blocker at all (it
 * proceeds): no restart is lost.  The restart is a task posted to the
 * waiter's own loop, which then dispatches it again (and may queue again
 * behind another request).
 */
static bool track_begin(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;

	pthread_mutex_lock(&blk->track_lock);
	for (struct blk_req *t = blk->tracked; t; t = t->track_next) {
		if (track_conflict(r, t)) {
			/* ioc__blk_finish() of t posts this task. */
			r->u.task.fn = track_restart_task;
			r->wait_next = t->waiters;
			t->waiters = r;
			pthread_mutex_unlock(&blk->track_lock);
			return false;
		}
	}
	r->track_next = blk->tracked;
	blk->tracked = r;
	r->tracked = true;
	pthread_mutex_unlock(&blk->track_lock);
	return true;
}



/* ---- dispatch -------------------------------------------------------- */

static bool iov_aligned(const struct ioc_blk *blk, const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		if ((uintptr_t)iov[i].iov_base % blk->mem_align ||
		    iov[i].iov_len % blk->mem_align)
			return false;
	}
	return true;
}

/* cache=none: decide how a misaligned read or write runs.  Returns 0 or
 * -ENOMEM. */
static int setup_bounce(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;
	uint64_t al = blk->req_align;
	bool pos_ok = r->offset % al == 0 && r->len % al == 0;

	if (pos_ok && iov_aligned(blk, r->iov, r->iovcnt))
		return 0;
	if (r->op == BLK_OP_WRITE && !pos_ok) {
		r->rmw = true; /* the rmw job reads r->iov itself */
		return 0;
	}
	size_t balign = blk->mem_align > al ? blk->mem_align : al;

	if (balign < sizeof(void *))
		balign = sizeof(void *);
	r->io_offset = align_down(r->offset, al);
	r->io_len = align_up(r->offset + r->len, al) - r->io_offset;
	if (posix_memalign(&r->bounce, balign, r->io_len))
		return -ENOMEM;
	r->user_iov = r->iov;
	r->user_iovcnt = r->iovcnt;
	if (r->op == BLK_OP_WRITE)
		ioc__blk_iov_to_buf(r->iov, r->iovcnt, r->bounce);
	r->bounce_iov.iov_base = r->bounce;
	r->bounce_iov.iov_len = r->io_len;
	r->iov = &r->bounce_iov;
	r->iovcnt = 1;
	return 0;
}

static void null_complete(void *opaque)
{
	struct blk_req *r = opaque;

	if (r->op == BLK_OP_READ && r->blk->null_read_zeroes)
		ioc__blk_iov_memset(r->iov, r->iovcnt, 0, 0, r->io_len);
	ioc__blk_finish(r, 0);
}

/* A latency is a timer on the submitting thread's loop (the request's
 * completion loop, or the coroutine's); with no loop it completes at once. */
static void null_submit(struct blk_req *r)
{
	struct ioc_loop *loop;

	if (ioc_unlikely(r->blk->fault)) {
		int64_t f = ioc__blk_fault_check(r, r->io_offset + r->done,
						 r->io_len - r->done);

		if (f < 0) {
			ioc__blk_finish(r, f);
			return;
		}
	}
	if (r->blk->null_latency_ns && (loop = ioc_loop_current())) {
		ioc_timer_init(&r->u.timer, loop, null_complete, r);
		ioc_timer_arm_in(&r->u.timer, r->blk->null_latency_ns);
		return;
	}
	null_complete(r);
}

/* Run r on its backend (tracking already decided). */
static void blk_dispatch(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;

	if (blk->driver == IOC_BLK_DRIVER_NULL) {
		null_submit(r);
		return;
	}
	if (blk_may_punch(r->op))
		ioc__blk_data_invalidate(blk);
	if (blk->o_direct && !r->tracked &&
	    (r->op == BLK_OP_WRITE || r->op == BLK_OP_ZEROES ||
	     r->op == BLK_OP_DISCARD)) {
		if (!track_begin(r))
			return; /* restarted by the conflicting request */
	}
	if (r->rmw || r->use_pool || blk->aio == IOC_BLK_AIO_THREADS)
		ioc__blk_threads_submit(r);
	else
		ioc__blk_uring_submit(r);
}

/* Which operations must go to the pool whatever the backend. */
static bool needs_pool(const struct blk_req *r)
{
	const struct ioc_blk *blk = r->blk;
	unsigned caps = blk_caps(blk);

	switch (r->op) {
	case BLK_OP_DISCARD:
		return blk->is_blockdev || !(caps & BLK_CAP_PUNCH);
	case BLK_OP_ZEROES:
		/* Only "punch a hole in a file" is one io_uring op; the
		 * allocate-zeroes chain has fallbacks. */
		return blk->is_blockdev || !(r->flags & IOC_BLK_MAY_UNMAP) ||
			!(caps & BLK_CAP_PUNCH);
	case BLK_OP_WRITE:
		return (r->flags & IOC_BLK_FUA) && !(caps & BLK_CAP_DSYNC);
	default:
		return false;
	}
}

static int check_range(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	uint64_t size = blk_size(blk);

	if (offset > size || len > size - offset)
		return -EINVAL;
	return 0;
}

#define BLK_KNOWN_FLAGS (IOC_BLK_FUA | IOC_BLK_MAY_UNMAP | \
			 IOC_BLK_NO_FALLBACK | IOC_BLK_NOWAIT_ONLY)

/* Validate; returns 0 to go on, or -errno. */
static int validate(struct ioc_blk *blk, enum blk_op op, uint64_t offset,
		    uint64_t len, const struct iovec *iov, int iovcnt, uint32_t flags)
{
	if (flags & ~BLK_KNOWN_FLAGS)
		return -EINVAL;
	if (op == BLK_OP_READ || op == BLK_OP_WRITE) {
		if (iovcnt < 0 || iovcnt > IOV_MAX || (iovcnt && !iov))
			return -EINVAL;
	}
	if (blk_is_sync(op, flags)) {
		int err = blk_wb_err(blk);

		if (err)
			return err; /* see "Write-back errors" above */
	}
	if (op == BLK_OP_FLUSH)
		return 0; /* harmless on a read-only image too */
	if (op != BLK_OP_READ && blk->read_only)
		return -EPERM;
	return check_range(blk, offset, len);
}

/*
 * Start a request.  done is what the inline attempt already transferred.
 * The request's result reaches cb(req, ret) exactly once.
 */
static void blk_submit(struct ioc_blk *blk, struct ioc_blk_req *req,
		       enum blk_op op, uint64_t offset, uint64_t len,
		       const struct iovec *iov, int iovcnt, uint32_t flags,
		       uint64_t done, bool direct_cb, ioc_blk_cb *cb, void *opaque)
{
	struct blk_req *r = blk_req_of(req);
	int ret;

	req->cb = cb;
	req->opaque = opaque;
	memset(r, 0, offsetof(struct blk_req, u));
	r->blk = blk;
	r->loop = ioc_loop_current();
	r->op = (uint8_t)op;
	r->offset = r->io_offset = offset;
	r->len = r->io_len = len;
	r->iov = iov;
	r->iovcnt = iovcnt;
	r->flags = flags;
	r->done = done;
	r->direct_cb = direct_cb;
	r->submitting = true;
	assert(r->loop || direct_cb);
	if (ioc_unlikely(!r->loop && blk->driver != IOC_BLK_DRIVER_NULL)) {
		/* A coroutine entered by hand on a thread without a loop:
		 * nothing could complete the request. */
		ioc__blk_finish(r, -ENOTSUP);
		goto out;
	}

	if (ioc_unlikely(done == len && op != BLK_OP_FLUSH)) {
		/* Empty, or the fast path already did it all. */
		ioc__blk_finish(r, 0);
		goto out;
	}
	if (op == BLK_OP_WRITE || blk_may_punch(op)) {
		/* Persistent dirty bitmaps: their bits on disk before the
		 * image changes (a no-op when the fast path did it).  On
		 * failure nothing is issued. */
		ret = blk_dirty_prepare(blk, offset, len);
		if (ret < 0) {
			ioc__blk_finish(r, ret);
			goto out;
		}
	}
	if (blk->o_direct && (op == BLK_OP_READ || op == BLK_OP_WRITE)) {
		ret = setup_bounce(r);
		if (ret < 0) {
			ioc__blk_finish(r, ret);
			goto out;
		}
	}
	if (blk->o_direct && op == BLK_OP_ZEROES &&
	    (offset % blk->req_align || len % blk->req_align)) {
		/* Its partial blocks may be zeroed by read-modify-write
		 * (write_zero_bytes): serialise it like one. */
		r->rmw_track = true;
	}
	r->use_pool = needs_pool(r);
	blk_dispatch(r);
out:
	r->submitting = false;
}

/* Callback API: report an error found before submission, deferred. */
static void fail_cb(struct ioc_blk_req *req, int ret, ioc_blk_cb *cb, void *opaque)
{
	struct blk_req *r = blk_req_of(req);

	req->cb = cb;
	req->opaque = opaque;
	memset(r, 0, offsetof(struct blk_req, u));
	r->loop = ioc_loop_current();
	assert(r->loop);
	r->submitting = true;
	ioc__blk_deliver(r, ret);
}

/* The callback API's last step: fail with ret < 0, else submit what is
 * left after done bytes (done == len completes in blk_submit's "nothing
 * left" check). */
static void submit_or_fail(struct ioc_blk *blk, struct ioc_blk_req *req, int ret,
			   enum blk_op op, uint64_t offset, uint64_t len,
			   const struct iovec *iov, int iovcnt, uint32_t flags,
			   uint64_t done, ioc_blk_cb *cb, void *opaque)
{
	if (ret < 0)
		fail_cb(req, ret, cb, opaque);
	else
		blk_submit(blk, req, op, offset, len, iov, iovcnt, flags, done,
			   false, cb, opaque);
}

static void blk_submit_cb(struct ioc_blk *blk, struct ioc_blk_req *req,
			  enum blk_op op, uint64_t offset, uint64_t len,
			  const struct iovec *iov, int iovcnt, uint32_t flags,
			  ioc_blk_cb *cb, void *opaque)
{
	submit_or_fail(blk, req, validate(blk, op, offset, len, iov, iovcnt, flags),
		       op, offset, len, iov, iovcnt, flags, 0, cb, opaque);
}

/* ---- fast path ------------------------------------------------------- */

/* cachestat(2) (Linux 6.5): how much of a range is in the page cache. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct blk_cachestat_range { uint64_t off, len; };
struct blk_cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/*
 * For file systems without RWF_NOWAIT (tmpfs among them): ask cachestat(2)
 * whether every page of the range is cached, and if so read it with a plain
 * preadv.  A page evicted between the two calls makes that one read block
 * for the time of a page-in: a bounded, rare cost accepted for a fast path
 * on such file systems.  Returns what preadv returned, or -EAGAIN.
 */
static bool range_cached(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	static long page_size;
	struct blk_cachestat_range range;
	struct blk_cachestat cs;
	uint64_t first, last;

	if (!page_size)
		page_size = sysconf(_SC_PAGESIZE);
	first = offset / (uint64_t)page_size;
	last = (offset + len - 1) / (uint64_t)page_size;
	range.off = first * (uint64_t)page_size;
	range.len = (last - first + 1) * (uint64_t)page_size;
	if (syscall(__NR_cachestat, blk->fd, &range, &cs, 0) < 0) {
		if (errno == ENOSYS || errno == EOPNOTSUPP || errno == EBADF)
			blk_cap_clear(blk, BLK_CAP_CACHESTAT);
		return false;
	}
	return cs.nr_cache >= last - first + 1;
}

static ssize_t cached_read(struct ioc_blk *blk, uint64_t offset, uint64_t len,
			   const struct iovec *iov, int iovcnt)
{
	if (!range_cached(blk, offset, len))
		return -EAGAIN;
	return preadv(blk->fd, iov, iovcnt, (off_t)offset);
}

/*
 * Try the read inline.  Returns the bytes read (possibly fewer than len:
 * the caller continues asynchronously from there), or -EAGAIN when the
 * data is not cached (or the fast path is backing off).
 *
 * Back-off: fp_credit drops by one per miss and is refilled by a hit; at
 * zero the fast path is skipped except one request in FP_PROBE_EVERY per
 * thread.  Relaxed loads and stores that pair with nothing (it is a
 * heuristic), not read-modify-writes: a lost update between two loops only
 * shifts when the back-off starts, and a store only happens when the value
 * changes, so hits on a hot image write nothing.
 */
static ssize_t fast_read(struct ioc_blk *blk, uint64_t offset, uint64_t len,
			 const struct iovec *iov, int iovcnt, uint32_t flags)
{
	static __thread unsigned probe;
	int credit = atomic_load_explicit(&blk->fp_credit, memory_order_relaxed);
	unsigned caps = blk_caps(blk);
	ssize_t n;

	if (credit <= 0 && !(flags & IOC_BLK_NOWAIT_ONLY) &&
	    ++probe % FP_PROBE_EVERY)
		return -EAGAIN;
	if (blk->never_waits) {
		n = preadv(blk->fd, iov, iovcnt, (off_t)offset);
	} else if (caps & BLK_CAP_NOWAIT) {
		n = preadv2(blk->fd, iov, iovcnt, (off_t)offset, RWF_NOWAIT);
		if (n < 0 && errno == EOPNOTSUPP) {
			/* This file system cannot do it: stop trying for
			 * good, and use cachestat instead. */
			blk_cap_clear(blk, BLK_CAP_NOWAIT);
			n = (caps & BLK_CAP_CACHESTAT) ?
				cached_read(blk, offset, len, iov, iovcnt) : -EAGAIN;
		}
	} else {
		n = cached_read(blk, offset, len, iov, iovcnt);
	}
	if (n > 0) {
		if (credit != FP_CREDIT_MAX)
			atomic_store_explicit(&blk->fp_credit, FP_CREDIT_MAX,
					      memory_order_relaxed);
		return n;
	}
	if (credit > 0)
		atomic_store_explicit(&blk->fp_credit, credit - 1, memory_order_relaxed);
	return -EAGAIN;
}

static inline bool fast_path_ok(struct ioc_blk *blk, uint32_t flags)
{
	if (blk->fault || blk->o_direct || blk->driver != IOC_BLK_DRIVER_FILE)
		return false;
	if (!(blk_caps(blk) &
	      (BLK_CAP_NOWAIT | BLK_CAP_CACHESTAT)))
		return false;
	return blk->fast_path || (flags & IOC_BLK_NOWAIT_ONLY);
}

/* Writes inline only where they cannot wait for I/O (tmpfs without swap):
 * no kernel offers a non-blocking buffered write through pwritev2 (ext4,
 * xfs and tmpfs all refuse RWF_NOWAIT there).  FUA writes always go to the
 * backend. */
static inline bool fast_write_ok(struct ioc_blk *blk, uint32_t flags)
{
	return blk->never_waits && blk->fast_path && !blk->fault &&
		!(flags & IOC_BLK_FUA);
}

/* Read inline what the page cache holds now: *done bytes of len (all,
 * some or none), the rest for the backend; -EAGAIN where
 * IOC_BLK_NOWAIT_ONLY wants all of it and not all is cached. */
static int fast_read_try(struct ioc_blk *blk, uint64_t offset, uint64_t len,
			 const struct iovec *iov, int iovcnt, uint32_t flags, uint64_t *done)
{
	ssize_t n;

	*done = 0;
	if (!len || !fast_path_ok(blk, flags))
		return (flags & IOC_BLK_NOWAIT_ONLY) ? -EAGAIN : 0;
	n = fast_read(blk, offset, len, iov, iovcnt, flags);
	if ((uint64_t)n != len && (flags & IOC_BLK_NOWAIT_ONLY))
		return -EAGAIN; /* not all of it was cached */
	if (n > 0)
		*done = (uint64_t)n;
	return 0;
}

/*
 * Zero-copy reads: the pipe takes references to the page-cache pages, so
 * the caller can splice them on to a socket without the data ever being
 * copied through user space.  Inline like the fast path and under the
 * same rules (buffered file, no fault hook, fast path on); a range not
 * wholly cached is refused rather than read, since splice(2) has no
 * RWF_NOWAIT and would block the loop on the disk.  Reads nothing past
 * the end of file (a short count, where preadv would zero-fill).  The
 * data is what the file holds at the time of the call: a later write to
 * the range changes what the pipe's pages show, as it would for a read
 * still in flight.
 */
ssize_t ioc_blk_splice_read(struct ioc_blk *blk, uint64_t offset, size_t len,
			    int pipe_fd, uint32_t flags)
{
	size_t done = 0;

	if (flags || offset > blk_size(blk) || len > blk_size(blk) - offset)
		return -EINVAL;
	if (blk->fault || blk->o_direct || blk->driver != IOC_BLK_DRIVER_FILE ||
	    !blk->fast_path || !(blk_caps(blk) & BLK_CAP_SPLICE))
		return -ENOTSUP;
	if (len == 0)
		return 0;
	if (!blk->never_waits &&
	    (!(blk_caps(blk) & BLK_CAP_CACHESTAT) || !range_cached(blk, offset, len)))
		return -EAGAIN;
	while (done < len) {
		loff_t off = (loff_t)(offset + done);
		ssize_t n = splice(blk->fd, &off, pipe_fd, NULL, len - done,
				   SPLICE_F_NONBLOCK);

		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n == 0)
			break; /* end of file */
		if (errno == EINTR)
			continue;
		if (done > 0 || errno == EAGAIN)
			break; /* the pipe is full */
		if (errno == EINVAL || errno == EOPNOTSUPP) {
			/* This file system cannot splice: never again. */
			blk_cap_clear(blk, BLK_CAP_SPLICE);
			return -ENOTSUP;
		}
		return -errno;
	}
	return done ? (ssize_t)done : -EAGAIN;
}

/*
 * Zero-copy writes' other half: the pipe's pages (a socket's, spliced in
 * without a copy) are written to the file with one copy, into the page
 * cache.  Only where a write cannot wait (tmpfs without swap, the rule of
 * inline writes above) and never FUA: anything else is -ENOTSUP with the
 * pipe untouched, for the caller to write the ordinary way.
 */
static int splice_write_check(struct ioc_blk *blk, uint64_t offset, size_t len,
			      uint32_t flags)
{
	if (flags & ~IOC_BLK_FUA)
		return -EINVAL;
	if (blk->read_only)
		return -EPERM;
	if (offset > blk_size(blk) || len > blk_size(blk) - offset)
		return -EINVAL;
	if (!fast_write_ok(blk, flags) || blk->driver != IOC_BLK_DRIVER_FILE ||
	    !(blk_caps(blk) & BLK_CAP_SPLICE))
		return -ENOTSUP;
	return 0;
}

/* The checked splice itself: any thread. */
static int splice_write_now(struct ioc_blk *blk, uint64_t offset, size_t len, int pipe_fd)
{
	size_t done = 0;
	int ret = blk_dirty_prepare(blk, offset, len);

	if (ret < 0)
		return ret;
	while (done < len) {
		loff_t off = (loff_t)(offset + done);
		ssize_t n = splice(pipe_fd, NULL, blk->fd, &off, len - done, 0);

		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		ret = n == 0 ? -EIO : -errno; /* n == 0: the pipe had less */
		if (done == 0 && (ret == -EINVAL || ret == -EOPNOTSUPP)) {
			blk_cap_clear(blk, BLK_CAP_SPLICE);
			return -ENOTSUP;
		}
		blk_dirty_mark(blk, offset, len); /* as in ioc__blk_finish() */
		return ret;
	}
	return blk_dirty_mark(blk, offset, len);
}

int ioc_blk_splice_write(struct ioc_blk *blk, uint64_t offset, size_t len,
			 int pipe_fd, uint32_t flags)
{
	int ret = splice_write_check(blk, offset, len, flags);

	if (ret < 0 || len == 0)
		return ret;
	return splice_write_now(blk, offset, len, pipe_fd);
}

/*
 * Large writes.  An inline write of a megabyte into tmpfs is a copy of a
 * quarter of a millisecond or more on the caller's thread; an NBD server's
 * loop thread that makes it cannot receive meanwhile, and a client whose
 * socket buffer holds less than a request waits for it.  So from
 * IOC_BLK_WRITER_MIN on, inline writes (and spliced ones) run on the
 * image's writer: a pool of one thread, since buffered writes to one file
 * hold its inode lock and more threads would only wait for each other
 * (a loop's pool grew to 14 threads spinning on that lock).  It is the
 * image's, not a loop's, so loops writing to one image share it.  Smaller
 * writes stay inline: at 64 KiB the hand-off (a pool job, a yield, a
 * completion) cost more than the copy it moved (bench/nbd/NOTES.md).
 * Without a writer (out of memory) the write stays inline.
 */
static struct ioc_pool *blk_writer(struct ioc_blk *blk)
{
	/* Acquire pairs with the release of the CAS below. */
	struct ioc_pool *p = atomic_load_explicit(&blk->writer, memory_order_acquire);
	struct ioc_pool *none = NULL;
	struct ioc_pool_opts o = {
		.max_threads = 1,
		.idle_timeout_ms = 1000,
		.name = "ioc-blkw",
	};

	if (p)
		return p;
	if (ioc_pool_new(&p, &o) < 0)
		return NULL;
	/* Release publishes the new pool to other loops' acquire loads
	 * (above); acquire on failure pairs with the winner's release. */
	if (!atomic_compare_exchange_strong_explicit(&blk->writer, &none, p,
						     memory_order_acq_rel,
						     memory_order_acquire)) {
		ioc_pool_free(p);
		return none;
	}
	return p;
}

/*
 * The writer, where it pays: a large write from a coroutine on a loop,
 * while the writer is idle.  Otherwise the loop copies the write itself:
 * with several connections (or loops) writing, a queue on one thread only
 * adds waiting, and the loops' own copies run side by side.  1 MiB writes
 * from four connections, against writing inline: always queueing gave
 * 0.92x the throughput at 2.6x the p99; a queue of two 0.88x at 1.5x;
 * idle only, par.  From one connection: 1.57x, 1.36x, 1.07x
 * (bench/nbd/NOTES.md).
 */
#define IOC_BLK_WRITER_QUEUE 1u

static struct ioc_pool *writer_for(struct ioc_blk *blk, uint64_t len)
{
	if (len < IOC_BLK_WRITER_MIN || !ioc_in_coroutine() || !ioc_loop_current())
		return NULL;
	/* Relaxed: a hint (blk-int.h), paired with nothing. */
	if (atomic_load_explicit(&blk->writer_jobs, memory_order_relaxed) >=
	    IOC_BLK_WRITER_QUEUE)
		return NULL;
	return blk_writer(blk);
}

static int64_t ioc_coroutine_fn writer_run(struct ioc_blk *blk, struct ioc_pool *w,
					   int64_t (*fn)(void *), void *job)
{
	int64_t ret;

	/* Relaxed, both: the count is a hint read by writer_for(). */
	atomic_fetch_add_explicit(&blk->writer_jobs, 1, memory_order_relaxed);
	ret = ioc_pool_co_run(w, fn, job);
	atomic_fetch_sub_explicit(&blk->writer_jobs, 1, memory_order_relaxed);
	return ret;
}

struct writer_job {
	struct ioc_blk *blk;
	uint64_t offset;
	size_t len;
	int pipe_fd;
	const struct iovec *iov;
	int iovcnt;
};

static int64_t writer_splice(void *arg)
{
	struct writer_job *j = arg;

	return splice_write_now(j->blk, j->offset, j->len, j->pipe_fd);
}

int ioc_coroutine_fn ioc_blk_co_splice_write(struct ioc_blk *blk, uint64_t offset,
					     size_t len, int pipe_fd, uint32_t flags)
{
	int ret = splice_write_check(blk, offset, len, flags);
	struct ioc_pool *w;

	if (ret < 0 || len == 0)
		return ret;
	if ((w = writer_for(blk, len))) {
		struct writer_job j = { .blk = blk, .offset = offset, .len = len,
					.pipe_fd = pipe_fd };

		return (int)writer_run(blk, w, writer_splice, &j);
	}
	return splice_write_now(blk, offset, len, pipe_fd);
}

/* An inline write on the writer: all of it, by the thread backend's own
 * loop (short writes, EINTR, no progress). */
static int64_t writer_pwritev(void *arg)
{
	struct writer_job *j = arg;
	struct blk_req r = { .blk = j->blk, .iov = j->iov, .iovcnt = j->iovcnt,
			     .offset = j->offset, .len = j->len, .io_offset = j->offset,
			     .io_len = j->len, .op = BLK_OP_WRITE };
	int64_t ret = blk_dirty_prepare(j->blk, j->offset, j->len);

	if (ret < 0)
		return ret;
	ret = ioc__blk_sync_rw(&r);
	free(r.tmp_iov);
	blk_dirty_mark(j->blk, j->offset, j->len); /* as in ioc__blk_finish() */
	return ret;
}

/* ---- coroutine API --------------------------------------------------- */

struct co_call {
	struct ioc_blk_req req;
	struct ioc_co_await aw;
};

static void co_done(struct ioc_blk_req *req, int ret)
{
	struct co_call *c = ioc_container_of(req, struct co_call, req);

	ioc_co_await_done(&c->aw, ret);
}

static int ioc_coroutine_fn co_run(struct ioc_blk *blk, enum blk_op op,
				   uint64_t offset, uint64_t len,
				   const struct iovec *iov, int iovcnt,
				   uint32_t flags, uint64_t done)
{
	struct co_call c;

	ioc_co_await_init(&c.aw);
	blk_submit(blk, &c.req, op, offset, len, iov, iovcnt, flags, done, true,
		   co_done, NULL);
	return (int)ioc_co_await(&c.aw);
}

int ioc_coroutine_fn ioc_blk_co_preadv(struct ioc_blk *blk, uint64_t offset,
				       const struct iovec *iov, int iovcnt, uint32_t flags)
{
	uint64_t len = iov_total(iov, iovcnt);
	uint64_t done = 0;
	int ret = validate(blk, BLK_OP_READ, offset, len, iov, iovcnt, flags);

	if (ret == 0)
		ret = fast_read_try(blk, offset, len, iov, iovcnt, flags, &done);
	if (ret < 0 || (len && done == len))
		return ret;
	return co_run(blk, BLK_OP_READ, offset, len, iov, iovcnt, flags, done);
}

int ioc_coroutine_fn ioc_blk_co_pwritev(struct ioc_blk *blk, uint64_t offset,
					const struct iovec *iov, int iovcnt, uint32_t flags)
{
	uint64_t len = iov_total(iov, iovcnt);
	int ret = validate(blk, BLK_OP_WRITE, offset, len, iov, iovcnt, flags);

	uint64_t done = 0;

	if (ret < 0)
		return ret;
	if (fast_write_ok(blk, flags) && len) {
		ssize_t n;
		struct ioc_pool *w = writer_for(blk, len);

		if (w) {
			struct writer_job j = { .blk = blk, .offset = offset, .len = len,
						.iov = iov, .iovcnt = iovcnt };

			return (int)writer_run(blk, w, writer_pwritev, &j);
		}
		ret = blk_dirty_prepare(blk, offset, len);
		if (ret < 0)
			return ret;
		n = pwritev(blk->fd, iov, iovcnt, (off_t)offset);
		if ((uint64_t)n == len)
			return blk_dirty_mark(blk, offset, len);
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			ret = -errno;
			blk_dirty_mark(blk, offset, len); /* as in ioc__blk_finish() */
			return ret;
		}
		if (n > 0)
			done = (uint64_t)n;
	}
	return co_run(blk, BLK_OP_WRITE, offset, len, iov, iovcnt, flags, done);
}

int ioc_coroutine_fn ioc_blk_co_flush(struct ioc_blk *blk, uint32_t flags)
{
	int ret = validate(blk, BLK_OP_FLUSH, 0, 0, NULL, 0, flags);

	if (ret < 0)
		return ret;
	map_touch(blk);
	return co_run(blk, BLK_OP_FLUSH, 0, 0, NULL, 0, flags, 0);
}

/*
 * A discard or write-zeroes may punch a hole, and a read through the
 * mapping faults a tmpfs hole back in as an allocated page: the memory
 * the client freed would come back, and block status would report data
 * there.  So the first of them ends lending for this image (ordinary
 * reads see the hole as zeroes and leave it a hole).  Relaxed: pairs with
 * the load in ioc_blk_map_read(); a read racing with the punch is
 * unordered against it anyway, and at worst allocates one range again.
 */
static void map_stop(struct ioc_blk *blk)
{
	if (blk->map)
		atomic_store_explicit(&blk->map_broken, true, memory_order_relaxed);
}

/* Discard and write-zeroes: a range without data, which may punch a hole. */
static int ioc_coroutine_fn co_hole_op(struct ioc_blk *blk, enum blk_op op, uint64_t offset,
				       uint64_t len, uint32_t flags)
{
	int ret = validate(blk, op, offset, len, NULL, 0, flags);

	if (ret < 0 || len == 0)
		return ret;
	map_stop(blk);
	return co_run(blk, op, offset, len, NULL, 0, flags, 0);
}

int ioc_coroutine_fn ioc_blk_co_discard(struct ioc_blk *blk, uint64_t offset,
					uint64_t len, uint32_t flags)
{
	return co_hole_op(blk, BLK_OP_DISCARD, offset, len, flags);
}

int ioc_coroutine_fn ioc_blk_co_write_zeroes(struct ioc_blk *blk, uint64_t offset,
					     uint64_t len, uint32_t flags)
{
	return co_hole_op(blk, BLK_OP_ZEROES, offset, len, flags);
}

/*
 * Block status from SEEK_DATA/SEEK_HOLE, run inline (no I/O: extent maps
 * or the page cache).  SEEK_HOLE is not cheap everywhere: tmpfs answers it
 * by walking the page cache from offset to the next hole, which on a fully
 * written image is the end of the file -- 1.4 ms per call on a 256 MiB
 * image, so an NBD client reading it in 256 KiB requests (each sparse
 * read asks first) got 190 MB/s where nbdkit, which never asks, got 1.9
 * GB/s.  So the region that SEEK_HOLE reported as data is remembered
 * (QEMU's file-posix keeps the same kind of cache) and asked first; a
 * write only adds data, so only discard, write-zeroes and truncate drop
 * it.  A stale region could only ever report data where a hole is, which
 * NBD's base:allocation allows ("allocated or unknown").
 */
int ioc_coroutine_fn ioc_blk_co_block_status(struct ioc_blk *blk, uint64_t offset,
					     uint64_t len, uint64_t *pnum, uint32_t flags)
{
	uint64_t size = blk_size(blk);
	off_t data, hole;

	*pnum = 0;
	if (flags & ~BLK_KNOWN_FLAGS)
		return -EINVAL;
	if (len == 0 || offset >= size)
		return -EINVAL;
	if (len > size - offset)
		len = size - offset;
	if (blk->driver == IOC_BLK_DRIVER_NULL) {
		*pnum = len;
		return blk->null_read_zeroes ? IOC_BLK_STATUS_ZERO :
			IOC_BLK_STATUS_DATA;
	}
	if (blk->is_blockdev)
		goto all_data;

	uint64_t gen, known = ioc__blk_data_lookup(blk, offset, &gen);
	if (known) {
		*pnum = known < len ? known : len;
		return IOC_BLK_STATUS_DATA;
	}
	data = lseek(blk->fd, (off_t)offset, SEEK_DATA);
	if (data < 0) {
		if (errno == ENXIO) {
			/* No data at or after offset: a hole to the end. */
			*pnum = len;
			return IOC_BLK_STATUS_ZERO;
		}
		if (errno == EINVAL || errno == EOPNOTSUPP)
			goto all_data;
		return -errno;
	}
	if ((uint64_t)data > offset) {
		uint64_t n = (uint64_t)data - offset;

		*pnum = n < len ? n : len;
		return IOC_BLK_STATUS_ZERO;
	}
	hole = lseek(blk->fd, (off_t)offset, SEEK_HOLE);
	if (hole < 0) {
		if (errno == EINVAL || errno == EOPNOTSUPP || errno == ENXIO)
			goto all_data;
		return -errno;
	}
	if ((uint64_t)hole <= offset)
		goto all_data; /* raced with a write or truncate */
	ioc__blk_data_store(blk, gen, offset, (uint64_t)hole);
	*pnum = (uint64_t)hole - offset < len ? (uint64_t)hole - offset : len;
	return IOC_BLK_STATUS_DATA;
all_data:
	*pnum = len;
	return IOC_BLK_STATUS_DATA;
}

struct truncate_job {
	struct ioc_blk *blk;
	uint64_t size;
};

static int64_t truncate_work(void *arg)
{
	struct truncate_job *j = arg;

	return ftruncate(j->blk->fd, (off_t)j->size) < 0 ? -errno : 0;
}

int ioc_coroutine_fn ioc_blk_co_truncate(struct ioc_blk *blk, uint64_t size, uint32_t flags)
{
	struct truncate_job j = { .blk = blk, .size = size };
	struct ioc_pool *pool;
	int64_t ret;

	if (flags & ~BLK_KNOWN_FLAGS)
		return -EINVAL;
	if (blk->read_only)
		return -EPERM;
	if (size > INT64_MAX)
		return -EINVAL;
	if (blk->driver == IOC_BLK_DRIVER_NULL) {
		blk_set_size(blk, size);
		return 0;
	}
	if (blk->is_blockdev)
		return size == blk_size(blk) ?
			0 : -ENOTSUP;
	pool = ioc_pool_for_loop(ioc_loop_current());
	if (!pool)
		return -ENOMEM;
	/* Shrinking and growing again would leave a hole where the data
	 * region was: drop it on both sides, as for discard. */
	ioc__blk_data_invalidate(blk);
	ret = ioc_pool_co_run(pool, truncate_work, &j);
	ioc__blk_data_invalidate(blk);
	if (ret == 0)
		blk_set_size(blk, size);
	return (int)ret;
}

/* ---- callback API ---------------------------------------------------- */

/* Write inline where that cannot wait (fast_write_ok()): *done bytes of
 * len, the rest for the backend. */
static int fast_write_try(struct ioc_blk *blk, uint64_t offset, uint64_t len,
			  const struct iovec *iov, int iovcnt, uint32_t flags, uint64_t *done)
{
	ssize_t n;
	int ret;

	*done = 0;
	if (!len || !fast_write_ok(blk, flags))
		return 0;
	ret = blk_dirty_prepare(blk, offset, len);
	if (ret < 0)
		return ret;
	n = pwritev(blk->fd, iov, iovcnt, (off_t)offset);
	if (n < 0 && errno != EAGAIN && errno != EINTR)
		return -errno;
	if (n > 0)
		*done = (uint64_t)n;
	return 0;
}

/* A read or write of the callback API: checked, done inline as far as it
 * can be without waiting, the rest submitted (or the error reported). */
static void rw_cb(struct ioc_blk *blk, struct ioc_blk_req *req, enum blk_op op,
		  uint64_t offset, const struct iovec *iov, int iovcnt, uint32_t flags,
		  ioc_blk_cb *cb, void *opaque)
{
	uint64_t len = iov_total(iov, iovcnt), done = 0;
	int ret = validate(blk, op, offset, len, iov, iovcnt, flags);

	if (ret == 0 && op == BLK_OP_READ)
		ret = fast_read_try(blk, offset, len, iov, iovcnt, flags, &done);
	else if (ret == 0)
		ret = fast_write_try(blk, offset, len, iov, iovcnt, flags, &done);
	submit_or_fail(blk, req, ret, op, offset, len, iov, iovcnt, flags, done, cb, opaque);
}

void ioc_blk_preadv(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		    const struct iovec *iov, int iovcnt, uint32_t flags,
		    ioc_blk_cb *cb, void *opaque)
{
	rw_cb(blk, req, BLK_OP_READ, offset, iov, iovcnt, flags, cb, opaque);
}

void ioc_blk_pwritev(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		     const struct iovec *iov, int iovcnt, uint32_t flags,
		     ioc_blk_cb *cb, void *opaque)
{
	rw_cb(blk, req, BLK_OP_WRITE, offset, iov, iovcnt, flags, cb, opaque);
}

void ioc_blk_flush(struct ioc_blk *blk, struct ioc_blk_req *req, uint32_t flags,
		   ioc_blk_cb *cb, void *opaque)
{
	blk_submit_cb(blk, req, BLK_OP_FLUSH, 0, 0, NULL, 0, flags, cb, opaque);
}

void ioc_blk_discard(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		     uint64_t len, uint32_t flags, ioc_blk_cb *cb, void *opaque)
{
	blk_submit_cb(blk, req, BLK_OP_DISCARD, offset, len, NULL, 0, flags, cb, opaque);
}

void ioc_blk_write_zeroes(struct ioc_blk *blk, struct ioc_blk_req *req,
			  uint64_t offset, uint64_t len, uint32_t flags,
			  ioc_blk_cb *cb, void *opaque)
{
	blk_submit_cb(blk, req, BLK_OP_ZEROES, offset, len, NULL, 0, flags, cb, opaque);
}
