/*
 * The standalone cases of the qcow2 fuzz target (fuzz-qcow2.c; the runner
 * is tests/harness/fuzz-standalone.h).  The corpus is made now: small
 * images from qemu-img and qemu-io (each cluster size class, compressed
 * zlib and zstd, extended L2, version 2, refcount widths, a backing file
 * name, a snapshot, bitmaps with data), each whole, truncated and
 * mutated, most edits in the header and its extensions; garbage behind
 * the magic.  With a directory argument, the files in it (a corpus saved
 * by a libFuzzer run) too; --write-corpus DIR stores the images.
 */
#include "q2-test.h"
#include "fuzz-standalone.h"

static const char *write_dir;       /* --write-corpus: images go here */

/* One image: made by the shell command make, then mutated with half the
 * edits in its first 512 bytes (the header and its extensions). */
static void image(const char *make)
{
	char *p = q2t_path("fz.qcow2"), *b = q2t_path("fzb.qcow2");
	static uint64_t x = 12345;
	static unsigned k;
	size_t n;
	uint8_t *d;

	Q2T_SH_OK("P='%s'; B='%s'; %s", p, b, make);
	d = q2t_read_file(p, &n);
	ASSERT_ULT(n, 4u << 20);
	if (write_dir) {
		char name[32];

		snprintf(name, sizeof(name), "image-%u.qcow2", k++);
		ioc_fuzz_write(write_dir, name, d, n);
	} else {
		struct ioc_fuzz_mut m = { .head = 512, .seed = q2t_rand(&x) };

		ioc_fuzz_mutate(d, n, &m);
	}
	free(d);
	unlink(p);
	unlink(b);
	free(p);
	free(b);
}

#define W "qemu-io -f qcow2 -c 'write -P 0x5c 0 20k' -c 'write -z 40k 8k' $P >/dev/null"

static void test_generated_corpus(void)
{
	image("qemu-img create -q -f qcow2 -o cluster_size=512 $P 256k && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=4k,refcount_bits=1 $P 1M && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=4k,refcount_bits=64 $P 1M && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=16k,extended_l2=on $P 1M && " W);
	image("qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=4k $P 1M && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on $P 1M && " W);
	image("qemu-img create -q -f qcow2 $B 1M && qemu-img create -q -f qcow2 "
	      "-o cluster_size=4k -b $B -F qcow2 $P && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=4k $P 1M && " W
	      " && qemu-img snapshot -c s1 $P && qemu-img bitmap --add $P b0");
	/* Bitmaps with data clusters (qemu-io's writes are tracked), one
	 * disabled, 4 KiB and 512-byte granularities, a longer name. */
	image("qemu-img create -q -f qcow2 -o cluster_size=4k $P 1M && "
	      "qemu-img bitmap --add $P b0 && qemu-img bitmap --add -g 4096 $P fine && "
	      "qemu-img bitmap --add -g 512 $P tiny && "
	      "qemu-img bitmap --add --disable $P a-rather-long-bitmap-name.x && " W);
	image("qemu-img create -q -f qcow2 -o cluster_size=512 $P 256k && "
	      "qemu-img bitmap --add -g 512 $P b0 && " W);
	image("qemu-img create -q -f raw $B 256k && qemu-io -f raw -c 'write -P 0x33 0 64k' "
	      "$B >/dev/null && qemu-img convert -c -O qcow2 -o cluster_size=4k $B $P");
	image("qemu-img create -q -f raw $B 256k && qemu-io -f raw -c 'write -P 0x34 0 64k' "
	      "$B >/dev/null && qemu-img convert -c -O qcow2 -o cluster_size=4k,"
	      "compression_type=zstd $B $P");
	/* Garbage behind the magic. */
	if (!write_dir) {
		uint8_t g[4096];
		uint64_t x = 77;

		for (int i = 0; i < 64; i++) {
			for (size_t k = 0; k < sizeof(g); k++)
				g[k] = (uint8_t)q2t_rand(&x);
			memcpy(g, "QFI\xfb\0\0\0", 7);
			g[7] = (uint8_t)(2 + (i & 1));
			ioc_fuzz_run(g, (size_t)(i * 61) % sizeof(g) + 72);
		}
	}
	if (!write_dir) {
		ioc_test_diag("%lu inputs", ioc_fuzz_runs);
		ASSERT_UGT(ioc_fuzz_runs, 1000);
	}
}

static void run_file(const char *name, const uint8_t *p, size_t n, void *opaque)
{
	(void)name;
	(void)opaque;
	ioc_fuzz_run(p, n);
}

static void test_saved_corpus(void)
{
	ioc_fuzz_corpus(NULL, run_file, NULL);
}

static void write_corpus(const char *dir)
{
	write_dir = dir;
	test_generated_corpus();
}

IOC_FUZZ_MAIN_SETUP(q2t_require_qemu, write_corpus, IOC_TEST(test_generated_corpus),
		    IOC_TEST(test_saved_corpus))
