/*
 * Ring push+pop cost per element, per regime, iocore vs concurrencykit's
 * ck_ring in the same binary.
 *
 *   bench-ring --case single   --regime spsc|mpsc|mpmc --burst N --impl iocore|ck
 *   bench-ring --case threaded --regime spsc|mpsc|mpmc --burst N --impl iocore|ck
 *
 * single: one thread pushes `burst` pointers then pops them, repeatedly
 *   (the instruction cost of the regime's code path, no contention); timed
 *   with the thread's CPU clock, so time slices lost to other load on the
 *   shared machine do not count.
 * threaded: one producer thread and one consumer thread stream elements
 *   through a 1024-slot ring (cache-line traffic between two cores); two
 *   rows: wall-clock ns/element and process CPU ns/element.
 * ck_ring has no burst calls: its rows loop over single calls, which is what
 * a ck user writes.  Each row is the best of TRIALS runs (shared machine).
 * Prints one JSON row (bench/README.md).
 */
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
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

static enum regime regime_opt;
static unsigned burst = 1;
static bool use_ck;
static uint64_t total;

/* Both rings live in static storage, so neither pays a pointer load the
 * other does not (ck's ring is a global object too). */
static unsigned char ring_mem[sizeof(struct ioc_ring) + RING_SIZE * sizeof(void *)]
	IOC_CACHE_ALIGNED;
#define ring ((struct ioc_ring *)ring_mem)
#ifdef IOC_HAVE_CK
static ck_ring_t ckr IOC_CACHE_ALIGNED;
static ck_ring_buffer_t ckbuf[RING_SIZE] IOC_CACHE_ALIGNED;
#endif

/* ---- one push / pop of up to n, per impl and regime ---- */

static inline __attribute__((always_inline)) unsigned
push_x(bool ck, enum regime regime, void **objs, unsigned n)
{
	if (!ck) {
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

static inline __attribute__((always_inline)) unsigned
pop_x(bool ck, enum regime regime, void **objs, unsigned n)
{
	if (!ck) {
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

/* Process CPU time (both threads) of the last threaded run, per element. */
static double last_cpu_ns;

static uint64_t process_cpu_ns(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u;
}

/* Full or empty: the other thread may be descheduled (2 shared cores), so
 * spin briefly, then give it the CPU.  Same for both impls. */
static void backoff(unsigned *spins)
{
	if (++*spins % 64 == 0)
		sched_yield();
	else
		ioc_ring_relax();
}

/*
 * The timed loops are stamped out once per (impl, regime) with constant
 * arguments, so each is a straight inlined loop with no dispatch inside:
 * the comparison is between ring code, not between switch statements.
 */
#define DEFINE_LOOPS(NAME, CK, RG)                                               \
static double single_##NAME(void)                                                \
{                                                                                \
	void *in[MAX_BURST], *out[MAX_BURST];                                    \
	uint64_t sum = 0, t0, rounds = total / burst;                            \
	unsigned b = burst;                                                      \
                                                                                 \
	for (unsigned i = 0; i < b; i++)                                         \
		in[i] = (void *)(uintptr_t)(i + 1);                              \
	t0 = ioc_bench_thread_cpu_ns();                                          \
	for (uint64_t r = 0; r < rounds; r++) {                                  \
		unsigned n = push_x(CK, RG, in, b);                              \
		unsigned m = pop_x(CK, RG, out, b);                              \
                                                                                 \
		if (n != b || m != b)                                            \
			abort();                                                 \
		sum += (uintptr_t)out[0];                                        \
	}                                                                        \
	t0 = ioc_bench_thread_cpu_ns() - t0;                                     \
	if (sum != rounds)                                                       \
		abort();                                                         \
	last_cpu_ns = (double)t0 / (double)(rounds * b);                         \
	return (double)t0 / (double)(rounds * b);                                \
}                                                                                \
                                                                                 \
static void *producer_##NAME(void *arg)                                          \
{                                                                                \
	void *in[MAX_BURST];                                                     \
	uint64_t sent = 0;                                                       \
                                                                                 \
	(void)arg;                                                               \
	while (sent < total) {                                                   \
		unsigned n = burst, k;                                           \
                                                                                 \
		if (total - sent < n)                                            \
			n = (unsigned)(total - sent);                            \
		for (unsigned i = 0; i < n; i++)                                 \
			in[i] = (void *)(uintptr_t)(sent + i + 1);               \
		for (unsigned done = 0, spins = 0; done < n; done += k) {        \
			k = push_x(CK, RG, in + done, n - done);                 \
			if (!k)                                                  \
				backoff(&spins);                                 \
		}                                                                \
		sent += n;                                                       \
	}                                                                        \
	return NULL;                                                             \
}                                                                                \
                                                                                 \
static double threaded_##NAME(void)                                              \
{                                                                                \
	pthread_t t;                                                             \
	void *out[MAX_BURST];                                                    \
	uint64_t got = 0, expect = 1, t0, c0 = process_cpu_ns();                 \
	unsigned spins = 0;                                                      \
                                                                                 \
	t0 = ioc_bench_now_ns();                                                 \
	if (pthread_create(&t, NULL, producer_##NAME, NULL))                     \
		abort();                                                         \
	while (got < total) {                                                    \
		unsigned n = pop_x(CK, RG, out, burst);                          \
                                                                                 \
		if (!n) {                                                        \
			backoff(&spins);                                         \
			continue;                                                \
		}                                                                \
		for (unsigned i = 0; i < n; i++)                                 \
			if ((uintptr_t)out[i] != expect++)                       \
				abort();                                         \
		got += n;                                                        \
	}                                                                        \
	pthread_join(t, NULL);                                                   \
	t0 = ioc_bench_now_ns() - t0;                                            \
	last_cpu_ns = (double)(process_cpu_ns() - c0) / (double)total;           \
	return (double)t0 / (double)total;                                       \
}

DEFINE_LOOPS(iocore_spsc, false, SPSC)
DEFINE_LOOPS(iocore_mpsc, false, MPSC)
DEFINE_LOOPS(iocore_mpmc, false, MPMC)
DEFINE_LOOPS(ck_spsc, true, SPSC)
DEFINE_LOOPS(ck_mpsc, true, MPSC)
DEFINE_LOOPS(ck_mpmc, true, MPMC)

static double run_once(bool threaded)
{
	static double (*const fns[2][2][3])(void) = {
		{ { single_iocore_spsc, single_iocore_mpsc, single_iocore_mpmc },
		  { single_ck_spsc, single_ck_mpsc, single_ck_mpmc } },
		{ { threaded_iocore_spsc, threaded_iocore_mpsc, threaded_iocore_mpmc },
		  { threaded_ck_spsc, threaded_ck_mpsc, threaded_ck_mpmc } },
	};

	return fns[threaded][use_ck][regime_opt]();
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
	regime_opt = !strcmp(reg, "mpsc") ? MPSC : !strcmp(reg, "mpmc") ? MPMC : SPSC;
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
	if (ioc_ring_init(ring, RING_SIZE, sizeof(void *)))
		return 1;
	/* Best of several trials: the machine is shared, and the minimum is
	 * the least disturbed measurement of the same code. */
	total /= TRIALS;
	ns = 1e30;
	double cpu = 1e30;
	for (int t = 0; t < TRIALS; t++) {
		double v = run_once(!strcmp(cas, "threaded"));

		if (v < ns)
			ns = v;
		if (last_cpu_ns < cpu)
			cpu = last_cpu_ns;
	}
	row.value = ns;
	row.value_ok = true;
	ioc_bench_row(stdout, &row);
	if (!strcmp(cas, "threaded")) {
		/* CPU time of both threads per element: robust against time
		 * slices lost to other load, which the wall clock is not. */
		row.metric = "cpu-ns/element";
		row.value = cpu;
		ioc_bench_row(stdout, &row);
	}
	return 0;
}
