/*
 * Every ring regime under several producers and consumers: each element is
 * delivered exactly once, and every consumer sees each producer's elements
 * in increasing order.  Pointer and element rings, single and burst calls.
 * Bounded by count and by a deadline (never asserts on timing).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "iocore/ring.h"
#include "tap.h"

enum regime { SPSC, MPSC, MPMC };

struct elem {
	uint32_t p, seq;
	uint64_t check;
};

struct cfg {
	enum regime regime;
	bool elem, burst;
	unsigned producers, consumers;
};

#define MAX_THREADS 4
#define BURST 8

struct run {
	struct cfg cfg;
	struct ioc_ring *r;
	uint32_t per_producer;
	int64_t deadline;
	_Atomic uint8_t *seen;          /* [producer][seq] delivery counts */
	_Atomic uint64_t produced;      /* total, added by each producer at its end */
	_Atomic unsigned producers_done;
	_Atomic uint64_t consumed;
	_Atomic unsigned order_errors, check_errors;
};

struct worker {
	struct run *run;
	unsigned id;
	pthread_t tid;
};

static uint64_t check_of(uint32_t p, uint32_t seq)
{
	return ((uint64_t)p * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)seq * 0xff51afd7ed558ccdull);
}

static void backoff(unsigned *spins)
{
	if (++*spins % 64 == 0)
		sched_yield();
	else
		ioc_ring_relax();
}

static unsigned push_some(struct run *run, const void *items, unsigned n)
{
	struct ioc_ring *r = run->r;
	const struct cfg *c = &run->cfg;

	if (c->elem) {
		if (!c->burst)
			n = 1;
		switch (c->regime) {
		case SPSC: return ioc_ring_push_elem_burst_spsc(r, items, n);
		case MPSC: return c->burst ? ioc_ring_push_elem_burst_mpsc(r, items, n)
					   : ioc_ring_push_elem_mpsc(r, items);
		case MPMC: return c->burst ? ioc_ring_push_elem_burst_mpmc(r, items, n)
					   : ioc_ring_push_elem_mpmc(r, items);
		}
	} else {
		void *const *ptrs = items;

		if (!c->burst) {
			switch (c->regime) {
			case SPSC: return ioc_ring_push_spsc(r, ptrs[0]);
			case MPSC: return ioc_ring_push_mpsc(r, ptrs[0]);
			case MPMC: return ioc_ring_push_mpmc(r, ptrs[0]);
			}
		}
		switch (c->regime) {
		case SPSC: return ioc_ring_push_burst_spsc(r, ptrs, n);
		case MPSC: return ioc_ring_push_burst_mpsc(r, ptrs, n);
		case MPMC: return ioc_ring_push_burst_mpmc(r, ptrs, n);
		}
	}
	return 0;
}

static unsigned pop_some(struct run *run, struct elem *out)
{
	struct ioc_ring *r = run->r;
	const struct cfg *c = &run->cfg;
	void *ptrs[BURST];
	unsigned n;

	if (c->elem) {
		switch (c->regime) {
		case SPSC: return c->burst ? ioc_ring_pop_elem_burst_spsc(r, out, BURST)
					   : ioc_ring_pop_elem_spsc(r, out);
		case MPSC: return c->burst ? ioc_ring_pop_elem_burst_mpsc(r, out, BURST)
					   : ioc_ring_pop_elem_mpsc(r, out);
		case MPMC: return c->burst ? ioc_ring_pop_elem_burst_mpmc(r, out, BURST)
					   : ioc_ring_pop_elem_mpmc(r, out);
		}
		return 0;
	}
	if (c->burst) {
		switch (c->regime) {
		case SPSC: n = ioc_ring_pop_burst_spsc(r, ptrs, BURST); break;
		case MPSC: n = ioc_ring_pop_burst_mpsc(r, ptrs, BURST); break;
		default:   n = ioc_ring_pop_burst_mpmc(r, ptrs, BURST); break;
		}
	} else {
		switch (c->regime) {
		case SPSC: n = ioc_ring_pop_spsc(r, ptrs); break;
		case MPSC: n = ioc_ring_pop_mpsc(r, ptrs); break;
		default:   n = ioc_ring_pop_mpmc(r, ptrs); break;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		uintptr_t v = (uintptr_t)ptrs[i] - 1;

		out[i].p = (uint32_t)(v >> 24);
		out[i].seq = (uint32_t)(v & 0xffffff);
		out[i].check = check_of(out[i].p, out[i].seq);
	}
	return n;
}

static void *producer(void *arg)
{
	struct worker *w = arg;
	struct run *run = w->run;
	uint32_t seq = 0;
	unsigned spins = 0;

	while (seq < run->per_producer) {
		struct elem items[BURST];
		void *ptrs[BURST];
		unsigned n = run->per_producer - seq, done = 0;

		/* The deadline only after a first round: a producer that
		 * starts late (a loaded machine, an emulator) still proves
		 * something, and the run can never end with nothing moved. */
		if (seq && (seq & 1023) == 0 && ioc_now_ns() > run->deadline)
			break;
		if (n > BURST)
			n = BURST;
		for (unsigned i = 0; i < n; i++) {
			items[i] = (struct elem){ w->id, seq + i, check_of(w->id, seq + i) };
			ptrs[i] = (void *)(((uintptr_t)w->id << 24 | (seq + i)) + 1);
		}
		while (done < n) {
			unsigned k = run->cfg.elem ? push_some(run, items + done, n - done)
						   : push_some(run, ptrs + done, n - done);
			if (k == 0)
				backoff(&spins);
			done += k;
		}
		seq += n;
	}
	/* Release: pairs with the consumers' acquire loads, so the totals
	 * they compare are final once producers_done reaches the count. */
	atomic_fetch_add_explicit(&run->produced, seq, memory_order_relaxed);
	atomic_fetch_add_explicit(&run->producers_done, 1, memory_order_release);
	return NULL;
}

static void *consumer(void *arg)
{
	struct worker *w = arg;
	struct run *run = w->run;
	int64_t last[MAX_THREADS];
	unsigned spins = 0;

	for (unsigned p = 0; p < MAX_THREADS; p++)
		last[p] = -1;
	for (;;) {
		struct elem out[BURST];
		unsigned n = pop_some(run, out);

		if (n == 0) {
			/* Acquire pairs with the producers' release increment. */
			if (atomic_load_explicit(&run->producers_done, memory_order_acquire) ==
				    run->cfg.producers &&
			    atomic_load_explicit(&run->consumed, memory_order_relaxed) ==
				    atomic_load_explicit(&run->produced, memory_order_relaxed))
				break;
			backoff(&spins);
			continue;
		}
		for (unsigned i = 0; i < n; i++) {
			struct elem *e = &out[i];

			if (e->p >= run->cfg.producers || e->seq >= run->per_producer ||
			    e->check != check_of(e->p, e->seq)) {
				atomic_fetch_add(&run->check_errors, 1);
				continue;
			}
			if ((int64_t)e->seq <= last[e->p])
				atomic_fetch_add(&run->order_errors, 1);
			last[e->p] = e->seq;
			atomic_fetch_add_explicit(&run->seen[(size_t)e->p * run->per_producer + e->seq],
						  1, memory_order_relaxed);
		}
		atomic_fetch_add_explicit(&run->consumed, n, memory_order_relaxed);
	}
	return NULL;
}

static void run_cfg(struct cfg cfg)
{
	struct run run = { .cfg = cfg };
	struct worker prod[MAX_THREADS], cons[MAX_THREADS];
	uint64_t total = 0;

	run.per_producer = (uint32_t)ioc_test_scaled(300000);
	if (run.per_producer > 0xffffff)
		run.per_producer = 0xffffff;
	run.deadline = ioc_now_ns() + (int64_t)ioc_test_scaled(700) * 1000000;
	run.seen = calloc((size_t)cfg.producers * run.per_producer, 1);
	ASSERT_NOT_NULL(run.seen);
	if (cfg.elem)
		ASSERT_OK(ioc_ring_new_elem(&run.r, 64, sizeof(struct elem)));
	else
		ASSERT_OK(ioc_ring_new(&run.r, 64));

	for (unsigned i = 0; i < cfg.consumers; i++) {
		cons[i] = (struct worker){ .run = &run, .id = i };
		ASSERT_EQ(pthread_create(&cons[i].tid, NULL, consumer, &cons[i]), 0);
	}
	for (unsigned i = 0; i < cfg.producers; i++) {
		prod[i] = (struct worker){ .run = &run, .id = i };
		ASSERT_EQ(pthread_create(&prod[i].tid, NULL, producer, &prod[i]), 0);
	}
	for (unsigned i = 0; i < cfg.producers; i++)
		pthread_join(prod[i].tid, NULL);
	for (unsigned i = 0; i < cfg.consumers; i++)
		pthread_join(cons[i].tid, NULL);

	ASSERT_EQ(atomic_load(&run.check_errors), 0);
	ASSERT_EQ(atomic_load(&run.order_errors), 0);
	ASSERT_UEQ(atomic_load(&run.consumed), atomic_load(&run.produced));
	ASSERT_TRUE(ioc_ring_empty(run.r));
	/* Exactly once: each producer's prefix delivered once, the rest never. */
	for (unsigned p = 0; p < cfg.producers; p++) {
		uint32_t seq = 0;

		while (seq < run.per_producer &&
		       atomic_load(&run.seen[(size_t)p * run.per_producer + seq]) == 1)
			seq++;
		total += seq;
		for (uint32_t s = seq; s < run.per_producer; s++)
			ASSERT_EQ(atomic_load(&run.seen[(size_t)p * run.per_producer + s]), 0);
	}
	ASSERT_UEQ(total, atomic_load(&run.produced));
	ASSERT_UGT(total, 0);
	ioc_test_diag("regime %d elem %d burst %d: %" PRIu64 " elements",
		      cfg.regime, cfg.elem, cfg.burst, total);
	ioc_ring_free(run.r);
	free(run.seen);
}

static void test_spsc(void)
{
	for (int k = 0; k < 4; k++)
		run_cfg((struct cfg){ SPSC, k & 1, k >> 1, 1, 1 });
}

static void test_mpsc(void)
{
	for (int k = 0; k < 4; k++)
		run_cfg((struct cfg){ MPSC, k & 1, k >> 1, 3, 1 });
}

static void test_mpmc(void)
{
	for (int k = 0; k < 4; k++)
		run_cfg((struct cfg){ MPMC, k & 1, k >> 1, 3, 3 });
}

IOC_TEST_MAIN(
	IOC_TEST(test_spsc),
	IOC_TEST(test_mpsc),
	IOC_TEST(test_mpmc),
)
