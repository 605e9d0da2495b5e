/*
 * Private to src/zip: the pipeline's state, shared by pipeline.c (the slot
 * cycle, compression, the public entry points) and decompress.c.  Calls run
 * one way: decompress.c uses the cycle below; pipeline.c reaches
 * decompression only through the ioc__zip_dir ops the stream was made with.
 */
#ifndef IOC_ZIP_INT_H
#define IOC_ZIP_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "iocore/wq.h"
#include "iocore/zip.h"
#include "codec.h"

struct ioc_zip;

/* What differs between compressing and decompressing streams.  Called on
 * the feeding thread (job: on a workqueue worker) after the entry point
 * checked the stream is alive and the flags are known. */
struct ioc__zip_dir {
	bool decomp;
	void (*job)(struct ioc_wq_job *job);
	int (*buffer)(struct ioc_zip *z, void **buf, size_t *len);
	int (*commit)(struct ioc_zip *z, size_t n);
	int (*write_ref)(struct ioc_zip *z, const uint8_t *p, size_t len, uint32_t flags);
	int (*finish)(struct ioc_zip *z);
};

/* One frame of a batch, at in + coff, decoding to out + doff. */
struct fdesc {
	uint32_t coff, csize, doff, dsize;
	enum ioc__zip_kind kind;  /* decompression */
	uint32_t sum;             /* compression: the frame's checksum */
	bool zero;                /* compression: all-zero shortcut taken */
	uint8_t pck_n;            /* compression: page checks of a stored */
	uint32_t pck_at;          /* frame, in its slot's pck from pck_at */
};

/* Frames under BATCH_FRAME are batched into one slot, up to BATCH_BYTES of
 * input or output or BATCH_MAX frames, so a stream of 4 KiB frames (a
 * migration stream's pages) costs one job per ~1 MiB, not per page.
 * Compression batches the same way: blocks under BATCH_FRAME share a slot
 * of up to BATCH_BYTES (still one independent frame per block). */
#define BATCH_FRAME (256u << 10)
#define BATCH_BYTES (1u << 20)
#define BATCH_MAX 256

struct slot {
	struct ioc_wq_job job;
	struct ioc_zip *z;
	uint8_t *in, *out;
	/* Where the worker reads its input: s->in, or the caller's own
	 * buffer (ioc_zip_write_ref), frames for decompression, a whole
	 * slot's worth of blocks for compression. */
	const uint8_t *src;
	size_t in_len, in_cap, out_len, out_cap;
	uint64_t in_off;          /* stream offset of the input (for errors) */
	uint64_t out_off;         /* decompression: offset of the output */
	uint64_t seq;
	/* Decompression of small frames: several per slot (see batching). */
	struct fdesc *fd;
	unsigned nf;
	uint32_t *pck;            /* compression: page checks of its frames */
	size_t npck;
	uint64_t err_off;         /* offset of the frame that failed */
	/* Set by the feeding thread when the wq hands the job back (only then
	 * may the slot be reused); err/why/out_len, written by the worker,
	 * are read after that handoff, which orders them. */
	bool done;
	int err;
	const char *why;
	/* Compression with write_from_workers (see worker_write()): ready is
	 * set by the compressing worker once out/out_len/fd are final and
	 * cleared by the writer; written is set by the writer when the slot
	 * is out (or skipped after an error) and read by the feeding thread
	 * before it emits or reuses the slot. */
	atomic_bool ready;
	atomic_bool written;
};

struct ctx_cell {
	/* Claimed by a job with an acquire exchange; released with a release
	 * store when the job is done with it, pairing with the next claimer's
	 * exchange so its view of the context is the releaser's. */
	atomic_bool busy;
	bool ready;
	/* Decompression with write_at: the claimer's output buffer (the frame
	 * leaves through write_at before the job ends, so it need not live in
	 * the slot), grown to the frames met and reused while cache-warm. */
	uint8_t *obuf;
	size_t ocap;
	union {
		struct ioc__zip_cctx c;
		struct ioc__zip_dctx d;
	};
} IOC_CACHE_ALIGNED;

/* Per-worker-thread accounting, each on its own line, written only by its
 * thread.  CPU time (CLOCK_THREAD_CPUTIME_ID) rather than wall time, so
 * "equally busy" means equal work, not equal time spent preempted by other
 * processes on a shared machine. */
struct wstat {
	_Atomic uint64_t cpu_ns;
	_Atomic uint64_t jobs;
	_Atomic uint64_t frames;
} IOC_CACHE_ALIGNED;

struct ioc_zip {
	bool decomp;
	const struct ioc__zip_dir *dir;
	bool dead;
	struct ioc_zip_opts o;
	int level;
	size_t block;
	unsigned bps;             /* compression: blocks per slot */
	struct ioc_wq *wq;
	unsigned workers;

	struct slot *slots;
	unsigned nslots;
	uint64_t next_seq;        /* next block to fill */
	uint64_t emitted;         /* blocks written out */
	bool filling;             /* slot next_seq % nslots is being filled */

	struct ctx_cell *cells;
	unsigned ncells;

	struct wstat *wstats;
	/* Hands out wstats indices to worker threads on their first job.
	 * Relaxed: only uniqueness matters, the index is then the thread's. */
	atomic_uint next_widx;

	/* zstd seek table (compression) / frames since the last table
	 * (decompression, to check a table we meet). */
	struct ioc__zip_seek_entry *ents;
	size_t nents, ents_cap;
	bool ents_overflow;       /* decompression: too many to check */
	/* Compression: the page-check frame (codec.c) being gathered, a bit
	 * per seek-table entry (set for stored frames) and their checks. */
	bool pck_on;
	uint8_t *pck_map;
	size_t pck_map_cap;
	uint32_t *pcks;
	size_t npcks, pcks_cap;

	/* decompression */
	uint8_t *stage;
	size_t stage_start, stage_len, stage_cap, stage_max;
	uint64_t stage_off;       /* stream offset of stage[stage_start] */
	uint64_t frame_off;       /* offset of the frame being streamed */
	struct ioc__zip_frame fr;
	bool streaming;
	bool ref;                 /* stage is the caller's buffer (write_ref) */
	uint64_t skip_left;       /* bytes of a big skippable frame to drop */
	struct ioc__zip_dctx sd;
	bool sd_ready;
	struct slot *batch;       /* slot collecting small frames, not submitted */
	uint8_t *sout;
	size_t sout_cap;

	/* Compression with write_from_workers: wtoken is the writer's
	 * try-lock, wnext the seq of the next slot to write (changed only by
	 * the token holder), werr the first write error. */
	atomic_bool wtoken;
	_Atomic uint64_t wnext;
	atomic_int werr;

	struct ioc_zip_stats st;
	uint64_t in_total;
	uint64_t out_next;        /* decompression: output offset of the next frame */
	char err[256];
};

/* Record the first error (message and code) and mark the stream dead;
 * returns err. */
int ioc__zip_fail(struct ioc_zip *z, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Slot buffers: huge-page backed from 2 MiB up. */
void *ioc__zip_buf_alloc(size_t n);
void ioc__zip_buf_free(void *p, size_t n);

/* Worker side: a codec context cell for the job's duration, and the
 * worker's CPU-time accounting. */
struct ctx_cell *ioc__zip_claim(struct ioc_zip *z);
void ioc__zip_unclaim(struct ctx_cell *c);
uint64_t ioc__zip_thread_cpu_ns(void);
void ioc__zip_account(struct ioc_zip *z, uint64_t t0, unsigned frames);

/* Feeding-thread side of the slot cycle. */
int ioc__zip_push_entry(struct ioc_zip *z, uint32_t csize, uint32_t dsize, uint32_t sum);
int ioc__zip_submit(struct ioc_zip *z, struct slot *s);
int ioc__zip_next_slot(struct ioc_zip *z, struct slot **out);
int ioc__zip_drain(struct ioc_zip *z);

/* A stream of either direction. */
int ioc__zip_create(struct ioc_zip **out, const struct ioc_zip_opts *opts,
		    const struct ioc__zip_dir *dir);

#endif /* IOC_ZIP_INT_H */
