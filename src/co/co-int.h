/*
 * Private coroutine state shared by the files of src/co.
 */
#ifndef IOC_CO_INT_H
#define IOC_CO_INT_H

#include "ioc-config.h"
#include "iocore/co.h"
#include "co-switch.h"

#include <assert.h>
#include <stdatomic.h>

/*
 * Lives in the highest bytes of its own stack mapping:
 *     [guard page][stack ............................][struct ioc_co]
 * so one mmap serves both and a pooled coroutine costs one VMA (two when
 * the guard needs mprotect).
 */
struct ioc_co {
	struct ioc__co_ctx ctx;		/* saved while not running */
	struct ioc__co_ctx *ret;	/* the enterer's context */
	struct ioc_co *caller;		/* entering coroutine, NULL for a thread */
	ioc_co_fn *fn;
	void *opaque;
	bool entered;			/* running or inside a nested enter */
	bool terminated;		/* fn returned; enter() releases it */

	struct ioc_loop *home;
	struct ioc_task wake_task;	/* ioc_co_wake(); co-loop.c */
	struct ioc_loop *move_dest;	/* ioc_co_move_to() in flight */

	struct ioc_co *pool_next;	/* free-list link while pooled */

	void *map;			/* the whole mapping */
	size_t map_size;
	void *stack_lo;			/* lowest usable stack byte */
	size_t stack_size;		/* usable bytes up to this struct */
	void *guard_lo;			/* the guard page */
	size_t guard_size;
#ifdef IOC_ASAN
	void *asan_fake_stack;
	const void *caller_stack_lo;	/* learnt when the enterer switches in */
	size_t caller_stack_size;
#endif
#ifdef IOC_TSAN
	void *tsan_fiber;
	void *tsan_caller_fiber;
#endif
#if IOC_HAVE_VALGRIND
	unsigned valgrind_id;
#endif
};

/* Before a coroutine yields to wait for a wakeup: the home-thread rule of
 * co.h, checked (a wake could otherwise enter it while it is still
 * switching out on another thread). */
#define ioc__co_check_home(co)                                            \
	assert((co)->home && ioc_loop_current() == (co)->home &&          \
	       "a coroutine waits only on its home loop's thread (co.h)")

/* Thread-local state of co.c and co-pool.c, on the switch and pool fast
 * paths: initial-exec, so an access is one thread-pointer-relative load
 * rather than a call to __tls_get_addr.  A libiocore.so dlopen()ed late
 * takes these few words from glibc's static TLS surplus. */
#define IOC_TLS __thread __attribute__((tls_model("initial-exec")))

/* stack.c: map a coroutine (stack + struct) / unmap it. */
struct ioc_co *ioc__co_stack_alloc(size_t stack_size);
void ioc__co_stack_free(struct ioc_co *co);
/* How many VMAs one stack costs (1 with MADV_GUARD_INSTALL, else 2). */
unsigned ioc__co_stack_vmas(void);

/* co-pool.c */
struct ioc_co *ioc__co_pool_get(void);
void ioc__co_pool_put(struct ioc_co *co);

/* co.c: make a fresh context in a new stack. */
void ioc__co_init_context(struct ioc_co *co);
void ioc__co_fini_context(struct ioc_co *co);

#endif /* IOC_CO_INT_H */
