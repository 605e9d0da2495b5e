/*
 * The block layer's verbs one by one: FUA and flush reach the disk
 * (cachestat(2) sees no dirty pages afterwards), discard and write-zeroes
 * leave holes or allocated zeroes as asked, the callback API never calls
 * back inside the submitting call, the null driver, truncate, bounds and
 * read-only checks, large writes on the image's writer thread.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "blk-test.h"
#include "src/blk/blk-int.h"

#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

struct bt_cachestat_range { uint64_t off, len; };
struct bt_cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* Dirty pages of [off, off+len) (len 0: to the end), or -errno. */
static int64_t dirty_pages(const char *path, uint64_t off, uint64_t len)
{
	struct bt_cachestat_range r = { off, len };
	struct bt_cachestat cs = { 0 };
	int fd = open(path, O_RDONLY);
	long ret;

	ASSERT_GE(fd, 0);
	ret = syscall(__NR_cachestat, fd, &r, &cs, 0);
	close(fd);
	if (ret < 0)
		return -errno;
	return (int64_t)(cs.nr_dirty + cs.nr_writeback);
}

struct fua_arg {
	struct ioc_blk *blk;
	const char *path;
};

static void ioc_coroutine_fn fua_body(void *opaque)
{
	struct fua_arg *a = opaque;
	static char buf[65536];
	struct iovec iov = { buf, sizeof(buf) };

	memset(buf, 0xab, sizeof(buf));
	/* A plain write stays in the page cache (unless background writeback
	 * happens to run right now: then say so, the checks below still
	 * hold)... */
	ASSERT_OK(ioc_blk_co_pwritev(a->blk, 0, &iov, 1, 0));
	if (dirty_pages(a->path, 0, sizeof(buf)) == 0)
		ioc_test_diag("plain write already clean: writeback is running");
	/* ...a FUA write does not (its own range)... */
	ASSERT_OK(ioc_blk_co_pwritev(a->blk, 1 << 20, &iov, 1, IOC_BLK_FUA));
	ASSERT_EQ(dirty_pages(a->path, 1 << 20, sizeof(buf)), 0);
	/* ...and a flush cleans the rest. */
	ASSERT_OK(ioc_blk_co_flush(a->blk, 0));
	ASSERT_EQ(dirty_pages(a->path, 0, 0), 0);
	/* FUA write-zeroes as well. */
	ASSERT_OK(ioc_blk_co_pwritev(a->blk, 0, &iov, 1, 0));
	ASSERT_OK(ioc_blk_co_write_zeroes(a->blk, 2 << 20, sizeof(buf), IOC_BLK_FUA));
	ASSERT_EQ(dirty_pages(a->path, 2 << 20, sizeof(buf)), 0);
	ASSERT_OK(ioc_blk_co_flush(a->blk, 0));
	ASSERT_EQ(dirty_pages(a->path, 0, 0), 0);
}

static void test_fua_flush(void)
{
	const char *dir = bt_disk_dir();

	if (!dir)
		IOC_SKIP("no disk directory");
	for (int aio = 0; aio < 2; aio++) {
		struct ioc_blk_opts opts = {
			.aio = aio ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING };
		struct fua_arg a;
		char *path = bt_make_image(dir, "fua.img", 4 << 20, false);

		if (dirty_pages(path, 0, 0) < 0) {
			unlink(path);
			free(path);
			IOC_SKIP("no cachestat(2)");
		}
		bt_get_loop();
		ASSERT_OK(ioc_blk_open(&a.blk, path, &opts));
		a.path = path;
		bt_run_co_fn(fua_body, &a);
		ioc_blk_close(a.blk);
		unlink(path);
		free(path);
	}
	rmdir(dir);
}

struct hole_arg {
	struct ioc_blk *blk;
	int fd;
};

static bool is_hole(int fd, off_t off)
{
	off_t d = lseek(fd, off, SEEK_DATA);

	return d < 0 ? errno == ENXIO : d > off;
}

/* Bytes allocated to the file. */
static int64_t allocated(int fd)
{
	struct stat st;

	ASSERT_EQ(fstat(fd, &st), 0);
	return (int64_t)st.st_blocks * 512;
}

static void check_zero(struct ioc_blk *blk, uint64_t off, uint64_t len)
{
	char *buf = malloc(len), *zero = calloc(1, len);
	struct iovec iov = { buf, len };

	memset(buf, 1, len);
	ASSERT_OK(ioc_blk_co_preadv(blk, off, &iov, 1, 0));
	ASSERT_MEM_EQ(buf, zero, len);
	free(buf);
	free(zero);
}

static void ioc_coroutine_fn holes_body(void *opaque)
{
	struct hole_arg *a = opaque;
	uint64_t pnum;

	ASSERT_FALSE(is_hole(a->fd, 0));
	/* discard punches a hole */
	ASSERT_OK(ioc_blk_co_discard(a->blk, 0, 64 * 1024, 0));
	ASSERT_TRUE(is_hole(a->fd, 0));
	check_zero(a->blk, 0, 64 * 1024);
	ASSERT_EQ(ioc_blk_co_block_status(a->blk, 0, 1 << 20, &pnum, 0),
		  IOC_BLK_STATUS_ZERO);
	ASSERT_UEQ(pnum, 64 * 1024);
	ASSERT_EQ(ioc_blk_co_block_status(a->blk, 64 * 1024, 1 << 20, &pnum, 0),
		  IOC_BLK_STATUS_DATA);
	/* write-zeroes with MAY_UNMAP punches too (frees the blocks) */
	int64_t blocks = allocated(a->fd);

	ASSERT_OK(ioc_blk_co_write_zeroes(a->blk, 128 * 1024, 64 * 1024, IOC_BLK_MAY_UNMAP));
	ASSERT_TRUE(is_hole(a->fd, 128 * 1024));
	check_zero(a->blk, 128 * 1024, 64 * 1024);
	ASSERT_LE(allocated(a->fd), blocks - 64 * 1024);
	/* without it the zeroes stay allocated (SEEK_DATA may still call
	 * them a hole: tmpfs and ext4 treat unwritten extents so) */
	blocks = allocated(a->fd);
	ASSERT_OK(ioc_blk_co_write_zeroes(a->blk, 256 * 1024, 64 * 1024, 0));
	ASSERT_EQ(allocated(a->fd), blocks);
	check_zero(a->blk, 256 * 1024, 64 * 1024);
	ASSERT_GT(ioc_blk_co_block_status(a->blk, 256 * 1024, 64 * 1024, &pnum, 0), 0);
	ASSERT_UEQ(pnum, 64 * 1024);
	/* NO_FALLBACK: fine when a fast way exists */
	ASSERT_OK(ioc_blk_co_write_zeroes(a->blk, 384 * 1024, 64 * 1024,
					  IOC_BLK_NO_FALLBACK));
	check_zero(a->blk, 384 * 1024, 64 * 1024);
	/* misaligned zeroes keep their neighbours */
	ASSERT_OK(ioc_blk_co_write_zeroes(a->blk, 512 * 1024 + 100, 5000, 0));
	check_zero(a->blk, 512 * 1024 + 100, 5000);
	{
		unsigned char b[2];
		struct iovec iov = { b, 1 };

		ASSERT_OK(ioc_blk_co_preadv(a->blk, 512 * 1024 + 99, &iov, 1, 0));
		ASSERT_EQ(b[0], (unsigned char)((512 * 1024 + 99) * 7 + 3));
		ASSERT_OK(ioc_blk_co_preadv(a->blk, 512 * 1024 + 5100, &iov, 1, 0));
		ASSERT_EQ(b[0], (unsigned char)((512 * 1024 + 5100) * 7 + 3));
	}
	/* out of range */
	ASSERT_EQ(ioc_blk_co_discard(a->blk, 1 << 20, 4096, 0), -EINVAL);
	ASSERT_EQ(ioc_blk_co_write_zeroes(a->blk, (1 << 20) - 4096, 8192, 0), -EINVAL);
	ASSERT_EQ(ioc_blk_co_write_zeroes(a->blk, 0, 4096, 1u << 30), -EINVAL);
}

static void run_holes(const char *dir, enum ioc_blk_aio aio, enum ioc_blk_cache cache)
{
	struct ioc_blk_opts opts = { .aio = aio, .cache = cache };
	char *path = bt_make_image(dir, "holes.img", 1 << 20, true);
	struct hole_arg a;

	a.fd = open(path, O_RDONLY);
	ASSERT_GE(a.fd, 0);
	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&a.blk, path, &opts));
	bt_run_co_fn(holes_body, &a);
	ioc_blk_close(a.blk);
	close(a.fd);
	unlink(path);
	free(path);
}

static void test_discard_zeroes(void)
{
	const char *disk = bt_disk_dir();

	for (int aio = 0; aio < 2; aio++) {
		enum ioc_blk_aio m = aio ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING;

		run_holes(NULL, m, IOC_BLK_CACHE_WRITEBACK);
		if (disk) {
			run_holes(disk, m, IOC_BLK_CACHE_WRITEBACK);
			run_holes(disk, m, IOC_BLK_CACHE_NONE);
		}
	}
	if (disk)
		rmdir(disk);
}

/* ---- callback API --------------------------------------------------- */

struct cb_state {
	bool in_submit;
	int calls;
	int ret;
	struct ioc_loop *loop;
};

static void cb_done(struct ioc_blk_req *req, int ret)
{
	struct cb_state *s = req->opaque;

	ASSERT_FALSE(s->in_submit);
	ASSERT_TRUE(ioc_loop_in_thread(s->loop) || ioc_loop_current() == s->loop);
	s->calls++;
	s->ret = ret;
}

static void wait_calls(struct cb_state *s, int n)
{
	while (s->calls < n)
		ioc_loop_poll(bt_loop, true);
	ASSERT_EQ(s->calls, n);
}

static void run_cb(struct ioc_blk *blk, bool check_data)
{
	struct cb_state s = { .loop = bt_get_loop() };
	struct ioc_blk_req req;
	char buf[8192], check[8192];
	struct iovec iov = { buf, sizeof(buf) };

	memset(buf, 0x3c, sizeof(buf));
	s.in_submit = true;
	ioc_blk_pwritev(blk, &req, 4096, &iov, 1, 0, cb_done, &s);
	s.in_submit = false;
	wait_calls(&s, 1);
	ASSERT_EQ(s.ret, 0);

	/* twice: the second read is a page-cache hit (fast path) */
	for (int i = 0; i < 2; i++) {
		memset(buf, 0, sizeof(buf));
		s.in_submit = true;
		ioc_blk_preadv(blk, &req, 4096, &iov, 1, 0, cb_done, &s);
		s.in_submit = false;
		wait_calls(&s, 2 + i);
		ASSERT_EQ(s.ret, 0);
		memset(check, 0x3c, sizeof(check));
		if (check_data)
			ASSERT_MEM_EQ(buf, check, sizeof(buf));
	}

	s.in_submit = true;
	ioc_blk_flush(blk, &req, 0, cb_done, &s);
	s.in_submit = false;
	wait_calls(&s, 4);
	ASSERT_EQ(s.ret, 0);

	s.in_submit = true;
	ioc_blk_discard(blk, &req, 0, 4096, 0, cb_done, &s);
	s.in_submit = false;
	wait_calls(&s, 5);
	ASSERT_EQ(s.ret, 0);

	s.in_submit = true;
	ioc_blk_write_zeroes(blk, &req, 4096, 4096, IOC_BLK_MAY_UNMAP, cb_done, &s);
	s.in_submit = false;
	wait_calls(&s, 6);
	ASSERT_EQ(s.ret, 0);

	/* errors are delivered the same way */
	s.in_submit = true;
	ioc_blk_preadv(blk, &req, (uint64_t)ioc_blk_size(blk), &iov, 1, 0, cb_done, &s);
	s.in_submit = false;
	wait_calls(&s, 7);
	ASSERT_EQ(s.ret, -EINVAL);
}

/* A callback that submits the next request on the same struct ioc_blk_req
 * (the usual pattern of a server's request slot). */
struct chain {
	struct ioc_blk *blk;
	struct ioc_blk_req req;
	char buf[4096];
	struct iovec iov;
	unsigned left, done;
	int err;
};

static void chain_cb(struct ioc_blk_req *req, int ret)
{
	struct chain *c = req->opaque;

	c->done++;
	if (ret < 0 && !c->err)
		c->err = ret;
	if (--c->left == 0)
		return;
	if (c->left % 3 == 0)
		ioc_blk_pwritev(c->blk, req, (c->left % 64) * 4096, &c->iov, 1, 0,
				chain_cb, c);
	else if (c->left % 7 == 0)
		ioc_blk_flush(c->blk, req, 0, chain_cb, c);
	else
		ioc_blk_preadv(c->blk, req, (c->left % 64) * 4096, &c->iov, 1, 0,
			       chain_cb, c);
}

static void run_chain(struct ioc_blk *blk)
{
	struct chain c[4];

	for (int i = 0; i < 4; i++) {
		c[i] = (struct chain){ .blk = blk, .left = (unsigned)ioc_test_scaled(500) };
		c[i].iov.iov_base = c[i].buf;
		c[i].iov.iov_len = sizeof(c[i].buf);
		memset(c[i].buf, i, sizeof(c[i].buf));
		ioc_blk_preadv(blk, &c[i].req, 0, &c[i].iov, 1, 0, chain_cb, &c[i]);
	}
	for (int i = 0; i < 4; i++) {
		while (c[i].left)
			ioc_loop_poll(bt_loop, true);
		ASSERT_EQ(c[i].err, 0);
		ASSERT_EQ(c[i].done, ioc_test_scaled(500));
	}
}

static void test_callback_api(void)
{
	for (int aio = 0; aio < 2; aio++) {
		struct ioc_blk_opts opts = {
			.aio = aio ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING };
		char *path = bt_make_image(NULL, "cb.img", 1 << 20, true);
		struct ioc_blk *blk;

		bt_get_loop();
		ASSERT_OK(ioc_blk_open(&blk, path, &opts));
		run_cb(blk, true);
		run_chain(blk);
		ioc_blk_close(blk);
		unlink(path);
		free(path);
	}
	{
		struct ioc_blk_opts opts = { .driver = IOC_BLK_DRIVER_NULL,
					     .null_size = 1 << 20 };
		struct ioc_blk *blk;

		ASSERT_OK(ioc_blk_open(&blk, NULL, &opts));
		run_cb(blk, false);
		run_chain(blk);
		ioc_blk_close(blk);
	}
}

/* ---- null driver, truncate, checks ---------------------------------- */

static void ioc_coroutine_fn null_body(void *opaque)
{
	struct ioc_blk *blk = opaque;
	char buf[4096];
	struct iovec iov = { buf, sizeof(buf) };
	uint64_t pnum;

	memset(buf, 1, sizeof(buf));
	ASSERT_OK(ioc_blk_co_preadv(blk, 0, &iov, 1, 0));
	ASSERT_EQ(buf[0], 0);
	ASSERT_EQ(buf[4095], 0);
	ASSERT_OK(ioc_blk_co_pwritev(blk, 4096, &iov, 1, IOC_BLK_FUA));
	ASSERT_OK(ioc_blk_co_flush(blk, 0));
	ASSERT_OK(ioc_blk_co_discard(blk, 0, 8192, 0));
	ASSERT_OK(ioc_blk_co_write_zeroes(blk, 0, 8192, 0));
	ASSERT_EQ(ioc_blk_co_block_status(blk, 0, 1 << 30, &pnum, 0), IOC_BLK_STATUS_ZERO);
	ASSERT_UEQ(pnum, 1 << 20);
	ASSERT_EQ(ioc_blk_co_preadv(blk, (1 << 20) - 1, &iov, 1, 0), -EINVAL);
	ASSERT_OK(ioc_blk_co_truncate(blk, 2 << 20, 0));
	ASSERT_EQ(ioc_blk_size(blk), 2 << 20);
	ASSERT_OK(ioc_blk_co_preadv(blk, (1 << 20) - 1, &iov, 1, 0));
}

static void test_null(void)
{
	struct ioc_blk_opts opts = { .driver = IOC_BLK_DRIVER_NULL, .null_size = 1 << 20,
				     .null_read_zeroes = true };
	struct ioc_blk *blk;
	struct ioc_blk_info info;

	ASSERT_OK(ioc_blk_open(&blk, NULL, &opts));
	ioc_blk_get_info(blk, &info);
	ASSERT_STR_EQ(info.aio, "null");
	ASSERT_UEQ(info.size, 1 << 20);
	bt_run_co_fn(null_body, blk);
	ioc_blk_close(blk);
}

struct trunc_arg {
	struct ioc_blk *blk, *ro;
	const char *path;
};

static void ioc_coroutine_fn trunc_body(void *opaque)
{
	struct trunc_arg *a = opaque;
	char buf[4096];
	struct iovec iov = { buf, sizeof(buf) };
	struct stat st;

	ASSERT_EQ(ioc_blk_co_preadv(a->blk, 1 << 20, &iov, 1, 0), -EINVAL);
	ASSERT_OK(ioc_blk_co_truncate(a->blk, (1 << 20) + 4096, 0));
	ASSERT_EQ(stat(a->path, &st), 0);
	ASSERT_EQ(st.st_size, (1 << 20) + 4096);
	ASSERT_EQ(ioc_blk_size(a->blk), (1 << 20) + 4096);
	memset(buf, 9, sizeof(buf));
	ASSERT_OK(ioc_blk_co_preadv(a->blk, 1 << 20, &iov, 1, 0));
	ASSERT_EQ(buf[0], 0);
	ASSERT_OK(ioc_blk_co_truncate(a->blk, 8192, 0));
	ASSERT_EQ(ioc_blk_co_preadv(a->blk, 8192, &iov, 1, 0), -EINVAL);
	ASSERT_OK(ioc_blk_co_preadv(a->blk, 4096, &iov, 1, 0));
	/* read-only */
	ASSERT_EQ(ioc_blk_co_pwritev(a->ro, 0, &iov, 1, 0), -EPERM);
	ASSERT_EQ(ioc_blk_co_write_zeroes(a->ro, 0, 4096, 0), -EPERM);
	ASSERT_EQ(ioc_blk_co_truncate(a->ro, 4096, 0), -EPERM);
	ASSERT_OK(ioc_blk_co_preadv(a->ro, 0, &iov, 1, 0));
	/* NOWAIT_ONLY: cached data comes back, else -EAGAIN, never blocks */
	int r = ioc_blk_co_preadv(a->blk, 0, &iov, 1, IOC_BLK_NOWAIT_ONLY);

	ASSERT_TRUE(r == 0 || r == -EAGAIN);
}

static void test_truncate_checks(void)
{
	char *path = bt_make_image(NULL, "trunc.img", 1 << 20, true);
	struct ioc_blk_opts ro = { .read_only = true };
	struct trunc_arg a = { .path = path };
	struct ioc_blk_info info;

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&a.blk, path, NULL));
	ASSERT_OK(ioc_blk_open(&a.ro, path, &ro));
	ioc_blk_get_info(a.ro, &info);
	ASSERT_TRUE(info.read_only);
	ASSERT_FALSE(info.is_blockdev);
	bt_run_co_fn(trunc_body, &a);
	ioc_blk_close(a.blk);
	ioc_blk_close(a.ro);
	ASSERT_EQ(ioc_blk_open(&a.blk, "/nonexistent/x.img", NULL), -ENOENT);
	unlink(path);
	free(path);
}

/* ---- the fast path, each way --------------------------------------- */

struct fast_arg {
	struct ioc_blk *blk;
	const char *path;
	bool can_evict;
	enum blk_fast_how how;
};

/* Drop [off, off + len) of fd from the page cache; true once mincore()
 * reports none of its pages resident (a bounded number of tries). */
static bool evict(int fd, off_t off, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	off_t start = off & ~(off_t)(pg - 1);
	size_t span = (size_t)(off + (off_t)len - start);
	size_t npages = (span + (size_t)pg - 1) / (size_t)pg;
	unsigned char vec[16];
	void *m;
	bool gone = false;

	ASSERT_LE(npages, sizeof(vec));
	ASSERT_EQ(fdatasync(fd), 0); /* dirty pages are not dropped */
	m = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, start);
	ASSERT_TRUE(m != MAP_FAILED);
	for (int i = 0; i < 100 && !gone; i++) {
		ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
		ASSERT_EQ(mincore(m, span, vec), 0);
		gone = true;
		for (size_t p = 0; p < npages; p++)
			gone = gone && !(vec[p] & 1);
		if (!gone)
			sched_yield();
	}
	munmap(m, span);
	return gone;
}

static void ioc_coroutine_fn fast_body(void *opaque)
{
	struct fast_arg *a = opaque;
	unsigned char buf[3 * 4096], want[3 * 4096];
	struct iovec iov[2] = { { buf, 5000 }, { buf + 5000, sizeof(buf) - 5000 } };
	int fd = open(a->path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, want, sizeof(want), 8192), (ssize_t)sizeof(want));
	/* Cached (the pread above): NOWAIT_ONLY must succeed inline. */
	memset(buf, 0, sizeof(buf));
	ASSERT_OK(ioc_blk_co_preadv(a->blk, 8192, iov, 2, IOC_BLK_NOWAIT_ONLY));
	ASSERT_MEM_EQ(buf, want, sizeof(buf));
	if (a->can_evict && a->how != BLK_FAST_PLAIN) {
		/* Not cached: -EAGAIN with NOWAIT_ONLY, data without it.
		 * DONTNEED may leave a page that sits in another CPU's LRU
		 * batch, so evict until mincore() agrees, and only then ask. */
		if (evict(fd, 8192, sizeof(buf)) && a->how == BLK_FAST_CACHESTAT) {
			ASSERT_EQ(ioc_blk_co_preadv(a->blk, 8192, iov, 2,
						    IOC_BLK_NOWAIT_ONLY), -EAGAIN);
		} else if (a->how == BLK_FAST_NOWAIT) {
			/* RWF_NOWAIT promises not to block, not to fail: a
			 * buffered read that finds no page still starts
			 * readahead, and when that I/O completes before the
			 * kernel looks again the read returns the data.  So
			 * either answer is right, but data must be right. */
			int r;

			memset(buf, 0, sizeof(buf));
			r = ioc_blk_co_preadv(a->blk, 8192, iov, 2, IOC_BLK_NOWAIT_ONLY);
			ASSERT_TRUE(r == -EAGAIN || r == 0);
			if (r == 0)
				ASSERT_MEM_EQ(buf, want, sizeof(buf));
		} else {
			ioc_test_diag("the kernel kept the pages cached: "
				      "the uncached NOWAIT_ONLY read is not checked");
		}
		memset(buf, 0, sizeof(buf));
		ASSERT_OK(ioc_blk_co_preadv(a->blk, 8192, iov, 2, 0));
		ASSERT_MEM_EQ(buf, want, sizeof(buf));
	}
	/* Many reads through the fast path and around it, all correct. */
	for (int i = 0; i < 64; i++) {
		memset(buf, 0, sizeof(buf));
		ASSERT_OK(ioc_blk_co_preadv(a->blk, 8192, iov, 2, 0));
		ASSERT_MEM_EQ(buf, want, sizeof(buf));
	}
	close(fd);
}

/* Whether the syscalls behind a forced fast-path way exist here: the
 * NOWAIT way falls back to cachestat(2) where the file system refuses
 * RWF_NOWAIT, so it works if either does. */
static bool fast_way_works(const char *path, enum blk_fast_how how)
{
	char c;
	struct iovec iov = { &c, 1 };
	int fd, ret = 0;

	if (how == BLK_FAST_PLAIN)
		return true;
	if (how == BLK_FAST_NOWAIT) {
		fd = open(path, O_RDONLY);
		ASSERT_GE(fd, 0);
		if (preadv2(fd, &iov, 1, 0, RWF_NOWAIT) < 0)
			ret = -errno;
		close(fd);
		if (ret != -EOPNOTSUPP && ret != -ENOSYS)
			return true;
	}
	return dirty_pages(path, 0, 0) >= 0;
}

static void test_fast_path_ways(void)
{
	const char *disk = bt_disk_dir();

	for (int d = 0; d < 2; d++) {
		const char *dir = d ? disk : NULL;

		if (d && !disk)
			break;
		for (int how = BLK_FAST_PLAIN; how <= BLK_FAST_CACHESTAT; how++) {
			char *path = bt_make_image(dir, "fast.img", 1 << 20, true);
			struct fast_arg a = { .path = path, .can_evict = d == 1,
					      .how = (enum blk_fast_how)how };

			if (!fast_way_works(path, a.how)) {
				/* An older kernel, or qemu's user-mode
				 * emulation: the way cannot run here. */
				ioc_test_diag("fast path way %d: no %s here", how,
					      how == BLK_FAST_NOWAIT ?
					      "preadv2(RWF_NOWAIT) nor cachestat(2)" :
					      "cachestat(2)");
				unlink(path);
				free(path);
				continue;
			}
			bt_get_loop();
			ASSERT_OK(ioc_blk_open(&a.blk, path, NULL));
			ioc__blk_set_fast_how(a.blk, a.how);
			bt_run_co_fn(fast_body, &a);
			ioc_blk_close(a.blk);
			unlink(path);
			free(path);
		}
	}
	if (disk)
		rmdir(disk);
}

/* ---- zero-copy reads into a pipe ------------------------------------ */

/* Splice [off, off + len) of blk into a fresh pipe and compare what comes
 * out with the file's bytes.  Returns what ioc_blk_splice_read() did. */
static ssize_t splice_check(struct ioc_blk *blk, int fd, uint64_t off, size_t len)
{
	int p[2];
	uint8_t *got = malloc(len + 1), *want = malloc(len + 1);

	ASSERT_NOT_NULL(got);
	ASSERT_NOT_NULL(want);
	ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
	ASSERT_GE(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
	ssize_t n = ioc_blk_splice_read(blk, off, len, p[1], 0);
	if (n > 0) {
		ASSERT_EQ(read(p[0], got, len + 1), n);
		ASSERT_EQ(pread(fd, want, (size_t)n, (off_t)off), n);
		ASSERT_OK(memcmp(got, want, (size_t)n));
	}
	close(p[0]);
	close(p[1]);
	free(got);
	free(want);
	return n;
}

static void test_splice_read(void)
{
	char *path = bt_make_image(NULL, "splice.img", 1 << 20, true);
	struct ioc_blk_opts nofast = { .no_fast_path = true };
	struct ioc_blk_opts null = { .driver = IOC_BLK_DRIVER_NULL, .null_size = 1 << 20 };
	struct ioc_blk *blk;
	int fd = open(path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	ASSERT_EQ(splice_check(blk, fd, 0, 1 << 20), 1 << 20);
	ASSERT_EQ(splice_check(blk, fd, 5000, 300000), 300000);
	ASSERT_EQ(splice_check(blk, fd, (1 << 20) - 1, 1), 1);
	ASSERT_EQ(splice_check(blk, fd, 0, 0), 0);
	ASSERT_EQ(splice_check(blk, fd, (1 << 20) - 10, 20), -EINVAL);
	ASSERT_EQ(ioc_blk_splice_read(blk, 0, 4096, -1, 1), -EINVAL);
	/* Past the end of a file cut short underneath: short, not zeroes. */
	ASSERT_OK(truncate(path, 512 << 10));
	ASSERT_EQ(splice_check(blk, fd, 500 << 10, 100 << 10), 12 << 10);
	ioc_blk_close(blk);

	/* Writes from a pipe: the pipe's bytes land in the file. */
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	if (blk->never_waits) {
		int p[2];
		uint8_t *w = malloc(200000), *r = malloc(200000);

		ASSERT_NOT_NULL(w);
		ASSERT_NOT_NULL(r);
		for (size_t i = 0; i < 200000; i++)
			w[i] = (uint8_t)(i * 13 + 1);
		ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
		ASSERT_GE(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
		ASSERT_EQ(write(p[1], w, 200000), 200000);
		ASSERT_EQ(ioc_blk_splice_write(blk, 0, 0, -1, 0), 0); /* the probe */
		ASSERT_EQ(ioc_blk_splice_write(blk, 0, 4096, p[0], IOC_BLK_FUA), -ENOTSUP);
		ASSERT_EQ(ioc_blk_splice_write(blk, 1000, 200000, p[0], 0), 0);
		ASSERT_EQ(pread(fd, r, 200000, 1000), 200000);
		ASSERT_OK(memcmp(r, w, 200000));
		/* A pipe holding less than len: an error, not a hang. */
		ASSERT_EQ(write(p[1], w, 100), 100);
		ASSERT_LT(ioc_blk_splice_write(blk, 0, 4096, p[0], 0), 0);
		close(p[0]);
		close(p[1]);
		free(w);
		free(r);
	} else {
		ASSERT_EQ(ioc_blk_splice_write(blk, 0, 0, -1, 0), -ENOTSUP);
	}
	ASSERT_EQ(ioc_blk_splice_write(blk, (1 << 20) - 10, 20, -1, 0), -EINVAL);
	ioc_blk_close(blk);

	/* Where it can never be done. */
	ASSERT_OK(ioc_blk_open(&blk, path, &nofast));
	ASSERT_EQ(ioc_blk_splice_write(blk, 0, 0, -1, 0), -ENOTSUP);
	ASSERT_EQ(splice_check(blk, fd, 0, 4096), -ENOTSUP);
	ioc_blk_close(blk);
	ASSERT_OK(ioc_blk_open(&blk, NULL, &null));
	ASSERT_EQ(ioc_blk_splice_read(blk, 0, 4096, -1, 0), -ENOTSUP);
	ioc_blk_close(blk);
	close(fd);
	unlink(path);
	free(path);

	/* On a disk: cache=none refuses; a range out of the page cache is
	 * not read (-EAGAIN) where cachestat(2) exists. */
	const char *disk = bt_disk_dir();
	if (!disk)
		return;
	path = bt_make_image(disk, "splice.img", 1 << 20, true);
	struct ioc_blk_opts direct = { .cache = IOC_BLK_CACHE_NONE };
	if (ioc_blk_open(&blk, path, &direct) == 0) {
		ASSERT_EQ(ioc_blk_splice_read(blk, 0, 4096, -1, 0), -ENOTSUP);
		ioc_blk_close(blk);
	}
	fd = open(path, O_RDONLY);
	ASSERT_GE(fd, 0);
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	ASSERT_EQ(ioc_blk_splice_write(blk, 0, 0, -1, 0), -ENOTSUP); /* may wait */
	bool cachestat = fast_way_works(path, BLK_FAST_CACHESTAT);
	if (cachestat && evict(fd, 0, 8192))
		ASSERT_EQ(splice_check(blk, fd, 0, 8192), -EAGAIN);
	ASSERT_EQ(pread(fd, (char[8192]){0}, 8192, 0), 8192); /* cache it */
	/* Without cachestat(2) (an older kernel, qemu-aarch64's user mode)
	 * a disk file's range cannot be known cached: never spliced. */
	ASSERT_EQ(splice_check(blk, fd, 0, 8192), cachestat ? 8192 : -EAGAIN);
	ioc_blk_close(blk);
	close(fd);
	unlink(path);
	free(path);
	rmdir(disk);
}

/* ---- one image, several I/O threads --------------------------------- */

#define MT_THREADS 2
#define MT_COS 8
#define MT_SPAN (64 * 1024)

struct mt_co {
	struct ioc_blk *blk;
	unsigned id;
	unsigned ops;
	int efd;
	int failures;
};

static void ioc_coroutine_fn mt_body(void *opaque)
{
	struct mt_co *m = opaque;
	uint64_t base = (uint64_t)m->id * MT_SPAN, seed = m->id + 1, one = 1;
	unsigned char wbuf[4096], rbuf[4096];

	for (unsigned i = 0; i < m->ops; i++) {
		uint64_t off = base + (bt_rand(&seed) % (MT_SPAN / 4096)) * 4096;
		struct iovec w = { wbuf, sizeof(wbuf) }, r = { rbuf, sizeof(rbuf) };

		memset(wbuf, (int)(i + m->id), sizeof(wbuf));
		if (ioc_blk_co_pwritev(m->blk, off, &w, 1, 0) < 0 ||
		    ioc_blk_co_preadv(m->blk, off, &r, 1, 0) < 0 ||
		    memcmp(wbuf, rbuf, sizeof(rbuf)) != 0)
			m->failures++;
	}
	/* Tell the main thread; it blocks in read(2) on the eventfd. */
	ASSERT_EQ(write(m->efd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

static int mt_start(void *arg)
{
	struct mt_co *m = arg;

	for (unsigned i = 0; i < MT_COS; i++) {
		struct ioc_co *co = ioc_co_create(mt_body, &m[i]);

		if (!co)
			return -ENOMEM;
		ioc_co_enter(co);
	}
	return 0;
}

static void test_multi_loop(void)
{
	char *path = bt_make_image(NULL, "mt.img", MT_THREADS * MT_COS * MT_SPAN, false);
	struct ioc_iothread *t[MT_THREADS];
	struct mt_co m[MT_THREADS][MT_COS];
	int efd = eventfd(0, EFD_CLOEXEC);

	ASSERT_GE(efd, 0);
	for (int aio = 0; aio < 2; aio++) {
		struct ioc_blk_opts opts = {
			.aio = aio ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING };
		struct ioc_blk *blk;
		uint64_t n = 0, v;

		ASSERT_OK(ioc_blk_open(&blk, path, &opts));
		for (int i = 0; i < MT_THREADS; i++) {
			struct ioc_iothread_opts to = { .name = "blk-test", .cpu = -1 };

			ASSERT_OK(ioc_iothread_start(&t[i], &to));
			for (unsigned j = 0; j < MT_COS; j++)
				m[i][j] = (struct mt_co){ .blk = blk, .id = (unsigned)i * MT_COS + j,
							  .ops = (unsigned)ioc_test_scaled(200),
							  .efd = efd };
		}
		for (int i = 0; i < MT_THREADS; i++)
			ASSERT_OK(ioc_iothread_call(t[i], mt_start, m[i]));
		while (n < MT_THREADS * MT_COS) {
			ASSERT_EQ(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v));
			n += v;
		}
		for (int i = 0; i < MT_THREADS; i++) {
			ioc_iothread_stop(t[i]);
			for (unsigned j = 0; j < MT_COS; j++)
				ASSERT_EQ(m[i][j].failures, 0);
		}
		ioc_blk_close(blk);
	}
	close(efd);
	unlink(path);
	free(path);
}

/* ---- large writes on the image's writer thread ---------------------- */

#define WR_THREADS 2
#define WR_COS 4
#define WR_SPAN (2u << 20)     /* each coroutine's own range */
#define WR_LEN (IOC_BLK_WRITER_MIN + 4099)

struct wr_co {
	struct ioc_blk *blk;
	unsigned id;
	int efd;
	int failures;
	unsigned writer_calls;  /* writes that should have gone to the writer */
};

static uint8_t wr_pat(uint64_t off, unsigned round)
{
	return (uint8_t)(off * 31 + (off >> 11) + round * 7);
}

/* Per round, in the coroutine's own range: a large pwritev in three
 * pieces at an odd offset, a large spliced write from a pipe, a small
 * pwritev (inline, below the writer's minimum), each read back. */
static void ioc_coroutine_fn wr_body(void *opaque)
{
	struct wr_co *w = opaque;
	uint64_t base = (uint64_t)w->id * WR_SPAN, one = 1;
	uint8_t *b = malloc(WR_LEN), *r = malloc(WR_LEN);
	int p[2];

	ASSERT_NOT_NULL(b);
	ASSERT_NOT_NULL(r);
	ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
	ASSERT_GE(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
	for (unsigned round = 0; round < 3; round++) {
		uint64_t o1 = base + 777, o2 = base + WR_LEN + 4096, o3 = o2 + WR_LEN;
		struct iovec v[3] = { { b, 1000 }, { b + 1000, 100000 },
				      { b + 101000, WR_LEN - 101000 } };
		struct iovec rv = { r, WR_LEN };

		for (size_t i = 0; i < WR_LEN; i++)
			b[i] = wr_pat(o1 + i, round);
		w->failures += ioc_blk_co_pwritev(w->blk, o1, v, 3, 0) != 0;
		w->failures += ioc_blk_co_preadv(w->blk, o1, &rv, 1, 0) != 0 ||
			       memcmp(b, r, WR_LEN) != 0;
		for (size_t i = 0; i < WR_LEN; i++)
			b[i] = wr_pat(o2 + i, round);
		ASSERT_EQ(write(p[1], b, WR_LEN), (ssize_t)WR_LEN);
		w->failures += ioc_blk_co_splice_write(w->blk, o2, WR_LEN, p[0], 0) != 0;
		w->failures += ioc_blk_co_preadv(w->blk, o2, &rv, 1, 0) != 0 ||
			       memcmp(b, r, WR_LEN) != 0;
		v[0] = (struct iovec){ b, 4096 };
		w->failures += ioc_blk_co_pwritev(w->blk, o3, v, 1, 0) != 0;
		w->writer_calls += 2;
	}
	close(p[0]);
	close(p[1]);
	free(b);
	free(r);
	ASSERT_EQ(write(w->efd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

static int wr_start(void *arg)
{
	struct wr_co *w = arg;

	for (unsigned i = 0; i < WR_COS; i++) {
		struct ioc_co *co = ioc_co_create(wr_body, &w[i]);

		if (!co)
			return -ENOMEM;
		ioc_co_enter(co);
	}
	return 0;
}

/* A lone coroutine: one large write (the writer is idle, so it takes
 * it) and one small one (inline). */
static void ioc_coroutine_fn wr_one_body(void *opaque)
{
	struct wr_co *w = opaque;
	uint8_t *b = calloc(1, WR_LEN);
	struct iovec v = { b, WR_LEN };
	uint64_t one = 1;

	ASSERT_NOT_NULL(b);
	w->failures += ioc_blk_co_pwritev(w->blk, 0, &v, 1, 0) != 0;
	v.iov_len = 4096;
	w->failures += ioc_blk_co_pwritev(w->blk, WR_LEN, &v, 1, 0) != 0;
	free(b);
	ASSERT_EQ(write(w->efd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

static int wr_one_start(void *arg)
{
	struct ioc_co *co = ioc_co_create(wr_one_body, arg);

	if (!co)
		return -ENOMEM;
	ioc_co_enter(co);
	return 0;
}

/* Large inline writes from coroutines on two loops at once go to one
 * writer (created once, whichever loop comes first), land where they
 * should and mark the dirty bitmap; below the minimum, and outside a
 * coroutine, they stay inline; FUA never goes inline. */
static void test_writer(void)
{
	char *path = bt_make_image(NULL, "wr.img", WR_THREADS * WR_COS * WR_SPAN, false);
	struct ioc_iothread *t[WR_THREADS];
	struct wr_co w[WR_THREADS][WR_COS];
	struct ioc_blk_dirty *bm;
	struct ioc_blk_dirty_opts dopts = { .name = "wr" };
	struct ioc_pool_stats ps;
	struct ioc_blk *blk;
	uint64_t n = 0, v, len, calls = 0;
	int efd = eventfd(0, EFD_CLOEXEC);

	ASSERT_GE(efd, 0);
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	ioc__blk_set_fast_how(blk, BLK_FAST_PLAIN); /* writes inline, as on tmpfs */
	ASSERT_OK(ioc_blk_dirty_add(blk, &dopts, &bm));
	for (int i = 0; i < WR_THREADS; i++) {
		struct ioc_iothread_opts to = { .name = "blk-test", .cpu = -1 };

		ASSERT_OK(ioc_iothread_start(&t[i], &to));
		for (unsigned j = 0; j < WR_COS; j++)
			w[i][j] = (struct wr_co){ .blk = blk, .id = (unsigned)i * WR_COS + j,
						  .efd = efd };
	}
	for (int i = 0; i < WR_THREADS; i++)
		ASSERT_OK(ioc_iothread_call(t[i], wr_start, w[i]));
	while (n < WR_THREADS * WR_COS) {
		ASSERT_EQ(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v));
		n += v;
	}
	for (int i = 0; i < WR_THREADS; i++) {
		ioc_iothread_stop(t[i]);
		for (unsigned j = 0; j < WR_COS; j++) {
			ASSERT_EQ(w[i][j].failures, 0);
			calls += w[i][j].writer_calls;
		}
	}
	/* Large writes went to the writer while it had room and stayed
	 * inline past IOC_BLK_WRITER_QUEUE; none is counted as still there. */
	ASSERT_NOT_NULL(blk->writer);
	ioc_pool_get_stats(blk->writer, &ps);
	ASSERT_GE(ps.completed, 1);
	ASSERT_LE(ps.completed, calls);
	ASSERT_LE(ps.threads, 1);
	ASSERT_UEQ(atomic_load(&blk->writer_jobs), 0);
	/* Alone, a large write goes to the writer and a small one does not. */
	{
		struct ioc_iothread_opts to = { .name = "blk-test", .cpu = -1 };
		struct wr_co one = { .blk = blk, .efd = efd };
		uint64_t before = ps.completed;

		ASSERT_OK(ioc_iothread_start(&t[0], &to));
		ASSERT_OK(ioc_iothread_call(t[0], wr_one_start, &one));
		ASSERT_EQ(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v));
		ioc_iothread_stop(t[0]);
		ASSERT_EQ(one.failures, 0);
		ioc_pool_get_stats(blk->writer, &ps);
		ASSERT_UEQ(ps.completed, before + 1);
	}
	/* The bitmap saw every write: each range's first granule to its
	 * last one is dirty, the gap after the small write clean. */
	for (unsigned id = 0; id < WR_THREADS * WR_COS; id++) {
		uint64_t base = (uint64_t)id * WR_SPAN;
		uint64_t end = base + 777 + 2 * (WR_LEN + 4096) + 4096;

		ASSERT_EQ(ioc_blk_dirty_extent(bm, base, WR_SPAN, &len), 1);
		ASSERT_GE(base + len, end);
		ASSERT_LT(base + len, base + WR_SPAN);
	}
	/* Outside a coroutine a large splice stays inline: no new job. */
	{
		int p[2];
		uint8_t *b = calloc(1, WR_LEN);

		ASSERT_NOT_NULL(b);
		ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
		ASSERT_GE(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
		uint64_t before = ps.completed;

		ASSERT_EQ(write(p[1], b, WR_LEN), (ssize_t)WR_LEN);
		ASSERT_EQ(ioc_blk_splice_write(blk, 0, WR_LEN, p[0], 0), 0);
		ASSERT_EQ(ioc_blk_co_splice_write(blk, 0, 0, -1, 0), 0); /* the probe */
		ASSERT_EQ(ioc_blk_co_splice_write(blk, 0, WR_LEN, p[0], IOC_BLK_FUA), -ENOTSUP);
		ioc_pool_get_stats(blk->writer, &ps);
		ASSERT_UEQ(ps.completed, before);
		close(p[0]);
		close(p[1]);
		free(b);
	}
	ioc_blk_close(blk);
	close(efd);
	unlink(path);
	free(path);
}

/* ---- reads lent from a mapping ------------------------------------- */

#define MAP_IMG ((5u << 20) + 4096) /* three 2 MiB chunks, the last partial */

struct map_arg {
	struct ioc_blk *blk;
	uint64_t size;
	int ret;
};

static void map_truncate_body(void *opaque)
{
	struct map_arg *a = opaque;

	a->ret = ioc_blk_co_truncate(a->blk, a->size, 0);
}

static void map_flush_body(void *opaque)
{
	struct map_arg *a = opaque;

	a->ret = ioc_blk_co_flush(a->blk, 0);
}

static void map_discard_body(void *opaque)
{
	struct map_arg *a = opaque;

	a->ret = ioc_blk_co_discard(a->blk, 1u << 20, 64u << 10, 0);
}

/* What ioc_blk_map_read() lends is the file's bytes at [off, off + len). */
static void map_check(struct ioc_blk *blk, int fd, uint64_t off, size_t len)
{
	const uint8_t *p = ioc_blk_map_read(blk, off, len);
	uint8_t *want = malloc(len);

	ASSERT_NOT_NULL(p);
	ASSERT_NOT_NULL(want);
	ASSERT_EQ(pread(fd, want, len, (off_t)off), (ssize_t)len);
	ASSERT_OK(memcmp(p, want, len));
	free(want);
}

static void test_map_read(void)
{
	char *path = bt_make_image(NULL, "map.img", MAP_IMG, true);
	char *sparse = bt_make_image(NULL, "sparse.img", MAP_IMG, false);
	struct ioc_blk_opts nofast = { .no_fast_path = true };
	struct map_arg a = { 0 };
	struct ioc_blk *blk;
	int fd = open(path, O_RDWR);

	ASSERT_GE(fd, 0);
	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	if (!blk->never_waits) {
		/* Not tmpfs without swap: never lent. */
		ioc_test_diag("map_read: the test directory is not tmpfs without swap");
		ASSERT_NULL(ioc_blk_map_read(blk, 0, 4096));
		ioc_blk_close(blk);
		goto out;
	}
	map_check(blk, fd, 0, 4096);
	/* Mapped at a 2 MiB boundary, so that huge pages map whole. */
	ASSERT_EQ((uintptr_t)ioc_blk_map_read(blk, 0, 4096) & ((2u << 20) - 1), 0);
	map_check(blk, fd, (2u << 20) - 100, 200);     /* across a chunk edge */
	map_check(blk, fd, MAP_IMG - 1, 1);
	map_check(blk, fd, 0, MAP_IMG);
	ASSERT_NULL(ioc_blk_map_read(blk, 0, 0));
	ASSERT_NULL(ioc_blk_map_read(blk, MAP_IMG - 10, 20));
	ASSERT_NULL(ioc_blk_map_read(blk, MAP_IMG + 4096, 1));
	/* The same pages as the file: a later write shows through. */
	const uint8_t *p = ioc_blk_map_read(blk, 8192, 4096);
	ASSERT_NOT_NULL(p);
	ASSERT_EQ(pwrite(fd, "fresh", 5, 8192 + 17), 5);
	ASSERT_OK(memcmp(p + 17, "fresh", 5));
	/* Cut short through the block layer: nothing lent past the end. */
	a.blk = blk;
	a.size = 3u << 20;
	bt_run_co_fn(map_truncate_body, &a);
	ASSERT_OK(a.ret);
	ASSERT_NULL(ioc_blk_map_read(blk, 3u << 20, 4096));
	map_check(blk, fd, (3u << 20) - 4096, 4096);
	/* Cut short underneath: the kernel's copy out of a lent range past
	 * the new end fails with EFAULT (no SIGBUS). */
	p = ioc_blk_map_read(blk, (2u << 20) + 8192, 4096);
	ASSERT_NOT_NULL(p);
	ASSERT_OK(ftruncate(fd, 2u << 20));
	int pp[2];
	ASSERT_OK(pipe2(pp, O_CLOEXEC | O_NONBLOCK));
	errno = 0;
	ASSERT_EQ(write(pp[1], p, 4096), -1);
	ASSERT_EQ(errno, EFAULT);
	close(pp[0]);
	close(pp[1]);
	/* The fallback: pread, zeroes past the end, and nothing more lent. */
	uint8_t got[8192], want[8192];
	memset(got, 0xee, sizeof(got));
	ASSERT_EQ(pread(fd, want, 4096, (2u << 20) - 4096), 4096);
	memset(want + 4096, 0, 4096);
	ASSERT_OK(ioc_blk_map_fault(blk, (2u << 20) - 4096, got, sizeof(got)));
	ASSERT_OK(memcmp(got, want, sizeof(got)));
	ASSERT_NULL(ioc_blk_map_read(blk, 0, 4096));
	ioc_blk_close(blk);

	/* A discard ends lending: a read through the mapping would fault
	 * the hole back in as an allocated page. */
	ASSERT_OK(ftruncate(fd, MAP_IMG));
	ASSERT_OK(fallocate(fd, 0, 0, MAP_IMG));
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	map_check(blk, fd, 1u << 20, 4096);
	a.blk = blk;
	bt_run_co_fn(map_discard_body, &a);
	ASSERT_OK(a.ret);
	ASSERT_NULL(ioc_blk_map_read(blk, 0, 4096));
	ASSERT_NULL(ioc_blk_map_read(blk, 1u << 20, 4096));
	ioc_blk_close(blk);

	/* A sparse image, the fast path off: never lent. */
	ASSERT_OK(ioc_blk_open(&blk, sparse, NULL));
	ASSERT_NULL(ioc_blk_map_read(blk, 0, 4096));
	ioc_blk_close(blk);
	ASSERT_OK(ioc_blk_open(&blk, path, &nofast));
	ASSERT_NULL(ioc_blk_map_read(blk, 0, 4096));
	ioc_blk_close(blk);
out:
	close(fd);
	unlink(path);
	unlink(sparse);
	free(path);
	free(sparse);
}

/* Writes into the mapping: the kernel's copy into what
 * ioc_blk_map_write() gives lands in the file, ioc_blk_map_store() too,
 * and ioc_blk_map_written() marks the dirty bitmap; never for FUA,
 * unknown flags, a read-only image or after a discard. */
static void test_map_write(void)
{
	char *path = bt_make_image(NULL, "mapw.img", MAP_IMG, true);
	struct ioc_blk_opts ro = { .read_only = true };
	struct ioc_blk_dirty_opts dopts = { .name = "mw" };
	struct ioc_blk_dirty *bm;
	struct map_arg a = { 0 };
	struct ioc_blk *blk;
	uint8_t src[8192], got[8192];
	uint64_t len;
	int fd = open(path, O_RDWR), pp[2];
	uint8_t *p;
	const struct timespec old[2] = { { .tv_sec = 1000 }, { .tv_sec = 1000 } };
	struct stat st;

	ASSERT_GE(fd, 0);
	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&blk, path, NULL));
	if (!blk->never_waits) {
		ioc_test_diag("map_write: the test directory is not tmpfs without swap");
		ASSERT_NULL(ioc_blk_map_write(blk, 0, 4096, 0));
		ioc_blk_close(blk);
		goto out;
	}
	ASSERT_OK(ioc_blk_dirty_add(blk, &dopts, &bm));
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 7 + 3);
	/* Across a chunk edge, from a pipe by the kernel's copy. */
	const uint64_t off = (2u << 20) - 4096 - 100;
	p = ioc_blk_map_write(blk, off, sizeof(src), 0);
	ASSERT_NOT_NULL(p);
	ASSERT_TRUE(p == (const uint8_t *)ioc_blk_map_read(blk, off, sizeof(src)));
	ASSERT_OK(pipe2(pp, O_CLOEXEC));
	ASSERT_EQ(write(pp[1], src, 5000), 5000);
	ASSERT_EQ(read(pp[0], p, 5000), 5000);
	ASSERT_OK(ioc_blk_map_store(blk, off + 5000, src + 5000, sizeof(src) - 5000));
	ASSERT_EQ(pread(fd, got, sizeof(got), (off_t)off), (ssize_t)sizeof(got));
	ASSERT_OK(memcmp(got, src, sizeof(src)));
	/* Marked by ioc_blk_map_written(), not before. */
	ASSERT_EQ(ioc_blk_dirty_extent(bm, 0, MAP_IMG, &len), 0);
	ASSERT_OK(futimens(fd, old));
	ASSERT_OK(ioc_blk_map_written(blk, off, sizeof(src)));
	/* The file's mtime: set by the next flush, once. */
	ASSERT_OK(fstat(fd, &st));
	ASSERT_EQ(st.st_mtim.tv_sec, 1000);
	a.blk = blk;
	bt_run_co_fn(map_flush_body, &a);
	ASSERT_OK(a.ret);
	ASSERT_OK(fstat(fd, &st));
	ASSERT_GT(st.st_mtim.tv_sec, 1000);
	ASSERT_OK(futimens(fd, old));
	bt_run_co_fn(map_flush_body, &a);
	ASSERT_OK(fstat(fd, &st));
	ASSERT_EQ(st.st_mtim.tv_sec, 1000);
	ASSERT_EQ(ioc_blk_dirty_extent(bm, off / 65536 * 65536, 65536, &len), 1);
	ASSERT_EQ(ioc_blk_dirty_extent(bm, 0, 65536, &len), 0);
	ASSERT_NULL(ioc_blk_map_write(blk, 0, 4096, IOC_BLK_FUA));
	ASSERT_NULL(ioc_blk_map_write(blk, 0, 4096, 1u << 20));
	ASSERT_NULL(ioc_blk_map_write(blk, 0, 0, 0));
	ASSERT_NULL(ioc_blk_map_write(blk, MAP_IMG - 10, 20, 0));
	/* A discard ends it, as it ends lending. */
	a.blk = blk;
	bt_run_co_fn(map_discard_body, &a);
	ASSERT_OK(a.ret);
	ASSERT_NULL(ioc_blk_map_write(blk, 0, 4096, 0));
	close(pp[0]);
	close(pp[1]);
	ioc_blk_close(blk);
	/* Read-only: lent, never written. */
	ASSERT_OK(fallocate(fd, 0, 0, MAP_IMG));
	ASSERT_OK(ioc_blk_open(&blk, path, &ro));
	ASSERT_NOT_NULL(ioc_blk_map_read(blk, 0, 4096));
	ASSERT_NULL(ioc_blk_map_write(blk, 0, 4096, 0));
	ioc_blk_close(blk);
out:
	close(fd);
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
	IOC_TEST(test_fua_flush),
	IOC_TEST(test_discard_zeroes),
	IOC_TEST(test_callback_api),
	IOC_TEST(test_null),
	IOC_TEST(test_truncate_checks),
	IOC_TEST(test_multi_loop),
	IOC_TEST(test_fast_path_ways),
	IOC_TEST(test_splice_read),
	IOC_TEST(test_writer),
	IOC_TEST(test_map_read),
	IOC_TEST(test_map_write),
	IOC_TEST(test_cleanup),
)
