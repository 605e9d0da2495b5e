/*
 * Compressed images with random access: the decoded bytes of a file from
 * iocore-zip (zstd frames plus a seek table, or gzip members carrying their
 * sizes) or stock zstd, at any offset, to coroutines on many I/O threads.
 * Problem: 4 KiB to 1 MiB reads land anywhere; decoding from a file's or a
 * huge frame's start per read is hopeless, and decoding on an I/O thread
 * stalls its other requests.
 *
 * Design: at open, an index of frames from the seek table, else from one
 * walk over the frame headers (a frame lacking its content size is decoded
 * once, and logged).  A read finds its frames by a division (equal frames),
 * a bitmap of starts (all on one unit) or a binary search, and takes each
 * from the frame cache (frame-cache.c: one decode per frame, later readers
 * wait for it).  A read of at most 64 KiB decodes its missed frames (of at
 * most 64 KiB) inline on its loop thread: a small decode costs about the
 * pool's round trip.  Larger ones go to the loop's pool on at most CPUs + 1
 * threads ("runners"), one job per ~128 KiB run of frames, all submitted
 * before the first wait; uncached frames such a read covers whole are
 * decoded straight into its buffer, ~512 KiB and one preadv per job (fresh
 * memory costs more than the decode).  A read of 64 KiB or more, or of a
 * frame that large, ending on a frame's last byte reads ahead as far again
 * (up to 1 MiB) unless other large reads are in flight.  Frames over half
 * the cache are never cached; reads decode them from the start, on the pool.
 * Zero frames (RLE blocks of byte 0; gzip members with the CRC-32 of zeros,
 * confirmed by a decode) are known at open or after a decode: reads fill
 * zeroes, block status reports holes.  Stored frames (one raw zstd block) go
 * from the file into the reply: no decode, copy or cache entry (random data
 * would push text out).  Their XXH64 is checked whole on a frame's first
 * read, then trusted like a cached decode (neither sees the file change
 * under a running server); with page checks (codec.c) a small read checks
 * just its pages, each once; a failing page defers to the whole-frame check.
 * A frame failing its decode or first check fails its reads (-EIO, offsets
 * logged); the next read tries again.
 *
 * Rejected: partial decodes (a frame of up to 128 KiB is one zstd block,
 * decoded whole before any byte comes out); ioc_zip_extract() per read
 * (threads and a copy per request); mmap of the compressed file (truncation:
 * SIGBUS on a pool thread, where pread errs); checking stored frames on
 * every read (a whole frame hashed per small read, for changes no hit sees).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include "ioc-config.h"
#if IOC_HAVE_XXHASH
#include <xxhash.h>
#endif

#include "iocore/co.h"
#include "iocore/pool.h"
#include "iocore/zip.h"
#include "codec.h"
#include "frame-cache.h"
#include "util/log.h"

#define DEFAULT_CACHE   (256u << 20)
#define STREAM_CHUNK    (1u << 20)
#define BATCH           64      /* frames requested before the first wait */
#define ZERO_FRAME_MAX  4096    /* an RLE frame of 64 MiB is ~2 KiB */
#define JOB_FRAMES      16      /* frames decoded by one pool job, at most */
#define JOB_BYTES       (128u << 10) /* ... and about this much data */
#define INLINE_MAX      (64u << 10)  /* reads and frames decoded inline */
#define XJOB_BYTES      (512u << 10) /* a job decoding in place: fewer,
					* larger jobs keep the pool from
					* growing past the CPUs */
#define RA_MIN          (64u << 10)  /* reads or frames that read ahead */
#define RA_MAX          (1u << 20)   /* readahead's reach */
#define STORED_MAX      (128u << 10) /* a stored frame read from the file:
					* one raw block at most */

struct zframe {
	uint64_t coff, doff, csize, dsize;
	enum ioc__zip_kind kind;
};

#define RUN_IOV         (4 * BATCH)  /* iovecs of one preadv of a run */
#define RUN_GAP         4096         /* bytes between two frames of a run
					* (zero frames, ~20 bytes each) */
#define RUN_CBYTES      (1u << 20)   /* compressed bytes of a run, at most */

/* A run's preadv: where the bytes it does not keep go. */
struct run_scratch {
	struct iovec iov[RUN_IOV];
	uint8_t head[BATCH][32], tail[BATCH][4];
	uint8_t sink[RUN_GAP];
};

/* A decoder context and its compressed-input buffer; one per pool thread
 * at most in use, kept on a free list. */
struct dslot {
	struct dslot *next;
	struct ioc__zip_dctx d;
	uint8_t *cbuf;
	size_t ccap;
	struct run_scratch *rs;         /* made by the first run read */
};

struct ioc_zip_image {
	int fd;
	struct zframe *frames;
	size_t nframes;
	uint64_t size;
	_Atomic uint8_t *zero;          /* per frame: 1 = all zero (relaxed:
					 * a hint; both values read correctly) */
	_Atomic size_t nzero;           /* frames marked in zero (set_zero) */
	_Atomic uint8_t *sstate;        /* per frame: SS_NOT = not a stored
					 * frame; SS_MAYBE = may be one, read
					 * from the file and checked;
					 * SS_CHECKED = one whose checksum
					 * passed (see stored_state()) */
	/* Page checks (codec.c) of stored frames, when the file has them:
	 * per frame the index of its first check in pcks (NO_PCK: none) and
	 * a bit per page whose check passed (see paged_read()). */
	struct pck_ref { uint32_t first; _Atomic uint32_t done; } *pref;
	uint32_t *pcks;
	struct ioc__zip_fcache *cache;
	size_t max_cached;              /* larger frames decode streaming */
	uint64_t fixed;                 /* every frame but the last has this
					 * size (0: not so) */
	/* Else, when every frame starts on a multiple of unit (iocore-zip's
	 * blocks, some merged into runs of zeros): a bit per unit, set where
	 * a frame starts, in words of 64 with the count of set bits before
	 * each (NULL: not so; find_frame() searches). */
	struct rank_word { uint64_t bits; uint64_t before; } *rank;
	uint64_t unit;
	bool readahead;
	_Atomic unsigned large_reads;   /* in flight, decoding in place */
	struct ioc_zip_image_opts opts;
	char how[160];
	char *path;                     /* as opened */
	size_t budget;                  /* the frame cache's */

	pthread_mutex_t lock;           /* free dslots, jobs, work, runners */
	pthread_cond_t idle;            /* jobs and runners reached 0 */
	struct dslot *dfree;
	unsigned jobs;                  /* cache decodes in flight */
	struct zwork *work, **work_tail; /* decodes waiting for a runner */
	unsigned runners, max_runners;  /* pool jobs running work */
	unsigned runners_peak;          /* most at once (get_info) */

	/* Statistics: relaxed increments, read by get_info; no pairing,
	 * nothing is ordered by them. */
	_Atomic uint64_t decodes, readaheads, stream_reads, errors, direct, stored,
			 stored_checks, page_checks;
};

#define NO_PCK UINT32_MAX

static void ilog(struct ioc_zip_image *img, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void ilog(struct ioc_zip_image *img, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ioc__vlog(img->opts.log, img->opts.log_opaque, fmt, ap);
	va_end(ap);
}

int ioc_zip_probe(int fd)
{
	uint8_t m[4];
	ssize_t n = pread(fd, m, sizeof(m), 0);

	if (n < 0)
		return -errno;
	if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b)
		return 1;
	if (n < 4)
		return 0;
	uint32_t magic = ioc__zip_le32(m);
	return magic == IOC__ZIP_ZSTD_MAGIC ||
	       (magic & IOC__ZIP_SKIP_MASK) == IOC__ZIP_SKIP_MAGIC;
}

/* ---- zero frames ---------------------------------------------------- */

/* Marks frame i all-zero, counting it once (reports read the count
 * instead of walking every frame).  Relaxed: the flag is a hint and the
 * count a statistic; the exchange makes two markers of one frame count
 * it once. */
static void set_zero(struct ioc_zip_image *img, size_t i)
{
	if (!atomic_exchange_explicit(&img->zero[i], 1, memory_order_relaxed))
		atomic_fetch_add_explicit(&img->nzero, 1, memory_order_relaxed);
}

/* Is this whole zstd frame (csize bytes at p) RLE or raw blocks of zero
 * bytes adding up to dsize?  Reads only the block headers. */
static bool zstd_frame_is_zero(const uint8_t *p, size_t csize, uint64_t dsize)
{
	struct ioc__zip_frame f = { 0 };
	const char *why;
	uint64_t got = 0;
	size_t pos;

	if (ioc__zip_scan(&f, p, csize, &why) != 1 || f.kind != IOC__ZIP_K_ZSTD)
		return false;
	pos = f.hdr_len;
	for (;;) {
		uint32_t h, type, size;

		if (pos + 3 > csize)
			return false;
		h = p[pos] | (uint32_t)p[pos + 1] << 8 | (uint32_t)p[pos + 2] << 16;
		type = (h >> 1) & 3;
		size = h >> 3;
		pos += 3;
		if (type == 1) {                /* RLE: one byte, size times */
			if (pos >= csize || p[pos] != 0)
				return false;
			pos += 1;
		} else if (type == 0) {         /* raw */
			if (pos + size > csize || !ioc__zip_all_zero(p + pos, size))
				return false;
			pos += size;
		} else {
			return false;
		}
		got += size;
		if (h & 1)
			break;
	}
	return got == dsize;
}

/* Is this gzip member (csize bytes at p) dsize zero bytes?  Its trailer
 * must carry the CRC-32 of dsize zeros (*zcrc, for *zlen bytes, computed
 * once per size) and its size; only then is it decoded, into out (dsize
 * bytes), and checked -- so the answer is exact, and a member of text
 * that merely compresses as well as zeros costs a trailer compare. */
static bool gzip_member_is_zero(struct ioc__zip_dctx *d, const uint8_t *p, size_t csize,
				uint64_t dsize, uint8_t *out, uint64_t *zlen, uint32_t *zcrc)
{
	const char *why;

	if (csize < 18 || dsize > UINT32_MAX ||
	    ioc__zip_le32(p + csize - 4) != (uint32_t)dsize)
		return false;
	if (*zlen != dsize) {
		uLong crc = crc32(0, Z_NULL, 0);

		memset(out, 0, (size_t)dsize);
		for (uint64_t done = 0; done < dsize;) {
			uInt n = dsize - done < (1u << 30) ? (uInt)(dsize - done) : (1u << 30);

			crc = crc32(crc, out, n);
			done += n;
		}
		*zcrc = (uint32_t)crc;
		*zlen = dsize;
	}
	if (ioc__zip_le32(p + csize - 8) != *zcrc)
		return false;
	return ioc__zip_decompress(d, IOC__ZIP_K_GZIP, out, (size_t)dsize, p, csize, &why) >= 0 &&
	       ioc__zip_all_zero(out, (size_t)dsize);
}

/* Small frames: read them and check.  A zero zstd frame is RLE blocks
 * (read the block headers); a zero gzip member is whatever deflate made
 * of zeros, ~1 byte per KiB (check its trailer, then decode it). */
static int find_zero_frames(struct ioc_zip_image *img)
{
	uint8_t *buf = malloc(ZERO_FRAME_MAX), *out = NULL;
	struct ioc__zip_dctx d;
	bool have_d = false;
	uint64_t zlen = UINT64_MAX, outcap = 0;
	uint32_t zcrc = 0;
	int r = 0;

	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < img->nframes; i++) {
		const struct zframe *f = &img->frames[i];
		bool zero;

		if (f->kind == IOC__ZIP_K_SKIP || f->csize > ZERO_FRAME_MAX || !f->dsize)
			continue;
		if (f->kind == IOC__ZIP_K_GZIP && !have_d) {
			r = ioc__zip_dctx_init(&d, 31, IOC_ZIP_DEFLATE_DEFAULT);
			if (r < 0)
				break;
			have_d = true;
		}
		if (f->kind == IOC__ZIP_K_GZIP && outcap < f->dsize) {
			/* Deflate of zeros is ~1000:1: a member of at most
			 * ZERO_FRAME_MAX bytes decodes to a few MiB at most. */
			if (f->dsize > 1032u * ZERO_FRAME_MAX)
				continue;
			free(out);
			out = malloc((size_t)f->dsize);
			outcap = out ? f->dsize : 0;
			zlen = UINT64_MAX;
			if (!out) {
				r = -ENOMEM;
				break;
			}
		}
		r = ioc__zip_pread_all(img->fd, buf, (size_t)f->csize, f->coff);
		if (r < 0)
			break;
		if (f->kind == IOC__ZIP_K_ZSTD)
			zero = zstd_frame_is_zero(buf, (size_t)f->csize, f->dsize);
		else
			zero = gzip_member_is_zero(&d, buf, (size_t)f->csize, f->dsize, out,
						   &zlen, &zcrc);
		if (zero)
			set_zero(img, i);
	}
	if (have_d)
		ioc__zip_dctx_fini(&d);
	free(out);
	free(buf);
	return r;
}

/* ---- decoder slots -------------------------------------------------- */

static struct dslot *dslot_get(struct ioc_zip_image *img, size_t csize)
{
	struct dslot *s;

	pthread_mutex_lock(&img->lock);
	s = img->dfree;
	if (s)
		img->dfree = s->next;
	pthread_mutex_unlock(&img->lock);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return NULL;
		if (ioc__zip_dctx_init(&s->d, 31, IOC_ZIP_DEFLATE_DEFAULT) < 0) {
			free(s);
			return NULL;
		}
	}
	if (s->ccap < csize) {
		uint8_t *nb = realloc(s->cbuf, csize);

		if (!nb) {
			ioc__zip_dctx_fini(&s->d);
			free(s->cbuf);
			free(s->rs);
			free(s);
			return NULL;
		}
		s->cbuf = nb;
		s->ccap = csize;
	}
	return s;
}

static void dslot_put(struct ioc_zip_image *img, struct dslot *s)
{
	pthread_mutex_lock(&img->lock);
	s->next = img->dfree;
	img->dfree = s;
	pthread_mutex_unlock(&img->lock);
}

/* ---- runners: decode work on at most max_runners pool threads -------- */

/* Decoding is CPU work: more threads than CPUs only take turns, and each
 * switch evicts the frames another thread was writing.  So decode work is
 * queued on the image, and at most max_runners pool jobs (the CPU count
 * plus one, for a runner stalled on a cold pread) run it.  A runner takes
 * work until the queue is empty, then leaves: "runners--" and the empty
 * check happen under img->lock, as do the append and "runners < max" of
 * work_submit(), so queued work always has a runner.  Work completes on
 * the runner (a reader's ioc_co_await_done() may run on any thread), so
 * nothing but the runner's own struct waits for its loop: the image can
 * close once jobs and runners are 0, whether or not the loops still run.
 * Without the cap the loop's pool grew to ~19 threads on 2 CPUs (a 512
 * KiB decode waits in the queue long enough to look like a blocked job
 * to its spawn rule).  Rejected: a capped pool of the image's own (its
 * completions would land on loops freed before the image, with readahead
 * nobody waits for in flight); lowering the loop pool's limit (it also
 * runs blocking calls, which need threads). */
struct zwork {
	struct zwork *next;
	void (*run)(struct zwork *w);           /* on a runner; completes w */
	void (*cancel)(struct zwork *w, int err); /* never ran: completes w */
};

struct runner {
	struct ioc_pool_req req;
	struct ioc_zip_image *img;
};

static int64_t runner_run(void *arg)
{
	struct ioc_zip_image *img = ((struct runner *)arg)->img;

	for (;;) {
		struct zwork *w;

		pthread_mutex_lock(&img->lock);
		w = img->work;
		if (!w) {
			/* Not a touch of img after this unlock: close may
			 * free it as soon as runners is 0. */
			if (--img->runners == 0)
				pthread_cond_broadcast(&img->idle);
			pthread_mutex_unlock(&img->lock);
			return 0;
		}
		img->work = w->next;
		if (!img->work)
			img->work_tail = &img->work;
		pthread_mutex_unlock(&img->lock);
		w->run(w);
		/* w's completion is a task on a loop (a reader's wake, a
		 * publish's): give that loop's thread the CPU, to send the
		 * reply, before the next decode.  With as many runners as
		 * CPUs it would otherwise wait for a time slice to end
		 * (1 MiB reads on 2 CPUs: 15% slower without this). */
		sched_yield();
	}
}

/* On the submitting loop.  A runner that never ran (its pool was freed
 * first, at shutdown) cancels what is queued if no other runner is left
 * to take it, then leaves the count like runner_run(). */
static void runner_done(void *opaque, int64_t ret)
{
	struct runner *r = opaque;
	struct ioc_zip_image *img = r->img;

	free(r);
	if (ret != -ECANCELED)
		return;
	pthread_mutex_lock(&img->lock);
	while (img->runners == 1 && img->work) {
		struct zwork *w = img->work;

		img->work = NULL;
		img->work_tail = &img->work;
		pthread_mutex_unlock(&img->lock);
		while (w) {
			struct zwork *next = w->next;

			w->cancel(w, -ECANCELED);
			w = next;
		}
		pthread_mutex_lock(&img->lock);
	}
	if (--img->runners == 0)
		pthread_cond_broadcast(&img->idle);
	pthread_mutex_unlock(&img->lock);
}

/* Queue w; start a runner if fewer than max_runners run.  Loop thread.
 * Without memory for a runner, w waits for one that runs, or fails with
 * -ENOMEM if none does. */
static void work_submit(struct ioc_zip_image *img, struct zwork *w)
{
	struct runner *r = malloc(sizeof(*r));
	bool start = false;

	w->next = NULL;
	pthread_mutex_lock(&img->lock);
	if (!r && img->runners == 0) {
		pthread_mutex_unlock(&img->lock);
		w->cancel(w, -ENOMEM);
		return;
	}
	*img->work_tail = w;
	img->work_tail = &w->next;
	if (r && img->runners < img->max_runners) {
		if (++img->runners > img->runners_peak)
			img->runners_peak = img->runners;
		start = true;
	}
	pthread_mutex_unlock(&img->lock);
	if (!start) {
		free(r);
		return;
	}
	r->img = img;
	ioc_pool_submit(NULL, &r->req, runner_run, r, runner_done, r);
}

/* ---- decoding frames into the cache --------------------------------- */

/* One pool job decodes a run of frames (consecutive in the read that
 * wanted them), each published as soon as it is done. */
struct djob {
	struct zwork w;
	struct ioc_zip_image *img;
	unsigned n;
	size_t bytes;
	struct {
		struct ioc__zip_fentry *e;
		size_t idx;
	} f[JOB_FRAMES];
};

static void frame_failed(struct ioc_zip_image *img, size_t i, const char *why)
{
	const struct zframe *f = &img->frames[i];

	atomic_fetch_add_explicit(&img->errors, 1, memory_order_relaxed);
	ilog(img, "frame %zu (compressed offset %llu, %llu bytes; data offset %llu, %llu bytes): "
	     "%s; reads of this range fail with EIO", i, (unsigned long long)f->coff,
	     (unsigned long long)f->csize, (unsigned long long)f->doff,
	     (unsigned long long)f->dsize, why);
}

static int decode_frame(struct ioc_zip_image *img, size_t i, uint8_t *dst)
{
	const struct zframe *f = &img->frames[i];
	const char *why = NULL;
	struct dslot *s = dslot_get(img, (size_t)f->csize);
	int r;

	if (!s)
		return -ENOMEM;
	r = ioc__zip_pread_all(img->fd, s->cbuf, (size_t)f->csize, f->coff);
	if (r < 0)
		why = r == -ENODATA ? "file truncated" : ioc_strerror(r);
	else
		r = ioc__zip_decompress(&s->d, f->kind, dst, (size_t)f->dsize, s->cbuf,
					(size_t)f->csize, &why);
	dslot_put(img, s);
	if (r < 0) {
		frame_failed(img, i, why ? why : ioc_strerror(r));
		return -EIO;
	}
	return 0;
}

/* ---- stored frames: read from the file, not decoded -------------------- */

/* zstd stores a block it cannot shrink as is (a raw block): a frame of
 * random bytes is its header, one 3-byte block header, the data and the
 * checksum (XXH64's low 32 bits).  Such a frame is read straight into the
 * reader's buffer (one preadv: header and checksum aside) and its
 * checksum checked on its first read; once that passed, later reads read
 * only the bytes they want (the frame's data sits at a known offset) and
 * trust the check, as a cache hit trusts its frame's decode.  No decode,
 * no copy, no cache entry. */
enum { SS_MAYBE, SS_NOT, SS_CHECKED };

static unsigned stored_state(struct ioc_zip_image *img, size_t i)
{
	/* Pairs with the relaxed stores in stored_read() and at open: the
	 * state describes the file's bytes, it publishes no memory, and a
	 * reader that sees an older value only does more work (checks the
	 * frame again), so no ordering is needed. */
	return atomic_load_explicit(&img->sstate[i], memory_order_relaxed);
}

static bool maybe_stored(struct ioc_zip_image *img, size_t i)
{
	return stored_state(img, i) != SS_NOT;
}

/* Where a stored frame's data starts in the file. */
static uint64_t stored_data(const struct zframe *f)
{
	return f->coff + (f->csize - f->dsize - 4);
}

#if IOC_HAVE_XXHASH
/* Frame i read as a stored frame: its header up to the block's (head, of
 * csize - dsize - 4 bytes), its data (dst) and checksum (tail).  0, -EIO
 * (damaged: logged), or 1 when it is not a stored frame (remembered). */
static int stored_check(struct ioc_zip_image *img, size_t i, const uint8_t *head,
			const uint8_t *dst, const uint8_t *tail)
{
	const struct zframe *f = &img->frames[i];

	/* ioc__zip_is_stored() reads only the header up to the block's. */
	if (!ioc__zip_is_stored(head, (size_t)f->csize, (size_t)f->dsize)) {
		/* Pairs with the load in stored_state(). */
		atomic_store_explicit(&img->sstate[i], SS_NOT, memory_order_relaxed);
		return 1;
	}
	if ((uint32_t)XXH64(dst, (size_t)f->dsize, 0) != ioc__zip_le32(tail)) {
		frame_failed(img, i, "checksum mismatch (stored frame)");
		return -EIO;
	}
	/* Pairs with the load in stored_state(). */
	atomic_store_explicit(&img->sstate[i], SS_CHECKED, memory_order_relaxed);
	atomic_fetch_add_explicit(&img->stored, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&img->stored_checks, 1, memory_order_relaxed);
	return 0;
}
#endif

/* Frame i, whole, into dst: 0, -EIO (damaged: logged), or 1 when it turns
 * out not to be a stored frame (remembered; decode it instead). */
static int stored_read(struct ioc_zip_image *img, size_t i, uint8_t *dst)
{
#if IOC_HAVE_XXHASH
	const struct zframe *f = &img->frames[i];
	uint8_t head[32], tail[4];
	size_t h = (size_t)(f->csize - f->dsize - 4);
	struct iovec iov[3] = {
		{ head, h }, { dst, (size_t)f->dsize }, { tail, sizeof(tail) },
	};
	int r;

	if (stored_state(img, i) == SS_CHECKED) {
		r = ioc__zip_pread_all(img->fd, dst, (size_t)f->dsize, stored_data(f));
		if (r < 0) {
			frame_failed(img, i, r == -ENODATA ? "file truncated" : ioc_strerror(r));
			return -EIO;
		}
		atomic_fetch_add_explicit(&img->stored, 1, memory_order_relaxed);
		return 0;
	}
	r = ioc__zip_preadv_all(img->fd, iov, 3, f->coff);
	if (r < 0) {
		frame_failed(img, i, r == -ENODATA ? "file truncated" : ioc_strerror(r));
		return -EIO;
	}
	return stored_check(img, i, head, dst, tail);
#else
	(void)dst;
	/* Pairs with the load in stored_state(). */
	atomic_store_explicit(&img->sstate[i], SS_NOT, memory_order_relaxed);
	return 1;
#endif
}

#if IOC_HAVE_XXHASH
/* [lo, lo + len) of stored frame i, which has page checks, into dst: only
 * the pages it covers are read, and checked unless done says they passed
 * before (into dst itself when the range is whole pages).  0, -EIO (file
 * error: logged), -ENOMEM, or 1 when a page fails its check: the caller
 * then reads the frame whole, whose own checksum decides (a damaged frame
 * fails there and is logged; a wrong table costs only the detour). */
static int paged_read(struct ioc_zip_image *img, size_t i, uint64_t lo, uint8_t *dst,
		      size_t len)
{
	const struct zframe *f = &img->frames[i];
	struct pck_ref *pr = &img->pref[i];
	unsigned p0 = (unsigned)(lo / IOC__ZIP_PAGE);
	unsigned p1 = (unsigned)((lo + len - 1) / IOC__ZIP_PAGE);
	uint32_t want = (p1 - p0 == 31 ? UINT32_MAX : (1u << (p1 - p0 + 1)) - 1) << p0;
	uint64_t plo = (uint64_t)p0 * IOC__ZIP_PAGE;
	uint64_t phi = (uint64_t)(p1 + 1) * IOC__ZIP_PAGE;
	struct dslot *s = NULL;
	uint8_t *buf = dst;
	bool checked;
	int r;

	if (phi > f->dsize)
		phi = f->dsize;
	/* Relaxed, pairs with the fetch_or below: the bits describe the
	 * file's bytes and publish no memory; a reader that misses a bit
	 * only checks its page again. */
	checked = (atomic_load_explicit(&pr->done, memory_order_relaxed) & want) == want;
	if (checked) {
		plo = lo;
		phi = lo + len;
	} else if (plo != lo || phi != lo + len) {
		s = dslot_get(img, (size_t)(phi - plo));
		if (!s)
			return -ENOMEM;
		buf = s->cbuf;
	}
	r = ioc__zip_pread_all(img->fd, buf, (size_t)(phi - plo), stored_data(f) + plo);
	if (r < 0) {
		frame_failed(img, i, r == -ENODATA ? "file truncated" : ioc_strerror(r));
		r = -EIO;
		goto out;
	}
	if (!checked) {
		for (unsigned p = p0; p <= p1; p++) {
			uint64_t at = (uint64_t)p * IOC__ZIP_PAGE;
			size_t n = f->dsize - at < IOC__ZIP_PAGE ? (size_t)(f->dsize - at)
								 : IOC__ZIP_PAGE;

			if (ioc__zip_page_check(buf + (at - plo), n) !=
			    img->pcks[pr->first + p]) {
				r = 1;
				goto out;
			}
		}
		if (s)
			memcpy(dst, buf + (lo - plo), len);
		/* Pairs with the relaxed load above.  Counted: pages that
		 * passed for the first time (a race may check one twice). */
		uint32_t was = atomic_fetch_or_explicit(&pr->done, want, memory_order_relaxed);

		atomic_fetch_add_explicit(&img->page_checks,
					  (unsigned)__builtin_popcount(want & ~was),
					  memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&img->stored, 1, memory_order_relaxed);
	r = 0;
out:
	if (s)
		dslot_put(img, s);
	return r;
}
#endif

/* Frame i whole into dst: read from the file (a stored frame) or decoded
 * (counted; *decoded set).  0 or -errno.  On the calling thread: for a
 * stored frame a pread (and a checksum on its first read). */
static int frame_whole(struct ioc_zip_image *img, size_t i, uint8_t *dst, bool *decoded)
{
	int r = maybe_stored(img, i) ? stored_read(img, i, dst) : 1;

	*decoded = r == 1;
	if (r == 1) {
		r = decode_frame(img, i, dst);
		atomic_fetch_add_explicit(&img->decodes, 1, memory_order_relaxed);
	}
	return r;
}

/* [lo, lo + len) of frame i into dst, not through the cache.  0 or
 * -errno. */
static int frame_part(struct ioc_zip_image *img, size_t i, uint64_t lo, uint8_t *dst,
		      size_t len)
{
	const struct zframe *f = &img->frames[i];
	struct dslot *s;
	bool decoded;
	int r;

	if (lo == 0 && len == f->dsize)
		return frame_whole(img, i, dst, &decoded);
	if (stored_state(img, i) == SS_CHECKED) {
		r = ioc__zip_pread_all(img->fd, dst, len, stored_data(f) + lo);
		if (r < 0) {
			frame_failed(img, i, r == -ENODATA ? "file truncated" : ioc_strerror(r));
			return -EIO;
		}
		atomic_fetch_add_explicit(&img->stored, 1, memory_order_relaxed);
		return 0;
	}
#if IOC_HAVE_XXHASH
	if (img->pref && img->pref[i].first != NO_PCK && stored_state(img, i) != SS_NOT) {
		r = paged_read(img, i, lo, dst, len);
		if (r != 1)
			return r;
	}
#endif
	s = dslot_get(img, (size_t)f->dsize);
	if (!s)
		return -ENOMEM;
	r = frame_whole(img, i, s->cbuf, &decoded);
	if (r == 0)
		memcpy(dst, s->cbuf + lo, len);
	dslot_put(img, s);
	return r;
}

/* Decode frame i into e (created BUSY by this reader) and publish it:
 * on a pool thread, or inline on a loop thread for a small frame. */
static int decode_publish(struct ioc_zip_image *img, size_t i, struct ioc__zip_fentry *e)
{
	int r = decode_frame(img, i, e->data);

	atomic_fetch_add_explicit(&img->decodes, 1, memory_order_relaxed);
	if (r == 0 && ioc__zip_all_zero(e->data, e->len))
		set_zero(img, i);
	/* Wakes the waiters from this thread: they resume on their loops. */
	ioc__zip_fcache_publish(img->cache, e, r);
	return r;
}

/* Drops the job's references and its count; the last touch of img for
 * a job, on the runner (or the loop that cancels it). */
static void djob_finish(struct djob *j)
{
	struct ioc_zip_image *img = j->img;

	for (unsigned k = 0; k < j->n; k++)
		ioc__zip_fcache_put(img->cache, j->f[k].e);
	free(j);
	pthread_mutex_lock(&img->lock);
	if (--img->jobs == 0)
		pthread_cond_broadcast(&img->idle);
	pthread_mutex_unlock(&img->lock);
}

static void djob_run(struct zwork *w)
{
	struct djob *j = (struct djob *)w;

	for (unsigned k = 0; k < j->n; k++)
		(void)decode_publish(j->img, j->f[k].idx, j->f[k].e);
	djob_finish(j);
}

static void djob_cancel(struct zwork *w, int err)
{
	struct djob *j = (struct djob *)w;

	/* Never ran: nobody published. */
	for (unsigned k = 0; k < j->n; k++)
		ioc__zip_fcache_publish(j->img->cache, j->f[k].e, err);
	djob_finish(j);
}

/* Frames created BUSY by one read (or one readahead), gathered into jobs
 * of at most JOB_FRAMES frames and about JOB_BYTES of data. */
struct jobber {
	struct ioc_zip_image *img;
	struct djob *j;
	bool readahead;
};

static void jobber_submit(struct jobber *jb)
{
	struct ioc_zip_image *img = jb->img;
	struct djob *j = jb->j;

	if (!j)
		return;
	jb->j = NULL;
	pthread_mutex_lock(&img->lock);
	img->jobs++;
	pthread_mutex_unlock(&img->lock);
	if (jb->readahead)
		atomic_fetch_add_explicit(&img->readaheads, j->n, memory_order_relaxed);
	j->w.run = djob_run;
	j->w.cancel = djob_cancel;
	work_submit(img, &j->w);
}

/* e was just created BUSY for frame i: queue its decode.  The job holds
 * its own reference. */
static void jobber_add(struct jobber *jb, size_t i, struct ioc__zip_fentry *e)
{
	struct ioc_zip_image *img = jb->img;
	struct djob *j = jb->j;

	if (!j) {
		j = jb->j = calloc(1, sizeof(*j));
		if (!j) {
			ioc__zip_fcache_publish(img->cache, e, -ENOMEM);
			return;
		}
		j->img = img;
	}
	/* A second reference, for the job; under no lock, but the entry
	 * cannot be freed: the caller holds one. */
	atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
	j->f[j->n].e = e;
	j->f[j->n].idx = i;
	j->n++;
	j->bytes += e->len;
	if (j->n == JOB_FRAMES || j->bytes >= JOB_BYTES)
		jobber_submit(jb);
}

/* ---- large reads: frames they cover whole, decoded in place ----------- */

/* One job decodes a run of frames of one read straight into the read's
 * buffer; the reader waits for it (aw) before it returns, and before it
 * looks at the bytes: the runner's writes to the buffer and to f[].r
 * happen before its ioc_co_await_done, which the reader's ioc_co_await
 * pairs with. */
struct xjob {
	struct zwork w;
	struct ioc_zip_image *img;
	struct ioc_co_await aw;
	bool submitted, waited;
	unsigned n;
	size_t bytes;
	struct {
		size_t idx;
		uint8_t *dst;
		int r;
	} f[BATCH];
};

/* A decode in place is done: count it, note zeros. */
static void xjob_decoded(struct ioc_zip_image *img, struct xjob *j, unsigned k)
{
	atomic_fetch_add_explicit(&img->direct, 1, memory_order_relaxed);
	if (j->f[k].r == 0 &&
	    ioc__zip_all_zero(j->f[k].dst, (size_t)img->frames[j->f[k].idx].dsize))
		set_zero(img, j->f[k].idx);
}

/* The frames of a job are mostly neighbours in the file (those between
 * them are zero or cached ones, a few bytes or a frame); one preadv reads
 * a run of them: stored frames' data straight into the reply, compressed
 * frames into one buffer, headers and checksums of stored frames not yet
 * checked into the scratch, the rest (checked stored frames' headers,
 * bytes between frames) into a sink.  Frames k.. of j: how many it did
 * (0: none, do frame k alone). */
static unsigned xjob_run_read(struct ioc_zip_image *img, struct xjob *j, unsigned k)
{
	struct run_scratch *rs;
	struct dslot *s;
	size_t cbytes = 0, niov = 0, cpos = 0;
	uint64_t at = img->frames[j->f[k].idx].coff, end = at;
	uint8_t st[BATCH];      /* each frame's state, read once: the sizes
				 * below and the iovecs must agree */
	unsigned m, q;
	int r;

	for (m = k; m < j->n; m++) {
		const struct zframe *f = &img->frames[j->f[m].idx];
		bool packed;

		st[m - k] = (uint8_t)stored_state(img, j->f[m].idx);
		packed = st[m - k] == SS_NOT;

		if (f->coff < end || f->coff - end > RUN_GAP || niov + 4 > RUN_IOV ||
		    (packed && cbytes + f->csize > RUN_CBYTES))
			break;
		if (packed)
			cbytes += (size_t)f->csize;
		niov += 4;
		end = f->coff + f->csize;
	}
	if (m - k < 2)
		return 0;
	s = dslot_get(img, cbytes);
	if (!s)
		return 0;
	if (!s->rs && !(s->rs = malloc(sizeof(*s->rs)))) {
		dslot_put(img, s);
		return 0;
	}
	rs = s->rs;
	end = at;
	niov = 0;
	for (q = k; q < m; q++) {
		const struct zframe *f = &img->frames[j->f[q].idx];
		struct iovec *iov = rs->iov;
		size_t h = (size_t)(f->csize - f->dsize - 4);

		if (f->coff > end)
			iov[niov++] = (struct iovec){ rs->sink, (size_t)(f->coff - end) };
		end = f->coff + f->csize;
		switch (st[q - k]) {
		case SS_CHECKED:
			iov[niov++] = (struct iovec){ rs->sink, h };
			iov[niov++] = (struct iovec){ j->f[q].dst, (size_t)f->dsize };
			iov[niov++] = (struct iovec){ rs->sink, 4 };
			break;
		case SS_MAYBE:
			iov[niov++] = (struct iovec){ rs->head[q - k], h };
			iov[niov++] = (struct iovec){ j->f[q].dst, (size_t)f->dsize };
			iov[niov++] = (struct iovec){ rs->tail[q - k], 4 };
			break;
		default:
			iov[niov++] = (struct iovec){ s->cbuf + cpos, (size_t)f->csize };
			cpos += (size_t)f->csize;
			break;
		}
	}
	r = ioc__zip_preadv_all(img->fd, rs->iov, (int)niov, at);
	if (r < 0) {
		/* Frame by frame, to log which one fails. */
		dslot_put(img, s);
		return 0;
	}
	cpos = 0;
	for (q = k; q < m; q++) {
		size_t i = j->f[q].idx;
		const struct zframe *f = &img->frames[i];
		const char *why = NULL;
		bool decoded;

		/* As read: another reader may have changed the state since. */
		if (st[q - k] == SS_CHECKED) {
			atomic_fetch_add_explicit(&img->stored, 1, memory_order_relaxed);
			j->f[q].r = 0;
			continue;
		}
		if (st[q - k] == SS_MAYBE) {
#if IOC_HAVE_XXHASH
			j->f[q].r = stored_check(img, i, rs->head[q - k], j->f[q].dst,
						 rs->tail[q - k]);
#else
			j->f[q].r = 1;  /* never: SS_MAYBE needs libxxhash */
#endif
			if (j->f[q].r != 1)
				continue;
			/* Not a stored frame after all: decode it alone. */
			j->f[q].r = frame_whole(img, i, j->f[q].dst, &decoded);
			xjob_decoded(img, j, q);
			continue;
		}
		r = ioc__zip_decompress(&s->d, f->kind, j->f[q].dst, (size_t)f->dsize,
					s->cbuf + cpos, (size_t)f->csize, &why);
		cpos += (size_t)f->csize;
		atomic_fetch_add_explicit(&img->decodes, 1, memory_order_relaxed);
		if (r < 0)
			frame_failed(img, i, why ? why : ioc_strerror(r));
		j->f[q].r = r < 0 ? -EIO : 0;
		xjob_decoded(img, j, q);
	}
	dslot_put(img, s);
	return m - k;
}

static void xjob_run(struct zwork *w)
{
	struct xjob *j = (struct xjob *)w;
	struct ioc_zip_image *img = j->img;

	for (unsigned k = 0; k < j->n;) {
		unsigned done = xjob_run_read(img, j, k);
		bool decoded;

		if (done) {
			k += done;
			continue;
		}
		j->f[k].r = frame_whole(img, j->f[k].idx, j->f[k].dst, &decoded);
		if (decoded)
			xjob_decoded(img, j, k);
		k++;
	}
	ioc_co_await_done(&j->aw, 0);   /* the last touch of j */
}

static void xjob_cancel(struct zwork *w, int err)
{
	struct xjob *j = (struct xjob *)w;

	for (unsigned k = 0; k < j->n; k++)
		j->f[k].r = err;
	ioc_co_await_done(&j->aw, err);
}

static void xjob_submit(struct xjob *j)
{
	if (!j || j->submitted)
		return;
	j->submitted = true;
	ioc_co_await_init(&j->aw);
	j->w.run = xjob_run;
	j->w.cancel = xjob_cancel;
	work_submit(j->img, &j->w);
}

/* ---- streaming reads of frames too big to cache ---------------------- */

struct sjob {
	struct ioc_pool_req req;
	struct ioc_zip_image *img;
	size_t idx;
	uint64_t skip;          /* decoded bytes to drop before the range */
	uint8_t *dst;
	size_t len;
	struct ioc_co_await aw;
};

static int64_t sjob_run(void *arg)
{
	struct sjob *j = arg;
	struct ioc_zip_image *img = j->img;
	const struct zframe *f = &img->frames[j->idx];
	struct dslot *s = dslot_get(img, STREAM_CHUNK);
	uint8_t *out = malloc(STREAM_CHUNK);
	uint64_t cpos = f->coff, cend = f->coff + f->csize, dpos = 0;
	size_t have = 0, used_total = 0;
	const char *why = NULL;
	int r = 0;

	atomic_fetch_add_explicit(&img->stream_reads, 1, memory_order_relaxed);
	if (!s || !out) {
		r = -ENOMEM;
		goto out;
	}
	r = ioc__zip_stream_begin(&s->d, f->kind, &why);
	while (r == 0 && dpos < j->skip + j->len) {
		size_t used = 0, produced = 0;

		if (used_total == have && cpos < cend) {
			size_t n = cend - cpos < STREAM_CHUNK ? (size_t)(cend - cpos) : STREAM_CHUNK;

			r = ioc__zip_pread_all(img->fd, s->cbuf, n, cpos);
			if (r < 0) {
				why = ioc_strerror(r);
				break;
			}
			cpos += n;
			have = n;
			used_total = 0;
		}
		r = ioc__zip_stream(&s->d, s->cbuf + used_total, have - used_total, &used,
				    out, STREAM_CHUNK, &produced, &why);
		used_total += used;
		/* Copy the part of [dpos, dpos + produced) inside the range. */
		uint64_t lo = dpos > j->skip ? dpos : j->skip;
		uint64_t hi = dpos + produced;

		if (hi > j->skip + j->len)
			hi = j->skip + j->len;
		if (hi > lo)
			memcpy(j->dst + (lo - j->skip), out + (lo - dpos), (size_t)(hi - lo));
		dpos += produced;
		if (r == 1)
			break;
		if (r == 0 && !used && !produced && cpos >= cend) {
			why = "frame ends early";
			r = -EBADMSG;
		}
	}
	if (r >= 0 && dpos < j->skip + j->len) {
		why = "frame ends early";
		r = -EBADMSG;
	}
	if (r < 0) {
		frame_failed(img, j->idx, why ? why : ioc_strerror(r));
		r = -EIO;
	} else {
		r = 0;
	}
out:
	if (s) {
		/* Leave no half-read stream behind in a reused context. */
		s->d.streaming = false;
		dslot_put(img, s);
	}
	free(out);
	return r;
}

static void sjob_done(void *opaque, int64_t ret)
{
	struct sjob *j = opaque;

	ioc_co_await_done(&j->aw, ret);
}

static int ioc_coroutine_fn stream_read(struct ioc_zip_image *img, size_t i, uint64_t skip,
					uint8_t *dst, size_t len)
{
	struct sjob j = { .img = img, .idx = i, .skip = skip, .dst = dst, .len = len };

	ioc_co_await_init(&j.aw);
	ioc_pool_submit(NULL, &j.req, sjob_run, &j, sjob_done, &j);
	return (int)ioc_co_await(&j.aw);
}

/* ---- reads ---------------------------------------------------------- */

/* The first frame that ends after off (nframes if none). */
static size_t find_frame(const struct ioc_zip_image *img, uint64_t off)
{
	size_t lo = 0, hi = img->nframes;

	/* iocore-zip's frames are one size but the last: no search, which
	 * would touch ~log2(frames) cache lines of a large index. */
	if (img->fixed) {
		uint64_t k = off / img->fixed;

		if (k + 1 < img->nframes)
			return (size_t)k;
		lo = img->nframes - 1;
	} else if (img->rank) {
		/* A frame holds off's unit; the last frame starting at or
		 * before that unit is it: one cache line, not a search. */
		uint64_t u = off / img->unit;
		const struct rank_word *w = &img->rank[u / 64];
		uint64_t upto = w->bits & (~0ull >> (63 - u % 64));

		return (size_t)(w->before + (uint64_t)__builtin_popcountll(upto) - 1);
	}
	return IOC__ZIP_FRAME_AFTER(img->frames, lo, hi, off);
}

/* The rank index of frame starts (see struct ioc_zip_image), when every
 * frame starts on a multiple of some unit of at least 4 KiB (the gcd of
 * their offsets): 16 bytes per 64 units, 0.002% of the image in 12 KiB
 * units.  Its first frame may be a run of zeros: the unit is not frame
 * 0's size. */
static void build_rank(struct ioc_zip_image *img)
{
	uint64_t unit = 0;
	size_t nwords;

	for (size_t i = 0; i < img->nframes; i++) {
		uint64_t a = img->frames[i].doff, b = unit;

		if (!img->frames[i].dsize)      /* two frames would share a bit */
			return;
		while (b) {
			uint64_t t = a % b;

			a = b;
			b = t;
		}
		unit = a;
	}
	if (unit < 4096)
		return;
	nwords = (size_t)((img->size + unit - 1) / unit + 63) / 64;
	/* Sparse starts (a small unit under huge frames, as a damaged or
	 * hostile index may claim) would make the bitmap outweigh the index
	 * it saves searching: search instead, as when memory is short. */
	if (nwords / 4 > img->nframes)
		return;
	img->rank = calloc(nwords, sizeof(*img->rank));
	if (!img->rank)
		return;
	img->unit = unit;
	for (size_t i = 0; i < img->nframes; i++) {
		uint64_t u = img->frames[i].doff / unit;

		img->rank[u / 64].bits |= 1ull << (u % 64);
	}
	for (size_t w = 1, n = 0; w < nwords; w++) {
		n += (size_t)__builtin_popcountll(img->rank[w - 1].bits);
		img->rank[w].before = n;
	}
}

static bool is_zero(struct ioc_zip_image *img, size_t i)
{
	return atomic_load_explicit(&img->zero[i], memory_order_relaxed) != 0;
}

/* A read of len bytes ended where frame i starts: decode up to len bytes
 * (at least one frame, at most RA_MAX) of the frames after it, unless the
 * first is cached or being decoded already. */
static void maybe_readahead(struct ioc_zip_image *img, size_t i, size_t len)
{
	struct jobber jb = { .img = img, .readahead = true };
	size_t want = len < RA_MAX ? len : RA_MAX, got = 0;

	if (!img->readahead)
		return;
	for (; i < img->nframes && (got == 0 || got < want); i++) {
		const struct zframe *f = &img->frames[i];
		struct ioc__zip_fentry *e;
		bool created;
		int state;

		if (is_zero(img, i) || !f->dsize)
			continue;
		if (maybe_stored(img, i)) {
			got += (size_t)f->dsize;
			continue;
		}
		if (f->dsize > img->max_cached || ioc__zip_fcache_contains(img->cache, i))
			break;
		e = ioc__zip_fcache_get(img->cache, i, (size_t)f->dsize, &created, &state);
		if (!e)
			break;
		if (created)
			jobber_add(&jb, i, e);
		ioc__zip_fcache_put(img->cache, e);
		got += (size_t)f->dsize;
	}
	jobber_submit(&jb);
}

int ioc_coroutine_fn ioc_zip_image_co_pread(struct ioc_zip_image *img, uint64_t off,
					    void *buf, size_t len, uint32_t flags)
{
	struct {
		struct ioc__zip_fentry *e;      /* NULL: decoded in place by xj,
						 * or a stored frame */
		struct ioc__zip_fentry *pe;     /* xj's claim on the frame */
		struct xjob *xj;
		size_t idx;
		int state;
		unsigned slot;                  /* in xj */
		bool queued;                    /* w waits on e */
		struct ioc__zip_fc_waiter w;
	} batch[BATCH];
	struct xjob *xjobs[BATCH];
	uint8_t *dst = buf;
	uint64_t end = off + len;
	size_t i;
	int ret = 0;
	bool alone;
	/* A small read decodes the frames it misses on this thread: cheaper
	 * than the pool's round trip, and it delays this loop's other
	 * requests by one small decode at most. */
	bool inline_ok = len <= INLINE_MAX;
	/* A larger read decodes the frames it covers whole, and nobody has
	 * cached or is decoding, straight into buf on the pool: no cache
	 * entry to fill (fresh memory costs more than the decode), no copy.
	 * It claims each such frame in the cache first, so that a concurrent
	 * reader of it waits and gets a copy instead of decoding it again.
	 * No wait cycle: each reader serves its claims and waits on others'
	 * in frame order, so the lowest frame waited on is always served. */
	bool direct_ok = !inline_ok;

	if (flags || end < off || end > img->size)
		return -EINVAL;
	if (!len)
		return 0;
	/* Pairs with the decrement at the end; relaxed, see there. */
	if (direct_ok)
		atomic_fetch_add_explicit(&img->large_reads, 1, memory_order_relaxed);
	i = find_frame(img, off);
	while (off < end) {
		unsigned n = 0, nx = 0;
		uint64_t boff = off;
		struct jobber jb = { .img = img };
		struct xjob *xj = NULL;

		/* Pass 1: start every decode of this batch. */
		for (size_t k = i; k < img->nframes && n < BATCH && img->frames[k].doff < end; k++) {
			const struct zframe *f = &img->frames[k];
			bool created;

			if (is_zero(img, k) || f->dsize > img->max_cached || !f->dsize)
				continue;
			/* The part of frame k this read wants. */
			uint64_t from = f->doff > boff ? f->doff : boff;
			uint64_t to = f->doff + f->dsize < end ? f->doff + f->dsize : end;

			batch[n].idx = k;
			batch[n].xj = NULL;
			batch[n].e = NULL;
			batch[n].pe = NULL;
			batch[n].queued = false;
			batch[n].w = (struct ioc__zip_fc_waiter){
				.dst = dst + (from - boff), .lo = from - f->doff, .len = to - from,
			};
			if (direct_ok && f->doff >= boff && f->doff + f->dsize <= end) {
				if (!xj && (xj = calloc(1, sizeof(*xj))) != NULL) {
					xj->img = img;
					xjobs[nx++] = xj;
				}
				if (xj && !maybe_stored(img, k)) {
					struct ioc__zip_fentry *pe;

					pe = ioc__zip_fcache_claim(img->cache, k, &created,
								   &batch[n].state);
					if (!pe) {
						ret = -ENOMEM;
						break;
					}
					if (!created) {
						/* Cached or being decoded. */
						batch[n].e = pe;
						goto got;
					}
					batch[n].pe = pe;
				}
				if (xj) {
					xj->f[xj->n].idx = k;
					xj->f[xj->n].dst = dst + (f->doff - boff);
					batch[n].e = NULL;
					batch[n].xj = xj;
					batch[n].slot = xj->n++;
					xj->bytes += (size_t)f->dsize;
					if (xj->n == BATCH || xj->bytes >= XJOB_BYTES) {
						xjob_submit(xj);
						xj = NULL;
					}
					n++;
					continue;
				}
			}
			if (maybe_stored(img, k)) {
				/* Read in pass 2, on this thread. */
				n++;
				continue;
			}
			batch[n].e = ioc__zip_fcache_get(img->cache, k, (size_t)f->dsize,
							 &created, &batch[n].state);
			if (!batch[n].e) {
				ret = -ENOMEM;
				break;
			}
			if (created && inline_ok && f->dsize <= INLINE_MAX)
				decode_publish(img, k, batch[n].e);
			else if (created)
				jobber_add(&jb, k, batch[n].e);
got:
			/* Queue for a frame being decoded now, not in pass 2: a
			 * frame decoded in place is served (copied to us) only
			 * if we are queued when its decoder publishes it, and
			 * it publishes a job's frames in a row. */
			if (batch[n].state == IOC__ZIP_FC_BUSY)
				batch[n].queued = !ioc__zip_fcache_wait_prepare(img->cache,
										batch[n].e,
										&batch[n].w);
			n++;
		}
		jobber_submit(&jb);
		xjob_submit(xj);
		/* Pass 2: copy in order, waiting where needed. */
		unsigned b = 0;
		while (off < end && i < img->nframes) {
			const struct zframe *f = &img->frames[i];
			uint64_t lo = off - f->doff;
			size_t part = (size_t)((f->doff + f->dsize < end ? f->doff + f->dsize : end) - off);

			if (b < n && batch[b].idx == i && batch[b].xj) {
				struct xjob *j = batch[b].xj;
				int r;

				if (!j->waited) {
					ioc_co_await(&j->aw);
					j->waited = true;
				}
				r = j->f[batch[b].slot].r;
				if (batch[b].pe) {
					ioc__zip_fcache_publish_inplace(img->cache, batch[b].pe,
									j->f[batch[b].slot].dst, r);
					ioc__zip_fcache_put(img->cache, batch[b].pe);
				}
				if (r < 0 && !ret)
					ret = r == -ENOMEM ? -ENOMEM : -EIO;
				b++;
			} else if (b < n && batch[b].idx == i && !batch[b].e) {
				int r = frame_part(img, i, lo, dst + (off - boff), part);

				if (r < 0 && !ret)
					ret = r == -ENOMEM ? -ENOMEM : -EIO;
				b++;
			} else if (b < n && batch[b].idx == i) {
				struct ioc__zip_fentry *e = batch[b].e;
				bool waited = batch[b].queued;
				int st = 0;

				if (waited)
					st = (int)ioc_co_await(&batch[b].w.aw);
				/* Final now: ordered by the shard lock or the wake. */
				if (e->inplace && e->state == IOC__ZIP_FC_READY && !waited)
					/* Served before we queued: no bytes for us. */
					st = frame_part(img, i, lo, dst + (off - boff), part);
				else if (e->inplace && st == 0 && e->state == IOC__ZIP_FC_READY)
					; /* copied by the decoder before the wake */
				else if (st == 0 && e->state == IOC__ZIP_FC_READY)
					memcpy(dst + (off - boff), e->data + lo, part);
				else
					st = e->error == -ENOMEM ? -ENOMEM : -EIO;
				if (st < 0 && !ret)
					ret = st == -ENOMEM ? -ENOMEM : -EIO;
				ioc__zip_fcache_put(img->cache, e);
				b++;
			} else if (is_zero(img, i) || !f->dsize) {
				memset(dst + (off - boff), 0, part);
			} else if (f->dsize > img->max_cached) {
				int r = stream_read(img, i, lo, dst + (off - boff), part);

				if (r < 0 && !ret)
					ret = r;
			} else {
				/* Not fetched in pass 1 (batch full or ENOMEM):
				 * the next round takes it. */
				break;
			}
			off += part;
			if (lo + part == f->dsize)
				i++;
		}
		/* Entries left over after an ENOMEM in pass 1, and claims
		 * other readers may be waiting on. */
		for (; b < n; b++) {
			if (batch[b].pe) {
				struct xjob *j = batch[b].xj;

				if (!j->waited) {
					ioc_co_await(&j->aw);
					j->waited = true;
				}
				ioc__zip_fcache_publish_inplace(img->cache, batch[b].pe,
								j->f[batch[b].slot].dst,
								j->f[batch[b].slot].r);
				ioc__zip_fcache_put(img->cache, batch[b].pe);
			}
			if (!batch[b].e)
				continue;
			/* Queued: its publisher may still copy into buf. */
			if (batch[b].queued)
				ioc_co_await(&batch[b].w.aw);
			ioc__zip_fcache_put(img->cache, batch[b].e);
		}
		/* The pool may still write into buf: wait for every job. */
		for (unsigned x = 0; x < nx; x++) {
			if (!xjobs[x]->waited)
				ioc_co_await(&xjobs[x]->aw);
			free(xjobs[x]);
		}
		dst += off - boff;
		if (ret)
			break;
	}
	/* Pairs with the increment above; relaxed: a count, it orders
	 * nothing. */
	alone = !direct_ok ||
		atomic_fetch_sub_explicit(&img->large_reads, 1, memory_order_relaxed) == 1;
	if (ret)
		return ret;
	/* A read that reached the end of a frame reads on, most likely --
	 * unless other large reads are in flight: a client with several
	 * sequential reads queued is decoding the next ones itself, in
	 * place, and readahead would decode them a second time. */
	if (alone && i < img->nframes && img->frames[i].doff == end && i > 0 &&
	    (len >= RA_MIN || img->frames[i - 1].dsize >= RA_MIN))
		maybe_readahead(img, i, len);
	return 0;
}

int ioc_zip_image_block_status(struct ioc_zip_image *img, uint64_t off, uint64_t len,
			       uint64_t *pnum, uint32_t flags)
{
	size_t i;
	bool zero;
	uint64_t pos;

	if (flags || off >= img->size)
		return -EINVAL;
	if (len > img->size - off)
		len = img->size - off;
	i = find_frame(img, off);
	zero = is_zero(img, i);
	pos = off;
	while (i < img->nframes && pos < off + len && is_zero(img, i) == zero) {
		pos = img->frames[i].doff + img->frames[i].dsize;
		i++;
	}
	*pnum = (pos < off + len ? pos : off + len) - off;
	return zero ? IOC_ZIP_STATUS_ZERO : 0;
}

/* ---- open ----------------------------------------------------------- */

/* Does the file end with the seekable format's footer magic?  Without it
 * there is no seek table (stock zstd), as opposed to a broken one. */
static bool has_seekable_footer(int fd, uint64_t size)
{
	uint8_t m[4];

	return size >= 4 && ioc__zip_pread_all(fd, m, 4, size - 4) == 0 &&
	       ioc__zip_le32(m) == IOC__ZIP_SEEKABLE_MAGIC;
}

static int frames_from_index(struct ioc_zip_image *img, const struct ioc_zip_index *ix)
{
	img->frames = calloc(ix->nframes ? ix->nframes : 1, sizeof(*img->frames));
	if (!img->frames)
		return -ENOMEM;
	for (size_t i = 0; i < ix->nframes; i++) {
		img->frames[i] = (struct zframe){
			.coff = ix->frames[i].coff, .doff = ix->frames[i].doff,
			.csize = ix->frames[i].csize, .dsize = ix->frames[i].dsize,
			.kind = ix->format == IOC_ZIP_GZIP ? IOC__ZIP_K_GZIP : IOC__ZIP_K_ZSTD,
		};
	}
	img->nframes = ix->nframes;
	img->size = ix->dsize;
	return 0;
}

/* Learn the content size of a frame that does not record it. */
static int measure_frame(const uint8_t *p, size_t csize, enum ioc__zip_kind kind,
			 uint64_t *dsize, const char **why)
{
	struct ioc__zip_dctx d;
	uint8_t *out = malloc(STREAM_CHUNK);
	size_t pos = 0;
	uint64_t total = 0;
	int r;

	if (!out)
		return -ENOMEM;
	r = ioc__zip_dctx_init(&d, 31, IOC_ZIP_DEFLATE_DEFAULT);
	if (r < 0) {
		free(out);
		return r;
	}
	r = ioc__zip_stream_begin(&d, kind, why);
	while (r == 0) {
		size_t used = 0, produced = 0;

		r = ioc__zip_stream(&d, p + pos, csize - pos, &used, out, STREAM_CHUNK,
				    &produced, why);
		pos += used;
		total += produced;
		if (r == 0 && !used && !produced) {
			*why = "frame ends early";
			r = -EBADMSG;
		}
	}
	ioc__zip_dctx_fini(&d);
	free(out);
	*dsize = total;
	return r < 0 ? r : 0;
}

/* No seek table: walk the frames one by one. */
static int walk_frames(struct ioc_zip_image *img, uint64_t fsize, char *msg, size_t msglen)
{
	uint8_t *p;
	uint64_t off = 0, doff = 0;
	size_t cap = 0, measured = 0;
	int r = 0;

	if (fsize == 0)
		return ioc__zip_say(msg, msglen, -EBADMSG, "empty file");
	p = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE, img->fd, 0);
	if (p == MAP_FAILED)
		return ioc__zip_say(msg, msglen, -errno, "mmap: %s", strerror(errno));
	while (off < fsize) {
		struct ioc__zip_frame f = { 0 };
		const char *why = "truncated frame";

		r = ioc__zip_scan(&f, p + off, (size_t)(fsize - off), &why);
		if (r == 0 && f.hdr_done && !f.sized) {
			r = ioc__zip_say(msg, msglen, -ENOTSUP,
				"gzip member at offset %llu does not record its size "
				"(not written by iocore-zip): decompress it first",
				(unsigned long long)off);
			goto out;
		}
		if (r <= 0) {
			r = ioc__zip_say(msg, msglen, -EBADMSG, "frame at offset %llu: %s",
				(unsigned long long)off, why);
			goto out;
		}
		if (f.kind == IOC__ZIP_K_SKIP) {
			off += f.csize;
			continue;
		}
		if (img->nframes == cap) {
			size_t nc = cap ? 2 * cap : 64;
			struct zframe *nf = realloc(img->frames, nc * sizeof(*nf));

			if (!nf) {
				r = -ENOMEM;
				goto out;
			}
			img->frames = nf;
			cap = nc;
		}
		if (f.dsize == UINT64_MAX) {
			r = measure_frame(p + off, (size_t)f.csize, f.kind, &f.dsize, &why);
			if (r < 0) {
				r = ioc__zip_say(msg, msglen, -EBADMSG, "frame at offset %llu: %s",
					(unsigned long long)off, why);
				goto out;
			}
			measured++;
		}
		img->frames[img->nframes++] = (struct zframe){
			.coff = off, .doff = doff, .csize = f.csize, .dsize = f.dsize,
			.kind = f.kind,
		};
		off += f.csize;
		doff += f.dsize;
	}
	img->size = doff;
	if (measured)
		snprintf(img->how, sizeof(img->how),
			 "no seek table: indexed %zu frame(s) by walking their headers "
			 "(%zu without a content size decoded once to learn it)",
			 img->nframes, measured);
	else
		snprintf(img->how, sizeof(img->how),
			 "no seek table: indexed %zu frame(s) by walking their headers",
			 img->nframes);
	img->zero = calloc(img->nframes ? img->nframes : 1, sizeof(*img->zero));
	if (!img->zero) {
		r = -ENOMEM;
		goto out;
	}
	r = 0;
out:
	munmap(p, (size_t)fsize);
	return r;
}

/* The page checks of len bytes at off (a frame whose head the index has
 * checked): kept if they describe stored-looking frames exactly, else
 * ignored with a log line (the frames' own checksums still guard every
 * read).  0, or -errno when the file cannot be read or memory is short. */
static int load_page_checks(struct ioc_zip_image *img, uint64_t off, uint64_t len)
{
	size_t mapb = (img->nframes + 7) / 8, n = 0, k = 0;
	const char *bad = NULL;
	uint8_t *buf;
	int r;

	if (!IOC_HAVE_XXHASH || len > SIZE_MAX)
		return 0;
	buf = malloc((size_t)len);
	if (!buf)
		return -ENOMEM;
	r = ioc__zip_pread_all(img->fd, buf, (size_t)len, off);
	if (r < 0)
		goto out;
	/* Checked again: the file may have changed since the index read it.
	 * n < NO_PCK follows from the frame's 32-bit size. */
	if (ioc__zip_pck_head(buf, len, img->nframes, &n, &bad) < 0) {
		ilog(img, "ignoring the page checks at offset %llu: %s",
		     (unsigned long long)off, bad);
		goto out;
	}
	img->pref = calloc(img->nframes ? img->nframes : 1, sizeof(*img->pref));
	img->pcks = malloc(n ? n * sizeof(*img->pcks) : 1);
	if (!img->pref || !img->pcks) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < img->nframes; i++) {
		const struct zframe *f = &img->frames[i];
		unsigned np = ioc__zip_pck_pages((size_t)f->dsize);

		img->pref[i].first = NO_PCK;
		if (!(buf[IOC__ZIP_PCK_HEAD + i / 8] >> (i % 8) & 1))
			continue;
		if (stored_state(img, i) == SS_NOT || !np) {
			bad = "a frame marked stored cannot be one";
			break;
		}
		if (n - k < np) {
			bad = "fewer checks than pages";
			break;
		}
		img->pref[i].first = (uint32_t)k;
		for (unsigned p = 0; p < np; p++, k++)
			img->pcks[k] = ioc__zip_le32(buf + IOC__ZIP_PCK_HEAD + mapb + k * 4);
	}
	if (!bad && k != n)
		bad = "more checks than pages";
	if (bad) {
		ilog(img, "ignoring the page checks at offset %llu: %s",
		     (unsigned long long)off, bad);
		free(img->pref);
		free(img->pcks);
		img->pref = NULL;
		img->pcks = NULL;
	}
	r = 0;
out:
	free(buf);
	return r;
}

int ioc_zip_image_open(struct ioc_zip_image **out, const char *path,
		       const struct ioc_zip_image_opts *opts, char *msg, size_t msglen)
{
	struct ioc_zip_image *img;
	struct ioc_zip_index *ix = NULL;
	uint64_t pck_off = 0, pck_len = 0;
	struct stat st;
	long ncpu;
	int r;

	*out = NULL;
	img = calloc(1, sizeof(*img));
	if (!img)
		return -ENOMEM;
	if (opts)
		img->opts = *opts;
	pthread_mutex_init(&img->lock, NULL);
	pthread_cond_init(&img->idle, NULL);
	img->readahead = !img->opts.no_readahead;
	img->work_tail = &img->work;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	img->max_runners = ncpu > 0 && ncpu < 1024 ? (unsigned)ncpu + 1 : 2;
	img->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (img->fd < 0) {
		r = ioc__zip_say(msg, msglen, -errno, "%s: %s", path, strerror(errno));
		img->fd = -1;
		goto fail;
	}
	if (fstat(img->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		r = ioc__zip_say(msg, msglen, -EINVAL, "%s: not a regular file", path);
		goto fail;
	}
	img->path = strdup(path);
	if (!img->path) {
		r = -ENOMEM;
		goto fail;
	}
	r = ioc_zip_index_read(img->fd, &ix, msg, msglen);
	if (r == -EBADMSG && !has_seekable_footer(img->fd, (uint64_t)st.st_size)) {
		/* Not a broken seek table but none at all: stock zstd. */
		r = -ENOENT;
		if (msg && msglen)
			msg[0] = 0;
	}
	if (r == 0) {
		r = frames_from_index(img, ix);
		snprintf(img->how, sizeof(img->how), "%s: %zu frame(s)",
			 ix->format == IOC_ZIP_GZIP ? "gzip member sizes" : "seek table",
			 ix->nframes);
		pck_off = ix->pck_off;
		pck_len = ix->pck_len;
		ioc_zip_index_free(ix);
		if (r < 0)
			goto fail;
		img->zero = calloc(img->nframes ? img->nframes : 1, sizeof(*img->zero));
		if (!img->zero) {
			r = -ENOMEM;
			goto fail;
		}
		r = find_zero_frames(img);
		if (r < 0) {
			ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
			goto fail;
		}
	} else if (r == -ENOENT || r == -EBADMSG) {
		int r0 = r;
		char why[256];

		snprintf(why, sizeof(why), "%s", msg ? msg : "");
		r = walk_frames(img, (uint64_t)st.st_size, msg, msglen);
		if (r < 0)
			goto fail;
		r = find_zero_frames(img);
		if (r < 0) {
			ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
			goto fail;
		}
		if (r0 == -EBADMSG)
			ilog(img, "%s: ignoring a broken index (%s)", path, why);
	} else {
		goto fail;
	}
	for (size_t i = 0; i < img->nframes; i++)
		if (img->frames[i].csize > UINT32_MAX - 1 || img->frames[i].dsize > (1ull << 40)) {
			r = ioc__zip_say(msg, msglen, -EFBIG, "frame %zu is too big", i);
			goto fail;
		}
	img->sstate = calloc(img->nframes ? img->nframes : 1, sizeof(*img->sstate));
	if (!img->sstate) {
		r = -ENOMEM;
		goto fail;
	}
	/* A stored frame is its data plus 12-25 bytes: header, block header,
	 * checksum. */
	for (size_t i = 0; i < img->nframes; i++) {
		const struct zframe *f = &img->frames[i];
		bool may = IOC_HAVE_XXHASH && f->kind == IOC__ZIP_K_ZSTD && f->dsize &&
			   f->dsize <= STORED_MAX && f->csize >= f->dsize + 12 &&
			   f->csize <= f->dsize + 25;

		if (!may) /* before any reader: pairs with nothing */
			atomic_store_explicit(&img->sstate[i], SS_NOT, memory_order_relaxed);
	}
	if (pck_len) {
		r = load_page_checks(img, pck_off, pck_len);
		if (r < 0) {
			ioc__zip_say(msg, msglen, r, "%s: page checks: %s", path, ioc_strerror(r));
			goto fail;
		}
	}
	img->fixed = img->nframes > 1 ? img->frames[0].dsize : 0;
	for (size_t i = 0; img->fixed && i + 1 < img->nframes; i++)
		if (img->frames[i].dsize != img->fixed || img->frames[i].doff != i * img->fixed)
			img->fixed = 0;
	if (!img->fixed)
		build_rank(img);
	size_t budget = img->opts.frame_cache ? img->opts.frame_cache : DEFAULT_CACHE;
	img->budget = budget;
	img->max_cached = budget / 2;
	/* The pool's buffers fit the usual frame: iocore-zip's are all one
	 * size but the last, and but its runs of zeros, one frame each,
	 * which are never cached (sized by them, each buffer would be a
	 * run's megabyte, and the ghost would remember a handful of keys). */
	size_t slot = 0;
	for (size_t i = 0; i < img->nframes; i++)
		if (!is_zero(img, i) && img->frames[i].dsize <= img->max_cached &&
		    img->frames[i].dsize <= (1u << 20) && img->frames[i].dsize > slot)
			slot = (size_t)img->frames[i].dsize;
	r = ioc__zip_fcache_new(&img->cache, budget, img->nframes, slot);
	if (r < 0)
		goto fail;
	size_t big = 0;
	for (size_t i = 0; i < img->nframes; i++)
		if (img->frames[i].dsize > img->max_cached)
			big++;
	ilog(img, "%s: %llu bytes, %s", path, (unsigned long long)img->size, img->how);
	if (big)
		ilog(img, "%s: %zu frame(s) larger than half the frame cache: each read "
		     "decodes them from their start (slow random access); recompress "
		     "with iocore-zip --block-size 256K", path, big);
	*out = img;
	return 0;
fail:
	ioc_zip_image_close(img);
	return r;
}

void ioc_zip_image_close(struct ioc_zip_image *img)
{
	if (!img)
		return;
	/* Readahead jobs nobody waits for may still run, and runners
	 * may still be leaving: both count down on the runner. */
	pthread_mutex_lock(&img->lock);
	while (img->jobs || img->runners)
		pthread_cond_wait(&img->idle, &img->lock);
	pthread_mutex_unlock(&img->lock);
	ioc__zip_fcache_free(img->cache);
	while (img->dfree) {
		struct dslot *s = img->dfree;

		img->dfree = s->next;
		ioc__zip_dctx_fini(&s->d);
		free(s->cbuf);
		free(s->rs);
		free(s);
	}
	if (img->fd >= 0)
		close(img->fd);
	free(img->frames);
	free(img->rank);
	free(img->zero);
	free(img->sstate);
	free(img->pref);
	free(img->pcks);
	free(img->path);
	pthread_cond_destroy(&img->idle);
	pthread_mutex_destroy(&img->lock);
	free(img);
}

void ioc_zip_image_get_info(struct ioc_zip_image *img, struct ioc_zip_image_info *info)
{
	struct ioc__zip_fcache_stats cs;

	memset(info, 0, sizeof(*info));
	info->size = img->size;
	info->frames = img->nframes;
	/* Pairs with set_zero()'s count; a statistic, it orders nothing. */
	info->zero_frames = atomic_load_explicit(&img->nzero, memory_order_relaxed);
	info->path = img->path;
	info->indexed_by = img->how;
	info->cache_budget = img->budget;
	ioc__zip_fcache_get_stats(img->cache, &cs);
	info->cache_hits = cs.hits;
	info->cache_misses = cs.misses;
	info->cache_evictions = cs.evictions;
	info->cache_bytes = cs.bytes;
	info->cache_admitted = cs.admitted;
	info->cache_probation_bytes = cs.probation_bytes;
	info->decodes = atomic_load_explicit(&img->decodes, memory_order_relaxed);
	info->readaheads = atomic_load_explicit(&img->readaheads, memory_order_relaxed);
	info->stream_reads = atomic_load_explicit(&img->stream_reads, memory_order_relaxed);
	info->errors = atomic_load_explicit(&img->errors, memory_order_relaxed);
	info->direct_decodes = atomic_load_explicit(&img->direct, memory_order_relaxed);
	info->stored_reads = atomic_load_explicit(&img->stored, memory_order_relaxed);
	info->stored_checks = atomic_load_explicit(&img->stored_checks, memory_order_relaxed);
	info->page_checks = atomic_load_explicit(&img->page_checks, memory_order_relaxed);
	info->decode_threads = img->max_runners;
	pthread_mutex_lock(&img->lock);
	info->decode_threads_peak = img->runners_peak;
	pthread_mutex_unlock(&img->lock);
}
