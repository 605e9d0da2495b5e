/*
 * bench-zip: in-memory measurements that the CLI cannot isolate.
 *
 *   bench-zip --case backend FILE LEVEL   igzip and libdeflate vs zlib, one
 *                                         thread, same gzip member framing
 *                                         (speed and size: codec.c picks per
 *                                         level from these)
 *   bench-zip --case calibrate FILE NAME  every raw libdeflate level 1-9 and
 *                                         igzip 1-3, one thread, gzip's
 *                                         default block: total size and
 *                                         speed per level, to compare with
 *                                         pigz -N's size (calibrate.sh; the
 *                                         table in codec.c's essay)
 *   bench-zip --case lib FILE LEVEL NAME  the library pipeline against
 *                                         libzstd's own multithreading
 *                                         (ZSTD_c_nbWorkers), in memory, in
 *                                         the same process: no process
 *                                         start-up or file I/O in the ratio
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
#include "iocore/zip.h"
#include <unistd.h>
#include <zstd.h>

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
			   size_t block, size_t *out_total)
{
	struct ioc__zip_cctx c;
	size_t cap = ioc__zip_compress_bound(IOC_ZIP_GZIP, block);
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

struct sink {
	uint8_t *p;
	size_t len, cap;
};

static int sink_write(void *opaque, const void *buf, size_t len)
{
	struct sink *k = opaque;

	if (k->len + len > k->cap)
		return -ENOSPC;
	memcpy(k->p + k->len, buf, len);
	k->len += len;
	return 0;
}

/* Decompressed data lands at its offset, written by the worker that
 * decoded it: what libzstd's single-shot decode into the caller's buffer
 * does, without a serial copy on the feeding thread. */
static int sink_write_at(void *opaque, const void *buf, size_t len, uint64_t off)
{
	struct sink *k = opaque;

	if (off + len > k->cap)
		return -ENOSPC;
	memcpy(k->p + off, buf, len);
	return 0;
}

static void row(const char *kase, const char *params, const char *impl, bool peer,
		const char *metric, double v, bool lower, const char *cmd)
{
	struct ioc_bench_row r = {
		.suite = "zip", .case_name = kase, .params = params, .impl = impl, .peer = peer,
		.metric = metric, .value = v, .value_ok = v > 0, .lower_is_better = lower,
		.cmd = cmd, .error = v > 0 ? NULL : "failed",
	};

	ioc_bench_row(stdout, &r);
}

#define LIB_REPS 3

/* Best of LIB_REPS for each side; the same input, threads and level. */
static int lib_case(const char *path, int level, const char *name, const char *cmd)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned workers = ncpu > 0 ? (unsigned)ncpu : 1;
	size_t n, cap;
	uint8_t *src = slurp(path, 256u << 20, &n);
	struct sink ours, theirs, back;
	double best_c[2] = { 1e30, 1e30 }, best_d[2] = { 1e30, 1e30 };
	char params[256], pd[256];

	if (!src)
		return 1;
	cap = ZSTD_compressBound(n) + (1u << 20);
	ours = (struct sink){ malloc(cap), 0, cap };
	theirs = (struct sink){ malloc(cap), 0, cap };
	back = (struct sink){ malloc(n + 1), 0, n + 1 };
	if (!ours.p || !theirs.p || !back.p)
		return 1;
	for (int rep = 0; rep < LIB_REPS; rep++) {
		struct ioc_zip_opts o = { .level = level, .workers = workers, .write = sink_write,
					  .opaque = &ours };
		ZSTD_CCtx *zc = ZSTD_createCCtx();
		ZSTD_DCtx *zd = ZSTD_createDCtx();
		struct ioc_zip *z;
		uint64_t t;
		size_t r;

		/* ours: compress */
		ours.len = 0;
		t = ioc_bench_now_ns();
		if (ioc_zip_compressor_new(&z, &o) < 0 || ioc_zip_write(z, src, n, 0) < 0 ||
		    ioc_zip_finish(z) < 0)
			return 1;
		ioc_zip_free(z);
		t = ioc_bench_now_ns() - t;
		best_c[0] = (double)t < best_c[0] ? (double)t : best_c[0];
		/* libzstd, nbWorkers = workers */
		ZSTD_CCtx_setParameter(zc, ZSTD_c_compressionLevel, level);
		ZSTD_CCtx_setParameter(zc, ZSTD_c_nbWorkers, (int)workers);
		ZSTD_CCtx_setParameter(zc, ZSTD_c_checksumFlag, 1);
		t = ioc_bench_now_ns();
		r = ZSTD_compress2(zc, theirs.p, theirs.cap, src, n);
		t = ioc_bench_now_ns() - t;
		if (ZSTD_isError(r))
			return 1;
		theirs.len = r;
		best_c[1] = (double)t < best_c[1] ? (double)t : best_c[1];
		/* ours: decompress into memory the way libzstd's single-shot
		 * call does, input read in place (ioc_zip_write_ref) and each
		 * frame decoded straight into the caller's buffer at its
		 * offset (out_buf; sink_write_at only catches what falls
		 * outside it, nothing here). */
		o = (struct ioc_zip_opts){ .workers = workers, .write_at = sink_write_at,
					   .opaque = &back, .out_buf = back.p, .out_cap = back.cap };
		memset(back.p, 0, 4096);
		t = ioc_bench_now_ns();
		if (ioc_zip_decompressor_new(&z, &o) < 0 ||
		    ioc_zip_write_ref(z, ours.p, ours.len, 0) < 0 || ioc_zip_finish(z) < 0)
			return 1;
		ioc_zip_free(z);
		t = ioc_bench_now_ns() - t;
		if (memcmp(back.p, src, n))
			return 1;
		best_d[0] = (double)t < best_d[0] ? (double)t : best_d[0];
		/* libzstd: one frame, one thread (what zstd -d does) */
		t = ioc_bench_now_ns();
		r = ZSTD_decompressDCtx(zd, back.p, back.cap, theirs.p, theirs.len);
		t = ioc_bench_now_ns() - t;
		if (ZSTD_isError(r) || r != n)
			return 1;
		best_d[1] = (double)t < best_d[1] ? (double)t : best_d[1];
		ZSTD_freeCCtx(zc);
		ZSTD_freeDCtx(zd);
	}
	snprintf(params, sizeof(params), "corpus=%s,level=%d,threads=%u,api=lib", name, level,
		 workers);
	snprintf(pd, sizeof(pd), "corpus=%s,format=zstd,threads=%u,api=lib", name, workers);
	row("compress", params, "iocore-zip-lib", false, "MB/s", (double)n / best_c[0] * 1e3, false,
	    cmd);
	row("compress", params, "libzstd-mt", true, "MB/s", (double)n / best_c[1] * 1e3, false, cmd);
	row("compress", params, "iocore-zip-lib", false, "size ratio",
	    (double)ours.len / (double)n, true, cmd);
	row("compress", params, "libzstd-mt", true, "size ratio", (double)theirs.len / (double)n,
	    true, cmd);
	row("decompress", pd, "iocore-zip-lib", false, "MB/s", (double)n / best_d[0] * 1e3, false,
	    cmd);
	row("decompress", pd, "libzstd", true, "MB/s", (double)n / best_d[1] * 1e3, false, cmd);
	free(src);
	free(ours.p);
	free(theirs.p);
	free(back.p);
	return 0;
}

struct backend {
	enum ioc_zip_deflate be;
	const char *name;
	bool peer, built;
};

static const struct backend backends[] = {
	{ IOC_ZIP_DEFLATE_ISAL, "iocore-isal", false, IOC_HAVE_ISAL },
	{ IOC_ZIP_DEFLATE_LIBDEFLATE, "iocore-libdeflate", false, IOC_HAVE_LIBDEFLATE },
	{ IOC_ZIP_DEFLATE_ZLIB, "zlib", true, true },
};

/* An explicit deflater runs at the raw level asked for (only DEFAULT maps
 * levels), so these rows are the libraries' own levels, cut into the
 * blocks the CLI uses for gzip by default. */
static int calibrate_case(const char *path, const char *name, const char *cmd)
{
	size_t n, out = 0, block = ioc_zip_default_block(IOC_ZIP_GZIP, 6);
	uint8_t *src = slurp(path, 512u << 20, &n);
	char params[256];

	if (!src)
		return -1;
	for (size_t i = 0; i < IOC_ARRAY_SIZE(backends); i++) {
		const struct backend *b = &backends[i];
		int top = b->be == IOC_ZIP_DEFLATE_ISAL ? 3 : 9;

		/* zlib's sizes come from pigz itself (calibrate.sh). */
		if (!b->built || b->be == IOC_ZIP_DEFLATE_ZLIB)
			continue;
		for (int level = 1; level <= top; level++) {
			double v = backend_mbps(b->be, level, src, n, block, &out);

			snprintf(params, sizeof(params), "corpus=%s,level=%d,threads=1,block=%zu",
				 name, level, block);
			struct ioc_bench_row r = {
				.suite = "zip", .case_name = "calibrate", .params = params,
				.impl = b->name, .metric = "MB/s", .value = v,
				.value_ok = v > 0, .cmd = cmd,
				.error = v > 0 ? NULL : "compression failed",
			};
			ioc_bench_row(stdout, &r);
			r.metric = "bytes";
			r.lower_is_better = true;
			r.value = (double)out;
			ioc_bench_row(stdout, &r);
			fflush(stdout);
			fprintf(stderr, "bench-zip: %s %s level %d: %.1f MB/s, %zu bytes (%.4f)\n",
				name, b->name, level, v, out, (double)out / (double)n);
		}
	}
	free(src);
	return 0;
}

int main(int argc, char **argv)
{
	char cmd[1024], params[256];
	size_t n, out = 0;
	uint8_t *src;
	int level;

	if (argc == 6 && strcmp(argv[1], "--case") == 0 && strcmp(argv[2], "lib") == 0) {
		ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));
		if (lib_case(argv[3], atoi(argv[4]), argv[5], cmd)) {
			fprintf(stderr, "bench-zip: lib case failed\n");
			return 1;
		}
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "--case") == 0 && strcmp(argv[2], "calibrate") == 0) {
		ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));
		if (calibrate_case(argv[3], argv[4], cmd)) {
			fprintf(stderr, "bench-zip: cannot read %s\n", argv[3]);
			return 1;
		}
		return 0;
	}
	if (argc != 5 || strcmp(argv[1], "--case") || strcmp(argv[2], "backend")) {
		fprintf(stderr, "usage: bench-zip --case backend FILE LEVEL\n"
				"       bench-zip --case calibrate FILE CORPUS-NAME\n"
				"       bench-zip --case lib FILE LEVEL CORPUS-NAME\n");
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
	for (size_t i = 0; i < IOC_ARRAY_SIZE(backends); i++) {
		const struct backend *b = &backends[i];
		double v;

		/* igzip stops at level 3: a row above it would be level 3. */
		if (!b->built || (b->be == IOC_ZIP_DEFLATE_ISAL && level > 3))
			continue;
		v = backend_mbps(b->be, level, src, n, 4u << 20, &out);
		struct ioc_bench_row r = {
			.suite = "zip", .case_name = "codec-backend", .params = params,
			.impl = b->name, .peer = b->peer,
			.metric = "MB/s", .value = v, .value_ok = v > 0, .cmd = cmd,
			.error = v > 0 ? NULL : "compression failed",
		};
		ioc_bench_row(stdout, &r);
		r.metric = "size ratio";
		r.lower_is_better = true;
		r.value = (double)out / (double)n;
		ioc_bench_row(stdout, &r);
		fprintf(stderr, "bench-zip: %s level %d: %.1f MB/s, ratio %.4f\n", r.impl, level, v,
			(double)out / (double)n);
	}
	free(src);
	return 0;
}
