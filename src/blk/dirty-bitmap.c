/*
 * Dirty bitmaps: which granules of an image changed since a point in time,
 * for incremental backup (the NBD meta context qemu:dirty-bitmap:NAME).
 *
 * Marking: every write, write-zeroes and discard (failed ones too) sets its
 * granules' bits in the recording bitmaps ("Sets"), one fetch_or per word,
 * before it completes: no lock; no bitmap recording, one relaxed load.
 *
 * Ordering: a copier clears (ioc_blk_dirty_reset(), acq_rel fetch_and),
 * then reads; a writer marks (acq_rel fetch_or) once its data reached the
 * image, before acknowledging.  In the word's modification order the mark
 * follows the clear (the bit stays) or precedes it (the clear's acquire
 * reads its release: the copier reads the new data).  Marking first would
 * lose it (mark, clear, read old, land): test-blk-dirty checks both orders.
 *
 * Persistence: a sidecar IMAGE.NAME.iocbm, a 4 KiB header (hdr_encode())
 * then the words, IN_USE while we run.  So that kill -9 loses nothing,
 * before a write, write-zeroes or discard is issued its granules not yet
 * in ondisk[] (bits known durable) go to the sidecar, are fdatasynced,
 * then join ondisk[] (ioc__blk_dirty_prepare(); writers queue on the
 * bitmap's lock, one whose bits the writer ahead wrote does no I/O).  On
 * disk bits only go 0 -> 1, except in clear, which resets ondisk[] before
 * the words (a release: a mark that sees the cleared word persists
 * again).  A clean close writes the words, fdatasyncs, then a header
 * without IN_USE with their crc.  So an IN_USE sidecar marks every write
 * that may have reached the image, save one that raced a clear as the
 * process died; after a power loss too, if fdatasync holds.  A bad
 * header, crc or size loads inconsistent.  Cost: a granule's first write
 * waits for a sidecar fdatasync.  A store (a null-driver image holding,
 * e.g., a qcow2 node's bitmaps, marked via ioc_blk_dirty_mark()) has no
 * sidecar (ondisk[] NULL): told of adds and removes, it reads the bits out
 * at its clean close.
 *
 * Removal: markers read pointers unlocked, so a removed bitmap waits on a
 * retired list until close.  Rejected: a reader count or rwlock (a line
 * every I/O thread writes per write); epochs (the block layer does not
 * know its threads); a fixed array (it capped the count, and markers
 * walked disabled bitmaps).  Limits, QEMU's: 65535 bitmaps, names of
 * 1..1023 bytes (a sidecar's: 1..127 of [A-Za-z0-9_.-]), 512 B..2 GiB.
 */
#include <assert.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "blk-int.h"
#include "util/endian.h"

#define HDR_SIZE      4096u
#define HDR_CRC_OFF   176u
#define PAGE_WORDS    (4096u / 8)
#define SIDECAR_SUFFIX ".iocbm"
static const char magic[8] = { 'I', 'O', 'C', 'D', 'B', 'M', 'A', 'P' };

struct ioc_blk_dirty {
	struct ioc_blk *blk;
	char *name;
	unsigned shift;            /* log2(granularity) */
	uint64_t size;             /* image size it was made for */
	uint64_t nbits, nwords;
	_Atomic uint64_t *words;
	_Atomic uint64_t *ondisk;  /* sidecar: bits known durable (NULL: none) */
	_Atomic bool recording;
	bool persistent, inconsistent;
	uint64_t seq;              /* creation order, for listing */
	int fd;                    /* sidecar, or -1 */
	char *sidecar;
	pthread_mutex_t lock;      /* serialises sidecar writes */
	struct ioc_blk_dirty *retired_next;
};

static uint64_t gran_of(const struct ioc_blk_dirty *bm)
{
	return UINT64_C(1) << bm->shift;
}

static bool name_ok(const char *name, bool persistent)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0 || n >= IOC_BLK_DIRTY_NAME_MAX)
		return false;
	if (!persistent)
		return true;
	if (n >= IOC_BLK_DIRTY_SIDECAR_NAME_MAX)
		return false;
	if (name[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
			return false;
	}
	return true;
}

static int gran_shift(uint64_t gran)
{
	if (gran < IOC_BLK_DIRTY_GRAN_MIN || gran > IOC_BLK_DIRTY_GRAN_MAX ||
	    (gran & (gran - 1)))
		return -EINVAL;
	return __builtin_ctzll(gran);
}

/* ---- the sidecar ----------------------------------------------------- */





static void hdr_encode(const struct ioc_blk_dirty *bm, uint32_t flags,
		       uint32_t bits_crc, uint8_t *h)
{
	size_t nlen = strlen(bm->name);

	memset(h, 0, HDR_SIZE);
	memcpy(h, magic, 8);
	ioc__put_le32(h + 8, 1);
	ioc__put_le32(h + 12, flags);
	ioc__put_le64(h + 16, bm->size);
	ioc__put_le64(h + 24, gran_of(bm));
	ioc__put_le64(h + 32, bm->nwords);
	ioc__put_le32(h + 40, bits_crc);
	ioc__put_le32(h + 44, (uint32_t)nlen);
	memcpy(h + 48, bm->name, nlen);
	ioc__put_le32(h + HDR_CRC_OFF, (uint32_t)crc32(0, h, HDR_CRC_OFF));
}

int ioc__blk_dirty_parse(const void *buf, size_t len, uint64_t image_size,
			 const char *name, uint64_t *gran, uint32_t *flags,
			 const uint8_t **words)
{
	const uint8_t *h = buf;
	uint64_t g, nwords, nbits;
	uint32_t nlen;
	int shift;

	*gran = 0;
	*flags = 0;
	*words = NULL;
	if (len < HDR_SIZE || memcmp(h, magic, 8) != 0)
		return -EUCLEAN;
	if (ioc__get_le32(h + HDR_CRC_OFF) != (uint32_t)crc32(0, h, HDR_CRC_OFF))
		return -EUCLEAN;
	if (ioc__get_le32(h + 8) != 1)
		return -EUCLEAN;
	g = ioc__get_le64(h + 24);
	shift = gran_shift(g);
	if (shift < 0)
		return -EUCLEAN;
	*gran = g;
	*flags = ioc__get_le32(h + 12);
	nlen = ioc__get_le32(h + 44);
	if (nlen == 0 || nlen >= IOC_BLK_DIRTY_SIDECAR_NAME_MAX || strlen(name) != nlen ||
	    memcmp(h + 48, name, nlen) != 0)
		return -EUCLEAN;
	if (ioc__get_le64(h + 16) != image_size)
		return -EUCLEAN;
	nbits = (image_size + g - 1) >> shift;
	nwords = ioc__get_le64(h + 32);
	if (nwords != (nbits + 63) / 64 || (len - HDR_SIZE) / 8 != nwords ||
	    (len - HDR_SIZE) % 8)
		return -EUCLEAN;
	if (!(*flags & IOC__DIRTY_F_IN_USE) &&
	    ioc__get_le32(h + 40) != (uint32_t)crc32(0, h + HDR_SIZE, (uInt)(nwords * 8)))
		return -EUCLEAN;
	/* Bits past the end would be marks of nothing: refuse them. */
	if (nbits % 64 && nwords &&
	    ioc__get_le64(h + HDR_SIZE + (nwords - 1) * 8) >> (nbits % 64))
		return -EUCLEAN;
	*words = h + HDR_SIZE;
	return 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

static int write_header(struct ioc_blk_dirty *bm, uint32_t flags, uint32_t crc)
{
	uint8_t h[HDR_SIZE];
	int ret;

	hdr_encode(bm, flags, crc, h);
	ret = pwrite_all(bm->fd, h, HDR_SIZE, 0);
	if (ret == 0 && fdatasync(bm->fd) < 0)
		ret = -errno;
	return ret;
}

static uint32_t run_flags(const struct ioc_blk_dirty *bm, bool in_use)
{
	uint32_t f = in_use ? IOC__DIRTY_F_IN_USE : 0;

	if (!atomic_load_explicit(&bm->recording, memory_order_relaxed))
		f |= IOC__DIRTY_F_DISABLED;
	return f;
}

/* The bits of granules [first, last] that fall in word w. */
static uint64_t word_mask(uint64_t w, uint64_t first, uint64_t last)
{
	unsigned lo = w == first / 64 ? first % 64 : 0;
	unsigned hi = w == last / 64 ? last % 64 : 63;

	return (hi == 63 ? ~UINT64_C(0) : (UINT64_C(1) << (hi + 1)) - 1) &
		~((UINT64_C(1) << lo) - 1);
}

/*
 * Write words [w0, w1] (whole sidecar pages around them), with the bits of
 * granules [first, last] set in addition when extra (a write about to be
 * issued), and fdatasync, then record what was written in ondisk[].
 * Caller holds bm->lock.  The relaxed loads of the words may miss a mark
 * racing with us; that marker finds its bit missing from ondisk[] and
 * comes here after us.
 */
static int persist_locked(struct ioc_blk_dirty *bm, uint64_t w0, uint64_t w1,
			  bool extra, uint64_t first, uint64_t last)
{
	uint64_t p0 = w0 / PAGE_WORDS * PAGE_WORDS;
	uint64_t p1 = w1 / PAGE_WORDS * PAGE_WORDS + PAGE_WORDS;
	uint64_t n, *snap;
	int ret;

	if (p1 > bm->nwords)
		p1 = bm->nwords;
	n = p1 - p0;
	snap = malloc(n * 8);
	if (!snap)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		snap[i] = atomic_load_explicit(&bm->words[p0 + i], memory_order_relaxed);
		if (extra && p0 + i >= first / 64 && p0 + i <= last / 64)
			snap[i] |= word_mask(p0 + i, first, last);
	}
	for (uint64_t i = 0; i < n; i++)
		snap[i] = htole64(snap[i]);
	ret = pwrite_all(bm->fd, snap, n * 8, (off_t)(HDR_SIZE + p0 * 8));
	if (ret == 0 && fdatasync(bm->fd) < 0)
		ret = -errno;
	if (ret == 0) {
		/* Release: pairs with the acquire loads in mark_one() and
		 * ioc__blk_dirty_prepare(); one that sees the bit may go on,
		 * and the bit is durable. */
		for (uint64_t i = 0; i < n; i++)
			atomic_fetch_or_explicit(&bm->ondisk[p0 + i], le64toh(snap[i]),
						 memory_order_release);
	}
	free(snap);
	return ret;
}

static int persist_range(struct ioc_blk_dirty *bm, uint64_t w0, uint64_t w1)
{
	int ret = 0;
	bool need = false;

	pthread_mutex_lock(&bm->lock);
	/* Batching: the writer ahead of us may have written our bits. */
	for (uint64_t w = w0; w <= w1 && !need; w++)
		need = atomic_load_explicit(&bm->words[w], memory_order_relaxed) &
			~atomic_load_explicit(&bm->ondisk[w], memory_order_relaxed);
	if (need && bm->fd >= 0)
		ret = persist_locked(bm, w0, w1, false, 0, 0);
	pthread_mutex_unlock(&bm->lock);
	return ret;
}

/* Write-ahead: granules [first, last] durable before the write is issued. */
static int persist_ahead(struct ioc_blk_dirty *bm, uint64_t first, uint64_t last)
{
	uint64_t w0 = first / 64, w1 = last / 64;
	bool need = false;
	int ret = 0;

	pthread_mutex_lock(&bm->lock);
	for (uint64_t w = w0; w <= w1 && !need; w++) {
		uint64_t mask = word_mask(w, first, last);

		need = (atomic_load_explicit(&bm->ondisk[w], memory_order_relaxed) & mask) != mask;
	}
	/* A bitmap removed meanwhile (fd closed) marks nothing. */
	if (need && bm->fd >= 0)
		ret = persist_locked(bm, w0, w1, true, first, last);
	pthread_mutex_unlock(&bm->lock);
	return ret;
}

/* ---- sets ------------------------------------------------------------- */

/*
 * A vector of slots that the control thread changes under readers that
 * take no lock.  A bitmap keeps its slot for as long as it is in a
 * vector, so a reader walking [0, n) never misses one that was there
 * all along; a slot is filled (release) before n covers it (release), and
 * emptied by a plain store once the bitmap stops recording, so a reader
 * that still finds it marks nothing.  A vector is never changed once
 * replaced: growing past its capacity, or compacting once most slots are
 * empty, or emptying it, builds a new one (or none), publishes it
 * (release) and retires the old until close: a few words per change, next
 * to the removed bitmap that waits there too.  A walk costs the slots in
 * use, within four times the bitmaps it holds.
 */
struct blk_dirty_vec {
	struct blk_dirty_vec *retired_next;
	unsigned cap;
	_Atomic unsigned n;                       /* slots [0, n) may be set */
	_Atomic(struct ioc_blk_dirty *) slot[];
};

static unsigned vec_len(struct blk_dirty_vec *v)
{
	/* Acquire: pairs with the release store of n in vec_add(); the
	 * slots below it are filled. */
	return atomic_load_explicit(&v->n, memory_order_acquire);
}

static struct ioc_blk_dirty *vec_at(struct blk_dirty_vec *v, unsigned i)
{
	/* Acquire: pairs with the release store of the slot in vec_add() and
	 * vec_publish(); a reader that sees the pointer sees the bitmap
	 * initialised. */
	return atomic_load_explicit(&v->slot[i], memory_order_acquire);
}

static void vec_retire(struct ioc_blk *blk, struct blk_dirty_vec *v)
{
	if (v) {
		v->retired_next = blk->dirty_vec_retired;
		blk->dirty_vec_retired = v;
	}
}

/* A new vector holding v's bitmaps packed, with room for cap. */
static struct blk_dirty_vec *vec_copy(struct blk_dirty_vec *v, unsigned cap)
{
	struct blk_dirty_vec *nv = calloc(1, sizeof(*nv) + (size_t)cap * sizeof(nv->slot[0]));
	unsigned k = 0;

	if (!nv)
		return NULL;
	nv->cap = cap;
	for (unsigned i = 0; v && i < atomic_load_explicit(&v->n, memory_order_relaxed); i++) {
		struct ioc_blk_dirty *bm = atomic_load_explicit(&v->slot[i], memory_order_relaxed);

		if (bm)
			atomic_init(&nv->slot[k++], bm);
	}
	atomic_init(&nv->n, k);
	return nv;
}

static void vec_publish(struct ioc_blk *blk, struct blk_dirty_vec *_Atomic *pv,
			struct blk_dirty_vec *nv)
{
	struct blk_dirty_vec *old = atomic_load_explicit(pv, memory_order_relaxed);

	/* Release: pairs with the acquire loads of the vector in
	 * ioc__blk_dirty_mark(), _prepare(), and the lookups; a reader that
	 * sees the new vector sees its slots. */
	atomic_store_explicit(pv, nv, memory_order_release);
	vec_retire(blk, old);
}

static unsigned vec_live(struct blk_dirty_vec *v)
{
	unsigned k = 0;

	for (unsigned i = 0; v && i < atomic_load_explicit(&v->n, memory_order_relaxed); i++)
		k += atomic_load_explicit(&v->slot[i], memory_order_relaxed) != NULL;
	return k;
}

/* Room for one more bitmap in *pv without allocating: 0 or -ENOMEM. */
static int vec_reserve(struct ioc_blk *blk, struct blk_dirty_vec *_Atomic *pv)
{
	struct blk_dirty_vec *v = atomic_load_explicit(pv, memory_order_relaxed), *nv;
	unsigned live = vec_live(v);

	if (v && (live < atomic_load_explicit(&v->n, memory_order_relaxed) ||
		  atomic_load_explicit(&v->n, memory_order_relaxed) < v->cap))
		return 0;
	nv = vec_copy(v, live < 4 ? 8 : live * 2);
	if (!nv)
		return -ENOMEM;
	vec_publish(blk, pv, nv);
	return 0;
}

/* After vec_reserve(): the lowest empty slot, else one past n. */
static void vec_add(struct blk_dirty_vec *_Atomic *pv, struct ioc_blk_dirty *bm)
{
	struct blk_dirty_vec *v = atomic_load_explicit(pv, memory_order_relaxed);
	unsigned n = atomic_load_explicit(&v->n, memory_order_relaxed), i;

	for (i = 0; i < n && atomic_load_explicit(&v->slot[i], memory_order_relaxed); i++)
		;
	/* Release: pairs with vec_at()'s acquire. */
	atomic_store_explicit(&v->slot[i], bm, memory_order_release);
	if (i == n)
		/* Release: pairs with vec_len()'s acquire. */
		atomic_store_explicit(&v->n, n + 1, memory_order_release);
}

/* Take bm out of *pv (nothing if it is not there).  The caller stopped it
 * recording first, or it is out of every walk that matters. */
static void vec_del(struct ioc_blk *blk, struct blk_dirty_vec *_Atomic *pv,
		    struct ioc_blk_dirty *bm)
{
	struct blk_dirty_vec *v = atomic_load_explicit(pv, memory_order_relaxed), *nv;
	unsigned n = v ? atomic_load_explicit(&v->n, memory_order_relaxed) : 0, live;

	for (unsigned i = 0; i < n; i++) {
		if (atomic_load_explicit(&v->slot[i], memory_order_relaxed) != bm)
			continue;
		/* Relaxed: a reader that still loads bm finds it not
		 * recording, or marks a bitmap that was, harmlessly. */
		atomic_store_explicit(&v->slot[i], NULL, memory_order_relaxed);
		break;
	}
	while (n && !atomic_load_explicit(&v->slot[n - 1], memory_order_relaxed))
		n--;
	if (v)
		/* Relaxed: only empty slots leave the walk. */
		atomic_store_explicit(&v->n, n, memory_order_relaxed);
	live = vec_live(v);
	if (v && live == 0) {
		vec_publish(blk, pv, NULL);     /* markers' fast path again */
	} else if (v && n > 16 && live * 4 < n) {
		nv = vec_copy(v, live * 2);
		if (nv)                         /* else it stays sparse */
			vec_publish(blk, pv, nv);
	}
}

/* ---- marking --------------------------------------------------------- */

static int mark_one(struct ioc_blk_dirty *bm, uint64_t offset, uint64_t len)
{
	uint64_t first = offset >> bm->shift, last, w0, w1;
	bool need = false;

	if (!len || first >= bm->nbits)
		return 0;
	last = (offset + len - 1) >> bm->shift;
	if (last >= bm->nbits)
		last = bm->nbits - 1;
	w0 = first / 64;
	w1 = last / 64;
	for (uint64_t w = w0; w <= w1; w++) {
		uint64_t mask = word_mask(w, first, last);

		/* acq_rel: release pairs with the copier's acquire in
		 * ioc_blk_dirty_reset() (the ordering rule above); acquire
		 * pairs with clear_words()' release, so the ondisk[] load
		 * below sees clear's reset. */
		atomic_fetch_or_explicit(&bm->words[w], mask, memory_order_acq_rel);
		if (bm->ondisk &&
		    (atomic_load_explicit(&bm->ondisk[w], memory_order_acquire) & mask) != mask)
			need = true;
	}
	return need ? persist_range(bm, w0, w1) : 0;
}

int ioc__blk_dirty_mark(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	/* Acquire: pairs with the release stores of vec_publish(). */
	struct blk_dirty_vec *v = atomic_load_explicit(&blk->dirty_rec, memory_order_acquire);
	unsigned n = v ? vec_len(v) : 0;
	int ret = 0;

	for (unsigned i = 0; i < n; i++) {
		struct ioc_blk_dirty *bm = vec_at(v, i);
		int r;

		if (!bm || !atomic_load_explicit(&bm->recording, memory_order_relaxed))
			continue;
		r = mark_one(bm, offset, len);
		if (r < 0)
			ret = r;
	}
	return ret;
}

int ioc__blk_dirty_prepare(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	/* Acquire: pairs with the release stores of vec_publish(). */
	struct blk_dirty_vec *v = atomic_load_explicit(&blk->dirty_rec, memory_order_acquire);
	unsigned n = v ? vec_len(v) : 0;
	int ret = 0;

	for (unsigned i = 0; i < n && len; i++) {
		struct ioc_blk_dirty *bm = vec_at(v, i);
		uint64_t first, last;
		bool need = false;
		int r;

		if (!bm || !bm->ondisk ||
		    !atomic_load_explicit(&bm->recording, memory_order_relaxed))
			continue;
		first = offset >> bm->shift;
		if (first >= bm->nbits)
			continue;
		last = (offset + len - 1) >> bm->shift;
		if (last >= bm->nbits)
			last = bm->nbits - 1;
		for (uint64_t w = first / 64; w <= last / 64 && !need; w++) {
			uint64_t mask = word_mask(w, first, last);

			/* Acquire: pairs with persist_locked()'s release. */
			need = (atomic_load_explicit(&bm->ondisk[w], memory_order_acquire) &
				mask) != mask;
		}
		if (!need)
			continue;
		r = persist_ahead(bm, first, last);
		if (r < 0)
			ret = r;
	}
	return ret;
}

/* ---- creation and removal --------------------------------------------- */

static char *sidecar_path(const char *image, const char *name)
{
	char *p;

	if (asprintf(&p, "%s.%s%s", image, name, SIDECAR_SUFFIX) < 0)
		return NULL;
	return p;
}

static void bm_free(struct ioc_blk_dirty *bm)
{
	if (!bm)
		return;
	if (bm->fd >= 0)
		close(bm->fd);
	free(bm->sidecar);
	free(bm->name);
	free(bm->words);
	free(bm->ondisk);
	pthread_mutex_destroy(&bm->lock);
	free(bm);
}

/* sidecar: persistent in a sidecar file, with write-ahead (ondisk[]). */
static struct ioc_blk_dirty *bm_alloc(struct ioc_blk *blk, const char *name,
				      unsigned shift, bool persistent, bool sidecar)
{
	struct ioc_blk_dirty *bm = calloc(1, sizeof(*bm));

	if (!bm)
		return NULL;
	bm->blk = blk;
	bm->fd = -1;
	pthread_mutex_init(&bm->lock, NULL);
	bm->name = strdup(name);
	if (!bm->name) {
		bm_free(bm);
		return NULL;
	}
	bm->shift = shift;
	bm->size = blk_size(blk);
	bm->nbits = (bm->size + (UINT64_C(1) << shift) - 1) >> shift;
	bm->nwords = (bm->nbits + 63) / 64;
	bm->persistent = persistent;
	bm->words = calloc(bm->nwords ? bm->nwords : 1, 8);
	if (sidecar)
		bm->ondisk = calloc(bm->nwords ? bm->nwords : 1, 8);
	if (!bm->words || (sidecar && !bm->ondisk)) {
		bm_free(bm);
		return NULL;
	}
	return bm;
}

/* Room for one more bitmap (recording: in the markers' set too): 0,
 * -ENOSPC or -ENOMEM. */
static int reserve(struct ioc_blk *blk, bool recording)
{
	int ret;

	if (blk->dirty_count >= IOC_BLK_DIRTY_MAX)
		return -ENOSPC;
	ret = vec_reserve(blk, &blk->dirty_all);
	return ret || !recording ? ret : vec_reserve(blk, &blk->dirty_rec);
}

/* After reserve(): into the sets (vec_add()'s release stores publish it). */
static void publish(struct ioc_blk *blk, struct ioc_blk_dirty *bm)
{
	bm->seq = ++blk->dirty_seq;
	vec_add(&blk->dirty_all, bm);
	blk->dirty_count++;
	if (atomic_load_explicit(&bm->recording, memory_order_relaxed))
		vec_add(&blk->dirty_rec, bm);
	else if (atomic_load_explicit(&blk->dirty_rec, memory_order_relaxed) &&
		 !vec_live(atomic_load_explicit(&blk->dirty_rec, memory_order_relaxed)))
		vec_publish(blk, &blk->dirty_rec, NULL);  /* reserved for nothing */
}

static int fsync_dir_of(const char *path)
{
	char *copy = strdup(path);
	int fd, ret = 0;

	if (!copy)
		return -ENOMEM;
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(copy);
	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

int ioc_blk_dirty_add(struct ioc_blk *blk, const struct ioc_blk_dirty_opts *o,
		      struct ioc_blk_dirty **out)
{
	uint64_t gran = o->granularity ? o->granularity : IOC_BLK_DIRTY_GRAN_DEFAULT;
	int shift = gran_shift(gran), ret;
	struct ioc_blk_dirty *bm;

	if (out)
		*out = NULL;
	/* A store takes any name; a sidecar's name is part of a file name. */
	if (shift < 0 || !name_ok(o->name, o->persistent && !blk->dirty_store))
		return -EINVAL;
	if (ioc_blk_dirty_find(blk, o->name))
		return -EEXIST;
	if (o->persistent && !blk->path && !blk->dirty_store)
		return -ENOTSUP;
	ret = reserve(blk, !o->disabled && !o->inconsistent);
	if (ret < 0)
		return ret;
	bm = bm_alloc(blk, o->name, (unsigned)shift, o->persistent,
		      o->persistent && !blk->dirty_store);
	if (!bm)
		return -ENOMEM;
	atomic_init(&bm->recording, !o->disabled && !o->inconsistent);
	bm->inconsistent = o->inconsistent;
	if (o->persistent && blk->dirty_store) {
		struct ioc_blk_dirty_info info;

		ioc_blk_dirty_get_info(bm, &info);
		ret = blk->dirty_store->add(blk->dirty_store_opaque, &info);
		if (ret < 0) {
			bm_free(bm);
			return ret;
		}
	} else if (o->persistent) {
		bm->sidecar = sidecar_path(blk->path, o->name);
		if (!bm->sidecar) {
			ret = -ENOMEM;
			goto fail;
		}
		bm->fd = open(bm->sidecar, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (bm->fd < 0) {
			ret = -errno;
			goto fail;
		}
		if (ftruncate(bm->fd, (off_t)(HDR_SIZE + bm->nwords * 8)) < 0) {
			ret = -errno;
			goto fail;
		}
		ret = write_header(bm, run_flags(bm, true), 0);
		if (ret == 0)
			ret = fsync_dir_of(bm->sidecar);
		if (ret < 0)
			goto fail;
	}
	publish(blk, bm);
	if (out)
		*out = bm;
	return 0;
fail:
	if (bm->fd >= 0)
		unlink(bm->sidecar);
	bm_free(bm);
	return ret;
}

struct ioc_blk_dirty *ioc_blk_dirty_find(struct ioc_blk *blk, const char *name)
{
	/* Acquire: pairs with vec_publish(); I/O threads look bitmaps up for
	 * NBD block status while the control thread adds them.  O(bitmaps). */
	struct blk_dirty_vec *v = atomic_load_explicit(&blk->dirty_all, memory_order_acquire);
	unsigned n = v ? vec_len(v) : 0;

	for (unsigned i = 0; i < n; i++) {
		struct ioc_blk_dirty *bm = vec_at(v, i);

		if (bm && strcmp(bm->name, name) == 0)
			return bm;
	}
	return NULL;
}

int ioc_blk_dirty_remove(struct ioc_blk *blk, const char *name)
{
	struct ioc_blk_dirty *bm = ioc_blk_dirty_find(blk, name);

	if (!bm)
		return -ENOENT;
	if (bm->persistent && blk->dirty_store) {
		int ret = blk->dirty_store->remove(blk->dirty_store_opaque, name);

		if (ret < 0)
			return ret;
	}
	/* Stop recording first: a marker still holding the pointer then
	 * marks nothing, and never waits on the sidecar. */
	atomic_store_explicit(&bm->recording, false, memory_order_relaxed);
	vec_del(blk, &blk->dirty_rec, bm);
	vec_del(blk, &blk->dirty_all, bm);
	blk->dirty_count--;
	pthread_mutex_lock(&bm->lock);
	if (bm->fd >= 0) {
		close(bm->fd);
		bm->fd = -1;
	}
	pthread_mutex_unlock(&bm->lock);
	if (bm->sidecar)
		unlink(bm->sidecar);
	bm->retired_next = blk->dirty_retired;
	blk->dirty_retired = bm;
	return 0;
}

/* ---- management -------------------------------------------------------- */

int ioc_blk_dirty_clear(struct ioc_blk_dirty *bm)
{
	int ret = 0;

	if (bm->inconsistent)
		return -EUCLEAN;
	pthread_mutex_lock(&bm->lock);
	for (uint64_t w = 0; w < bm->nwords; w++) {
		if (bm->ondisk)
			atomic_store_explicit(&bm->ondisk[w], 0, memory_order_relaxed);
		/* Release: orders the ondisk[] reset before the cleared
		 * word; pairs with mark_one()'s acq_rel fetch_or. */
		atomic_exchange_explicit(&bm->words[w], 0, memory_order_acq_rel);
	}
	if (bm->persistent && bm->nwords && bm->fd >= 0)
		ret = persist_locked(bm, 0, bm->nwords - 1, false, 0, 0);
	pthread_mutex_unlock(&bm->lock);
	return ret;
}

int ioc_blk_dirty_set_recording(struct ioc_blk_dirty *bm, bool on)
{
	struct ioc_blk *blk = bm->blk;
	int ret = 0;

	if (bm->inconsistent)
		return -EUCLEAN;
	if (on && !atomic_load_explicit(&bm->recording, memory_order_relaxed)) {
		ret = vec_reserve(blk, &blk->dirty_rec);
		if (ret < 0)
			return ret;
		/* Relaxed: vec_add()'s release store publishes it. */
		atomic_store_explicit(&bm->recording, true, memory_order_relaxed);
		vec_add(&blk->dirty_rec, bm);
	} else if (!on && atomic_load_explicit(&bm->recording, memory_order_relaxed)) {
		/* Stopped before it leaves the walk, as in remove. */
		atomic_store_explicit(&bm->recording, false, memory_order_relaxed);
		vec_del(blk, &blk->dirty_rec, bm);
	}
	if (bm->persistent && bm->fd >= 0) {
		pthread_mutex_lock(&bm->lock);
		ret = write_header(bm, run_flags(bm, true), 0);
		pthread_mutex_unlock(&bm->lock);
	}
	return ret;
}

int ioc_blk_dirty_merge(struct ioc_blk_dirty *dst, struct ioc_blk_dirty *src)
{
	uint64_t off = 0, len;
	int ret;

	if (dst->inconsistent || src->inconsistent)
		return -EUCLEAN;
	if (dst->size != src->size)
		return -EINVAL;
	while (off < src->size) {
		ret = ioc_blk_dirty_extent(src, off, UINT64_MAX, &len);
		if (ret < 0)
			return ret;
		if (ret == 1) {
			ret = mark_one(dst, off, len);
			if (ret < 0)
				return ret;
		}
		off += len;
	}
	return 0;
}

static uint64_t count_bytes(struct ioc_blk_dirty *bm)
{
	uint64_t bits = 0, bytes;

	for (uint64_t w = 0; w < bm->nwords; w++)
		bits += (uint64_t)__builtin_popcountll(
			atomic_load_explicit(&bm->words[w], memory_order_relaxed));
	bytes = bits << bm->shift;
	/* The last granule may be cut short by the end of the image. */
	if (bm->nbits && (atomic_load_explicit(&bm->words[(bm->nbits - 1) / 64],
					       memory_order_relaxed) >>
			  ((bm->nbits - 1) % 64)) & 1)
		bytes -= (bm->nbits << bm->shift) - bm->size;
	return bytes;
}

void ioc_blk_dirty_get_info(struct ioc_blk_dirty *bm, struct ioc_blk_dirty_info *info)
{
	snprintf(info->name, sizeof(info->name), "%s", bm->name);
	info->granularity = gran_of(bm);
	info->count = count_bytes(bm);
	info->recording = atomic_load_explicit(&bm->recording, memory_order_relaxed);
	info->persistent = bm->persistent;
	info->inconsistent = bm->inconsistent;
}

static int by_seq(const void *a, const void *b)
{
	const struct ioc_blk_dirty *x = *(struct ioc_blk_dirty *const *)a;
	const struct ioc_blk_dirty *y = *(struct ioc_blk_dirty *const *)b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int ioc_blk_dirty_handles(struct ioc_blk *blk, struct ioc_blk_dirty **out, int max)
{
	/* Acquire: pairs with vec_publish() (NBD's LIST from I/O threads). */
	struct blk_dirty_vec *v = atomic_load_explicit(&blk->dirty_all, memory_order_acquire);
	unsigned n = v ? vec_len(v) : 0, k = 0;
	struct ioc_blk_dirty **all;

	if (!n)
		return 0;
	all = malloc(n * sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		struct ioc_blk_dirty *bm = vec_at(v, i);

		if (bm)
			all[k++] = bm;
	}
	qsort(all, k, sizeof(*all), by_seq);
	for (unsigned i = 0; i < k && (int)i < max; i++)
		out[i] = all[i];
	free(all);
	return (int)k;
}

const char *ioc_blk_dirty_name(const struct ioc_blk_dirty *bm)
{
	return bm->name;
}

int ioc_blk_dirty_list(struct ioc_blk *blk, struct ioc_blk_dirty_info *out, int max)
{
	struct ioc_blk_dirty **v;
	int n = ioc_blk_dirty_handles(blk, NULL, 0);

	if (n <= 0 || max <= 0)
		return n;
	v = malloc((size_t)n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	n = ioc_blk_dirty_handles(blk, v, n);
	for (int i = 0; i < n && i < max; i++)
		ioc_blk_dirty_get_info(v[i], &out[i]);
	free(v);
	return n;
}

static bool bit_at(struct ioc_blk_dirty *bm, uint64_t b)
{
	return (atomic_load_explicit(&bm->words[b / 64], memory_order_acquire) >> (b % 64)) & 1;
}

int ioc_blk_dirty_extent(struct ioc_blk_dirty *bm, uint64_t offset, uint64_t maxlen,
			 uint64_t *len)
{
	uint64_t b, end_bit, e, limit;
	bool state;

	if (bm->inconsistent)
		return -EUCLEAN;
	if (offset >= bm->size || !maxlen)
		return -EINVAL;
	b = offset >> bm->shift;
	state = bit_at(bm, b);
	limit = maxlen > bm->size - offset ? bm->size : offset + maxlen;
	end_bit = ((limit - 1) >> bm->shift) + 1;
	/* Scan word by word for the first bit that differs. */
	e = b + 1;
	while (e < end_bit) {
		uint64_t w = atomic_load_explicit(&bm->words[e / 64], memory_order_acquire);
		uint64_t diff = (state ? ~w : w) >> (e % 64);

		if (diff) {
			e += (uint64_t)__builtin_ctzll(diff);
			break;
		}
		e = (e / 64 + 1) * 64;
	}
	if (e > end_bit)
		e = end_bit;
	e <<= bm->shift;
	*len = (e > limit ? limit : e) - offset;
	return state;
}

int ioc_blk_dirty_reset(struct ioc_blk_dirty *bm, uint64_t offset, uint64_t len)
{
	uint64_t first, last;
	bool was = false;

	if (bm->inconsistent)
		return -EUCLEAN;
	if (!len || offset >= bm->size)
		return 0;
	first = offset >> bm->shift;
	last = (offset + len - 1) >> bm->shift;
	if (last >= bm->nbits)
		last = bm->nbits - 1;
	for (uint64_t w = first / 64; w <= last / 64; w++) {
		uint64_t mask = word_mask(w, first, last);

		/* acq_rel: the acquire pairs with mark_one()'s release (the
		 * ordering rule).  ondisk[] keeps its bits: the sidecar still
		 * has them, which errs on the side of copying more. */
		if (atomic_fetch_and_explicit(&bm->words[w], ~mask, memory_order_acq_rel) & mask)
			was = true;
	}
	return was;
}

/* ---- loading and closing ---------------------------------------------- */

static int read_file(int fd, size_t max, uint8_t **out, size_t *outlen)
{
	struct stat st;
	uint8_t *buf;
	size_t got = 0;

	if (fstat(fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size > max)
		return -EUCLEAN;
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf)
		return -ENOMEM;
	while (got < (size_t)st.st_size) {
		ssize_t n = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? -errno : -EUCLEAN;

			free(buf);
			return e;
		}
		got += (size_t)n;
	}
	*out = buf;
	*outlen = got;
	return 0;
}

static int load_one(struct ioc_blk *blk, const char *dir, const char *fname,
		    const char *name)
{
	uint64_t size = blk_size(blk), gran = 0;
	uint64_t maxw = (size / IOC_BLK_DIRTY_GRAN_MIN + 64) / 64;
	const uint8_t *words;
	struct ioc_blk_dirty *bm;
	uint8_t *buf = NULL;
	size_t len = 0;
	uint32_t flags = 0;
	int ret, fd, shift;
	char *path;

	if (!name_ok(name, true) || ioc_blk_dirty_find(blk, name))
		return 0;
	ret = reserve(blk, true);
	if (ret < 0)
		return ret;
	if (asprintf(&path, "%s/%s", dir, fname) < 0)
		return -ENOMEM;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		free(path);
		return ret;
	}
	ret = read_file(fd, HDR_SIZE + maxw * 8, &buf, &len);
	if (ret == 0 || ret == -EUCLEAN)
		ret = ret ? ret : ioc__blk_dirty_parse(buf, len, size, name, &gran,
						       &flags, &words);
	if (ret < 0 && ret != -EUCLEAN)
		goto out;
	shift = gran_shift(gran ? gran : IOC_BLK_DIRTY_GRAN_DEFAULT);
	bm = bm_alloc(blk, name, (unsigned)shift, true, true);
	if (!bm) {
		ret = -ENOMEM;
		goto out;
	}
	bm->sidecar = path;
	path = NULL;
	if (ret == -EUCLEAN) {
		/* Kept as found, for the operator to see and remove. */
		bm->inconsistent = true;
		atomic_init(&bm->recording, false);
	} else {
		for (uint64_t w = 0; w < bm->nwords; w++) {
			uint64_t v = ioc__get_le64(words + w * 8);

			atomic_init(&bm->words[w], v);
			atomic_init(&bm->ondisk[w], v);
		}
		atomic_init(&bm->recording, !(flags & IOC__DIRTY_F_DISABLED));
		bm->fd = fd;
		fd = -1;
		ret = write_header(bm, run_flags(bm, true), 0);
		if (ret < 0) {
			bm_free(bm);
			goto out;
		}
	}
	publish(blk, bm);
	ret = 1;
out:
	if (fd >= 0)
		close(fd);
	free(path);
	free(buf);
	return ret;
}

int ioc_blk_dirty_load(struct ioc_blk *blk)
{
	char *copy1, *copy2, *dir, *base;
	size_t blen, slen = strlen(SIDECAR_SUFFIX);
	struct dirent *de;
	int n = 0, ret = 0;
	DIR *d;

	if (!blk->path)
		return 0;
	copy1 = strdup(blk->path);
	copy2 = strdup(blk->path);
	if (!copy1 || !copy2) {
		ret = -ENOMEM;
		goto out;
	}
	dir = dirname(copy1);
	base = basename(copy2);
	blen = strlen(base);
	d = opendir(dir);
	if (!d) {
		ret = -errno;
		goto out;
	}
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		char name[IOC_BLK_DIRTY_SIDECAR_NAME_MAX];
		size_t nlen;

		if (len <= blen + 1 + slen || strncmp(de->d_name, base, blen) != 0 ||
		    de->d_name[blen] != '.' ||
		    strcmp(de->d_name + len - slen, SIDECAR_SUFFIX) != 0)
			continue;
		nlen = len - blen - 1 - slen;
		if (nlen >= sizeof(name))
			continue;
		memcpy(name, de->d_name + blen + 1, nlen);
		name[nlen] = '\0';
		ret = load_one(blk, dir, de->d_name, name);
		if (ret < 0)
			break;
		n += ret;
	}
	closedir(d);
out:
	free(copy1);
	free(copy2);
	return ret < 0 ? ret : n;
}

/* Clean stop: the words, fdatasync, then the header without IN_USE and
 * with their crc (a crash in between leaves IN_USE: still complete). */
static void store_clean(struct ioc_blk_dirty *bm)
{
	uint64_t n = bm->nwords;
	uint64_t *buf = malloc(n ? n * 8 : 1);
	uint32_t crc;

	if (!buf)
		return; /* stays IN_USE: loads as it is, still complete */
	for (uint64_t w = 0; w < n; w++)
		buf[w] = htole64(atomic_load_explicit(&bm->words[w], memory_order_relaxed));
	crc = (uint32_t)crc32(0, (const Bytef *)buf, (uInt)(n * 8));
	if (pwrite_all(bm->fd, buf, n * 8, HDR_SIZE) == 0 && fdatasync(bm->fd) == 0)
		write_header(bm, run_flags(bm, false), crc);
	free(buf);
}

void ioc__blk_dirty_close(struct ioc_blk *blk)
{
	struct blk_dirty_vec *v = atomic_load_explicit(&blk->dirty_all, memory_order_relaxed);
	unsigned n = v ? atomic_load_explicit(&v->n, memory_order_relaxed) : 0;

	/* No I/O is left: nothing walks the sets any more. */
	for (unsigned i = 0; i < n; i++) {
		struct ioc_blk_dirty *bm = atomic_load_explicit(&v->slot[i], memory_order_relaxed);

		if (!bm)
			continue;
		if (bm->persistent && !bm->inconsistent && bm->fd >= 0)
			store_clean(bm);
		bm_free(bm);
	}
	vec_retire(blk, v);
	vec_retire(blk, atomic_load_explicit(&blk->dirty_rec, memory_order_relaxed));
	atomic_store_explicit(&blk->dirty_all, NULL, memory_order_relaxed);
	atomic_store_explicit(&blk->dirty_rec, NULL, memory_order_relaxed);
	blk->dirty_count = 0;
	while (blk->dirty_vec_retired) {
		struct blk_dirty_vec *r = blk->dirty_vec_retired;

		blk->dirty_vec_retired = r->retired_next;
		free(r);
	}
	while (blk->dirty_retired) {
		struct ioc_blk_dirty *bm = blk->dirty_retired;

		blk->dirty_retired = bm->retired_next;
		bm_free(bm);
	}
}

/* ---- a set fed from outside, with a store ------------------------------- */

void ioc_blk_dirty_set_store(struct ioc_blk *blk, const struct ioc_blk_dirty_store *st,
			     void *opaque)
{
	blk->dirty_store = st;
	blk->dirty_store_opaque = opaque;
}

int ioc_blk_dirty_mark(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	return blk_dirty_mark(blk, offset, len);
}

/* The 64-bit words [first_bit / 64, +nbytes / 8) of bm that exist, and
 * where the array's bytes go: -EINVAL for a misaligned start. */
static int bits_range(const struct ioc_blk_dirty *bm, uint64_t first_bit, size_t nbytes,
		      uint64_t *w0, uint64_t *nw)
{
	uint64_t want = (nbytes + 7) / 8;

	if (first_bit % 64)
		return -EINVAL;
	*w0 = first_bit / 64;
	*nw = *w0 >= bm->nwords ? 0 : bm->nwords - *w0 < want ? bm->nwords - *w0 : want;
	return 0;
}

int ioc_blk_dirty_export(struct ioc_blk_dirty *bm, uint64_t first_bit, void *buf,
			 size_t nbytes)
{
	uint64_t w0, nw;
	uint8_t *p = buf;
	int ret = bits_range(bm, first_bit, nbytes, &w0, &nw);

	if (ret < 0)
		return ret;
	memset(buf, 0, nbytes);
	for (uint64_t i = 0; i < nw; i++) {
		uint64_t v = htole64(atomic_load_explicit(&bm->words[w0 + i],
							  memory_order_relaxed));
		size_t n = nbytes - i * 8 < 8 ? nbytes - i * 8 : 8;

		memcpy(p + i * 8, &v, n);
	}
	return 0;
}

int ioc_blk_dirty_import(struct ioc_blk_dirty *bm, uint64_t first_bit, const void *buf,
			 size_t nbytes)
{
	uint64_t w0, nw;
	const uint8_t *p = buf;
	int ret = bits_range(bm, first_bit, nbytes, &w0, &nw);

	if (ret < 0)
		return ret;
	for (uint64_t i = 0; i < nw; i++) {
		uint64_t v = 0;
		size_t n = nbytes - i * 8 < 8 ? nbytes - i * 8 : 8;

		memcpy(&v, p + i * 8, n);
		v = le64toh(v);
		/* Bits past the last granule mark nothing. */
		if (w0 + i == bm->nwords - 1 && bm->nbits % 64)
			v &= (UINT64_C(1) << (bm->nbits % 64)) - 1;
		/* Release: pairs with the acquire loads of ioc_blk_dirty_extent(),
		 * as a mark's would. */
		atomic_fetch_or_explicit(&bm->words[w0 + i], v, memory_order_release);
	}
	return 0;
}
