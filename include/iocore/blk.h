/*
 * iocore block layer: raw images and block devices over io_uring or the
 * thread pool, plus a null driver.
 *
 * One struct ioc_blk may be used from several loops at once (one per I/O
 * thread): each request runs on the caller's current loop (its ring, or its
 * thread pool).  All results are 0 (or a count) or -errno.
 */
#ifndef IOCORE_BLK_H
#define IOCORE_BLK_H

#include <sys/uio.h>

#include "iocore/common.h"
#include "iocore/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_blk;

enum ioc_blk_driver { IOC_BLK_DRIVER_FILE = 0, IOC_BLK_DRIVER_NULL };
enum ioc_blk_aio { IOC_BLK_AIO_AUTO = 0, IOC_BLK_AIO_IO_URING, IOC_BLK_AIO_THREADS };
enum ioc_blk_cache { IOC_BLK_CACHE_WRITEBACK = 0, IOC_BLK_CACHE_NONE };

struct ioc_blk_opts {
	enum ioc_blk_driver driver;
	enum ioc_blk_aio aio;      /* AUTO: io_uring when the loop has a ring */
	enum ioc_blk_cache cache;  /* NONE = O_DIRECT */
	bool read_only;
	bool no_fast_path;         /* disable inline preadv2(RWF_NOWAIT) */
	uint64_t null_size;        /* size of the null driver's device */
	bool null_read_zeroes;     /* null driver: reads fill zeroes (default:
				    * buffers are left as they are, like
				    * QEMU's null-co) and status says ZERO */
	int64_t null_latency_ns;   /* null driver: each request completes this
				    * long after it is submitted, on the
				    * submitting thread's loop (QEMU's null-co
				    * latency-ns); 0: at once */
};

/* Open path (ignored by the null driver).  Returns 0 or -errno. */
int ioc_blk_open(struct ioc_blk **out, const char *path,
		 const struct ioc_blk_opts *opts);
/* Close; no request may be in flight.  Persistent dirty bitmaps are
 * written out (a clean stop). */
void ioc_blk_close(struct ioc_blk *blk);
/* Stop the background work of an open image that only makes later I/O
 * cheaper (regrouping a tmpfs image into huge pages), for a job that needs
 * the CPU and the pages now, such as a migration.  Returns after at most
 * one step of it (a 2 MiB range).  Not restarted.  Same thread as open
 * and close. */
void ioc_blk_stop_background(struct ioc_blk *blk);

struct ioc_blk_info {
	uint64_t size;
	uint32_t min_align;   /* request alignment honoured without bouncing */
	uint32_t opt_align;
	bool read_only;
	bool can_discard, can_zero, can_fua, can_block_status;
	bool is_blockdev;
	const char *aio;      /* "io_uring", "threads" or "null" */
	const char *path;     /* as opened; NULL for the null driver */
	bool direct;          /* cache=none */
};
void ioc_blk_get_info(struct ioc_blk *blk, struct ioc_blk_info *info);
int64_t ioc_blk_size(struct ioc_blk *blk);
int ioc_coroutine_fn ioc_blk_co_truncate(struct ioc_blk *blk, uint64_t size, uint32_t flags);

/* Request flags. */
enum {
	IOC_BLK_FUA          = 1u << 0, /* write: durable before completion */
	IOC_BLK_MAY_UNMAP    = 1u << 1, /* write_zeroes: punching a hole is fine */
	IOC_BLK_NO_FALLBACK  = 1u << 2, /* write_zeroes: fail -ENOTSUP unless fast */
	IOC_BLK_NOWAIT_ONLY  = 1u << 3, /* read: only the inline attempt (-EAGAIN) */
};

/* Block status bits (from SEEK_DATA/SEEK_HOLE). */
enum {
	IOC_BLK_STATUS_DATA = 1u << 0, /* allocated */
	IOC_BLK_STATUS_ZERO = 1u << 1, /* reads as zero */
};

/*
 * Coroutine API: yields until done.  Reads past the end fail -EINVAL;
 * the transfer is complete or an error (short transfers are retried).
 * Writes, discards and write-zeroes past the end fail -EINVAL too, and
 * -EPERM on a read-only image.  Unknown flag bits fail -EINVAL.
 *
 * With cache=none, any offset, length and buffer alignment is accepted:
 * misaligned requests are bounced (and writes read-modify-written, with
 * overlapping writes serialised), at the cost of a copy.
 *
 * discard punches a hole in a file (BLKDISCARD on a device: whole logical
 * blocks only); it is a hint, and succeeds where it cannot be done.
 * write_zeroes: with MAY_UNMAP a hole is punched; otherwise the range is
 * zeroed allocated (ZERO_RANGE, else punch + preallocate, else BLKZEROOUT
 * on a device), and as a last resort zeroes are written, unless
 * NO_FALLBACK asks for -ENOTSUP instead.  FUA works on write and
 * write_zeroes (RWF_DSYNC, or fdatasync after).
 */
int ioc_coroutine_fn ioc_blk_co_preadv(struct ioc_blk *blk, uint64_t offset,
				       const struct iovec *iov, int iovcnt, uint32_t flags);
int ioc_coroutine_fn ioc_blk_co_pwritev(struct ioc_blk *blk, uint64_t offset,
					const struct iovec *iov, int iovcnt, uint32_t flags);
int ioc_coroutine_fn ioc_blk_co_flush(struct ioc_blk *blk, uint32_t flags);
int ioc_coroutine_fn ioc_blk_co_discard(struct ioc_blk *blk, uint64_t offset,
					uint64_t len, uint32_t flags);
int ioc_coroutine_fn ioc_blk_co_write_zeroes(struct ioc_blk *blk, uint64_t offset,
					     uint64_t len, uint32_t flags);
/* Status of [offset, offset+len): returns the IOC_BLK_STATUS_* bits of the
 * first extent and stores its length (<= len, > 0) in *pnum; or -errno.
 * len is clipped at the end of the image; offset must be inside it.  A
 * hole is ZERO, data is DATA (devices and the null driver: all DATA, or
 * ZERO for a null driver with null_read_zeroes).  Runs inline (lseek). */
int ioc_coroutine_fn ioc_blk_co_block_status(struct ioc_blk *blk, uint64_t offset,
					     uint64_t len, uint64_t *pnum, uint32_t flags);

/*
 * Splice up to len bytes at offset into the pipe pipe_fd without copying
 * them (the pipe holds page-cache pages), inline, never waiting for I/O.
 * Returns the bytes spliced (short at the end of file or when the pipe is
 * full), -EAGAIN when the range is not all cached (read it the ordinary
 * way), -ENOTSUP when this image can never do it (cache=none, the null
 * driver, a file system without splice, the fast path off, a fault hook),
 * -EINVAL for a range outside the image or unknown flags, or another
 * -errno.  Thread-safe like the other calls.
 */
ssize_t ioc_blk_splice_read(struct ioc_blk *blk, uint64_t offset, size_t len,
			    int pipe_fd, uint32_t flags);

/*
 * Where a read can be served without a copy to a buffer: a pointer to the
 * len bytes at offset in a shared read-only mapping of the image, valid
 * until ioc_blk_close(), or NULL (read the ordinary way).  Only for images
 * that never wait for I/O (tmpfs without swap), were fully allocated at
 * open and had nothing discarded or zeroed since, with the fast path on
 * and no fault hook, and only inside the size both at open and now.  The bytes are the file's at the time they are
 * read, not of the call.  Meant to be handed to the kernel (an iovec for
 * sendmsg) and not touched from user space: if the file is cut short under
 * the mapping, the kernel's copy fails with EFAULT where a user-space
 * access would raise SIGBUS.  Thread-safe like the other calls.
 */
const void *ioc_blk_map_read(struct ioc_blk *blk, uint64_t offset, size_t len);
/* The kernel's copy from what ioc_blk_map_read() lent failed (EFAULT):
 * lend nothing more, and read len bytes at offset into buf with pread,
 * zeroes past the end of the file (a read that never waits, inline).
 * Returns 0 or -errno. */
int ioc_blk_map_fault(struct ioc_blk *blk, uint64_t offset, void *buf, size_t len);

/*
 * Where a write's bytes can be put without a write(2): a pointer to the
 * len bytes at offset in the same mapping, made writable for writable
 * images, or NULL (write the ordinary way).  The rules of
 * ioc_blk_map_read(), and flags 0 (IOC_BLK_FUA: NULL).  Persistent dirty
 * bitmaps are prepared before it returns; once the bytes are in, or when
 * the caller gives up after storing part of them, it calls
 * ioc_blk_map_written() with the same range (0 or -errno, as a write's
 * bitmap marking).  Meant for the kernel to copy into (an iovec for
 * recvmsg), as with ioc_blk_map_read(): a file cut short fails that copy
 * with EFAULT.  Concurrent writes to one range end as concurrent pwritev
 * calls would: in some order, perhaps torn.  Thread-safe.
 */
void *ioc_blk_map_write(struct ioc_blk *blk, uint64_t offset, size_t len, uint32_t flags);
int ioc_blk_map_written(struct ioc_blk *blk, uint64_t offset, size_t len);
/* Between the two, bytes from a buffer into part of that range: a pwrite
 * (the image never waits), with no bitmap work of its own.  0 or -errno. */
int ioc_blk_map_store(struct ioc_blk *blk, uint64_t offset, const void *buf, size_t len);

/*
 * Write len bytes taken from the pipe pipe_fd at offset (one copy, into
 * the page cache), inline.  Returns 0; -ENOTSUP with the pipe untouched
 * where it cannot be done without waiting (all but tmpfs without swap,
 * FUA, cache=none, the null driver, a fault hook; write the ordinary way
 * then); or -errno, the pipe then in an unknown state (a non-blocking
 * pipe holding less than len: -EAGAIN; a blocking one would wait).
 */
int ioc_blk_splice_write(struct ioc_blk *blk, uint64_t offset, size_t len,
			 int pipe_fd, uint32_t flags);

/* From this many bytes on, a write that would run inline (tmpfs without
 * swap) runs on the image's writer thread instead (blk.c, "Large
 * writes"), when called from a coroutine. */
#define IOC_BLK_WRITER_MIN (256u << 10)

/*
 * ioc_blk_splice_write() from a coroutine: the same answers, but from
 * IOC_BLK_WRITER_MIN bytes on the copy runs on the image's writer thread
 * while the coroutine yields (the caller's loop goes on meanwhile).  A
 * zero len only asks (0 or -ENOTSUP) and may be called anywhere.
 */
int ioc_coroutine_fn ioc_blk_co_splice_write(struct ioc_blk *blk, uint64_t offset,
					     size_t len, int pipe_fd, uint32_t flags);

/* Callback API.  The embedded request is valid from submit until cb
 * returns; cb runs on the submitting loop with 0 or -errno. */
struct ioc_blk_req;
typedef void ioc_blk_cb(struct ioc_blk_req *req, int ret);
struct ioc_blk_req {
	ioc_blk_cb *cb;
	void *opaque;
	uint64_t priv[40]; /* private state of the backend */
};
void ioc_blk_preadv(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		    const struct iovec *iov, int iovcnt, uint32_t flags,
		    ioc_blk_cb *cb, void *opaque);
void ioc_blk_pwritev(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		     const struct iovec *iov, int iovcnt, uint32_t flags,
		     ioc_blk_cb *cb, void *opaque);
void ioc_blk_flush(struct ioc_blk *blk, struct ioc_blk_req *req, uint32_t flags,
		   ioc_blk_cb *cb, void *opaque);
void ioc_blk_discard(struct ioc_blk *blk, struct ioc_blk_req *req, uint64_t offset,
		     uint64_t len, uint32_t flags, ioc_blk_cb *cb, void *opaque);
void ioc_blk_write_zeroes(struct ioc_blk *blk, struct ioc_blk_req *req,
			  uint64_t offset, uint64_t len, uint32_t flags,
			  ioc_blk_cb *cb, void *opaque);
/* The callback API never runs cb before the submitting call returns: a
 * request that completes at once (fast path hit, null driver, invalid
 * argument) delivers its result through a task posted to the loop.  The
 * coroutine API has no such indirection: a request that completes at once
 * returns without yielding.  The callback API needs a current loop. */


/* ---- dirty bitmaps (src/blk/dirty-bitmap.c) -------------------------- */

/*
 * Named change-tracking bitmaps of an image: one bit per granule (a power
 * of two from 512 bytes to 2 GiB, default 64 KiB: QEMU's range) that every write,
 * write-zeroes and discard (failed ones too) sets before it completes, from
 * whichever thread completes it, without a lock.  A persistent bitmap is
 * kept in a sidecar file beside the image, "IMAGE.NAME.iocbm" (its format
 * and what survives a crash or a power loss: dirty-bitmap.c).  A bitmap
 * whose sidecar may be incomplete loads as inconsistent: it is listed,
 * can be removed, and refuses everything else with -EUCLEAN.
 *
 * Management calls (add, remove, clear, enable, merge, load, list) come
 * from one thread at a time (the control thread); the queries
 * (count, extent) and ioc_blk_dirty_reset() from any thread.
 */
/* At most IOC_BLK_DIRTY_MAX bitmaps an image (qcow2's limit, which QEMU
 * applies to persistent bitmaps; it sets none in memory), names of 1 to
 * IOC_BLK_DIRTY_NAME_MAX - 1 bytes (QEMU's 1023), a sidecar's name below
 * IOC_BLK_DIRTY_SIDECAR_NAME_MAX bytes (it is part of a file name). */
#define IOC_BLK_DIRTY_MAX        65535
#define IOC_BLK_DIRTY_NAME_MAX   1024
#define IOC_BLK_DIRTY_SIDECAR_NAME_MAX 128
#define IOC_BLK_DIRTY_GRAN_MIN   512u
#define IOC_BLK_DIRTY_GRAN_MAX   (1u << 31)
#define IOC_BLK_DIRTY_GRAN_DEFAULT 65536u

struct ioc_blk_dirty;

struct ioc_blk_dirty_opts {
	const char *name;        /* 1..1023 bytes; in a sidecar: 1..127 of
				  * [A-Za-z0-9_.-], not starting with '.' */
	uint64_t granularity;    /* 0 = 64 KiB */
	bool persistent;         /* kept in IMAGE.NAME.iocbm, or by the store */
	bool disabled;           /* created not recording */
	bool inconsistent;       /* created inconsistent (a store's bitmap that
				  * was not written back cleanly) */
};

struct ioc_blk_dirty_info {
	char name[IOC_BLK_DIRTY_NAME_MAX];
	uint64_t granularity;
	uint64_t count;          /* dirty bytes (granules x granularity,
				  * the last one clipped at the image end) */
	bool recording, persistent, inconsistent;
};

/* -EEXIST (name taken), -EINVAL (name, granularity), -ENOSPC
 * (IOC_BLK_DIRTY_MAX already),
 * -ENOTSUP (persistent without an image file), or a sidecar I/O error. */
int ioc_blk_dirty_add(struct ioc_blk *blk, const struct ioc_blk_dirty_opts *opts,
		      struct ioc_blk_dirty **out);
/* NULL when there is no bitmap of that name. */
struct ioc_blk_dirty *ioc_blk_dirty_find(struct ioc_blk *blk, const char *name);
/* Stop tracking and delete the sidecar.  -ENOENT. */
int ioc_blk_dirty_remove(struct ioc_blk *blk, const char *name);
int ioc_blk_dirty_clear(struct ioc_blk_dirty *bm);
int ioc_blk_dirty_set_recording(struct ioc_blk_dirty *bm, bool on);
/* dst |= src (any granularities: src's dirty ranges are marked in dst). */
int ioc_blk_dirty_merge(struct ioc_blk_dirty *dst, struct ioc_blk_dirty *src);
void ioc_blk_dirty_get_info(struct ioc_blk_dirty *bm, struct ioc_blk_dirty_info *info);
/* Bitmaps in creation order; returns how many (at most max are stored;
 * out may be NULL with max 0 to count them). */
int ioc_blk_dirty_list(struct ioc_blk *blk, struct ioc_blk_dirty_info *out, int max);
/* The same order as handles, without copying names: returns how many.  A
 * handle stays valid until the image closes, even once its bitmap is
 * removed (it is then no longer found). */
int ioc_blk_dirty_handles(struct ioc_blk *blk, struct ioc_blk_dirty **out, int max);
/* The bitmap's name, valid as long as the handle. */
const char *ioc_blk_dirty_name(const struct ioc_blk_dirty *bm);
/* The run of equal state that starts at offset: its length (<= maxlen,
 * clipped at the image end) in *len; returns 1 dirty, 0 clean, -EINVAL
 * when offset is not inside the image, -EUCLEAN when inconsistent. */
int ioc_blk_dirty_extent(struct ioc_blk_dirty *bm, uint64_t offset, uint64_t maxlen,
			 uint64_t *len);
/* For a copier: clear the granules inside [offset, offset+len) and return
 * 1 if any was dirty.  A write that completes after this returns marks
 * again; one that completed before it is seen by a read issued after it
 * (dirty-bitmap.c: the ordering rule). */
int ioc_blk_dirty_reset(struct ioc_blk_dirty *bm, uint64_t offset, uint64_t len);
/* Load every persistent bitmap found beside the image (at start-up).
 * Returns how many were loaded (inconsistent ones included) or -errno. */
int ioc_blk_dirty_load(struct ioc_blk *blk);

/*
 * A bitmap set fed from outside: an image of the null driver sized like a
 * block node's guest view holds the node's bitmaps (a qcow2 node's), the
 * node's write path marks them with ioc_blk_dirty_mark() (any thread,
 * after the write ran and before it completes, as the block layer marks
 * its own).  Persistent bitmaps of such a set live in a store (a qcow2
 * image's bitmaps extension) instead of sidecars: add calls st->add before
 * the bitmap is published (an error refuses the add), remove calls
 * st->remove first (an error keeps the bitmap); the store reads and
 * writes the bits itself with ioc_blk_dirty_export()/_import().  Set once,
 * before any bitmap is added.  Control thread.
 */
struct ioc_blk_dirty_store {
	int (*add)(void *opaque, const struct ioc_blk_dirty_info *info);
	int (*remove)(void *opaque, const char *name);
};
void ioc_blk_dirty_set_store(struct ioc_blk *blk, const struct ioc_blk_dirty_store *st,
			     void *opaque);
int ioc_blk_dirty_mark(struct ioc_blk *blk, uint64_t offset, uint64_t len);
/* Granule bits [first_bit, first_bit + nbytes * 8) as a little-endian bit
 * array (bit i of byte j is granule first_bit + 8j + i, qcow2's order);
 * first_bit a multiple of 64.  Bits past the end read as 0 and are
 * ignored on import.  Import ORs them in.  0, or -EINVAL. */
int ioc_blk_dirty_export(struct ioc_blk_dirty *bm, uint64_t first_bit, void *buf,
			 size_t nbytes);
int ioc_blk_dirty_import(struct ioc_blk_dirty *bm, uint64_t first_bit, const void *buf,
			 size_t nbytes);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_BLK_H */
