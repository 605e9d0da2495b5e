/*
 * Runs the qcow2 fuzz target's entry point as an ordinary TAP test, so CI
 * exercises it without libFuzzer.  The corpus is made now: small images
 * from qemu-img and qemu-io (each cluster size class, compressed zlib and
 * zstd, extended L2, version 2, refcount widths, a backing file name, a
 * snapshot, bitmaps with data), each whole, truncated, and with bytes flipped in
 * the header and anywhere.  With a directory argument, the files in it
 * (a corpus saved by a libFuzzer run) instead.
 */
#include <dirent.h>

#include "q2-test.h"
#include "fuzz.h"

static const char *extra_dir;
static unsigned long runs;

static void run(const uint8_t *p, size_t n)
{
	/* A private copy: ASan sees a read past the end on the exact block. */
	uint8_t *c = malloc(n ? n : 1);

	memcpy(c, p, n);
	LLVMFuzzerTestOneInput(c, n);
	free(c);
	runs++;
}

static void mutate_all(const uint8_t *base, size_t n, uint64_t x)
{
	uint8_t *m = malloc(n + 1);

	run(base, n);
	for (int i = 1; i <= 8; i++)
		run(base, n * (size_t)i / 9);
	for (int i = 0; i < (int)ioc_test_scaled(200) && n; i++) {
		uint64_t r = q2t_rand(&x);
		/* Most flips in the header and its extensions. */
		size_t pos = (i % 4) ? (size_t)(r % (n < 512 ? n : 512)) : (size_t)(r % n);

		memcpy(m, base, n);
		m[pos] ^= (uint8_t)(r >> 32 | 1);
		if (i % 3 == 0)
			m[(pos + 1) % n] ^= (uint8_t)(r >> 40);
		run(m, n);
	}
	free(m);
}

static void image(const char *make)
{
	char *p = q2t_path("fz.qcow2"), *b = q2t_path("fzb.qcow2");
	static uint64_t x = 12345;
	size_t n;
	uint8_t *d;

	Q2T_SH_OK("P='%s'; B='%s'; %s", p, b, make);
	d = q2t_read_file(p, &n);
	ASSERT_ULT(n, 4u << 20);
	mutate_all(d, n, q2t_rand(&x));
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
	{
		uint8_t g[4096];
		uint64_t x = 77;

		for (int i = 0; i < 64; i++) {
			for (size_t k = 0; k < sizeof(g); k++)
				g[k] = (uint8_t)q2t_rand(&x);
			memcpy(g, "QFI\xfb\0\0\0", 7);
			g[7] = (uint8_t)(2 + (i & 1));
			run(g, (size_t)(i * 61) % sizeof(g) + 72);
		}
	}
	ioc_test_diag("%lu inputs", runs);
	ASSERT_UGT(runs, 1000);
}

static void test_saved_corpus(void)
{
	char path[1024];
	unsigned long files = 0;
	struct dirent *e;
	DIR *d;

	if (!extra_dir)
		IOC_SKIP("no corpus directory given");
	d = opendir(extra_dir);
	if (!d)
		ioc_test_fail(__FILE__, __LINE__, "corpus %s: %s", extra_dir, strerror(errno));
	while ((e = readdir(d))) {
		size_t n;
		uint8_t *p;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", extra_dir, e->d_name);
		p = q2t_read_file(path, &n);
		run(p, n);
		free(p);
		files++;
	}
	closedir(d);
	ioc_test_diag("%lu corpus files from %s", files, extra_dir);
	ASSERT_UGT(files, 0);
}

int main(int argc, char **argv)
{
	static const struct ioc_test tests[] = {
		IOC_TEST(test_generated_corpus),
		IOC_TEST(test_saved_corpus),
	};

	if (argc > 1)
		extra_dir = argv[1];
	q2t_require_qemu();
	return ioc_test_run(tests, (int)IOC_ARRAY_SIZE(tests));
}
