/* The pipeline on the workqueue: round trips, ordering, zero blocks,
 * foreign input, hostile input, index and range extraction. */
#include "ioc-config.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <zlib.h>
#include <zstd.h>

#include "tap.h"
#include "iocore/zip.h"
#include "zip-test-util.h"
#include "src/zip/codec.h"

struct buf {
	uint8_t *p;
	size_t len, cap;
	int fail_after;     /* >0: fail the nth write with -ENOSPC */
	int writes;
};

static int buf_write(void *opaque, const void *data, size_t len)
{
	struct buf *b = opaque;

	if (b->fail_after && ++b->writes >= b->fail_after)
		return -ENOSPC;
	ASSERT_UGT(len, 0);     /* the stream never emits empty writes */
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;

		while (cap < b->len + len)
			cap *= 2;
		b->p = realloc(b->p, cap);
		ASSERT_NOT_NULL(b->p);
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, len);
	b->len += len;
	return 0;
}

static void compress_buf(const struct ioc_zip_opts *base, const uint8_t *src, size_t n,
			 size_t chunk, struct buf *out, struct ioc_zip_stats *st)
{
	struct ioc_zip_opts o = *base;
	struct ioc_zip *z;

	o.write = buf_write;
	o.opaque = out;
	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	for (size_t off = 0; off < n; off += chunk)
		ASSERT_OK(ioc_zip_write(z, src + off, n - off < chunk ? n - off : chunk, 0));
	ASSERT_OK(ioc_zip_finish(z));
	if (st)
		ioc_zip_get_stats(z, st);
	ioc_zip_free(z);
}

static int decompress_buf(const uint8_t *src, size_t n, size_t chunk, unsigned workers,
			  struct buf *out, char *err, size_t errlen, struct ioc_zip_stats *st)
{
	struct ioc_zip_opts o = { .workers = workers, .write = buf_write, .opaque = out };
	struct ioc_zip *z;
	int r = 0;

	ASSERT_OK(ioc_zip_decompressor_new(&z, &o));
	for (size_t off = 0; off < n && r == 0; off += chunk)
		r = ioc_zip_write(z, src + off, n - off < chunk ? n - off : chunk, 0);
	if (r == 0)
		r = ioc_zip_finish(z);
	if (err)
		snprintf(err, errlen, "%s", ioc_zip_error(z));
	if (st)
		ioc_zip_get_stats(z, st);
	ioc_zip_free(z);
	return r;
}

static void check_roundtrip(enum ioc_zip_format fmt, int level, size_t block, unsigned workers,
			    size_t n, size_t chunk)
{
	struct ioc_zip_opts o = { .format = fmt, .level = level, .block_size = block,
				  .workers = workers };
	uint8_t *src = zt_data(n, n ^ block);
	struct buf c = { 0 }, d = { 0 };
	char err[256];

	compress_buf(&o, src, n, chunk, &c, NULL);
	ASSERT_OK(decompress_buf(c.p, c.len, 65536 + 7, workers, &d, err, sizeof(err), NULL));
	ASSERT_UEQ(d.len, n);
	ASSERT_MEM_EQ(d.p, src, n);
	if (fmt == IOC_ZIP_ZSTD) {
		/* libzstd alone reads it (frames + skippable seek table). */
		uint8_t *back = malloc(n + 1);

		ASSERT_UEQ(ZSTD_decompress(back, n + 1, c.p, c.len), n);
		ASSERT_MEM_EQ(back, src, n);
		free(back);
	}
	free(src);
	free(c.p);
	free(d.p);
}

static void test_roundtrip_zstd(void)
{
	check_roundtrip(IOC_ZIP_ZSTD, 1, 4096, 2, 100000, 1000);
	check_roundtrip(IOC_ZIP_ZSTD, 3, 65536, 3, 1000000, 70000);
	check_roundtrip(IOC_ZIP_ZSTD, 9, 1u << 20, 1, 3u << 20, 1u << 20);
	check_roundtrip(IOC_ZIP_ZSTD, 19, 65536, 2, 200000, 4096);
}

static void test_roundtrip_gzip(void)
{
	check_roundtrip(IOC_ZIP_GZIP, 1, 4096, 2, 100000, 999);
	check_roundtrip(IOC_ZIP_GZIP, 6, 65536, 3, 1000000, 70000);
	check_roundtrip(IOC_ZIP_GZIP, 9, 1u << 20, 2, 3u << 20, 1u << 20);
}

static void test_empty_tiny(void)
{
	for (int fmt = 0; fmt < 2; fmt++) {
		static const size_t sizes[] = { 0, 1, 2, 4096 };

		for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++)
			check_roundtrip((enum ioc_zip_format)fmt, 0, 4096, 2, sizes[i], 1);
	}
}

/* Many small blocks, more than slots, through several workers: order kept. */
static void test_order_many_blocks(void)
{
	check_roundtrip(IOC_ZIP_ZSTD, 1, 4096, 4, ioc_test_scaled(4u << 20), 12345);
	check_roundtrip(IOC_ZIP_GZIP, 1, 4096, 4, ioc_test_scaled(2u << 20), 12345);
}

static void test_zero_blocks(void)
{
	size_t n = 64 * 4096;
	uint8_t *src = calloc(1, n);
	struct ioc_zip_opts o = { .format = IOC_ZIP_ZSTD, .block_size = 4096, .workers = 2 };
	struct ioc_zip_stats st;
	struct buf c = { 0 }, d = { 0 };

	/* Every fourth page holds data. */
	for (size_t p = 0; p < 64; p += 4)
		zt_fill(src + p * 4096, 4096, p);
	for (int fmt = 0; fmt < 2; fmt++) {
		o.format = (enum ioc_zip_format)fmt;
		c.len = d.len = 0;
		compress_buf(&o, src, n, 5000, &c, &st);
		ASSERT_UEQ(st.frames, 64);
		ASSERT_UEQ(st.zero_frames, 48);
		ASSERT_OK(decompress_buf(c.p, c.len, 777, 2, &d, NULL, 0, NULL));
		ASSERT_UEQ(d.len, n);
		ASSERT_MEM_EQ(d.p, src, n);
	}
	/* All zero: tiny output. */
	memset(src, 0, n);
	c.len = 0;
	o.format = IOC_ZIP_ZSTD;
	compress_buf(&o, src, n, n, &c, &st);
	ASSERT_UEQ(st.zero_frames, 64);
	ASSERT_ULT(c.len, 64 * 24 + 1024);
	free(src); free(c.p); free(d.p);
}

/* opts.zero_runs: all-zero blocks that follow each other in one batch are
 * one frame.  Each frame of the seek table is decoded alone by libzstd,
 * which checks its checksum (XXH64 of the whole run's zeros), and equals
 * its slice of the input; the run frames are the zero slices, longer than
 * a block; a run across two batches is two frames at most.  Without the
 * option, or for gzip, one frame per block as before. */
static void check_zero_runs(enum ioc_zip_format fmt, bool runs, bool no_sum)
{
	const size_t bs = 4096, nb = 300, n = nb * bs;
	uint8_t *src = calloc(1, n), *one = malloc(1u << 20);
	struct ioc_zip_opts o = { .format = fmt, .block_size = bs, .workers = 2,
				  .zero_runs = runs, .no_checksum = no_sum };
	struct ioc_zip_stats st;
	struct buf c = { 0 }, d = { 0 };
	bool merged = runs && fmt == IOC_ZIP_ZSTD && (no_sum || IOC_HAVE_XXHASH);

	ASSERT_NOT_NULL(src);
	ASSERT_NOT_NULL(one);
	/* Data in blocks 0, 4, 10 and 200; runs of 3, 5, 189 and 99 zero
	 * blocks (the last from block 201 to the end, across the first
	 * batch's end at 1 MiB). */
	for (size_t b = 0; b < nb; b++)
		if (b == 0 || b == 4 || b == 10 || b == 200)
			zt_fill(src + b * bs, bs, b + 1);
	compress_buf(&o, src, n, 70000, &c, &st);
	ASSERT_OK(decompress_buf(c.p, c.len, 777, 2, &d, NULL, 0, NULL));
	ASSERT_UEQ(d.len, n);
	ASSERT_MEM_EQ(d.p, src, n);
	if (!merged) {
		ASSERT_UEQ(st.frames, nb);
		ASSERT_UEQ(st.zero_frames, nb - 4);
		goto out;
	}
	ASSERT_UGE(st.frames, 8);
	ASSERT_ULE(st.frames, 9);
	ASSERT_UEQ(st.zero_frames, st.frames - 4);

	uint32_t nf = ioc__zip_le32(c.p + c.len - 9);
	bool with_sum = c.p[c.len - 5] & 0x80;
	size_t need = ioc__zip_seektable_size(nf, with_sum);
	struct ioc_zip_index ix;
	const char *why = NULL;

	ASSERT_UEQ(nf, st.frames);
	ASSERT_EQ(with_sum, !no_sum);
	ASSERT_OK(ioc__zip_seektable_parse(c.p + c.len - need, need, c.len, &ix, &why));
	ASSERT_UEQ(ix.dsize, n);
	for (size_t i = 0; i < ix.nframes; i++) {
		const struct ioc_zip_frame_info *f = &ix.frames[i];
		size_t r = ZSTD_decompress(one, 1u << 20, c.p + f->coff, f->csize);

		ASSERT_FALSE(ZSTD_isError(r));
		ASSERT_UEQ(r, f->dsize);
		ASSERT_MEM_EQ(one, src + f->doff, r);
		if (f->dsize > bs)
			ASSERT_TRUE(ioc__zip_all_zero(src + f->doff, f->dsize));
		else
			ASSERT_FALSE(ioc__zip_all_zero(src + f->doff, f->dsize));
	}
	free(ix.frames);
out:
	free(src); free(one); free(c.p); free(d.p);
}

static void test_zero_runs(void)
{
	check_zero_runs(IOC_ZIP_ZSTD, true, false);
	check_zero_runs(IOC_ZIP_ZSTD, true, true);
	check_zero_runs(IOC_ZIP_ZSTD, false, false);
	check_zero_runs(IOC_ZIP_GZIP, true, false);
}

/* Worker statistics add up: every frame is counted once, in one job per
 * batch of small blocks (64 KiB blocks: 16 per 1 MiB job). */
static void test_worker_stats(void)
{
	size_t n = 64 * 65536;
	uint8_t *src = zt_data(n, 71);
	struct buf c = { 0 };
	struct ioc_zip_opts o = { .block_size = 65536, .workers = 3, .write = buf_write,
				  .opaque = &c };
	struct ioc_zip_worker_stats ws[8];
	uint64_t jobs = 0, frames = 0;
	struct ioc_zip *z;
	int nw;

	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write(z, src, n, 0));
	ASSERT_OK(ioc_zip_finish(z));
	nw = ioc_zip_get_worker_stats(z, ws, 8);
	ASSERT_EQ(nw, 3);
	for (int i = 0; i < nw; i++) {
		jobs += ws[i].jobs;
		frames += ws[i].frames;
	}
	ASSERT_UEQ(frames, 64);
	ASSERT_UEQ(jobs, 4);
	ioc_zip_free(z);
	free(src);
	free(c.p);
}

static void test_zero_copy_feed(void)
{
	size_t n = 300000, off = 0;
	uint8_t *src = zt_data(n, 77);
	struct buf c = { 0 }, d = { 0 };
	struct ioc_zip_opts o = { .block_size = 65536, .workers = 2, .write = buf_write,
				  .opaque = &c };
	struct ioc_zip *z;

	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	while (off < n) {
		void *b;
		size_t room;

		ASSERT_OK(ioc_zip_buffer(z, &b, &room));
		ASSERT_UGT(room, 0);
		if (room > n - off)
			room = n - off;
		if (room > 10000)
			room = 10000;
		memcpy(b, src + off, room);
		ASSERT_OK(ioc_zip_commit(z, room, 0));
		off += room;
	}
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_free(z);
	ASSERT_OK(decompress_buf(c.p, c.len, c.len, 2, &d, NULL, 0, NULL));
	ASSERT_UEQ(d.len, n);
	ASSERT_MEM_EQ(d.p, src, n);
	free(src); free(c.p); free(d.p);
}

/* Decompress through ioc_zip_write_ref, the input cut into pieces of
 * `chunk` bytes, each its own allocation kept until finish returns (frames
 * cut by a piece's end go the copying way). */
static int decompress_ref(const uint8_t *src, size_t n, size_t chunk, struct buf *out,
			  char *err, size_t errlen)
{
	struct ioc_zip_opts o = { .workers = 2, .write = buf_write, .opaque = out };
	size_t npieces = n / chunk + 1, k = 0;
	uint8_t **pieces = calloc(npieces, sizeof(*pieces));
	struct ioc_zip *z;
	int r = 0;

	ASSERT_NOT_NULL(pieces);
	ASSERT_OK(ioc_zip_decompressor_new(&z, &o));
	for (size_t off = 0; off < n && r == 0; off += chunk) {
		size_t len = n - off < chunk ? n - off : chunk;

		pieces[k] = malloc(len);
		ASSERT_NOT_NULL(pieces[k]);
		memcpy(pieces[k], src + off, len);
		r = ioc_zip_write_ref(z, pieces[k], len, 0);
		k++;
	}
	if (r == 0)
		r = ioc_zip_finish(z);
	if (err)
		snprintf(err, errlen, "%s", ioc_zip_error(z));
	ioc_zip_free(z);
	for (size_t i = 0; i < k; i++) {
		memset(pieces[i], 0xa5, 1);   /* nothing reads them any more */
		free(pieces[i]);
	}
	free(pieces);
	return r;
}

/* Input by reference: whole, or cut anywhere (inside small batched frames,
 * big lone frames, gzip members, a streamed unsized frame, a seek table),
 * decodes as by copy; truncated input still fails naming the offset. */
static void test_write_ref(void)
{
	size_t n = 3000000;
	uint8_t *src = zt_data(n, 91);
	static const size_t chunks[] = { 0, 1000003, 65537, 4099 };
	char err[256];

	memset(src + 500000, 0, 700000);
	for (int fmt = 0; fmt < 3; fmt++) {
		struct ioc_zip_opts o = { .format = fmt == 1 ? IOC_ZIP_GZIP : IOC_ZIP_ZSTD,
					  .block_size = fmt == 2 ? (1u << 20) : 65536,
					  .workers = 2 };
		struct buf c = { 0 };

		compress_buf(&o, src, n, n, &c, NULL);
		if (fmt == 2) {
			/* Append a foreign frame without a content size (streamed). */
			ZSTD_CCtx *cc = ZSTD_createCCtx();
			ZSTD_outBuffer ob;
			ZSTD_inBuffer ib = { src, 200000, 0 };
			size_t bound = ZSTD_compressBound(200000) + 64;

			ASSERT_NOT_NULL(cc);
			c.p = realloc(c.p, c.len + bound);
			ASSERT_NOT_NULL(c.p);
			ob = (ZSTD_outBuffer){ c.p + c.len, bound, 0 };
			ASSERT_EQ(ZSTD_isError(ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_end)), 0);
			ASSERT_UEQ(ib.pos, 200000);
			c.len += ob.pos;
			ZSTD_freeCCtx(cc);
		}
		for (size_t i = 0; i < IOC_ARRAY_SIZE(chunks); i++) {
			struct buf d = { 0 };
			size_t want = fmt == 2 ? n + 200000 : n;

			ASSERT_OK(decompress_ref(c.p, c.len, chunks[i] ? chunks[i] : c.len, &d, err,
						 sizeof(err)));
			ASSERT_UEQ(d.len, want);
			ASSERT_MEM_EQ(d.p, src, n);
			if (fmt == 2)
				ASSERT_MEM_EQ(d.p + n, src, 200000);
			free(d.p);
			d = (struct buf){ 0 };
			ASSERT_LT(decompress_ref(c.p, c.len / 2, chunks[i] ? chunks[i] : c.len, &d, err,
						 sizeof(err)), 0);
			ASSERT_TRUE(strstr(err, "offset") != NULL);
			free(d.p);
		}
		free(c.p);
	}
	free(src);
}

/* Compression by reference cuts blocks exactly where copying would: the
 * same input fed by ioc_zip_write_ref in pieces of any size (whole slots
 * in place, a tail copied, the next piece topping it up; small blocks
 * batched several per slot; a slot reserved by ioc_zip_buffer() and left
 * empty; a flush in the middle) gives byte-identical output to one
 * ioc_zip_write, and the pieces may be freed once finish returns. */
/* The byte-for-byte comparisons below run gzip on libdeflate (or zlib),
 * whose output is a function of the block alone.  igzip's is not quite:
 * the same block compressed in these tests came out a few bytes longer or
 * shorter in ~3% of runs (always decoding to the same data), because ISA-L
 * compresses some blocks differently depending on the address of its
 * stream state (src/zip/codec.c); include/iocore/zip.h says so. */
#if IOC_HAVE_LIBDEFLATE
#define BYTE_STABLE_DEFLATER IOC_ZIP_DEFLATE_LIBDEFLATE
#else
#define BYTE_STABLE_DEFLATER IOC_ZIP_DEFLATE_ZLIB
#endif

static void test_write_ref_compress(void)
{
	size_t n = 2500000;
	uint8_t *src = zt_data(n, 93);
	static const size_t chunks[] = { 0, 1000003, 65536, 65537, 4099 };
	static const size_t blocks[] = { 65536, 1u << 20, 16384 };

	memset(src + 300000, 0, 600000);
	for (int fmt = 0; fmt < 2; fmt++)
		for (size_t b = 0; b < IOC_ARRAY_SIZE(blocks); b++) {
			struct ioc_zip_opts o = { .format = fmt ? IOC_ZIP_GZIP : IOC_ZIP_ZSTD,
						  .level = 1, .block_size = blocks[b],
						  .workers = 2, .write = buf_write,
						  .deflate = BYTE_STABLE_DEFLATER };
			struct buf want = { 0 };

			compress_buf(&o, src, n, n, &want, NULL);
			for (size_t i = 0; i < IOC_ARRAY_SIZE(chunks); i++) {
				size_t chunk = chunks[i] ? chunks[i] : n, k = 0;
				uint8_t **pieces = calloc(n / chunk + 1, sizeof(*pieces));
				struct buf c = { 0 }, d = { 0 };
				struct ioc_zip *z;
				void *bb;
				size_t room;

				ASSERT_NOT_NULL(pieces);
				o.opaque = &c;
				ASSERT_OK(ioc_zip_compressor_new(&z, &o));
				ASSERT_OK(ioc_zip_buffer(z, &bb, &room));   /* reserved, unused */
				for (size_t off = 0; off < n; off += chunk, k++) {
					size_t len = n - off < chunk ? n - off : chunk;

					pieces[k] = malloc(len);
					ASSERT_NOT_NULL(pieces[k]);
					memcpy(pieces[k], src + off, len);
					ASSERT_OK(ioc_zip_write_ref(z, pieces[k], len, 0));
				}
				ASSERT_OK(ioc_zip_finish(z));
				ioc_zip_free(z);
				for (size_t j = 0; j < k; j++)
					free(pieces[j]);
				free(pieces);
				ASSERT_UEQ(c.len, want.len);
				ASSERT_MEM_EQ(c.p, want.p, want.len);
				ASSERT_OK(decompress_buf(c.p, c.len, c.len, 2, &d, NULL, 0, NULL));
				ASSERT_UEQ(d.len, n);
				ASSERT_MEM_EQ(d.p, src, n);
				free(c.p);
				free(d.p);
			}
			/* A flush between two by-reference writes ends a block
			 * early: still a valid stream with the same content. */
			{
				struct buf c = { 0 }, d = { 0 };
				struct ioc_zip_stats st;
				struct ioc_zip *z;

				o.opaque = &c;
				ASSERT_OK(ioc_zip_compressor_new(&z, &o));
				ASSERT_OK(ioc_zip_write_ref(z, src, 700001, IOC_ZIP_FLUSH));
				ioc_zip_get_stats(z, &st);
				ASSERT_UEQ(st.in_bytes, 700001);
				ASSERT_UEQ(st.frames, (700001 + blocks[b] - 1) / blocks[b]);
				ASSERT_OK(ioc_zip_write_ref(z, src + 700001, n - 700001, 0));
				ASSERT_OK(ioc_zip_finish(z));
				ioc_zip_free(z);
				ASSERT_OK(decompress_buf(c.p, c.len, c.len, 2, &d, NULL, 0, NULL));
				ASSERT_UEQ(d.len, n);
				ASSERT_MEM_EQ(d.p, src, n);
				free(c.p);
				free(d.p);
			}
			free(want.p);
		}
	free(src);
}

/* A sink for write_from_workers: calls must never overlap (an atomic
 * "inside" count catches two at once) and, the seek table aside, come
 * from worker threads, not the feeding one. */
struct wsink {
	struct buf b;
	atomic_int inside;
	pthread_t feeder;
	int on_feeder, calls;
	int fail_at;            /* >0: the nth call fails with -EIO */
};

static int wsink_write(void *opaque, const void *data, size_t len)
{
	struct wsink *w = opaque;
	int r = 0;

	ASSERT_EQ(atomic_fetch_add(&w->inside, 1), 0);
	w->calls++;
	w->on_feeder += pthread_equal(pthread_self(), w->feeder) != 0;
	if (w->fail_at && w->calls >= w->fail_at)
		r = -EIO;
	else
		buf_write(&w->b, data, len);
	ASSERT_EQ(atomic_fetch_sub(&w->inside, 1), 1);
	return r;
}

/* write_from_workers gives the same bytes as writing on the feeding
 * thread, for both formats, batched small blocks and big ones, with a
 * flush in the middle; a failing write fails the stream and nothing is
 * written after it. */
static void test_write_from_workers(void)
{
	size_t n = 3000000;
	uint8_t *src = zt_data(n, 95);
	static const size_t blocks[] = { 16384, 65536, 1u << 20 };

	memset(src + 1000000, 0, 500000);
	for (int fmt = 0; fmt < 2; fmt++)
		for (size_t b = 0; b < IOC_ARRAY_SIZE(blocks); b++) {
			struct ioc_zip_opts o = { .format = fmt ? IOC_ZIP_GZIP : IOC_ZIP_ZSTD,
						  .level = 1, .block_size = blocks[b],
						  .workers = 3, .write = buf_write,
						  .deflate = BYTE_STABLE_DEFLATER };
			struct buf want = { 0 };
			struct wsink w = { .feeder = pthread_self() };
			struct ioc_zip *z;

			atomic_init(&w.inside, 0);
			o.opaque = &want;
			ASSERT_OK(ioc_zip_compressor_new(&z, &o));
			ASSERT_OK(ioc_zip_write(z, src, 1234567, IOC_ZIP_FLUSH));
			ASSERT_OK(ioc_zip_write(z, src + 1234567, n - 1234567, 0));
			ASSERT_OK(ioc_zip_finish(z));
			ioc_zip_free(z);

			o.write = wsink_write;
			o.opaque = &w;
			o.write_from_workers = true;
			ASSERT_OK(ioc_zip_compressor_new(&z, &o));
			ASSERT_OK(ioc_zip_write_ref(z, src, 1234567, IOC_ZIP_FLUSH));
			{
				/* Flushed: everything fed so far is out and
				 * decodes (no writer still busy with it). */
				struct buf part = { 0 };

				ASSERT_OK(decompress_buf(w.b.p, w.b.len, w.b.len, 2, &part, NULL, 0,
							 NULL));
				ASSERT_UEQ(part.len, 1234567);
				ASSERT_MEM_EQ(part.p, src, 1234567);
				free(part.p);
			}
			ASSERT_OK(ioc_zip_write(z, src + 1234567, n - 1234567, 0));
			ASSERT_OK(ioc_zip_finish(z));
			ioc_zip_free(z);
			ASSERT_UEQ(w.b.len, want.len);
			ASSERT_MEM_EQ(w.b.p, want.p, want.len);
			/* Only the zstd seek table comes from the feeding thread. */
			ASSERT_EQ(w.on_feeder, fmt == 0 ? 1 : 0);
			ASSERT_GT(w.calls, 1);
			free(w.b.p);

			/* The third write fails: the stream fails, no fourth. */
			w = (struct wsink){ .feeder = pthread_self(), .fail_at = 3 };
			atomic_init(&w.inside, 0);
			ASSERT_OK(ioc_zip_compressor_new(&z, &o));
			int r = ioc_zip_write(z, src, n, 0);

			if (r == 0)
				r = ioc_zip_finish(z);
			ASSERT_EQ(r, -EIO);
			ASSERT_TRUE(strstr(ioc_zip_error(z), "write") != NULL);
			ioc_zip_free(z);
			ASSERT_EQ(w.calls, 3);
			free(w.b.p);
			free(want.p);
		}
	/* Only for compression. */
	{
		struct ioc_zip_opts o = { .write = buf_write, .write_from_workers = true };
		struct ioc_zip *z;

		ASSERT_EQ(ioc_zip_decompressor_new(&z, &o), -EINVAL);
	}
	free(src);
}

/* A foreign single frame without content size decodes on one thread. */
static void test_foreign_zstd_stream(void)
{
	size_t n = 2u << 20, cap = ZSTD_compressBound(n) + 100;
	uint8_t *src = zt_data(n, 3), *dst = malloc(cap);
	ZSTD_CCtx *zc = ZSTD_createCCtx();
	ZSTD_inBuffer ib = { src, n, 0 };
	ZSTD_outBuffer ob = { dst, cap, 0 };
	struct buf d = { 0 };
	struct ioc_zip_stats st;

	ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_continue)));
	ib.size = ib.pos;
	ASSERT_UEQ(ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_end), 0);
	ZSTD_freeCCtx(zc);
	/* Twice in a row: two frames, both streamed. */
	memcpy(dst + ob.pos, dst, ob.pos);
	ASSERT_OK(decompress_buf(dst, 2 * ob.pos, 10000, 2, &d, NULL, 0, &st));
	ASSERT_UEQ(st.stream_frames, 2);
	ASSERT_UEQ(d.len, 2 * n);
	ASSERT_MEM_EQ(d.p, src, n);
	ASSERT_MEM_EQ(d.p + n, src, n);
	free(src); free(dst); free(d.p);
}

/* A plain gzip member (zlib, no size subfield) followed by ours. */
static void test_foreign_gzip_mixed(void)
{
	size_t n = 500000;
	uint8_t *src = zt_data(n, 4);
	struct buf c = { 0 }, d = { 0 };
	z_stream zs = { 0 };
	struct ioc_zip_opts o = { .format = IOC_ZIP_GZIP, .block_size = 65536, .workers = 2 };
	struct ioc_zip_stats st;
	size_t cap = compressBound((uLong)n) + 64;

	c.p = malloc(cap);
	c.cap = cap;
	ASSERT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
	zs.next_in = src;
	zs.avail_in = (uInt)n;
	zs.next_out = c.p;
	zs.avail_out = (uInt)cap;
	ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
	c.len = zs.total_out;
	deflateEnd(&zs);
	compress_buf(&o, src, n, n, &c, NULL);
	ASSERT_OK(decompress_buf(c.p, c.len, 3333, 2, &d, NULL, 0, &st));
	ASSERT_UEQ(st.stream_frames, 1);
	ASSERT_UGE(st.parallel_frames, 7);
	ASSERT_UEQ(d.len, 2 * n);
	ASSERT_MEM_EQ(d.p, src, n);
	ASSERT_MEM_EQ(d.p + n, src, n);
	free(src); free(c.p); free(d.p);
}

static void expect_bad(const uint8_t *p, size_t len, const char *what)
{
	struct buf d = { 0 };
	char err[256];
	int r = decompress_buf(p, len, 4096, 2, &d, err, sizeof(err), NULL);

	ioc_test_diag("%s: %d %s", what, r, err);
	ASSERT_LT(r, 0);
	ASSERT_TRUE(strstr(err, "offset") != NULL);
	free(d.p);
}

static void test_hostile(void)
{
	size_t n = 400000;
	uint8_t *src = zt_data(n, 8);
	struct ioc_zip_opts o = { .block_size = 65536, .workers = 2 };
	struct buf c = { 0 }, g = { 0 };

	compress_buf(&o, src, n, n, &c, NULL);
	o.format = IOC_ZIP_GZIP;
	compress_buf(&o, src, n, n, &g, NULL);

	expect_bad(c.p, c.len / 2, "zstd truncated");
	expect_bad(g.p, g.len - 3, "gzip truncated");
	c.p[c.len / 3] ^= 0x20;
	expect_bad(c.p, c.len, "zstd corrupt");
	c.p[c.len / 3] ^= 0x20;
	g.p[g.len / 3] ^= 0x20;
	expect_bad(g.p, g.len, "gzip corrupt");
	g.p[g.len / 3] ^= 0x20;
	/* Seek table entry lies. */
	c.p[c.len - 9 - 12 + 4] ^= 1;
	expect_bad(c.p, c.len, "zstd seek table lies");
	c.p[c.len - 9 - 12 + 4] ^= 1;
	/* A frame claiming 1 TiB of content: streamed, fails, no huge alloc. */
	{
		uint8_t big[] = { 0x28, 0xb5, 0x2f, 0xfd, 0xe4, 0, 0, 0, 0, 0, 1, 0, 0,
				  0x01, 0, 0, 0, 0, 0, 0 };
		expect_bad(big, sizeof(big), "lying 1 TiB content size");
	}
	/* Garbage, and garbage after a good file. */
	expect_bad((const uint8_t *)"hello world, not compressed", 27, "garbage");
	c.p = realloc(c.p, c.len + 10);
	memcpy(c.p + c.len, "trailing!!", 10);
	expect_bad(c.p, c.len + 10, "trailing garbage");
	free(src); free(c.p); free(g.p);
}

/* The error names the offset of the very frame that is corrupt, also
 * when small frames are decoded in batches. */
static void test_error_names_frame(void)
{
	size_t n = 1000000, off = 0;
	uint8_t *src = zt_data(n, 61);
	struct ioc_zip_opts o = { .block_size = 16384, .workers = 2 };
	struct buf c = { 0 }, d = { 0 };
	char err[256], want[64];

	compress_buf(&o, src, n, n, &c, NULL);
	for (int i = 0; i < 20; i++) {
		struct ioc__zip_frame f = { 0 };
		const char *why;

		ASSERT_EQ(ioc__zip_scan(&f, c.p + off, c.len - off, &why), 1);
		off += f.csize;
	}
	/* Frame 20 starts at off: break a byte in its middle. */
	c.p[off + 40] ^= 0x5a;
	snprintf(want, sizeof(want), "frame at offset %zu:", off);
	ASSERT_LT(decompress_buf(c.p, c.len, 100000, 2, &d, err, sizeof(err), NULL), 0);
	ioc_test_diag("%s", err);
	ASSERT_TRUE(strstr(err, want) != NULL);
	free(src); free(c.p); free(d.p);
}

static void test_write_error(void)
{
	size_t n = 4u << 20;    /* 4 slots of 16 blocks: several writes */
	uint8_t *src = zt_data(n, 1);
	struct buf c = { .fail_after = 3 };
	struct ioc_zip_opts o = { .block_size = 65536, .workers = 2, .write = buf_write,
				  .opaque = &c };
	struct ioc_zip *z;
	int r;

	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	r = ioc_zip_write(z, src, n, 0);
	if (r == 0)
		r = ioc_zip_finish(z);
	ASSERT_EQ(r, -ENOSPC);
	ASSERT_EQ(ioc_zip_write(z, src, 1, 0), -EIO);
	ioc_zip_free(z);
	free(src);
	free(c.p);
}

/* Frames larger than max_frame stream on the feeding thread, and the seek
 * table after them is not mistaken for a lie. */
static void test_max_frame_streams(void)
{
	size_t n = 1000000;
	uint8_t *src = zt_data(n, 31);
	struct ioc_zip_opts o = { .block_size = 65536, .workers = 2 };
	struct buf c = { 0 }, d = { 0 };
	struct ioc_zip_stats st;
	struct ioc_zip *z;

	compress_buf(&o, src, n, n, &c, NULL);
	o.max_frame = 16384;
	o.write = buf_write;
	o.opaque = &d;
	ASSERT_OK(ioc_zip_decompressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write(z, c.p, c.len, 0));
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_get_stats(z, &st);
	ioc_zip_free(z);
	ASSERT_UEQ(st.stream_frames, (n + 65535) / 65536);
	ASSERT_UEQ(st.parallel_frames, 0);
	ASSERT_UEQ(d.len, n);
	ASSERT_MEM_EQ(d.p, src, n);
	free(src); free(c.p); free(d.p);
}

/* IOC_ZIP_FLUSH: everything fed so far is out, as whole frames, when the
 * call returns; an input of exactly N blocks gets no empty extra frame. */
static void test_flush(void)
{
	size_t n = 300000;
	uint8_t *src = zt_data(n, 51);
	struct buf c = { 0 }, d = { 0 };
	struct ioc_zip_stats st;
	struct ioc_zip *z;

	for (int fmt = 0; fmt < 2; fmt++) {
		struct ioc_zip_opts o = { .format = (enum ioc_zip_format)fmt, .block_size = 65536,
					  .workers = 2, .write = buf_write, .opaque = &c,
					  .no_seek_table = true };
		c.len = d.len = 0;
		ASSERT_OK(ioc_zip_compressor_new(&z, &o));
		ASSERT_OK(ioc_zip_write(z, src, 1000, IOC_ZIP_FLUSH));
		/* The output so far decodes to exactly the 1000 bytes. */
		ASSERT_OK(decompress_buf(c.p, c.len, c.len, 2, &d, NULL, 0, NULL));
		ASSERT_UEQ(d.len, 1000);
		ASSERT_MEM_EQ(d.p, src, 1000);
		ASSERT_OK(ioc_zip_write(z, src + 1000, 131072 - 1000, IOC_ZIP_FLUSH));
		ASSERT_OK(ioc_zip_write(z, NULL, 0, IOC_ZIP_FLUSH));
		ASSERT_OK(ioc_zip_finish(z));
		ioc_zip_get_stats(z, &st);
		ioc_zip_free(z);
		ASSERT_UEQ(st.frames, 3);   /* 1000, 64 KiB, 64 KiB - 1000 */
		d.len = 0;
		ASSERT_OK(decompress_buf(c.p, c.len, 777, 2, &d, NULL, 0, NULL));
		ASSERT_UEQ(d.len, 131072);
		ASSERT_MEM_EQ(d.p, src, 131072);
	}
	/* Exactly two blocks: two frames, no empty third. */
	{
		struct ioc_zip_opts o = { .block_size = 65536, .workers = 2 };

		c.len = 0;
		compress_buf(&o, src, 131072, 131072, &c, &st);
		ASSERT_UEQ(st.frames, 2);
	}
	free(src); free(c.p); free(d.p);
}

struct posbuf {
	uint8_t *p;
	size_t cap;
	_Atomic size_t total;
};

static int pos_write(void *opaque, const void *buf, size_t len, uint64_t off)
{
	struct posbuf *b = opaque;

	if (off + len > b->cap)
		return -EFBIG;
	memcpy(b->p + off, buf, len);
	atomic_fetch_add_explicit(&b->total, len, memory_order_relaxed);
	return 0;
}

/* write_at: workers write each frame at its offset, any order; foreign
 * streamed frames go through it too. */
static void test_write_at(void)
{
	size_t n = 2000000;
	uint8_t *src = zt_data(n, 41);
	struct ioc_zip_opts o = { .format = IOC_ZIP_ZSTD, .block_size = 65536, .workers = 3 };
	struct buf c = { 0 };
	struct posbuf pb = { .p = calloc(1, 2 * n + 1), .cap = 2 * n + 1 };
	struct ioc_zip *z;

	compress_buf(&o, src, n, n, &c, NULL);
	/* Then a foreign gzip member (streamed) after it. */
	o.format = IOC_ZIP_GZIP;
	o.block_size = 0;
	compress_buf(&o, src, n, n, &c, NULL);
	o = (struct ioc_zip_opts){ .workers = 3, .write_at = pos_write, .opaque = &pb,
				   .max_frame = 100000 };
	ASSERT_OK(ioc_zip_decompressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write(z, c.p, c.len, 0));
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_free(z);
	ASSERT_UEQ(atomic_load(&pb.total), 2 * n);
	ASSERT_MEM_EQ(pb.p, src, n);
	ASSERT_MEM_EQ(pb.p + n, src, n);
	free(src); free(c.p); free(pb.p);
}

/* write_at that also marks which bytes came through it (workers write
 * disjoint ranges, so the byte flags need no atomics). */
struct markbuf {
	uint8_t *p, *written;
	size_t cap;
};

static int mark_write(void *opaque, const void *buf, size_t len, uint64_t off)
{
	struct markbuf *b = opaque;

	if (off + len > b->cap)
		return -EFBIG;
	memcpy(b->p + off, buf, len);
	memset(b->written + off, 1, len);
	return 0;
}

/* out_buf: frames inside it are decoded in place, without a write_at call;
 * a slot reaching past out_cap, and streamed frames, still go through
 * write_at; every byte arrives exactly once, at its offset.  out_buf is
 * allocated to exactly out_cap bytes, so ASan catches any overrun. */
static void test_out_buf(void)
{
	size_t n = 2000000, cap = n - 1000, via_at = 0;
	uint8_t *src = zt_data(n, 43);
	struct ioc_zip_opts o = { .format = IOC_ZIP_ZSTD, .block_size = 65536, .workers = 3 };
	struct buf c = { 0 };
	struct markbuf mb = { .p = calloc(1, 2 * n), .written = calloc(1, 2 * n), .cap = 2 * n };
	uint8_t *ob = malloc(cap);
	struct ioc_zip *z;

	ASSERT_NOT_NULL(ob);
	compress_buf(&o, src, n, n, &c, NULL);
	o.format = IOC_ZIP_GZIP;       /* then members bigger than max_frame: streamed */
	o.block_size = 0;
	compress_buf(&o, src, n, n, &c, NULL);
	o = (struct ioc_zip_opts){ .workers = 3, .write = buf_write, .opaque = &c,
				   .out_buf = ob, .out_cap = cap };
	ASSERT_EQ(ioc_zip_decompressor_new(&z, &o), -EINVAL);   /* needs write_at */
	ASSERT_EQ(ioc_zip_compressor_new(&z, &o), -EINVAL);
	o = (struct ioc_zip_opts){ .workers = 3, .write_at = mark_write, .opaque = &mb,
				   .max_frame = 100000, .out_buf = ob, .out_cap = cap };
	ASSERT_OK(ioc_zip_decompressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write_ref(z, c.p, c.len, 0));
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_free(z);
	for (size_t i = 0; i < 2 * n; i++) {
		uint8_t want = src[i % n];

		via_at += mb.written[i];
		if (mb.written[i])
			ASSERT_EQ(mb.p[i], want);
		else if (i < cap)
			ASSERT_EQ(ob[i], want);
		else
			ioc_test_fail(__FILE__, __LINE__, "byte %zu arrived nowhere", i);
	}
	/* The frame ending at n reaches past cap; the second copy was
	 * streamed; most of the first went in place. */
	for (size_t i = cap; i < 2 * n; i++)
		ASSERT_EQ(mb.written[i], 1);
	ASSERT_UGT(via_at, n);
	ASSERT_ULT(via_at, n + (1u << 20) + 65536);
	free(src); free(c.p); free(mb.p); free(mb.written); free(ob);
}

static int write_file(const char *path, const uint8_t *p, size_t n)
{
	int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(write(fd, p, n), (ssize_t)n);
	return fd;
}

static void test_extract(void)
{
	size_t n = 1000000;
	uint8_t *src = zt_data(n, 21);
	char path[512];

	for (int fmt = 0; fmt < 2; fmt++) {
		struct ioc_zip_opts o = { .format = (enum ioc_zip_format)fmt, .block_size = 65536,
					  .workers = 2 };
		struct buf c = { 0 };
		struct ioc_zip_index *ix;
		char msg[256];
		int fd;

		compress_buf(&o, src, n, n, &c, NULL);
		snprintf(path, sizeof(path), "%s/x%d", ioc_test_tmpdir(), fmt);
		fd = write_file(path, c.p, c.len);
		ASSERT_OK(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)));
		ASSERT_UEQ(ix->dsize, n);
		ASSERT_UEQ(ix->nframes, (n + 65535) / 65536);
		static const uint64_t ranges[][2] = {
			{ 0, 1 }, { 0, 1000000 }, { 65535, 2 }, { 65536, 65536 },
			{ 123456, 400000 }, { 999999, 10 }, { 5, 0 }, { 2000000, 5 },
		};
		for (size_t i = 0; i < IOC_ARRAY_SIZE(ranges); i++) {
			struct buf d = { 0 };
			uint64_t off = ranges[i][0], len = ranges[i][1];
			uint64_t want = off >= n ? 0 : (len > n - off ? n - off : len);

			o.write = buf_write;
			o.opaque = &d;
			ASSERT_OK(ioc_zip_extract(fd, ix, off, len, &o, msg, sizeof(msg)));
			ASSERT_UEQ(d.len, want);
			if (want)
				ASSERT_MEM_EQ(d.p, src + off, want);
			free(d.p);
		}
		if (fmt == IOC_ZIP_ZSTD) {
			/* An index entry that lies about one frame's content size:
			 * extraction names the frame instead of shifting data. */
			struct buf d = { 0 };

			ix->frames[3].dsize += 1;
			o.opaque = &d;
			ASSERT_EQ(ioc_zip_extract(fd, ix, 65536 * 3 + 5, 10, &o, msg, sizeof(msg)),
				  -EBADMSG);
			ioc_test_diag("lying index: %s", msg);
			ASSERT_TRUE(strstr(msg, "offset") != NULL);
			free(d.p);
			/* Corrupt footer on disk. */
			ioc_zip_index_free(ix);
			ASSERT_EQ(pwrite(fd, "\x7f", 1, (off_t)c.len - 6), 1);
			ASSERT_EQ(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)), -EBADMSG);
			ioc_test_diag("bad table: %s", msg);
		} else {
			ioc_zip_index_free(ix);
		}
		close(fd);
		unlink(path);
		free(c.p);
	}
	rmdir(ioc_test_tmpdir());
	free(src);
}

/* Stored frames get a check per 4 KiB page in a skippable frame before
 * the seek table: the index finds it, our decompressor and stock zstd
 * skip it, and a gap before the table that is not one fails the index.
 * Blocks 1, 4, 7 and 10 of 13 are random bytes (stored: 3 pages each). */
static void test_page_checks(void)
{
	size_t n = 12 * 12288 + 100;
	uint8_t *src = zt_data(n, 5);
	uint64_t x = 88172645463325252ull;
	char path[512], msg[256];

	for (size_t i = 0; i < n; i++)
		if (i / 12288 % 3 == 1) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			src[i] = (uint8_t)x;
		}
	for (int plain = 0; plain < 2; plain++) {
		struct ioc_zip_opts o = { .block_size = 12288, .workers = 2,
					  .no_page_checks = plain };
		struct buf c = { 0 }, d = { 0 };
		struct ioc_zip_index *ix;
		size_t want = !plain && IOC_HAVE_XXHASH ? IOC__ZIP_PCK_HEAD + 2 + 12 * 4 : 0;
		uint64_t pck_off;
		int fd;

		compress_buf(&o, src, n, n, &c, NULL);
		snprintf(path, sizeof(path), "%s/p%d", ioc_test_tmpdir(), plain);
		fd = write_file(path, c.p, c.len);
		ASSERT_OK(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)));
		ASSERT_UEQ(ix->nframes, 13);
		ASSERT_UEQ(ix->pck_len, want);
		pck_off = ix->pck_off;
		if (want) {
			const uint8_t *m = c.p + ix->pck_off + IOC__ZIP_PCK_HEAD;
			const uint8_t *k = m + 2;

			ASSERT_UEQ(ix->pck_off, ix->frames[12].coff + ix->frames[12].csize);
			ASSERT_EQ(m[0], 0x92);                  /* frames 1, 4, 7 */
			ASSERT_EQ(m[1], 0x04);                  /* and 10 */
#if IOC_HAVE_XXHASH
			/* Frame 4's third page. */
			ASSERT_UEQ(ioc__zip_le32(k + 5 * 4),
				   ioc__zip_page_check(src + 4 * 12288 + 8192, 4096));
#endif
			(void)k;
		}
		ioc_zip_index_free(ix);
		ASSERT_OK(decompress_buf(c.p, c.len, c.len, 2, &d, msg, sizeof(msg), NULL));
		ASSERT_UEQ(d.len, n);
		ASSERT_MEM_EQ(d.p, src, n);
		free(d.p);
		if (plain) {
			/* Five stray bytes before the table: too short for a
			 * page-check frame, so the sizes do not add up. */
			size_t t = c.len - ioc__zip_seektable_size(13, true);

			ASSERT_EQ(pwrite(fd, "xxxxx", 5, (off_t)t), 5);
			ASSERT_EQ(pwrite(fd, c.p + t, c.len - t, (off_t)t + 5), (ssize_t)(c.len - t));
			ASSERT_EQ(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)), -EBADMSG);
			ASSERT_TRUE(strstr(msg, "do not add up") != NULL);
		}
		if (want) {
			/* Not our frame (its tag changed): the sizes no longer
			 * add up. */
			c.p[pck_off + 8] ^= 1;
			ASSERT_EQ(pwrite(fd, c.p, c.len, 0), (ssize_t)c.len);
			ASSERT_EQ(ioc_zip_index_read(fd, &ix, msg, sizeof(msg)), -EBADMSG);
			ioc_test_diag("gap before the table: %s", msg);
			ASSERT_TRUE(strstr(msg, "do not add up") != NULL);
		}
		close(fd);
		unlink(path);
		free(c.p);
	}
	free(src);
}

IOC_TEST_MAIN(
	IOC_TEST(test_roundtrip_zstd),
	IOC_TEST(test_roundtrip_gzip),
	IOC_TEST(test_empty_tiny),
	IOC_TEST(test_order_many_blocks),
	IOC_TEST(test_zero_blocks),
	IOC_TEST(test_zero_runs),
	IOC_TEST(test_zero_copy_feed),
	IOC_TEST(test_write_ref),
	IOC_TEST(test_write_ref_compress),
	IOC_TEST(test_write_from_workers),
	IOC_TEST(test_worker_stats),
	IOC_TEST(test_foreign_zstd_stream),
	IOC_TEST(test_foreign_gzip_mixed),
	IOC_TEST(test_hostile),
	IOC_TEST(test_write_error),
	IOC_TEST(test_error_names_frame),
	IOC_TEST(test_max_frame_streams),
	IOC_TEST(test_write_at),
	IOC_TEST(test_out_buf),
	IOC_TEST(test_flush),
	IOC_TEST(test_page_checks),
	IOC_TEST(test_extract),
)
