/*
 * Errors come back as -errno without disturbing other requests in flight:
 * EIO and short transfers from the fault hook (every backend and the null
 * driver), ENOSPC from an image on a small, full tmpfs.
 */
#include <stdatomic.h>
#include <sys/mount.h>

#include "blk-test.h"
#include "src/blk/blk-int.h"

#define IMG_SIZE (1024 * 1024)
#define NREQ 64
#define CHUNK 8192

/* Requests at a multiple of 5 chunks fail with EIO; every first attempt of
 * the others transfers only half. */
struct faults {
	_Atomic unsigned shorts;
	_Atomic unsigned eios;
	_Atomic unsigned attempts;
};

static int64_t fault_fn(void *opaque, enum blk_op op, uint64_t offset, uint64_t len)
{
	struct faults *f = opaque;

	/* Pairs with nothing: counters read after every request completed
	 * (the completions order them). */
	atomic_fetch_add_explicit(&f->attempts, 1, memory_order_relaxed);
	if (op != BLK_OP_READ && op != BLK_OP_WRITE)
		return 0;
	if ((offset / CHUNK) % 5 == 0) {
		atomic_fetch_add_explicit(&f->eios, 1, memory_order_relaxed);
		return -EIO;
	}
	if (offset % CHUNK == 0 && len == CHUNK) {
		atomic_fetch_add_explicit(&f->shorts, 1, memory_order_relaxed);
		return CHUNK / 2;
	}
	return 0;
}

struct ereq {
	struct ioc_blk *blk;
	uint64_t off;
	bool write;
	int ret;
	unsigned char *buf;
	uint64_t len;
	unsigned *finished;
};

static void ioc_coroutine_fn ereq_co(void *opaque)
{
	struct ereq *e = opaque;
	struct iovec iov = { e->buf, e->len ? e->len : CHUNK };

	e->ret = e->write ? ioc_blk_co_pwritev(e->blk, e->off, &iov, 1, 0) :
		ioc_blk_co_preadv(e->blk, e->off, &iov, 1, 0);
	(*e->finished)++;
}

static void run_faults(const struct bt_config *c, bool null)
{
	struct ioc_blk_opts opts = { .aio = c->aio, .cache = c->cache,
				     .no_fast_path = c->no_fast_path,
				     .driver = null ? IOC_BLK_DRIVER_NULL : IOC_BLK_DRIVER_FILE,
				     .null_size = IMG_SIZE, .null_read_zeroes = true };
	char *path = null ? NULL : bt_make_image(NULL, "faults.img", IMG_SIZE, true);
	unsigned char *file = malloc(IMG_SIZE);
	struct ereq e[NREQ];
	struct faults f = { 0 };
	struct ioc_blk *blk;
	unsigned finished = 0;

	ASSERT_NOT_NULL(file);
	if (path)
		bt_read_file(path, file, IMG_SIZE);
	else
		memset(file, 0, IMG_SIZE);
	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&blk, path, &opts));
	ioc__blk_set_fault(blk, fault_fn, &f);
	for (unsigned i = 0; i < NREQ; i++) {
		e[i] = (struct ereq){ .blk = blk, .off = (uint64_t)i * CHUNK,
				      .write = i % 3 == 1, .ret = 1, .finished = &finished };
		ASSERT_OK(posix_memalign((void **)&e[i].buf, 4096, CHUNK));
		memset(e[i].buf, e[i].write ? 0x5a : 0, CHUNK);
		struct ioc_co *co = ioc_co_create(ereq_co, &e[i]);

		ASSERT_NOT_NULL(co);
		ioc_co_enter(co);
	}
	while (finished < NREQ)
		ioc_loop_poll(bt_loop, true);
	for (unsigned i = 0; i < NREQ; i++) {
		if (i % 5 == 0) {
			ASSERT_EQ(e[i].ret, -EIO);
			continue;
		}
		ASSERT_EQ(e[i].ret, 0);
		if (e[i].write)
			memset(file + e[i].off, 0x5a, CHUNK);
		else
			ASSERT_MEM_EQ(e[i].buf, file + e[i].off, CHUNK);
	}
	ASSERT_GT(atomic_load(&f.shorts), 0);
	ASSERT_GE(atomic_load(&f.eios), NREQ / 5);
	ioc__blk_set_fault(blk, NULL, NULL);
	ioc_blk_close(blk);
	if (path) {
		unsigned char *now = malloc(IMG_SIZE);

		bt_read_file(path, now, IMG_SIZE);
		ASSERT_MEM_EQ(now, file, IMG_SIZE);
		free(now);
		unlink(path);
	}
	for (unsigned i = 0; i < NREQ; i++)
		free(e[i].buf);
	free(path);
	free(file);
}

static void test_fault_eio_short(void)
{
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bt_configs); i++)
		run_faults(&bt_configs[i], false);
}

static void test_fault_null(void)
{
	run_faults(&bt_configs[0], true);
}

/* ENOSPC: a 1 MiB tmpfs holding an 8 MiB sparse image with 512 KiB of
 * data.  Reads of the data run while writes fill the file system: every
 * read must succeed with the right bytes, every write succeed or fail
 * -ENOSPC, and at least one must fail. */
static void test_enospc(void)
{
	char dir[] = "/tmp/ioc-enospc-XXXXXX";
	char *path = NULL;
	struct ioc_blk *blk;
	struct ereq e[NREQ];
	unsigned finished = 0, enospc = 0;
	unsigned char *data;
	struct ioc_blk_opts opts = { .aio = IOC_BLK_AIO_IO_URING };

	ASSERT_NOT_NULL(mkdtemp(dir));
	if (mount("ioc-enospc", dir, "tmpfs", 0, "size=1m") < 0) {
		rmdir(dir);
		IOC_SKIP("cannot mount a tmpfs (needs root)");
	}
	ASSERT_GE(asprintf(&path, "%s/full.img", dir), 0);
	int fd = open(path, O_RDWR | O_CREAT, 0644);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ftruncate(fd, 8 << 20));
	data = malloc(512 * 1024);
	for (unsigned i = 0; i < 512 * 1024; i++)
		data[i] = (unsigned char)(i * 13);
	ASSERT_EQ(pwrite(fd, data, 512 * 1024, 0), 512 * 1024);
	close(fd);

	/* io_uring and threads through the backends, then the inline path
	 * (tmpfs writes go inline with the fast path on). */
	for (int pass = 0; pass < 3; pass++) {
		opts.aio = pass == 1 ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING;
		opts.no_fast_path = pass < 2;
		finished = enospc = 0;
		bt_get_loop();
		ASSERT_OK(ioc_blk_open(&blk, path, &opts));
		for (unsigned i = 0; i < NREQ; i++) {
			bool w = i % 2;

			/* 32 writes of 32 KiB (1 MiB) cannot all fit next to
			 * the 512 KiB already there. */
			e[i] = (struct ereq){ .blk = blk, .write = w, .ret = 1, .finished = &finished,
					      .len = w ? 32 * 1024 : CHUNK,
					      .off = w ? (1 << 20) + (uint64_t)i * 64 * 1024 :
							 (uint64_t)(i % 64) * CHUNK };
			ASSERT_OK(posix_memalign((void **)&e[i].buf, 4096, 32 * 1024));
			memset(e[i].buf, 0x77, 32 * 1024);
		}
		for (unsigned i = 0; i < NREQ; i++) {
			struct ioc_co *co = ioc_co_create(ereq_co, &e[i]);

			ASSERT_NOT_NULL(co);
			ioc_co_enter(co);
		}
		while (finished < NREQ)
			ioc_loop_poll(bt_loop, true);
		for (unsigned i = 0; i < NREQ; i++) {
			if (e[i].write) {
				ASSERT_TRUE(e[i].ret == 0 || e[i].ret == -ENOSPC);
				enospc += e[i].ret == -ENOSPC;
			} else {
				ASSERT_EQ(e[i].ret, 0);
				ASSERT_MEM_EQ(e[i].buf, data + e[i].off, CHUNK);
			}
			free(e[i].buf);
		}
		ioc_blk_close(blk);
		ASSERT_GT(enospc, 0);
	}
	free(data);
	unlink(path);
	free(path);
	umount(dir);
	rmdir(dir);
}

static void test_cleanup(void)
{
	rmdir(ioc_test_tmpdir());
	ioc_loop_free(bt_loop);
	bt_loop = NULL;
}

IOC_TEST_MAIN(
	IOC_TEST(test_fault_eio_short),
	IOC_TEST(test_fault_null),
	IOC_TEST(test_enospc),
	IOC_TEST(test_cleanup),
)
