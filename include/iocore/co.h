/*
 * iocore coroutines: stackful, pooled, tied to event loops.
 *
 * A coroutine runs on the thread that enters it and yields back to whoever
 * entered it; when its function returns, it terminates and its stack goes
 * back to the pool.  Every coroutine has a home loop (the creating thread's
 * current loop); ioc_co_wake() from any thread re-enters it there.
 *
 * Functions marked ioc_coroutine_fn may yield and must only be called from
 * coroutine context.
 *
 * The home-thread rule: a coroutine that waits for a wakeup (ioc_co_wake,
 * ioc_co_await, the locks, the event) must be running on its home loop's
 * thread when it starts waiting.  That is what lets a waker on any other
 * thread wake it the instant it has published itself, before it has
 * finished switching out: the wake is a task on the home loop, and that
 * loop cannot run it until the coroutine has yielded.  Coroutines created
 * on a loop thread and moved only with ioc_co_move_to() follow it.
 *
 * Machine support: hand-written switches for x86-64 and AArch64 (callee-
 * saved registers, stack pointer, MXCSR and x87 control word / FPCR), a
 * ucontext fallback elsewhere.  Stacks are mmap'd, committed lazily, with a
 * guard page (MADV_GUARD_INSTALL where the kernel has it, else mprotect).
 * ASan, TSan and Valgrind are told about every stack and switch.
 */
#ifndef IOCORE_CO_H
#define IOCORE_CO_H

#include <stdatomic.h>

#include "iocore/common.h"
#include "iocore/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_co;
typedef void ioc_coroutine_fn ioc_co_fn(void *opaque);

/* Create a coroutine (not yet started) whose home is the current loop (may
 * be NULL: then only ioc_co_enter() can run it).  NULL only on -ENOMEM. */
struct ioc_co *ioc_co_create(ioc_co_fn *fn, void *opaque);
/* Run co on this thread until it yields or terminates.  Entering a
 * coroutine that is already running is a programming error (assert). */
void ioc_co_enter(struct ioc_co *co);
/* Give control back to whoever entered us. */
void ioc_coroutine_fn ioc_co_yield(void);
/* The running coroutine, or NULL outside coroutine context. */
struct ioc_co *ioc_co_self(void);
bool ioc_in_coroutine(void);
/* True when co is entered: running, or waiting on a coroutine it entered.
 * False once it has yielded or terminated (QEMU's qemu_coroutine_entered). */
bool ioc_co_entered(struct ioc_co *co);
/* The guard page below co's stack (for tests and debuggers). */
void ioc_co_get_guard(struct ioc_co *co, void **lo, size_t *len);

/* Resume co on its home loop.  Called on the thread running that loop
 * and outside any coroutine (a loop callback), it enters co at once and
 * returns when co yields or terminates -- so the caller must not touch
 * anything co may free once it runs.  Otherwise (another thread, or
 * inside a coroutine) it schedules co through the loop.  Lock-free,
 * allocates nothing, any thread.  co must be yielded (or about to yield
 * on the home loop's thread, see above) and must not be woken twice for
 * one yield.  A coroutine may wake itself and then yield: it continues
 * after whatever the loop has queued (a "yield to the loop"). */
void ioc_co_wake(struct ioc_co *co);
struct ioc_loop *ioc_co_home(struct ioc_co *co);
/* Set co's home loop (co not running). */
void ioc_co_set_home(struct ioc_co *co, struct ioc_loop *loop);
/* Move the calling coroutine to loop: it continues on loop's thread, and
 * loop becomes its home.  The calling thread must have a current loop. */
void ioc_coroutine_fn ioc_co_move_to(struct ioc_loop *loop);

/* Sleep on the home loop's timers (at least ns; never early). */
void ioc_coroutine_fn ioc_co_sleep_ns(int64_t ns);
/* Wait until fd is readable (IOC_CO_READ) or writable (IOC_CO_WRITE) on the
 * home loop.  Returns the event that fired, or -errno. */
enum { IOC_CO_READ = 1, IOC_CO_WRITE = 2 };
int ioc_coroutine_fn ioc_co_wait_fd(int fd, int events);

/*
 * Awaiting a callback-based operation:
 *     struct ioc_co_await aw;
 *     ioc_co_await_init(&aw);
 *     submit(..., my_cb, &aw);          // my_cb calls ioc_co_await_done(&aw, res)
 *     res = ioc_co_await(&aw);          // yields unless already done
 * ioc_co_await_done() may run on any thread, before or after the yield;
 * the coroutine resumes exactly once, on its home loop.  done() wakes it
 * with ioc_co_wake(), so from a callback on the home loop's thread the
 * coroutine runs inside done() itself: on every thread, done() must be
 * the caller's last touch of the operation's memory (which may be on the
 * coroutine's stack), and the callback must not hold a lock the
 * coroutine may take.  aw itself is never touched after done().  A
 * coroutine that yields here needs a home loop and must be on its thread
 * (the home-thread rule above).
 */
struct ioc_co_await {
	struct ioc_co *co;
	int64_t result;
	_Atomic int state; /* private */
};
void ioc_co_await_init(struct ioc_co_await *aw);
int64_t ioc_coroutine_fn ioc_co_await(struct ioc_co_await *aw);
void ioc_co_await_done(struct ioc_co_await *aw, int64_t result);

/* ---- synchronisation ------------------------------------------------- */

/* Waiters are linked through per-waiter nodes on the waiting coroutine's
 * stack; nothing here allocates. */
struct ioc_co_waiter;

/* Fair (FIFO) mutex with a lock-free uncontended path (one CAS to lock,
 * one atomic decrement to unlock); unlock hands the mutex straight to the
 * oldest waiter, which resumes on its own home loop, on any thread.
 * Zero-initialised memory is an unlocked mutex. */
struct ioc_co_mutex {
	_Atomic int locked;          /* private: holder + waiters */
	struct ioc_co *holder;       /* private */
	struct ioc_co_waiter *_Atomic from_push; /* private: arrivals, LIFO */
	struct ioc_co_waiter *to_pop;    /* private: arrivals, FIFO */
};
void ioc_co_mutex_init(struct ioc_co_mutex *m);
void ioc_coroutine_fn ioc_co_mutex_lock(struct ioc_co_mutex *m);
void ioc_coroutine_fn ioc_co_mutex_unlock(struct ioc_co_mutex *m);

/* A queue of waiting coroutines.  With a mutex, wait() drops it while
 * waiting and retakes it before returning (a condition variable).  Not
 * thread-safe by itself: callers serialise on that mutex (or use the queue
 * from one thread only).  next/restart_all wake through ioc_co_wake();
 * restart_all wakes the waiters queued when it was called, not those that
 * a directly entered waiter queues again. */
struct ioc_co_queue {
	struct ioc_co_waiter *head, *tail; /* private */
};
void ioc_co_queue_init(struct ioc_co_queue *q);
void ioc_coroutine_fn ioc_co_queue_wait(struct ioc_co_queue *q,
					struct ioc_co_mutex *m);
/* Wake the first waiter; returns false if there was none. */
bool ioc_co_queue_next(struct ioc_co_queue *q);
void ioc_co_queue_restart_all(struct ioc_co_queue *q);
bool ioc_co_queue_empty(const struct ioc_co_queue *q);

struct ioc_co_rwlock {
	struct ioc_co_mutex mutex; /* private */
	struct ioc_co_queue queue; /* private */
	int readers;               /* private */
	int pending_writers;       /* private: blocks new readers */
	bool writer;               /* private */
};
void ioc_co_rwlock_init(struct ioc_co_rwlock *l);
void ioc_coroutine_fn ioc_co_rwlock_rdlock(struct ioc_co_rwlock *l);
void ioc_coroutine_fn ioc_co_rwlock_wrlock(struct ioc_co_rwlock *l);
void ioc_coroutine_fn ioc_co_rwlock_unlock(struct ioc_co_rwlock *l);

/* An event (latch): set once, any thread; waiters resume; reset re-arms. */
struct ioc_co_event {
	/* private: NULL (clear), a list of waiters (clear), or the "set"
	 * marker */
	struct ioc_co_waiter *_Atomic head;
};
void ioc_co_event_init(struct ioc_co_event *e);
void ioc_co_event_set(struct ioc_co_event *e);
void ioc_co_event_reset(struct ioc_co_event *e);
bool ioc_co_event_is_set(struct ioc_co_event *e);
void ioc_coroutine_fn ioc_co_event_wait(struct ioc_co_event *e);

/* ---- pool ------------------------------------------------------------ */

struct ioc_co_pool_stats {
	uint64_t created;  /* stacks allocated */
	uint64_t reused;   /* creations served from a pool */
	uint64_t freed;    /* stacks released to the kernel */
	uint64_t pooled;   /* coroutines pooled now (all threads) */
	uint64_t max_pooled; /* the global bound in force */
	uint64_t reserved; /* slots reserved against the bound (>= pooled,
			    * <= max_pooled at every instant; pooled is a
			    * racy sum while threads run) */
};
/* All zero until the first coroutine is created. */
void ioc_co_pool_get_stats(struct ioc_co_pool_stats *st);

struct ioc_co_pool_opts {
	size_t stack_size;   /* default 1 MiB; rounded up to pages */
	unsigned batch_size; /* coroutines per global batch, default 16 */
	uint64_t max_pooled; /* 0 = default, derived from vm.max_map_count */
};
/* Tune the process-wide pool; call before creating coroutines.
 * Returns 0 or -EBUSY/-EINVAL.  max_pooled is clamped to
 * max_map_count / 4 / (VMAs per stack) and rounded down to whole batches;
 * the default is that or 4096, whichever is lower. */
int ioc_co_pool_configure(const struct ioc_co_pool_opts *opts);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_CO_H */
