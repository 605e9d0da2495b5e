/*
 * Images qemu-img and qemu-io make, read through the qcow2 driver and
 * compared byte for byte with `qemu-img convert -O raw`: cluster sizes
 * 512, 64k and 2M, compressed clusters (zlib and zstd), extended L2
 * entries with partly allocated and zeroed subclusters over a backing
 * file, lazy refcounts, refcount widths 1, 16 and 64, version 2 images,
 * a backing chain three deep, an internal snapshot (and a write through
 * the driver that leaves the snapshot intact and `qemu-img check` clean),
 * block status against qemu-img map, and readers on two loops at once.
 */
#include <pthread.h>

#include "q2-test.h"
#include "src/node/qcow2.h"

#define SRC_SIZE (6u << 20)

static char *src_raw;

static const char *source(void)
{
	if (!src_raw) {
		src_raw = q2t_path("source.raw");
		q2t_make_source(src_raw, SRC_SIZE, 7);
	}
	return src_raw;
}

/* Open img read-only, compare it with its own raw conversion, close. */
static void check_image(const char *img, const char *extra)
{
	char *raw = q2t_path("check.raw"), err[512];
	struct ioc_node *n;

	Q2T_SH_OK("qemu-img convert -U -O raw '%s' '%s'", img, raw);
	if (q2t_open("img", img, true, extra, &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "open %s: %s", img, err);
	q2t_compare_raw(n, raw);
	q2t_close(n);
	unlink(raw);
	free(raw);
}

static void convert_and_check(const char *opts, bool compress)
{
	char *img = q2t_path("conv.qcow2");

	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 %s %s '%s' '%s'", compress ? "-c" : "",
		  opts, source(), img);
	check_image(img, "");
	unlink(img);
	free(img);
}

static void test_cluster_sizes(void)
{
	convert_and_check("-o cluster_size=512", false);
	convert_and_check("-o cluster_size=65536", false);
	convert_and_check("-o cluster_size=2M", false);
}

static void test_small_cache(void)
{
	char *img = q2t_path("cache.qcow2");

	/* Slices smaller than a table, and few of them: misses and evictions. */
	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 -o cluster_size=4096 '%s' '%s'", source(),
		  img);
	check_image(img, "\"l2-cache-size\":4096,\"l2-cache-entry-size\":1024");
	check_image(img, "\"l2-cache-entry-size\":512,\"cache-clean-interval\":0");
	unlink(img);
	free(img);
}

static void test_compressed(void)
{
	convert_and_check("-o compression_type=zlib", true);
	convert_and_check("-o compression_type=zstd", true);
	convert_and_check("-o compression_type=zlib,cluster_size=4096", true);
	convert_and_check("-o compression_type=zstd,cluster_size=2M", true);
}

static void test_refcount_bits(void)
{
	convert_and_check("-o refcount_bits=1", false);
	convert_and_check("-o refcount_bits=16", false);
	convert_and_check("-o refcount_bits=64", false);
}

static void test_v2_lazy(void)
{
	char *img = q2t_path("lazy.qcow2");

	convert_and_check("-o compat=0.10", false);
	convert_and_check("-o compat=0.10", true);
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o lazy_refcounts=on '%s' 4M", img);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x5a 100k 300k' -c 'write -z 1M 64k' '%s' "
		  ">/dev/null", img);
	check_image(img, "");
	unlink(img);
	free(img);
}

/* Subclusters: an overlay with extended L2 over a backing file, written
 * in pieces smaller than a cluster, zeroed in subclusters, discarded. */
static void test_extended_l2(void)
{
	char *base = q2t_path("xbase.qcow2"), *top = q2t_path("xtop.qcow2");

	convert_and_check("-o extended_l2=on", false);
	convert_and_check("-o extended_l2=on,cluster_size=2M", false);
	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 '%s' '%s'", source(), base);
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k "
		  "-b '%s' -F qcow2 '%s'", base, top);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x11 4k 2k' -c 'write -P 0x22 70k 10k' "
		  "-c 'write -z 130k 8k' -c 'write -P 0x33 1M 200k' -c 'write -z -u 1100k 64k' "
		  "-c 'discard 2M 128k' '%s' >/dev/null", top);
	check_image(top, "");
	unlink(top);
	unlink(base);
	free(top);
	free(base);
}

struct st_arg {
	struct ioc_node *n;
	uint64_t off[4];
	int st[4];
	unsigned d[4];
	uint64_t pn[4];
};

static void ioc_coroutine_fn st_co(void *opaque)
{
	struct st_arg *a = opaque;

	for (int i = 0; i < 4; i++)
		a->st[i] = ioc_node_co_block_status(a->n, a->off[i], 4096, &a->pn[i], &a->d[i]);
}

/* base (raw) <- mid (qcow2, relative name) <- top, each layer writing. */
static void test_backing_chain(void)
{
	char *base = q2t_path("base.raw"), *mid = q2t_path("mid.qcow2");
	char *top = q2t_path("top.qcow2"), *raw = q2t_path("alone.raw"), err[512];
	struct ioc_node *n;
	struct st_arg a = { .off = { 50 << 10, 0, 600 << 10, 2 << 20 } };

	Q2T_SH_OK("cp '%s' '%s'", source(), base);
	Q2T_SH_OK("cd '%s' && qemu-img create -q -f qcow2 -b base.raw -F raw mid.qcow2 8M",
		  ioc_test_tmpdir());
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x44 0 100k' -c 'write -z 512k 1M' "
		  "-c 'write -P 0x45 7M 64k' '%s' >/dev/null", mid);
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o cluster_size=4k -b '%s' -F qcow2 '%s' 10M",
		  mid, top);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x46 50k 20k' -c 'discard 0 8k' "
		  "-c 'write -P 0x47 9M 4k' '%s' >/dev/null", top);
	check_image(top, "");

	/* "backing": null: the layer alone, unallocated reads as zeroes. */
	Q2T_SH_OK("qemu-img convert -U -O raw 'json:{\"driver\":\"qcow2\",\"backing\":null,"
		  "\"file\":{\"driver\":\"file\",\"filename\":\"%s\"}}' '%s'", top, raw);
	ASSERT_OK(q2t_open("alone", top, true, "\"backing\":null", &n, err, sizeof(err)));
	ASSERT_NULL(n->backing);
	q2t_compare_raw(n, raw);
	q2t_close(n);

	/* "backing": a node of the graph by its name. */
	{
		struct ioc_node *b;
		char js[1024];

		snprintf(js, sizeof(js), "\"backing\":\"mid\"");
		ASSERT_OK(q2t_open("mid", mid, true, "", &b, err, sizeof(err)));
		ASSERT_OK(q2t_open("named", top, true, js, &n, err, sizeof(err)));
		ASSERT_PTR_EQ(n->backing, b);
		Q2T_SH_OK("qemu-img convert -U -O raw '%s' '%s'", top, raw);
		q2t_compare_raw(n, raw);
		q2t_close(n);
		q2t_close(b);
	}

	/* Block status and allocation depth.  50k: top's data; 0:
	 * discarded in top (reads as zeroes there); 600k: mid's zeroes;
	 * 2M: the raw base. */
	ASSERT_OK(q2t_open("top", top, true, "", &n, err, sizeof(err)));
	a.n = n;
	bt_run_co_fn(st_co, &a);
	ASSERT_EQ(a.st[0], IOC_NODE_ST_DATA | IOC_NODE_ST_ALLOCATED);
	ASSERT_EQ(a.d[0], 1);
	ASSERT_EQ(a.st[1], IOC_NODE_ST_ZERO | IOC_NODE_ST_ALLOCATED);
	ASSERT_EQ(a.d[1], 1);
	ASSERT_EQ(a.st[2], IOC_NODE_ST_ZERO | IOC_NODE_ST_ALLOCATED);
	ASSERT_EQ(a.d[2], 2);
	ASSERT_EQ(a.st[3] & IOC_NODE_ST_ALLOCATED, IOC_NODE_ST_ALLOCATED);
	ASSERT_EQ(a.d[3], 3);
	q2t_close(n);
	unlink(raw);
	unlink(top);
	unlink(mid);
	unlink(base);
	free(raw);
	free(top);
	free(mid);
	free(base);
}

struct wr_arg {
	struct ioc_node *n;
	int ret;
};

static void ioc_coroutine_fn snap_write_co(void *opaque)
{
	struct wr_arg *a = opaque;
	static uint8_t buf[200 << 10];

	memset(buf, 0x77, sizeof(buf));
	a->ret = ioc_node_co_pwrite(a->n, 30 << 10, buf, sizeof(buf), 0);
	if (a->ret == 0)
		a->ret = ioc_node_co_write_zeroes(a->n, 1 << 20, 256 << 10, IOC_NODE_MAY_UNMAP);
	if (a->ret == 0)
		a->ret = ioc_node_co_discard(a->n, 3 << 20, 512 << 10, 0);
	if (a->ret == 0)
		a->ret = ioc_node_co_flush(a->n, 0);
}

/* An internal snapshot: the active layer is served, and writes through
 * the driver copy shared clusters instead of changing them. */
static void test_snapshot(void)
{
	char *img = q2t_path("snap.qcow2"), *before = q2t_path("snap-before.raw");
	char *after = q2t_path("snap-after.raw"), err[512];
	struct ioc_node *n;
	struct wr_arg a;

	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 '%s' '%s'", source(), img);
	Q2T_SH_OK("qemu-img snapshot -c s1 '%s'", img);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x66 0 128k' '%s' >/dev/null", img);
	check_image(img, "");
	Q2T_SH_OK("qemu-img convert -O raw -l snapshot.name=s1 '%s' '%s'", img, before);
	ASSERT_OK(q2t_open("snap", img, false, "", &n, err, sizeof(err)));
	a.n = n;
	bt_run_co_fn(snap_write_co, &a);
	ASSERT_OK(a.ret);
	q2t_close(n);
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	Q2T_SH_OK("qemu-img convert -O raw -l snapshot.name=s1 '%s' '%s'", img, after);
	Q2T_SH_OK("cmp -s '%s' '%s'", before, after);
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, after);
	Q2T_SH_OK("qemu-io -f raw -c 'read -P 0x77 30k 200k' -c 'read -P 0 1M 256k' "
		  "-c 'read -P 0 3M 512k' '%s' | grep -q 'read 524288'", after);
	unlink(img);
	unlink(before);
	unlink(after);
	free(img);
	free(before);
	free(after);
}

/* Readers on two loops at once over one node, with small cache slices
 * so that they miss, evict and hit concurrently. */
struct par_arg {
	struct ioc_node *n;
	const uint8_t *want;
	uint64_t rstate;
	int ret;
	bool mismatch;
};

static void ioc_coroutine_fn par_co(void *opaque)
{
	struct par_arg *a = opaque;
	uint64_t x = a->rstate;
	static _Thread_local uint8_t buf[128 << 10];

	for (int i = 0; i < 400 && a->ret == 0; i++) {
		uint64_t len = q2t_rand(&x) % sizeof(buf) + 1;
		uint64_t off = q2t_rand(&x) % (a->n->size - len);

		a->ret = ioc_node_co_pread(a->n, off, buf, len, 0);
		if (a->ret == 0 && memcmp(buf, a->want + off, len))
			a->mismatch = true;
	}
}

static void *par_thread(void *opaque)
{
	struct ioc_loop *loop;
	struct par_arg *a = opaque;
	struct bt_run r = { par_co, a, false };
	struct ioc_co *co;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	co = ioc_co_create(bt_run_co, &r);
	ASSERT_NOT_NULL(co);
	ioc_co_enter(co);
	while (!r.done)
		ioc_loop_poll(loop, true);
	ioc_node_graph_detach_loop(q2t_graph, loop);
	ioc_loop_free(loop);
	return NULL;
}

static void test_parallel_readers(void)
{
	char *img = q2t_path("par.qcow2"), err[512];
	size_t len;
	uint8_t *want;
	struct ioc_node *n;
	struct par_arg a[2];
	pthread_t t[2];

	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 -c -o cluster_size=4k '%s' '%s'", source(),
		  img);
	want = q2t_read_file(source(), &len);
	ASSERT_OK(q2t_open("par", img, true, "\"l2-cache-size\":16384,"
			   "\"l2-cache-entry-size\":512", &n, err, sizeof(err)));
	for (int i = 0; i < 2; i++) {
		a[i] = (struct par_arg){ n, want, 1000 + (uint64_t)i, 0, false };
		ASSERT_OK(pthread_create(&t[i], NULL, par_thread, &a[i]));
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		ASSERT_OK(a[i].ret);
		ASSERT_FALSE(a[i].mismatch);
	}
	q2t_close(n);
	free(want);
	unlink(img);
	free(img);
}

/* A writer on one loop (the first half, a model of what it wrote) and
 * readers on another (the second half, checked; the first, unchecked):
 * allocations, table changes and evictions under readers' feet. */
struct rw_arg {
	struct ioc_node *n;
	uint8_t *model;
	uint64_t half;
	int ret;
	bool mismatch;
};

static void ioc_coroutine_fn rw_writer_co(void *opaque)
{
	struct rw_arg *a = opaque;
	uint64_t x = 555;
	static uint8_t buf[64 << 10];

	for (int i = 0; i < 300 && a->ret == 0; i++) {
		uint64_t len = q2t_rand(&x) % sizeof(buf) + 1;
		uint64_t off = q2t_rand(&x) % (a->half - len);
		uint8_t pat = (uint8_t)q2t_rand(&x);

		memset(buf, pat, len);
		if (i % 5 == 4)
			a->ret = ioc_node_co_write_zeroes(a->n, off, len, IOC_NODE_MAY_UNMAP);
		else
			a->ret = ioc_node_co_pwrite(a->n, off, buf, len, 0);
		memset(a->model + off, i % 5 == 4 ? 0 : pat, len);
		if (i % 50 == 0 && a->ret == 0)
			a->ret = ioc_node_co_flush(a->n, 0);
	}
}

static void ioc_coroutine_fn rw_reader_co(void *opaque)
{
	struct rw_arg *a = opaque;
	uint64_t x = 777;
	static _Thread_local uint8_t buf[64 << 10];

	for (int i = 0; i < 600 && a->ret == 0; i++) {
		uint64_t len = q2t_rand(&x) % sizeof(buf) + 1;
		bool first = i % 3 == 0;
		uint64_t off = (first ? 0 : a->half) + q2t_rand(&x) % (a->half - len);

		a->ret = ioc_node_co_pread(a->n, off, buf, len, 0);
		if (!first && a->ret == 0 && memcmp(buf, a->model + off, len))
			a->mismatch = true;
	}
}

/* A coroutine fn(arg) on a loop of its own thread. */
struct thr {
	void (*fn)(void *);
	void *arg;
};

static void *rw_thread(void *opaque)
{
	struct thr *p = opaque;
	struct ioc_loop *loop;
	struct bt_run r = { p->fn, p->arg, false };
	struct ioc_co *co;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	co = ioc_co_create(bt_run_co, &r);
	ASSERT_NOT_NULL(co);
	ioc_co_enter(co);
	while (!r.done)
		ioc_loop_poll(loop, true);
	ioc_node_graph_detach_loop(q2t_graph, loop);
	ioc_loop_free(loop);
	return NULL;
}

static void test_parallel_read_write(void)
{
	char *img = q2t_path("rw.qcow2"), err[512];
	size_t len;
	struct ioc_node *n;
	struct rw_arg w, r;
	struct thr pw, pr;
	pthread_t t[2];

	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 -o cluster_size=1k '%s' '%s'", source(),
		  img);
	ASSERT_OK(q2t_open("rw", img, false, "\"l2-cache-size\":8192", &n, err, sizeof(err)));
	w = (struct rw_arg){ n, q2t_read_file(source(), &len), SRC_SIZE / 2, 0, false };
	r = w;
	pw = (struct thr){ rw_writer_co, &w };
	pr = (struct thr){ rw_reader_co, &r };
	ASSERT_OK(pthread_create(&t[0], NULL, rw_thread, &pw));
	ASSERT_OK(pthread_create(&t[1], NULL, rw_thread, &pr));
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	ASSERT_OK(w.ret);
	ASSERT_OK(r.ret);
	ASSERT_FALSE(r.mismatch);
	q2t_close(n);
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	{
		char *raw = q2t_path("rw.raw");
		size_t rl;
		uint8_t *got;

		Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
		got = q2t_read_file(raw, &rl);
		ASSERT_UEQ(rl, SRC_SIZE);
		ASSERT_TRUE(memcmp(got, w.model, SRC_SIZE) == 0);
		free(got);
		unlink(raw);
		free(raw);
	}
	free(w.model);
	unlink(img);
	free(img);
}

struct tr_arg {
	struct ioc_node *n;
	int grow, too_far, shrink;
};

static void ioc_coroutine_fn truncate_co(void *opaque)
{
	struct tr_arg *a = opaque;
	uint8_t b[4096];

	memset(b, 0x3c, sizeof(b));
	a->grow = ioc_node_co_truncate(a->n, 12 << 20);
	if (a->grow == 0)
		a->grow = ioc_node_co_pwrite(a->n, (12 << 20) - 4096, b, sizeof(b), 0);
	a->too_far = ioc_node_co_truncate(a->n, 1ull << 40);
	a->shrink = ioc_node_co_truncate(a->n, 1 << 20);
}

/* block_resize: growth inside the L1 table's reach; the rest refused. */
static void test_truncate(void)
{
	char *img = q2t_path("tr.qcow2"), err[512];
	struct ioc_node *n;
	struct tr_arg a = { 0 };

	Q2T_SH_OK("qemu-img create -q -f qcow2 '%s' 8M", img);
	ASSERT_OK(q2t_open("tr", img, false, "", &n, err, sizeof(err)));
	a.n = n;
	bt_run_co_fn(truncate_co, &a);
	ASSERT_OK(a.grow);
	ASSERT_EQ(a.too_far, -ENOTSUP);
	ASSERT_EQ(a.shrink, -ENOTSUP);
	ASSERT_UEQ(n->size, 12u << 20);
	q2t_close(n);
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	Q2T_SH_OK("qemu-img info '%s' | grep -q 'virtual size: 12 MiB'", img);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'read -P 0x3c 12284k 4k' '%s' | grep -q 'read 4096'", img);
	unlink(img);
	free(img);
}

struct nf_arg {
	struct ioc_node *n;
	int unaligned, aligned, v2;
	struct ioc_node *n2;
	uint8_t after[8192];
};

static void ioc_coroutine_fn nofallback_co(void *opaque)
{
	struct nf_arg *a = opaque;

	a->unaligned = ioc_node_co_write_zeroes(a->n, 1000, 65536, IOC_NODE_NO_FALLBACK);
	a->aligned = ioc_node_co_write_zeroes(a->n, 65536, 131072, IOC_NODE_NO_FALLBACK);
	a->v2 = ioc_node_co_write_zeroes(a->n2, 65536, 65536, IOC_NODE_NO_FALLBACK);
	if (ioc_node_co_pread(a->n, 0, a->after, sizeof(a->after), 0) < 0)
		a->aligned = -EIO;
}

/* Write-zeroes without fallback: by flag, or -ENOTSUP with nothing done. */
static void test_zero_no_fallback(void)
{
	char *img = q2t_path("nf.qcow2"), *v2 = q2t_path("nf2.qcow2"), err[512];
	struct nf_arg a;

	Q2T_SH_OK("qemu-img create -q -f qcow2 '%s' 1M && qemu-io -f qcow2 -c "
		  "'write -P 0x12 0 256k' '%s' >/dev/null", img, img);
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o compat=0.10 '%s' 1M", v2);
	memset(&a, 0, sizeof(a));
	ASSERT_OK(q2t_open("nf", img, false, "", &a.n, err, sizeof(err)));
	ASSERT_OK(q2t_open("nf2", v2, false, "", &a.n2, err, sizeof(err)));
	bt_run_co_fn(nofallback_co, &a);
	ASSERT_EQ(a.unaligned, -ENOTSUP);
	ASSERT_OK(a.aligned);
	ASSERT_EQ(a.v2, -ENOTSUP);
	for (size_t i = 0; i < sizeof(a.after); i++)
		ASSERT_EQ(a.after[i], 0x12);
	q2t_close(a.n);
	q2t_close(a.n2);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'read -P 0 64k 128k' -c 'read -P 0x12 192k 64k' '%s' "
		  "| grep -c '^read' | grep -q 2", img);
	unlink(img);
	unlink(v2);
	free(img);
	free(v2);
}

/* cache-clean-interval: slices unused for an interval leave memory on
 * the opening loop's timer (the loop is polled, nothing else waits). */
static void test_clean_interval(void)
{
	char *img = q2t_path("ci.qcow2"), *raw = q2t_path("ci.raw"), err[512];
	struct ioc_node *n;
	int64_t t0;

	Q2T_SH_OK("qemu-img convert -f raw -O qcow2 -o cluster_size=4k '%s' '%s'", source(),
		  img);
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
	ASSERT_OK(q2t_open("ci", img, true, "\"cache-clean-interval\":1", &n, err,
			   sizeof(err)));
	q2t_compare_raw(n, raw);
	ASSERT_UGT(ioc__qcow2_cache_resident(n), 0);
	t0 = ioc_now_ns();
	while (ioc__qcow2_clean_passes(n) < 2) {
		ioc_loop_poll(bt_get_loop(), true);
		ASSERT_LT(ioc_now_ns() - t0, 30 * 1000000000ll);
	}
	ASSERT_UEQ(ioc__qcow2_cache_resident(n), 0);
	q2t_compare_raw(n, raw);        /* and it reads on */
	q2t_close(n);
	unlink(img);
	unlink(raw);
	free(img);
	free(raw);
}

/* query-named-block-nodes' image: the format's own members. */
static void test_info(void)
{
	char *img = q2t_path("info.qcow2"), err[512];
	struct ioc_node *n;
	json_t *j, *img_j, *data;

	Q2T_SH_OK("qemu-img create -q -f qcow2 -o cluster_size=16k,refcount_bits=8,"
		  "extended_l2=on,compression_type=zstd '%s' 1M", img);
	ASSERT_OK(q2t_open("info", img, true, "", &n, err, sizeof(err)));
	j = ioc_node_info_json(n);
	ASSERT_NOT_NULL(j);
	img_j = json_object_get(j, "image");
	ASSERT_NOT_NULL(img_j);
	ASSERT_EQ(json_integer_value(json_object_get(img_j, "cluster-size")), 16384);
	data = json_object_get(json_object_get(img_j, "format-specific"), "data");
	ASSERT_NOT_NULL(data);
	ASSERT_EQ(json_integer_value(json_object_get(data, "refcount-bits")), 8);
	ASSERT_TRUE(json_is_true(json_object_get(data, "extended-l2")));
	ASSERT_STR_EQ(json_string_value(json_object_get(data, "compression-type")), "zstd");
	ASSERT_STR_EQ(json_string_value(json_object_get(data, "compat")), "1.1");
	json_decref(j);
	q2t_close(n);
	unlink(img);
	free(img);
}

static void test_cleanup(void)
{
	if (src_raw)
		unlink(src_raw);
	free(src_raw);
	src_raw = NULL;
}

Q2T_MAIN(
	IOC_TEST(test_cluster_sizes),
	IOC_TEST(test_small_cache),
	IOC_TEST(test_compressed),
	IOC_TEST(test_refcount_bits),
	IOC_TEST(test_v2_lazy),
	IOC_TEST(test_extended_l2),
	IOC_TEST(test_backing_chain),
	IOC_TEST(test_snapshot),
	IOC_TEST(test_parallel_readers),
	IOC_TEST(test_parallel_read_write),
	IOC_TEST(test_truncate),
	IOC_TEST(test_info),
	IOC_TEST(test_clean_interval),
	IOC_TEST(test_zero_no_fallback),
	IOC_TEST(test_cleanup),
)
