/*
 * Coroutine core: enter/yield/terminate, nesting, ordering, self/entered,
 * the floating-point control state across switches, the guard page, and
 * the reentry assertion.
 */
#include "iocore/co.h"
#include "tap.h"

#include <fenv.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>

static int trace[64];
static int ntrace;

static void note(int v)
{
	trace[ntrace++] = v;
}

static void ioc_coroutine_fn yielder(void *opaque)
{
	int *n = opaque;

	note(1);
	(*n)++;
	ioc_co_yield();
	note(3);
	(*n)++;
	ioc_co_yield();
	note(5);
	(*n)++;
}

static void test_enter_yield_terminate(void)
{
	int n = 0;
	struct ioc_co *co = ioc_co_create(yielder, &n);

	ntrace = 0;
	ASSERT_NOT_NULL(co);
	ASSERT_FALSE(ioc_in_coroutine());
	ASSERT_NULL(ioc_co_self());
	ASSERT_FALSE(ioc_co_entered(co));
	ioc_co_enter(co);
	note(2);
	ASSERT_EQ(n, 1);
	ASSERT_FALSE(ioc_co_entered(co));
	ioc_co_enter(co);
	note(4);
	ASSERT_EQ(n, 2);
	ioc_co_enter(co);	/* terminates; co goes back to the pool */
	note(6);
	ASSERT_EQ(n, 3);
	ASSERT_EQ(ntrace, 6);
	for (int i = 0; i < 6; i++)
		ASSERT_EQ(trace[i], i + 1);
}

struct selfcheck {
	struct ioc_co *co;
	bool in, entered;
	struct ioc_co *self;
};

static void ioc_coroutine_fn self_fn(void *opaque)
{
	struct selfcheck *s = opaque;

	s->in = ioc_in_coroutine();
	s->self = ioc_co_self();
	s->entered = ioc_co_entered(s->co);
}

static void test_self_entered(void)
{
	struct selfcheck s = { 0 };

	s.co = ioc_co_create(self_fn, &s);
	ASSERT_NOT_NULL(s.co);
	ioc_co_enter(s.co);
	ASSERT_TRUE(s.in);
	ASSERT_TRUE(s.entered);
	ASSERT_PTR_EQ(s.self, s.co);
	ASSERT_NULL(ioc_co_self());
}

/* Nesting: each level enters the next; every level must see itself as
 * self and its ancestors as entered (waiting on a child), and control
 * unwinds in order. */
#define DEPTH 1000
static struct ioc_co *chain[DEPTH];
static int depth_seen;
static bool nest_ok = true;

static void ioc_coroutine_fn nest_fn(void *opaque)
{
	int level = (int)(intptr_t)opaque;

	if (ioc_co_self() != chain[level])
		nest_ok = false;
	for (int i = 0; i <= level; i++)
		if (!ioc_co_entered(chain[i]))
			nest_ok = false;
	if (level + 1 < DEPTH) {
		chain[level + 1] = ioc_co_create(nest_fn, (void *)(intptr_t)(level + 1));
		if (!chain[level + 1]) {
			nest_ok = false;
			return;
		}
		ioc_co_enter(chain[level + 1]);
		if (ioc_co_self() != chain[level])
			nest_ok = false;
	} else {
		depth_seen = level + 1;
	}
}

static void test_nesting(void)
{
	chain[0] = ioc_co_create(nest_fn, (void *)(intptr_t)0);
	ASSERT_NOT_NULL(chain[0]);
	ioc_co_enter(chain[0]);
	ASSERT_TRUE(nest_ok);
	ASSERT_EQ(depth_seen, DEPTH);
}

/* A yield inside a nested coroutine returns to its enterer (the parent
 * coroutine), not to the thread. */
static struct ioc_co *inner_co;

static void ioc_coroutine_fn inner_fn(void *opaque)
{
	note(2);
	ioc_co_yield();
	note(4);
}

static void ioc_coroutine_fn outer_fn(void *opaque)
{
	note(1);
	inner_co = ioc_co_create(inner_fn, NULL);
	ioc_co_enter(inner_co);
	note(3);
	ioc_co_enter(inner_co);
	note(5);
	ioc_co_yield();
	note(7);
}

static void test_nested_yield_order(void)
{
	struct ioc_co *outer = ioc_co_create(outer_fn, NULL);

	ntrace = 0;
	ioc_co_enter(outer);
	note(6);
	ioc_co_enter(outer);
	ASSERT_EQ(ntrace, 7);
	for (int i = 0; i < 7; i++)
		ASSERT_EQ(trace[i], i + 1);
}

/* Many coroutines suspended at once, resumed in reverse order. */
static void ioc_coroutine_fn count_fn(void *opaque)
{
	int *v = opaque;

	ioc_co_yield();
	(*v)++;
}

static void test_many_suspended(void)
{
	enum { N = 300 };
	static struct ioc_co *cos[N];
	static int vals[N];

	for (int i = 0; i < N; i++) {
		cos[i] = ioc_co_create(count_fn, &vals[i]);
		ASSERT_NOT_NULL(cos[i]);
		ioc_co_enter(cos[i]);
	}
	for (int i = N - 1; i >= 0; i--)
		ioc_co_enter(cos[i]);
	for (int i = 0; i < N; i++)
		ASSERT_EQ(vals[i], 1);
}

/* Floating-point control state is per context: a coroutine that changes
 * the rounding mode does not leak it into its enterer, and gets its own
 * back after a yield. */
struct fpcheck {
	int mode_after_yield;
};

static void ioc_coroutine_fn fp_fn(void *opaque)
{
	struct fpcheck *f = opaque;

	fesetround(FE_UPWARD);
	ioc_co_yield();
	f->mode_after_yield = fegetround();
	fesetround(FE_TONEAREST);
}

static void test_fp_control_state(void)
{
	struct fpcheck f = { 0 };
	struct ioc_co *co;

	fesetround(FE_TOWARDZERO);
	co = ioc_co_create(fp_fn, &f);
	ioc_co_enter(co);
	ASSERT_EQ(fegetround(), FE_TOWARDZERO);
	ioc_co_enter(co);
	ASSERT_EQ(f.mode_after_yield, FE_UPWARD);
	ASSERT_EQ(fegetround(), FE_TOWARDZERO);
	fesetround(FE_TONEAREST);
}

/* Callee-saved registers survive a round trip through a coroutine that
 * clobbers them (the compiler keeps these locals in registers). */
static void ioc_coroutine_fn clobber_fn(void *opaque)
{
	volatile uint64_t sink = 0;

	for (int i = 0; i < 100; i++) {
		uint64_t a = 0x1111, b = 0x2222, c = 0x3333, d = 0x4444;
		uint64_t e = 0x5555, f = 0x6666;

		__asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d),
				 "+r"(e), "+r"(f));
		sink += a + b + c + d + e + f;
		ioc_co_yield();
	}
	*(uint64_t *)opaque = sink;
}

static void test_callee_saved(void)
{
	uint64_t sink = 0;
	struct ioc_co *co = ioc_co_create(clobber_fn, &sink);

	for (uint64_t i = 0; i < 100; i++) {
		uint64_t x = i * 3, y = i * 5, z = i * 7, w = i * 11;
		uint64_t u = i * 13, v = i * 17;

		ioc_co_enter(co);
		__asm__ volatile("" : "+r"(x), "+r"(y), "+r"(z), "+r"(w),
				 "+r"(u), "+r"(v));
		ASSERT_UEQ(x + y + z + w + u + v, i * 56);
	}
	ioc_co_enter(co);	/* terminates */
	ASSERT_UEQ(sink, 100 * (0x1111 + 0x2222 + 0x3333 + 0x4444 + 0x5555 + 0x6666));
}

/* ---- death tests, in a child process --------------------------------- */

static int run_child(void (*fn)(void))
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		fn();
		_exit(0);
	}
	ASSERT_GT(pid, 0);
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	return status;
}

static void ioc_coroutine_fn reenter_fn(void *opaque)
{
	ioc_co_enter(ioc_co_self());
}

static void child_reenter(void)
{
	/* Keep the expected abort quiet. */
	freopen("/dev/null", "w", stderr);
	ioc_co_enter(ioc_co_create(reenter_fn, NULL));
}

static void test_reenter_asserts(void)
{
	int status = run_child(child_reenter);

	if (!WIFSIGNALED(status))
		ioc_test_diag("child status 0x%x", status);
	ASSERT_TRUE(WIFSIGNALED(status));
	ASSERT_EQ(WTERMSIG(status), SIGABRT);
}

static uintptr_t guard_lo, guard_hi;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	_exit(a >= guard_lo && a < guard_hi ? 42 : 43);
}

static volatile int recurse_limit = 1 << 30;

static int __attribute__((noinline)) recurse(int n)
{
	volatile char buf[512];

	buf[0] = (char)n;
	buf[511] = (char)n;
	if (n >= recurse_limit)
		return 0;
	return recurse(n + 1) + buf[0] + buf[511];
}

static void ioc_coroutine_fn overflow_fn(void *opaque)
{
	recurse(0);
}

static void child_overflow(void)
{
	static char altstack[64 << 10];
	stack_t ss = { .ss_sp = altstack, .ss_size = sizeof(altstack) };
	struct sigaction sa = { .sa_sigaction = on_segv,
				.sa_flags = SA_SIGINFO | SA_ONSTACK };
	struct ioc_co *co = ioc_co_create(overflow_fn, NULL);
	void *lo;
	size_t len;

	ioc_co_get_guard(co, &lo, &len);
	guard_lo = (uintptr_t)lo;
	guard_hi = guard_lo + len;
	sigaltstack(&ss, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	ioc_co_enter(co);
	_exit(44);
}

static void test_stack_overflow_hits_guard(void)
{
	int status = run_child(child_overflow);

	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(WEXITSTATUS(status), 42);
}

static void test_pool_reuse(void)
{
	struct ioc_co_pool_stats a, b;

	ioc_co_pool_get_stats(&a);
	for (int i = 0; i < 1000; i++) {
		int n = 0;
		struct ioc_co *co = ioc_co_create(yielder, &n);

		ntrace = 0;
		ASSERT_NOT_NULL(co);
		ioc_co_enter(co);
		ioc_co_enter(co);
		ioc_co_enter(co);
		ASSERT_EQ(n, 3);
	}
	ioc_co_pool_get_stats(&b);
	ASSERT_UEQ(b.created, a.created);
	ASSERT_UEQ(b.reused, a.reused + 1000);
	ASSERT_ULE(b.pooled, b.max_pooled);
	ASSERT_ULE(b.reserved, b.max_pooled);
	ASSERT_UGE(b.max_pooled, 16);
}

/* The death tests fork; they come first so that the child inherits no
 * TSan fibers (TSan forgets their happens-before history across fork and
 * then reports false races in the child). */
IOC_TEST_MAIN(
	IOC_TEST(test_reenter_asserts),
	IOC_TEST(test_stack_overflow_hits_guard),
	IOC_TEST(test_enter_yield_terminate),
	IOC_TEST(test_self_entered),
	IOC_TEST(test_nesting),
	IOC_TEST(test_nested_yield_order),
	IOC_TEST(test_many_suspended),
	IOC_TEST(test_fp_control_state),
	IOC_TEST(test_callee_saved),
	IOC_TEST(test_pool_reuse),
)
