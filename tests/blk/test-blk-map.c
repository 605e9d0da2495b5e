/*
 * Block status agrees with `qemu-img map --output=json` on the same file:
 * a sparse image with random data runs and punched holes, on tmpfs and on
 * a disk file system.  Both sides are merged into maximal extents of equal
 * (data, zero) flags and must be identical.  And the data region block
 * status remembers is forgotten by every operation that makes holes.
 */
#include "blk-test.h"

#define IMG_SIZE (8u << 20)
#define MAXEXT 4096

struct ext {
	uint64_t start, len;
	bool data, zero;
};

static int push(struct ext *e, int n, uint64_t start, uint64_t len, bool data, bool zero)
{
	if (n && e[n - 1].data == data && e[n - 1].zero == zero &&
	    e[n - 1].start + e[n - 1].len == start) {
		e[n - 1].len += len;
		return n;
	}
	ASSERT_LT(n, MAXEXT);
	e[n] = (struct ext){ start, len, data, zero };
	return n + 1;
}

static bool json_bool(const char *line, const char *key)
{
	const char *p = strstr(line, key);

	ASSERT_NOT_NULL(p);
	p += strlen(key);
	while (*p == ' ' || *p == ':')
		p++;
	return strncmp(p, "true", 4) == 0;
}

static uint64_t json_u64(const char *line, const char *key)
{
	const char *p = strstr(line, key);

	ASSERT_NOT_NULL(p);
	p += strlen(key);
	while (*p == ' ' || *p == ':')
		p++;
	return strtoull(p, NULL, 10);
}

static int qemu_map(const char *path, struct ext *e)
{
	char *cmd = NULL, line[512];
	FILE *f;
	int n = 0;

	ASSERT_GE(asprintf(&cmd, "qemu-img map --output=json -f raw '%s'", path), 0);
	f = popen(cmd, "r");
	ASSERT_NOT_NULL(f);
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "\"start\""))
			continue;
		n = push(e, n, json_u64(line, "\"start\""), json_u64(line, "\"length\""),
			 json_bool(line, "\"data\""), json_bool(line, "\"zero\""));
	}
	ASSERT_EQ(pclose(f), 0);
	free(cmd);
	return n;
}

struct map_arg {
	struct ioc_blk *blk;
	struct ext *e;
	int n;
};

static void ioc_coroutine_fn map_body(void *opaque)
{
	struct map_arg *a = opaque;
	uint64_t off = 0, size = (uint64_t)ioc_blk_size(a->blk);

	a->n = 0;
	while (off < size) {
		uint64_t pnum = 0;
		int st = ioc_blk_co_block_status(a->blk, off, size - off, &pnum, 0);

		ASSERT_GE(st, 0);
		ASSERT_UGT(pnum, 0);
		ASSERT_ULE(pnum, size - off);
		a->n = push(a->e, a->n, off, pnum, st & IOC_BLK_STATUS_DATA,
			    st & IOC_BLK_STATUS_ZERO);
		off += pnum;
	}
}

static void run_map(const char *dir, uint64_t seed)
{
	char *path = bt_make_image(dir, "map.img", IMG_SIZE, false);
	struct ext *ours = calloc(MAXEXT, sizeof(*ours));
	struct ext *theirs = calloc(MAXEXT, sizeof(*theirs));
	struct map_arg a = { .e = ours };
	char buf[65536];
	int fd = open(path, O_RDWR);
	int n;

	ASSERT_GE(fd, 0);
	memset(buf, 0x42, sizeof(buf));
	for (int i = 0; i < 40; i++) {
		uint64_t off = (bt_rand(&seed) % (IMG_SIZE / 4096)) * 4096;
		uint64_t len = (1 + bt_rand(&seed) % 16) * 4096;

		if (off + len > IMG_SIZE)
			len = IMG_SIZE - off;
		ASSERT_EQ(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
	}
	close(fd);
	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&a.blk, path, NULL));
	/* and some holes */
	for (int i = 0; i < 10; i++) {
		uint64_t off = (bt_rand(&seed) % (IMG_SIZE / 4096 - 2)) * 4096;

		fd = open(path, O_RDWR);
		ASSERT_OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				    (off_t)off, 8192));
		close(fd);
	}
	bt_run_co_fn(map_body, &a);
	n = qemu_map(path, theirs);
	for (int i = 0; i < n && i < a.n; i++) {
		if (ours[i].start != theirs[i].start || ours[i].len != theirs[i].len ||
		    ours[i].data != theirs[i].data || ours[i].zero != theirs[i].zero)
			ioc_test_fail(__FILE__, __LINE__,
				      "extent %d: ours %" PRIu64 "+%" PRIu64 " data=%d zero=%d,"
				      " qemu-img %" PRIu64 "+%" PRIu64 " data=%d zero=%d", i,
				      ours[i].start, ours[i].len, ours[i].data, ours[i].zero,
				      theirs[i].start, theirs[i].len, theirs[i].data,
				      theirs[i].zero);
	}
	ASSERT_EQ(a.n, n);
	ASSERT_GT(n, 4);
	ioc_test_diag("%d extents agree", n);
	ioc_blk_close(a.blk);
	unlink(path);
	free(path);
	free(ours);
	free(theirs);
}

static void test_map_tmpfs(void)
{
	if (system("qemu-img --version >/dev/null 2>&1") != 0)
		IOC_SKIP("no qemu-img");
	run_map(NULL, 1);
	run_map(NULL, 2);
}

static void test_map_disk(void)
{
	const char *dir = bt_disk_dir();

	if (system("qemu-img --version >/dev/null 2>&1") != 0)
		IOC_SKIP("no qemu-img");
	if (!dir)
		IOC_SKIP("no disk directory");
	run_map(dir, 3);
	rmdir(dir);
}

/* Block status remembers the data region SEEK_HOLE found (blk.c): every
 * way of making a hole through the block layer must forget it, or a hole
 * made after a status call would still be reported as data. */
struct region_arg {
	struct ioc_blk *blk;
};

static int status_at(struct ioc_blk *blk, uint64_t off, uint64_t *pnum)
{
	int st = ioc_blk_co_block_status(blk, off, (uint64_t)ioc_blk_size(blk) - off, pnum, 0);

	ASSERT_GE(st, 0);
	return st;
}

static void region_body(void *opaque)
{
	struct region_arg *a = opaque;
	struct ioc_blk *blk = a->blk;
	static char buf[65536];
	struct iovec iov = { buf, sizeof(buf) };
	uint64_t pnum;

	/* Dense: one data region over the whole 1 MiB. */
	ASSERT_EQ(status_at(blk, 0, &pnum), IOC_BLK_STATUS_DATA);
	ASSERT_UEQ(pnum, 1u << 20);
	ASSERT_EQ(status_at(blk, 4096, &pnum), IOC_BLK_STATUS_DATA);
	ASSERT_UEQ(pnum, (1u << 20) - 4096);

	ASSERT_OK(ioc_blk_co_discard(blk, 256 << 10, 64 << 10, 0));
	ASSERT_EQ(status_at(blk, 256 << 10, &pnum), IOC_BLK_STATUS_ZERO);
	ASSERT_UEQ(pnum, 64u << 10);
	ASSERT_EQ(status_at(blk, 0, &pnum), IOC_BLK_STATUS_DATA);
	ASSERT_UEQ(pnum, 256u << 10);

	ASSERT_OK(ioc_blk_co_write_zeroes(blk, 512 << 10, 64 << 10, IOC_BLK_MAY_UNMAP));
	ASSERT_EQ(status_at(blk, 512 << 10, &pnum) & IOC_BLK_STATUS_ZERO, IOC_BLK_STATUS_ZERO);

	/* Writing data into a hole needs no invalidation, but must show. */
	memset(buf, 0x5a, sizeof(buf));
	ASSERT_OK(ioc_blk_co_pwritev(blk, 256 << 10, &iov, 1, 0));
	ASSERT_EQ(status_at(blk, 256 << 10, &pnum), IOC_BLK_STATUS_DATA);

	/* Shrink and grow back: the tail is a hole now. */
	ASSERT_EQ(status_at(blk, 768 << 10, &pnum), IOC_BLK_STATUS_DATA);
	ASSERT_OK(ioc_blk_co_truncate(blk, 768 << 10, 0));
	ASSERT_OK(ioc_blk_co_truncate(blk, 1 << 20, 0));
	ASSERT_EQ(status_at(blk, 768 << 10, &pnum), IOC_BLK_STATUS_ZERO);
	ASSERT_UEQ(pnum, 256u << 10);
}

static void test_data_region_follows_holes(void)
{
	char *path = bt_make_image(NULL, "region.img", 1 << 20, true);
	struct region_arg a;

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&a.blk, path, NULL));
	bt_run_co_fn(region_body, &a);
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
	IOC_TEST(test_map_tmpfs),
	IOC_TEST(test_map_disk),
	IOC_TEST(test_data_region_follows_holes),
	IOC_TEST(test_cleanup),
)
