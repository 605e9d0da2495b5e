/*
 * Fuzz target: the frame decoder.  Arbitrary bytes go through the frame
 * scanner (fed incrementally), the in-memory frame decoder, the streaming
 * decoder and the whole decompression pipeline.  Limits are small
 * (max_frame 1 MiB, window 1 MiB) so a hostile header cannot make the
 * fuzzer run out of memory; any crash, leak or sanitizer report is a bug.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/zip.h"
#include "src/zip/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_OUT (1u << 20)

static int sink(void *opaque, const void *buf, size_t len)
{
	size_t *total = opaque;

	(void)buf;
	*total += len;
	return *total > 64u * FUZZ_MAX_OUT ? -EFBIG : 0;
}

static void scan_and_decode(struct ioc__zip_dctx *d, const uint8_t *data, size_t size)
{
	struct ioc__zip_frame f = { 0 };
	const char *why = NULL;
	int r = 0;

	/* Incremental scan in three steps must agree with a one-shot scan. */
	for (size_t avail = size / 3; ; avail = avail * 2 + 1) {
		if (avail > size)
			avail = size;
		r = ioc__zip_scan(&f, data, avail, &why);
		if (r != 0 || avail == size)
			break;
	}
	if (r == 1 && f.kind != IOC__ZIP_K_SKIP) {
		uint64_t dsize = f.dsize;

		if (f.kind == IOC__ZIP_K_GZIP)
			dsize = ioc__zip_le32(data + f.csize - 4);
		if (dsize <= FUZZ_MAX_OUT) {
			void *out = malloc(dsize ? (size_t)dsize : 1);

			if (out) {
				ioc__zip_decompress(d, f.kind, out, (size_t)dsize, data,
						    (size_t)f.csize, &why);
				free(out);
			}
		}
	}
	if (f.hdr_done && (f.kind == IOC__ZIP_K_ZSTD || f.kind == IOC__ZIP_K_GZIP) &&
	    ioc__zip_stream_begin(d, f.kind, &why) == 0) {
		static uint8_t out[65536];
		size_t off = 0, produced_total = 0;

		for (int i = 0; i < 4096; i++) {
			size_t used = 0, produced = 0;

			r = ioc__zip_stream(d, data + off, size - off, &used, out, sizeof(out),
					    &produced, &why);
			off += used;
			produced_total += produced;
			if (r != 0 || (!used && !produced) || produced_total > 64u * FUZZ_MAX_OUT)
				break;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ioc__zip_dctx d;
	struct ioc_zip *z;
	size_t total = 0;
	struct ioc_zip_opts o = {
		.workers = 1, .in_flight = 2, .max_frame = FUZZ_MAX_OUT, .window_log_max = 20,
		.write = sink, .opaque = &total,
	};

	if (ioc__zip_dctx_init(&d, 20, IOC_ZIP_DEFLATE_DEFAULT) == 0) {
		scan_and_decode(&d, data, size);
		ioc__zip_dctx_fini(&d);
	}
	if (ioc_zip_decompressor_new(&z, &o) == 0) {
		/* Two feeds, so frames straddle a boundary. */
		if (ioc_zip_write(z, data, size / 2, 0) == 0 &&
		    ioc_zip_write(z, data + size / 2, size - size / 2, IOC_ZIP_FLUSH) == 0)
			ioc_zip_finish(z);
		ioc_zip_free(z);
	}
	return 0;
}
