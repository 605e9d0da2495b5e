/*
 * Dirty bitmaps: marking by every kind of write, extents, clear, reset,
 * merge, disabled bitmaps, persistence across a clean close and across a
 * process that dies without closing, torn and stale sidecars, and the
 * ordering rule under threads racing a copier.
 */
#include <endian.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include "blk-test.h"
#include "src/blk/blk-int.h"

#define GRAN 65536u
#define SIZE (64u * GRAN + 4096u) /* the last granule is cut short */

struct wr {
	struct ioc_blk *blk;
	uint64_t off, len;
	int kind; /* 0 write, 1 zeroes, 2 discard */
	int ret;
};

static void ioc_coroutine_fn do_write(void *arg)
{
	struct wr *w = arg;

	if (w->kind == 0) {
		char *buf = malloc(w->len);
		struct iovec iov = { buf, w->len };

		memset(buf, 0x5a, w->len);
		w->ret = ioc_blk_co_pwritev(w->blk, w->off, &iov, 1, 0);
		free(buf);
	} else if (w->kind == 1) {
		w->ret = ioc_blk_co_write_zeroes(w->blk, w->off, w->len, 0);
	} else {
		w->ret = ioc_blk_co_discard(w->blk, w->off, w->len, 0);
	}
}

static void write_at(struct ioc_blk *blk, int kind, uint64_t off, uint64_t len)
{
	struct wr w = { blk, off, len, kind, -1 };

	bt_run_co_fn(do_write, &w);
	ASSERT_OK(w.ret);
}

/* The dirty extents as "start+len,..." for comparison. */
static void extents(struct ioc_blk_dirty *bm, char *out, size_t n)
{
	uint64_t off = 0, len;
	size_t pos = 0;

	out[0] = 0;
	while (off < SIZE) {
		int d = ioc_blk_dirty_extent(bm, off, UINT64_MAX, &len);

		ASSERT_GE(d, 0);
		ASSERT_UGT(len, 0);
		if (d)
			pos += (size_t)snprintf(out + pos, n - pos, "%s%llu+%llu", pos ? "," : "",
						(unsigned long long)off, (unsigned long long)len);
		off += len;
	}
}

static struct ioc_blk *open_img(const char *path)
{
	struct ioc_blk *blk;
	struct ioc_blk_opts o = { .aio = IOC_BLK_AIO_THREADS };

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&blk, path, &o));
	return blk;
}

static void test_marking(void)
{
	char *path = bt_make_image(NULL, "mark.img", SIZE, false);
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty *bm, *off, *b2;
	struct ioc_blk_dirty_info info;
	char ex[512];

	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "b0" }, &bm));
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "b0" }, NULL),
		  -EEXIST);
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "g", .granularity = 3000 }, NULL), -EINVAL);
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "g", .granularity = 256 }, NULL), -EINVAL);
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "g", .granularity = UINT64_C(4) << 30 }, NULL), -EINVAL);
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "off", .disabled = true }, &off));

	write_at(blk, 0, 4096, 512);                 /* granule 0 */
	write_at(blk, 0, 3 * GRAN - 512, 1024);      /* granules 2 and 3 */
	write_at(blk, 1, 10 * GRAN, GRAN);           /* granule 10 exactly */
	write_at(blk, 2, 20 * GRAN + 1, 1);          /* granule 20 */
	write_at(blk, 0, 64 * GRAN, 4096);           /* the short last one */
	extents(bm, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "0+65536,131072+131072,655360+65536,1310720+65536,4194304+4096");
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_UEQ(info.count, 5 * GRAN + 4096);
	ASSERT_TRUE(info.recording);
	ASSERT_FALSE(info.persistent);
	ioc_blk_dirty_get_info(off, &info);
	ASSERT_UEQ(info.count, 0);
	ASSERT_FALSE(info.recording);

	/* maxlen clips an extent. */
	uint64_t len;
	ASSERT_EQ(ioc_blk_dirty_extent(bm, 2 * GRAN + 100, 1000, &len), 1);
	ASSERT_UEQ(len, 1000);
	ASSERT_EQ(ioc_blk_dirty_extent(bm, SIZE, 1, &len), -EINVAL);

	/* A copier's reset: whole granules, reports whether any was dirty. */
	ASSERT_EQ(ioc_blk_dirty_reset(bm, 2 * GRAN, GRAN), 1);
	ASSERT_EQ(ioc_blk_dirty_reset(bm, 2 * GRAN, GRAN), 0);

	/* Merge into the disabled one: it takes the bits, still records nothing. */
	ASSERT_OK(ioc_blk_dirty_merge(off, bm));
	extents(off, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "0+65536,196608+65536,655360+65536,1310720+65536,4194304+4096");
	write_at(blk, 0, 30 * GRAN, 1);
	ioc_blk_dirty_get_info(off, &info);
	ASSERT_UEQ(info.count, 4 * GRAN + 4096);
	ASSERT_OK(ioc_blk_dirty_set_recording(off, true));
	write_at(blk, 0, 31 * GRAN, 1);
	ioc_blk_dirty_get_info(off, &info);
	ASSERT_UEQ(info.count, 5 * GRAN + 4096);

	/* Merge across granularities: 4 KiB into 64 KiB rounds out. */
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "fine", .granularity = 4096 }, &b2));
	write_at(blk, 0, 40 * GRAN + 8192, 100);
	ioc_blk_dirty_get_info(b2, &info);
	ASSERT_UEQ(info.count, 4096);
	ASSERT_OK(ioc_blk_dirty_clear(bm));
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_UEQ(info.count, 0);
	ASSERT_OK(ioc_blk_dirty_merge(bm, b2));
	extents(bm, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "2621440+65536");

	struct ioc_blk_dirty_info list[4];
	ASSERT_EQ(ioc_blk_dirty_list(blk, NULL, 0), 3);
	ASSERT_EQ(ioc_blk_dirty_list(blk, list, 4), 3);
	ASSERT_STR_EQ(list[0].name, "b0");
	ASSERT_STR_EQ(list[2].name, "fine");
	ASSERT_OK(ioc_blk_dirty_remove(blk, "b0"));
	ASSERT_EQ(ioc_blk_dirty_remove(blk, "b0"), -ENOENT);
	ASSERT_NULL(ioc_blk_dirty_find(blk, "b0"));
	ASSERT_EQ(ioc_blk_dirty_list(blk, list, 4), 2);
	write_at(blk, 0, 0, 1); /* no bitmap named b0 is touched */
	ioc_blk_close(blk);
	unlink(path);
	free(path);
}


static int64_t fail_writes(void *opaque, enum blk_op op, uint64_t offset, uint64_t len)
{
	return op == BLK_OP_WRITE || op == BLK_OP_ZEROES ? -EIO : 0;
}

/* A failed write may have changed part of its range: it is marked too. */
static void test_failed_write_marked(void)
{
	char *path = bt_make_image(NULL, "fail.img", SIZE, false);
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty *bm;
	struct ioc_blk_dirty_info info;
	struct wr w = { blk, 3 * GRAN, 4096, 0, 0 };

	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "f" }, &bm));
	ioc__blk_set_fault(blk, fail_writes, NULL);
	bt_run_co_fn(do_write, &w);
	ASSERT_EQ(w.ret, -EIO);
	w = (struct wr){ blk, 9 * GRAN, GRAN, 1, 0 };
	bt_run_co_fn(do_write, &w);
	ASSERT_EQ(w.ret, -EIO);
	ioc__blk_set_fault(blk, NULL, NULL);
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_UEQ(info.count, 2 * GRAN);
	ioc_blk_close(blk);
	unlink(path);
	free(path);
}

static char *sidecar(const char *img, const char *name)
{
	char *p;

	ASSERT_GT(asprintf(&p, "%s.%s.iocbm", img, name), 0);
	return p;
}

static void test_persist_clean(void)
{
	char *path = bt_make_image(NULL, "pc.img", SIZE, false);
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty *bm;
	struct ioc_blk_dirty_info info;
	char ex[512], ex2[512];

	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "a/b", .persistent = true }, NULL), -EINVAL);
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "p0", .persistent = true, .granularity = 4096 }, &bm));
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "p1", .persistent = true, .disabled = true }, NULL));
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "t" }, NULL));
	write_at(blk, 0, 8192, 4096);
	write_at(blk, 2, 50 * GRAN, 3 * GRAN);
	extents(bm, ex, sizeof(ex));
	ioc_blk_close(blk);

	blk = open_img(path);
	ASSERT_EQ(ioc_blk_dirty_load(blk), 2);
	ASSERT_NULL(ioc_blk_dirty_find(blk, "t")); /* not persistent */
	bm = ioc_blk_dirty_find(blk, "p0");
	ASSERT_NOT_NULL(bm);
	extents(bm, ex2, sizeof(ex2));
	ASSERT_STR_EQ(ex, ex2);
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_TRUE(info.recording && info.persistent && !info.inconsistent);
	ASSERT_UEQ(info.granularity, 4096);
	ioc_blk_dirty_get_info(ioc_blk_dirty_find(blk, "p1"), &info);
	ASSERT_FALSE(info.recording);
	ASSERT_UEQ(info.count, 0);
	/* Loading twice adds nothing. */
	ASSERT_EQ(ioc_blk_dirty_load(blk), 0);
	/* Remove deletes the sidecar. */
	char *sc = sidecar(path, "p1");
	ASSERT_OK(access(sc, F_OK));
	ASSERT_OK(ioc_blk_dirty_remove(blk, "p1"));
	ASSERT_EQ(access(sc, F_OK), -1);
	ioc_blk_close(blk);
	free(sc);
	sc = sidecar(path, "p0");
	unlink(sc);
	free(sc);
	unlink(path);
	free(path);
}

/*
 * Write-ahead: a write's bits are in the sidecar before the image changes,
 * so one that lands and is never acknowledged (the process dies before it
 * completes) is still marked.  The fault hook runs just before each
 * transfer is issued; it reads the sidecar's words from the file and
 * counts the granules of the transfer whose bit is not there yet.
 */
struct ahead {
	const char *sidecar;
	int checked, missing;
};

static int64_t check_ahead(void *opaque, enum blk_op op, uint64_t offset, uint64_t len)
{
	struct ahead *a = opaque;
	int fd;

	if (op != BLK_OP_WRITE && op != BLK_OP_ZEROES && op != BLK_OP_DISCARD)
		return 0;
	fd = open(a->sidecar, O_RDONLY);
	ASSERT_GE(fd, 0);
	for (uint64_t g = offset / GRAN; g <= (offset + len - 1) / GRAN; g++) {
		uint64_t w = 0;

		ASSERT_EQ(pread(fd, &w, 8, (off_t)(4096 + g / 64 * 8)), 8);
		if (!((le64toh(w) >> (g % 64)) & 1))
			a->missing++;
		a->checked++;
	}
	close(fd);
	return 0;
}

static void test_persist_write_ahead(void)
{
	char *path = bt_make_image(NULL, "ahead.img", SIZE, false);
	char *sc = sidecar(path, "a");
	struct ahead a = { sc, 0, 0 };
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty_info info;
	struct ioc_blk_dirty *bm;

	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "a", .persistent = true }, &bm));
	ioc__blk_set_fault(blk, check_ahead, &a);
	write_at(blk, 0, 2 * GRAN + 100, 10);
	write_at(blk, 0, 63 * GRAN, GRAN + 4096); /* to the end, across a word */
	write_at(blk, 1, 20 * GRAN, GRAN);
	write_at(blk, 2, 30 * GRAN, GRAN);
	ioc__blk_set_fault(blk, NULL, NULL);
	ASSERT_GE(a.checked, 5);
	ASSERT_EQ(a.missing, 0);
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_UEQ(info.count, 4 * GRAN + 4096);
	ASSERT_OK(ioc_blk_dirty_remove(blk, "a"));
	ioc_blk_close(blk);
	unlink(path);
	free(sc);
	free(path);
}

/* A child marks through real writes and dies with SIGKILL, never closing:
 * every write it finished must be marked when the image is opened again. */
/*
 * The child of test_persist_kill(): a fresh process image (fork then exec of
 * this test binary, so no thread or coroutine state of the parent is
 * inherited, which ThreadSanitizer cannot follow across a bare fork).  It
 * acknowledges each persistent write on fd 3, then kills itself.
 */
static void persist_kill_child(const char *path)
{
	struct ioc_blk *blk;
	struct ioc_blk_opts o = { .aio = IOC_BLK_AIO_THREADS };

	bt_get_loop();
	if (ioc_blk_open(&blk, path, &o) ||
	    ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		    .name = "k", .persistent = true }, NULL))
		_exit(1);
	for (int i = 0; i < 64; i += 3) {
		write_at(blk, 0, (uint64_t)i * GRAN + 17, 10);
		/* Acknowledged: tell the parent. */
		if (write(3, &i, sizeof(i)) != sizeof(i))
			_exit(1);
	}
	raise(SIGKILL);
	_exit(1);
}

__attribute__((constructor)) static void persist_kill_child_entry(void)
{
	const char *path = getenv("IOC_DIRTY_KILL_CHILD");

	if (path)
		persist_kill_child(path);
}

static void test_persist_kill(void)
{
	char *path = bt_make_image(NULL, "pk.img", SIZE, false);
	int pfd[2];
	pid_t pid;
	char ex[512];

	ASSERT_OK(pipe(pfd));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		char self[4096];
		ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		const char *argv[] = { self, NULL };

		if (n <= 0 || dup2(pfd[1], 3) < 0 ||
		    setenv("IOC_DIRTY_KILL_CHILD", path, 1))
			_exit(1);
		self[n] = 0;
		/* Through the cross build's emulator, where there is one. */
		ioc_test_exec_tool(argv);
		_exit(1);
	}
	close(pfd[1]);
	int last = -1, i, st;
	while (read(pfd[0], &i, sizeof(i)) == sizeof(i))
		last = i;
	close(pfd[0]);
	ASSERT_EQ(waitpid(pid, &st, 0), pid);
	ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	ASSERT_EQ(last, 63);

	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty_info info;
	struct ioc_blk_dirty *bm;

	ASSERT_EQ(ioc_blk_dirty_load(blk), 1);
	bm = ioc_blk_dirty_find(blk, "k");
	ASSERT_NOT_NULL(bm);
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_FALSE(info.inconsistent);
	ASSERT_UEQ(info.count, 22 * GRAN);
	for (int g = 0; g < 64; g++) {
		uint64_t len;

		ASSERT_EQ(ioc_blk_dirty_extent(bm, (uint64_t)g * GRAN, GRAN, &len), g % 3 == 0);
	}
	(void)ex;
	ioc_blk_close(blk);
	char *sc = sidecar(path, "k");
	unlink(sc);
	free(sc);
	unlink(path);
	free(path);
}

static void make_clean(const char *path)
{
	struct ioc_blk *blk = open_img(path);

	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "x", .persistent = true }, NULL));
	write_at(blk, 0, 5 * GRAN, 1);
	ioc_blk_close(blk);
}

static void expect_inconsistent(const char *path)
{
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty_info info;
	struct ioc_blk_dirty *bm;
	uint64_t len;

	ASSERT_EQ(ioc_blk_dirty_load(blk), 1);
	bm = ioc_blk_dirty_find(blk, "x");
	ASSERT_NOT_NULL(bm);
	ioc_blk_dirty_get_info(bm, &info);
	ASSERT_TRUE(info.inconsistent);
	ASSERT_FALSE(info.recording);
	ASSERT_EQ(ioc_blk_dirty_extent(bm, 0, 1, &len), -EUCLEAN);
	ASSERT_EQ(ioc_blk_dirty_clear(bm), -EUCLEAN);
	ASSERT_EQ(ioc_blk_dirty_set_recording(bm, true), -EUCLEAN);
	ioc_blk_close(blk);
	/* Closing left the sidecar as it was: still inconsistent. */
	blk = open_img(path);
	ASSERT_EQ(ioc_blk_dirty_load(blk), 1);
	ioc_blk_dirty_get_info(ioc_blk_dirty_find(blk, "x"), &info);
	ASSERT_TRUE(info.inconsistent);
	ASSERT_OK(ioc_blk_dirty_remove(blk, "x"));
	ioc_blk_close(blk);
}

static void patch(const char *file, off_t off, uint8_t xor)
{
	int fd = open(file, O_RDWR);
	uint8_t b;

	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, &b, 1, off), 1);
	b ^= xor;
	ASSERT_EQ(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static void test_torn(void)
{
	char *path = bt_make_image(NULL, "torn.img", SIZE, false);
	char *sc = sidecar(path, "x");

	/* A bit flipped in the words of a clean sidecar. */
	make_clean(path);
	patch(sc, 4096, 0x40);
	expect_inconsistent(path);
	/* The header's crc. */
	make_clean(path);
	patch(sc, 20, 1);
	expect_inconsistent(path);
	/* Cut short. */
	make_clean(path);
	ASSERT_OK(truncate(sc, 4096 + 8));
	expect_inconsistent(path);
	/* Shorter than a header; empty. */
	make_clean(path);
	ASSERT_OK(truncate(sc, 100));
	expect_inconsistent(path);
	make_clean(path);
	ASSERT_OK(truncate(sc, 0));
	expect_inconsistent(path);
	/* The image changed size: stale. */
	make_clean(path);
	ASSERT_OK(truncate(path, SIZE + GRAN));
	expect_inconsistent(path);
	ASSERT_OK(truncate(path, SIZE));
	/* Intact: consistent (the cases above fail for their reason). */
	make_clean(path);
	{
		struct ioc_blk *blk = open_img(path);
		struct ioc_blk_dirty_info info;

		ASSERT_EQ(ioc_blk_dirty_load(blk), 1);
		ioc_blk_dirty_get_info(ioc_blk_dirty_find(blk, "x"), &info);
		ASSERT_FALSE(info.inconsistent);
		ASSERT_UEQ(info.count, GRAN);
		ASSERT_OK(ioc_blk_dirty_remove(blk, "x"));
		ioc_blk_close(blk);
	}
	unlink(path);
	free(sc);
	free(path);
}

/*
 * The ordering rule, as a model: "the image" is an array of granules that
 * writers store into (the write completing) and then mark; a copier resets
 * a granule and, if it was dirty, reads it.  When the writers are done and
 * the copier has made one last pass, the copy must equal the image.
 */
#define SG 64
struct stress {
	struct ioc_blk *blk;
	struct ioc_blk_dirty *bm;
	_Atomic uint64_t image[SG];
	uint64_t copy[SG];
	_Atomic int writers_left;
	unsigned seed;
};

static void *writer(void *arg)
{
	struct stress *s = arg;
	uint64_t r = __atomic_add_fetch(&s->seed, 7919, __ATOMIC_RELAXED);
	unsigned long n = ioc_test_scaled(200000);

	for (unsigned long i = 0; i < n; i++) {
		unsigned g = (unsigned)(bt_rand(&r) % SG);

		/* The write reaches the image... */
		atomic_fetch_add_explicit(&s->image[g], 1, memory_order_relaxed);
		/* ...then it is marked. */
		ASSERT_OK(ioc__blk_dirty_mark(s->blk, (uint64_t)g * 4096, 4096));
	}
	atomic_fetch_sub_explicit(&s->writers_left, 1, memory_order_release);
	return NULL;
}

static void copy_pass(struct stress *s)
{
	for (unsigned g = 0; g < SG; g++)
		if (ioc_blk_dirty_reset(s->bm, (uint64_t)g * 4096, 4096) == 1)
			s->copy[g] = atomic_load_explicit(&s->image[g], memory_order_relaxed);
}

static void test_ordering_stress(void)
{
	struct stress *s = calloc(1, sizeof(*s));
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = SG * 4096 };
	pthread_t th[2];

	ASSERT_OK(ioc_blk_open(&s->blk, NULL, &o));
	ASSERT_OK(ioc_blk_dirty_add(s->blk, &(struct ioc_blk_dirty_opts){
		.name = "s", .granularity = 4096 }, &s->bm));
	s->seed = 1;
	atomic_init(&s->writers_left, 2);
	for (int i = 0; i < 2; i++)
		ASSERT_OK(pthread_create(&th[i], NULL, writer, s));
	while (atomic_load_explicit(&s->writers_left, memory_order_acquire))
		copy_pass(s);
	for (int i = 0; i < 2; i++)
		ASSERT_OK(pthread_join(th[i], NULL));
	copy_pass(s);
	for (unsigned g = 0; g < SG; g++)
		ASSERT_UEQ(s->copy[g], atomic_load_explicit(&s->image[g], memory_order_relaxed));
	ioc_blk_close(s->blk);
	free(s);
}


/*
 * The same rule, exhaustively: a writer does two steps, "write" and
 * "mark", in either order; a copier does "reset" then "read".  Every
 * interleaving of the two, then the copier's final pass, must leave the
 * copy up to date when the writer marks after writing; marking first must
 * lose the write in some interleaving (so this check can fail).
 */
static int lost_writes(bool mark_first)
{
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = 4096 };
	int lost = 0;

	/* Positions of the copier's 2 steps among 4: C(4,2) = 6 schedules. */
	for (unsigned sched = 0; sched < 16; sched++) {
		struct ioc_blk *blk;
		struct ioc_blk_dirty *bm;
		uint64_t image = 0, copy = 0;
		int w = 0, c = 0;

		if (__builtin_popcount(sched) != 2)
			continue;
		ASSERT_OK(ioc_blk_open(&blk, NULL, &o));
		ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
			.name = "m", .granularity = 4096 }, &bm));
		for (int step = 0; step < 4; step++) {
			if (sched & (1u << step)) {
				if (c++ == 0)
					ioc_blk_dirty_reset(bm, 0, 4096);
				else
					copy = image;  /* read (copies whatever is there) */
			} else {
				bool do_mark = (w++ == 0) == mark_first;

				if (do_mark)
					ASSERT_OK(ioc__blk_dirty_mark(blk, 0, 4096));
				else
					image = 1;
			}
		}
		if (ioc_blk_dirty_reset(bm, 0, 4096) == 1)
			copy = image;
		lost += copy != image;
		ioc_blk_close(blk);
	}
	return lost;
}

static void test_ordering_model(void)
{
	ASSERT_EQ(lost_writes(false), 0);
	ASSERT_GT(lost_writes(true), 0);
}

/* A set fed from outside with a store: adds and removes of persistent
 * bitmaps reach it (a refusal refuses), marks come from
 * ioc_blk_dirty_mark(), the bits go out and come back as qcow2's
 * little-endian bit array, and a bitmap created inconsistent refuses all
 * but removal. */
static int store_adds, store_removes, store_fail;
static char store_last[IOC_BLK_DIRTY_NAME_MAX];

static int st_add(void *opaque, const struct ioc_blk_dirty_info *info)
{
	(void)opaque;
	if (store_fail)
		return store_fail;
	store_adds++;
	snprintf(store_last, sizeof(store_last), "%s", info->name);
	return 0;
}

static int st_remove(void *opaque, const char *name)
{
	(void)opaque;
	if (store_fail)
		return store_fail;
	store_removes++;
	snprintf(store_last, sizeof(store_last), "%s", name);
	return 0;
}

static void test_store(void)
{
	static const struct ioc_blk_dirty_store st = { st_add, st_remove };
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = SIZE };
	struct ioc_blk_dirty *bm, *bad, *t;
	struct ioc_blk_dirty_info info;
	struct ioc_blk *blk;
	uint8_t bits[16], back[16];
	uint64_t len;

	ASSERT_OK(ioc_blk_open(&blk, NULL, &o));
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "p",
			.persistent = true }, NULL), -ENOTSUP);
	ioc_blk_dirty_set_store(blk, &st, NULL);
	/* Any name a store takes (not a file name's characters). */
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "p q/r",
			.persistent = true }, &bm));
	ASSERT_EQ(store_adds, 1);
	ASSERT_STR_EQ(store_last, "p q/r");
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "t" }, &t));
	ASSERT_EQ(store_adds, 1);       /* not persistent: not the store's */
	store_fail = -ENOSPC;
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "f",
			.persistent = true }, NULL), -ENOSPC);
	ASSERT_NULL(ioc_blk_dirty_find(blk, "f"));
	store_fail = 0;

	/* Marks from outside, bits out. */
	ASSERT_OK(ioc_blk_dirty_mark(blk, GRAN + 1, 1));
	ASSERT_OK(ioc_blk_dirty_mark(blk, 9 * GRAN, 2 * GRAN));
	ASSERT_OK(ioc_blk_dirty_export(bm, 0, bits, sizeof(bits)));
	ASSERT_EQ(bits[0], 0x02);
	ASSERT_EQ(bits[1], 0x06);       /* granules 9 and 10 */
	for (size_t i = 2; i < sizeof(bits); i++)
		ASSERT_EQ(bits[i], 0);      /* 65 granules: the rest reads as 0 */
	ASSERT_EQ(ioc_blk_dirty_export(bm, 3, bits, sizeof(bits)), -EINVAL);

	/* Bits in, past the end ignored. */
	memset(bits, 0xff, sizeof(bits));
	ASSERT_OK(ioc_blk_dirty_import(t, 0, bits, sizeof(bits)));
	ioc_blk_dirty_get_info(t, &info);
	ASSERT_UEQ(info.count, SIZE);
	ASSERT_EQ(ioc_blk_dirty_extent(t, 0, UINT64_MAX, &len), 1);
	ASSERT_UEQ(len, SIZE);
	ASSERT_OK(ioc_blk_dirty_export(t, 0, back, sizeof(back)));
	ASSERT_EQ(back[8], 0x01);       /* granule 64, the cut-short one */
	ASSERT_EQ(back[9], 0);

	/* Inconsistent: listed, refused, removable (the store is told). */
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "bad",
			.persistent = true, .inconsistent = true }, &bad));
	ioc_blk_dirty_get_info(bad, &info);
	ASSERT_TRUE(info.inconsistent);
	ASSERT_FALSE(info.recording);
	ASSERT_EQ(ioc_blk_dirty_clear(bad), -EUCLEAN);
	ASSERT_EQ(ioc_blk_dirty_set_recording(bad, true), -EUCLEAN);
	ASSERT_EQ(ioc_blk_dirty_extent(bad, 0, 1, &len), -EUCLEAN);
	store_fail = -EIO;
	ASSERT_EQ(ioc_blk_dirty_remove(blk, "bad"), -EIO);
	ASSERT_NOT_NULL(ioc_blk_dirty_find(blk, "bad"));
	store_fail = 0;
	ASSERT_OK(ioc_blk_dirty_remove(blk, "bad"));
	ASSERT_EQ(store_removes, 1);
	ASSERT_STR_EQ(store_last, "bad");
	ASSERT_OK(ioc_blk_dirty_remove(blk, "t"));
	ASSERT_EQ(store_removes, 1);
	ioc_blk_close(blk);
}

/* QEMU's limits: more than 16 bitmaps, names of 1023 bytes, granularity
 * 512 bytes to 2 GiB; the markers walk the recording bitmaps only. */
#define NB 40
static void test_limits(void)
{
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = SIZE };
	struct ioc_blk_dirty *bm[NB], *fine, *big, *h[NB + 4];
	struct ioc_blk_dirty_info info;
	char name[1100], ex[256];
	struct ioc_blk *blk;
	unsigned saved;

	ASSERT_OK(ioc_blk_open(&blk, NULL, &o));
	for (int i = 0; i < NB; i++) {
		snprintf(name, sizeof(name), "b%d", i);
		ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = name,
				.disabled = i % 2 }, &bm[i]));
	}
	memset(name, 'n', 1023);
	name[1023] = 0;
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = name,
			.granularity = 512 }, &fine));
	ASSERT_PTR_EQ(ioc_blk_dirty_find(blk, name), fine);
	ioc_blk_dirty_get_info(fine, &info);
	ASSERT_STR_EQ(info.name, name);
	ASSERT_UEQ(info.granularity, 512);
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "big",
			.granularity = UINT64_C(1) << 31 }, &big));
	name[1023] = 'n';
	name[1024] = 0;
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = name }, NULL),
		  -EINVAL);
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "g256",
			.granularity = 256 }, NULL), -EINVAL);
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "g4G",
			.granularity = UINT64_C(1) << 32 }, NULL), -EINVAL);
	saved = blk->dirty_count;
	blk->dirty_count = IOC_BLK_DIRTY_MAX;      /* as if full */
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = "x" }, NULL),
		  -ENOSPC);
	blk->dirty_count = saved;

	/* Every bitmap listed, in creation order. */
	ASSERT_EQ(ioc_blk_dirty_handles(blk, h, NB + 4), NB + 2);
	for (int i = 0; i < NB; i++)
		ASSERT_PTR_EQ(h[i], bm[i]);
	ASSERT_PTR_EQ(h[NB], fine);
	ASSERT_STR_EQ(ioc_blk_dirty_name(h[NB + 1]), "big");

	/* A write marks the recording ones only; 512-byte granules. */
	ASSERT_OK(ioc_blk_dirty_mark(blk, 1000, 1));
	ASSERT_OK(ioc_blk_dirty_mark(blk, 8192, 4096));
	for (int i = 0; i < NB; i++) {
		ioc_blk_dirty_get_info(bm[i], &info);
		ASSERT_UEQ(info.count, i % 2 ? 0 : GRAN);
	}
	extents(fine, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "512+512,8192+4096");
	ioc_blk_dirty_get_info(big, &info);
	ASSERT_UEQ(info.count, SIZE);             /* one granule, clipped */
	ASSERT_EQ(ioc_blk_dirty_reset(fine, 8704, 512), 1);
	extents(fine, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "512+512,8192+512,9216+3072");

	/* The markers' set follows enable and disable; with none recording
	 * it is gone (the fast path). */
	for (int i = 0; i < NB; i += 2)
		ASSERT_OK(ioc_blk_dirty_set_recording(bm[i], false));
	ASSERT_OK(ioc_blk_dirty_set_recording(fine, false));
	ASSERT_OK(ioc_blk_dirty_set_recording(big, false));
	ASSERT_NULL(atomic_load(&blk->dirty_rec));
	ASSERT_OK(ioc_blk_dirty_set_recording(bm[NB - 1], true));
	ASSERT_OK(ioc_blk_dirty_mark(blk, 2 * GRAN, 1));
	ioc_blk_dirty_get_info(bm[NB - 1], &info);
	ASSERT_UEQ(info.count, GRAN);
	ioc_blk_dirty_get_info(bm[NB - 2], &info);
	ASSERT_UEQ(info.count, GRAN);             /* the first write only */

	/* Removing most of them compacts; the rest go on being found and
	 * marked. */
	for (int i = 0; i < NB - 3; i++) {
		snprintf(name, sizeof(name), "b%d", i);
		ASSERT_OK(ioc_blk_dirty_remove(blk, name));
	}
	ASSERT_OK(ioc_blk_dirty_set_recording(bm[NB - 3], true));
	ASSERT_OK(ioc_blk_dirty_mark(blk, 3 * GRAN, 1));
	ioc_blk_dirty_get_info(bm[NB - 3], &info);
	ASSERT_UEQ(info.count, GRAN);
	ioc_blk_dirty_get_info(bm[NB - 1], &info);
	ASSERT_UEQ(info.count, 2 * GRAN);
	ASSERT_PTR_EQ(ioc_blk_dirty_find(blk, "b38"), bm[NB - 2]);
	ASSERT_NULL(ioc_blk_dirty_find(blk, "b0"));
	ASSERT_EQ(ioc_blk_dirty_list(blk, NULL, 0), 5);
	ioc_blk_close(blk);
}

/* A sidecar keeps a 512-byte granularity; its name stays below 128 bytes
 * (part of a file name). */
static void test_persist_fine(void)
{
	char *path = bt_make_image(NULL, "pf.img", SIZE, false), name[200], ex[256];
	struct ioc_blk *blk = open_img(path);
	struct ioc_blk_dirty *bm;

	memset(name, 's', 128);
	name[128] = 0;
	ASSERT_EQ(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = name,
			.persistent = true }, NULL), -EINVAL);
	name[127] = 0;
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){ .name = name,
			.persistent = true, .granularity = 512 }, &bm));
	write_at(blk, 0, 1536, 100);
	ioc_blk_close(blk);
	blk = open_img(path);
	ASSERT_EQ(ioc_blk_dirty_load(blk), 1);
	bm = ioc_blk_dirty_find(blk, name);
	ASSERT_NOT_NULL(bm);
	extents(bm, ex, sizeof(ex));
	ASSERT_STR_EQ(ex, "1536+512");
	ASSERT_OK(ioc_blk_dirty_remove(blk, name));
	ioc_blk_close(blk);
	unlink(path);
	free(path);
}

/* Adds, removes, enables and disables while another thread marks: the
 * sets grow, compact and empty under it, and a bitmap that records all
 * along misses nothing. */
struct churn {
	struct ioc_blk *blk;
	struct ioc_blk_dirty *keep;
	_Atomic bool stop;
	_Atomic bool started;   /* the marker's first mark is done */
	uint64_t marked, missed;
};

/* Each mark must reach keep at once: checked, then cleared for the next. */
static void *churn_marker(void *arg)
{
	struct churn *c = arg;
	uint64_t len;

	/* Relaxed: a flag the main thread sets once it is done. */
	for (uint64_t g = 0; !atomic_load_explicit(&c->stop, memory_order_relaxed); g++) {
		uint64_t off = (g % 64) * GRAN;

		ASSERT_OK(ioc_blk_dirty_mark(c->blk, off, 1));
		if (ioc_blk_dirty_extent(c->keep, off, GRAN, &len) != 1)
			c->missed++;
		ASSERT_EQ(ioc_blk_dirty_reset(c->keep, off, 1), 1);
		c->marked++;
		/* Release: pairs with test_churn()'s acquire wait, so the
		 * churn starts with the marker running. */
		atomic_store_explicit(&c->started, true, memory_order_release);
	}
	return NULL;
}

static void test_churn(void)
{
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = SIZE };
	struct churn c = { 0 };
	struct ioc_blk_dirty *bm;
	char name[32];
	pthread_t t;

	ASSERT_OK(ioc_blk_open(&c.blk, NULL, &o));
	ASSERT_OK(ioc_blk_dirty_add(c.blk, &(struct ioc_blk_dirty_opts){ .name = "keep" },
				    &c.keep));
	ASSERT_EQ(pthread_create(&t, NULL, churn_marker, &c), 0);
	/* Not a timing wait: the churn must overlap marks, however the
	 * threads are scheduled.  Acquire: pairs with the marker's release. */
	while (!atomic_load_explicit(&c.started, memory_order_acquire))
		sched_yield();
	for (int round = 0; round < 30; round++) {
		for (int i = 0; i < 50; i++) {
			snprintf(name, sizeof(name), "c%d", i);
			ASSERT_OK(ioc_blk_dirty_add(c.blk, &(struct ioc_blk_dirty_opts){
					.name = name, .disabled = i % 3 == 0 }, &bm));
			if (i % 3 == 1)
				ASSERT_OK(ioc_blk_dirty_set_recording(bm, false));
		}
		for (int i = 0; i < 50; i++) {
			snprintf(name, sizeof(name), "c%d", i);
			bm = ioc_blk_dirty_find(c.blk, name);
			ASSERT_NOT_NULL(bm);
			if (i % 3 == 0)
				ASSERT_OK(ioc_blk_dirty_set_recording(bm, true));
			ASSERT_OK(ioc_blk_dirty_remove(c.blk, name));
		}
	}
	/* Relaxed: pthread_join() orders the rest. */
	atomic_store_explicit(&c.stop, true, memory_order_relaxed);
	ASSERT_EQ(pthread_join(t, NULL), 0);
	ASSERT_UEQ(c.missed, 0);
	ASSERT_UGT(c.marked, 0);
	ASSERT_EQ(ioc_blk_dirty_list(c.blk, NULL, 0), 1);
	ASSERT_NULL(ioc_blk_dirty_find(c.blk, "c0"));
	ioc_blk_close(c.blk);
}

IOC_TEST_MAIN(
	IOC_TEST(test_marking),
	IOC_TEST(test_failed_write_marked),
	IOC_TEST(test_persist_clean),
	IOC_TEST(test_persist_kill),
	IOC_TEST(test_persist_write_ahead),
	IOC_TEST(test_torn),
	IOC_TEST(test_ordering_model),
	IOC_TEST(test_ordering_stress),
	IOC_TEST(test_store),
	IOC_TEST(test_limits),
	IOC_TEST(test_persist_fine),
	IOC_TEST(test_churn),
)
