/*
 * Dirty images repaired at a writable open.  QEMU's own (qemu-io writes
 * with lazy refcounts, then aborts) and the driver's own (lazy
 * refcounts, L2 slices evicted to disk before their refcounts, then the
 * file stops taking writes) are left with refcounts `qemu-img check`
 * calls wrong; a writable open and close must leave them clean, without
 * the dirty bit, reading as they did.  Refcount blocks the table lost
 * are made again, and a repair that stops after any of its writes
 * leaves an image that is still dirty and that the next open repairs.
 */
#include <limits.h>
#include <stdatomic.h>

#include "q2-test.h"
#include "src/blk/blk-int.h"

static _Atomic long writes_left = LONG_MAX;
static _Atomic long writes_seen;

static int64_t stop_hook(void *opaque, enum blk_op op, uint64_t off, uint64_t len)
{
	(void)opaque;
	(void)off;
	(void)len;
	if (op == BLK_OP_READ)
		return 0;
	/* Relaxed: set before the node's first request, as in the crash test. */
	atomic_fetch_add_explicit(&writes_seen, 1, memory_order_relaxed);
	if (atomic_fetch_sub_explicit(&writes_left, 1, memory_order_relaxed) <= 0)
		return -EIO;
	return 0;
}

static uint64_t be_at(const char *path, uint64_t off, int bytes)
{
	uint8_t b[8];
	uint64_t v = 0;
	int fd = open(path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, b, (size_t)bytes, (off_t)off), bytes);
	close(fd);
	for (int i = 0; i < bytes; i++)
		v = v << 8 | b[i];
	return v;
}

static void put_zero(const char *path, uint64_t off, size_t len)
{
	uint8_t z[64] = { 0 };
	int fd = open(path, O_WRONLY);

	ASSERT_GE(fd, 0);
	ASSERT_TRUE(len <= sizeof(z));
	ASSERT_EQ(pwrite(fd, z, len, (off_t)off), (ssize_t)len);
	close(fd);
}

static bool dirty(const char *path)
{
	return be_at(path, 72, 8) & 1;
}

/* The qcow2 node over a file node of its own, whose writes the hook
 * sees from the first one (the repair runs inside the open). */
static int open_hooked(const char *path, const char *extra, struct ioc_node **out, char *err,
		       size_t errlen)
{
	char js[4096];
	json_t *o;
	json_error_t je;
	const char *cls;
	struct ioc_node *f;
	int ret;

	snprintf(js, sizeof(js), "{\"driver\":\"file\",\"node-name\":\"hf\",\"filename\":\"%s\"}",
		 path);
	o = json_loads(js, 0, &je);
	ASSERT_NOT_NULL(o);
	ASSERT_OK(ioc_node_add(q2t_get_graph(), o, &f, &cls, err, errlen));
	json_decref(o);
	ASSERT_NOT_NULL(ioc_node_blk(f));
	ioc__blk_set_fault(ioc_node_blk(f), stop_hook, NULL);
	snprintf(js, sizeof(js), "{\"driver\":\"qcow2\",\"node-name\":\"hq\",\"file\":\"hf\"%s%s}",
		 extra && extra[0] ? "," : "", extra ? extra : "");
	o = json_loads(js, 0, &je);
	ASSERT_NOT_NULL(o);
	err[0] = 0;
	ret = ioc_node_add(q2t_graph, o, out, &cls, err, errlen);
	json_decref(o);
	return ret;
}

static void close_hooked(struct ioc_node *n)
{
	char err[256];
	const char *cls;

	if (n)
		ASSERT_OK(ioc_node_del(q2t_graph, n->name, &cls, err, sizeof(err)));
	ASSERT_OK(ioc_node_del(q2t_graph, "hf", &cls, err, sizeof(err)));
}

/* Open writable and close: the repair; then clean, not dirty, and as raw. */
static void repair_and_compare(const char *img, const char *raw)
{
	char err[512];
	struct ioc_node *n;

	ASSERT_TRUE(dirty(img));
	if (q2t_open("r", img, false, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	q2t_close(n);
	ASSERT_TRUE(!dirty(img));
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	Q2T_SH_OK("qemu-img compare -q -f qcow2 -F raw '%s' '%s'", img, raw);
}

/* qemu-io's writes (a list of -c arguments) on a lazy-refcounts image
 * made by create, stopped by qemu-io's abort; the same writes (or
 * raw_writes, without compression) on raw. */
static void qemu_dirty2(const char *img, const char *raw, const char *create, uint64_t size,
			const char *writes, const char *raw_writes)
{
	Q2T_SH_OK("rm -f '%s' '%s' && qemu-img create -q -f qcow2 -o lazy_refcounts=on%s '%s' "
		  "%" PRIu64 " && qemu-img create -q -f raw '%s' %" PRIu64, img, raw, create, img,
		  size, raw, size);
	q2t_sh("qemu-io -f qcow2 %s -c abort '%s' >/dev/null 2>&1", writes, img);
	Q2T_SH_OK("qemu-io -f raw %s '%s' >/dev/null", raw_writes ? raw_writes : writes, raw);
}

static void qemu_dirty(const char *img, const char *raw, const char *create, uint64_t size,
		       const char *writes)
{
	qemu_dirty2(img, raw, create, size, writes, NULL);
}

static void test_qemu_dirty(void)
{
	static const struct {
		const char *name, *create;
		uint64_t size;
		const char *writes, *raw_writes;
		bool check_fails;       /* before the repair */
	} cases[] = {
		{ "4 KiB clusters", ",cluster_size=4k", 4 << 20,
		  "-c 'write -P 0x5a 0 256k' -c 'write -P 0x11 1M 64k' -c 'write -z 128k 8k'",
		  NULL, true },
		{ "512-byte clusters, 8-bit refcounts, several blocks",
		  ",cluster_size=512,refcount_bits=8", 4 << 20,
		  "-c 'write -P 0x33 0 1M' -c 'write -P 0x44 2M 512k' -c 'discard 64k 64k'",
		  NULL, true },
		{ "compressed clusters", "", 4 << 20,
		  "-c 'write -c -P 0x66 0 64k' -c 'write -c -P 0x67 64k 64k' "
		  "-c 'write -P 0x68 1M 4k'",
		  "-c 'write -P 0x66 0 64k' -c 'write -P 0x67 64k 64k' -c 'write -P 0x68 1M 4k'",
		  false },
		{ "extended L2", ",extended_l2=on,cluster_size=32k", 4 << 20,
		  "-c 'write -P 0x71 4k 8k' -c 'write -P 0x72 100k 2k' -c 'write -P 0x73 3M 64k'",
		  NULL, true },
	};
	char *img = q2t_path("q.qcow2"), *raw = q2t_path("q.raw");

	for (size_t i = 0; i < IOC_ARRAY_SIZE(cases); i++) {
		ioc_test_diag("%s", cases[i].name);
		qemu_dirty2(img, raw, cases[i].create, cases[i].size, cases[i].writes,
			    cases[i].raw_writes);
		if (cases[i].check_fails)
			ASSERT_NE(q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img), 0);
		repair_and_compare(img, raw);
	}
	unlink(img);
	unlink(raw);
	free(img);
	free(raw);
}

/* An internal snapshot: its clusters counted (shared ones twice), and
 * it still reads as it did. */
static void test_qemu_dirty_snapshot(void)
{
	char *img = q2t_path("s.qcow2"), *raw = q2t_path("s.raw"), *old = q2t_path("s0.raw");
	char *out = q2t_path("s1.raw");

	Q2T_SH_OK("rm -f '%s' && qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on "
		  "'%s' 2M && qemu-io -f qcow2 -c 'write -P 0x22 0 1M' '%s' >/dev/null && "
		  "qemu-img snapshot -c s1 '%s' && qemu-img convert -O raw '%s' '%s'", img, img,
		  img, img, img, old);
	Q2T_SH_OK("cp '%s' '%s' && qemu-io -f raw -c 'write -P 0x23 256k 64k' -c 'write -P 0x24 "
		  "1536k 8k' '%s' >/dev/null", old, raw, raw);
	q2t_sh("qemu-io -f qcow2 -c 'write -P 0x23 256k 64k' -c 'write -P 0x24 1536k 8k' -c abort "
	       "'%s' >/dev/null 2>&1", img);
	ASSERT_NE(q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img), 0);
	repair_and_compare(img, raw);
	Q2T_SH_OK("qemu-img convert -l s1 -O raw '%s' '%s' && cmp '%s' '%s'", img, out, out, old);
	unlink(img);
	unlink(raw);
	unlink(old);
	unlink(out);
	free(img);
	free(raw);
	free(old);
	free(out);
}

/* Persistent bitmaps (the directory and tables counted): no corruption
 * after the repair.  The driver does not keep bitmaps, so a writable
 * open clears their autoclear bit and their clusters become leaks. */
static void test_qemu_dirty_bitmap(void)
{
	char *img = q2t_path("b.qcow2"), *raw = q2t_path("b.raw");
	char err[512];
	struct ioc_node *n;
	int st;

	Q2T_SH_OK("rm -f '%s' && qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on "
		  "'%s' 2M && qemu-img bitmap --add '%s' b0 && qemu-img create -q -f raw '%s' 2M",
		  img, img, img, raw);
	q2t_sh("qemu-io -f qcow2 -c 'write -P 0x31 0 600k' -c abort '%s' >/dev/null 2>&1", img);
	Q2T_SH_OK("qemu-io -f raw -c 'write -P 0x31 0 600k' '%s' >/dev/null", raw);
	ASSERT_TRUE(dirty(img));
	ASSERT_TRUE(be_at(img, 88, 8) & 1);
	if (q2t_open("r", img, false, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	q2t_close(n);
	ASSERT_TRUE(!dirty(img));
	st = q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img);
	ASSERT_TRUE(st == 0 || st == 3);
	Q2T_SH_OK("qemu-img compare -q -f qcow2 -F raw '%s' '%s'", img, raw);
	unlink(img);
	unlink(raw);
	free(img);
	free(raw);
}

struct wr_arg {
	struct ioc_node *n;
	int phase;
	int ret;
};

/* Phase 0: data, then a flush; phase 1: more, over many L2 slices so
 * that a small cache writes them back (refcounts not yet written: lazy). */
static void ioc_coroutine_fn wr_co(void *opaque)
{
	struct wr_arg *a = opaque;
	uint8_t *buf = malloc(64 << 10);

	a->ret = 0;
	if (a->phase == 0) {
		memset(buf, 0x41, 64 << 10);
		for (uint64_t off = 0; off < (8u << 20) && a->ret == 0; off += 1 << 20)
			a->ret = ioc_node_co_pwrite(a->n, off, buf, 64 << 10, 0);
		if (a->ret == 0)
			a->ret = ioc_node_co_flush(a->n, 0);
	} else {
		memset(buf, 0x42, 64 << 10);
		for (uint64_t off = 128 << 10; off < (8u << 20) && a->ret == 0; off += 256 << 10)
			a->ret = ioc_node_co_pwrite(a->n, off, buf, 4096, 0);
	}
	free(buf);
}

static void test_own_crash(void)
{
	char *img = q2t_path("o.qcow2"), *raw = q2t_path("o.raw");
	char err[512];
	struct ioc_node *n;
	struct wr_arg a = { 0 };
	size_t rl;
	uint8_t *got;
	int st;

	Q2T_SH_OK("rm -f '%s' && qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on "
		  "'%s' 8M", img, img);
	atomic_store(&writes_left, LONG_MAX);
	if (open_hooked(img, "\"l2-cache-entry-size\":512,\"l2-cache-size\":4096", &n, err,
			sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	ASSERT_TRUE(dirty(img));
	a.n = n;
	bt_run_co_fn(wr_co, &a);
	ASSERT_OK(a.ret);
	a.phase = 1;
	bt_run_co_fn(wr_co, &a);
	ASSERT_OK(a.ret);
	/* The disk goes away: close writes nothing. */
	atomic_store(&writes_left, 0);
	close_hooked(n);
	atomic_store(&writes_left, LONG_MAX);
	ASSERT_TRUE(dirty(img));
	st = q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img);
	ioc_test_diag("qemu-img check before the repair: %d", st);
	ASSERT_NE(st, 0);

	if (q2t_open("r", img, false, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	q2t_close(n);
	ASSERT_TRUE(!dirty(img));
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	/* Flushed data reads back; the rest is the new data or the old. */
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
	got = q2t_read_file(raw, &rl);
	ASSERT_UEQ(rl, 8u << 20);
	for (size_t i = 0; i < rl; i++) {
		bool flushed = (i & ((1u << 20) - 1)) < (64u << 10);
		bool late = i >= (128u << 10) && (i - (128u << 10)) % (256u << 10) < 4096;
		uint8_t old = flushed ? 0x41 : 0;

		if (got[i] != old && !(late && got[i] == 0x42))
			ioc_test_fail(__FILE__, __LINE__, "byte %zu reads %02x", i, got[i]);
	}
	free(got);
	unlink(img);
	unlink(raw);
	free(img);
	free(raw);
}

/* 512-byte clusters, 16-bit refcounts: 256 clusters a block.  A dirty
 * image whose table lost its blocks past the first. */
static void make_lost_blocks(const char *img, const char *raw)
{
	uint64_t rt;

	qemu_dirty(img, raw, ",cluster_size=512", 2 << 20,
		   "-c 'write -P 0x51 0 300k' -c 'write -P 0x52 1M 200k'");
	rt = be_at(img, 48, 8);
	for (int i = 1; i < 8; i++)
		put_zero(img, rt + 8 * (uint64_t)i, 8);
}

static void test_lost_blocks(void)
{
	char *img = q2t_path("l.qcow2"), *raw = q2t_path("l.raw");

	make_lost_blocks(img, raw);
	ASSERT_NE(q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img), 0);
	repair_and_compare(img, raw);
	unlink(img);
	unlink(raw);
	free(img);
	free(raw);
}

/* The repair stopped after each of its writes: still dirty, and
 * repaired by the next open.  (In issue order; the crash test keeps
 * random subsets of the writes since a flush.) */
static void test_repair_stopped(void)
{
	char *img = q2t_path("p.qcow2"), *raw = q2t_path("p.raw"), *orig = q2t_path("p0.qcow2");
	char err[512];
	struct ioc_node *n;
	long total, clean = 0;

	make_lost_blocks(orig, raw);
	Q2T_SH_OK("cp '%s' '%s'", orig, img);
	atomic_store(&writes_left, LONG_MAX);
	atomic_store(&writes_seen, 0);
	if (open_hooked(img, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	total = atomic_load(&writes_seen);
	close_hooked(n);
	ioc_test_diag("the repair writes %ld times", total);
	ASSERT_GT(total, 3);
	for (long k = 0; k < total; k++) {
		Q2T_SH_OK("cp '%s' '%s'", orig, img);
		atomic_store(&writes_left, k);
		if (open_hooked(img, "", &n, err, sizeof(err)) == 0)
			ioc_test_fail(__FILE__, __LINE__, "opened with %ld of %ld writes", k, total);
		close_hooked(NULL);
		atomic_store(&writes_left, LONG_MAX);
		/* Clean only once the dirty bit's write went through, with
		 * everything before it flushed (the open's own writes follow:
		 * lazy refcounts mark the image dirty again). */
		if (dirty(img)) {
			repair_and_compare(img, raw);
		} else {
			clean++;
			Q2T_SH_OK("qemu-img check -q '%s'", img);
			Q2T_SH_OK("qemu-img compare -q -f qcow2 -F raw '%s' '%s'", img, raw);
		}
	}
	/* The last ones: the dirty bit cleared, its flush, the open's own. */
	ASSERT_LE(clean, 4);
	unlink(img);
	unlink(raw);
	unlink(orig);
	free(img);
	free(raw);
	free(orig);
}

Q2T_MAIN(
	IOC_TEST(test_qemu_dirty),
	IOC_TEST(test_qemu_dirty_snapshot),
	IOC_TEST(test_qemu_dirty_bitmap),
	IOC_TEST(test_own_crash),
	IOC_TEST(test_lost_blocks),
	IOC_TEST(test_repair_stopped),
)
