/*
 * Data integrity of every backend x cache mode: concurrent coroutines do
 * random reads, writes (plain and FUA), write-zeroes and discards at random
 * offsets and sizes, aligned and misaligned (offset, length and memory),
 * through vectors of 1-3 pieces; every read is checked against a shadow
 * copy, and at the end the whole file, read with pread(2), must equal it.
 * Each coroutine owns its own 64 KiB regions, so the expected content is
 * exact while 16 requests are in flight.
 */
#include "blk-test.h"

#define REGION (64 * 1024)
#define NREGIONS 64
#define IMG_SIZE ((uint64_t)REGION * NREGIONS)
#define WORKERS 16
#define MAXLEN (20 * 1024)

struct integ {
	struct ioc_blk *blk;
	unsigned char *shadow;
	unsigned ops;
	unsigned finished;
	bool is_dev;
};

struct worker {
	struct integ *t;
	unsigned id;
	uint64_t seed;
	unsigned char *buf;   /* MAXLEN + 64 */
	unsigned char *check;
};

static void pick(struct worker *w, uint64_t *off, uint64_t *len)
{
	unsigned region = (unsigned)(bt_rand(&w->seed) % (NREGIONS / WORKERS)) * WORKERS + w->id;
	uint64_t base = (uint64_t)region * REGION;
	bool aligned = bt_rand(&w->seed) % 2;
	uint64_t o = bt_rand(&w->seed) % REGION;
	uint64_t l = 1 + bt_rand(&w->seed) % MAXLEN;

	if (aligned) {
		o &= ~(uint64_t)4095;
		l = (l + 4095) & ~(uint64_t)4095;
	}
	if (o + l > REGION)
		l = REGION - o;
	*off = base + o;
	*len = l;
}

/* Split [p, p+len) into 1-3 pieces. */
static int split(struct worker *w, unsigned char *p, uint64_t len, struct iovec *iov)
{
	int n = 1 + (int)(bt_rand(&w->seed) % 3);

	if (len < 3)
		n = 1;
	for (int i = 0; i < n; i++) {
		uint64_t piece = i == n - 1 ? len : 1 + bt_rand(&w->seed) % (len - (uint64_t)(n - 1 - i));

		if (i < n - 1 && bt_rand(&w->seed) % 2)
			piece = (piece + 511) & ~(uint64_t)511;
		if (piece > len - (uint64_t)(n - 1 - i))
			piece = len - (uint64_t)(n - 1 - i);
		iov[i].iov_base = p;
		iov[i].iov_len = piece;
		p += piece;
		len -= piece;
	}
	return n;
}

static void ioc_coroutine_fn worker_co(void *opaque)
{
	struct worker *w = opaque;
	struct integ *t = w->t;

	for (unsigned i = 0; i < t->ops; i++) {
		uint64_t off, len;
		struct iovec iov[3];
		unsigned kind = (unsigned)(bt_rand(&w->seed) % 10);
		/* Memory alignment: 4 KiB aligned or off by a few bytes. */
		unsigned char *p = w->buf + (bt_rand(&w->seed) % 2 ? 0 : 1 + bt_rand(&w->seed) % 31);
		int n, ret;

		pick(w, &off, &len);
		n = split(w, p, len, iov);
		if (kind < 4) {
			ret = ioc_blk_co_preadv(t->blk, off, iov, n, 0);
			ASSERT_EQ(ret, 0);
			ASSERT_MEM_EQ(p, t->shadow + off, len);
		} else if (kind < 8) {
			for (uint64_t j = 0; j < len; j++)
				p[j] = (unsigned char)bt_rand(&w->seed);
			ret = ioc_blk_co_pwritev(t->blk, off, iov, n,
						 kind == 7 ? IOC_BLK_FUA : 0);
			ASSERT_EQ(ret, 0);
			memcpy(t->shadow + off, p, len);
		} else if (kind == 8) {
			uint32_t fl = bt_rand(&w->seed) % 2 ? IOC_BLK_MAY_UNMAP : 0;

			ret = ioc_blk_co_write_zeroes(t->blk, off, len, fl);
			ASSERT_EQ(ret, 0);
			memset(t->shadow + off, 0, len);
		} else {
			ret = ioc_blk_co_discard(t->blk, off, len, 0);
			ASSERT_EQ(ret, 0);
			if (t->is_dev) {
				/* A device's discarded blocks read as
				 * anything: learn what they read as. */
				ASSERT_OK(ioc_blk_co_preadv(t->blk, off, iov, n, 0));
				memcpy(t->shadow + off, p, len);
			} else {
				memset(t->shadow + off, 0, len);
			}
		}
	}
	t->finished++;
}

/* Run the workers on path (a file or a device holding IMG_SIZE bytes). */
static void run_path(const struct bt_config *c, const char *path, const char *where)
{
	struct ioc_blk_opts opts = { .aio = c->aio, .cache = c->cache,
				     .no_fast_path = c->no_fast_path };
	/* Fewer rounds off tmpfs: FUA writes there wait for a real disk. */
	struct integ t = { .ops = (unsigned)ioc_test_scaled(strncmp(where, "tmpfs", 5) ? 60 : 150) };
	struct worker w[WORKERS];
	struct ioc_blk_info info;
	unsigned char *file = malloc(IMG_SIZE);
	int ret;

	t.shadow = malloc(IMG_SIZE);
	ASSERT_NOT_NULL(t.shadow);
	ASSERT_NOT_NULL(file);
	bt_read_file(path, t.shadow, IMG_SIZE);
	bt_get_loop();
	ret = ioc_blk_open(&t.blk, path, &opts);
	if (ret == -EINVAL && c->cache == IOC_BLK_CACHE_NONE) {
		ioc_test_diag("%s: O_DIRECT refused in %s", c->name, where);
		goto out;
	}
	ASSERT_OK(ret);
	ioc_blk_get_info(t.blk, &info);
	ioc_test_diag("%s in %s: aio=%s align=%u", c->name, where,
		      info.aio, info.min_align);
	ASSERT_UEQ(info.size, IMG_SIZE);
	t.is_dev = info.is_blockdev;
	for (unsigned i = 0; i < WORKERS; i++) {
		w[i] = (struct worker){ .t = &t, .id = i, .seed = 0x9e3779b97f4a7c15ull * (i + 1) };
		ASSERT_OK(posix_memalign((void **)&w[i].buf, 4096, MAXLEN + 4096));
		struct ioc_co *co = ioc_co_create(worker_co, &w[i]);

		ASSERT_NOT_NULL(co);
		ioc_co_enter(co);
	}
	while (t.finished < WORKERS)
		ioc_loop_poll(bt_loop, true);
	for (unsigned i = 0; i < WORKERS; i++)
		free(w[i].buf);
	ioc_blk_close(t.blk);
	bt_read_file(path, file, IMG_SIZE);
	ASSERT_MEM_EQ(file, t.shadow, IMG_SIZE);
out:
	free(file);
	free(t.shadow);
}

static void run_config(const struct bt_config *c, const char *dir)
{
	char *path = bt_make_image(dir, "integrity.img", IMG_SIZE, true);

	run_path(c, path, dir ? dir : "tmpfs");
	unlink(path);
	free(path);
}

static void test_tmpfs(void)
{
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bt_configs); i++)
		run_config(&bt_configs[i], NULL);
}

/* A disk file system: O_DIRECT with real alignment, so the bounce and
 * read-modify-write paths run. */
static void test_disk(void)
{
	const char *dir = bt_disk_dir();

	if (!dir)
		IOC_SKIP("no disk directory");
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bt_configs); i++)
		run_config(&bt_configs[i], dir);
	rmdir(dir);
}

static void ioc_coroutine_fn dev_zero_body(void *opaque)
{
	struct ioc_blk *blk = opaque;
	struct ioc_blk_info info;
	unsigned char buf[8192], zero[5000];
	struct iovec iov = { buf, sizeof(buf) };

	ioc_blk_get_info(blk, &info);
	ASSERT_TRUE(info.is_blockdev);
	ASSERT_UEQ(info.min_align, 4096);
	memset(zero, 0, sizeof(zero));
	memset(buf, 0x11, sizeof(buf));
	ASSERT_OK(ioc_blk_co_pwritev(blk, 0, &iov, 1, 0));
	ASSERT_EQ(ioc_blk_co_write_zeroes(blk, 100, 5000, IOC_BLK_NO_FALLBACK), -ENOTSUP);
	ASSERT_EQ(ioc_blk_co_write_zeroes(blk, 4096, 4096, IOC_BLK_NO_FALLBACK), 0);
	ASSERT_OK(ioc_blk_co_write_zeroes(blk, 100, 5000, 0));
	ASSERT_OK(ioc_blk_co_preadv(blk, 0, &iov, 1, 0));
	ASSERT_EQ(buf[99], 0x11);
	ASSERT_MEM_EQ(buf + 100, zero, 5000);
	ASSERT_EQ(buf[5100], 0);     /* the 4096..8191 block was zeroed */
	ASSERT_OK(ioc_blk_co_discard(blk, 100, 10000, 0));
}

/* A loop device with 4 KiB logical sectors: BLKSSZGET/STATX_DIOALIGN of a
 * block device, BLKDISCARD, fallocate on a device, bouncing at 4 KiB. */
static void test_blockdev(void)
{
	char *img = bt_make_image(NULL, "dev.img", IMG_SIZE, true);
	char *cmd = NULL, dev[64] = "";
	FILE *f;

	if (geteuid() != 0)
		IOC_SKIP("needs root for losetup");
	ASSERT_GE(asprintf(&cmd, "losetup --find --show --sector-size 4096 '%s' 2>/dev/null",
			   img), 0);
	f = popen(cmd, "r");
	free(cmd);
	if (f) {
		if (!fgets(dev, sizeof(dev), f))
			dev[0] = 0;
		pclose(f);
	}
	dev[strcspn(dev, "\n")] = 0;
	if (!dev[0] || access(dev, R_OK | W_OK) != 0) {
		unlink(img);
		free(img);
		IOC_SKIP("cannot set up a loop device");
	}
	ioc_test_diag("loop device %s", dev);
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bt_configs); i++)
		run_path(&bt_configs[i], dev, dev);
	{
		/* Partial logical blocks have no fast zeroing. */
		struct ioc_blk_opts opts = { .cache = IOC_BLK_CACHE_NONE };
		struct ioc_blk *blk;

		ASSERT_OK(ioc_blk_open(&blk, dev, &opts));
		bt_run_co_fn(dev_zero_body, blk);
		ioc_blk_close(blk);
	}
	ASSERT_GE(asprintf(&cmd, "losetup -d %s", dev), 0);
	ASSERT_EQ(system(cmd), 0);
	free(cmd);
	unlink(img);
	free(img);
}

/* ---- read-modify-write under cache=none ----------------------------- */

#define SLICES 64
#define SLICE 48 /* never a multiple of 512: every write is a partial block */

struct rmw_w {
	struct ioc_blk *blk;
	unsigned idx, round;
	unsigned *finished;
};

static void ioc_coroutine_fn rmw_co(void *opaque)
{
	struct rmw_w *w = opaque;
	unsigned char buf[SLICE];
	struct iovec iov = { buf, SLICE };

	memset(buf, (int)(w->idx + w->round * SLICES) & 0xff, SLICE);
	if (w->idx % 4 == 3)
		ASSERT_OK(ioc_blk_co_write_zeroes(w->blk, 4096 + (uint64_t)w->idx * SLICE,
						  SLICE, 0));
	else
		ASSERT_OK(ioc_blk_co_pwritev(w->blk, 4096 + (uint64_t)w->idx * SLICE,
					     &iov, 1, 0));
	(*w->finished)++;
}

/* 64 concurrent writes of 48 bytes each into the same few blocks: without
 * the tracking that serialises overlapping read-modify-writes, updates get
 * lost (the threads backend runs them in parallel). */
static void run_rmw(enum ioc_blk_aio aio, const char *dir)
{
	char *path = bt_make_image(dir, "rmw.img", 64 * 1024, true);
	struct ioc_blk_opts opts = { .aio = aio, .cache = IOC_BLK_CACHE_NONE };
	struct rmw_w w[SLICES];
	struct ioc_blk_info info;
	unsigned char file[SLICES * SLICE];
	unsigned rounds = (unsigned)ioc_test_scaled(6);

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&w[0].blk, path, &opts));
	ioc_blk_get_info(w[0].blk, &info);
	if (info.min_align < 512) {
		ioc_blk_close(w[0].blk);
		unlink(path);
		free(path);
		IOC_SKIP("no O_DIRECT alignment here");
	}
	for (unsigned r = 0; r < rounds; r++) {
		unsigned finished = 0;

		for (unsigned i = 0; i < SLICES; i++) {
			w[i] = (struct rmw_w){ .blk = w[0].blk, .idx = i, .round = r,
					       .finished = &finished };
			struct ioc_co *co = ioc_co_create(rmw_co, &w[i]);

			ASSERT_NOT_NULL(co);
			ioc_co_enter(co);
		}
		while (finished < SLICES)
			ioc_loop_poll(bt_loop, true);
		int fd = open(path, O_RDONLY);

		ASSERT_GE(fd, 0);
		ASSERT_EQ(pread(fd, file, sizeof(file), 4096), (ssize_t)sizeof(file));
		close(fd);
		for (unsigned i = 0; i < SLICES; i++)
			for (unsigned j = 0; j < SLICE; j++)
				ASSERT_EQ(file[i * SLICE + j],
					  i % 4 == 3 ? 0 : (i + r * SLICES) & 0xff);
	}
	ioc_blk_close(w[0].blk);
	unlink(path);
	free(path);
}

/* The aligned region of a write at an unaligned end of file must not grow
 * the file. */
static void ioc_coroutine_fn eof_body(void *opaque)
{
	struct ioc_blk *blk = opaque;
	unsigned char buf[300], back[300];
	struct iovec iov = { buf, 100 };

	memset(buf, 0xee, sizeof(buf));
	ASSERT_OK(ioc_blk_co_pwritev(blk, 900, &iov, 1, 0));
	iov.iov_base = back;
	iov.iov_len = 200;
	ASSERT_OK(ioc_blk_co_preadv(blk, 800, &iov, 1, 0));
	ASSERT_EQ(back[99], (unsigned char)((800 + 99) * 7 + 3));
	ASSERT_MEM_EQ(back + 100, buf, 100);
	ASSERT_EQ(ioc_blk_co_preadv(blk, 900, &iov, 1, 0), -EINVAL);
}

static void test_rmw(void)
{
	const char *dir = bt_disk_dir();
	struct ioc_blk_opts opts = { .cache = IOC_BLK_CACHE_NONE };
	struct ioc_blk *blk;
	struct stat st;
	char *path;

	if (!dir)
		IOC_SKIP("no disk directory");
	run_rmw(IOC_BLK_AIO_THREADS, dir);
	run_rmw(IOC_BLK_AIO_IO_URING, dir);

	path = bt_make_image(dir, "eof.img", 1000, true);
	ASSERT_OK(ioc_blk_open(&blk, path, &opts));
	bt_run_co_fn(eof_body, blk);
	ioc_blk_close(blk);
	ASSERT_EQ(stat(path, &st), 0);
	ASSERT_EQ(st.st_size, 1000);
	unlink(path);
	free(path);
	rmdir(dir);
}

static void test_cleanup(void)
{
	rmdir(ioc_test_tmpdir());
	ioc_loop_free(bt_loop);
	bt_loop = NULL;
}

IOC_TEST_MAIN(
	IOC_TEST(test_tmpfs),
	IOC_TEST(test_disk),
	IOC_TEST(test_blockdev),
	IOC_TEST(test_rmw),
	IOC_TEST(test_cleanup),
)
