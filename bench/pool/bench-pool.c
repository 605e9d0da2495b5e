/*
 * bench-pool: the thread pool against GLib's GThreadPool and libuv's
 * uv_queue_work, one implementation per process.
 *
 *   bench-pool --impl iocore|glib|libuv --case preadv|empty
 *              [--file PATH] [--depth 64] [--threads 4] [--seconds 2]
 *              [--variant NAME]   (iocore only: the ablations below)
 *
 * preadv: `depth` 4 KiB preadv requests in flight from one event loop, at
 * random aligned offsets of PATH (an image in /dev/shm), each completion
 * resubmitting at once; requests/s.  empty: the same with a job that does
 * nothing, so only the round trip is measured; ns per job.
 *
 * How each peer delivers completions to "the loop":
 *  - iocore: done callbacks on an ioc_loop (loop thread = main thread).
 *  - libuv: uv_queue_work's after_work_cb on a uv_loop (its pool size set
 *    with UV_THREADPOOL_SIZE, which libuv reads once per process).
 *  - GLib: a GThreadPool (non-exclusive, max `threads`) whose job pushes
 *    the finished request on a GAsyncQueue that the main thread pops; the
 *    cheapest way back to one thread GLib offers (a GMainContext source per
 *    completion would be slower), so the comparison favours the peer.
 *
 * Variants (case "ablation", iocore only) each turn one design step off:
 *   default, no-submit-batch, no-complete-batch, wake-always, no-spin,
 *   spin-busy, no-lag-yield, qemu-like (all of those off, and threads
 *   started eagerly), max64 (the default max_threads of 64), eager-spawn
 *   (max 64, a thread whenever none is idle, as QEMU: what the spawn delay
 *   avoids).
 *
 * The first 10% of the run is warm-up and not counted.  One row of JSON on
 * stdout (bench/README.md); diagnostics on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "iocore/pool.h"
#include "src/pool/pool-int.h"
#include "common/bench.h"

#ifdef HAVE_GLIB
#include <glib.h>
#endif
#ifdef HAVE_LIBUV
#include <uv.h>
#endif

enum { BS = 4096, MAX_DEPTH = 1024 };

struct cfg {
	const char *impl, *case_name, *file, *variant;
	unsigned depth, threads;
	double seconds;
	bool empty;
	int fd;
	uint64_t nblocks;
};

static struct cfg cfg = {
	.impl = "iocore", .case_name = "preadv", .variant = NULL,
	.depth = 64, .threads = 4, .seconds = 2.0, .fd = -1,
};

/* Shared run state (touched only by the submitting thread). */
struct run {
	uint64_t start, warm, end;
	uint64_t count, count_at_warm, t_warm;
	uint64_t cpu_warm, cpu_end;   /* process CPU time, ns */
	unsigned inflight;
	bool stopping;
	uint32_t seed;
};

static struct run R;

struct slot {
	union {
		struct ioc_pool_req req;
#ifdef HAVE_LIBUV
		uv_work_t uv;
#endif
	} u;
	uint64_t off;
	int64_t ret;
	char *buf;
};

static struct slot slots[MAX_DEPTH];

static uint64_t cpu_ns(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u;
}

static uint64_t next_offset(void)
{
	if (cfg.empty)
		return 0;
	R.seed = R.seed * 1664525u + 1013904223u;
	return (uint64_t)(R.seed >> 4) % cfg.nblocks * BS;
}

static int64_t do_job(struct slot *s)
{
	struct iovec iov = { s->buf, BS };
	ssize_t r;

	if (cfg.empty)
		return 0;
	r = preadv(cfg.fd, &iov, 1, (off_t)s->off);
	return r < 0 ? -errno : r;
}

/* After a completion: count it, decide whether to resubmit. */
static bool account(int64_t ret)
{
	if (ret != (cfg.empty ? 0 : BS)) {
		fprintf(stderr, "bench-pool: job failed: %lld\n", (long long)ret);
		exit(1);
	}
	R.count++;
	R.inflight--;
	if ((R.count & 63) == 0 && !R.stopping) {
		uint64_t now = ioc_bench_now_ns();

		if (!R.t_warm && now >= R.warm) {
			R.t_warm = now;
			R.count_at_warm = R.count;
			R.cpu_warm = cpu_ns();
		}
		if (now >= R.end) {
			R.stopping = true;
			R.end = now;
			R.cpu_end = cpu_ns();
		}
	}
	return !R.stopping;
}

static void run_begin(void)
{
	R.start = ioc_bench_now_ns();
	R.warm = R.start + (uint64_t)(cfg.seconds * 1e8);
	R.end = R.start + (uint64_t)(cfg.seconds * 1e9);
	R.seed = 12345;
}

/* ---- the ceiling: threads calling preadv themselves ---------------------- */

/*
 * Not a thread pool: cfg.threads threads each call the job in a loop, with
 * no handoff, no loop thread and no completion.  What no pool can beat on
 * this machine: with 4 KiB page-cache reads the kernel's own preadv cost
 * (copy, page-cache lookup, file refcount and atime, shared by threads
 * reading one file) bounds every implementation, and this row shows where
 * that bound lies next to the pools' rows.
 */
static _Atomic uint64_t bare_count;
static _Atomic bool bare_stop, bare_failed;

static void *bare_thread(void *arg)
{
	struct slot *s = arg;
	uint32_t seed = (uint32_t)(uintptr_t)arg;
	uint64_t n = 0;

	/* Relaxed: a stop flag and a counter, read after join / sampled. */
	while (!atomic_load_explicit(&bare_stop, memory_order_relaxed)) {
		seed = seed * 1664525u + 1013904223u;
		s->off = cfg.empty ? 0 : (uint64_t)(seed >> 4) % cfg.nblocks * BS;
		if (do_job(s) != (cfg.empty ? 0 : BS)) {
			/* Relaxed: read after pthread_join(), which orders it. */
			atomic_store_explicit(&bare_failed, true, memory_order_relaxed);
			break;
		}
		if (++n == 64) {
			atomic_fetch_add_explicit(&bare_count, n, memory_order_relaxed);
			n = 0;
		}
	}
	return NULL;
}

static void sleep_until_ns(uint64_t t)
{
	for (uint64_t now; (now = ioc_bench_now_ns()) < t;) {
		struct timespec ts = { (time_t)((t - now) / 1000000000u),
				       (long)((t - now) % 1000000000u) };

		nanosleep(&ts, NULL);
	}
}

static const char *run_bare(void)
{
	pthread_t tids[64];
	unsigned t = cfg.threads < 64 ? cfg.threads : 64;

	if (t > cfg.depth)
		return "bare needs --depth >= --threads (one buffer per thread)";
	run_begin();
	for (unsigned i = 0; i < t; i++)
		if (pthread_create(&tids[i], NULL, bare_thread, &slots[i]))
			return "pthread_create failed";
	sleep_until_ns(R.warm);
	R.t_warm = ioc_bench_now_ns();
	R.count_at_warm = atomic_load_explicit(&bare_count, memory_order_relaxed);
	R.cpu_warm = cpu_ns();
	sleep_until_ns(R.end);
	R.end = ioc_bench_now_ns();
	R.count = atomic_load_explicit(&bare_count, memory_order_relaxed);
	R.cpu_end = cpu_ns();
	atomic_store_explicit(&bare_stop, true, memory_order_relaxed);
	for (unsigned i = 0; i < t; i++)
		pthread_join(tids[i], NULL);
	return atomic_load_explicit(&bare_failed, memory_order_relaxed) ?
	       "a preadv failed" : NULL;
}

/* ---- iocore -------------------------------------------------------------- */

static struct ioc_loop *io_loop;
static struct ioc_pool *io_pool;

static int64_t io_fn(void *arg)
{
	return do_job(arg);
}

static void io_submit(struct slot *s);

static void io_done(void *opaque, int64_t ret)
{
	struct slot *s = opaque;

	if (account(ret))
		io_submit(s);
	else if (R.inflight == 0)
		ioc_loop_stop(io_loop);
}

static void io_submit(struct slot *s)
{
	s->off = next_offset();
	R.inflight++;
	ioc_pool_submit(io_pool, &s->u.req, io_fn, s, io_done, s);
}

static const char *run_iocore(void)
{
	struct ioc_pool_opts o = { .max_threads = cfg.threads };
	uint32_t ablation = 0;
	const char *v = cfg.variant ? cfg.variant : "default";
	struct ioc_pool_stats st;
	struct ioc_loop_stats ls;
	int rc;

	if (!strcmp(v, "no-submit-batch"))
		ablation = IOC__POOL_NO_SUBMIT_BATCH;
	else if (!strcmp(v, "no-complete-batch"))
		ablation = IOC__POOL_NO_COMPLETE_BATCH;
	else if (!strcmp(v, "wake-always"))
		ablation = IOC__POOL_WAKE_ALWAYS;
	else if (!strcmp(v, "no-spin"))
		o.spin_max_ns = -1;
	else if (!strcmp(v, "spin-busy"))
		ablation = IOC__POOL_SPIN_BUSY;
	else if (!strcmp(v, "no-lag-yield"))
		ablation = IOC__POOL_NO_LAG_YIELD;
	else if (!strcmp(v, "qemu-like")) {
		ablation = IOC__POOL_NO_SUBMIT_BATCH |
			   IOC__POOL_NO_COMPLETE_BATCH |
			   IOC__POOL_WAKE_ALWAYS | IOC__POOL_NO_LAG_YIELD;
		o.spin_max_ns = -1;
		o.spawn_delay_ns = -1;
	} else if (!strcmp(v, "eager-spawn")) {
		o.max_threads = 64;
		o.spawn_delay_ns = -1;
	} else if (!strcmp(v, "max64"))
		o.max_threads = 64;
	else if (strcmp(v, "default"))
		return "unknown variant";

	rc = ioc_loop_new(&io_loop, NULL);
	if (rc < 0)
		return "ioc_loop_new failed";
	ioc_loop_set_current(io_loop);
	rc = ioc__pool_new_ablated(&io_pool, &o, ablation);
	if (rc < 0)
		return "ioc_pool_new failed";
	run_begin();
	for (unsigned i = 0; i < cfg.depth; i++)
		io_submit(&slots[i]);
	ioc_loop_run(io_loop);
	ioc_pool_get_stats(io_pool, &st);
	ioc_loop_get_stats(io_loop, &ls);
	fprintf(stderr, "iocore[%s]: %llu jobs, %llu completion batches "
		"(%.1f per batch), %llu worker wakeups, %llu lag yields, %u threads; "
		"loop: %llu sleeps, %llu notify syscalls (%.3f per job)\n", v,
		(unsigned long long)st.completed,
		(unsigned long long)st.completion_batches,
		st.completion_batches ? (double)st.completed / st.completion_batches : 0,
		(unsigned long long)st.worker_wakeups,
		(unsigned long long)st.lag_yields, st.threads,
		(unsigned long long)ls.blocking_waits,
		(unsigned long long)ls.notifies,
		st.completed ? (double)ls.notifies / st.completed : 0);
	ioc_pool_free(io_pool);
	ioc_loop_free(io_loop);
	return NULL;
}

/* ---- GLib GThreadPool ------------------------------------------------------ */

#ifdef HAVE_GLIB
static GAsyncQueue *g_doneq;

static void glib_work(gpointer data, gpointer user)
{
	struct slot *s = data;

	s->ret = do_job(s);
	g_async_queue_push(g_doneq, s);
}

static const char *run_glib(void)
{
	GThreadPool *pool;
	GError *err = NULL;

	g_doneq = g_async_queue_new();
	pool = g_thread_pool_new(glib_work, NULL, (gint)cfg.threads, FALSE, &err);
	if (!pool)
		return "g_thread_pool_new failed";
	run_begin();
	for (unsigned i = 0; i < cfg.depth; i++) {
		slots[i].off = next_offset();
		R.inflight++;
		g_thread_pool_push(pool, &slots[i], NULL);
	}
	while (R.inflight) {
		struct slot *s = g_async_queue_pop(g_doneq);

		if (account(s->ret)) {
			s->off = next_offset();
			R.inflight++;
			g_thread_pool_push(pool, s, NULL);
		}
	}
	g_thread_pool_free(pool, FALSE, TRUE);
	g_async_queue_unref(g_doneq);
	return NULL;
}
#else
static const char *run_glib(void)
{
	return "built without glib-2.0";
}
#endif

/* ---- libuv uv_queue_work --------------------------------------------------- */

#ifdef HAVE_LIBUV
static uv_loop_t uvl;

static void uv_work(uv_work_t *w)
{
	struct slot *s = (struct slot *)w;

	s->ret = do_job(s);
}

static void uv_submit(struct slot *s);

static void uv_after(uv_work_t *w, int status)
{
	struct slot *s = (struct slot *)w;

	if (status)
		s->ret = status;
	if (account(s->ret))
		uv_submit(s);
}

static void uv_submit(struct slot *s)
{
	s->off = next_offset();
	R.inflight++;
	uv_queue_work(&uvl, &s->u.uv, uv_work, uv_after);
}

static const char *run_libuv(void)
{
	char n[16];

	/* libuv sizes its process-global pool from the environment once. */
	snprintf(n, sizeof(n), "%u", cfg.threads);
	setenv("UV_THREADPOOL_SIZE", n, 1);
	if (uv_loop_init(&uvl))
		return "uv_loop_init failed";
	run_begin();
	for (unsigned i = 0; i < cfg.depth; i++)
		uv_submit(&slots[i]);
	uv_run(&uvl, UV_RUN_DEFAULT);
	uv_loop_close(&uvl);
	return NULL;
}
#else
static const char *run_libuv(void)
{
	return "built without libuv";
}
#endif

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "impl", required_argument, NULL, 'i' },
		{ "case", required_argument, NULL, 'c' },
		{ "file", required_argument, NULL, 'f' },
		{ "depth", required_argument, NULL, 'd' },
		{ "threads", required_argument, NULL, 't' },
		{ "seconds", required_argument, NULL, 's' },
		{ "variant", required_argument, NULL, 'v' },
		{ 0 }
	};
	char cmd[1024], params[256], impl[64];
	struct ioc_bench_row row = { .suite = "pool" };
	const char *err = NULL;
	double elapsed, n;
	int opt;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'i': cfg.impl = optarg; break;
		case 'c': cfg.case_name = optarg; break;
		case 'f': cfg.file = optarg; break;
		case 'd': cfg.depth = (unsigned)atoi(optarg); break;
		case 't': cfg.threads = (unsigned)atoi(optarg); break;
		case 's': cfg.seconds = atof(optarg); break;
		case 'v': cfg.variant = optarg; break;
		default:
			fprintf(stderr, "usage: see the comment in bench-pool.c\n");
			return 2;
		}
	}
	if (cfg.depth == 0 || cfg.depth > MAX_DEPTH || cfg.threads == 0)
		return 2;
	cfg.empty = !strcmp(cfg.case_name, "empty");
	if (!cfg.empty) {
		struct stat sb;

		if (!cfg.file) {
			fprintf(stderr, "bench-pool: --file is required\n");
			return 2;
		}
		cfg.fd = open(cfg.file, O_RDONLY);
		if (cfg.fd < 0 || fstat(cfg.fd, &sb) < 0 || sb.st_size < BS) {
			perror(cfg.file);
			return 1;
		}
		cfg.nblocks = (uint64_t)sb.st_size / BS;
	}
	for (unsigned i = 0; i < cfg.depth; i++)
		if (posix_memalign((void **)&slots[i].buf, BS, BS))
			return 1;

	if (!strcmp(cfg.impl, "iocore"))
		err = run_iocore();
	else if (!strcmp(cfg.impl, "glib"))
		err = run_glib();
	else if (!strcmp(cfg.impl, "libuv"))
		err = run_libuv();
	else if (!strcmp(cfg.impl, "bare"))
		err = run_bare();
	else
		err = "unknown impl";

	if (cfg.variant)
		snprintf(params, sizeof(params), "job=%s,depth=%u,threads=%u,variant=%s",
			 cfg.case_name, cfg.depth, cfg.threads, cfg.variant);
	else
		snprintf(params, sizeof(params), "bs=%u,depth=%u,threads=%u%s",
			 cfg.empty ? 0 : BS, cfg.depth, cfg.threads,
			 cfg.empty ? "" : ",file=/dev/shm");
	snprintf(impl, sizeof(impl), "%s",
		 !strcmp(cfg.impl, "glib") ? "glib-gthreadpool" :
		 !strcmp(cfg.impl, "bare") ? "ceiling-bare-threads" : cfg.impl);
	row.case_name = cfg.variant ? "ablation" : cfg.case_name;
	row.params = params;
	row.impl = impl;
	row.peer = strcmp(cfg.impl, "iocore") != 0;
	row.cmd = ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));
	row.lower_is_better = cfg.empty;
	row.metric = cfg.empty ? "ns/job" : "requests/s";
	if (err || !R.t_warm || R.count <= R.count_at_warm) {
		row.error = err ? err : "run too short";
		row.value_ok = false;
	} else {
		elapsed = (double)(R.end - R.t_warm);
		n = (double)(R.count - R.count_at_warm);
		row.value = cfg.empty ? elapsed / n : n / (elapsed / 1e9);
		row.value_ok = true;
		/* CPU per job: what the design controls even when other
		 * work shares the CPUs (spinning counts as cost). */
		fprintf(stderr, "%s %s: %.0f ns CPU per job, %.2f CPUs busy\n",
			impl, cfg.variant ? cfg.variant : cfg.case_name,
			(double)(R.cpu_end - R.cpu_warm) / n,
			(double)(R.cpu_end - R.cpu_warm) / elapsed);
	}
	ioc_bench_row(stdout, &row);
	return 0;
}
