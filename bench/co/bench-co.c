/*
 * bench-co: coroutine benchmarks, ours and the peers in one binary.
 *
 *   bench-co --case CASE [--iters N] [--impl IMPL]
 *
 * Cases (QEMU's tests/unit/test-coroutine.c perf cases keep their names
 * and default iteration counts):
 *   lifecycle  create + enter + terminate, 1M times             ns/coroutine
 *   nesting    10000 cycles of nesting 1000 deep               ns/coroutine
 *   yield      enter + yield round trips, 100M                 ns/round trip
 *   cost       create + enter + yield + re-enter + terminate, 40M  ns/op
 *   switch     one context switch, ping-pong between two stacks, all three
 *              interleaved: iocore (our assembly switch), Boost.Context
 *              jump_fcontext, glibc swapcontext                 ns/switch
 *   request    one coroutine per request, 64 in flight, each awaiting a
 *              completion posted through the loop (no I/O)     requests/s
 *              --impl iocore, or callbacks (the same chain without
 *              coroutines: the floor a coroutine adds to)
 * Prints one JSON row (bench/README.md) on stdout.
 */
#include "iocore/co.h"
#include "common/bench.h"
#include "co-switch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

static const char *cmd;

static void row(const char *case_name, const char *params, const char *impl,
		bool peer, const char *metric, double v, bool lower,
		const char *error)
{
	struct ioc_bench_row r = {
		.suite = "co", .case_name = case_name, .params = params,
		.impl = impl, .peer = peer, .metric = metric, .value = v,
		.value_ok = !error, .lower_is_better = lower, .cmd = cmd,
		.error = error,
	};

	ioc_bench_row(stdout, &r);
}

/*
 * Timing.  Every case runs its iterations in batches and reports the
 * fastest batch, timed with the thread's CPU clock: this machine has 2
 * cores shared with other work, so wall time measured how often we were
 * scheduled (a 14 ns round trip read as 60 ns at load 7), and the minimum
 * over short batches is the stable estimate of what the code costs.  Every
 * implementation, ours and the peers, is measured the same way.
 */
static double best_ns = 1e30;
static uint64_t batch_t0;

static void batch_start(void)
{
	batch_t0 = ioc_bench_thread_cpu_ns();
}

static void batch_end(double ops)
{
	double ns = (double)(ioc_bench_thread_cpu_ns() - batch_t0) / ops;

	if (ns < best_ns)
		best_ns = ns;
}

static const char *params(const char *fmt, unsigned long n)
{
	static char buf[64];

	snprintf(buf, sizeof(buf), fmt, n);
	return buf;
}

/* ---- QEMU's perf cases ------------------------------------------------- */

static void ioc_coroutine_fn empty_fn(void *opaque)
{
}

enum { OPS_PER_BATCH = 100000 };

static void perf_lifecycle(unsigned long n)
{
	for (unsigned long done = 0; done < n; done += OPS_PER_BATCH) {
		batch_start();
		for (unsigned long i = 0; i < OPS_PER_BATCH; i++)
			ioc_co_enter(ioc_co_create(empty_fn, NULL));
		batch_end(OPS_PER_BATCH);
	}
	row("lifecycle", params("iters=%lu", n), "iocore", false, "ns/coroutine",
	    best_ns, true, NULL);
}

struct nest {
	unsigned n_enter, max;
};

static void ioc_coroutine_fn nest_fn(void *opaque)
{
	struct nest *nd = opaque;

	nd->n_enter++;
	if (nd->n_enter < nd->max)
		ioc_co_enter(ioc_co_create(nest_fn, nd));
}

static void perf_nesting(unsigned long cycles)
{
	const unsigned depth = 1000;

	for (unsigned long done = 0; done < cycles; done += 10) {
		batch_start();
		for (unsigned long i = 0; i < 10; i++) {
			struct nest nd = { .max = depth };

			ioc_co_enter(ioc_co_create(nest_fn, &nd));
		}
		batch_end(10.0 * depth);
	}
	row("nesting", params("cycles=%lu,depth=1000", cycles), "iocore", false,
	    "ns/coroutine", best_ns, true, NULL);
}

static void ioc_coroutine_fn yield_loop(void *opaque)
{
	unsigned long *counter = opaque;

	while (*counter > 0) {
		(*counter)--;
		ioc_co_yield();
	}
}

static void perf_yield(unsigned long n)
{
	unsigned long counter = n;
	struct ioc_co *co = ioc_co_create(yield_loop, &counter);

	while (counter > 0) {
		batch_start();
		for (int i = 0; i < OPS_PER_BATCH && counter > 0; i++)
			ioc_co_enter(co);
		batch_end(OPS_PER_BATCH);
	}
	ioc_co_enter(co);	/* let it return */
	row("yield", params("iters=%lu", n), "iocore", false, "ns/round-trip",
	    best_ns, true, NULL);
}

static void ioc_coroutine_fn cost_fn(void *opaque)
{
	ioc_co_yield();
}

static void perf_cost(unsigned long n)
{
	for (unsigned long done = 0; done < n; done += OPS_PER_BATCH) {
		batch_start();
		for (unsigned long i = 0; i < OPS_PER_BATCH; i++) {
			struct ioc_co *co = ioc_co_create(cost_fn, NULL);

			ioc_co_enter(co);
			ioc_co_enter(co);
		}
		batch_end(OPS_PER_BATCH);
	}
	row("cost", params("iters=%lu", n), "iocore", false, "ns/op", best_ns,
	    true, NULL);
}

/* ---- raw switch: ours, Boost.Context, swapcontext ---------------------- */

#define SWITCH_PARAMS "pingpong=raw"
enum { RAW_STACK = 64 << 10 };

static void *raw_stack(void)
{
	void *p = mmap(NULL, RAW_STACK, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	return p;
}

/*
 * The three switches are measured interleaved in one process -- a batch of
 * ours, a batch of jump_fcontext, now and then a batch of swapcontext --
 * each keeping its own fastest batch: the CPU's clock moves with the load
 * of the other core (the same binary read 3.8 and 5.1 ns a minute apart),
 * and interleaving gives every implementation the same clock.
 */
static struct ioc__co_ctx main_ctx, other_ctx;

static void raw_entry(void *arg)
{
	for (;;)
		ioc__co_ctx_switch(&other_ctx, &main_ctx, arg);
}

#ifdef HAVE_BOOST_CONTEXT
/* Boost.Context's C-linkage entry points (boost/context/detail/fcontext.hpp). */
typedef void *fcontext_t;
typedef struct {
	fcontext_t fctx;
	void *data;
} transfer_t;
transfer_t jump_fcontext(fcontext_t const to, void *vp);
fcontext_t make_fcontext(void *sp, size_t size, void (*fn)(transfer_t));

static void fctx_entry(transfer_t t)
{
	for (;;)
		t = jump_fcontext(t.fctx, t.data);
}
#endif

static ucontext_t uc_main, uc_other;

static void uc_entry(void)
{
	for (;;)
		swapcontext(&uc_other, &uc_main);
}

static double time_batch(int which, unsigned long ops)
{
#ifdef HAVE_BOOST_CONTEXT
	static transfer_t t;
#endif
	uint64_t t0 = ioc_bench_thread_cpu_ns();

	switch (which) {
	case 0:
		for (unsigned long i = 0; i < ops; i++)
			ioc__co_ctx_switch(&main_ctx, &other_ctx, NULL);
		break;
#ifdef HAVE_BOOST_CONTEXT
	case 1:
		for (unsigned long i = 0; i < ops; i++)
			t = jump_fcontext(t.fctx, NULL);
		break;
	case 3: {	/* first entry */
		char *stack = raw_stack();
		fcontext_t f = make_fcontext(stack + RAW_STACK, RAW_STACK, fctx_entry);

		t = jump_fcontext(f, NULL);
		break;
	}
#endif
	case 2:
		for (unsigned long i = 0; i < ops; i++)
			swapcontext(&uc_main, &uc_other);
		break;
	}
	return (double)(ioc_bench_thread_cpu_ns() - t0) / (2.0 * (double)ops);
}

static void perf_switch(unsigned long n)
{
	double best[3] = { 1e30, 1e30, 1e30 };
	const char *impl[3] = { "iocore", "boost-fcontext", "swapcontext" };
	bool have_fctx = false;

	ioc__co_ctx_make(&other_ctx, raw_stack(), RAW_STACK, raw_entry);
	ioc__co_ctx_switch(&main_ctx, &other_ctx, NULL);
#ifdef HAVE_BOOST_CONTEXT
	time_batch(3, 0);
	have_fctx = true;
#endif
	getcontext(&uc_other);
	uc_other.uc_stack.ss_sp = raw_stack();
	uc_other.uc_stack.ss_size = RAW_STACK;
	makecontext(&uc_other, uc_entry, 0);
	swapcontext(&uc_main, &uc_other);

	for (unsigned long done = 0, round = 0; done < n; done += OPS_PER_BATCH, round++) {
		for (int w = 0; w < 2; w++) {
			double ns;

			if (w == 1 && !have_fctx)
				continue;
			ns = time_batch(w, OPS_PER_BATCH);
			if (ns < best[w])
				best[w] = ns;
		}
		if (round % 16 == 0) {	/* ~40x slower: fewer, smaller batches */
			double ns = time_batch(2, OPS_PER_BATCH / 10);

			if (ns < best[2])
				best[2] = ns;
		}
	}
	for (int w = 0; w < 3; w++) {
		if (w == 1 && !have_fctx)
			row("switch", SWITCH_PARAMS, impl[w], true, "ns/switch", 0,
			    true, "built without libboost_context");
		else
			row("switch", SWITCH_PARAMS, impl[w], w != 0, "ns/switch",
			    best[w], true, NULL);
	}
}

/* ---- request-shaped: 64 in flight through the loop --------------------- */

enum { DEPTH = 64 };

struct fake_op {
	struct ioc_task task;	/* the "completion", posted to the loop */
	struct ioc_co_await *aw;
	void (*cb)(struct fake_op *op);
};

static struct ioc_loop *loop;
static unsigned long req_started, req_done, req_total;

static void op_complete(struct ioc_task *t)
{
	struct fake_op *op = ioc_container_of(t, struct fake_op, task);

	if (op->aw)
		ioc_co_await_done(op->aw, 0);
	else
		op->cb(op);
}

static void submit_fake(struct fake_op *op)
{
	op->task.fn = op_complete;
	ioc_loop_post(loop, &op->task);
}

static void start_request(void);

static void ioc_coroutine_fn request_fn(void *opaque)
{
	struct ioc_co_await aw;
	struct fake_op op = { 0 };

	ioc_co_await_init(&aw);
	op.aw = &aw;
	submit_fake(&op);
	ioc_co_await(&aw);
	req_done++;
	if (req_started < req_total)
		start_request();
}

static void start_request(void)
{
	req_started++;
	ioc_co_enter(ioc_co_create(request_fn, NULL));
}

/* The same chain as plain callbacks: the floor. */
static struct fake_op cb_ops[DEPTH];

static void cb_done(struct fake_op *op)
{
	req_done++;
	if (req_started < req_total) {
		req_started++;
		submit_fake(op);
	}
}

static void perf_request(unsigned long n, bool coroutines)
{
	uint64_t t0, c0;

	if (!loop && ioc_loop_new(&loop, NULL) < 0) {
		row("request", "inflight=64,io=none", coroutines ? "iocore" : "iocore-callbacks",
		    false, "requests/s", 0, false, "ioc_loop_new failed");
		return;
	}
	req_started = req_done = 0;
	req_total = n;
	t0 = ioc_bench_now_ns();
	c0 = ioc_bench_thread_cpu_ns();
	for (int i = 0; i < DEPTH; i++) {
		if (coroutines) {
			start_request();
		} else {
			cb_ops[i].cb = cb_done;
			req_started++;
			submit_fake(&cb_ops[i]);
		}
	}
	while (req_done < req_total)
		ioc_loop_poll(loop, true);
	/* Single-threaded and never idle: CPU time is the cost (see above). */
	fprintf(stderr, "request: wall %.1f ms, cpu %.1f ms\n",
		(double)(ioc_bench_now_ns() - t0) / 1e6,
		(double)(ioc_bench_thread_cpu_ns() - c0) / 1e6);
	row("request", "inflight=64,io=none",
	    coroutines ? "iocore" : "iocore-callbacks", false, "requests/s",
	    (double)n * 1e9 / (double)(ioc_bench_thread_cpu_ns() - c0), false, NULL);
}

int main(int argc, char **argv)
{
	static char cmdbuf[512];
	const char *which = NULL, *impl = "iocore";
	unsigned long iters = 0;

	cmd = ioc_bench_cmdline(argc, argv, cmdbuf, sizeof(cmdbuf));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--case") && i + 1 < argc)
			which = argv[++i];
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--impl") && i + 1 < argc)
			impl = argv[++i];
		else {
			fprintf(stderr, "usage: %s --case CASE [--iters N] [--impl IMPL]\n",
				argv[0]);
			return 2;
		}
	}
	if (!which) {
		fprintf(stderr, "--case required\n");
		return 2;
	}
#define N(def) (iters ? iters : (unsigned long)(def))
	if (!strcmp(which, "lifecycle")) {
		perf_lifecycle(N(1000000));
	} else if (!strcmp(which, "nesting")) {
		perf_nesting(N(10000));
	} else if (!strcmp(which, "yield")) {
		perf_yield(N(100000000));
	} else if (!strcmp(which, "cost")) {
		perf_cost(N(40000000));
	} else if (!strcmp(which, "switch")) {
		perf_switch(N(50000000));	/* all three, interleaved */
	} else if (!strcmp(which, "request")) {
		perf_request(N(4000000), strcmp(impl, "callbacks") != 0);
	} else {
		fprintf(stderr, "unknown case %s\n", which);
		return 2;
	}
	return 0;
}
