/*
 * The assembly context switch alone (src/co/switch-<arch>.S through
 * co-switch.h), without the rest of the coroutine module: arguments both
 * ways, every register the ABI says a callee keeps, the floating-point
 * control state of each context, and the stack alignment a fresh context
 * starts with.
 *
 * Built natively by meson on x86-64 and AArch64.  It needs nothing but libc
 * and libm, so tests/co/test-co-switch-aarch64.sh also cross-builds it
 * statically for AArch64 and runs it under qemu-aarch64 on an x86-64 host:
 * that is how the AArch64 switch gets tested on this project's machines.
 */
#include <fenv.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

#include "../../src/co/co-switch.h"

#define STACK_SIZE (64 * 1024)

static struct ioc__co_ctx main_ctx, co_ctx;
static void *stack;

static void start(ioc__co_entry_fn *entry)
{
	stack = aligned_alloc(16, STACK_SIZE);
	ASSERT_NOT_NULL(stack);
	/* An odd size and a misaligned top: ctx_make must align it. */
	ioc__co_ctx_make(&co_ctx, stack, STACK_SIZE - 8, entry);
}

static void finish(void)
{
	free(stack);
	stack = NULL;
}

/* ---- arguments ---------------------------------------------------------- */

static void echo_entry(void *arg)
{
	uintptr_t v = (uintptr_t)arg;

	for (;;)
		v = (uintptr_t)ioc__co_ctx_switch(&co_ctx, &main_ctx, (void *)(v * 3 + 1));
}

static void test_args_both_ways(void)
{
	start(echo_entry);
	for (uintptr_t i = 0; i < 10000; i++) {
		uintptr_t r = (uintptr_t)ioc__co_ctx_switch(&main_ctx, &co_ctx, (void *)i);

		ASSERT_UEQ(r, i * 3 + 1);
	}
	finish();
}

/* ---- callee-saved registers ------------------------------------------- */

/* What the callee-saved registers held after a switch that left them
 * loaded with seed-derived values. */
struct regs {
	uint64_t gpr[10];
	uint64_t fpr[8];
};

#if defined(__aarch64__)
#define NGPR 10         /* x19-x28 */
#define NFPR 8          /* d8-d15 */
/*
 * Load x19-x28 with seed + i and d8-d15 with seed + 100 + i, switch from
 * *save to `to`, and store what those registers hold once something
 * switches back.  The compiler is told nothing about x19-x28 and d8-d15:
 * the asm saves and restores them itself, so the registers checked are
 * the switch's doing alone.
 */
static void switch_loaded(void **save, void *to, uint64_t seed, struct regs *out)
{
	__asm__ volatile(
		"stp	%[save], %[to], [sp, #-16]!\n\t"
		"stp	%[out], %[seed], [sp, #-16]!\n\t"
		"stp	x19, x20, [sp, #-16]!\n\t"
		"stp	x21, x22, [sp, #-16]!\n\t"
		"stp	x23, x24, [sp, #-16]!\n\t"
		"stp	x25, x26, [sp, #-16]!\n\t"
		"stp	x27, x28, [sp, #-16]!\n\t"
		"stp	d8, d9, [sp, #-16]!\n\t"
		"stp	d10, d11, [sp, #-16]!\n\t"
		"stp	d12, d13, [sp, #-16]!\n\t"
		"stp	d14, d15, [sp, #-16]!\n\t"
		/* 9 pairs saved above the two argument pairs */
		"ldr	x9, [sp, #152]\n\t"
		"add	x19, x9, #0\n\t"
		"add	x20, x9, #1\n\t"
		"add	x21, x9, #2\n\t"
		"add	x22, x9, #3\n\t"
		"add	x23, x9, #4\n\t"
		"add	x24, x9, #5\n\t"
		"add	x25, x9, #6\n\t"
		"add	x26, x9, #7\n\t"
		"add	x27, x9, #8\n\t"
		"add	x28, x9, #9\n\t"
		"add	x10, x9, #100\n\t	fmov	d8, x10\n\t"
		"add	x10, x9, #101\n\t	fmov	d9, x10\n\t"
		"add	x10, x9, #102\n\t	fmov	d10, x10\n\t"
		"add	x10, x9, #103\n\t	fmov	d11, x10\n\t"
		"add	x10, x9, #104\n\t	fmov	d12, x10\n\t"
		"add	x10, x9, #105\n\t	fmov	d13, x10\n\t"
		"add	x10, x9, #106\n\t	fmov	d14, x10\n\t"
		"add	x10, x9, #107\n\t	fmov	d15, x10\n\t"
		"ldp	x0, x1, [sp, #160]\n\t"
		"mov	x2, #0\n\t"
		"bl	ioc__co_switch\n\t"
		"ldr	x9, [sp, #144]\n\t"
		"stp	x19, x20, [x9, #0]\n\t"
		"stp	x21, x22, [x9, #16]\n\t"
		"stp	x23, x24, [x9, #32]\n\t"
		"stp	x25, x26, [x9, #48]\n\t"
		"stp	x27, x28, [x9, #64]\n\t"
		"stp	d8, d9, [x9, #80]\n\t"
		"stp	d10, d11, [x9, #96]\n\t"
		"stp	d12, d13, [x9, #112]\n\t"
		"stp	d14, d15, [x9, #128]\n\t"
		"ldp	d14, d15, [sp], #16\n\t"
		"ldp	d12, d13, [sp], #16\n\t"
		"ldp	d10, d11, [sp], #16\n\t"
		"ldp	d8, d9, [sp], #16\n\t"
		"ldp	x27, x28, [sp], #16\n\t"
		"ldp	x25, x26, [sp], #16\n\t"
		"ldp	x23, x24, [sp], #16\n\t"
		"ldp	x21, x22, [sp], #16\n\t"
		"ldp	x19, x20, [sp], #16\n\t"
		"add	sp, sp, #32\n\t"
		:
		: [save] "r"(save), [to] "r"(to), [out] "r"(out), [seed] "r"(seed)
		: "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9",
		  "x10", "x11", "x12", "x13", "x14", "x15", "x16", "x17", "x18",
		  "x30", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8",
		  "v9", "v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17",
		  "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26",
		  "v27", "v28", "v29", "v30", "v31", "memory", "cc");
}
#elif defined(__x86_64__)
#define NGPR 5          /* rbx, r12-r15 (rbp: the compiler's frame pointer) */
#define NFPR 0
/*
 * The same for rbx and r12-r15.  It steps over the red zone and aligns
 * the stack for the call itself, keeping the old stack pointer on the
 * new stack.
 */
static void switch_loaded(void **save, void *to, uint64_t seed, struct regs *out)
{
	__asm__ volatile(
		"mov	%%rsp, %%rax\n\t"
		"lea	-128(%%rsp), %%rsp\n\t"
		"and	$-16, %%rsp\n\t"
		"push	%%rax\n\t"              /* old rsp */
		"push	%[out]\n\t"
		"push	%[save]\n\t"
		"push	%[to]\n\t"
		"push	%[seed]\n\t"
		"push	%%rbx\n\t"
		"push	%%r12\n\t"
		"push	%%r13\n\t"
		"push	%%r14\n\t"
		"push	%%r15\n\t"              /* 10 pushes: aligned */
		"mov	40(%%rsp), %%rax\n\t"   /* seed */
		"lea	0(%%rax), %%rbx\n\t"
		"lea	1(%%rax), %%r12\n\t"
		"lea	2(%%rax), %%r13\n\t"
		"lea	3(%%rax), %%r14\n\t"
		"lea	4(%%rax), %%r15\n\t"
		"mov	56(%%rsp), %%rdi\n\t"   /* save */
		"mov	48(%%rsp), %%rsi\n\t"   /* to */
		"xor	%%edx, %%edx\n\t"
		"call	ioc__co_switch\n\t"
		"mov	64(%%rsp), %%rax\n\t"   /* out */
		"mov	%%rbx, 0(%%rax)\n\t"
		"mov	%%r12, 8(%%rax)\n\t"
		"mov	%%r13, 16(%%rax)\n\t"
		"mov	%%r14, 24(%%rax)\n\t"
		"mov	%%r15, 32(%%rax)\n\t"
		"pop	%%r15\n\t"
		"pop	%%r14\n\t"
		"pop	%%r13\n\t"
		"pop	%%r12\n\t"
		"pop	%%rbx\n\t"
		"mov	32(%%rsp), %%rsp\n\t"   /* old rsp */
		:
		: [save] "r"(save), [to] "r"(to), [out] "r"(out), [seed] "r"(seed)
		: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
		  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
		  "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",
		  "xmm15", "memory", "cc");
}
#endif

static struct regs co_seen;
static int co_bad;

static void check(const struct regs *r, uint64_t seed)
{
	for (int i = 0; i < NGPR; i++)
		ASSERT_UEQ(r->gpr[i], seed + (uint64_t)i);
	for (int i = 0; i < NFPR; i++)
		ASSERT_UEQ(r->fpr[i], seed + 100 + (uint64_t)i);
}

/* The coroutine loads its own values, different every round, and checks
 * them when it is resumed; main does the same on its side. */
static void loaded_entry(void *arg)
{
	(void)arg;
	for (uint64_t round = 0;; round++) {
		uint64_t seed = 0x7000000000000000ull + round * 1000;

		switch_loaded(&co_ctx.sp, main_ctx.sp, seed, &co_seen);
		for (int i = 0; i < NGPR; i++)
			co_bad |= co_seen.gpr[i] != seed + (uint64_t)i;
		for (int i = 0; i < NFPR; i++)
			co_bad |= co_seen.fpr[i] != seed + 100 + (uint64_t)i;
	}
}

static void test_callee_saved_registers(void)
{
	struct regs seen;

	start(loaded_entry);
	for (uint64_t round = 0; round < 1000; round++) {
		uint64_t seed = 0x1000000000000000ull + round * 1000;

		memset(&seen, 0, sizeof(seen));
		switch_loaded(&main_ctx.sp, co_ctx.sp, seed, &seen);
		check(&seen, seed);
		ASSERT_EQ(co_bad, 0);
	}
	finish();
}

/* ---- floating-point control state ---------------------------------------- */

static int co_mode_seen;
static double co_third, co_third_seen;

/* 1/3 in the current rounding mode, computed at run time.  The mode is
 * read back both ways: fegetround() (on x86-64 glibc reads the x87
 * control word only) and an actual division (SSE on x86-64, so MXCSR). */
static __attribute__((noinline)) double third(void)
{
	volatile double one = 1.0, three = 3.0;

	return one / three;
}

static void fp_entry(void *arg)
{
	(void)arg;
	fesetround(FE_UPWARD);
	co_third = third();
	for (;;) {
		ioc__co_ctx_switch(&co_ctx, &main_ctx, NULL);
		co_mode_seen = fegetround();
		co_third_seen = third();
	}
}

static void test_fp_control_per_context(void)
{
	double down;

	fesetround(FE_TOWARDZERO);
	down = third();
	start(fp_entry);
	for (int i = 0; i < 3; i++) {
		ioc__co_ctx_switch(&main_ctx, &co_ctx, NULL);
		ASSERT_EQ(fegetround(), FE_TOWARDZERO);
		ASSERT_TRUE(third() == down);
		if (i > 0) {
			ASSERT_EQ(co_mode_seen, FE_UPWARD);
			ASSERT_TRUE(co_third_seen == co_third);
		}
	}
	fesetround(FE_TONEAREST);
	/* The two modes give different quotients, or this proves nothing. */
	ASSERT_TRUE(co_third != down);
	finish();
}

/* ---- stack alignment ------------------------------------------------------ */

static uintptr_t entry_local;

static __attribute__((noinline)) void note_alignment(void)
{
	/* The compiler assumes the ABI's 16 bytes and does not realign, so
	 * the address shows the stack the switch built. */
	_Alignas(16) volatile char local[16];

	local[0] = 1;
	entry_local = (uintptr_t)&local[0];
}

static void align_entry(void *arg)
{
	(void)arg;
	note_alignment();
	for (;;)
		ioc__co_ctx_switch(&co_ctx, &main_ctx, NULL);
}

static void test_entry_stack_alignment(void)
{
	start(align_entry);
	ioc__co_ctx_switch(&main_ctx, &co_ctx, NULL);
	ASSERT_UEQ(entry_local % 16, 0);
	ASSERT_GT(entry_local, (uintptr_t)stack);
	ASSERT_LT(entry_local, (uintptr_t)stack + STACK_SIZE);
	finish();
}

IOC_TEST_MAIN(
	IOC_TEST(test_args_both_ways),
	IOC_TEST(test_callee_saved_registers),
	IOC_TEST(test_fp_control_per_context),
	IOC_TEST(test_entry_stack_alignment),
)
