/*
 * Workqueue throughput, shaped like a migration's page pipeline: one
 * submitter thread, jobs that each process one 4 KiB page, K jobs in
 * flight, throughput in jobs/s.
 *
 *   bench-wq --case empty|crc4k|compress4k --impl iocore|glib|mutex|inline
 *            --workers N [--policy fill|rr|ll] [--jobs N] [--inflight K]
 *            [--variant]
 *
 * Cases: empty (the job does nothing: pure dispatch cost), crc4k (a 4-lane
 * multiply-rotate hash over the page, xxhash-like, ~0.3 us: "tiny"),
 * compress4k (ZSTD_compressCCtx level 1 of the page: "large").
 * Impls: iocore's wq (default policy, or --policy), GLib's GThreadPool with
 * completions through a GAsyncQueue, and a plain mutex+condvar queue (one
 * request queue, one done queue) written here as the floor.  And
 * "inline", reported as ceiling-inline: no queue and no thread, the
 * submitter runs each job as it submits it: the rate the work alone allows
 * one thread (not a peer; no target compares with it).
 * All use the same submitter loop: keep K = workers * 64 jobs in flight,
 * collect what finished, submit again.  Two rows per run: jobs/s (wall
 * clock) and cpu-ns/job (process CPU time per job, all threads).
 * --variant prints the row as case "batching", params job=...,policy=...,
 * impl iocore-<policy> (the FILL/RR/LL comparison, no peers).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zstd.h>

#include "common/bench.h"
#include "iocore/wq.h"

#ifdef IOC_HAVE_GLIB
#include <glib.h>
#endif

#define PAGE 4096
#define NPAGES 256
#define OUT_CAP (PAGE + 512)

enum jcase { J_EMPTY, J_CRC, J_ZSTD };

struct bjob {
	struct ioc_wq_job wq;
	struct bjob *next;          /* mutex queue link */
	const unsigned char *page;
	uint64_t sum;
	size_t csize;
	unsigned char out[OUT_CAP];
};

static enum jcase jcase;
static unsigned char *pages;

static uint64_t rotl64(uint64_t x, int r)
{
	return (x << r) | (x >> (64 - r));
}

/* xxhash64-like: four independent lanes of multiply-rotate. */
static uint64_t hash_page(const unsigned char *p)
{
	const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full;
	uint64_t h[4] = { P1 + P2, P2, 0, -P1 };

	for (size_t i = 0; i < PAGE; i += 32) {
		for (int l = 0; l < 4; l++) {
			uint64_t w;

			memcpy(&w, p + i + 8 * l, 8);
			h[l] = rotl64(h[l] + w * P2, 31) * P1;
		}
	}
	return rotl64(h[0], 1) + rotl64(h[1], 7) + rotl64(h[2], 12) + rotl64(h[3], 18);
}

static __thread ZSTD_CCtx *tls_cctx;

static void job_run(struct bjob *j)
{
	switch (jcase) {
	case J_EMPTY:
		j->sum = 1;
		break;
	case J_CRC:
		j->sum = hash_page(j->page);
		break;
	case J_ZSTD:
		if (!tls_cctx)
			tls_cctx = ZSTD_createCCtx();  /* one per thread, kept */
		j->csize = ZSTD_compressCCtx(tls_cctx, j->out, OUT_CAP, j->page, PAGE, 1);
		j->sum = ZSTD_isError(j->csize) ? 0 : j->csize;
		break;
	}
}

/* Semi-compressible pages: words from a small vocabulary plus noise. */
static void make_pages(void)
{
	static const char *words[] = { "block ", "sector ", "io_uring ", "queue ",
		"worker ", "ring ", "page ", "0000000000000000", "compress ", "zstd " };
	uint64_t x = 0x1234567;

	pages = aligned_alloc(4096, (size_t)NPAGES * PAGE);
	for (size_t off = 0; off < (size_t)NPAGES * PAGE;) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		if ((x >> 60) < 3) {
			pages[off++] = (unsigned char)(x >> 24);
		} else {
			const char *w = words[(x >> 33) % 10];

			for (; *w && off < (size_t)NPAGES * PAGE; w++)
				pages[off++] = (unsigned char)*w;
		}
	}
}

/* ---- the submitter loop, shared by every impl ------------------------- */

struct impl {
	/* 0 or -EAGAIN */
	int (*submit)(void *ctx, struct bjob *j);
	/* wait for at least one; return count placed in out */
	unsigned (*collect)(void *ctx, struct bjob **out, unsigned max);
	void *ctx;
};

static uint64_t cpu_ns(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u;
}

/* Process CPU time per job of the last run (all threads: the submitter,
 * the workers, their spinning and their syscalls). */
static double cpu_per_job;

static double run(const struct impl *im, struct bjob *pool, unsigned k,
		  uint64_t njobs, uint64_t *check)
{
	uint64_t c0 = cpu_ns();
	struct bjob **free_list = calloc(k, sizeof(*free_list));
	struct bjob **out = calloc(k, sizeof(*out));
	unsigned nfree = k;
	uint64_t submitted = 0, collected = 0, sum = 0, t0;

	for (unsigned i = 0; i < k; i++)
		free_list[i] = &pool[i];
	t0 = ioc_bench_now_ns();
	while (collected < njobs) {
		while (nfree && submitted < njobs) {
			struct bjob *j = free_list[nfree - 1];

			j->page = pages + (submitted % NPAGES) * PAGE;
			if (im->submit(im->ctx, j) < 0)
				break;
			nfree--;
			submitted++;
		}
		unsigned n = im->collect(im->ctx, out, k);

		for (unsigned i = 0; i < n; i++) {
			sum += out[i]->sum;
			free_list[nfree++] = out[i];
		}
		collected += n;
	}
	t0 = ioc_bench_now_ns() - t0;
	cpu_per_job = (double)(cpu_ns() - c0) / (double)njobs;
	*check = sum;
	free(free_list);
	free(out);
	return (double)njobs * 1e9 / (double)t0;
}

/* ---- iocore ---------------------------------------------------------- */

static void wq_job_fn(struct ioc_wq_job *job)
{
	job_run(ioc_container_of(job, struct bjob, wq));
}

static int wq_submit(void *ctx, struct bjob *j)
{
	j->wq.fn = wq_job_fn;
	return ioc_wq_submit(ctx, &j->wq);
}

static unsigned wq_collect(void *ctx, struct bjob **out, unsigned max)
{
	struct ioc_wq_job **jobs = (struct ioc_wq_job **)out;
	int n = ioc_wq_wait_done(ctx, jobs, max, -1);

	for (int i = 0; i < n; i++)
		out[i] = ioc_container_of(jobs[i], struct bjob, wq);
	return n > 0 ? (unsigned)n : 0;
}

/* ---- mutex + condvar queue (the floor) --------------------------------- */

struct mq {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct bjob *head, **tail;
};

struct mpool {
	struct mq req, done;
	bool stop;
	unsigned nthreads;
	pthread_t threads[64];
};

static void mq_init(struct mq *q)
{
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	q->head = NULL;
	q->tail = &q->head;
}

static void mq_push(struct mq *q, struct bjob *j)
{
	j->next = NULL;
	pthread_mutex_lock(&q->lock);
	*q->tail = j;
	q->tail = &j->next;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

static void *mq_worker(void *arg)
{
	struct mpool *mp = arg;

	for (;;) {
		struct bjob *j;

		pthread_mutex_lock(&mp->req.lock);
		while (!mp->req.head && !mp->stop)
			pthread_cond_wait(&mp->req.cond, &mp->req.lock);
		j = mp->req.head;
		if (!j) {
			pthread_mutex_unlock(&mp->req.lock);
			return NULL;
		}
		mp->req.head = j->next;
		if (!mp->req.head)
			mp->req.tail = &mp->req.head;
		pthread_mutex_unlock(&mp->req.lock);
		job_run(j);
		mq_push(&mp->done, j);
	}
}

static int mq_submit(void *ctx, struct bjob *j)
{
	mq_push(&((struct mpool *)ctx)->req, j);
	return 0;
}

static unsigned mq_collect(void *ctx, struct bjob **out, unsigned max)
{
	struct mpool *mp = ctx;
	unsigned n = 0;

	pthread_mutex_lock(&mp->done.lock);
	while (!mp->done.head)
		pthread_cond_wait(&mp->done.cond, &mp->done.lock);
	while (mp->done.head && n < max) {
		out[n++] = mp->done.head;
		mp->done.head = mp->done.head->next;
	}
	if (!mp->done.head)
		mp->done.tail = &mp->done.head;
	pthread_mutex_unlock(&mp->done.lock);
	return n;
}

/* ---- the ceiling: no queue, the submitter runs each job itself --------- */

/* What one thread needs for the jobs alone (the hash of a page, say), so
 * no one-worker queue can go faster; a peer's rate over this one is the
 * best ratio any queue could reach against it with one worker. */
struct inl {
	struct bjob **done;
	unsigned n;
};

static int inline_submit(void *ctx, struct bjob *j)
{
	struct inl *q = ctx;

	job_run(j);
	q->done[q->n++] = j;
	return 0;
}

static unsigned inline_collect(void *ctx, struct bjob **out, unsigned max)
{
	struct inl *q = ctx;
	unsigned n = q->n < max ? q->n : max;

	memcpy(out, q->done + q->n - n, n * sizeof(*out));
	q->n -= n;
	return n;
}

/* ---- GLib GThreadPool ------------------------------------------------- */

#ifdef IOC_HAVE_GLIB
static void glib_fn(gpointer data, gpointer user)
{
	job_run(data);
	g_async_queue_push(user, data);
}

struct gctx {
	GThreadPool *pool;
	GAsyncQueue *done;
};

static int glib_submit(void *ctx, struct bjob *j)
{
	struct gctx *g = ctx;

	return g_thread_pool_push(g->pool, j, NULL) ? 0 : -EIO;
}

static unsigned glib_collect(void *ctx, struct bjob **out, unsigned max)
{
	struct gctx *g = ctx;
	unsigned n = 0;

	out[n++] = g_async_queue_pop(g->done);
	while (n < max && (out[n] = g_async_queue_try_pop(g->done)))
		n++;
	return n;
}
#endif

int main(int argc, char **argv)
{
	const char *cas = "crc4k", *impl = "iocore", *policy = NULL;
	unsigned workers = 1, k = 0;
	uint64_t njobs = 0, check = 0;
	bool variant = false;
	int64_t spin_ns = 0;
	char params[160], cmd[512], implname[32];
	const char *err = NULL;
	double rate = 0;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : "";

		if (!strcmp(argv[i], "--variant")) {
			variant = true;
			continue;
		}
		if (!strcmp(argv[i], "--case"))
			cas = v;
		else if (!strcmp(argv[i], "--impl"))
			impl = v;
		else if (!strcmp(argv[i], "--workers"))
			workers = (unsigned)atoi(v);
		else if (!strcmp(argv[i], "--policy"))
			policy = v;
		else if (!strcmp(argv[i], "--jobs"))
			njobs = strtoull(v, NULL, 0);
		else if (!strcmp(argv[i], "--spin"))
			spin_ns = strtoll(v, NULL, 0);
		else if (!strcmp(argv[i], "--inflight"))
			k = (unsigned)atoi(v);
		i++;
	}
	jcase = !strcmp(cas, "empty") ? J_EMPTY : !strcmp(cas, "compress4k") ? J_ZSTD : J_CRC;
	if (workers < 1 || workers > 64)
		workers = 1;
	if (!k)
		k = workers * 64;
	if (!njobs)
		njobs = jcase == J_ZSTD ? 100000 : 1000000;
	make_pages();
	struct bjob *pool = aligned_alloc(64, (size_t)k * sizeof(*pool));
	memset(pool, 0, (size_t)k * sizeof(*pool));
	ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));

	struct ioc_bench_row row = {
		.suite = "wq", .case_name = cas, .params = params, .impl = implname,
		.metric = "jobs/s", .cmd = cmd,
	};

	if (!strcmp(impl, "iocore")) {
		struct ioc_wq_opts o = { .workers = workers, .name = "bench-wq",
					 .spin_ns = spin_ns };
		struct ioc_wq *wq;
		struct ioc_wq_worker_stats st[64];

		if (policy)
			o.policy = !strcmp(policy, "rr") ? IOC_WQ_ROUND_ROBIN :
				   !strcmp(policy, "ll") ? IOC_WQ_LEAST_LOADED : IOC_WQ_FILL;
		if (ioc_wq_new(&wq, &o) < 0)
			return 1;
		struct impl im = { wq_submit, wq_collect, wq };
		rate = run(&im, pool, k, njobs, &check);
		int n = ioc_wq_get_stats(wq, st, 64);
		for (int i = 0; i < n; i++)
			fprintf(stderr, "# worker %d: jobs %llu busy %.1f ms sleeps %llu wakeups %llu\n",
				i, (unsigned long long)st[i].jobs, st[i].busy_ns / 1e6,
				(unsigned long long)st[i].sleeps, (unsigned long long)st[i].wakeups);
		ioc_wq_free(wq);
		snprintf(implname, sizeof(implname), variant ? "iocore-%s" : "iocore",
			 policy ? policy : "fill");
	} else if (!strcmp(impl, "mutex")) {
		static struct mpool mp;

		mq_init(&mp.req);
		mq_init(&mp.done);
		mp.nthreads = workers;
		for (unsigned i = 0; i < workers; i++)
			pthread_create(&mp.threads[i], NULL, mq_worker, &mp);
		struct impl im = { mq_submit, mq_collect, &mp };
		rate = run(&im, pool, k, njobs, &check);
		pthread_mutex_lock(&mp.req.lock);
		mp.stop = true;
		pthread_cond_broadcast(&mp.req.cond);
		pthread_mutex_unlock(&mp.req.lock);
		for (unsigned i = 0; i < workers; i++)
			pthread_join(mp.threads[i], NULL);
		snprintf(implname, sizeof(implname), "mutex-condvar");
		row.peer = true;
	} else if (!strcmp(impl, "inline")) {
		struct inl q = { calloc(k, sizeof(struct bjob *)), 0 };
		struct impl im = { inline_submit, inline_collect, &q };

		if (!q.done)
			return 1;
		rate = run(&im, pool, k, njobs, &check);
		free(q.done);
		snprintf(implname, sizeof(implname), "ceiling-inline");
		row.peer = true;
	} else {
		snprintf(implname, sizeof(implname), "glib-gthreadpool");
		row.peer = true;
#ifdef IOC_HAVE_GLIB
		struct gctx g;

		g.done = g_async_queue_new();
		g.pool = g_thread_pool_new(glib_fn, g.done, (gint)workers, TRUE, NULL);
		struct impl im = { glib_submit, glib_collect, &g };
		rate = run(&im, pool, k, njobs, &check);
		g_thread_pool_free(g.pool, FALSE, TRUE);
		g_async_queue_unref(g.done);
#else
		err = "built without glib-2.0";
#endif
	}
	/* inflight appears in params only when it is not the default. */
	char kparam[32] = "";
	if (k != workers * 64)
		snprintf(kparam, sizeof(kparam), ",inflight=%u", k);
	if (variant)
		snprintf(params, sizeof(params), "job=%s,workers=%u,policy=%s%s", cas,
			 workers, policy ? policy : "fill", kparam);
	else
		snprintf(params, sizeof(params), "workers=%u%s", workers, kparam);
	if (variant)
		row.case_name = "batching";
	if (!err && check == 0) {
		err = "job results missing (checksum 0)";
	}
	row.value = rate;
	row.value_ok = !err;
	row.error = err;
	ioc_bench_row(stdout, &row);
	/* The same run as CPU time per job: less sensitive than the rate to
	 * other load on a shared machine, and it shows what spinning costs. */
	row.metric = "cpu-ns/job";
	row.value = cpu_per_job;
	row.lower_is_better = true;
	ioc_bench_row(stdout, &row);
	return 0;
}
