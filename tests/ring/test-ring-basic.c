/* Single-threaded ring semantics: capacity, full/empty, bursts, wrap. */
#include <errno.h>
#include <stdint.h>

#include "iocore/ring.h"
#include "tap.h"

static void test_geometry(void)
{
	struct ioc_ring *r = (void *)1;

	ASSERT_EQ(ioc_ring_new(&r, 0), -EINVAL);
	ASSERT_NULL(r);
	ASSERT_EQ(ioc_ring_new(&r, 3), -EINVAL);
	ASSERT_EQ(ioc_ring_new(&r, 1), -EINVAL);
	ASSERT_EQ(ioc_ring_new_elem(&r, 8, 0), -EINVAL);
	ASSERT_UEQ(ioc_ring_memsize(6, 8), 0);
	ASSERT_OK(ioc_ring_new(&r, 8));
	ASSERT_UEQ(ioc_ring_capacity(r), 8);
	ASSERT_TRUE(ioc_ring_empty(r));
	/* Producer and consumer sides and the slots on separate lines. */
	ASSERT_UEQ((uintptr_t)&r->prod % IOC_CACHELINE, 0);
	ASSERT_UEQ((uintptr_t)&r->cons % IOC_CACHELINE, 0);
	ASSERT_UEQ((uintptr_t)r->slots % IOC_CACHELINE, 0);
	ASSERT_UGE((uintptr_t)&r->cons - (uintptr_t)&r->prod, IOC_CACHELINE);
	ASSERT_UGE((uintptr_t)r->slots - (uintptr_t)&r->cons, IOC_CACHELINE);
	ioc_ring_free(r);
}

typedef bool push_fn(struct ioc_ring *, void *);
typedef bool pop_fn(struct ioc_ring *, void **);
typedef unsigned pushb_fn(struct ioc_ring *, void *const *, unsigned);
typedef unsigned popb_fn(struct ioc_ring *, void **, unsigned);

static void check_ptr_regime(push_fn *push, pop_fn *pop, pushb_fn *pushb,
			     popb_fn *popb)
{
	struct ioc_ring *r;
	void *v[16], *out[16];
	uintptr_t next_in = 1, next_out = 1;

	ASSERT_OK(ioc_ring_new(&r, 8));
	for (int i = 0; i < 16; i++)
		v[i] = (void *)(uintptr_t)(i + 1);
	/* Fill to capacity, then full. */
	for (int i = 0; i < 8; i++)
		ASSERT_TRUE(push(r, (void *)next_in++));
	ASSERT_FALSE(push(r, (void *)99));
	ASSERT_UEQ(ioc_ring_count(r), 8);
	ASSERT_UEQ(pushb(r, v, 4), 0);
	/* Drain three, burst-push up to 16: only 3 fit. */
	for (int i = 0; i < 3; i++) {
		void *p;

		ASSERT_TRUE(pop(r, &p));
		ASSERT_UEQ((uintptr_t)p, next_out++);
	}
	for (int i = 0; i < 16; i++)
		v[i] = (void *)(uintptr_t)(next_in + i);
	ASSERT_UEQ(pushb(r, v, 16), 3);
	next_in += 3;
	/* Pop in bursts across the wrap point: everything, in order. */
	ASSERT_UEQ(popb(r, out, 5), 5);
	ASSERT_UEQ(popb(r, out + 5, 16), 3);
	for (int i = 0; i < 8; i++)
		ASSERT_UEQ((uintptr_t)out[i], next_out++);
	ASSERT_UEQ(next_in, next_out);
	ASSERT_UEQ(popb(r, out, 16), 0);
	void *p = (void *)7;
	ASSERT_FALSE(pop(r, &p));
	ASSERT_PTR_EQ(p, (void *)7);
	/* Many laps so the 32-bit indices wrap the mask many times. */
	for (int lap = 0; lap < 1000; lap++) {
		for (int i = 0; i < 5; i++)
			v[i] = (void *)(uintptr_t)(next_in + i);
		ASSERT_UEQ(pushb(r, v, 5), 5);
		next_in += 5;
		ASSERT_UEQ(popb(r, out, 16), 5);
		for (int i = 0; i < 5; i++)
			ASSERT_UEQ((uintptr_t)out[i], next_out++);
	}
	ASSERT_TRUE(ioc_ring_empty(r));
	ioc_ring_free(r);
}

static void test_ptr_spsc(void)
{
	check_ptr_regime(ioc_ring_push_spsc, ioc_ring_pop_spsc,
			 ioc_ring_push_burst_spsc, ioc_ring_pop_burst_spsc);
}

static void test_ptr_mpsc(void)
{
	check_ptr_regime(ioc_ring_push_mpsc, ioc_ring_pop_mpsc,
			 ioc_ring_push_burst_mpsc, ioc_ring_pop_burst_mpsc);
}

static void test_ptr_mpmc(void)
{
	check_ptr_regime(ioc_ring_push_mpmc, ioc_ring_pop_mpmc,
			 ioc_ring_push_burst_mpmc, ioc_ring_pop_burst_mpmc);
}

struct elem24 {
	uint64_t a, b, c;
};

typedef unsigned epushb_fn(struct ioc_ring *, const void *, unsigned);
typedef unsigned epopb_fn(struct ioc_ring *, void *, unsigned);
typedef bool epush_fn(struct ioc_ring *, const void *);
typedef bool epop_fn(struct ioc_ring *, void *);

static void check_elem_regime(epush_fn *push, epop_fn *pop, epushb_fn *pushb,
			      epopb_fn *popb)
{
	struct ioc_ring *r;
	struct elem24 in[10], out[10], one;
	uint64_t next_in = 0, next_out = 0;

	ASSERT_OK(ioc_ring_new_elem(&r, 16, sizeof(struct elem24)));
	for (int lap = 0; lap < 500; lap++) {
		/* 7 per lap so bursts straddle the end of the array. */
		for (int i = 0; i < 7; i++, next_in++)
			in[i] = (struct elem24){ next_in, ~next_in, next_in * 3 };
		ASSERT_UEQ(pushb(r, in, 7), 7);
		one = (struct elem24){ next_in, ~next_in, next_in * 3 };
		ASSERT_TRUE(push(r, &one));
		next_in++;
		ASSERT_UEQ(popb(r, out, 3), 3);
		ASSERT_TRUE(pop(r, &out[3]));
		ASSERT_UEQ(popb(r, out + 4, 10), 4);
		for (int i = 0; i < 8; i++, next_out++) {
			ASSERT_UEQ(out[i].a, next_out);
			ASSERT_UEQ(out[i].b, ~next_out);
			ASSERT_UEQ(out[i].c, next_out * 3);
		}
	}
	/* Full: 16 fit, the 17th does not. */
	for (int i = 0; i < 16; i++)
		ASSERT_TRUE(push(r, &one));
	ASSERT_FALSE(push(r, &one));
	ASSERT_UEQ(pushb(r, in, 3), 0);
	ASSERT_UEQ(ioc_ring_count(r), 16);
	ioc_ring_free(r);
}

static void test_elem_spsc(void)
{
	check_elem_regime(ioc_ring_push_elem_spsc, ioc_ring_pop_elem_spsc,
			  ioc_ring_push_elem_burst_spsc,
			  ioc_ring_pop_elem_burst_spsc);
}

static void test_elem_mpsc(void)
{
	check_elem_regime(ioc_ring_push_elem_mpsc, ioc_ring_pop_elem_mpsc,
			  ioc_ring_push_elem_burst_mpsc,
			  ioc_ring_pop_elem_burst_mpsc);
}

static void test_elem_mpmc(void)
{
	check_elem_regime(ioc_ring_push_elem_mpmc, ioc_ring_pop_elem_mpmc,
			  ioc_ring_push_elem_burst_mpmc,
			  ioc_ring_pop_elem_burst_mpmc);
}

static void test_init_in_place(void)
{
	static unsigned char mem[sizeof(struct ioc_ring) + 4 * 8] IOC_CACHE_ALIGNED;
	struct ioc_ring *r = (struct ioc_ring *)mem;
	void *p;

	ASSERT_UGE(sizeof(mem), ioc_ring_memsize(4, 8));
	ASSERT_OK(ioc_ring_init(r, 4, 8));
	ASSERT_TRUE(ioc_ring_push_spsc(r, mem));
	ASSERT_TRUE(ioc_ring_pop_spsc(r, &p));
	ASSERT_PTR_EQ(p, mem);
	ASSERT_EQ(ioc_ring_init(r, 5, 8), -EINVAL);
}

IOC_TEST_MAIN(
	IOC_TEST(test_geometry),
	IOC_TEST(test_ptr_spsc),
	IOC_TEST(test_ptr_mpsc),
	IOC_TEST(test_ptr_mpmc),
	IOC_TEST(test_elem_spsc),
	IOC_TEST(test_elem_mpsc),
	IOC_TEST(test_elem_mpmc),
	IOC_TEST(test_init_in_place),
)
