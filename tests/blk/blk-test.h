/*
 * Helpers shared by the block layer's tests: one loop per test process,
 * running a coroutine to completion, scratch images, the backend matrix.
 */
#ifndef IOC_BLK_TEST_H
#define IOC_BLK_TEST_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iocore/blk.h"
#include "iocore/co.h"
#include "iocore/loop.h"
#include "tap.h"

static struct ioc_loop *bt_loop;

static inline struct ioc_loop *bt_get_loop(void)
{
	if (!bt_loop)
		ASSERT_OK(ioc_loop_new(&bt_loop, NULL));
	return bt_loop;
}

struct bt_run {
	void (*fn)(void *arg);
	void *arg;
	bool done;
};

static void ioc_coroutine_fn bt_run_co(void *opaque)
{
	struct bt_run *r = opaque;

	r->fn(r->arg);
	r->done = true;
}

/* Run fn(arg) in a coroutine on the test's loop until it returns. */
static inline void bt_run_co_fn(void (*fn)(void *), void *arg)
{
	struct bt_run r = { fn, arg, false };
	struct ioc_loop *loop = bt_get_loop();
	struct ioc_co *co = ioc_co_create(bt_run_co, &r);

	ASSERT_NOT_NULL(co);
	ioc_co_enter(co);
	while (!r.done)
		ioc_loop_poll(loop, true);
}

/* A file of size bytes filled with a pattern, in dir (NULL: the test's
 * tmpfs directory).  Returns a malloc'd path. */
static inline char *bt_make_image(const char *dir, const char *name, uint64_t size,
				  bool fill)
{
	char *path = NULL;
	int fd;

	if (!dir)
		dir = ioc_test_tmpdir();
	if (asprintf(&path, "%s/%s", dir, name) < 0)
		abort();
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		ioc_test_fail(__FILE__, __LINE__, "open %s: %s", path, strerror(errno));
	ASSERT_OK(ftruncate(fd, (off_t)size));
	if (fill) {
		char buf[4096];

		for (uint64_t off = 0; off < size; off += sizeof(buf)) {
			for (size_t i = 0; i < sizeof(buf); i++)
				buf[i] = (char)((off + i) * 7 + 3);
			size_t n = size - off < sizeof(buf) ? size - off : sizeof(buf);

			ASSERT_EQ(pwrite(fd, buf, n, (off_t)off), (ssize_t)n);
		}
	}
	close(fd);
	return path;
}

/* A directory on a disk file system (O_DIRECT with real alignment), or
 * NULL when there is none. */
static inline const char *bt_disk_dir(void)
{
	static char dir[256];
	const char *cands[] = { getenv("IOC_TEST_DISK_TMPDIR"), "/var/tmp", "/tmp" };

	if (dir[0] && access(dir, W_OK) == 0)
		return dir;
	for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		if (!cands[i])
			continue;
		snprintf(dir, sizeof(dir), "%s/ioc-blk-XXXXXX", cands[i]);
		if (mkdtemp(dir))
			return dir;
	}
	dir[0] = 0;
	return NULL;
}

static inline void bt_read_file(const char *path, void *buf, uint64_t len)
{
	int fd = open(path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, buf, len, 0), (ssize_t)len);
	close(fd);
}

struct bt_config {
	const char *name;
	enum ioc_blk_aio aio;
	enum ioc_blk_cache cache;
	bool no_fast_path;
};

static const struct bt_config bt_configs[] = {
	{ "io_uring writeback", IOC_BLK_AIO_IO_URING, IOC_BLK_CACHE_WRITEBACK, false },
	{ "io_uring writeback nofast", IOC_BLK_AIO_IO_URING, IOC_BLK_CACHE_WRITEBACK, true },
	{ "io_uring none", IOC_BLK_AIO_IO_URING, IOC_BLK_CACHE_NONE, true },
	{ "threads writeback", IOC_BLK_AIO_THREADS, IOC_BLK_CACHE_WRITEBACK, false },
	{ "threads writeback nofast", IOC_BLK_AIO_THREADS, IOC_BLK_CACHE_WRITEBACK, true },
	{ "threads none", IOC_BLK_AIO_THREADS, IOC_BLK_CACHE_NONE, true },
};

static inline uint64_t bt_rand(uint64_t *s)
{
	/* xorshift64* */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

#endif /* IOC_BLK_TEST_H */
