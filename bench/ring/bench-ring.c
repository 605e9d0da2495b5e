/*
 * Ring push+pop cost per element, per regime, iocore vs concurrencykit's
 * ck_ring in the same binary.
 *
 *   bench-ring --case single   --regime spsc|mpsc|mpmc --burst N --impl iocore|ck
 *   bench-ring --case threaded --regime spsc|mpsc|mpmc --burst N --impl iocore|ck
 *
 * single: one thread pushes `burst` pointers then pops them, repeatedly
 *   (the instruction cost of the regime's code path, no contention).
 * threaded: one producer thread and one consumer thread stream elements
 *   through a 1024-slot ring (cache-line traffic between two cores).
 * ck_ring has no burst calls: its rows loop over single calls, which is what
 * a ck user writes.  Each row is the best of TRIALS runs (shared machine).
 * Prints one JSON row (bench/README.md).
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/bench.h"
#include "iocore/ring.h"

#ifdef IOC_HAVE_CK
#include <ck_ring.h>
#endif

enum regime { SPSC, MPSC, MPMC };

#define RING_SIZE 1024
#define MAX_BURST 256
#define TRIALS 5

static enum regime regime;
static unsigned burst = 1;
static bool use_ck;
static uint64_t total;

static struct ioc_ring *ring;
#ifdef IOC_HAVE_CK
static ck_ring_t ckr IOC_CACHE_ALIGNED;
static ck_ring_buffer_t ckbuf[RING_SIZE] IOC_CACHE_ALIGNED;
#endif

/* ---- one push / pop of up to n, per impl and regime ---- */

static inline unsigned do_push(void **objs, unsigned n)
{
	if (!use_ck) {
		if (n == 1) {
			switch (regime) {
			case SPSC: return ioc_ring_push_spsc(ring, objs[0]);
			case MPSC: return ioc_ring_push_mpsc(ring, objs[0]);
			case MPMC: return ioc_ring_push_mpmc(ring, objs[0]);
			}
		}
		switch (regime) {
		case SPSC: return ioc_ring_push_burst_spsc(ring, objs, n);
		case MPSC: return ioc_ring_push_burst_mpsc(ring, objs, n);
		case MPMC: return ioc_ring_push_burst_mpmc(ring, objs, n);
		}
		return 0;
	}
#ifdef IOC_HAVE_CK
	unsigned i = 0;

	for (; i < n; i++) {
		bool ok = false;

		switch (regime) {
		case SPSC: ok = ck_ring_enqueue_spsc(&ckr, ckbuf, objs[i]); break;
		case MPSC: ok = ck_ring_enqueue_mpsc(&ckr, ckbuf, objs[i]); break;
		case MPMC: ok = ck_ring_enqueue_mpmc(&ckr, ckbuf, objs[i]); break;
		}
		if (!ok)
			break;
	}
	return i;
#else
	return 0;
#endif
}

static inline unsigned do_pop(void **objs, unsigned n)
{
	if (!use_ck) {
		if (n == 1) {
			switch (regime) {
			case SPSC: return ioc_ring_pop_spsc(ring, objs);
			case MPSC: return ioc_ring_pop_mpsc(ring, objs);
			case MPMC: return ioc_ring_pop_mpmc(ring, objs);
			}
		}
		switch (regime) {
		case SPSC: return ioc_ring_pop_burst_spsc(ring, objs, n);
		case MPSC: return ioc_ring_pop_burst_mpsc(ring, objs, n);
		case MPMC: return ioc_ring_pop_burst_mpmc(ring, objs, n);
		}
		return 0;
	}
#ifdef IOC_HAVE_CK
	unsigned i = 0;

	for (; i < n; i++) {
		bool ok = false;

		switch (regime) {
		case SPSC: ok = ck_ring_dequeue_spsc(&ckr, ckbuf, &objs[i]); break;
		case MPSC: ok = ck_ring_dequeue_mpsc(&ckr, ckbuf, &objs[i]); break;
		case MPMC: ok = ck_ring_dequeue_mpmc(&ckr, ckbuf, &objs[i]); break;
		}
		if (!ok)
			break;
	}
	return i;
#else
	return 0;
#endif
}

static double run_single(void)
{
	void *in[MAX_BURST], *out[MAX_BURST];
	uint64_t sum = 0, t0, rounds = total / burst;

	for (unsigned i = 0; i < burst; i++)
		in[i] = (void *)(uintptr_t)(i + 1);
	t0 = ioc_bench_now_ns();
	for (uint64_t r = 0; r < rounds; r++) {
		unsigned n = do_push(in, burst);
		unsigned m = do_pop(out, burst);

		if (n != burst || m != burst)
			abort();
		sum += (uintptr_t)out[0];
	}
	t0 = ioc_bench_now_ns() - t0;
	if (sum != rounds)
		abort();
	return (double)t0 / (double)(rounds * burst);
}

static void *producer(void *arg)
{
	void *in[MAX_BURST];
	uint64_t sent = 0;

	(void)arg;
	while (sent < total) {
		unsigned n = burst, k;

		if (total - sent < n)
			n = (unsigned)(total - sent);
		for (unsigned i = 0; i < n; i++)
			in[i] = (void *)(uintptr_t)(sent + i + 1);
		for (unsigned done = 0; done < n; done += k) {
			k = do_push(in + done, n - done);
			if (!k)
				ioc_ring_relax();
		}
		sent += n;
	}
	return NULL;
}

static double run_threaded(void)
{
	pthread_t t;
	void *out[MAX_BURST];
	uint64_t got = 0, expect = 1, t0;

	t0 = ioc_bench_now_ns();
	if (pthread_create(&t, NULL, producer, NULL))
		abort();
	while (got < total) {
		unsigned n = do_pop(out, burst);

		if (!n) {
			ioc_ring_relax();
			continue;
		}
		for (unsigned i = 0; i < n; i++)
			if ((uintptr_t)out[i] != expect++)
				abort();
		got += n;
	}
	pthread_join(t, NULL);
	t0 = ioc_bench_now_ns() - t0;
	return (double)t0 / (double)total;
}

int main(int argc, char **argv)
{
	const char *cas = "single", *reg = "spsc", *impl = "iocore";
	char params[128], cmd[512];
	double ns;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--case"))
			cas = argv[i + 1];
		else if (!strcmp(argv[i], "--regime"))
			reg = argv[i + 1];
		else if (!strcmp(argv[i], "--burst"))
			burst = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--impl"))
			impl = argv[i + 1];
		else if (!strcmp(argv[i], "--total"))
			total = strtoull(argv[i + 1], NULL, 0);
	}
	regime = !strcmp(reg, "mpsc") ? MPSC : !strcmp(reg, "mpmc") ? MPMC : SPSC;
	use_ck = !strcmp(impl, "ck");
	if (burst < 1 || burst > MAX_BURST)
		burst = 1;
	if (!total)
		total = !strcmp(cas, "single") ? 20000000 : 10000000;
	snprintf(params, sizeof(params), "regime=%s,burst=%u", reg, burst);
	ioc_bench_cmdline(argc, argv, cmd, sizeof(cmd));

	struct ioc_bench_row row = {
		.suite = "ring", .case_name = cas, .params = params,
		.impl = use_ck ? "ck_ring" : "iocore", .peer = use_ck,
		.metric = "ns/element", .lower_is_better = true, .cmd = cmd,
	};
#ifndef IOC_HAVE_CK
	if (use_ck) {
		row.error = "built without libck (ck_ring.h)";
		ioc_bench_row(stdout, &row);
		return 0;
	}
#else
	ck_ring_init(&ckr, RING_SIZE);
#endif
	if (ioc_ring_new(&ring, RING_SIZE))
		return 1;
	/* Best of several trials: the machine is shared, and the minimum is
	 * the least disturbed measurement of the same code. */
	total /= TRIALS;
	ns = 1e30;
	for (int t = 0; t < TRIALS; t++) {
		double v = !strcmp(cas, "threaded") ? run_threaded() : run_single();

		if (v < ns)
			ns = v;
	}
	row.value = ns;
	row.value_ok = true;
	ioc_bench_row(stdout, &row);
	ioc_ring_free(ring);
	return 0;
}
