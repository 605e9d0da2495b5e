/*
 * The machine-dependent part of a coroutine: a saved context and the
 * switch between two of them.  Private to src/co.
 *
 * Two backends, chosen at build time by src/co/meson.build:
 *  - IOC_CO_BACKEND_ASM: hand-written switch-<arch>.S; a context is one
 *    saved stack pointer (everything else lives on the stack).
 *  - IOC_CO_BACKEND_UCONTEXT: getcontext/makecontext/swapcontext, for other
 *    architectures and as a slow baseline; swapcontext also saves and
 *    restores the signal mask with a system call on every switch.
 *
 * ioc__co_ctx_switch(from, to, arg) saves the running context in *from,
 * resumes *to and returns, once something switches back to *from, the arg
 * that switch passed.  It is always_inline, and so are the sanitizer
 * hooks in co.c: with TSan every non-inlined function pushes and pops a
 * frame on the *current fiber's* shadow stack, so a function that switches
 * fibers between its entry and its exit would push on one and pop on the
 * other.  A fresh context made by ioc__co_ctx_make() starts in
 * entry(arg) with the arg of the first switch into it; entry never returns.
 */
#ifndef IOC_CO_SWITCH_H
#define IOC_CO_SWITCH_H

#include <stddef.h>
#include <stdint.h>

#if !defined(IOC_CO_BACKEND_ASM) && !defined(IOC_CO_BACKEND_UCONTEXT)
#error "src/co/meson.build defines the context-switch backend"
#endif

typedef void ioc__co_entry_fn(void *arg);

#ifdef IOC_CO_BACKEND_ASM

struct ioc__co_ctx {
	void *sp;
};

void *ioc__co_switch(void **save_sp, void *to_sp, void *arg);

static inline __attribute__((always_inline)) void *ioc__co_ctx_switch(struct ioc__co_ctx *from,
				       struct ioc__co_ctx *to, void *arg)
{
	return ioc__co_switch(&from->sp, to->sp, arg);
}

#if defined(__x86_64__)
/* First frame in the layout switch-x86_64.S pops (see there). */
static inline void ioc__co_ctx_make(struct ioc__co_ctx *ctx, void *stack_lo,
				    size_t size, ioc__co_entry_fn *entry)
{
	uintptr_t top = ((uintptr_t)stack_lo + size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 72);	/* 8 mod 16 after ret */
	uint32_t mxcsr;
	uint16_t fpucw;

	__asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
	__asm__ volatile("fnstcw %0" : "=m"(fpucw));
	sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
	for (int i = 1; i <= 6; i++)
		sp[i] = 0;			/* r12..rbp; rbp = 0 ends backtraces */
	sp[7] = (uint64_t)(uintptr_t)entry;	/* return address */
	sp[8] = 0;				/* entry's own "return address" */
	ctx->sp = sp;
}
#elif defined(__aarch64__)
static inline void ioc__co_ctx_make(struct ioc__co_ctx *ctx, void *stack_lo,
				    size_t size, ioc__co_entry_fn *entry)
{
	uintptr_t top = ((uintptr_t)stack_lo + size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 176);
	uint64_t fpcr;

	__asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
	for (int i = 0; i < 22; i++)
		sp[i] = 0;
	sp[11] = (uint64_t)(uintptr_t)entry;	/* x30 */
	sp[20] = fpcr;
	ctx->sp = sp;
}
#else
#error "no assembly context switch for this architecture; use ucontext"
#endif

#else /* IOC_CO_BACKEND_UCONTEXT */

#include <ucontext.h>

struct ioc__co_ctx {
	ucontext_t uc;
	void *arg;	/* what the switch into this context passes */
	ioc__co_entry_fn *entry;
};

static inline __attribute__((always_inline)) void *ioc__co_ctx_switch(struct ioc__co_ctx *from,
				       struct ioc__co_ctx *to, void *arg)
{
	to->arg = arg;
	swapcontext(&from->uc, &to->uc);
	return from->arg;
}

void ioc__co_ctx_make(struct ioc__co_ctx *ctx, void *stack_lo, size_t size,
		      ioc__co_entry_fn *entry);

#endif

#endif /* IOC_CO_SWITCH_H */
