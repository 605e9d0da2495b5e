/*
 * bench-zip: in-memory measurements that the CLI cannot isolate.
 *
 *   bench-zip --case backend FILE LEVEL   libdeflate vs zlib, one thread,
 *                                         same gzip member framing
 *
 * Prints JSON rows (bench/README.md); the end-to-end comparisons against
 * zstd and pigz are in run.sh.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bench.h"
#include "ioc-config.h"
#include "src/zip/codec.h"

static uint8_t *slurp(const char *path, size_t cap, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p = malloc(cap);

	if (!f || !p)
		return NULL;
	*len = fread(p, 1, cap, f);
	fclose(f);
	return p;
}

static double backend_mbps(enum ioc_zip_deflate be, int level, const uint8_t *src, size_t n,
			   size_t *out_total)
{
	struct ioc__zip_cctx c;
	size_t block = 4u << 20, cap = ioc__zip_compress_bound(IOC_ZIP_GZIP, block);
	uint8_t *dst = malloc(cap);
	uint64_t t0;
	uint32_t sum;
	bool zero;

	if (!dst || ioc__zip_cctx_init(&c, IOC_ZIP_GZIP, level, true, be) < 0)
		return -1;
	*out_total = 0;
	t0 = ioc_bench_now_ns();
	for (size_t off = 0; off < n; off += block) {
		size_t len = n - off < block ? n - off : block;
		ssize_t r = ioc__zip_compress(&c, dst, cap, src + off, len, &sum, &zero);

		if (r < 0)
			return -1;
		*out_total += (size_t)r;
	}
	t0 = ioc_bench_now_ns() - t0;
	ioc__zip_cctx_fini(&c);
	free(dst);
	return (double)n / ((double)t0 / 1e9) / 1e6;
}

int main(int argc, char **argv)
{
	char cmd[1024], params[256];
	size_t n, out = 0;
	uint8_t *src;
	int level;

	if (argc != 5 || strcmp(argv[1], "--case") || strcmp(argv[2], "backend")) {
		fprintf(stderr, "usage: bench-zip --case backend FILE LEVEL\n");
		return 2;
	}
	level = atoi(argv[4]);
	src = slurp(argv[3], 64u << 20, &n);
	if (!src) {
		fprintf(stderr, "bench-zip: cannot read %s\n", argv[3]);
		return 1;
	}
	ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));
	snprintf(params, sizeof(params), "level=%d,threads=1,bytes=%zu", level, n);
	for (int i = 0; i < 2; i++) {
		enum ioc_zip_deflate be = i ? IOC_ZIP_DEFLATE_ZLIB : IOC_ZIP_DEFLATE_LIBDEFLATE;
		double v;

		if (!i && !IOC_HAVE_LIBDEFLATE)
			continue;
		v = backend_mbps(be, level, src, n, &out);
		struct ioc_bench_row r = {
			.suite = "zip", .case_name = "codec-backend", .params = params,
			.impl = i ? "zlib" : "iocore-libdeflate", .peer = i != 0,
			.metric = "MB/s", .value = v, .value_ok = v > 0, .cmd = cmd,
			.error = v > 0 ? NULL : "compression failed",
		};
		ioc_bench_row(stdout, &r);
		fprintf(stderr, "bench-zip: %s level %d: %.1f MB/s, ratio %.4f\n", r.impl, level, v,
			(double)out / (double)n);
	}
	free(src);
	return 0;
}
