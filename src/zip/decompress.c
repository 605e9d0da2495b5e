/*
 * zip decompression: frames delimited on the feeding thread, decoded by
 * workqueue workers in pipeline.c's slot cycle.  Problem: input is hostile
 * and of any origin (ours, zstd's or gzip's CLI, a pipe), yet decoding
 * should use every core with bounded memory, and output should reach its
 * file with no copy of decoded bytes by the feeding thread.
 *
 * Design.  The feeding thread buffers input in a staging buffer, delimits
 * frames with the codec scanner (block headers only) and hands each complete
 * frame with a known content size of at most max_frame to a slot (small
 * frames batched, as for compression).  Anything else (a foreign
 * single-frame zstd file from a pipe, a gzip member without our size
 * subfield, a frame over max_frame) is decoded streaming on the feeding
 * thread once the slots drain, with bounded buffers and ZSTD_d_windowLogMax,
 * so memory stays bounded whatever the input claims.
 *  - A frame's output offset is known at dispatch, so with opts.write_at the
 *    worker pwrites its frame itself, decoding into its context cell's
 *    reused, cache-warm buffer rather than the slot's: decoded memory is one
 *    frame per worker, and slots hold only input.
 *  - With opts.out_buf (an embedder's whole output in memory) workers decode
 *    each frame into it, as ZSTD_decompressDCtx() does on one thread.
 *  - Fed by ioc_zip_write_ref() (the CLI maps its input), the caller's buffer
 *    is the staging buffer and slots point into it.
 *  - A seek table met in the input is checked against the frames before it,
 *    as zstd's seekable reader would.
 *
 * Rejected (measurements in bench/zip/NOTES.md; the run is CPU bound on
 * decode plus the tmpfs write path, whose inode lock the workers share): one
 * ordered writer (the feeding thread pwriting while workers only decode
 * becomes the serial bottleneck); more workers, a sleeping write lock,
 * writing each block under a try-lock as it is decoded, or deferring a write
 * while the lock is busy (no gain or slower); decoding into a mapping of the
 * output (a fault per page, then the unmap); more slots than workers + 2
 * without write_at (each is megabytes of fresh memory to fault in).
 *
 * Cost.  One memcpy of compressed input into a slot (the staging buffer must
 * survive partial frames) unless fed by reference.  Worst-case memory with
 * write_at: 4 * workers + 2 slots of compressed input (none by reference)
 * plus one decoded frame per worker, each at most max_frame.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "zip-int.h"
#include "util/buf.h"

static int grow(uint8_t **p, size_t *cap, size_t want);

static void decompress_job(struct ioc_wq_job *job)
{
	struct slot *s = ioc_container_of(job, struct slot, job);
	struct ioc_zip *z = s->z;
	uint64_t t0 = ioc__zip_thread_cpu_ns();
	struct ctx_cell *c = ioc__zip_claim(z);
	uint8_t *dst;
	bool direct;

	if (!c->ready) {
		int e = ioc__zip_dctx_init(&c->d, z->o.window_log_max, z->o.deflate);
		if (e < 0) {
			s->err = e;
			s->why = "cannot create a decompression context";
			goto out;
		}
		c->ready = true;
	}
	s->err = 0;
	dst = s->out;
	direct = z->o.out_buf && s->out_off <= z->o.out_cap &&
		 s->out_len <= z->o.out_cap - s->out_off;
	if (direct) {
		/* The caller's memory: decode in place, nothing to write. */
		dst = (uint8_t *)z->o.out_buf + s->out_off;
	} else if (z->o.write_at) {
		if (grow(&c->obuf, &c->ocap, s->out_len ? s->out_len : 1) < 0) {
			s->err = -ENOMEM;
			s->why = "out of memory";
			goto out;
		}
		dst = c->obuf;
	}
	for (unsigned i = 0; i < s->nf && !s->err; i++) {
		const struct fdesc *f = &s->fd[i];

		s->err = ioc__zip_decompress(&c->d, f->kind, dst + f->doff, f->dsize,
					     s->src + f->coff, f->csize, &s->why);
		if (s->err)
			s->err_off = s->in_off + f->coff;
	}
	if (!s->err && s->out_len && z->o.write_at && !direct) {
		/* Positional output straight from the worker: the feeding
		 * thread never touches the decoded bytes.  Still holding the
		 * cell, whose buffer this is. */
		s->err = z->o.write_at(z->o.opaque, dst, s->out_len, s->out_off);
		if (s->err)
			s->why = "write failed";
	}
out:
	if (c)
		ioc__zip_unclaim(c);
	ioc__zip_account(z, t0, s->nf);
}

/* ---- decompression ------------------------------------------------ */

static int stage_reserve(struct ioc_zip *z, size_t want)
{
	if (z->stage_start && z->stage_len + want > z->stage_cap - z->stage_start) {
		memmove(z->stage, z->stage + z->stage_start, z->stage_len);
		z->stage_start = 0;
	}
	if (z->stage_len + want > z->stage_cap) {
		/* (The staging buffer starts at its 1 MiB, never empty.) */
		void *p = ioc__buf_grow(z->stage, &z->stage_cap, z->stage_len + want,
					1u << 20);

		if (!p)
			return -ENOMEM;
		z->stage = p;
	}
	return 0;
}

static void stage_consume(struct ioc_zip *z, size_t n)
{
	z->stage_start += n;
	z->stage_len -= n;
	z->stage_off += n;
	if (!z->stage_len)
		z->stage_start = 0;
}

static int grow(uint8_t **p, size_t *cap, size_t want)
{
	void *q;

	if (*cap >= want)
		return 0;
	/* Grow to the frame size met, once; equal-sized frames then reuse.
	 * The contents need not survive. */
	q = ioc__zip_buf_alloc(want);
	if (!q)
		return -ENOMEM;
	ioc__zip_buf_free(*p, *cap);
	*p = q;
	*cap = want;
	return 0;
}

/* A seek table met while decoding must describe the frames since the
 * previous one; a table that lies is an error, as zstd's seekable reader
 * would refuse the file. */
static int check_seek_table(struct ioc_zip *z, const uint8_t *p, size_t len)
{
	uint32_t n;
	bool with_sum;
	const char *why = NULL;
	size_t esize;

	if (len < 8 + IOC__ZIP_SEEK_FOOTER ||
	    ioc__zip_seektable_footer(p + len - IOC__ZIP_SEEK_FOOTER, &n, &with_sum, &why) == -ENOENT)
		return 0;       /* some other skippable frame */
	if (z->ents_overflow) {
		z->ents_overflow = false;
		z->nents = 0;
		return 0;
	}
	/* The table describes the n frames just before it (others may precede
	 * them: `cat other.zst ours.zst`). */
	if (why || ioc__zip_seektable_size(n, with_sum) != len || n > z->nents) {
		return ioc__zip_fail(z, -EBADMSG, "seek table at offset %llu: %s",
			    (unsigned long long)z->stage_off,
			    why ? why : "does not describe the frames before it");
	}
	esize = with_sum ? 12 : 8;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = p + 8 + (size_t)i * esize;
		const struct ioc__zip_seek_entry *f = &z->ents[z->nents - n + i];

		if (ioc__zip_le32(e) != f->csize || ioc__zip_le32(e + 4) != f->dsize ||
		    (with_sum && f->sum != UINT32_MAX && ioc__zip_le32(e + 8) != f->sum))
			return ioc__zip_fail(z, -EBADMSG,
				    "seek table at offset %llu: entry %u does not match its frame",
				    (unsigned long long)z->stage_off, i);
	}
	z->nents = 0;
	return 0;
}

static int batch_submit(struct ioc_zip *z)
{
	struct slot *s = z->batch;

	if (!s)
		return 0;
	z->batch = NULL;
	return ioc__zip_submit(z, s);
}

static int stream_begin(struct ioc_zip *z)
{
	const char *why = NULL;
	int r = batch_submit(z);

	if (r == 0)
		r = ioc__zip_drain(z);

	if (r < 0)
		return r;
	if (!z->sd_ready) {
		r = ioc__zip_dctx_init(&z->sd, z->o.window_log_max, z->o.deflate);
		if (r < 0)
			return ioc__zip_fail(z, r, "decoder: %s", ioc_strerror(r));
		z->sd_ready = true;
		z->sout_cap = ZSTD_DStreamOutSize() * 4;
		z->sout = malloc(z->sout_cap);
		if (!z->sout)
			return ioc__zip_fail(z, -ENOMEM, "decoder: out of memory");
	}
	r = ioc__zip_stream_begin(&z->sd, z->fr.kind, &why);
	if (r < 0)
		return ioc__zip_fail(z, r, "frame at offset %llu: %s", (unsigned long long)z->stage_off, why);
	z->streaming = true;
	z->frame_off = z->stage_off;
	z->nents = 0;
	z->ents_overflow = true;  /* a table after a streamed frame is not checked */
	z->st.stream_frames++;
	return 0;
}

/* Feed staged bytes to the streaming decoder; keep calling while it makes
 * progress (it may hold decoded bytes when the output buffer filled). */
static int stream_step(struct ioc_zip *z)
{
	const char *why = NULL;

	for (;;) {
		size_t used = 0, produced = 0;
		int r = ioc__zip_stream(&z->sd, z->stage + z->stage_start, z->stage_len, &used,
					z->sout, z->sout_cap, &produced, &why);

		if (r < 0)
			return ioc__zip_fail(z, r, "frame at offset %llu: %s",
				    (unsigned long long)z->frame_off, why);
		stage_consume(z, used);
		if (produced) {
			int w = z->o.write_at ? z->o.write_at(z->o.opaque, z->sout, produced,
							      z->out_next)
					      : z->o.write(z->o.opaque, z->sout, produced);

			z->out_next += produced;

			if (w < 0)
				return ioc__zip_fail(z, w, "write: %s", ioc_strerror(w));
			z->st.out_bytes += produced;
		}
		if (r == 1) {
			z->streaming = false;
			z->st.frames++;
			memset(&z->fr, 0, sizeof(z->fr));
			return 0;
		}
		if (!used && produced < z->sout_cap)
			return 0;   /* needs more input */
	}
}

/* Hand a complete frame (csize bytes at p, dsize of content) to a slot:
 * alone if it is big, else into the open batch. */
static int dec_add_frame(struct ioc_zip *z, const uint8_t *p, uint64_t dsize)
{
	size_t csize = (size_t)z->fr.csize;
	bool small = csize < BATCH_FRAME && dsize < BATCH_FRAME;
	struct slot *s = z->batch;
	struct fdesc *f;
	int r;

	if (s && (!small || s->nf == BATCH_MAX || s->in_len + csize > BATCH_BYTES ||
		  s->out_len + dsize > BATCH_BYTES ||
		  (z->ref && (p < s->src || (uint64_t)(p - s->src) + csize > UINT32_MAX)))) {
		r = batch_submit(z);
		if (r < 0)
			return r;
		s = NULL;
	}
	if (!s) {
		r = ioc__zip_next_slot(z, &s);
		if (r < 0)
			return r;
		/* A batch slot gets room for a full batch up front, so
		 * appending never reallocates; a lone frame, its size. */
		if ((!z->ref &&
		     grow(&s->in, &s->in_cap, small ? BATCH_BYTES + BATCH_FRAME : csize) < 0) ||
		    (!z->o.write_at &&
		     grow(&s->out, &s->out_cap,
			  small ? BATCH_BYTES + BATCH_FRAME : dsize ? (size_t)dsize : 1) < 0))
			return ioc__zip_fail(z, -ENOMEM, "frame at offset %llu: out of memory",
				    (unsigned long long)z->stage_off);
		s->nf = 0;
		s->in_len = 0;
		s->out_len = 0;
		s->in_off = z->stage_off;
		s->out_off = z->out_next;
		s->src = z->ref ? p : s->in;
	}
	f = &s->fd[s->nf++];
	*f = (struct fdesc){ .coff = (uint32_t)(z->ref ? (size_t)(p - s->src) : s->in_len),
			     .csize = (uint32_t)csize,
			     .doff = (uint32_t)s->out_len, .dsize = (uint32_t)dsize,
			     .kind = z->fr.kind };
	if (!z->ref)
		memcpy(s->in + s->in_len, p, csize);
	s->in_len += csize;
	s->out_len += (size_t)dsize;
	z->out_next += dsize;
	/* Remember frames for checking a seek table we may meet, but not
	 * without bound: past 1M frames since the last table (12 MB), stop
	 * and skip the check rather than grow with hostile input. */
	if (z->fr.kind == IOC__ZIP_K_ZSTD && z->nents >= (1u << 20))
		z->ents_overflow = true;
	if (z->fr.kind == IOC__ZIP_K_ZSTD && !z->ents_overflow) {
		uint32_t sum = z->fr.has_sum ? ioc__zip_le32(p + csize - 4) : UINT32_MAX;

		r = ioc__zip_push_entry(z, (uint32_t)csize, (uint32_t)dsize, sum);
		if (r < 0)
			return ioc__zip_fail(z, r, "out of memory");
	}
	stage_consume(z, csize);
	memset(&z->fr, 0, sizeof(z->fr));
	if (!small)
		return ioc__zip_submit(z, s);
	z->batch = s;
	return 0;
}

/* Split the staged input into frames and dispatch them. */
static int dec_split(struct ioc_zip *z)
{
	while (z->stage_len || z->streaming) {
		const uint8_t *p = z->stage + z->stage_start;
		const char *why = NULL;
		bool must_stream;
		uint64_t dsize;
		int r;

		if (z->skip_left) {
			size_t n = z->stage_len < z->skip_left ? z->stage_len : (size_t)z->skip_left;

			stage_consume(z, n);
			z->skip_left -= n;
			if (z->skip_left)
				return 0;
			continue;
		}
		if (z->streaming) {
			r = stream_step(z);
			if (r < 0 || z->streaming)
				return r;
			continue;
		}
		r = ioc__zip_scan(&z->fr, p, z->stage_len, &why);
		if (r < 0)
			return ioc__zip_fail(z, r, "offset %llu: %s", (unsigned long long)z->stage_off, why);
		if (!z->fr.hdr_done)
			return 0;
		if (z->fr.kind == IOC__ZIP_K_SKIP) {
			if (r == 0 && z->fr.csize > z->stage_max) {
				/* Too big to check: drop it as it streams by. */
				z->skip_left = z->fr.csize;
				z->nents = 0;
				z->ents_overflow = false;
				memset(&z->fr, 0, sizeof(z->fr));
				continue;
			}
			if (r == 0)
				return 0;
			if (z->fr.skip_magic == IOC__ZIP_SEEK_SKIP_MAGIC) {
				r = check_seek_table(z, p, (size_t)z->fr.csize);
				if (r < 0)
					return r;
			}
			stage_consume(z, (size_t)z->fr.csize);
			memset(&z->fr, 0, sizeof(z->fr));
			continue;
		}
		dsize = z->fr.dsize;
		if (z->fr.kind == IOC__ZIP_K_GZIP && r == 1)
			dsize = ioc__zip_le32(p + z->fr.csize - 4);
		must_stream = !z->fr.sized ||
			      (z->fr.kind == IOC__ZIP_K_ZSTD &&
			       (dsize == UINT64_MAX || dsize > z->o.max_frame)) ||
			      (r == 1 && dsize > z->o.max_frame) ||
			      (r == 0 && z->stage_len >= z->stage_max);
		if (must_stream) {
			r = stream_begin(z);
			if (r < 0)
				return r;
			continue;
		}
		if (r == 0)
			return 0;
		r = dec_add_frame(z, p, dsize);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Frames, then whatever batch is open: a batch never waits for more input
 * (the next frame may be seconds away in a live stream). */
static int dec_process(struct ioc_zip *z)
{
	int r = dec_split(z);

	return r < 0 ? r : batch_submit(z);
}

static int dec_finish(struct ioc_zip *z)
{
	int r = dec_process(z);

	if (r < 0)
		return r;
	if (z->streaming || z->stage_len || z->skip_left)
		return ioc__zip_fail(z, -EBADMSG, "offset %llu: input ends inside a frame (truncated)",
			    (unsigned long long)(z->streaming ? z->frame_off : z->stage_off));
	return ioc__zip_drain(z);
}

/* ---- entry points ------------------------------------------------- */

static int dec_buffer(struct ioc_zip *z, void **buf, size_t *len)
{
	/* Ask for at least 256 KiB of room, more while a frame is pending so
	 * one read can complete it. */
	int r = stage_reserve(z, 256u << 10);

	if (r < 0)
		return ioc__zip_fail(z, r, "out of memory");
	*buf = z->stage + z->stage_start + z->stage_len;
	*len = z->stage_cap - z->stage_start - z->stage_len;
	return 0;
}

static int dec_commit(struct ioc_zip *z, size_t n)
{
	if (n > z->stage_cap - z->stage_start - z->stage_len)
		return -EINVAL;
	z->stage_len += n;
	z->st.in_bytes += n;
	return dec_process(z);
}

static int dec_write_ref(struct ioc_zip *z, const uint8_t *buf, size_t len, uint32_t flags)
{
	uint8_t *own;
	size_t own_cap;
	int r;

	/* Only from a clean frame boundary: bytes of a pending frame are in
	 * the staging buffer and must be joined by copying. */
	if (z->stage_len || !len)
		return ioc_zip_write(z, buf, len, flags);
	/* The caller's buffer stands in as the staging buffer while its
	 * frames are split; slots point into it instead of copying. */
	own = z->stage;
	own_cap = z->stage_cap;
	z->stage = (uint8_t *)(uintptr_t)buf;   /* only read while ref is set */
	z->stage_start = 0;
	z->stage_len = len;
	z->stage_cap = len;
	z->st.in_bytes += len;
	z->ref = true;
	r = dec_process(z);
	z->ref = false;
	/* A partial frame left at the end (the caller's next write completes
	 * it) moves into the stream's own buffer. */
	{
		const uint8_t *rest = z->stage + z->stage_start;
		size_t n = r < 0 ? 0 : z->stage_len;

		z->stage = own;
		z->stage_cap = own_cap;
		z->stage_start = 0;
		z->stage_len = 0;
		if (n) {
			int e = stage_reserve(z, n);

			if (e < 0)
				return ioc__zip_fail(z, e, "out of memory");
			memcpy(z->stage, rest, n);
			z->stage_len = n;
		}
	}
	if (r == 0 && (flags & IOC_ZIP_FLUSH))
		r = ioc__zip_drain(z);
	return r;
}

static const struct ioc__zip_dir decompress_dir = {
	.decomp = true,
	.job = decompress_job,
	.buffer = dec_buffer,
	.commit = dec_commit,
	.write_ref = dec_write_ref,
	.finish = dec_finish,
};

int ioc_zip_decompressor_new(struct ioc_zip **out, const struct ioc_zip_opts *opts)
{
	return ioc__zip_create(out, opts, &decompress_dir);
}
