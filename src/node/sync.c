/*
 * Node requests from a plain thread (node.h, "From a thread without a
 * loop").  Problem: the node API is coroutine code on a loop, and some
 * callers are threads that block by design (a migration receiver's reader
 * and its workqueue workers), each wanting one request done before it
 * goes on.
 *
 * Design: the caller posts a task (on its own stack) to a loop that
 * another thread runs; the task makes a coroutine there (home: that loop)
 * and enters it; the coroutine runs the request to its end, yielding on
 * the loop as any request does, stores the result and wakes the caller.
 * Many callers may each have a request in flight on one loop at once, and
 * one caller several (post now, wait later): they are separate coroutines,
 * so a file node's writes overlap in io_uring.
 *
 * Sleep/wake: the caller sleeps in FUTEX_WAIT only while done is 0 (the
 * kernel checks that against the sleep atomically); the coroutine stores
 * done = 1 with release, pairing with the caller's acquire load (which
 * then sees ret and whatever the request wrote into the caller's memory),
 * then FUTEX_WAKEs.  After that store the caller may return and the call
 * be gone: FUTEX_WAKE uses only the address, and the coroutine touches
 * nothing of the call after it.  The task itself is the loop's handoff
 * (loop.h's lifetime rule): the loop is not freed while a caller waits,
 * as the caller owns it or knows its owner waits for it.
 *
 * Rejected: ioc_loop_call() (its function must not yield, a request does);
 * a coroutine per caller thread, woken for each request (the same hops, a
 * wake protocol of our own); a condition variable (a mutex round trip on
 * both sides for one word the futex already watches).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "node.h"

static void finish(struct ioc_node_call *c, int ret)
{
	c->ret = ret;
	/* Release: pairs with the acquire load in ioc_node_call_wait(); c may
	 * be gone once it is visible. */
	atomic_store_explicit(&c->done, 1, memory_order_release);
	syscall(SYS_futex, &c->done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void ioc_coroutine_fn call_co(void *opaque)
{
	struct ioc_node_call *c = opaque;

	finish(c, c->fn(c->arg));
}

/* On the loop's thread, outside any coroutine. */
static void call_task(struct ioc_task *task)
{
	struct ioc_node_call *c = ioc_container_of(task, struct ioc_node_call, task);
	struct ioc_co *co = ioc_co_create(call_co, c);

	if (!co) {
		finish(c, -ENOMEM);
		return;
	}
	ioc_co_enter(co);
}

void ioc_node_call_post(struct ioc_loop *loop, struct ioc_node_call *c,
			int (*fn)(void *arg), void *arg)
{
	c->task.fn = call_task;
	c->fn = fn;
	c->arg = arg;
	c->ret = 0;
	atomic_init(&c->done, 0);
	ioc_loop_post(loop, &c->task);
}

int ioc_node_call_wait(struct ioc_node_call *c)
{
	/* Sleep/wake: see the top of the file. */
	while (!atomic_load_explicit(&c->done, memory_order_acquire))
		syscall(SYS_futex, &c->done, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
	return c->ret;
}

int ioc_node_call_co(struct ioc_loop *loop, int (*fn)(void *arg), void *arg)
{
	struct ioc_node_call c;

	ioc_node_call_post(loop, &c, fn, arg);
	return ioc_node_call_wait(&c);
}

static int ioc_coroutine_fn req_fn(void *arg)
{
	struct ioc_node_req *r = arg;

	switch (r->op) {
	case IOC_NODE_OP_WRITE:
		return ioc_node_co_pwrite(r->n, r->off, r->buf, (size_t)r->len, r->flags);
	case IOC_NODE_OP_ZERO:
		return ioc_node_co_write_zeroes(r->n, r->off, r->len, r->flags);
	case IOC_NODE_OP_FLUSH:
		return ioc_node_co_flush(r->n, r->flags);
	default:
		return ioc_node_co_truncate(r->n, r->len);
	}
}

int ioc_node_pwrite_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t off,
			 const void *buf, size_t len, uint32_t flags)
{
	struct ioc_node_req r = { n, IOC_NODE_OP_WRITE, off, len, buf, flags };

	return ioc_node_call_co(loop, req_fn, &r);
}

void ioc_node_pwrite_post(struct ioc_loop *loop, struct ioc_node_call *c,
			  struct ioc_node *n, uint64_t off, const void *buf, size_t len,
			  uint32_t flags)
{
	c->req = (struct ioc_node_req){ n, IOC_NODE_OP_WRITE, off, len, buf, flags };
	ioc_node_call_post(loop, c, req_fn, &c->req);
}

int ioc_node_write_zeroes_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t off,
			       uint64_t len, uint32_t flags)
{
	struct ioc_node_req r = { n, IOC_NODE_OP_ZERO, off, len, NULL, flags };

	return ioc_node_call_co(loop, req_fn, &r);
}

int ioc_node_flush_sync(struct ioc_loop *loop, struct ioc_node *n)
{
	struct ioc_node_req r = { n, IOC_NODE_OP_FLUSH, 0, 0, NULL, 0 };

	return ioc_node_call_co(loop, req_fn, &r);
}

int ioc_node_truncate_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t size)
{
	/* IOC_NODE_OP_N stands for truncate (no counted kind of its own). */
	struct ioc_node_req r = { n, IOC_NODE_OP_N, 0, size, NULL, 0 };

	return ioc_node_call_co(loop, req_fn, &r);
}
