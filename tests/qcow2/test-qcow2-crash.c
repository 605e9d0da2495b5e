/*
 * Crash points: the same short sequence of writes, write-zeroes,
 * discards and flushes runs again and again, and each time the file
 * stops taking requests at its k-th one (every write, flush and discard
 * from then on fails, as a disk that went away), for k spread over the
 * whole run.  A disk that loses power keeps what was flushed, and of the
 * writes since the last flush that completed, any subset (a cache writes
 * back in its own order): so the file is then rebuilt from its contents
 * at that flush and a seeded random subset of the writes issued since
 * (all of them, then random halves), each as it landed.  Every such
 * file must be an image `qemu-img check` finds no corruption in (leaked
 * clusters are allowed: a lost decrement), and every byte not written
 * since the last flush that succeeded must read as it did at that flush:
 * the driver's ordering rules (data, refcounts, L2, L1) with nothing
 * but flushes to order them.  With lazy refcounts each such file is
 * dirty, and a writable open must repair it to a clean image first.
 * With a persistent bitmap in the image, the crash may also hit the
 * close that writes it back: qemu-img must still read the directory,
 * and a bitmap it lists as not in use must hold every range the run
 * changed (a commit that came before its bits would lie).
 */
#include <limits.h>
#include <pthread.h>

#include "q2-test.h"
#include "src/blk/blk-int.h"

#define SIZE (2u << 20)
#define NOPS 48

struct op {
	int kind;               /* 0 write, 1 zero, 2 zero+unmap, 3 discard, 4 flush */
	uint64_t off, len;
	uint8_t pat;
};

#define SUBSETS 3          /* crash images per point: every write, two random halves */

static struct op ops[NOPS];
static bool with_bitmap;
static unsigned committed, in_use;

/*
 * The file's writes since its last flush, as the hook saw them: each
 * request's range, and its contents read back from the file when the
 * next request arrives (requests reach the file one at a time: the
 * test's one coroutine waits for each).  A flush takes the whole file as
 * the new base.  The hook runs on the thread that submits or on a pool
 * thread: the mutex orders it with the test's reads of the journal.
 */
struct jent {
	uint64_t off, len;
	uint8_t *data;          /* NULL until read back */
};

static struct {
	pthread_mutex_t lock;
	int fd;                 /* the image, for reading back */
	long left;              /* requests until the crash */
	long seen;
	uint8_t *base;
	size_t base_len;
	struct jent *ent;
	size_t nent, cap;
} jr = { .lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1 };

static uint8_t *read_whole(int fd, size_t *len)
{
	struct stat st;
	uint8_t *p;

	ASSERT_OK(fstat(fd, &st));
	*len = (size_t)st.st_size;
	p = malloc(*len + 1);
	ASSERT_NOT_NULL(p);
	ASSERT_EQ(pread(fd, p, *len, 0), (ssize_t)*len);
	return p;
}

/* Lock held: the last request's contents, now that it is done. */
static void capture_last(void)
{
	struct jent *e = jr.nent ? &jr.ent[jr.nent - 1] : NULL;

	if (!e || e->data)
		return;
	e->data = calloc(1, e->len ? e->len : 1);
	ASSERT_NOT_NULL(e->data);
	/* Past the file's end (a range cut short) reads as zeroes. */
	ASSERT_GE(pread(jr.fd, e->data, e->len, (off_t)e->off), 0);
}

static void journal_clear(void)
{
	for (size_t i = 0; i < jr.nent; i++)
		free(jr.ent[i].data);
	jr.nent = 0;
}

static int64_t crash_hook(void *opaque, enum blk_op op, uint64_t off, uint64_t len)
{
	int64_t ret = 0;

	(void)opaque;
	if (op == BLK_OP_READ)
		return 0;
	pthread_mutex_lock(&jr.lock);
	jr.seen++;
	capture_last();
	if (jr.left <= 0) {
		ret = -EIO;
	} else {
		jr.left--;
		if (op == BLK_OP_FLUSH) {
			/* Everything before it is done: the flush, once it
			 * completes (it does: the next request waits for it),
			 * makes the file as it is now the base. */
			free(jr.base);
			jr.base = read_whole(jr.fd, &jr.base_len);
			journal_clear();
		} else {
			if (jr.nent == jr.cap) {
				jr.cap = jr.cap ? jr.cap * 2 : 64;
				jr.ent = realloc(jr.ent, jr.cap * sizeof(*jr.ent));
				ASSERT_NOT_NULL(jr.ent);
			}
			jr.ent[jr.nent++] = (struct jent){ off, len, NULL };
		}
	}
	pthread_mutex_unlock(&jr.lock);
	return ret;
}

/* The file as a crash would leave it: the base, then the writes since
 * that subset keeps (variant 0: all; others: each with odds of one half
 * from x), in the order they were issued.  The file keeps its size. */
static void write_crash_image(const char *img, int variant, uint64_t x)
{
	size_t cur;
	uint8_t *now, *out;
	int fd = open(img, O_RDWR);
	size_t kept = 0;

	ASSERT_GE(fd, 0);
	now = read_whole(fd, &cur);
	free(now);
	out = calloc(1, cur + 1);
	ASSERT_NOT_NULL(out);
	memcpy(out, jr.base, jr.base_len < cur ? jr.base_len : cur);
	for (size_t i = 0; i < jr.nent; i++) {
		struct jent *e = &jr.ent[i];

		if (variant && (q2t_rand(&x) & 1))
			continue;
		kept++;
		if (e->off < cur)
			memcpy(out + e->off, e->data, e->len < cur - e->off ? e->len : cur - e->off);
	}
	ASSERT_EQ(pwrite(fd, out, cur, 0), (ssize_t)cur);
	close(fd);
	free(out);
	(void)kept;
}

/* After a crash: the image's bitmap b0 is in use (stale, as it says), or
 * it covers every request of the run (all of them marked: failed ones
 * too, as they may have changed part of their range). */
static void check_bitmap(const char *img, long limit)
{
	char err[512];
	struct ioc_node *n;
	struct ioc_blk_dirty *bm;
	struct ioc_blk_dirty_info info;

	if (q2t_sh("qemu-img info '%s' >/dev/null 2>&1", img) != 0) {
		q2t_sh("qemu-img info '%s'", img);
		ioc_test_fail(__FILE__, __LINE__, "crash after %ld writes: qemu-img info fails",
			      limit);
	}
	if (q2t_open("v", img, true, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "crash after %ld writes: %s", limit, err);
	bm = ioc_blk_dirty_find(n->dirty_set, "b0");
	/* Gone would be a bitmap lost: only where the extension's update is
	 * not one sector write (not so in this image). */
	if (!bm)
		ioc_test_fail(__FILE__, __LINE__, "crash after %ld writes: b0 is gone", limit);
	ioc_blk_dirty_get_info(bm, &info);
	if (info.inconsistent) {
		in_use++;
	} else {
		committed++;
		for (int i = 0; i < NOPS; i++) {
			uint64_t off = ops[i].off, end = ops[i].off + ops[i].len, len;

			if (ops[i].kind == 4)
				continue;
			for (; off < end; off += len)
				if (ioc_blk_dirty_extent(bm, off, end - off, &len) != 1)
					ioc_test_fail(__FILE__, __LINE__, "crash after %ld writes: "
						      "request %d (%" PRIu64 "+%" PRIu64 ") is not "
						      "in the committed bitmap at %" PRIu64, limit, i,
						      ops[i].off, ops[i].len, off);
		}
	}
	q2t_close(n);
}

struct run_arg {
	struct ioc_node *n;
	uint8_t *model, *flushed;
	bool *dirty;            /* changed since the last flush, or unknown */
	bool *unknown;          /* discarded: zeroes or what was there */
};

static void ioc_coroutine_fn run_co(void *opaque)
{
	struct run_arg *a = opaque;
	uint8_t *buf = malloc(256 << 10);

	for (int i = 0; i < NOPS; i++) {
		struct op *o = &ops[i];
		int ret;

		switch (o->kind) {
		case 0:
			memset(buf, o->pat, o->len);
			ret = ioc_node_co_pwrite(a->n, o->off, buf, o->len, 0);
			memset(a->model + o->off, o->pat, o->len);
			memset(a->unknown + o->off, 0, o->len);
			break;
		case 1:
		case 2:
			ret = ioc_node_co_write_zeroes(a->n, o->off, o->len,
						       o->kind == 2 ? IOC_NODE_MAY_UNMAP : 0);
			memset(a->model + o->off, 0, o->len);
			memset(a->unknown + o->off, 0, o->len);
			break;
		case 3:
			/* Discarded bytes read as zeroes or as before: unknown. */
			ret = ioc_node_co_discard(a->n, o->off, o->len, 0);
			memset(a->unknown + o->off, 1, o->len);
			break;
		default:
			ret = ioc_node_co_flush(a->n, 0);
			if (ret == 0) {
				memcpy(a->flushed, a->model, SIZE);
				memcpy(a->dirty, a->unknown, SIZE);
			}
			continue;
		}
		(void)ret;
		memset(a->dirty + o->off, 1, o->len);
	}
	free(buf);
}

static void make_ops(uint64_t x)
{
	for (int i = 0; i < NOPS; i++) {
		struct op *o = &ops[i];
		uint64_t r = q2t_rand(&x);
		int k = (int)(r % 16);

		o->kind = i % 8 == 7 ? 4 : k < 10 ? 0 : k < 12 ? 1 : k < 14 ? 2 : 3;
		o->len = (q2t_rand(&x) % (128 << 10)) / 512 * 512 + 512;
		o->off = (q2t_rand(&x) % (SIZE - o->len)) / 512 * 512;
		o->pat = (uint8_t)(q2t_rand(&x) | 1);
	}
}

/* One crash point: limit requests, or -1 for none.  Returns the number
 * of write, flush and discard requests the run made. */
static bool lazy;          /* lazy refcounts: each crash image repaired by an open first */

static long run_point(const char *good, const char *img, long limit, uint64_t seed)
{
	char err[512], *raw = q2t_path("crash.raw"), *copy = q2t_path("crash.qcow2");
	struct ioc_node *n;
	struct run_arg a;
	struct ioc_blk *blk;
	uint8_t *before = NULL;
	size_t rl;
	long seen;

	Q2T_SH_OK("cp '%s' '%s'", good, img);
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
	before = q2t_read_file(raw, &rl);
	ASSERT_UEQ(rl, SIZE);
	a.model = malloc(SIZE);
	a.flushed = before;
	a.dirty = calloc(1, SIZE);
	a.unknown = calloc(1, SIZE);
	memcpy(a.model, before, SIZE);
	ASSERT_OK(q2t_open("c", img, false, "\"discard\":\"unmap\"", &n, err, sizeof(err)));
	a.n = n;
	blk = ioc_node_blk(n->file);
	ASSERT_NOT_NULL(blk);
	/* The open's own writes are flushed: the file as it is is the base. */
	pthread_mutex_lock(&jr.lock);
	jr.fd = open(img, O_RDONLY);
	ASSERT_GE(jr.fd, 0);
	free(jr.base);
	jr.base = read_whole(jr.fd, &jr.base_len);
	journal_clear();
	jr.left = limit < 0 ? LONG_MAX : limit;
	jr.seen = 0;
	pthread_mutex_unlock(&jr.lock);
	ioc__blk_set_fault(blk, crash_hook, NULL);
	bt_run_co_fn(run_co, &a);
	q2t_close(n);
	pthread_mutex_lock(&jr.lock);
	capture_last();
	seen = jr.seen;
	pthread_mutex_unlock(&jr.lock);

	/* Without a crash, the file as it is; with one, each subset. */
	Q2T_SH_OK("cp '%s' '%s'", img, copy);
	for (int v = 0; v < (limit < 0 ? 1 : SUBSETS); v++) {
		if (limit >= 0) {
			Q2T_SH_OK("cp '%s' '%s'", copy, img);
			write_crash_image(img, v, seed * 7919 + (uint64_t)limit * 131 + (uint64_t)v);
		}
		if (lazy) {
			struct ioc_node *r;

			if (q2t_open("r", img, false, "", &r, err, sizeof(err)) < 0)
				ioc_test_fail(__FILE__, __LINE__, "crash after %ld requests (subset "
					      "%d): the repair refused: %s", limit, v, err);
			q2t_close(r);
		}
		/* 0: clean, 3: leaked clusters only (none after a repair). */
		int st = q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img);

		if (st != 0 && (st != 3 || lazy)) {
			q2t_sh("qemu-img check '%s'", img);
			ioc_test_fail(__FILE__, __LINE__, "crash after %ld requests (subset %d of "
				      "%zu writes since the flush): check says %d", limit, v, jr.nent,
				      st);
		}
		Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
		uint8_t *got = q2t_read_file(raw, &rl);

		ASSERT_UEQ(rl, SIZE);
		for (size_t i = 0; i < SIZE; i++)
			if (!a.dirty[i] && got[i] != a.flushed[i])
				ioc_test_fail(__FILE__, __LINE__, "crash after %ld requests (subset "
					      "%d): byte %zu is %02x, flushed as %02x", limit, v, i,
					      got[i], a.flushed[i]);
		free(got);
		if (with_bitmap)
			check_bitmap(img, limit);
	}
	pthread_mutex_lock(&jr.lock);
	close(jr.fd);
	jr.fd = -1;
	journal_clear();
	pthread_mutex_unlock(&jr.lock);
	unlink(raw);
	unlink(copy);
	free(raw);
	free(copy);
	free(a.model);
	free(a.dirty);
	free(a.unknown);
	free(before);
	return seen;
}

static void crash_run(const char *name, const char *setup, uint64_t x)
{
	char *good = q2t_path("good.qcow2"), *img = q2t_path("img.qcow2");
	long total, points = (long)ioc_test_scaled(16), step;

	Q2T_SH_OK("cd '%s' && IMG=good.qcow2 && %s", ioc_test_tmpdir(), setup);
	make_ops(x);
	total = run_point(good, img, -1, x);
	step = total / points > 0 ? total / points : 1;
	ioc_test_diag("%s: %ld requests, a crash every %ld, %d images each", name, total, step,
		      SUBSETS);
	for (long k = 0; k <= total; k += step)
		run_point(good, img, k, x);
	/* With a bitmap: every request of the close that stores it. */
	for (long k = total - 24; with_bitmap && k < total; k++)
		if (k > 0 && k % step)
			run_point(good, img, k, x);
	Q2T_SH_OK("cd '%s' && rm -f base.qcow2", ioc_test_tmpdir());
	unlink(good);
	unlink(img);
	free(good);
	free(img);
}

static void test_plain(void)
{
	crash_run("4 KiB clusters", "qemu-img create -q -f qcow2 -o cluster_size=4k $IMG 2M",
		  1);
}

static void test_small_clusters(void)
{
	/* New refcount blocks and a growing refcount table. */
	crash_run("512-byte clusters, 64-bit refcounts",
		  "qemu-img create -q -f qcow2 -o cluster_size=512,refcount_bits=64 $IMG 2M", 2);
}

static void test_backing_ext_l2(void)
{
	crash_run("extended L2 over a backing file",
		  "qemu-img create -q -f qcow2 base.qcow2 2M && qemu-io -f qcow2 -c "
		  "'write -P 0x21 0 2M' base.qcow2 >/dev/null && qemu-img create -q -f qcow2 "
		  "-o extended_l2=on,cluster_size=32k -b base.qcow2 -F qcow2 $IMG", 3);
}

static void test_snapshot(void)
{
	crash_run("internal snapshot",
		  "qemu-img create -q -f qcow2 -o cluster_size=4k $IMG 2M && qemu-io -f qcow2 "
		  "-c 'write -P 0x22 0 2M' $IMG >/dev/null && qemu-img snapshot -c s1 $IMG", 4);
}

static void test_lazy(void)
{
	/* Refcounts written after the L2 entries, or lost: each crash
	 * image is dirty, and the repair at open must make it clean. */
	lazy = true;
	crash_run("lazy refcounts, 4 KiB clusters",
		  "qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on $IMG 2M", 5);
	/* Shared clusters: counted twice, and copied on write. */
	crash_run("lazy refcounts, internal snapshot",
		  "qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on $IMG 2M && "
		  "qemu-io -f qcow2 -c 'write -P 0x22 0 2M' $IMG >/dev/null && qemu-img snapshot "
		  "-c s1 $IMG", 6);
	lazy = false;
}

static void test_bitmap(void)
{
	with_bitmap = true;
	crash_run("a persistent bitmap written back at close",
		  "qemu-img create -q -f qcow2 -o cluster_size=4k $IMG 2M && "
		  "qemu-img bitmap --add -g 4096 $IMG b0", 7);
	with_bitmap = false;
	ioc_test_diag("bitmap: %u crash images left it committed, %u in use", committed,
		      in_use);
	/* The run without a crash commits; the first crash points come
	 * before the close. */
	ASSERT_UGT(committed, 0);
	ASSERT_UGT(in_use, 0);
}

Q2T_MAIN(
	IOC_TEST(test_plain),
	IOC_TEST(test_small_clusters),
	IOC_TEST(test_backing_ext_l2),
	IOC_TEST(test_snapshot),
	IOC_TEST(test_lazy),
	IOC_TEST(test_bitmap),
)
