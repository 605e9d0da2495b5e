/*
 * Compressed images with random access (src/zip/image.c) and their frame
 * cache, driven directly by coroutines on several I/O threads:
 *   - many coroutines on two threads read random ranges through a cache of
 *     eight frames (constant eviction, waits on frames another thread is
 *     decoding) and every byte matches the original, decoded on at most
 *     CPUs + 1 pool threads at once;
 *   - sixteen coroutines reading one cold frame at once decode it once;
 *   - on a fresh image, cold reads at the start, middle and end of a
 *     frame and across frame boundaries (decoded on the reader's thread
 *     when small, on the pool when large) give the original bytes;
 *   - a damaged frame fails the small reads decoded inline that touch it
 *     with EIO and a logged offset, and only those;
 *   - large reads decode the frames they cover whole into the caller's
 *     buffer (zero, stored and compressed frames, starts and ends inside
 *     frames), a damaged one among them fails the read with EIO;
 *   - the file cut short under an open image fails the reads that need
 *     bytes past the cut with EIO ("file truncated" in the log) and
 *     serves the rest;
 *   - stored (raw) frames are read from the file, not decoded nor cached,
 *     their checksum checked (a damaged one fails with EIO) on a frame's
 *     first read only, later reads taking just their bytes;
 *   - with page checks, a small read of a stored frame reads and checks
 *     only its pages, once each; a damaged page fails the reads that touch
 *     it (logged), a wrong check falls back to the frame's checksum, and
 *     a table that cannot be right is ignored at open;
 *   - a scan admits nothing past probation, frames read again are kept,
 *     4 KiB reads walking through frames decode each once;
 *   - concurrent large reads of the same frames decode them once in
 *     place, the others (and small reads inside) get copies;
 *   - a large read ending on a frame boundary reads ahead (the frames
 *     after it are then hits), a small read of a small frame does not;
 *   - all-zero frames are known at open, before any read, zstd RLE frames
 *     and gzip members of zeros alike.
 * The TSan suite runs this too: the cache's locking and the decode
 * handoff between pool threads and loops are what it exercises.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "iocore/co.h"
#include "iocore/loop.h"
#include "iocore/zip.h"
#include "ioc-config.h"
#include "tap.h"

/* 1 when stored (raw) frames are read from the file, not decoded. */
#define ST IOC_HAVE_XXHASH

#define FRAME   (64u << 10)
#define NFRAMES 128u
#define SIZE    ((size_t)FRAME * NFRAMES + 777)   /* a short last frame */

static uint8_t *raw;
static char path[64], gzpath[64], smallpath[64], runspath[64], plainpath[64];
#define SMALL   (16u << 10)     /* frames of smallpath */

static int write_fd(void *opaque, const void *buf, size_t len)
{
	return write(*(int *)opaque, buf, len) == (ssize_t)len ? 0 : -EIO;
}

/* 64 KiB runs of zeros (every 4th), random bytes and text; the image in
 * out, compressed as format in frames of block bytes (with runs, a run of
 * zero blocks is one frame; with plain, no page checks of stored frames:
 * their whole-frame checks are tested on those). */
static void make_image(char *out, enum ioc_zip_format format, size_t block, bool runs,
		       bool plain)
{
	struct ioc_zip_opts o = { .format = format, .block_size = block, .workers = 2,
				  .write = write_fd, .zero_runs = runs,
				  .no_page_checks = plain };
	struct ioc_zip *z;
	unsigned seed = 12345;
	int fd;

	for (size_t i = 0; i < SIZE; i++) {
		size_t f = i / FRAME;

		if (f % 4 == 0)
			raw[i] = 0;
		else if (f % 4 == 1)
			raw[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
		else
			raw[i] = (uint8_t)("frame cache "[i % 12] + f);
	}
	snprintf(out, 64, "/tmp/ioc-zip-image.XXXXXX");
	fd = mkstemp(out);
	ASSERT_GE(fd, 0);
	o.opaque = &fd;
	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write(z, raw, SIZE, 0));
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_free(z);
	close(fd);
}

/* Completion count: the last reader signals the main thread. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned left;
	unsigned bad;
} done = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void reader_done(bool ok)
{
	pthread_mutex_lock(&done.lock);
	done.bad += !ok;
	if (--done.left == 0)
		pthread_cond_broadcast(&done.cond);
	pthread_mutex_unlock(&done.lock);
}

static void wait_readers(void)
{
	pthread_mutex_lock(&done.lock);
	while (done.left)
		pthread_cond_wait(&done.cond, &done.lock);
	pthread_mutex_unlock(&done.lock);
}

struct reader {
	struct ioc_zip_image *img;
	unsigned seed;
	unsigned reads;
	uint64_t off;           /* fixed offset when reads == 1 */
	size_t len;
};

static void ioc_coroutine_fn reader_fn(void *opaque)
{
	struct reader *r = opaque;
	uint8_t *buf = malloc(300000);
	bool ok = buf != NULL;

	for (unsigned i = 0; ok && i < r->reads; i++) {
		uint64_t off = r->off;
		size_t len = r->len;

		if (r->reads > 1) {
			r->seed = r->seed * 1103515245u + 12345u;
			off = (r->seed >> 4) % SIZE;
			r->seed = r->seed * 1103515245u + 12345u;
			len = 1 + (r->seed >> 8) % 300000;
			if (len > SIZE - off)
				len = SIZE - off;
		}
		ok = ioc_zip_image_co_pread(r->img, off, buf, len, 0) == 0 &&
		     memcmp(buf, raw + off, len) == 0;
	}
	free(buf);
	reader_done(ok);
}

struct spawn {
	struct reader *readers;
	unsigned n;
};

static int spawn_fn(void *arg)
{
	struct spawn *s = arg;

	for (unsigned i = 0; i < s->n; i++) {
		struct ioc_co *co = ioc_co_create(reader_fn, &s->readers[i]);

		if (!co)
			return -ENOMEM;
		ioc_co_enter(co);
	}
	return 0;
}

/* Start sp[t]'s readers on an I/O thread each (nt of them), wait until
 * they are all done, and check that every one read the right bytes. */
static void run_readers(struct spawn *sp, int nt)
{
	struct ioc_iothread *th[2];

	ASSERT_LE(nt, 2);
	done.left = 0;
	done.bad = 0;
	for (int t = 0; t < nt; t++)
		done.left += sp[t].n;
	for (int t = 0; t < nt; t++)
		ASSERT_OK(ioc_iothread_start(&th[t], NULL));
	for (int t = 0; t < nt; t++)
		ASSERT_OK(ioc_iothread_call(th[t], spawn_fn, &sp[t]));
	wait_readers();
	for (int t = 0; t < nt; t++)
		ioc_iothread_stop(th[t]);
	ASSERT_EQ(done.bad, 0);
}

/* n readers on each of two I/O threads, each making reads random reads
 * (seeds from seed on), all checked. */
static void random_readers(struct ioc_zip_image *img, unsigned n, unsigned reads, unsigned seed)
{
	struct reader rd[2][16];
	struct spawn sp[2];

	ASSERT_ULE(n, 16);
	for (unsigned t = 0; t < 2; t++) {
		for (unsigned i = 0; i < n; i++)
			rd[t][i] = (struct reader){ .img = img, .seed = t * n + i + seed,
						    .reads = reads };
		sp[t] = (struct spawn){ rd[t], n };
	}
	run_readers(sp, 2);
}

static void test_random_reads_small_cache(void)
{
	struct ioc_zip_image_opts zo = { .frame_cache = 8 * FRAME };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, path, &zo, msg, sizeof(msg)));
	random_readers(img, 16, 60, 1);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.size, SIZE);
	ASSERT_STR_EQ(info.path, path);
	ASSERT_UEQ(info.cache_budget, 8 * FRAME);
	ASSERT_UGT(info.cache_hits, 0);
	ASSERT_UGT(info.cache_evictions, 0);
	ASSERT_ULE(info.cache_bytes, 8 * FRAME);
	ASSERT_UEQ(info.errors, 0);
	/* 32 readers of up to 300000 bytes on two threads: never more
	 * decoding pool threads than CPUs + 1. */
	ASSERT_UEQ(info.decode_threads, (unsigned)sysconf(_SC_NPROCESSORS_ONLN) + 1);
	ASSERT_UGE(info.decode_threads_peak, 1);
	ASSERT_ULE(info.decode_threads_peak, info.decode_threads);
	ioc_zip_image_close(img);
}

static void test_one_frame_decoded_once(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	struct reader rd[2][8];
	struct spawn sp[2];
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, path, &zo, msg, sizeof(msg)));
	for (int t = 0; t < 2; t++) {
		for (int i = 0; i < 8; i++)
			rd[t][i] = (struct reader){ .img = img, .reads = 1,
						    .off = 6 * FRAME + 1000 * (unsigned)i,
						    .len = 4096 };
		sp[t] = (struct spawn){ rd[t], 8 };
	}
	run_readers(sp, 2);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.decodes, 1);
	ASSERT_UEQ(info.cache_misses, 1);
	ASSERT_UEQ(info.cache_hits, 15);
	ioc_zip_image_close(img);
}

/* One coroutine on one I/O thread runs fn(img). */
struct one_call {
	struct ioc_zip_image *img;
	void (*fn)(struct ioc_zip_image *img, bool *ok);
	bool ok;
};

static void ioc_coroutine_fn one_call_fn(void *opaque)
{
	struct one_call *c = opaque;

	c->ok = true;
	c->fn(c->img, &c->ok);
	reader_done(c->ok);
}

static int one_spawn_fn(void *arg)
{
	struct ioc_co *co = ioc_co_create(one_call_fn, arg);

	if (!co)
		return -ENOMEM;
	ioc_co_enter(co);
	return 0;
}

static void run_one(struct ioc_zip_image *img, void (*fn)(struct ioc_zip_image *, bool *))
{
	struct one_call c = { .img = img, .fn = fn };
	struct ioc_iothread *th;

	done.left = 1;
	done.bad = 0;
	ASSERT_OK(ioc_iothread_start(&th, NULL));
	ASSERT_OK(ioc_iothread_call(th, one_spawn_fn, &c));
	wait_readers();
	ioc_iothread_stop(th);
	ASSERT_EQ(done.bad, 0);
}

/* Read [off, off + len) and compare; a poisoned buffer, so bytes a decode
 * left out cannot pass as zeros. */
static bool check_range(struct ioc_zip_image *img, uint64_t off, size_t len)
{
	uint8_t *buf = malloc(len);
	bool ok;

	if (!buf)
		return false;
	memset(buf, 0xee, len);
	ok = ioc_zip_image_co_pread(img, off, buf, len, 0) == 0 &&
	     memcmp(buf, raw + off, len) == 0;
	free(buf);
	return ok;
}

/* Frames 4k are zeros, 4k + 1 random, the others text: every read below
 * but one lands on frames nobody read before (a fresh image, no
 * readahead). */
static void edge_reads(struct ioc_zip_image *img, bool *ok)
{
	static const struct { uint64_t off; size_t len; } r[] = {
		{ 2 * FRAME, 4096 },                    /* start of a frame */
		{ 6 * FRAME + FRAME / 2 - 100, 4096 },  /* middle */
		{ 11 * FRAME - 4096, 4096 },            /* its last bytes */
		{ 14 * FRAME - 1, 2 },                  /* across a boundary */
		{ 17 * FRAME + 5, 1 },                  /* one byte */
		{ 21 * FRAME - 3000, 3 * FRAME + 6000 },/* large: on the pool */
		{ 2 * FRAME + 4096, FRAME - 4096 },     /* the rest, from the cache */
		{ SIZE - 700, 700 },                    /* the short last frame */
	};

	for (size_t k = 0; k < sizeof(r) / sizeof(r[0]); k++)
		if (!check_range(img, r[k].off, r[k].len)) {
			ioc_test_diag("read %zu at %llu, %zu bytes differs", k,
				 (unsigned long long)r[k].off, r[k].len);
			*ok = false;
		}
}

static void test_cold_edge_reads(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, path, &zo, msg, sizeof(msg)));
	run_one(img, edge_reads);
	ioc_zip_image_get_info(img, &info);
	/* Frames 2, 6, 10, 14, 22, 23 decoded (zero frames need none), 13,
	 * 17 and 21 (random bytes: stored) read from the file; the large
	 * read covers 21, 22 and 23 whole: 22 and 23 decoded in place. */
	ASSERT_UEQ(info.decodes, 9 - 3 * ST);
	ASSERT_UEQ(info.direct_decodes, 3 - ST);
	ASSERT_UEQ(info.stored_reads, 3 * ST);
	ASSERT_UEQ(info.errors, 0);
	ioc_zip_image_close(img);
}

/* The bytes (*fsize of them) of image file `from`, and frame f's
 * compressed offset and size in it; for the tests that damage a copy. */
static uint8_t *read_image(const char *from, size_t f, uint64_t *coff, uint64_t *csize,
			   off_t *fsize)
{
	struct ioc_zip_index *ix;
	char msg[256];
	uint8_t *file;
	int fd = open(from, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)));
	*coff = ix->frames[f].coff;
	*csize = ix->frames[f].csize;
	ioc_zip_index_free(ix);
	*fsize = lseek(fd, 0, SEEK_END);
	file = malloc((size_t)*fsize);
	ASSERT_NOT_NULL(file);
	ASSERT_EQ(pread(fd, file, (size_t)*fsize, 0), *fsize);
	close(fd);
	return file;
}

/* file's fsize bytes into a new file named from tmpl (into out, 64 bytes). */
static void write_copy(char *out, const char *tmpl, const uint8_t *file, off_t fsize)
{
	int fd;

	snprintf(out, 64, "%s", tmpl);
	fd = mkstemp(out);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(write(fd, file, (size_t)fsize), fsize);
	close(fd);
}

/* A copy of the image with one byte of frame 5's compressed data (random
 * bytes, stored) flipped: its checksum fails. */
static char badpath[64];
static char badlog[512];

static void log_fn(void *opaque, const char *msg)
{
	if (strstr(msg, "EIO"))
		snprintf(badlog, sizeof(badlog), "%s", msg);
}

static uint8_t big[3 * FRAME];

static void damaged_reads(struct ioc_zip_image *img, bool *ok)
{
	uint8_t buf[4096];

	*ok &= ioc_zip_image_co_pread(img, 5 * FRAME + 8192, buf, 4096, 0) == -EIO;
	*ok &= ioc_zip_image_co_pread(img, 6 * FRAME - 2, buf, 4, 0) == -EIO;
	*ok &= check_range(img, 6 * FRAME, 4096);
	*ok &= check_range(img, 3 * FRAME + 100, 4096);
	/* Large reads: frame 5 covered whole (decoded in place) fails the
	 * read; one that stops just short of it does not. */
	*ok &= ioc_zip_image_co_pread(img, 4 * FRAME + 10, big, 3 * FRAME, 0) == -EIO;
	*ok &= check_range(img, 2 * FRAME + 10, 3 * FRAME - 10);
	*ok &= check_range(img, 6 * FRAME, 3 * FRAME + 1);
}

/* fn on a copy of image `from` whose byte at where(frame 5's compressed
 * offset and size) is flipped, logging to badlog; the image's info after
 * it in *info.  The log must name frame 5's compressed offset. */
static void run_damaged(const char *from, uint64_t (*where)(uint64_t, uint64_t),
			void (*fn)(struct ioc_zip_image *, bool *),
			struct ioc_zip_image_info *info)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true, .log = log_fn };
	struct ioc_zip_image *img;
	char msg[256], want[64];
	uint64_t coff, csize;
	off_t fsize;
	uint8_t *file = read_image(from, 5, &coff, &csize, &fsize);

	ASSERT_UGT(csize, 64);
	file[where(coff, csize)] ^= 0x40;
	write_copy(badpath, "/tmp/ioc-zip-image-bad.XXXXXX", file, fsize);
	free(file);
	badlog[0] = 0;

	ASSERT_OK(ioc_zip_image_open(&img, badpath, &zo, msg, sizeof(msg)));
	run_one(img, fn);
	ioc_zip_image_get_info(img, info);
	ioc_zip_image_close(img);
	unlink(badpath);
	snprintf(want, sizeof(want), "compressed offset %llu", (unsigned long long)coff);
	ASSERT_NOT_NULL(strstr(badlog, want));
}

static uint64_t mid_frame(uint64_t coff, uint64_t csize)
{
	return coff + csize / 2;
}

static void test_damaged_frame_inline(void)
{
	struct ioc_zip_image_info info;

	run_damaged(plainpath, mid_frame, damaged_reads, &info);
	ASSERT_UEQ(info.errors, 3);     /* not cached: each read tried again */
	/* Checked: frame 9 (the last read's); never frame 5, which fails. */
	ASSERT_UEQ(info.stored_checks, ST);
	if (ST)         /* frame 5 is random bytes: a stored frame */
		ASSERT_NOT_NULL(strstr(badlog, "stored frame"));
}

/* The compressed file cut short under an open image (someone truncated
 * it in the middle of frame 9, random bytes: a stored frame): the reads
 * that need bytes past the cut fail with EIO and the log says "file
 * truncated"; frames before it, and zero frames (known at open) on either
 * side, are still served, by small and large reads alike. */
static char cutpath[64];
static uint64_t cut_at;
static char cutlog[512];

static void cut_log_fn(void *opaque, const char *msg)
{
	if (strstr(msg, "file truncated"))
		snprintf(cutlog, sizeof(cutlog), "%s", msg);
}

static void cut_reads(struct ioc_zip_image *img, bool *ok)
{
	uint8_t buf[4096];

	*ok &= check_range(img, 3 * FRAME + 100, 4096);         /* text */
	*ok &= check_range(img, 5 * FRAME + 100, 4096);         /* stored */
	*ok &= truncate(cutpath, (off_t)cut_at) == 0;
	/* Past the cut: text frame 10, stored frame 9 (across it), and a
	 * large read covering 7-9 whole (one preadv for the run, then frame
	 * by frame). */
	*ok &= ioc_zip_image_co_pread(img, 10 * FRAME + 8192, buf, 4096, 0) == -EIO;
	*ok &= ioc_zip_image_co_pread(img, 9 * FRAME + 8192, buf, 4096, 0) == -EIO;
	*ok &= ioc_zip_image_co_pread(img, 7 * FRAME, big, 3 * FRAME, 0) == -EIO;
	/* Before it: frames read before the cut and frames never read, small
	 * and large; zero frames (8 before it, 12 past it) need no bytes of
	 * the file. */
	*ok &= check_range(img, 3 * FRAME + 5000, 4096);
	*ok &= check_range(img, 5 * FRAME + 9000, 4096);
	*ok &= check_range(img, 6 * FRAME + 100, 4096);
	*ok &= check_range(img, 1 * FRAME, 3 * FRAME);
	*ok &= check_range(img, 8 * FRAME + 100, 4096);
	*ok &= check_range(img, 12 * FRAME + 100, 4096);
}

static void test_truncated_file(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true, .log = cut_log_fn };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	char msg[256];
	uint64_t coff, csize;
	off_t fsize;
	uint8_t *file = read_image(plainpath, 9, &coff, &csize, &fsize);

	ASSERT_UGT(csize, FRAME);       /* stored: random bytes */
	cut_at = coff + csize / 2;
	write_copy(cutpath, "/tmp/ioc-zip-image-cut.XXXXXX", file, fsize);
	free(file);

	ASSERT_OK(ioc_zip_image_open(&img, cutpath, &zo, msg, sizeof(msg)));
	run_one(img, cut_reads);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UGE(info.errors, 3);
	ASSERT_NOT_NULL(strstr(cutlog, "file truncated"));
	ioc_zip_image_close(img);
	unlink(cutpath);
}

static void stored_diag(const struct ioc_zip_image_info *info)
{
	ioc_test_diag("stored reads %llu, frame checks %llu, page checks %llu, decodes %llu",
		      (unsigned long long)info->stored_reads,
		      (unsigned long long)info->stored_checks,
		      (unsigned long long)info->page_checks,
		      (unsigned long long)info->decodes);
}

/* A stored frame's checksum is checked over the whole frame on its first
 * read only; later reads, small or covering it whole, take just their
 * bytes.  Frames 1 and 5 of smallpath are random bytes (stored). */
static void stored_checked_once(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	*ok &= check_range(img, 5 * SMALL + 8192, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.stored_reads == 1 && info.stored_checks == 1 && info.decodes == 0;
	/* The same frame again, other parts of it: no check, right bytes. */
	*ok &= check_range(img, 5 * SMALL + 100, 3000);
	*ok &= check_range(img, 6 * SMALL - 1, 1);
	*ok &= check_range(img, 5 * SMALL, SMALL);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.stored_reads == 4 && info.stored_checks == 1;
	/* A large read covering frames 4-8 whole, read from the file with
	 * one preadv: 5 as checked, 4, 6 and 7 checked now, 8 (text)
	 * decoded in place. */
	*ok &= check_range(img, 4 * SMALL, 5 * SMALL);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.stored_reads == 8 && info.stored_checks == 4 && info.errors == 0 &&
	       info.decodes == 1 && info.direct_decodes == 1;
	if (!*ok)
		stored_diag(&info);
}

/* fn on a fresh image of file, without readahead (stored frames only). */
static void run_stored(const char *file, void (*fn)(struct ioc_zip_image *, bool *))
{
	struct ioc_zip_image_opts zo = { .no_readahead = true };
	struct ioc_zip_image *img;
	char msg[256];

	if (!ST)
		IOC_SKIP("stored frames need libxxhash");
	ASSERT_OK(ioc_zip_image_open(&img, file, &zo, msg, sizeof(msg)));
	run_one(img, fn);
	ioc_zip_image_close(img);
}

static void test_stored_checked_once(void)
{
	run_stored(smallpath, stored_checked_once);
}

/* Page checks (iocore-zip writes them unless told not to): a read of a
 * stored frame reads and checks only the 4 KiB pages it covers, each on
 * its first read.  Frame 5 of path is random bytes: stored, 16 pages. */
static void paged_reads(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	*ok &= check_range(img, 5 * FRAME + 8192, 4096);        /* page 2 */
	ioc_zip_image_get_info(img, &info);
	*ok &= info.stored_reads == 1 && info.page_checks == 1 && info.stored_checks == 0;
	/* Page 2 again; 2-3 unaligned (3 is new); the frame's last byte. */
	*ok &= check_range(img, 5 * FRAME + 8192, 4096);
	*ok &= check_range(img, 5 * FRAME + 9000, 4096);
	*ok &= check_range(img, 6 * FRAME - 1, 1);
	/* Across into frame 6 (text, decoded): page 15 is checked already. */
	*ok &= check_range(img, 6 * FRAME - 100, 200);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.stored_reads == 5 && info.page_checks == 3 && info.stored_checks == 0 &&
	       info.errors == 0 && info.decodes == 1;
	if (!*ok)
		stored_diag(&info);
}

static void test_page_checked_reads(void)
{
	run_stored(path, paged_reads);
}

/* Where page p of frame f's data is in the file, and where its check is
 * (stored frames 1, 5, 9, ... of path: frame f is the (f / 4)th). */
static uint64_t page_at(uint64_t coff, uint64_t csize, unsigned p)
{
	return coff + csize - 4 - FRAME + (uint64_t)p * 4096;
}

static uint64_t check_at(size_t f, unsigned p)
{
	struct ioc_zip_index *ix;
	char msg[256];
	uint64_t at;
	int fd = open(path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)));
	ASSERT_UGT(ix->pck_len, 0);
	at = ix->pck_off + 24 + (ix->nframes + 7) / 8 + ((f / 4) * (FRAME / 4096) + p) * 4;
	ioc_zip_index_free(ix);
	close(fd);
	return at;
}

/* One byte of frame 5's page 2 flipped: the reads that touch page 2 fail
 * with EIO and a logged offset (the frame's own checksum decides), small
 * reads of its other pages are served, and a large read covering the
 * frame whole fails. */
static void damaged_page_reads(struct ioc_zip_image *img, bool *ok)
{
	uint8_t buf[4096];

	*ok &= ioc_zip_image_co_pread(img, 5 * FRAME + 8192, buf, 4096, 0) == -EIO;
	*ok &= ioc_zip_image_co_pread(img, 5 * FRAME + 8000, buf, 300, 0) == -EIO;
	*ok &= check_range(img, 5 * FRAME + 12288, 4096);
	*ok &= check_range(img, 5 * FRAME, 4096);
	*ok &= ioc_zip_image_co_pread(img, 4 * FRAME + 10, big, 3 * FRAME, 0) == -EIO;
	*ok &= check_range(img, 6 * FRAME, 3 * FRAME + 1);
}

static uint64_t in_page_2(uint64_t coff, uint64_t csize)
{
	return page_at(coff, csize, 2) + 100;
}

static void test_damaged_page(void)
{
	struct ioc_zip_image_info info;

	if (!ST)
		IOC_SKIP("stored frames need libxxhash");
	run_damaged(path, in_page_2, damaged_page_reads, &info);
	ASSERT_UEQ(info.errors, 3);
	ASSERT_UEQ(info.page_checks, 3);        /* pages 0, 3; 0 of frame 9 */
	ASSERT_NOT_NULL(strstr(badlog, "stored frame"));
}

/* The page-check frame, not the data, damaged.  A wrong check: the read
 * falls back to the frame's own checksum, which passes, and gets the
 * right bytes.  A table that marks a compressed frame stored: ignored at
 * open with a log line, every read still right. */
static char pcklog[512];

static void pck_log_fn(void *opaque, const char *msg)
{
	(void)opaque;
	if (strstr(msg, "page checks"))
		snprintf(pcklog, sizeof(pcklog), "%s", msg);
}

static void wrong_check_reads(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	*ok &= check_range(img, 5 * FRAME + 8192, 4096);        /* its page */
	*ok &= check_range(img, 5 * FRAME + 16384, 4096);
	*ok &= check_range(img, 1 * FRAME + 4096, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.errors == 0 && info.stored_checks == 1 && info.page_checks == 1;
}

/* file (fsize bytes) with a page-check table that is wrong as a whole:
 * opened, the table is ignored with why in the log, and random reads are
 * right without a page check or an error. */
static void pck_ignored(const uint8_t *file, off_t fsize, const char *why)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true, .log = pck_log_fn };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	char msg[256];

	write_copy(badpath, "/tmp/ioc-zip-image-bad.XXXXXX", file, fsize);
	pcklog[0] = 0;
	ASSERT_OK(ioc_zip_image_open(&img, badpath, &zo, msg, sizeof(msg)));
	ioc_test_diag("%s", pcklog);
	ASSERT_NOT_NULL(strstr(pcklog, "ignoring the page checks"));
	ASSERT_NOT_NULL(strstr(pcklog, why));
	random_readers(img, 4, 20, 99);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.errors, 0);
	ASSERT_UEQ(info.page_checks, 0);
	ioc_zip_image_close(img);
	unlink(badpath);
}

static void test_damaged_page_checks(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true, .log = pck_log_fn };
	struct ioc_zip_image *img;
	char msg[256];
	uint64_t coff, csize, map;
	off_t fsize;
	uint8_t *file;

	if (!ST)
		IOC_SKIP("stored frames need libxxhash");
	file = read_image(path, 5, &coff, &csize, &fsize);
	file[check_at(5, 2)] ^= 1;
	write_copy(badpath, "/tmp/ioc-zip-image-bad.XXXXXX", file, fsize);
	ASSERT_OK(ioc_zip_image_open(&img, badpath, &zo, msg, sizeof(msg)));
	run_one(img, wrong_check_reads);
	ioc_zip_image_close(img);
	unlink(badpath);

	/* Frame 2 (text) marked stored: the bitmap is after the head. */
	file[check_at(5, 2)] ^= 1;
	map = check_at(0, 0) - (NFRAMES + 1 + 7) / 8;
	file[map] |= 1 << 2;
	pck_ignored(file, fsize, "a frame marked stored cannot be one");
	/* Frame 5 (stored) not marked: its checks are left over, and the
	 * frames after it would take the wrong ones. */
	file[map] &= (uint8_t)~(1 << 2 | 1 << 5);
	pck_ignored(file, fsize, "more checks than pages");
	free(file);
}

static void ra_steps(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	/* 4 KiB at frame 1's end (random bytes: a stored frame, read from
	 * the file): frames of 64 KiB read ahead one frame. */
	*ok &= check_range(img, 2 * FRAME - 4096, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.readaheads == 1 && info.cache_misses == 2 - ST && info.stored_reads == ST;
	/* Frame 2 was read ahead: a hit (perhaps waiting for its decode);
	 * ending on frame 3 reads ahead frame 3. */
	*ok &= check_range(img, 2 * FRAME, FRAME);
	/* 128 KiB ending on frame 11: 128 KiB ahead, 11 and 13 (12 is zero,
	 * 13 stored: it counts, but there is nothing to decode).  (9,
	 * stored, and 10, covered whole, are read in place, not cached.) */
	*ok &= check_range(img, 9 * FRAME, 2 * FRAME);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.readaheads == 4 - ST && info.cache_misses == 5 - 2 * ST &&
	       info.direct_decodes == 2 - ST && info.stored_reads == 2 * ST;
	*ok &= check_range(img, 11 * FRAME, 3 * FRAME);
	ioc_zip_image_get_info(img, &info);
	/* 11 was a hit, 13 stored; 14 and 15 are read ahead now (16 zero,
	 * 17 stored). */
	*ok &= info.cache_hits == 3 - ST && info.readaheads == 7 - 2 * ST &&
	       info.cache_misses == 8 - 3 * ST && info.direct_decodes == 2 - ST &&
	       info.stored_reads == 3 * ST;
	if (!*ok)
		ioc_test_diag("hits %llu misses %llu readaheads %llu",
			      (unsigned long long)info.cache_hits,
			      (unsigned long long)info.cache_misses,
			      (unsigned long long)info.readaheads);
}

/* 16 KiB frames: a 4 KiB read ending on one does not read ahead. */
static void ra_small(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	*ok &= check_range(img, 9 * SMALL - 4096, 4096);       /* text */
	ioc_zip_image_get_info(img, &info);
	*ok &= info.readaheads == 0 && info.cache_misses == 1 && info.decodes == 1;
}

static void test_readahead(void)
{
	struct ioc_zip_image *img;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, path, NULL, msg, sizeof(msg)));
	run_one(img, ra_steps);
	ioc_zip_image_close(img);
	ASSERT_OK(ioc_zip_image_open(&img, smallpath, NULL, msg, sizeof(msg)));
	run_one(img, ra_small);
	ioc_zip_image_close(img);
}

/* 16 KiB frames (four to a 64 KiB run): frames 0-3 zero, 4-7 random
 * (stored), 8-15 text, 16-19 zero, 20-23 random, 24-27 text.  Large reads
 * decode the frames they cover whole into the caller's buffer and the
 * ones they cover in part through the cache. */
static void direct_reads(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	/* From inside zero frame 3 to inside text frame 15: 4-7 read from
	 * the file (stored), 8-14 decoded in place, 15 through the cache. */
	*ok &= check_range(img, 3 * SMALL + 100, 200 << 10);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.direct_decodes == 11 - 4 * ST && info.cache_misses == 1 &&
	       info.decodes == 12 - 4 * ST && info.stored_reads == 4 * ST;
	/* Exactly frames 20-27, stored and compressed: all in place. */
	*ok &= check_range(img, 20 * SMALL, 8 * SMALL);
	/* The end of 14 (not cached: decoded again), 15 (a hit) and the
	 * zero frames after it. */
	*ok &= check_range(img, 15 * SMALL - 100, 100 + 70 * 1024);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.direct_decodes == 19 - 8 * ST && info.cache_hits == 1 &&
	       info.cache_misses == 2 && info.stored_reads == 8 * ST && info.decodes == 21 - 8 * ST;
	if (!*ok)
		ioc_test_diag("direct %llu hits %llu misses %llu decodes %llu",
			      (unsigned long long)info.direct_decodes,
			      (unsigned long long)info.cache_hits,
			      (unsigned long long)info.cache_misses,
			      (unsigned long long)info.decodes);
}

static void test_direct_reads(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true };
	struct ioc_zip_image *img;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, smallpath, &zo, msg, sizeof(msg)));
	run_one(img, direct_reads);
	ioc_zip_image_close(img);
}

/* Admission: 16 KiB frames, a cache of 64 of them (4 on probation).
 * Frames 8-15 of every 16 are text (see direct_reads): the n-th of them. */
static size_t text_frame(unsigned n)
{
	return (size_t)n / 8 * 16 + 8 + n % 8;
}

static void admission_steps(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	/* A scan: 32 text frames read once each.  They pass through
	 * probation and leave it: nothing is admitted, the cache holds no
	 * more than probation's share. */
	for (unsigned n = 0; n < 32; n++)
		*ok &= check_range(img, text_frame(n) * SMALL + 100, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.cache_misses == 32 && info.cache_admitted == 0 && info.decodes == 32 &&
	       info.cache_bytes == info.cache_probation_bytes &&
	       info.cache_bytes <= 4 * SMALL && info.cache_evictions >= 28;
	if (!*ok)
		ioc_test_diag("scan: misses %llu admitted %llu bytes %llu evictions %llu",
			      (unsigned long long)info.cache_misses,
			      (unsigned long long)info.cache_admitted,
			      (unsigned long long)info.cache_bytes,
			      (unsigned long long)info.cache_evictions);
	/* The same frames again: the ghost remembers most of the first 28
	 * (the last 4 are still on probation; a key that lost its ghost slot
	 * to another goes on probation again and pushes one of them out), so
	 * they are kept now... */
	for (unsigned n = 0; n < 32; n++)
		*ok &= check_range(img, text_frame(n) * SMALL + 200, 4096);
	ioc_zip_image_get_info(img, &info);
	uint64_t hits2 = info.cache_hits;

	*ok &= info.cache_admitted >= 24 && info.decodes <= 32 + 28 + 4;
	/* ... and a third pass hits them. */
	for (unsigned n = 0; n < 28; n++)
		*ok &= check_range(img, text_frame(n) * SMALL + 300, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.cache_hits - hits2 >= 24;
	if (!*ok)
		ioc_test_diag("again: hits %llu then %llu, admitted %llu decodes %llu",
			      (unsigned long long)hits2, (unsigned long long)info.cache_hits,
			      (unsigned long long)info.cache_admitted,
			      (unsigned long long)info.decodes);
}

/* 4 KiB reads walking through frames: probation keeps each frame from
 * its first read to its last, so each is decoded once. */
static void admission_walk(struct ioc_zip_image *img, bool *ok)
{
	struct ioc_zip_image_info info;

	for (uint64_t off = 40 * SMALL; off < 48 * SMALL; off += 4096)
		*ok &= check_range(img, off, 4096);
	ioc_zip_image_get_info(img, &info);
	*ok &= info.decodes == 8 && info.cache_misses == 8 && info.cache_hits == 24;
	if (!*ok)
		ioc_test_diag("walk: decodes %llu misses %llu hits %llu",
			      (unsigned long long)info.decodes,
			      (unsigned long long)info.cache_misses,
			      (unsigned long long)info.cache_hits);
}

static void test_admission(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true, .frame_cache = 64 * SMALL };
	struct ioc_zip_image *img;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, smallpath, &zo, msg, sizeof(msg)));
	run_one(img, admission_steps);
	ioc_zip_image_close(img);
	ASSERT_OK(ioc_zip_image_open(&img, smallpath, &zo, msg, sizeof(msg)));
	run_one(img, admission_walk);
	ioc_zip_image_close(img);
}

/* Two large reads of the same frames at once and a small read inside
 * them, all on one thread: the first claims frames 8-15 (text) and
 * decodes them into its buffer; the others, started while it waits for
 * the pool, wait on its claims and get copies.  Each frame is decoded
 * once.  Then the same on two threads (bytes only: who comes first is
 * up to the scheduler). */
static void test_inplace_decoded_once(void)
{
	struct ioc_zip_image_opts zo = { .no_readahead = true };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	struct reader rd[2][3];
	struct spawn sp[2];
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, smallpath, &zo, msg, sizeof(msg)));
	rd[0][0] = (struct reader){ .img = img, .reads = 1, .off = 8 * SMALL, .len = 8 * SMALL };
	rd[0][1] = rd[0][0];
	rd[0][2] = (struct reader){ .img = img, .reads = 1, .off = 9 * SMALL + 100, .len = 4096 };
	sp[0] = (struct spawn){ rd[0], 3 };
	run_readers(sp, 1);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.decodes, 8);
	ASSERT_UEQ(info.direct_decodes, 8);
	ASSERT_UEQ(info.cache_hits, 9);
	ASSERT_UEQ(info.cache_bytes, 0);
	ASSERT_UEQ(info.errors, 0);

	/* Frames 24-31 (text), from two threads at once. */
	for (int t = 0; t < 2; t++) {
		rd[t][0] = (struct reader){ .img = img, .reads = 1, .off = 24 * SMALL,
					    .len = 8 * SMALL };
		rd[t][1] = rd[t][0];
		rd[t][2] = (struct reader){ .img = img, .reads = 1,
					    .off = (26 + (unsigned)t) * SMALL + 100, .len = 4096 };
		sp[t] = (struct spawn){ rd[t], 3 };
	}
	run_readers(sp, 2);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.errors, 0);
	ioc_zip_image_close(img);
}

static void zero_frames_known_at_open(const char *file)
{
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	uint64_t pnum;
	char msg[256];

	ASSERT_OK(ioc_zip_image_open(&img, file, NULL, msg, sizeof(msg)));
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.frames, NFRAMES + 1);
	ASSERT_UEQ(info.zero_frames, NFRAMES / 4 + 1); /* the short last one too */
	ASSERT_EQ(ioc_zip_image_block_status(img, 0, SIZE, &pnum, 0), IOC_ZIP_STATUS_ZERO);
	ASSERT_UEQ(pnum, FRAME);
	ASSERT_EQ(ioc_zip_image_block_status(img, FRAME, SIZE - FRAME, &pnum, 0), 0);
	ASSERT_UEQ(pnum, 3 * FRAME);
	ASSERT_EQ(ioc_zip_image_block_status(img, SIZE, 1, &pnum, 0), -EINVAL);
	ASSERT_UEQ(info.decodes, 0);
	ioc_zip_image_close(img);
}

static void test_zero_frames_known_at_open(void)
{
	zero_frames_known_at_open(path);
}

/* Gzip members of zeros are deflate output, not RLE blocks: recognised
 * from their trailer and one decode at open, and the members of text,
 * which compress nearly as well, are not taken for zeros. */
static void test_gzip_zero_members_known_at_open(void)
{
	zero_frames_known_at_open(gzpath);
}

/* Frames of two sizes, as iocore-zip writes them: 16 KiB blocks, each
 * 64 KiB run of zeros one frame (zero_runs).  The runs are known at open
 * and reported whole, nothing is decoded for them, and random reads of
 * any length across runs and data (found by the bitmap of frame starts,
 * in units of 16 KiB: neither division nor search) through a small cache
 * read the right bytes. */
static void test_zero_run_frames(void)
{
	struct ioc_zip_image_opts zo = { .frame_cache = 16 * SMALL };
	struct ioc_zip_image *img;
	struct ioc_zip_image_info info;
	uint64_t pnum;
	char msg[256];
	/* Without libxxhash, checksummed runs are not merged. */
	size_t zeros = IOC_HAVE_XXHASH ? NFRAMES / 4 + 1 : (NFRAMES / 4) * (FRAME / SMALL) + 1;

	ASSERT_OK(ioc_zip_image_open(&img, runspath, &zo, msg, sizeof(msg)));
	ioc_zip_image_get_info(img, &info);
	/* A run cut by the end of a batch (about 1 MiB of blocks) is two
	 * frames: at most one more per MiB. */
	ASSERT_UGE(info.zero_frames, zeros);
	ASSERT_ULE(info.zero_frames, zeros + SIZE / (1u << 20) + 1);
	ASSERT_UEQ(info.frames, info.zero_frames + (NFRAMES * 3 / 4) * (FRAME / SMALL));
	ASSERT_EQ(ioc_zip_image_block_status(img, 0, SIZE, &pnum, 0), IOC_ZIP_STATUS_ZERO);
	ASSERT_UEQ(pnum, FRAME);
	ASSERT_EQ(ioc_zip_image_block_status(img, 4 * FRAME + 100, SIZE - 4 * FRAME - 100, &pnum,
					     0), IOC_ZIP_STATUS_ZERO);
	ASSERT_UEQ(pnum, FRAME - 100);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.decodes, 0);
	random_readers(img, 8, 40, 77);
	ioc_zip_image_get_info(img, &info);
	ASSERT_UEQ(info.errors, 0);
	ASSERT_UGT(info.decodes, 0);
	ioc_zip_image_close(img);
}

static void setup(void)
{
	raw = malloc(SIZE);
	ASSERT_NOT_NULL(raw);
	make_image(path, IOC_ZIP_ZSTD, FRAME, false, false);
	make_image(plainpath, IOC_ZIP_ZSTD, FRAME, false, true);
	make_image(gzpath, IOC_ZIP_GZIP, FRAME, false, false);
	make_image(smallpath, IOC_ZIP_ZSTD, SMALL, false, true);
	make_image(runspath, IOC_ZIP_ZSTD, SMALL, true, false);
}

static void cleanup(void)
{
	unlink(path);
	unlink(plainpath);
	unlink(gzpath);
	unlink(smallpath);
	unlink(runspath);
	free(raw);
}

IOC_TEST_MAIN(
	IOC_TEST(setup),
	IOC_TEST(test_zero_frames_known_at_open),
	IOC_TEST(test_gzip_zero_members_known_at_open),
	IOC_TEST(test_one_frame_decoded_once),
	IOC_TEST(test_random_reads_small_cache),
	IOC_TEST(test_cold_edge_reads),
	IOC_TEST(test_damaged_frame_inline),
	IOC_TEST(test_truncated_file),
	IOC_TEST(test_stored_checked_once),
	IOC_TEST(test_page_checked_reads),
	IOC_TEST(test_damaged_page),
	IOC_TEST(test_damaged_page_checks),
	IOC_TEST(test_readahead),
	IOC_TEST(test_direct_reads),
	IOC_TEST(test_admission),
	IOC_TEST(test_inplace_decoded_once),
	IOC_TEST(test_zero_run_frames),
	IOC_TEST(cleanup),
)
