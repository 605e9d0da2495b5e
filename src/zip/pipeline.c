/*
 * zip pipeline: blocks in, wq workers (de)compress, frames out in order;
 * here the slot cycle and compression (decompress.c feeds it frames).
 *
 * Problem.  QEMU's multithreaded migration compression spent its time in
 * locks and wakeups (a request per thread at a time, per-thread and global
 * locks, workers idle while the migration thread slept).  We want every
 * worker busy, bounded memory, no allocation per block, output in input
 * order, for the CLI and embedders (migration, backup).
 *
 * Design.  A stream owns nslots slots (ioc__zip_create()), each an input
 * buffer, an output buffer and an embedded struct ioc_wq_job, used strictly
 * in a cycle: job s lives in slot s % nslots.  The feeding thread, the only
 * one touching the stream's own fields, fills and submits slots in turn and,
 * when the next is still busy, collects completions and emits finished slots
 * in sequence through the write callback.  So:
 *  - memory is nslots * (block + bound) plus one codec context per worker,
 *    made up front or on first use, and reused;
 *  - order is the cycle: slot (emitted % nslots) goes out once its job is
 *    back, so the wq runs out of order and least-loaded sees true load;
 *  - nobody waits on a lock a worker holds: the only shared state is the wq's
 *    lockless rings and the context cells (`workers` of them, claimed by
 *    atomic exchange, created by their first claimant).
 * Blocks under 256 KiB (a migration's 4 KiB pages) are batched ~1 MiB to a
 * job, still one frame per block, so the per-job cost is paid per megabyte.
 * With opts.write_from_workers (the CLI sets it) workers write the output
 * themselves, in order, through a try-lock (worker_write()): otherwise the
 * feeding thread, a third thread on two cores, takes its writes out of one
 * worker's time.  ioc_zip_buffer() saves the input copy, ioc_zip_write_ref()
 * the read(2) copy too (workers use whole slots of the caller's buffer, the
 * CLI's mapping).  wstat: CPU time per worker (two clock_gettime() a job).
 *
 * Rejected (measurements in bench/zip/NOTES.md): a per-block malloc/free
 * (the allocator's locks and page faults show at 4 KiB blocks); a
 * mutex-protected reorder list (the slot cycle already is one); a separate
 * writer thread (the callback is the embedder's code, best on its own
 * thread; a third busy thread on two cores robs the workers); an in-order
 * workqueue (it blinds least-loaded: strict alternation); no spinning in the
 * wq, or workers pinned to their own cells (no change).
 */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "ioc-config.h"
#if IOC_HAVE_XXHASH
#include <xxhash.h>
#endif

#include "zip-int.h"
#include "util/buf.h"

int ioc__zip_fail(struct ioc_zip *z, int err, const char *fmt, ...)
{
	va_list ap;

	if (!z->dead) {
		va_start(ap, fmt);
		vsnprintf(z->err, sizeof(z->err), fmt, ap);
		va_end(ap);
		z->dead = true;
	}
	return err;
}

const char *ioc_zip_error(const struct ioc_zip *z)
{
	return z->err[0] ? z->err : "no error";
}

void ioc_zip_get_stats(const struct ioc_zip *z, struct ioc_zip_stats *st)
{
	*st = z->st;
}

int ioc_zip_get_worker_stats(struct ioc_zip *z, struct ioc_zip_worker_stats *st, unsigned max)
{
	for (unsigned i = 0; i < z->workers && i < max; i++) {
		st[i].cpu_ns = atomic_load_explicit(&z->wstats[i].cpu_ns, memory_order_relaxed);
		st[i].jobs = atomic_load_explicit(&z->wstats[i].jobs, memory_order_relaxed);
		st[i].frames = atomic_load_explicit(&z->wstats[i].frames, memory_order_relaxed);
	}
	return (int)z->workers;
}

/* ---- slot buffers ------------------------------------------------- */

/* Slot buffers are megabytes each and touched once per block.  Fresh
 * anonymous memory costs a page fault and a zeroed page per 4 KiB, which
 * for a short stream (a 50 MB file) is a visible share of the run; so
 * buffers of 2 MiB and more are mapped 2 MiB-aligned with MADV_HUGEPAGE
 * (transparent huge pages are commonly in "madvise" mode): one fault per
 * 2 MiB.  Where THP is off this is a plain mmap, no worse than malloc. */
#define HUGE_SZ (2u << 20)

static size_t buf_round(size_t n)
{
	return n >= HUGE_SZ ? (n + HUGE_SZ - 1) & ~(size_t)(HUGE_SZ - 1) : n;
}

void *ioc__zip_buf_alloc(size_t n)
{
	uint8_t *p, *a;
	size_t len = buf_round(n);

	if (len < HUGE_SZ)
		return malloc(n ? n : 1);
	p = mmap(NULL, len + HUGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	a = (uint8_t *)(((uintptr_t)p + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	munmap(a + len, (size_t)(p + HUGE_SZ - a));
#ifdef MADV_HUGEPAGE
	madvise(a, len, MADV_HUGEPAGE);
#endif
	return a;
}

void ioc__zip_buf_free(void *p, size_t n)
{
	if (!p)
		return;
	if (buf_round(n) < HUGE_SZ)
		free(p);
	else
		munmap(p, buf_round(n));
}

/* ---- worker side -------------------------------------------------- */

/* Which stream's wstats this thread writes, and where.  A wq thread serves
 * one wq, hence one stream, for its whole life, so the pair never goes
 * stale. */
static __thread struct ioc_zip *tl_zip;
static __thread unsigned tl_widx;

uint64_t ioc__zip_thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void ioc__zip_account(struct ioc_zip *z, uint64_t t0, unsigned frames)
{
	struct wstat *w;
	uint64_t dt = ioc__zip_thread_cpu_ns() - t0;

	if (tl_zip != z) {
		tl_zip = z;
		tl_widx = atomic_fetch_add_explicit(&z->next_widx, 1, memory_order_relaxed);
	}
	if (tl_widx >= z->workers)
		return;
	w = &z->wstats[tl_widx];
	/* Single writer; the feeding thread reads these after the wq handed
	 * the job back, which orders them (relaxed is enough). */
	atomic_store_explicit(&w->cpu_ns,
			      atomic_load_explicit(&w->cpu_ns, memory_order_relaxed) + dt,
			      memory_order_relaxed);
	atomic_store_explicit(&w->jobs, atomic_load_explicit(&w->jobs, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	atomic_store_explicit(&w->frames,
			      atomic_load_explicit(&w->frames, memory_order_relaxed) + frames,
			      memory_order_relaxed);
}

struct ctx_cell *ioc__zip_claim(struct ioc_zip *z)
{
	for (;;) {
		for (unsigned i = 0; i < z->ncells; i++) {
			struct ctx_cell *c = &z->cells[i];

			/* Pairs with the release store in ioc__zip_unclaim(). */
			if (!atomic_load_explicit(&c->busy, memory_order_relaxed) &&
			    !atomic_exchange_explicit(&c->busy, true, memory_order_acquire))
				return c;
		}
		/* Only reachable if the wq ran more jobs at once than it has
		 * workers; spin politely rather than fail. */
		sched_yield();
	}
}

void ioc__zip_unclaim(struct ctx_cell *c)
{
	/* Pairs with the acquire exchange in ioc__zip_claim(). */
	atomic_store_explicit(&c->busy, false, memory_order_release);
}

/* Output written by the workers (opts.write_from_workers): whoever holds
 * wtoken writes every ready slot from wnext on, in order, so the write
 * callback runs one call at a time, in sequence, on whichever worker
 * finished the head of the cycle; the feeding thread writes nothing.
 *
 * Handshake (no wait, no lost slot): a worker stores its slot's ready
 * flag, then tries the token.  The holder, after writing, releases the
 * token and then looks at the next slot's ready flag once more.  Both
 * pairs are seq_cst, so of "worker stores ready; worker tries token" and
 * "holder drops token; holder loads ready", at least one side sees the
 * other's store: either the worker gets the token and writes, or the
 * holder sees the flag and takes the token again.  A ready flag always
 * belongs to seq wnext when its slot is wnext's: the slot's previous seq
 * was written before wnext passed it, and its next seq cannot be
 * submitted before this one is emitted, which waits for written.
 * src/zip/ordered-write.pml models this with spin (tests/zip runs it, and
 * checks that the model without the recheck loses a block). */
static void worker_write(struct ioc_zip *z, struct slot *mine)
{
	/* Pairs with the seq_cst token release and ready load below. */
	atomic_store_explicit(&mine->ready, true, memory_order_seq_cst);
	for (;;) {
		uint64_t seq;
		struct slot *h;

		if (atomic_exchange_explicit(&z->wtoken, true, memory_order_seq_cst))
			return;         /* the holder will see our flag */
		for (;;) {
			int err;

			seq = atomic_load_explicit(&z->wnext, memory_order_relaxed);
			h = &z->slots[seq % z->nslots];
			/* Acquire: pairs with the compressing worker's store,
			 * so out/out_len/err are final. */
			if (!atomic_load_explicit(&h->ready, memory_order_acquire))
				break;
			err = atomic_load_explicit(&z->werr, memory_order_relaxed);
			/* After a failed block or write nothing more goes out
			 * (the feeding thread reports the first error). */
			if (!err && h->err)
				err = h->err;
			else if (!err && h->out_len)
				err = z->o.write(z->o.opaque, h->out, h->out_len);
			if (err)
				atomic_store_explicit(&z->werr, err, memory_order_relaxed);
			atomic_store_explicit(&h->ready, false, memory_order_relaxed);
			/* Pairs with the feeding thread's acquire load in
			 * reap(): the slot may be reused after this. */
			atomic_store_explicit(&h->written, true, memory_order_release);
			atomic_store_explicit(&z->wnext, seq + 1, memory_order_relaxed);
		}
		/* Pairs with the seq_cst ready store at the top. */
		atomic_store_explicit(&z->wtoken, false, memory_order_seq_cst);
		seq = atomic_load_explicit(&z->wnext, memory_order_relaxed);
		if (!atomic_load_explicit(&z->slots[seq % z->nslots].ready, memory_order_seq_cst))
			return;
	}
}

/* A run of all-zero blocks as one frame (opts.zero_runs).  A disk image
 * is often mostly zeros, in long runs; one RLE frame per block costs ~15
 * bytes plus a 12-byte seek-table entry per block, ~0.2% of the output for
 * a third of zeros in 12 KiB blocks, against ~50 bytes per run.  Only
 * blocks of one slot merge: a slot is written by whichever worker
 * compressed it, in order, so a run across slots would need the writer to
 * hold a frame back.  The frame's checksum is XXH64 of the run's zeros
 * (libxxhash; libzstd does not export its own), hashed once when the run
 * ends.  Rejected: hashing a static zero buffer per block (the run's own
 * input is contiguous zeros already); compressing the run through libzstd
 * to learn the checksum (its match finder on a megabyte of zeros costs
 * more than the hash). */
static bool zero_runs_on(const struct ioc_zip *z)
{
	return z->o.zero_runs && z->o.format == IOC_ZIP_ZSTD &&
	       (z->o.no_checksum || IOC_HAVE_XXHASH);
}

/* Rewrite the run's frame, fd[fi] at out offset at, to cover dsize bytes
 * of zeros from s->src + in. */
static int zero_run_end(struct ioc_zip *z, struct slot *s, unsigned fi, size_t at, size_t in,
			size_t dsize)
{
	bool with_sum = !z->o.no_checksum;
	uint32_t sum = 0;
	size_t n = ioc__zip_zero_frame_size(dsize, with_sum);

	if (n > s->out_cap - at)
		return -ENOSPC;
#if IOC_HAVE_XXHASH
	if (with_sum)
		sum = (uint32_t)XXH64(s->src + in, dsize, 0);
#else
	(void)in;
#endif
	n = ioc__zip_zero_frame(s->out + at, dsize, with_sum, sum);
	s->out_len = at + n;
	s->fd[fi].csize = (uint32_t)n;
	s->fd[fi].dsize = (uint32_t)dsize;
	s->fd[fi].sum = sum;
	return 0;
}

static void compress_job(struct ioc_wq_job *job)
{
	struct slot *s = ioc_container_of(job, struct slot, job);
	struct ioc_zip *z = s->z;
	uint64_t t0 = ioc__zip_thread_cpu_ns();
	struct ctx_cell *c = ioc__zip_claim(z);
	ssize_t r;

	if (!c->ready) {
		int e = ioc__zip_cctx_init(&c->c, z->o.format, z->level, !z->o.no_checksum,
					   z->o.deflate);
		if (e < 0) {
			s->err = e;
			s->why = "cannot create a compression context";
			s->nf = 0;
			goto out;
		}
		c->ready = true;
	}
	/* The slot's input is cut into blocks of z->block (the last may be
	 * short); each becomes one frame, back to back in out. */
	s->out_len = 0;
	s->nf = 0;
	s->npck = 0;
	s->err = 0;
	/* The open zero run: its frame fd[run_f] at out offset run_at, its
	 * data at src offset run_in, run_len bytes in run_n blocks. */
	bool runs = zero_runs_on(z);
	unsigned run_f = 0, run_n = 0;
	size_t run_at = 0, run_in = 0, run_len = 0;

	for (size_t off = 0; off < s->in_len || s->nf == 0; off += z->block) {
		size_t len = s->in_len - off < z->block ? s->in_len - off : z->block;
		struct fdesc *f;

		if (run_n) {
			if (run_len + len <= IOC_ZIP_MAX_BLOCK &&
			    ioc__zip_all_zero(s->src + off, len)) {
				run_len += len;
				run_n++;
				continue;
			}
			if (run_n > 1 && zero_run_end(z, s, run_f, run_at, run_in, run_len) < 0) {
				s->err = -ENOSPC;
				s->why = "compression failed";
				break;
			}
			run_n = 0;
		}
		f = &s->fd[s->nf++];
		r = ioc__zip_compress(&c->c, s->out + s->out_len, s->out_cap - s->out_len,
				      s->src + off, len, &f->sum, &f->zero);
		if (r < 0) {
			s->err = (int)r;
			s->why = "compression failed";
			break;
		}
		f->dsize = (uint32_t)len;
		f->csize = (uint32_t)r;
		f->pck_n = 0;
#if IOC_HAVE_XXHASH
		if (z->pck_on && !f->zero &&
		    ioc__zip_is_stored(s->out + s->out_len, (size_t)r, len)) {
			unsigned np = ioc__zip_pck_pages(len);

			f->pck_at = (uint32_t)s->npck;
			f->pck_n = (uint8_t)np;
			for (unsigned pg = 0; pg < np; pg++) {
				size_t at = (size_t)pg * IOC__ZIP_PAGE;
				size_t n = len - at < IOC__ZIP_PAGE ? len - at : IOC__ZIP_PAGE;

				s->pck[s->npck++] = ioc__zip_page_check(s->src + off + at, n);
			}
		}
#endif
		if (runs && f->zero) {
			run_f = s->nf - 1;
			run_n = 1;
			run_at = s->out_len;
			run_in = off;
			run_len = len;
		}
		s->out_len += (size_t)r;
	}
	if (!s->err && run_n > 1 && zero_run_end(z, s, run_f, run_at, run_in, run_len) < 0) {
		s->err = -ENOSPC;
		s->why = "compression failed";
	}
out:
	ioc__zip_unclaim(c);
	if (z->o.write_from_workers)
		worker_write(z, s);
	ioc__zip_account(z, t0, s->nf);
}
/* ---- feeding-thread side ------------------------------------------ */

int ioc__zip_push_entry(struct ioc_zip *z, uint32_t csize, uint32_t dsize, uint32_t sum)
{
	if (z->nents >= IOC__ZIP_SEEK_MAX_FRAMES)
		return -EFBIG;
	if (z->nents == z->ents_cap) {
		void *p = ioc__array_grow(z->ents, &z->ents_cap, z->nents + 1, 256,
					  sizeof(*z->ents));

		if (!p)
			return -ENOMEM;
		z->ents = p;
	}
	z->ents[z->nents++] = (struct ioc__zip_seek_entry){ csize, dsize, sum };
	return 0;
}

/* Frame f, just pushed as seek-table entry nents - 1, into the page-check
 * frame: its bit (0 unless stored) and its checks from pck. */
static int push_pck(struct ioc_zip *z, const struct fdesc *f, const uint32_t *pck)
{
	size_t i = z->nents - 1;

	if (i / 8 >= z->pck_map_cap) {
		size_t old = z->pck_map_cap;
		uint8_t *p = ioc__buf_grow(z->pck_map, &z->pck_map_cap, i / 8 + 1, 256);

		if (!p)
			return -ENOMEM;
		memset(p + old, 0, z->pck_map_cap - old);
		z->pck_map = p;
	}
	if (!f->pck_n)
		return 0;
	if (z->npcks + f->pck_n > z->pcks_cap) {
		uint32_t *p = ioc__array_grow(z->pcks, &z->pcks_cap, z->npcks + f->pck_n, 1024,
					      sizeof(*p));

		if (!p)
			return -ENOMEM;
		z->pcks = p;
	}
	z->pck_map[i / 8] |= (uint8_t)(1u << (i % 8));
	memcpy(z->pcks + z->npcks, pck + f->pck_at, f->pck_n * sizeof(*pck));
	z->npcks += f->pck_n;
	return 0;
}

/* Write out a finished slot (the oldest one). */
static int emit(struct ioc_zip *z, struct slot *s)
{
	int r;

	if (s->err) {
		if (z->decomp && s->err == -EBADMSG)
			return ioc__zip_fail(z, -EBADMSG, "frame at offset %llu: %s",
				    (unsigned long long)s->err_off, s->why);
		return ioc__zip_fail(z, s->err, "%s at offset %llu: %s: %s", z->decomp ? "frame" : "block",
			    (unsigned long long)s->in_off, s->why, ioc_strerror(s->err));
	}
	if (z->decomp) {
		/* With write_at the worker has written it already. */
		r = s->out_len && !z->o.write_at ? z->o.write(z->o.opaque, s->out, s->out_len) : 0;
		if (r < 0)
			return ioc__zip_fail(z, r, "write: %s", ioc_strerror(r));
		z->st.out_bytes += s->out_len;
		z->st.frames += s->nf;
		z->st.parallel_frames += s->nf;
		return 0;
	}
	if (z->o.write_from_workers)
		/* Written by a worker already (worker_write); its error, if
		 * any, read after the acquire of written in reap(). */
		r = atomic_load_explicit(&z->werr, memory_order_relaxed);
	else
		r = z->o.write(z->o.opaque, s->out, s->out_len);
	if (r < 0)
		return ioc__zip_fail(z, r, "write: %s", ioc_strerror(r));
	z->st.out_bytes += s->out_len;
	z->st.frames += s->nf;
	for (unsigned i = 0; i < s->nf; i++) {
		z->st.zero_frames += s->fd[i].zero;
		if (z->o.format == IOC_ZIP_ZSTD && !z->o.no_seek_table) {
			r = ioc__zip_push_entry(z, s->fd[i].csize, s->fd[i].dsize, s->fd[i].sum);
			if (r == 0 && z->pck_on)
				r = push_pck(z, &s->fd[i], s->pck);
			if (r < 0)
				return ioc__zip_fail(z, r, "seek table: %s", ioc_strerror(r));
		}
	}
	return 0;
}

static void mark_done(struct ioc_wq_job **jobs, int n)
{
	for (int i = 0; i < n; i++)
		ioc_container_of(jobs[i], struct slot, job)->done = true;
}

/* Emit finished blocks from the head of the cycle.  block=true waits until
 * at least the oldest in-flight block has been written; either way it then
 * writes whatever else is already finished and returns without waiting for
 * the rest (waiting for all of them would let the reader idle while the
 * workers finish the last blocks of a round). */
static int reap(struct ioc_zip *z, bool block)
{
	struct ioc_wq_job *jobs[32];
	bool progressed = false;
	int n;

	while (z->emitted < z->next_seq) {
		struct slot *s = &z->slots[z->emitted % z->nslots];

		/* With write_from_workers a slot handed back may still wait
		 * for an older one to be written; whoever writes it does so
		 * inside a job not yet handed back, so waiting for the next
		 * completion below is enough.  Acquire pairs with the
		 * release store in worker_write(). */
		if (s->done && (!z->o.write_from_workers ||
				atomic_load_explicit(&s->written, memory_order_acquire))) {
			int r = emit(z, s);

			if (r < 0)
				return r;
			s->done = false;
			z->emitted++;
			progressed = true;
			continue;
		}
		if (block && !progressed)
			n = ioc_wq_wait_done(z->wq, jobs, IOC_ARRAY_SIZE(jobs), -1);
		else
			n = ioc_wq_poll_done(z->wq, jobs, IOC_ARRAY_SIZE(jobs));
		if (n < 0)
			return ioc__zip_fail(z, n, "workqueue: %s", ioc_strerror(n));
		if (n == 0 && (!block || progressed))
			return 0;
		mark_done(jobs, n);
	}
	return 0;
}

int ioc__zip_submit(struct ioc_zip *z, struct slot *s)
{
	int r;

	s->done = false;
	s->err = 0;
	/* No worker looks at this slot's flags now: its last seq was
	 * written and emitted (see worker_write()). */
	atomic_store_explicit(&s->written, false, memory_order_relaxed);
	s->seq = z->next_seq++;
	z->filling = false;
	while ((r = ioc_wq_submit(z->wq, &s->job)) == -EAGAIN) {
		struct ioc_wq_job *jobs[32];
		int n = ioc_wq_wait_done(z->wq, jobs, IOC_ARRAY_SIZE(jobs), -1);

		if (n < 0)
			return ioc__zip_fail(z, n, "workqueue: %s", ioc_strerror(n));
		mark_done(jobs, n);
	}
	if (r < 0)
		return ioc__zip_fail(z, r, "workqueue submit: %s", ioc_strerror(r));
	/* Write out whatever is finished without waiting, so output flows
	 * while the reader keeps feeding. */
	return reap(z, false);
}

/* The slot for the next block, once it is free (its previous block
 * emitted). */
int ioc__zip_next_slot(struct ioc_zip *z, struct slot **out)
{
	int r;

	while (z->next_seq - z->emitted >= z->nslots) {
		r = reap(z, true);
		if (r < 0)
			return r;
	}
	*out = &z->slots[z->next_seq % z->nslots];
	return 0;
}

int ioc__zip_drain(struct ioc_zip *z)
{
	while (z->emitted < z->next_seq) {
		int r = reap(z, true);

		if (r < 0)
			return r;
	}
	return 0;
}

/* ---- construction ------------------------------------------------- */

size_t ioc_zip_default_block(enum ioc_zip_format format, int level)
{
	/* Independent blocks lose the matches a continuous stream would find
	 * across their boundaries.  zstd's window grows with the level
	 * (2 MiB at -3, 8 MiB from -6 up), so the block grows with it to stay
	 * within ~3% of `zstd -T` (bench/zip: -3 at 4 MiB is +2.1% on a tar
	 * of /usr, -9 at 4 MiB +7%, at 8 MiB +2.4%).  Deflate's window is
	 * 32 KiB: 1 MiB blocks lose nothing measurable and balance better. */
	if (format == IOC_ZIP_GZIP)
		return 1u << 20;
	if (level <= 0)
		level = 3;
	if (level <= 5)
		return 4u << 20;
	if (level <= 12)
		return 8u << 20;
	return 16u << 20;
}

static unsigned online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (unsigned)n : 1;
}

int ioc__zip_create(struct ioc_zip **out, const struct ioc_zip_opts *opts,
		    const struct ioc__zip_dir *dir)
{
	bool decomp = dir->decomp;
	struct ioc_zip *z;
	struct ioc_wq_opts wo = { 0 };
	int r;

	*out = NULL;
	if (!opts || (!opts->write && !(decomp && opts->write_at)))
		return -EINVAL;
	if (opts->out_buf && !(decomp && opts->write_at))
		return -EINVAL;
	if (opts->write_from_workers && decomp)
		return -EINVAL;
	if (!decomp && opts->format != IOC_ZIP_ZSTD && opts->format != IOC_ZIP_GZIP)
		return -EINVAL;
	if (opts->block_size && (opts->block_size < IOC_ZIP_MIN_BLOCK ||
				 opts->block_size > IOC_ZIP_MAX_BLOCK))
		return -EINVAL;
	if (opts->level < 0 || opts->level > 22)
		return -EINVAL;
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	z->decomp = decomp;
	z->dir = dir;
	z->o = *opts;
	z->level = opts->level ? opts->level : (opts->format == IOC_ZIP_GZIP ? 6 : 3);
	z->block = opts->block_size ? opts->block_size
				    : ioc_zip_default_block(opts->format, z->level);
	if (!z->o.max_frame)
		z->o.max_frame = IOC_ZIP_MAX_BLOCK;
	z->workers = opts->workers ? opts->workers : online_cpus();
	/* Compression: two blocks per worker plus two.  Blocks differ in cost
	 * (a tar mixes text and binaries), and the writer emits in order, so
	 * with one block per worker a worker that finished early idles until
	 * the slowest block of the round is written; the spare slots give it
	 * the next block instead (with the out-of-order wq below: 1-7% busy
	 * spread on a 200 MB tar of /usr, 50 blocks).
	 * Decompression: one per worker plus the one being filled and the one
	 * being written; frames decode fast and evenly, and every slot's
	 * output is megabytes of fresh memory to fault in, which on a VM costs
	 * more than the extra overlap buys.  With write_at the output buffer
	 * belongs to the worker's cell, not the slot (a slot is then only
	 * its compressed input, or nothing when fed by reference), so four
	 * per worker cost little and keep workers fed while the feeding
	 * thread waits for a core. */
	z->nslots = opts->in_flight ? opts->in_flight
		    : !decomp ? 2 * z->workers + 2
		    : opts->write_at ? 4 * z->workers + 2 : z->workers + 2;
	/* Small blocks are batched (bps per slot), see BATCH_FRAME. */
	z->bps = 1;
	if (!decomp && z->block < BATCH_FRAME) {
		z->bps = (unsigned)(BATCH_BYTES / z->block);
		if (z->bps > BATCH_MAX)
			z->bps = BATCH_MAX;
	}
	if (z->nslots < 2)
		z->nslots = 2;
	z->pck_on = IOC_HAVE_XXHASH && !decomp && opts->format == IOC_ZIP_ZSTD &&
		    !opts->no_seek_table && !opts->no_checksum && !opts->no_page_checks &&
		    ioc__zip_pck_pages(z->block);

	wo.workers = z->workers;
	wo.ring_size = 4;
	while (wo.ring_size < z->nslots)
		wo.ring_size *= 2;
	wo.policy = IOC_WQ_LEAST_LOADED;
	/* Not in_order: the slot cycle already orders the output, and an
	 * in-order wq keeps a finished job counted as in flight until every
	 * older one is done, which blinds least-loaded to which worker is
	 * actually free (measured: strict alternation, 14-17% busy spread;
	 * out of order: see bench/zip). */
	wo.in_order = false;
	wo.name = decomp ? "ioc-unzip" : "ioc-zip";
	r = ioc_wq_new(&z->wq, &wo);
	if (r < 0)
		goto fail;
	z->workers = ioc_wq_workers(z->wq);

	/* One context cell per worker; see the opening comment. */
	z->ncells = z->workers;
	z->cells = aligned_alloc(IOC_CACHELINE, sizeof(*z->cells) * z->ncells);
	if (!z->cells) {
		r = -ENOMEM;
		goto fail;
	}
	memset(z->cells, 0, sizeof(*z->cells) * z->ncells);
	for (unsigned i = 0; i < z->ncells; i++)
		atomic_init(&z->cells[i].busy, false);

	z->wstats = aligned_alloc(IOC_CACHELINE, sizeof(*z->wstats) * z->workers);
	if (!z->wstats) {
		r = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < z->workers; i++) {
		atomic_init(&z->wstats[i].cpu_ns, 0);
		atomic_init(&z->wstats[i].jobs, 0);
		atomic_init(&z->wstats[i].frames, 0);
	}
	atomic_init(&z->next_widx, 0);
	atomic_init(&z->wtoken, false);
	atomic_init(&z->wnext, 0);
	atomic_init(&z->werr, 0);

	z->slots = calloc(z->nslots, sizeof(*z->slots));
	if (!z->slots) {
		r = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < z->nslots; i++) {
		struct slot *s = &z->slots[i];

		s->z = z;
		s->job.fn = dir->job;
		atomic_init(&s->ready, false);
		atomic_init(&s->written, false);
		s->fd = calloc(BATCH_MAX, sizeof(*s->fd));
		if (!s->fd) {
			r = -ENOMEM;
			goto fail;
		}
		if (decomp)
			continue;   /* buffers grow on demand to the frames met */
		s->in_cap = z->block * z->bps;
		s->out_cap = ioc__zip_compress_bound(opts->format, z->block) * z->bps;
		s->in = ioc__zip_buf_alloc(s->in_cap);
		s->out = ioc__zip_buf_alloc(s->out_cap);
		if (z->pck_on)
			s->pck = calloc((size_t)z->bps * ioc__zip_pck_pages(z->block),
					sizeof(*s->pck));
		if (!s->in || !s->out || (z->pck_on && !s->pck)) {
			r = -ENOMEM;
			goto fail;
		}
	}
	if (decomp) {
		z->stage_max = ZSTD_compressBound(z->o.max_frame) + 4096;
		z->stage_cap = 1u << 20;
		z->stage = malloc(z->stage_cap);
		if (!z->stage) {
			r = -ENOMEM;
			goto fail;
		}
	}
	*out = z;
	return 0;
fail:
	ioc_zip_free(z);
	return r;
}


void ioc_zip_free(struct ioc_zip *z)
{
	if (!z)
		return;
	/* ioc_wq_free waits for submitted jobs, so no worker touches a slot
	 * or a cell after this. */
	if (z->wq)
		ioc_wq_free(z->wq);
	if (z->slots)
		for (unsigned i = 0; i < z->nslots; i++) {
			ioc__zip_buf_free(z->slots[i].in, z->slots[i].in_cap);
			ioc__zip_buf_free(z->slots[i].out, z->slots[i].out_cap);
			free(z->slots[i].fd);
			free(z->slots[i].pck);
		}
	free(z->slots);
	if (z->cells)
		for (unsigned i = 0; i < z->ncells; i++) {
			ioc__zip_buf_free(z->cells[i].obuf, z->cells[i].ocap);
			if (!z->cells[i].ready)
				continue;
			if (z->decomp)
				ioc__zip_dctx_fini(&z->cells[i].d);
			else
				ioc__zip_cctx_fini(&z->cells[i].c);
		}
	free(z->cells);
	free(z->wstats);
	if (z->sd_ready)
		ioc__zip_dctx_fini(&z->sd);
	free(z->sout);
	free(z->stage);
	free(z->ents);
	free(z->pck_map);
	free(z->pcks);
	free(z);
}

/* ---- compression -------------------------------------------------- */

static int comp_buffer(struct ioc_zip *z, void **buf, size_t *len)
{
	struct slot *s;
	int r;

	if (!z->filling) {
		r = ioc__zip_next_slot(z, &s);
		if (r < 0)
			return r;
		s->in_len = 0;
		s->in_off = z->in_total;
		s->src = s->in;
		z->filling = true;
	}
	s = &z->slots[z->next_seq % z->nslots];
	*buf = s->in + s->in_len;
	*len = s->in_cap - s->in_len;
	return 0;
}

static int comp_commit(struct ioc_zip *z, size_t n)
{
	struct slot *s = &z->slots[z->next_seq % z->nslots];

	if (!z->filling || n > s->in_cap - s->in_len)
		return -EINVAL;
	s->in_len += n;
	z->in_total += n;
	z->st.in_bytes += n;
	if (s->in_len == s->in_cap)
		return ioc__zip_submit(z, s);
	return 0;
}

static int comp_finish(struct ioc_zip *z)
{
	int r;

	/* A final partial block, or one empty frame for empty input so the
	 * output is a valid file for every tool. */
	if ((z->filling && z->slots[z->next_seq % z->nslots].in_len) || z->next_seq == 0) {
		void *b;
		size_t l;

		r = comp_buffer(z, &b, &l);
		if (r < 0)
			return r;
		r = ioc__zip_submit(z, &z->slots[z->next_seq % z->nslots]);
		if (r < 0)
			return r;
	}
	r = ioc__zip_drain(z);
	if (r < 0)
		return r;
	/* Page checks, if any frame was stored and they fit a skippable
	 * frame (~0.1% of the stored data). */
	if (z->pck_on && z->npcks &&
	    ioc__zip_pck_size(z->nents, z->npcks) - 8 <= UINT32_MAX) {
		size_t len = ioc__zip_pck_size(z->nents, z->npcks);
		uint8_t *t = malloc(len);

		if (!t)
			return ioc__zip_fail(z, -ENOMEM, "page checks: out of memory");
		ioc__zip_pck_write(t, z->nents, z->pck_map, z->pcks, z->npcks);
		r = z->o.write(z->o.opaque, t, len);
		free(t);
		if (r < 0)
			return ioc__zip_fail(z, r, "write: %s", ioc_strerror(r));
		z->st.out_bytes += len;
	}
	if (z->o.format == IOC_ZIP_ZSTD && !z->o.no_seek_table) {
		bool with_sum = !z->o.no_checksum;
		size_t len = ioc__zip_seektable_size(z->nents, with_sum);
		uint8_t *t = malloc(len);

		if (!t)
			return ioc__zip_fail(z, -ENOMEM, "seek table: out of memory");
		ioc__zip_seektable_write(t, z->ents, z->nents, with_sum);
		r = z->o.write(z->o.opaque, t, len);
		free(t);
		if (r < 0)
			return ioc__zip_fail(z, r, "write: %s", ioc_strerror(r));
		z->st.out_bytes += len;
	}
	return 0;
}

/* Compression by reference: each whole slot's worth (bps blocks) of the
 * caller's buffer goes to a worker in place, s->src pointing into it; a
 * slot a previous write left partly filled is topped up by copying first,
 * and a tail shorter than a slot is copied, so blocks are cut exactly
 * where ioc_zip_write() would cut them. */
static int comp_write_ref(struct ioc_zip *z, const uint8_t *p, size_t len, uint32_t flags)
{
	size_t full = z->block * z->bps;
	struct slot *s;
	int r;

	if (z->filling && z->slots[z->next_seq % z->nslots].in_len) {
		s = &z->slots[z->next_seq % z->nslots];
		size_t n = s->in_cap - s->in_len < len ? s->in_cap - s->in_len : len;

		r = ioc_zip_write(z, p, n, 0);
		if (r < 0)
			return r;
		p += n;
		len -= n;
	}
	while (len >= full) {
		/* A slot reserved by ioc_zip_buffer() without data is the
		 * next one in the cycle anyway: take it over. */
		r = ioc__zip_next_slot(z, &s);
		if (r < 0)
			return r;
		s->src = p;
		s->in_len = full;
		s->in_off = z->in_total;
		z->in_total += full;
		z->st.in_bytes += full;
		r = ioc__zip_submit(z, s);
		if (r < 0)
			return r;
		p += full;
		len -= full;
	}
	return len || flags ? ioc_zip_write(z, p, len, flags) : 0;
}

/* ---- entry points ------------------------------------------------- */

static const struct ioc__zip_dir compress_dir = {
	.decomp = false,
	.job = compress_job,
	.buffer = comp_buffer,
	.commit = comp_commit,
	.write_ref = comp_write_ref,
	.finish = comp_finish,
};

int ioc_zip_compressor_new(struct ioc_zip **out, const struct ioc_zip_opts *opts)
{
	return ioc__zip_create(out, opts, &compress_dir);
}

void ioc__zip_set_base(struct ioc_zip *z, uint64_t off)
{
	z->stage_off = off;
}

int ioc_zip_buffer(struct ioc_zip *z, void **buf, size_t *len)
{
	if (z->dead)
		return -EIO;
	return z->dir->buffer(z, buf, len);
}

static int flush(struct ioc_zip *z)
{
	if (!z->decomp && z->filling && z->slots[z->next_seq % z->nslots].in_len) {
		int r = ioc__zip_submit(z, &z->slots[z->next_seq % z->nslots]);

		if (r < 0)
			return r;
	}
	return ioc__zip_drain(z);
}

int ioc_zip_commit(struct ioc_zip *z, size_t n, uint32_t flags)
{
	int r;

	if (z->dead)
		return -EIO;
	if (flags & ~(uint32_t)IOC_ZIP_FLUSH)
		return -EINVAL;
	r = z->dir->commit(z, n);
	if (r == 0 && (flags & IOC_ZIP_FLUSH))
		r = flush(z);
	return r;
}

int ioc_zip_write(struct ioc_zip *z, const void *buf, size_t len, uint32_t flags)
{
	const uint8_t *p = buf;

	if (flags & ~(uint32_t)IOC_ZIP_FLUSH)
		return -EINVAL;
	do {
		void *dst;
		size_t room;
		int r = ioc_zip_buffer(z, &dst, &room);

		if (r < 0)
			return r;
		if (room > len)
			room = len;
		if (room)
			memcpy(dst, p, room);
		p += room;
		len -= room;
		r = ioc_zip_commit(z, room, len ? 0 : flags);
		if (r < 0)
			return r;
	} while (len);
	return 0;
}

int ioc_zip_write_ref(struct ioc_zip *z, const void *buf, size_t len, uint32_t flags)
{
	if (z->dead)
		return -EIO;
	if (flags & ~(uint32_t)IOC_ZIP_FLUSH)
		return -EINVAL;
	return z->dir->write_ref(z, buf, len, flags);
}

int ioc_zip_finish(struct ioc_zip *z)
{
	if (z->dead)
		return -EIO;
	return z->dir->finish(z);
}
