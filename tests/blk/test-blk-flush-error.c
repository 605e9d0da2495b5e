/*
 * The write-back error rule (blk.c, "Write-back errors"): once a flush
 * fails, every later flush and FUA request fails with the same error, even
 * though the file system would now report success; reads and plain writes
 * go on.  The failing flush is injected through the fault hook, once, so
 * the later flushes reach a healthy fdatasync: without the rule they would
 * succeed and this test fails.  Every backend, both APIs' paths (the
 * coroutine API here, FUA write-zeroes through io_uring's flush step).
 */
#include <stdatomic.h>

#include "blk-test.h"
#include "src/blk/blk-int.h"

#define IMG_SIZE (1024 * 1024)

/* Fail the first n flush attempts with err; count every attempt. */
struct flush_fault {
	int err;
	_Atomic int left;
	_Atomic int flushes;
};

static int64_t flush_fault_fn(void *opaque, enum blk_op op, uint64_t offset,
			      uint64_t len)
{
	struct flush_fault *f = opaque;

	if (op != BLK_OP_FLUSH)
		return 0;
	/* Relaxed: read after the requests completed (their completions
	 * order them with the test's thread). */
	atomic_fetch_add_explicit(&f->flushes, 1, memory_order_relaxed);
	if (atomic_fetch_sub_explicit(&f->left, 1, memory_order_relaxed) > 0)
		return f->err;
	return 0;
}

struct case_arg {
	struct ioc_blk *blk;
	struct flush_fault *f;
	int err;
};

static void ioc_coroutine_fn sticky_case(void *opaque)
{
	struct case_arg *a = opaque;
	struct ioc_blk *blk = a->blk;
	static char buf[4096] __attribute__((aligned(4096)));
	struct iovec iov = { buf, sizeof(buf) };

	memset(buf, 0x6b, sizeof(buf));
	/* Healthy: a write, then a clean flush. */
	ASSERT_EQ(ioc_blk_co_pwritev(blk, 0, &iov, 1, 0), 0);
	ASSERT_EQ(ioc_blk_co_flush(blk, 0), 0);
	/* The write-back error: the next flush fails ... */
	atomic_store(&a->f->left, 1);
	ASSERT_EQ(ioc_blk_co_pwritev(blk, 4096, &iov, 1, 0), 0);
	ASSERT_EQ(ioc_blk_co_flush(blk, 0), a->err);
	int before = atomic_load(&a->f->flushes);
	/* ... and so does every later one, without reaching the disk ... */
	ASSERT_EQ(ioc_blk_co_flush(blk, 0), a->err);
	ASSERT_EQ(ioc_blk_co_flush(blk, 0), a->err);
	ASSERT_EQ(ioc_blk_co_pwritev(blk, 8192, &iov, 1, IOC_BLK_FUA), a->err);
	ASSERT_EQ(ioc_blk_co_write_zeroes(blk, 8192, 4096, IOC_BLK_FUA), a->err);
	ASSERT_EQ(atomic_load(&a->f->flushes), before);
	/* ... while reads, plain writes, zeroes and discards still work. */
	ASSERT_EQ(ioc_blk_co_pwritev(blk, 12288, &iov, 1, 0), 0);
	memset(buf, 0, sizeof(buf));
	ASSERT_EQ(ioc_blk_co_preadv(blk, 12288, &iov, 1, 0), 0);
	ASSERT_EQ(buf[0], 0x6b);
	ASSERT_EQ(buf[4095], 0x6b);
	ASSERT_EQ(ioc_blk_co_write_zeroes(blk, 16384, 4096, 0), 0);
	ASSERT_EQ(ioc_blk_co_discard(blk, 20480, 4096, 0), 0);
}

static void ioc_coroutine_fn still_failing(void *opaque)
{
	struct case_arg *a = opaque;

	ASSERT_EQ(ioc_blk_co_flush(a->blk, 0), a->err);
}

static void ioc_coroutine_fn clean_after_reopen(void *opaque)
{
	struct ioc_blk *blk = opaque;

	ASSERT_EQ(ioc_blk_co_flush(blk, 0), 0);
}

static void run_sticky(const struct bt_config *c, int err)
{
	struct ioc_blk_opts opts = { .aio = c->aio, .cache = c->cache,
				     .no_fast_path = c->no_fast_path };
	const char *dir = c->cache == IOC_BLK_CACHE_NONE ? bt_disk_dir() : NULL;
	struct flush_fault f = { .err = err };
	struct case_arg a = { .f = &f, .err = err };
	char *path;
	int r;

	if (c->cache == IOC_BLK_CACHE_NONE && !dir)
		return; /* no disk file system for O_DIRECT: covered by the rest */
	path = bt_make_image(dir, "flush-error.img", IMG_SIZE, false);
	bt_get_loop();
	r = ioc_blk_open(&a.blk, path, &opts);
	if (r == -EINVAL && c->cache == IOC_BLK_CACHE_NONE) {
		/* The kernel refuses O_DIRECT on this file system. */
		unlink(path);
		free(path);
		return;
	}
	ASSERT_OK(r);
	ioc__blk_set_fault(a.blk, flush_fault_fn, &f);
	bt_run_co_fn(sticky_case, &a);
	/* Still failing with no hook at all: the error belongs to the image. */
	ioc__blk_set_fault(a.blk, NULL, NULL);
	bt_run_co_fn(still_failing, &a);
	ioc_blk_close(a.blk);
	/* A fresh open starts clean (the operator's restart). */
	ASSERT_OK(ioc_blk_open(&a.blk, path, &opts));
	bt_run_co_fn(clean_after_reopen, a.blk);
	ioc_blk_close(a.blk);
	unlink(path);
	free(path);
}

static void test_sticky_eio(void)
{
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bt_configs); i++)
		run_sticky(&bt_configs[i], -EIO);
}

static void test_sticky_enospc(void)
{
	/* ENOSPC from a flush (thin provisioning, NFS) drops data too. */
	run_sticky(&bt_configs[0], -ENOSPC);
	run_sticky(&bt_configs[3], -ENOSPC);
}

static void ioc_coroutine_fn fua_enospc(void *opaque)
{
	struct case_arg *a = opaque;
	static char buf[4096];
	struct iovec iov = { buf, sizeof(buf) };

	/* A FUA write refused for space taints nothing: the allocation
	 * failed before anything reached the cache. */
	ASSERT_EQ(ioc_blk_co_pwritev(a->blk, 0, &iov, 1, IOC_BLK_FUA), -ENOSPC);
	ASSERT_EQ(ioc_blk_co_flush(a->blk, 0), 0);
	ASSERT_EQ(ioc_blk_co_pwritev(a->blk, 0, &iov, 1, IOC_BLK_FUA), 0);
}

static int64_t write_enospc_once(void *opaque, enum blk_op op, uint64_t offset,
				 uint64_t len)
{
	_Atomic int *left = opaque;

	if (op == BLK_OP_WRITE &&
	    atomic_fetch_sub_explicit(left, 1, memory_order_relaxed) > 0)
		return -ENOSPC;
	return 0;
}

static void test_fua_enospc_not_sticky(void)
{
	char *path = bt_make_image(NULL, "fua.img", IMG_SIZE, false);
	struct case_arg a = { 0 };
	_Atomic int left = 1;

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&a.blk, path, NULL));
	ioc__blk_set_fault(a.blk, write_enospc_once, &left);
	bt_run_co_fn(fua_enospc, &a);
	ioc__blk_set_fault(a.blk, NULL, NULL);
	ioc_blk_close(a.blk);
	unlink(path);
	free(path);
}

static void test_cleanup(void)
{
	rmdir(ioc_test_tmpdir());
	ioc_loop_free(bt_loop);
	bt_loop = NULL;
}

IOC_TEST_MAIN(
	IOC_TEST(test_sticky_eio),
	IOC_TEST(test_sticky_enospc),
	IOC_TEST(test_fua_enospc_not_sticky),
	IOC_TEST(test_cleanup),
)
