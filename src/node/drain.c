/*
 * The drain: stop a node changing without failing its front ends' clients.
 *
 * Problem: a migration's switch-over, an export's deletion in "safe" mode
 * and a notifier's removal need a moment when no request is inside a node,
 * with new ones waiting (HOLD) or refused (SHUT), for every front end
 * alike; and every request of every I/O thread pays for that possibility.
 *
 * Design: n->gate (OPEN, HOLD, SHUT) is loaded relaxed once per request in
 * ioc_node_co_enter(); while it is OPEN that load and a plain increment of
 * the loop's slot count (slot->executing) are the whole cost.  A change
 * stores the state and posts slot->task to every loop attached to the
 * graph, then waits until each has applied it.  One relaxed load suffices:
 * the task runs on the loop after the post's release/acquire, so every
 * later load there reads the new state; a request that loaded OPEN before
 * the task ran has already incremented executing (no yield in between), so
 * the task sees it.  HOLD: the task reports when executing is 0, else sets
 * draining and the last ioc_node_leave() reports.  Held requests wait in
 * slot->held (a coroutine queue of that loop); OPEN and SHUT wake them and
 * they load the gate again.  A loop attaching during a change: the state
 * is stored under the graph's lock, which attaching takes, so the loop is
 * either posted to or reads the new state.  A change the front end makes
 * outside a request's coroutine (a payload received into the image's
 * mapping) enters without waiting (ioc_node_enter_cut()) and is cut short
 * by the task on HOLD or SHUT, so a drain never waits for a client that
 * stalls in the middle of a payload.
 *
 * Sleep/wake handshake of the changer: n->gate_applied, a latch
 * (util/latch.h) set before the posts, each posted loop reporting once;
 * the latch's mutex orders both sides, so no wakeup is lost.  A changer
 * on a loop that submits to the node (the hand-over's main loop) waits
 * from the loop's pool instead (ioc_node_co_hold()).
 *
 * Rejected: a reader count or rwlock per node (a line written by every
 * I/O thread on every request); failing requests during a switch-over.
 */
#include <errno.h>

#include "iocore/pool.h"
#include "node-int.h"
#include "util/list.h"

/* Each cut leaves (ioc_node_leave_cut()), unlinking itself only. */
static void cut_all(struct ioc_node_slot *s)
{
	for (struct ioc_node_cut *c = s->cuts, *next; c; c = next) {
		next = c->next;
		c->fn(c);
	}
}

static void gate_apply(struct ioc_task *task)
{
	struct ioc_node_slot *s = ioc_container_of(task, struct ioc_node_slot, task);
	struct ioc_node *n = s->node;
	/* Relaxed: ordered after the changer's store by the task's post. */
	int state = atomic_load_explicit(&n->gate, memory_order_relaxed);

	if (state != IOC_NODE_GATE_OPEN)
		cut_all(s);
	if (state == IOC_NODE_GATE_HOLD) {
		if (s->executing) {
			s->draining = true; /* the last leave reports */
			return;
		}
		ioc__latch_report(&n->gate_applied);
		return;
	}
	s->draining = false;
	ioc_co_queue_restart_all(&s->held);
	ioc__latch_report(&n->gate_applied);
}

void ioc__node_gate_init(struct ioc_node *n)
{
	atomic_init(&n->gate, IOC_NODE_GATE_OPEN);
	ioc__latch_init(&n->gate_applied);
	for (unsigned i = 0; i < IOC_NODE_MAX_SLOTS; i++) {
		n->slot[i].node = n;
		ioc_co_queue_init(&n->slot[i].held);
		n->slot[i].task.fn = gate_apply;
	}
}

void ioc__node_gate_destroy(struct ioc_node *n)
{
	ioc__latch_destroy(&n->gate_applied);
}

int ioc_coroutine_fn ioc_node_co_enter(struct ioc_node *n)
{
	struct ioc_node_slot *s = ioc__node_my_slot(n);

	if (!s)
		return atomic_load_explicit(&n->gate, memory_order_relaxed) ==
		       IOC_NODE_GATE_SHUT ? -ESHUTDOWN : 0;
	for (;;) {
		/* Relaxed: see the essay; after a wake, ordered by the waking
		 * task. */
		int state = atomic_load_explicit(&n->gate, memory_order_relaxed);

		if (ioc_likely(state == IOC_NODE_GATE_OPEN)) {
			s->executing++;
			return 0;
		}
		if (state == IOC_NODE_GATE_SHUT)
			return -ESHUTDOWN;
		ioc_co_queue_wait(&s->held, NULL);
	}
}

void ioc_node_leave(struct ioc_node *n)
{
	struct ioc_node_slot *s = ioc__node_my_slot(n);

	if (s && --s->executing == 0 && s->draining) {
		s->draining = false;
		ioc__latch_report(&n->gate_applied);
	}
}

bool ioc_node_enter_cut(struct ioc_node *n, struct ioc_node_cut *cut)
{
	struct ioc_node_slot *s = ioc__node_my_slot(n);
	/* Relaxed: as in ioc_node_co_enter(); a change is applied by
	 * gate_apply() on this loop, which then sees the cut. */
	int state = atomic_load_explicit(&n->gate, memory_order_relaxed);

	cut->slot = NULL;
	if (state != IOC_NODE_GATE_OPEN)
		return false;
	if (!s)
		return true;
	s->executing++;
	cut->slot = s;
	IOC__LIST_PUSH(s->cuts, cut, prev, next);
	return true;
}

void ioc_node_leave_cut(struct ioc_node *n, struct ioc_node_cut *cut)
{
	struct ioc_node_slot *s = cut->slot;

	if (!s)
		return;
	IOC__LIST_UNLINK(s->cuts, cut, prev, next);
	cut->slot = NULL;
	ioc_node_leave(n);
}

void ioc_node_set_gate(struct ioc_node *n, int state)
{
	struct ioc_node_graph *g = n->graph;
	struct ioc_loop *self = ioc_loop_current();
	unsigned posted = 0;

	/* More than any count of loops, until the count is known. */
	ioc__latch_set(&n->gate_applied, IOC_NODE_MAX_SLOTS + 1);
	pthread_mutex_lock(&g->lock);
	/* Relaxed: published to each loop by its post (and to loops that
	 * attach later by g->lock). */
	atomic_store_explicit(&n->gate, state, memory_order_relaxed);
	for (unsigned i = 0; i < g->nslots; i++) {
		if (!g->loops[i] || g->loops[i] == self)
			continue;
		ioc_loop_post(g->loops[i], &n->slot[i].task);
		posted++;
	}
	pthread_mutex_unlock(&g->lock);
	ioc__latch_wait(&n->gate_applied, IOC_NODE_MAX_SLOTS + 1 - posted);
	/* The caller's own loop, if it is attached, applies the change here:
	 * it has no request inside (it could not be blocked in here), but
	 * may have cuts. */
	for (unsigned i = 0; self && i < g->nslots; i++) {
		if (g->loops[i] == self && state != IOC_NODE_GATE_OPEN)
			cut_all(&n->slot[i]);
		if (g->loops[i] == self && state != IOC_NODE_GATE_HOLD) {
			n->slot[i].draining = false;
			ioc_co_queue_restart_all(&n->slot[i].held);
		}
	}
}

static int64_t hold_fn(void *arg)
{
	ioc_node_set_gate(arg, IOC_NODE_GATE_HOLD);
	return 0;
}

void ioc_coroutine_fn ioc_node_co_hold(struct ioc_node *n)
{
	n->changing = true;
	(void)ioc_pool_co_run(NULL, hold_fn, n);
	n->changing = false;
}
