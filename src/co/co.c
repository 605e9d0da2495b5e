/*
 * Coroutines: create, enter, yield, terminate.
 *
 * Problem: a request should read as straight-line code (submit, wait,
 * continue) yet cost about a callback: stackful coroutines, the switch kept
 * near the hardware's floor (about Boost.Context's, far below swapcontext:
 * bench/co/NOTES.md; mostly stmxcsr).
 *
 * Design.  Entering saves the enterer's context in a local on its own stack
 * and points co->ret at it; yield and terminate switch back to co->ret.  So
 * the enterer may be a thread or a coroutine (nesting).  Only ioc_co_enter()
 * touches the thread-local current coroutine, before the switch and after it
 * returns: the enterer resumes on the thread it entered from, so the compiler
 * may cache the TLS address across it.  After a *yield*, which may resume
 * elsewhere, nothing thread-local is read (ioc_co_yield()).
 *
 * The first entry starts trampoline(), which loops forever: run fn, mark
 * terminated, switch back passing itself (a yield passes NULL).  The enterer
 * learns "terminated" from the switch's return value, never from the
 * coroutine's memory (after a yield it may already run elsewhere), and
 * releases it to the pool; the next ioc_co_create() sets a new fn and the
 * next enter resumes the loop: reuse costs no context setup.
 *
 * Tools.  ASan hears of every switch (start/finish_switch_fiber), or it
 * reports false stack-buffer overflows and mis-tracks fake stacks; a
 * terminating coroutine passes NULL to free its fake stack; the enterer's
 * stack bounds come from finish_switch_fiber's "old" output (no per-thread
 * bookkeeping).  TSan gets a fiber per coroutine and switch_to_fiber before
 * each switch (flag 0: a synchronisation point, as migration needs).
 *
 * Rejected: sigsetjmp/siglongjmp (QEMU's ucontext backend: glibc's longjmp
 * mangles pointers and checks shadow stacks, several times slower); QEMU's
 * per-thread leader coroutine (a TLS lookup per yield; subtle migration).
 *
 * Not supported: CET shadow stacks / IBT (the switch returns by indirect
 * jump; the .S has no GNU property note); AArch64 BTI.  Only the AArch64
 * switch is tested, alone, under qemu-aarch64 (test-co-switch-aarch64.sh:
 * arguments, x19-x28, d8-d15, FPCR, first-frame alignment); the rest of the
 * module has never run on AArch64, for want of a machine.
 */
#include "co-int.h"

#include <assert.h>
#include <stdlib.h>

#ifdef IOC_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef IOC_TSAN
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif

static IOC_TLS struct ioc_co *tls_current;

/*
 * noinline: a coroutine that migrated between two calls must read the new
 * thread's variable.  Inlined (with LTO) the compiler may keep the first
 * thread's TLS address across the yield -- QEMU's coroutine-tls.h problem.
 */
__attribute__((noinline)) struct ioc_co *ioc_co_self(void)
{
	return tls_current;
}

__attribute__((noinline)) bool ioc_in_coroutine(void)
{
	return tls_current != NULL;
}

bool ioc_co_entered(struct ioc_co *co)
{
	return co->entered;
}

/* ---- sanitizer hooks around a switch --------------------------------- */

/* Before switching from the enterer into co. */
static inline __attribute__((always_inline)) void hook_enter(struct ioc_co *co, void **fake)
{
#ifdef IOC_ASAN
	__sanitizer_start_switch_fiber(fake, co->stack_lo, co->stack_size);
#else
	(void)fake;
#endif
#ifdef IOC_TSAN
	co->tsan_caller_fiber = __tsan_get_current_fiber();
	__tsan_switch_to_fiber(co->tsan_fiber, 0);
#else
	(void)co;
#endif
}

/* In the enterer, once control came back. */
static inline __attribute__((always_inline)) void hook_back_in_enterer(void *fake)
{
#ifdef IOC_ASAN
	__sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
	(void)fake;
#endif
}

/* In co, once it is running (first start or resume after yield). */
static inline __attribute__((always_inline)) void hook_running(struct ioc_co *co)
{
#ifdef IOC_ASAN
	__sanitizer_finish_switch_fiber(co->asan_fake_stack,
					&co->caller_stack_lo,
					&co->caller_stack_size);
#else
	(void)co;
#endif
}

/* In co, before switching back to the enterer.  A terminating coroutine
 * passes no fake-stack slot, so ASan drops its fake frames. */
static inline __attribute__((always_inline)) void hook_leave(struct ioc_co *co, bool terminating)
{
#ifdef IOC_ASAN
	if (terminating)
		co->asan_fake_stack = NULL;	/* resumes fresh when reused */
	__sanitizer_start_switch_fiber(terminating ? NULL : &co->asan_fake_stack,
				       co->caller_stack_lo,
				       co->caller_stack_size);
#else
	(void)terminating;
#endif
#ifdef IOC_TSAN
	__tsan_switch_to_fiber(co->tsan_caller_fiber, 0);
#else
	(void)co;
#endif
}

/* ---- the coroutine side ---------------------------------------------- */

static void __attribute__((noreturn)) trampoline(void *arg)
{
	struct ioc_co *co = arg;

	for (;;) {
		hook_running(co);
		co->fn(co->opaque);
		co->terminated = true;
		co->entered = false;
		hook_leave(co, true);
		/* Tells ioc_co_enter() to release co; resumes here when the
		 * pool hands co out again. */
		ioc__co_ctx_switch(&co->ctx, co->ret, co);
	}
}

#ifdef IOC_CO_BACKEND_UCONTEXT
static void uc_start(unsigned hi, unsigned lo)
{
	struct ioc__co_ctx *ctx =
		(struct ioc__co_ctx *)(((uintptr_t)hi << 32) | (uintptr_t)lo);

	ctx->entry(ctx->arg);
}

void ioc__co_ctx_make(struct ioc__co_ctx *ctx, void *stack_lo, size_t size,
		      ioc__co_entry_fn *entry)
{
	uintptr_t p = (uintptr_t)ctx;

	getcontext(&ctx->uc);
	ctx->uc.uc_stack.ss_sp = stack_lo;
	ctx->uc.uc_stack.ss_size = size;
	ctx->uc.uc_link = NULL;
	ctx->entry = entry;
	makecontext(&ctx->uc, (void (*)(void))uc_start, 2,
		    (unsigned)(p >> 32), (unsigned)p);
}
#endif

void ioc__co_init_context(struct ioc_co *co)
{
	ioc__co_ctx_make(&co->ctx, co->stack_lo, co->stack_size, trampoline);
#ifdef IOC_TSAN
	co->tsan_fiber = __tsan_create_fiber(0);
#endif
}

void ioc__co_fini_context(struct ioc_co *co)
{
#ifdef IOC_TSAN
	__tsan_destroy_fiber(co->tsan_fiber);
#else
	(void)co;
#endif
}

/* ---- API --------------------------------------------------------------- */

struct ioc_co *ioc_co_create(ioc_co_fn *fn, void *opaque)
{
	struct ioc_co *co = ioc__co_pool_get();

	if (ioc_unlikely(!co))
		return NULL;
	co->fn = fn;
	co->opaque = opaque;
	co->home = ioc_loop_current();
	return co;
}

void ioc_co_enter(struct ioc_co *co)
{
	struct ioc_co *prev = tls_current;
	struct ioc__co_ctx here;
	void *fake = NULL;
	void *finished;

	assert(!co->entered && "entering a running coroutine");
	assert(!co->terminated);
	co->entered = true;
	co->caller = prev;
	co->ret = &here;
	tls_current = co;
	hook_enter(co, &fake);
	/* Returns NULL when co yielded, co when it terminated. */
	finished = ioc__co_ctx_switch(&here, &co->ctx, co);
	/* Back on the same thread.  After a yield co may already belong to
	 * another thread (woken there), so read nothing from it. */
	hook_back_in_enterer(fake);
	tls_current = prev;
	if (finished)
		ioc__co_pool_put(finished);
}

void ioc_coroutine_fn ioc_co_yield(void)
{
	struct ioc_co *co = tls_current;

	assert(co && "ioc_co_yield() outside a coroutine");
	co->entered = false;
	hook_leave(co, false);
	ioc__co_ctx_switch(&co->ctx, co->ret, NULL);
	/* Possibly on another thread now: co is a local, nothing here reads
	 * thread-local storage. */
	hook_running(co);
}

void ioc_co_get_guard(struct ioc_co *co, void **lo, size_t *len)
{
	*lo = co->guard_lo;
	*len = co->guard_size;
}
