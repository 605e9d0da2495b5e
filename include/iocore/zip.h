/*
 * iocore zip: parallel zstd/gzip compression and decompression on the
 * workqueue, in formats stock tools read.
 *
 * A stream object (struct ioc_zip) is either a compressor or a
 * decompressor.  The caller feeds bytes with ioc_zip_write() (or fills the
 * stream's own block buffer with ioc_zip_buffer()/ioc_zip_commit() to save a
 * copy), calls ioc_zip_finish() at the end, and receives the output, in
 * order, through opts.write on the feeding thread (a decompressor may
 * instead take opts.write_at, called by the workers with offsets).
 *
 *   struct ioc_zip_opts o = { .level = 3, .write = send_fn, .opaque = chan };
 *   ioc_zip_compressor_new(&z, &o);
 *   for each page: ioc_zip_write(z, page, 4096, 0);
 *   at a sync point: ioc_zip_write(z, NULL, 0, IOC_ZIP_FLUSH);
 *   ioc_zip_finish(z); ioc_zip_free(z);
 *
 * Output formats:
 *   zstd: one independent frame per block, each with content size and
 *         checksum, then a seek table in zstd's seekable format (a
 *         skippable frame).  `zstd -d` reads it.
 *   gzip: one independent member per block (multi-member gzip that gzip
 *         and pigz read); each header carries an extra subfield 'I','Z'
 *         with the member's compressed size so decoders can split the
 *         file without inflating it.
 * An all-zero block becomes a minimal frame (zstd: RLE blocks) without
 * running the compressor; with opts.zero_runs a run of them becomes one
 * such frame.
 *
 * Memory: opts.in_flight slots (default 2 * workers + 2), each a block of input
 * (blocks under 256 KiB are batched, 1 MiB of them per slot: one job per
 * batch, still one frame per block) and its compressed bound, allocated at
 * creation and reused; one codec context
 * per worker; the zstd seek table costs 12 bytes per block until finish.
 * A decompressor grows its slots to the frames it meets, up to max_frame
 * (content) and its compressed bound (with write_at the decoded side is
 * one buffer per worker; fed by ioc_zip_write_ref, slots hold no
 * input); bigger or unsized frames decode
 * streaming on the feeding thread with a window of at most
 * 2^window_log_max.  So memory is bounded by the options, not the input.
 *
 * Threading: one stream is used by one thread at a time.  The callback runs
 * on that thread, inside ioc_zip_write()/commit()/finish(), unless the
 * options move it to the workers (write_at for decompression,
 * write_from_workers for compression; see their comments).
 */
#ifndef IOCORE_ZIP_H
#define IOCORE_ZIP_H

#include "iocore/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_zip;

enum ioc_zip_format {
	IOC_ZIP_ZSTD = 0,
	IOC_ZIP_GZIP,
	IOC_ZIP_AUTO,           /* decompression only: detect per frame */
};

/* Deflate implementation for gzip.  DEFAULT: gzip level N aims at zlib
 * -N's ratio (what gzip -N and pigz -N produce) with the fastest backend
 * setting measured to reach it: ISA-L's igzip 1-3 for levels 1-3 (within
 * ~1% of zlib on text, smaller on memory images, up to ~4% bigger on
 * binaries), libdeflate above it at a calibrated level of its own (e.g.
 * -6 runs libdeflate 5; the table is in src/zip/codec.c), zlib when
 * neither is built.  An explicit backend runs at the level as given (igzip
 * clamps above 3 to 3).  Decompression always uses libdeflate when built
 * (faster than igzip's inflate), else zlib.  Asking for one that is not
 * built gives -ENOTSUP.
 * Reproducibility: zstd, libdeflate and zlib output is a function of the
 * input, the level and the block size alone.  igzip's (gzip levels 1-3 by
 * default) may differ by a few bytes from run to run -- always valid and
 * decoding to the same data: ISA-L 2.30 compresses some blocks slightly
 * differently depending on the address of its stream state, which moves
 * with every run.  Pick IOC_ZIP_DEFLATE_LIBDEFLATE (iocore-zip
 * --deflate=libdeflate) where the compressed bytes themselves must repeat
 * (deduplicating backups). */
enum ioc_zip_deflate {
	IOC_ZIP_DEFLATE_DEFAULT = 0,
	IOC_ZIP_DEFLATE_LIBDEFLATE,
	IOC_ZIP_DEFLATE_ZLIB,
	IOC_ZIP_DEFLATE_ISAL,
};

/* Output sink: consume len bytes; return 0 or -errno (which aborts the
 * stream and is returned by the call that fed it). */
typedef int (*ioc_zip_write_fn)(void *opaque, const void *buf, size_t len);

#define IOC_ZIP_MAX_BLOCK      (64u << 20)
#define IOC_ZIP_MIN_BLOCK      (4u << 10)

struct ioc_zip_opts {
	enum ioc_zip_format format;   /* compression: ZSTD (default) or GZIP */
	int level;                    /* 0 = 3 for zstd, 6 for gzip; 1..19 */
	size_t block_size;            /* 0 = ioc_zip_default_block(); 4 KiB..64 MiB */
	unsigned workers;             /* 0 = online CPUs */
	unsigned in_flight;           /* slots; 0 = 2 * workers + 2 (decompression:
					 workers + 2, or 4 * workers + 2
					 with write_at, whose decoded
					 output is per worker, not per
					 slot) */
	bool no_checksum;             /* zstd: omit frame checksums */
	bool no_seek_table;           /* zstd: omit the seek table */
	bool zero_runs;               /* zstd: all-zero blocks that follow
					 each other in one batch (blocks
					 under 256 KiB) become one frame, so
					 frames vary in size; needs
					 libxxhash when checksums are on
					 (without it, one frame per block) */
	bool no_page_checks;          /* zstd with a seek table: no checksum
					 per 4 KiB page of stored frames
					 (~0.1% of them; they let a reader
					 check only what it reads) */
	enum ioc_zip_deflate deflate;
	/* Decompression limits against hostile input. */
	unsigned window_log_max;      /* 0 = 27 (128 MiB), as zstd -d */
	size_t max_frame;             /* largest frame decoded in memory;
					 0 = IOC_ZIP_MAX_BLOCK.  Larger or
					 unsized frames decode streaming on
					 the feeding thread. */
	ioc_zip_write_fn write;       /* required (unless write_at, below) */
	void *opaque;
	/* Decompression only, optional: positional output.  When set, each
	 * frame's data is written by the worker that decoded it, as soon as
	 * it is decoded, at its offset in the output; calls come from several
	 * threads at once, in any order, for disjoint ranges (pwrite(2) on a
	 * regular file fits).  write is then not called. */
	int (*write_at)(void *opaque, const void *buf, size_t len, uint64_t offset);
	/* Decompression only, optional, needs write_at: the caller's output
	 * memory.  A frame decoded by a worker whose data falls inside
	 * [0, out_cap) is decoded straight into out_buf + its offset, with
	 * no write_at call and no copy (libzstd's decode into a caller's
	 * buffer, in parallel); anything else (data past out_cap, frames
	 * decoded streaming) still goes through write_at.  Workers write
	 * disjoint ranges; read the buffer after ioc_zip_finish(). */
	void *out_buf;
	size_t out_cap;
	/* Compression only, optional: write is called by the worker threads
	 * instead of the feeding thread, still one call at a time, in output
	 * order, each call ordered after the previous one (so the callback
	 * needs no lock of its own, but must not care which thread runs
	 * it).  Spreads the cost of writing the output over the workers
	 * instead of taking it from whichever core the feeding thread runs
	 * on.  The seek table, at ioc_zip_finish(), is still written by the
	 * feeding thread, after every block. */
	bool write_from_workers;
};

/* Default block size for a format and level: zstd 4 MiB up to -5, 8 MiB up
 * to -12, 16 MiB above (the window grows with the level); gzip 1 MiB. */
size_t ioc_zip_default_block(enum ioc_zip_format format, int level);

int ioc_zip_compressor_new(struct ioc_zip **out, const struct ioc_zip_opts *opts);
int ioc_zip_decompressor_new(struct ioc_zip **out, const struct ioc_zip_opts *opts);
/* Drops anything unfinished.  Safe on NULL. */
void ioc_zip_free(struct ioc_zip *z);

/* Flags for ioc_zip_write()/ioc_zip_commit(). */
enum {
	/* After this data: end the current block even if it is not full
	 * (compressor) and return only once everything fed so far has been
	 * written through the callback.  A migration stream uses it at the
	 * end of each dirty-page pass.  Costs a short block and a pipeline
	 * drain, so not for every write. */
	IOC_ZIP_FLUSH = 1u << 0,
};

/* Feed len bytes (uncompressed for a compressor, compressed for a
 * decompressor).  flags: 0 or IOC_ZIP_FLUSH.  Returns 0 or -errno; after an
 * error the stream is dead and ioc_zip_error() says why. */
int ioc_zip_write(struct ioc_zip *z, const void *buf, size_t len, uint32_t flags);

/* Like ioc_zip_write(), without copying the input into the stream: a
 * decompressor's workers read whole frames straight from buf (a mapped
 * file, say).  buf must stay valid and unchanged until ioc_zip_finish() or
 * ioc_zip_free() returns.  Bytes of a frame cut at the end of buf are
 * copied and joined with the next write; a write that starts inside such
 * a frame is copied whole.  A compressor's workers read whole slots'
 * worth of blocks straight from buf; a block cut by the end of buf is
 * copied and completed by the next write, so blocks fall where
 * ioc_zip_write() would cut them. */
int ioc_zip_write_ref(struct ioc_zip *z, const void *buf, size_t len, uint32_t flags);

/* Zero-copy feeding: *buf gets room for up to *len bytes inside the
 * stream; write into it and call ioc_zip_commit(z, n, flags) with n <= *len.
 * The buffer is valid until the next call on z. */
int ioc_zip_buffer(struct ioc_zip *z, void **buf, size_t *len);
int ioc_zip_commit(struct ioc_zip *z, size_t n, uint32_t flags);

/* Compressor: emits the last block and the seek table.  Decompressor:
 * fails with -EBADMSG if the input ended inside a frame.  Waits for every
 * block to be written. */
int ioc_zip_finish(struct ioc_zip *z);

/* Text of the last error, naming the input offset where it applies
 * ("frame at offset 1234: checksum mismatch").  Never NULL. */
const char *ioc_zip_error(const struct ioc_zip *z);

struct ioc_zip_stats {
	uint64_t in_bytes;
	uint64_t out_bytes;
	uint64_t frames;          /* frames/members produced or decoded */
	uint64_t zero_frames;     /* all-zero blocks emitted without compressing */
	uint64_t parallel_frames; /* decompression: frames decoded by workers */
	uint64_t stream_frames;   /* decompression: frames decoded streaming */
};
void ioc_zip_get_stats(const struct ioc_zip *z, struct ioc_zip_stats *st);

/* Per worker thread: CPU time spent in this stream's jobs (thread CPU
 * clock, so time preempted by other processes does not count), jobs run
 * and blocks/frames in them.  Fills up to max, returns the number of
 * workers. */
struct ioc_zip_worker_stats {
	uint64_t cpu_ns;
	uint64_t jobs;
	uint64_t frames;
};
int ioc_zip_get_worker_stats(struct ioc_zip *z, struct ioc_zip_worker_stats *st, unsigned max);

/* ------------------------------------------------------------------ */
/* Random access and listing (files in our formats, or any zstd file
 * with a seek table, or gzip members carrying the 'IZ' subfield). */

struct ioc_zip_frame_info {
	uint64_t coff;    /* offset in the compressed file */
	uint64_t doff;    /* offset in the decompressed data */
	uint32_t csize;
	uint32_t dsize;
	uint32_t sum;     /* XXH64 low 32 bits (zstd) or CRC32 (gzip), if has_sum */
	bool has_sum;
};

struct ioc_zip_index {
	enum ioc_zip_format format;
	size_t nframes;
	uint64_t csize;   /* compressed bytes described (file size) */
	uint64_t dsize;   /* total decompressed size */
	struct ioc_zip_frame_info *frames;
	/* zstd: iocore-zip's page checks of stored frames, a skippable frame
	 * of pck_len bytes at pck_off between the data and the seek table
	 * (both 0 when the file has none). */
	uint64_t pck_off, pck_len;
};

/* Builds an index of the file open on fd: the seek table for zstd, the
 * member headers for gzip.  -ENOENT when the file has no usable index,
 * -EBADMSG when it has a broken one (msg, if not NULL, gets a message
 * naming the offset). */
int ioc_zip_index_read(int fd, struct ioc_zip_index **out, char *msg, size_t msglen);
void ioc_zip_index_free(struct ioc_zip_index *ix);

/* Decompress bytes [off, off + len) of the data in fd (using the index)
 * through opts->write, decoding only the frames that cover the range, in
 * parallel.  len is clipped at the end of the data.  Returns 0 or -errno;
 * msg as above. */
int ioc_zip_extract(int fd, const struct ioc_zip_index *ix, uint64_t off, uint64_t len,
		    const struct ioc_zip_opts *opts, char *msg, size_t msglen);


/* ------------------------------------------------------------------ */
/* Compressed images: random access to the decompressed bytes of a file in
 * our formats (zstd frames with a seek table, gzip members with sizes) or
 * of any stock zstd file (indexed at open by walking its frames), for
 * coroutines on any number of loop threads at once.  Frames are decoded
 * on the calling loop's thread pool and kept in a frame cache shared by
 * all readers; see src/zip/image.c. */

struct ioc_zip_image;

struct ioc_zip_image_opts {
	size_t frame_cache;         /* bytes of decoded frames kept; 0 = 256 MiB.
				     * A sixteenth holds frames read once (on
				     * probation); frames above half of it are
				     * not cached but decoded from their start
				     * per read. */
	bool no_readahead;          /* do not decode the next frame when a read
				     * ends on a frame's last byte */
	/* Open-time notes and decode errors (naming the offsets); any
	 * thread.  NULL = silent. */
	void (*log)(void *opaque, const char *msg);
	void *log_opaque;
};

/* 1 if the file open on fd starts like a zstd frame, a skippable frame or
 * a gzip member, 0 if not, or -errno. */
int ioc_zip_probe(int fd);

/* Open path read-only and index it.  -errno, with a message in msg. */
int ioc_zip_image_open(struct ioc_zip_image **out, const char *path,
		       const struct ioc_zip_image_opts *opts, char *msg, size_t msglen);
/* No read may be in flight.  Waits for readahead decodes still queued:
 * call it after the loops that read have finished (or been freed).  Safe
 * on NULL. */
void ioc_zip_image_close(struct ioc_zip_image *img);

/* Read [off, off + len) of the decompressed data; coroutine on a loop
 * thread.  flags must be 0.  -EINVAL past the end; -EIO when a frame in
 * the range is corrupt (logged with its offsets; other ranges still
 * read); -ENOMEM. */
int ioc_coroutine_fn ioc_zip_image_co_pread(struct ioc_zip_image *img, uint64_t off,
					    void *buf, size_t len, uint32_t flags);

enum {
	IOC_ZIP_STATUS_ZERO = 1u << 0,      /* reads as zeroes (a hole) */
	IOC_ZIP_STATUS_OVERLAY = 1u << 1,   /* overlay: comes from the overlay
					     * file, not the base */
};
/* Status of the first extent of [off, off + len): IOC_ZIP_STATUS_ZERO for
 * frames known to be all zero (recognised from their bytes at open, or
 * after a decode), 0 for data; its length in *pnum.  flags must be 0.
 * Never blocks. */
int ioc_zip_image_block_status(struct ioc_zip_image *img, uint64_t off, uint64_t len,
			       uint64_t *pnum, uint32_t flags);

struct ioc_zip_image_info {
	uint64_t size;              /* decompressed bytes */
	size_t frames, zero_frames;
	const char *path;           /* as opened (valid while open) */
	const char *indexed_by;     /* how the index was found (valid while open) */
	uint64_t cache_budget;      /* the frame cache's size (opts.frame_cache) */
	uint64_t cache_hits, cache_misses, cache_evictions, cache_bytes;
	uint64_t decodes, readaheads, stream_reads, errors;
	uint64_t direct_decodes;    /* of those decodes, straight into a read's
				     * buffer (frames a large read covers whole) */
	uint64_t cache_admitted;    /* misses kept past probation (read again) */
	uint64_t cache_probation_bytes; /* of cache_bytes, on probation */
	uint64_t stored_reads;      /* stored (raw) frames read from the file,
				     * not decoded nor cached */
	uint64_t stored_checks;     /* of those, reads that checked the whole
				     * frame's checksum: each frame's first
				     * (later reads trust it) */
	uint64_t page_checks;       /* pages of stored frames checked on their
				     * own (files with page checks): each
				     * page's first read checks just it */
	unsigned decode_threads;    /* pool threads that decode at once, at
				     * most (online CPUs + 1) */
	unsigned decode_threads_peak; /* most that did so far */
};
/* Any thread. */
void ioc_zip_image_get_info(struct ioc_zip_image *img, struct ioc_zip_image_info *info);

/* Copy-on-write overlay over a compressed image (src/zip/overlay.c): one
 * sparse file (header, allocation map of 64 KiB clusters, data) that makes
 * the image writable while the compressed base stays untouched.  Created
 * when path is missing or empty; refused when made for another base.
 * Flush (and FUA) make every completed write durable; the map on disk
 * never points at data that is not.  Coroutine calls on loop threads, any
 * number at once; results 0 or -errno. */
struct ioc_zip_overlay;
enum { IOC_ZIP_OVERLAY_FUA = 1u << 0 };
int ioc_zip_overlay_open(struct ioc_zip_overlay **out, struct ioc_zip_image *base,
			 const char *path, char *msg, size_t msglen);
/* No request may be in flight; does not flush.  Safe on NULL. */
void ioc_zip_overlay_close(struct ioc_zip_overlay *ov);
uint64_t ioc_zip_overlay_size(struct ioc_zip_overlay *ov);
struct ioc_zip_overlay_info {
	const char *path;           /* the overlay file (valid while open) */
	uint64_t size;              /* the image's, as the base's */
	uint64_t cluster_size;
	uint64_t clusters_written;  /* clusters whose data the overlay holds */
	uint64_t clusters_zero;     /* clusters zeroed or trimmed over the base */
};
/* Any thread; writes in flight may or may not be counted yet. */
void ioc_zip_overlay_get_info(struct ioc_zip_overlay *ov, struct ioc_zip_overlay_info *info);
int ioc_coroutine_fn ioc_zip_overlay_co_pread(struct ioc_zip_overlay *ov, uint64_t off,
					      void *buf, size_t len, uint32_t flags);
/* flags: 0 or IOC_ZIP_OVERLAY_FUA. */
int ioc_coroutine_fn ioc_zip_overlay_co_pwrite(struct ioc_zip_overlay *ov, uint64_t off,
					       const void *buf, size_t len, uint32_t flags);
/* Zeroes that read back as zeroes over any base data (TRIM too). */
int ioc_coroutine_fn ioc_zip_overlay_co_zero(struct ioc_zip_overlay *ov, uint64_t off,
					     uint64_t len, uint32_t flags);
int ioc_coroutine_fn ioc_zip_overlay_co_flush(struct ioc_zip_overlay *ov, uint32_t flags);
/* IOC_ZIP_STATUS_* of the first extent (OVERLAY set where the overlay
 * decides the bytes), its length in *pnum.  Never blocks. */
int ioc_zip_overlay_block_status(struct ioc_zip_overlay *ov, uint64_t off, uint64_t len,
				 uint64_t *pnum, uint32_t flags);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_ZIP_H */
