/*
 * Allocating writes in flight together: two loops on two threads, each
 * with sixteen coroutines, write into one image whose clusters start
 * unallocated (over a backing file, so copy-on-write has something to
 * keep).  The writes are adjacent and overlapping, often in one cluster,
 * sometimes in one subcluster: every byte anybody writes gets the same
 * value (a function of its offset), so the result does not depend on
 * the order and is known: written bytes have it, the rest the backing
 * file's.  A copy-on-write that brought back old bytes over a neighbour's
 * write, or two allocations of one cluster, would show.  After the run
 * the node reads the model, and once closed `qemu-img check` finds the
 * image clean and `qemu-img convert` gives the model too.  Plain 64 KiB
 * clusters (also without a backing file, where a new cluster gets only
 * its data written), extended L2 entries (2 KiB subclusters), 4 KiB clusters
 * with a small L2 cache (evictions while writes are in flight), and a
 * few write-zeroes and discards of clusters nobody writes into.
 */
#include <pthread.h>

#include "q2-test.h"

#define IMG_SIZE   (4u << 20)
#define THREADS    2
#define COS        16
#define MAX_LEN    (20u << 10)
#define WSPAN      (IMG_SIZE / 8 * 7)   /* written; the rest zeroed and discarded */

/* The value every writer gives byte o. */
static uint8_t val(uint64_t o)
{
	return (uint8_t)((o * 2654435761u) >> 13) | 1;
}

/* The backing file's byte o (never val(o): val is odd, this is even). */
static uint8_t bval(uint64_t o)
{
	return (uint8_t)((o / 509) * 2);
}

struct shared {
	struct ioc_node *n;
	uint64_t cs;                /* cluster size */
	_Atomic int errors;
	int writes;                 /* per coroutine */
};

struct co_arg {
	struct shared *sh;
	uint8_t *written;           /* this thread's: 1 where it wrote */
	uint64_t rstate;
	int *left;                  /* coroutines still running on this loop */
};

/* Writes go to the first 7/8 of the image; the last 1/8 gets zeroes and
 * discards (whole clusters), concurrently. */
static void ioc_coroutine_fn writer_co(void *opaque)
{
	struct co_arg *a = opaque;
	struct shared *sh = a->sh;
	uint64_t x = a->rstate, wspan = WSPAN;
	uint8_t *buf = malloc(MAX_LEN);

	ASSERT_NOT_NULL(buf);
	for (int i = 0; i < sh->writes; i++) {
		uint64_t r = q2t_rand(&x), off, len;
		int ret;

		if (r % 16 == 0) {
			/* A cluster of the zeroed part. */
			uint64_t c = wspan / sh->cs + q2t_rand(&x) % ((IMG_SIZE - wspan) / sh->cs);

			off = c * sh->cs;
			ret = r & 16 ? ioc_node_co_write_zeroes(sh->n, off, sh->cs,
								IOC_NODE_MAY_UNMAP)
				     : ioc_node_co_discard(sh->n, off, sh->cs, 0);
			if (ret < 0)
				atomic_fetch_add(&sh->errors, 1);
			continue;
		}
		/* Clustered: most writes land near another coroutine's. */
		off = (q2t_rand(&x) % (wspan / 8192)) * 8192 + (q2t_rand(&x) % 16) * 512;
		len = (q2t_rand(&x) % (MAX_LEN / 512) + 1) * 512;
		if (off + len > wspan)
			len = wspan - off;
		for (uint64_t k = 0; k < len; k++) {
			buf[k] = val(off + k);
			a->written[off + k] = 1;
		}
		if (i % 3 == 0) {
			/* Two pieces, to cross an iovec boundary. */
			struct iovec iov[2] = { { buf, len / 2 }, { buf + len / 2, len - len / 2 } };

			ret = ioc_node_co_pwritev(sh->n, off, iov, 2, 0);
		} else {
			ret = ioc_node_co_pwrite(sh->n, off, buf, len, i % 29 == 0 ? IOC_NODE_FUA : 0);
		}
		if (ret < 0)
			atomic_fetch_add(&sh->errors, 1);
		if (i % 37 == 36 && ioc_node_co_flush(sh->n, 0) < 0)
			atomic_fetch_add(&sh->errors, 1);
	}
	free(buf);
	(*a->left)--;
}

struct thr_arg {
	struct shared *sh;
	unsigned id;
	uint8_t *written;
};

static void *loop_thread(void *opaque)
{
	struct thr_arg *t = opaque;
	struct ioc_loop *loop;
	struct co_arg a[COS];
	int left = COS;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	for (int i = 0; i < COS; i++) {
		struct ioc_co *co;

		a[i] = (struct co_arg){ t->sh, t->written,
					0x9e3779b97f4a7c15ull * (t->id * COS + i + 1), &left };
		co = ioc_co_create(writer_co, &a[i]);
		ASSERT_NOT_NULL(co);
		ioc_co_enter(co);
	}
	while (left)
		ioc_loop_poll(loop, true);
	ioc_node_graph_detach_loop(q2t_graph, loop);
	ioc_loop_free(loop);
	return NULL;
}

struct check_arg {
	struct ioc_node *n;
	uint8_t *out;
	int ret;
};

static void ioc_coroutine_fn read_all_co(void *opaque)
{
	struct check_arg *c = opaque;

	c->ret = ioc_node_co_pread(c->n, 0, c->out, IMG_SIZE, 0);
}

static void expect(const uint8_t *got, const uint8_t *written, bool backing,
		   const char *what)
{
	for (uint64_t o = 0; o < IMG_SIZE; o++) {
		uint8_t old = backing ? bval(o) : 0;
		uint8_t want = written[o] ? val(o) : old;

		/* The zeroed part: each cluster zeroed, discarded (zeroes
		 * over a backing file in v3) or untouched. */
		if (o >= WSPAN && (got[o] == 0 || got[o] == old))
			continue;
		if (got[o] != want)
			ioc_test_fail(__FILE__, __LINE__, "%s: byte %" PRIu64 " is %02x, want %02x "
				      "(%s)", what, o, got[o], want,
				      written[o] == 1 ? "written" : "backing");
	}
}

static void run(const char *name, bool backing, const char *create_opts,
		const char *node_opts)
{
	char *base = q2t_path("conc-base.raw"), *img = q2t_path("conc.qcow2");
	char *raw = q2t_path("conc.raw"), err[512];
	struct shared sh = { 0 };
	uint8_t *written = calloc(1, IMG_SIZE);
	struct thr_arg ta[THREADS];
	pthread_t t[THREADS];
	struct check_arg c;
	uint8_t *b = malloc(IMG_SIZE);
	size_t rl;
	FILE *f;

	ASSERT_NOT_NULL(b);
	for (uint64_t o = 0; o < IMG_SIZE; o++)
		b[o] = bval(o);
	f = fopen(base, "wb");
	ASSERT_NOT_NULL(f);
	ASSERT_UEQ(fwrite(b, 1, IMG_SIZE, f), IMG_SIZE);
	fclose(f);
	if (backing)
		Q2T_SH_OK("qemu-img create -q -f qcow2 -b '%s' -F raw -o %s '%s'", base,
			  create_opts, img);
	else
		Q2T_SH_OK("qemu-img create -q -f qcow2 -o %s '%s' %u", create_opts, img, IMG_SIZE);
	ASSERT_OK(q2t_open(name, img, false, node_opts, &sh.n, err, sizeof(err)));
	sh.cs = strstr(create_opts, "cluster_size=4k") ? 4096 : 65536;
	ASSERT_NOT_NULL(written);
	/* Fewer writes under ThreadSanitizer, which is ten times slower. */
	sh.writes = getenv("IOC_SANITIZER") ? 24 : 60;
	for (unsigned i = 0; i < THREADS; i++) {
		ta[i] = (struct thr_arg){ &sh, i, calloc(1, IMG_SIZE) };
		ASSERT_NOT_NULL(ta[i].written);
		ASSERT_OK(pthread_create(&t[i], NULL, loop_thread, &ta[i]));
	}
	for (unsigned i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		for (uint64_t o = 0; o < IMG_SIZE; o++)
			written[o] |= ta[i].written[o];
		free(ta[i].written);
	}
	ASSERT_EQ(atomic_load(&sh.errors), 0);

	c = (struct check_arg){ sh.n, malloc(IMG_SIZE), 0 };
	ASSERT_NOT_NULL(c.out);
	bt_run_co_fn(read_all_co, &c);
	ASSERT_OK(c.ret);
	expect(c.out, written, backing, "read back");
	free(c.out);
	q2t_close(sh.n);

	Q2T_SH_OK("qemu-img check -q '%s'", img);
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
	free(b);
	b = q2t_read_file(raw, &rl);
	ASSERT_UEQ(rl, IMG_SIZE);
	expect(b, written, backing, "qemu-img convert");
	free(b);
	free(written);
	unlink(raw);
	unlink(img);
	unlink(base);
	free(raw);
	free(img);
	free(base);
}

static void test_plain(void)
{
	run("c-plain", true, "cluster_size=64k", "");
}

/* No backing file: the copied parts are zeroes, and a new cluster in
 * the file's fresh end gets only its data written. */
static void test_no_backing(void)
{
	run("c-nobk", false, "cluster_size=64k", "");
}

static void test_extended_l2(void)
{
	run("c-ext", true, "cluster_size=64k,extended_l2=on", "");
}

static void test_small_cache(void)
{
	run("c-small", true, "cluster_size=4k", "\"l2-cache-size\":8192,\"l2-cache-entry-size\":1024");
}

/* A freed cluster that still holds data (discards not passed down) is
 * reused by the next allocation: the copied parts must be written as
 * zeroes there; only a cluster that is a hole may get just its data. */
struct reuse_arg {
	struct ioc_node *n;
	uint8_t *out;
	int ret;
};

static void ioc_coroutine_fn reuse_co(void *opaque)
{
	struct reuse_arg *a = opaque;
	uint8_t *buf = malloc(65536);
	int ret;

	ASSERT_NOT_NULL(buf);
	for (uint64_t k = 0; k < 65536; k++)
		buf[k] = val(k);
	ret = ioc_node_co_pwrite(a->n, 0, buf, 65536, 0);
	if (ret == 0)
		ret = ioc_node_co_flush(a->n, 0);
	if (ret == 0)
		ret = ioc_node_co_discard(a->n, 0, 65536, 0);
	/* Two writebacks: the first makes the decrement wait for readers,
	 * the second applies it. */
	for (int i = 0; i < 3 && ret == 0; i++)
		ret = ioc_node_co_flush(a->n, 0);
	if (ret == 0)
		ret = ioc_node_co_pwrite(a->n, 5 * 65536 + 8192, buf, 4096, 0);
	if (ret == 0)
		ret = ioc_node_co_pread(a->n, 5 * 65536, a->out, 65536, 0);
	a->ret = ret;
	free(buf);
}

static void test_reused_cluster(void)
{
	char *img = q2t_path("reuse.qcow2"), err[512];
	struct reuse_arg a = { NULL, malloc(65536), 0 };

	ASSERT_NOT_NULL(a.out);
	Q2T_SH_OK("qemu-img create -q -f qcow2 '%s' 4M", img);
	ASSERT_OK(q2t_open("c-reuse", img, false,
			   "\"discard\":\"unmap\",\"pass-discard-request\":false", &a.n, err,
			   sizeof(err)));
	bt_run_co_fn(reuse_co, &a);
	ASSERT_OK(a.ret);
	for (uint64_t k = 0; k < 65536; k++) {
		uint8_t want = k >= 8192 && k < 8192 + 4096 ? val(k - 8192) : 0;

		if (a.out[k] != want)
			ioc_test_fail(__FILE__, __LINE__, "byte %" PRIu64 " of the cluster is %02x, "
				      "want %02x", k, a.out[k], want);
	}
	q2t_close(a.n);
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	free(a.out);
	unlink(img);
	free(img);
}

Q2T_MAIN(
	IOC_TEST(test_plain),
	IOC_TEST(test_no_backing),
	IOC_TEST(test_extended_l2),
	IOC_TEST(test_small_cache),
	IOC_TEST(test_reused_cluster),
)
