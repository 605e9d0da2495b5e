/*
 * An image on tmpfs regrouped into huge pages in the background (huge.c):
 * the bytes stay the same, holes stay holes (their 2 MiB ranges are
 * skipped), writes made while the pass runs land, IOC_BLK_HUGE=off keeps it
 * from starting, and closing in the middle of a pass stops it.
 */
#include <linux/falloc.h>

#include "blk-test.h"
#include "src/blk/blk-int.h"

#define MIB (1u << 20)
#define SZ  (8u * MIB) /* four 2 MiB ranges; the third one has a hole */

static char *make_holey(void)
{
	char *path = bt_make_image(NULL, "huge.img", SZ, true);
	int fd = open(path, O_RDWR);

	ASSERT_GE(fd, 0);
	/* A 64 KiB hole inside the third range. */
	ASSERT_OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			    4 * MIB + 512 * 1024, 65536));
	close(fd);
	return path;
}

static bool on_tmpfs_without_swap(struct ioc_blk *blk)
{
	return blk->never_waits;
}

static void test_collapse_keeps_bytes_and_holes(void)
{
	char *path = make_holey();
	unsigned char *before = malloc(SZ), *after = malloc(SZ);
	struct ioc_blk_opts o = { 0 };
	struct ioc_blk *blk;
	unsigned done, skipped;

	bt_read_file(path, before, SZ);
	ASSERT_OK(ioc_blk_open(&blk, path, &o));
	if (!on_tmpfs_without_swap(blk)) {
		ioc_blk_close(blk);
		unlink(path);
		IOC_SKIP("the image is not on tmpfs without swap");
	}
	int err = ioc__blk_huge_wait(blk, &done, &skipped);
	ioc_blk_close(blk);
	if (err == -EINVAL || err == -ENOMEM) {
		unlink(path);
		IOC_SKIP("the kernel collapses no tmpfs pages here");
	}
	ASSERT_EQ(err, 0);
	/* Ranges 0, 1 and 3 collapsed (or busy: EAGAIN skips), 2 skipped. */
	ASSERT_EQ(done + skipped, 4u);
	ASSERT_GE(skipped, 1u);
	bt_read_file(path, after, SZ);
	ASSERT_MEM_EQ(before, after, SZ);
	int fd = open(path, O_RDONLY);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(lseek(fd, 4 * MIB, SEEK_HOLE), (off_t)(4 * MIB + 512 * 1024));
	close(fd);
	free(before);
	free(after);
	unlink(path);
	free(path);
}

struct wr {
	struct ioc_blk *blk;
	uint64_t off;
	unsigned char byte;
	int ret;
};

static void ioc_coroutine_fn do_write(void *arg)
{
	struct wr *w = arg;
	unsigned char *buf = malloc(65536);
	struct iovec iov = { buf, 65536 };

	memset(buf, w->byte, 65536);
	w->ret = ioc_blk_co_pwritev(w->blk, w->off, &iov, 1, 0);
	free(buf);
}

/* Writes while the pass runs: every one of them is in the file after it. */
static void test_writes_during_pass(void)
{
	char *path = bt_make_image(NULL, "huge-w.img", 32u * MIB, true);
	unsigned char *want = malloc(32u * MIB), *got = malloc(32u * MIB);
	struct ioc_blk_opts o = { 0 };
	struct ioc_blk *blk;
	unsigned done, skipped;

	bt_read_file(path, want, 32u * MIB);
	ASSERT_OK(ioc_blk_open(&blk, path, &o));
	for (unsigned i = 0; i < 64; i++) {
		struct wr w = { blk, (uint64_t)i * 512 * 1024 + 4096, (unsigned char)(i + 1), 1 };

		bt_run_co_fn(do_write, &w);
		ASSERT_EQ(w.ret, 0);
		memset(want + w.off, w.byte, 65536);
	}
	int err = ioc__blk_huge_wait(blk, &done, &skipped);
	ASSERT_TRUE(err == 0 || err == -EINVAL || err == -ENOMEM);
	ioc_blk_close(blk);
	bt_read_file(path, got, 32u * MIB);
	ASSERT_MEM_EQ(want, got, 32u * MIB);
	free(want);
	free(got);
	unlink(path);
	free(path);
}

static void test_off_by_environment(void)
{
	char *path = bt_make_image(NULL, "huge-off.img", SZ, true);
	struct ioc_blk_opts o = { 0 };
	struct ioc_blk *blk;
	unsigned done = 1, skipped = 1;

	setenv("IOC_BLK_HUGE", "off", 1);
	ASSERT_OK(ioc_blk_open(&blk, path, &o));
	unsetenv("IOC_BLK_HUGE");
	ASSERT_FALSE(blk->huge_running);
	ASSERT_EQ(ioc__blk_huge_wait(blk, &done, &skipped), 0);
	ASSERT_EQ(done, 0u);
	ASSERT_EQ(skipped, 0u);
	ioc_blk_close(blk);
	unlink(path);
	free(path);
}

/* Closed at once: the pass stops between ranges; close returns and the
 * bytes are intact (the sanitizer builds check the thread's end).  Once
 * stopped by ioc_blk_stop_background() first (what a migration calls):
 * the thread is joined when it returns, whatever it had done, and a second
 * call is harmless. */
static void test_close_mid_pass(void)
{
	char *path = bt_make_image(NULL, "huge-c.img", 64u * MIB, true);
	unsigned char *want = malloc(64u * MIB), *got = malloc(64u * MIB);
	struct ioc_blk_opts o = { 0 };
	struct ioc_blk *blk;

	bt_read_file(path, want, 64u * MIB);
	for (int i = 0; i < 3; i++) {
		unsigned done = 0, skipped = 0, done2 = 0, skipped2 = 0;

		ASSERT_OK(ioc_blk_open(&blk, path, &o));
		if (i == 1) {
			ioc_blk_stop_background(blk);
			ASSERT_FALSE(blk->huge_running);
			ASSERT_EQ(ioc__blk_huge_wait(blk, &done, &skipped), 0);
			ASSERT_TRUE(done + skipped <= 32u);
			ioc_blk_stop_background(blk);
			ASSERT_EQ(ioc__blk_huge_wait(blk, &done2, &skipped2), 0);
			ASSERT_EQ(done2, done);
			ASSERT_EQ(skipped2, skipped);
		}
		ioc_blk_close(blk);
	}
	bt_read_file(path, got, 64u * MIB);
	ASSERT_MEM_EQ(want, got, 64u * MIB);
	free(want);
	free(got);
	unlink(path);
	free(path);
}

IOC_TEST_MAIN(
	IOC_TEST(test_collapse_keeps_bytes_and_holes),
	IOC_TEST(test_writes_during_pass),
	IOC_TEST(test_off_by_environment),
	IOC_TEST(test_close_mid_pass),
)
