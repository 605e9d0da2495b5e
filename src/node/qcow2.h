/*
 * qcow2: the private interface between the driver's files.
 *
 *   qcow2-format.c   pure parsers (header, extensions, snapshot entries,
 *                    table entries, compressed clusters): no I/O, no
 *                    state, so the fuzz target links them alone;
 *   qcow2-cache.c    the L2 slice cache (lock-free hits);
 *   qcow2-refcount.c refcounts, cluster allocation, metadata writeback;
 *   qcow2-check.c    the repair of a dirty image's refcounts at open;
 *   qcow2.c          the driver: open, the read and write paths.
 *
 * qcow2.c's opening comment is the design essay, crash ordering included.
 */
#ifndef IOC_NODE_QCOW2_H
#define IOC_NODE_QCOW2_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "iocore/co.h"

/* ---- the format (docs/interop/qcow2.txt) ------------------------------ */

#define Q2_MAGIC              0x514649fbu   /* "QFI\xfb" */
#define Q2_MIN_CLUSTER_BITS   9
#define Q2_MAX_CLUSTER_BITS   21
#define Q2_V2_HEADER_LEN      72
#define Q2_V3_HEADER_LEN      104
/* QEMU's implementation limits, which we keep so that every image one
 * opens the other does. */
#define Q2_MAX_L1_BYTES       (32u << 20)
#define Q2_MAX_REFTABLE_BYTES (8u << 20)
#define Q2_MAX_SNAPSHOTS      65536u
#define Q2_MAX_SNAPSHOTS_BYTES (1024u * Q2_MAX_SNAPSHOTS)
#define Q2_MAX_SNAPSHOT_EXTRA 1024u
#define Q2_SNAPSHOT_HDR_LEN   40u
#define Q2_MAX_BACKING_NAME   1023u
#define Q2_MAX_BITMAPS        65535u
#define Q2_MAX_BITMAP_DIR     (1024u * Q2_MAX_BITMAPS)

#define Q2_INCOMPAT_DIRTY     (1ull << 0)
#define Q2_INCOMPAT_CORRUPT   (1ull << 1)
#define Q2_INCOMPAT_DATA_FILE (1ull << 2)
#define Q2_INCOMPAT_COMPRESS  (1ull << 3)
#define Q2_INCOMPAT_EXT_L2    (1ull << 4)
#define Q2_INCOMPAT_KNOWN     0x1full
#define Q2_COMPAT_LAZY        (1ull << 0)
#define Q2_AUTOCLEAR_BITMAPS  (1ull << 0)
#define Q2_AUTOCLEAR_RAW_DATA (1ull << 1)

#define Q2_EXT_END            0x00000000u
#define Q2_EXT_BACKING_FMT    0xe2792acau
#define Q2_EXT_FEATURES       0x6803f857u
#define Q2_EXT_BITMAPS        0x23852875u
#define Q2_EXT_CRYPTO         0x0537be77u
#define Q2_EXT_DATA_FILE      0x44415441u

/* Header field offsets (the ones written back). */
#define Q2_OFF_REFTABLE       48   /* refcount_table_offset, then _clusters */
#define Q2_OFF_INCOMPAT       72
#define Q2_OFF_AUTOCLEAR      88

#define Q2_OFLAG_COPIED       (1ull << 63)
#define Q2_OFLAG_COMPRESSED   (1ull << 62)
#define Q2_OFLAG_ZERO         (1ull << 0)
#define Q2_L1E_OFFSET_MASK    0x00fffffffffffe00ull
#define Q2_L1E_RESERVED       0x7f000000000001ffull
#define Q2_L2E_OFFSET_MASK    0x00fffffffffffe00ull
#define Q2_L2E_RESERVED       0x3f000000000001feull
#define Q2_RTE_OFFSET_MASK    0xfffffffffffffe00ull

enum q2_compression { Q2_COMP_ZLIB = 0, Q2_COMP_ZSTD = 1 };

/* A parsed and range-checked header with its extensions. */
struct q2_header {
	uint32_t version;
	uint64_t backing_off;
	uint32_t backing_len;
	uint32_t cluster_bits;
	uint64_t size;                 /* rounded down to 512, as QEMU does */
	uint32_t crypt_method;
	uint32_t l1_size;
	uint64_t l1_off;
	uint64_t rt_off;
	uint32_t rt_clusters;
	uint32_t nb_snapshots;
	uint64_t snapshots_off;
	uint64_t incompat, compat, autoclear;
	uint32_t refcount_order;
	uint32_t header_len;
	uint8_t compression;
	char backing_file[Q2_MAX_BACKING_NAME + 1];
	char backing_fmt[16];
	bool has_bitmaps;              /* extension present and consistent */
	uint32_t nb_bitmaps;
	uint64_t bitmap_dir_off, bitmap_dir_size;
};

/* Parse the first bytes of an image (buf[0..len), len at least the
 * cluster size or the whole file when it is shorter; file_size the
 * file's).  read_write: refuse what may only be read (the corrupt bit;
 * a dirty image is repaired at a writable open, qcow2-check.c).
 * 0, or -errno with err naming the field in QEMU's words. */
int ioc__qcow2_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
			    bool read_write, struct q2_header *h, char *err, size_t errlen);

/* One snapshot table entry's fixed part (40 bytes at p).  Returns the
 * entry's whole length (the next starts at it rounded up to 8; the last
 * one's padding may be missing at the end of the file), or -errno. */
int64_t ioc__qcow2_parse_snapshot(const uint8_t *p, const struct q2_header *h,
				  uint64_t file_size, unsigned index, char *err,
				  size_t errlen);

/* The bitmaps extension (docs/interop/qcow2.txt, "Bitmaps extension"):
 * a directory of entries, each a bitmap table of cluster offsets. */
#define Q2_BME_IN_USE         (1u << 0)
#define Q2_BME_AUTO           (1u << 1)
#define Q2_BME_KNOWN_FLAGS    0x3u      /* QEMU's: the rest are refused */
#define Q2_BME_TYPE_DIRTY     1u
#define Q2_BME_HDR_LEN        24u
#define Q2_BME_MIN_GRAN_BITS  9u
#define Q2_BME_MAX_GRAN_BITS  31u
#define Q2_BME_MAX_NAME       1023u
#define Q2_BME_MAX_TABLE      0x8000000u   /* entries */
#define Q2_BME_MAX_PHYS       0x20000000u  /* bytes of bitmap data */
#define Q2_BTE_OFFSET_MASK    0x00fffffffffffe00ull
#define Q2_BTE_RESERVED       0xff000000000001feull
#define Q2_BTE_ALL_ONES       (1ull << 0)

struct q2_bitmap_entry {
	uint64_t table_off;
	uint32_t table_size;           /* entries */
	uint32_t flags;                /* Q2_BME_* */
	unsigned gran_bits;
	uint16_t name_len;
	const char *name;              /* into the directory, not terminated */
};

/* The bitmap table entries a bitmap of 2^gran_bits granules needs over
 * size bytes with clusters of 2^cluster_bits. */
uint64_t ioc__qcow2_bitmap_table_size(uint64_t size, unsigned gran_bits,
				      unsigned cluster_bits);
/* Parse and check a bitmap directory (dir[0..len), nb entries by the
 * header) as QEMU checks it, with offsets also checked against the file
 * and the header cluster: out[0..nb) filled.  0, or -EINVAL with err
 * naming the bitmap and the field. */
int ioc__qcow2_parse_bitmap_dir(const uint8_t *dir, size_t len, uint32_t nb,
				uint64_t image_size, unsigned cluster_bits, uint64_t file_size,
				struct q2_bitmap_entry *out, char *err, size_t errlen);
/* Check a bitmap table entry: 0, or -EINVAL with err set. */
int ioc__qcow2_check_bitmap_te(uint64_t e, unsigned cluster_bits, uint64_t file_size,
			       char *err, size_t errlen);

/* Guest cluster kinds of an L2 entry. */
enum q2_kind {
	Q2_UNALLOC,        /* backing file, or zeroes */
	Q2_ZERO,           /* reads as zeroes */
	Q2_DATA,           /* at host offset */
	Q2_COMPRESSED,
};

/* The geometry every decoder needs. */
struct q2_geom {
	unsigned cluster_bits;
	bool ext_l2;
	bool v3;
	uint64_t file_size;            /* host offsets past it are corrupt */
};

/* Check an L1 entry: 0, or -EIO (err set) when it is unaligned, has
 * reserved bits or points into the header or past the file. */
int ioc__qcow2_check_l1e(const struct q2_geom *g, uint64_t l1e, char *err, size_t errlen);

/* The status of subcluster sc (0 without extended L2) of an entry and
 * bitmap: kind, and for Q2_DATA the host offset of the subcluster's
 * cluster.  -EIO (err set) for an entry no qcow2 writer makes. */
int ioc__qcow2_decode_l2e(const struct q2_geom *g, uint64_t l2e, uint64_t bitmap,
			  unsigned sc, enum q2_kind *kind, uint64_t *host, char *err,
			  size_t errlen);

/* A compressed descriptor: where its bytes start and how many there are
 * (at most two clusters' worth, checked). */
int ioc__qcow2_compressed_extent(const struct q2_geom *g, uint64_t l2e, uint64_t *off,
				 uint64_t *len, char *err, size_t errlen);

/* Decode a compressed cluster: in[0..inlen) into out[0..outlen), which it
 * must fill exactly.  0 or -EIO. */
int ioc__qcow2_decompress(enum q2_compression type, const uint8_t *in, size_t inlen,
			  uint8_t *out, size_t outlen);


/* Refcount entry i of a refcount block (order 0..6). */
uint64_t ioc__qcow2_rc_get(const uint8_t *blk, unsigned order, uint64_t i);
void ioc__qcow2_rc_set(uint8_t *blk, unsigned order, uint64_t i, uint64_t v);

/* ---- the L2 slice cache (qcow2-cache.c) -------------------------------- */

/*
 * A slice is l2-cache-entry-size bytes of one L2 table, big-endian as on
 * disk.  Slots never move or go away while the node is open, so a reader
 * can pin one found through the directory without a lock: see
 * qcow2-cache.c for the protocol.
 */
struct q2_slice {
	_Atomic uint32_t pins;         /* readers holding it; Q2_SLICE_BUSY while refilled */
	_Atomic uint64_t key;          /* host offset of the slice; 0: empty */
	uint64_t *data;                /* words; loaded/stored with __atomic */
	uint32_t dir;                  /* directory index while keyed */
	bool dirty;                    /* lock held */
	_Atomic uint64_t used;         /* last use, in cache ticks */
};

struct q2_cache {
	struct q2_slice *slots;
	unsigned nslots;
	size_t slice_bytes;
	_Atomic(struct q2_slice *) *dir;   /* by l1 index * slices_per_table + slice */
	size_t ndir;
	_Atomic uint64_t tick;
	uint64_t last_clean_ns;
	uint64_t clean_epoch;          /* the tick of the last clean pass */
	uint64_t clean_interval_ns;    /* 0: never */
	uint64_t hits, misses;         /* statistics (relaxed, approximate) */
};

int ioc__qcow2_cache_init(struct q2_cache *c, unsigned nslots, size_t slice_bytes,
			  size_t ndir);
void ioc__qcow2_cache_destroy(struct q2_cache *c);
/* Without the lock: the slice at dir index d when it holds key, pinned;
 * NULL when it must be loaded. */
struct q2_slice *ioc__qcow2_cache_lookup(struct q2_cache *c, size_t d, uint64_t key);
void ioc__qcow2_cache_unpin(struct q2_slice *s);
/* Lock held: a free slot for (d, key), pinned and out of the directory
 * (Q2_SLICE_BUSY) for the caller to fill and publish.  NULL when only
 * dirty slots could be taken: the caller writes them back and retries. */
struct q2_slice *ioc__qcow2_cache_claim(struct q2_cache *c);
/* Lock held: give back a claimed slot unfilled (a failed read). */
void ioc__qcow2_cache_abandon(struct q2_slice *s);
/* Lock held: publish a claimed, filled slot under (d, key), still pinned
 * once for the caller. */
void ioc__qcow2_cache_publish(struct q2_cache *c, struct q2_slice *s, size_t d,
			      uint64_t key);
/* Lock held: drop whatever slice the directory has at d (its table moved). */
void ioc__qcow2_cache_forget(struct q2_cache *c, size_t d);
/* Lock held: free the buffers of clean slices unused for the interval. */
void ioc__qcow2_cache_clean(struct q2_cache *c, uint64_t now_ns, bool all);

/* ---- the driver's state (qcow2.c, qcow2-refcount.c) -------------------- */

struct ioc_node;
struct q2_alloc;

#define Q2_SHARDS 16

struct q2_state {
	struct ioc_node *node, *file, *backing;
	struct q2_header h;
	struct q2_geom geom;           /* file_size kept in file_size below */
	_Atomic uint64_t file_size;    /* the file child's size; grows under lock */
	unsigned cluster_bits;
	uint64_t cs;
	unsigned l2_bits;              /* log2 of entries per L2 table */
	unsigned words;                /* 64-bit words per L2 entry: 1, or 2 */
	unsigned slice_bits;           /* log2 of entries per slice */
	unsigned sub_bits;             /* log2 of the allocation unit (subcluster) */
	unsigned nsub;                 /* subclusters per cluster: 32, or 1 */
	bool rw, lazy, pass_discard, marked_dirty;
	bool failed;                   /* metadata write failed: refuse writes */

	/* The active L1 table, host-endian.  Readers load entries without
	 * the lock (relaxed: an entry is published after the table it
	 * points to is in the cache or on disk, see l2_prepare()). */
	_Atomic uint64_t *l1;
	uint32_t l1_size;
	uint64_t l1_off;

	/* Refcounts: the table, and the blocks read so far (lock held). */
	uint64_t *rt;
	uint64_t rt_entries;
	uint32_t rt_clusters;
	uint64_t rt_off;
	uint8_t **rb;
	bool *rb_dirty;
	unsigned rb_bits;              /* log2 of refcounts per block */
	uint64_t rc_max;
	uint64_t free_hint;            /* no free cluster below it */
	uint64_t *pending;             /* clusters to decrement at writeback */
	size_t npending, cap_pending;
	uint64_t *grace;               /* dropped, on disk; waiting for readers */
	size_t ngrace;
	unsigned grace_parity;         /* the in-flight counters they wait for */

	/* Lockless requests in flight, by epoch parity and shard (qcow2.c,
	 * "In-flight requests"). */
	_Atomic unsigned epoch;
	struct q2_inflight {
		_Atomic long n;
	} IOC_CACHE_ALIGNED inflight[2][Q2_SHARDS];

	struct q2_cache cache;
	struct ioc_co_mutex lock;      /* metadata changes and cache misses */
	struct q2_alloc *allocs;       /* allocating writes in flight (lock held) */

	/* cache-clean-interval: a timer on the loop that opened the node
	 * (the main thread's, which closes it too). */
	struct ioc_timer clean_timer;
	struct ioc_loop *clean_loop;   /* NULL: no timer */
	bool cleaning;                 /* a clean coroutine runs (that loop only) */
	uint64_t cleaned;              /* passes that ran (tests) */
	struct q2_bitmaps *bitmaps;    /* qcow2-bitmap.c */
};

/* The L2 cache's slices now in memory (tests and statistics). */
size_t ioc__qcow2_cache_resident(struct ioc_node *n);
uint64_t ioc__qcow2_clean_passes(struct ioc_node *n);

/* In-flight requests: whether none that entered under parity p is left;
 * a new epoch (returns the parity requests entered under until now). */
bool ioc__qcow2_drained(struct q2_state *q, unsigned p);
unsigned ioc__qcow2_flip(struct q2_state *q);

/* Child I/O (coroutine). */
int ioc__qcow2_pread(struct q2_state *q, uint64_t off, void *buf, size_t len);
int ioc__qcow2_pwrite(struct q2_state *q, uint64_t off, const void *buf, size_t len);
int ioc__qcow2_flush_file(struct q2_state *q);
/* Write v as the header's 64-bit field at off (Q2_OFF_INCOMPAT,
 * Q2_OFF_AUTOCLEAR) and flush it; *field (its copy in q->h) becomes v
 * only once that succeeded. */
int ioc__qcow2_header_put64(struct q2_state *q, uint64_t off, uint64_t *field, uint64_t v);

/* qcow2-refcount.c, lock held. */
int ioc__qcow2_rc_get_cluster(struct q2_state *q, uint64_t cluster, uint64_t *rc);
int ioc__qcow2_alloc_cluster(struct q2_state *q, uint64_t *host);
/* Queue the clusters [off, off+len) touch for a decrement at the next
 * writeback, after the L2 entries that dropped them are on disk. */
int ioc__qcow2_defer_free(struct q2_state *q, uint64_t off, uint64_t len);
/* Write dirty refcount blocks, then dirty L2 slices, with flushes between
 * (crash ordering: qcow2.c), then apply deferred frees.  flush: end with
 * everything durable (a guest flush). */
int ioc__qcow2_writeback(struct q2_state *q, bool flush);
/* Write the dirty refcount blocks (then flush the file, if asked). */
int ioc__qcow2_write_refblocks(struct q2_state *q, bool flush);
void ioc__qcow2_refcount_free(struct q2_state *q);
int ioc__qcow2_refcount_init(struct q2_state *q, char *err, size_t errlen);

/* qcow2-check.c, at open (after the L1 and refcount tables are read):
 * count the refcounts of a dirty image again from its metadata, write
 * them, clear the dirty bit.  0, or -errno with err naming the fault. */
int ioc__qcow2_repair(struct q2_state *q, char *err, size_t errlen);

/* qcow2.c: run fn(arg) in a coroutine to its end, from the main thread. */
int ioc__qcow2_run_sync(struct ioc_node *n, void (*fn)(void *), void *arg);

/* qcow2-bitmap.c: the node's dirty bitmaps and the bitmaps extension.
 * open: in open's coroutine, after the refcounts, before any guest write
 * (loads the directory; read-write: marks the bitmaps in use, durably).
 * close: in close's coroutine before the last writeback (a clean stop
 * writes them back).  free: with the driver's state.  resize: the
 * set follows a resize, refused (-EBUSY) while it has bitmaps. */
int ioc__qcow2_bitmaps_open(struct q2_state *q, char *err, size_t errlen);
int ioc__qcow2_bitmaps_close(struct q2_state *q);
void ioc__qcow2_bitmaps_free(struct q2_state *q);
int ioc__qcow2_bitmaps_resize(struct q2_state *q, uint64_t size);
/* The image's directory as query-named-block-nodes' format-specific
 * "bitmaps" (QEMU's Qcow2BitmapInfo: name, granularity, flags), added to
 * data when there is one. */
struct json_t;
void ioc__qcow2_bitmaps_info(struct q2_state *q, struct json_t *data);

#endif /* IOC_NODE_QCOW2_H */
