/*
 * A differential run: the same random sequence of writes, write-zeroes
 * (with and without unmap), discards and flushes goes through the qcow2
 * driver into one copy of an image and through qemu-io into another;
 * then `qemu-img compare` finds them equal, `qemu-img check` finds both
 * clean, and the driver reads qemu-io's copy as qemu-img does.  One run
 * per kind of image: plain, 512-byte clusters with 64-bit refcounts (the
 * refcount table grows), a backing file (copy-on-write from it), extended
 * L2 entries, compressed clusters, an internal snapshot, version 2, lazy
 * refcounts.  The sequence is fixed (xorshift from a constant) and short
 * in the suite; make soak runs it longer (IOC_TEST_SCALE) from another
 * start (IOC_Q2_DIFF_SEED, printed, so a failure reproduces).
 */
#include "q2-test.h"

#define IMG_SIZE (8u << 20)
#ifndef DIFF_START
#define DIFF_START 0
#endif

struct op {
	int kind;               /* 0 write, 1 zero, 2 zero+unmap, 3 discard, 4 flush */
	uint64_t off, len;
	uint8_t pat;
};

struct run_arg {
	struct ioc_node *n;
	struct op *ops;
	int nops;
	int ret, failed_op;
};

static void ioc_coroutine_fn run_co(void *opaque)
{
	struct run_arg *a = opaque;
	uint8_t *buf = malloc(512 << 10);

	for (int i = 0; i < a->nops && a->ret == 0; i++) {
		struct op *o = &a->ops[i];

		switch (o->kind) {
		case 0:
			memset(buf, o->pat, o->len);
			a->ret = ioc_node_co_pwrite(a->n, o->off, buf, o->len,
						    (o->pat & 7) == 0 ? IOC_NODE_FUA : 0);
			break;
		case 1:
		case 2:
			a->ret = ioc_node_co_write_zeroes(a->n, o->off, o->len,
							  o->kind == 2 ? IOC_NODE_MAY_UNMAP : 0);
			break;
		case 3:
			a->ret = ioc_node_co_discard(a->n, o->off, o->len, 0);
			break;
		default:
			a->ret = ioc_node_co_flush(a->n, 0);
			break;
		}
		a->failed_op = i;
	}
	free(buf);
}

static int make_ops(struct op *ops, int n, uint64_t rstate, uint64_t size)
{
	uint64_t x = rstate | 1;

	for (int i = 0; i < n; i++) {
		uint64_t r = q2t_rand(&x);
		struct op *o = &ops[i];
		int k = (int)(r % 20);

		o->kind = k < 11 ? 0 : k < 14 ? 1 : k < 16 ? 2 : k < 19 ? 3 : 4;
		r = q2t_rand(&x);
		/* Mostly 512-aligned, sometimes any byte; short and long. */
		uint64_t align = (r & 3) == 0 ? 1 : (r & 3) == 1 ? 512 : 4096;
		uint64_t max = (r >> 8) % 4 == 0 ? (512 << 10) : (16 << 10);

		o->len = (q2t_rand(&x) % max) / align * align;
		if (!o->len)
			o->len = align;
		o->off = (q2t_rand(&x) % (size - o->len)) / align * align;
		o->pat = (uint8_t)(q2t_rand(&x) | 1);
	}
	return n;
}

static void write_cmds(const char *path, const struct op *ops, int n)
{
	FILE *f = fopen(path, "w");

	ASSERT_NOT_NULL(f);
	for (int i = 0; i < n; i++) {
		const struct op *o = &ops[i];

		switch (o->kind) {
		case 0:
			fprintf(f, "write %s-P 0x%02x %" PRIu64 " %" PRIu64 "\n",
				(o->pat & 7) == 0 ? "-f " : "", o->pat, o->off, o->len);
			break;
		case 1:
			fprintf(f, "write -z %" PRIu64 " %" PRIu64 "\n", o->off, o->len);
			break;
		case 2:
			fprintf(f, "write -z -u %" PRIu64 " %" PRIu64 "\n", o->off, o->len);
			break;
		case 3:
			fprintf(f, "discard %" PRIu64 " %" PRIu64 "\n", o->off, o->len);
			break;
		default:
			fprintf(f, "flush\n");
			break;
		}
	}
	fclose(f);
}

/* setup: a shell command making $IMG (and whatever it backs onto) in the
 * test directory. */
static void diff_run_opts(const char *name, const char *setup, const char *opts, int nops,
			  uint64_t rstate)
{
	char *a_img = q2t_path("a.qcow2"), *b_img = q2t_path("b.qcow2");
	char *cmds = q2t_path("cmds"), *raw = q2t_path("b.raw"), err[512], extra[512];
	struct op *ops;
	struct ioc_node *n;
	struct run_arg ra;
	const char *dir = ioc_test_tmpdir();

	const char *seed = getenv("IOC_Q2_DIFF_SEED");
	uint64_t start = DIFF_START + (seed ? strtoull(seed, NULL, 0) : 0);

	nops = (int)ioc_test_scaled((unsigned long)nops);
	ops = calloc((size_t)nops, sizeof(*ops));
	ioc_test_diag("%s: %d requests, start %" PRIu64, name, nops, start);
	Q2T_SH_OK("cd '%s' && rm -f base.qcow2 && IMG=a.qcow2 && SRC=src.raw && %s", dir, setup);
	Q2T_SH_OK("cp '%s' '%s'", a_img, b_img);
	make_ops(ops, nops, rstate + start, IMG_SIZE);
	write_cmds(cmds, ops, nops);

	snprintf(extra, sizeof(extra), "\"discard\":\"unmap\"%s%s", opts[0] ? "," : "", opts);
	if (q2t_open("diff", a_img, false, extra, &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "open: %s", err);
	ra = (struct run_arg){ n, ops, nops, 0, 0 };
	bt_run_co_fn(run_co, &ra);
	if (ra.ret < 0)
		ioc_test_fail(__FILE__, __LINE__, "request %d failed: %s", ra.failed_op,
			      strerror(-ra.ret));
	q2t_close(n);
	Q2T_SH_OK("qemu-io -f qcow2 '%s' < '%s' > /dev/null", b_img, cmds);

	Q2T_SH_OK("qemu-img check -q '%s'", a_img);
	Q2T_SH_OK("qemu-img check -q '%s'", b_img);
	Q2T_SH_OK("qemu-img compare -q '%s' '%s'", a_img, b_img);
	/* And the driver reads what qemu-io wrote as qemu-img reads it. */
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", b_img, raw);
	ASSERT_OK(q2t_open("diffb", b_img, true, "", &n, err, sizeof(err)));
	q2t_compare_raw(n, raw);
	q2t_close(n);

	Q2T_SH_OK("cd '%s' && rm -f base.qcow2 src.raw", dir);
	unlink(a_img);
	unlink(b_img);
	unlink(cmds);
	unlink(raw);
	free(a_img);
	free(b_img);
	free(cmds);
	free(raw);
	free(ops);
}

static void diff_run(const char *name, const char *setup, int nops, uint64_t rstate)
{
	diff_run_opts(name, setup, "", nops, rstate);
}

/* A source with data, zeroes and holes for the converted kinds. */
#define SRC "qemu-img create -q -f raw src.raw 8M && " \
	"qemu-io -f raw -c 'write -P 0x31 0 3M' -c 'write -P 0x32 5M 2M' src.raw >/dev/null && "

static void test_plain(void)
{
	diff_run("plain", "qemu-img create -q -f qcow2 $IMG 8M", 200, 1);
	/* Eight slices of 512 bytes: dirty slices are written back to make
	 * room, between requests and inside them. */
	diff_run_opts("plain, small cache", "qemu-img create -q -f qcow2 -o cluster_size=4k "
		      "$IMG 8M", "\"l2-cache-size\":4096,\"l2-cache-entry-size\":512", 200, 12);
}

static void test_small_clusters(void)
{
	diff_run("512-byte clusters, 64-bit refcounts",
		 "qemu-img create -q -f qcow2 -o cluster_size=512,refcount_bits=64 $IMG 8M",
		 200, 2);
	diff_run("512-byte clusters, 1-bit refcounts",
		 "qemu-img create -q -f qcow2 -o cluster_size=512,refcount_bits=1 $IMG 8M",
		 120, 3);
}

static void test_backing(void)
{
	diff_run("backing file", SRC "qemu-img convert -O qcow2 src.raw base.qcow2 && "
		 "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 $IMG", 200, 4);
}

static void test_extended_l2(void)
{
	diff_run("extended L2", SRC "qemu-img convert -O qcow2 src.raw base.qcow2 && "
		 "qemu-img create -q -f qcow2 -o extended_l2=on -b base.qcow2 -F qcow2 $IMG",
		 200, 5);
	diff_run("extended L2, no backing",
		 "qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=32k $IMG 8M", 150, 6);
}

static void test_compressed(void)
{
	diff_run("compressed zlib", SRC "qemu-img convert -c -O qcow2 src.raw $IMG", 150, 7);
	diff_run("compressed zstd", SRC "qemu-img convert -c -O qcow2 "
		 "-o compression_type=zstd,cluster_size=4k src.raw $IMG", 150, 8);
}

static void test_snapshot(void)
{
	diff_run("internal snapshot", SRC "qemu-img convert -O qcow2 src.raw $IMG && "
		 "qemu-img snapshot -c s1 $IMG", 200, 9);
}

static void test_v2(void)
{
	diff_run("version 2", SRC "qemu-img convert -O qcow2 src.raw base.qcow2 && "
		 "qemu-img create -q -f qcow2 -o compat=0.10 -b base.qcow2 -F qcow2 $IMG", 150,
		 10);
}

static void test_lazy(void)
{
	diff_run("lazy refcounts",
		 "qemu-img create -q -f qcow2 -o lazy_refcounts=on $IMG 8M", 150, 11);
}

Q2T_MAIN(
	IOC_TEST(test_plain),
	IOC_TEST(test_small_clusters),
	IOC_TEST(test_backing),
	IOC_TEST(test_extended_l2),
	IOC_TEST(test_compressed),
	IOC_TEST(test_snapshot),
	IOC_TEST(test_v2),
	IOC_TEST(test_lazy),
)
