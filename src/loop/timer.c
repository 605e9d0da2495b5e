/*
 * Timers: an intrusive pairing heap keyed on the CLOCK_MONOTONIC deadline.
 *
 * Problem: QEMU keeps armed timers in a sorted list, so arming is O(n) in
 * the number of armed timers; a server with one request timeout per
 * in-flight request arms thousands.
 *
 * Design: a pairing heap threaded through struct ioc_timer itself (child,
 * sibling, prev), so arming never allocates.  Insert and meld are O(1),
 * delete-min is O(log n) amortised (two-pass pairing), cancel of an
 * arbitrary node is the same cut + delete-min of its subtree.  Re-arming is
 * cancel + insert.  Equal deadlines run in an unspecified order.
 *
 * Rejected: a binary heap in an array (needs allocation on arm and an index
 * in the timer to cancel); a timer wheel (O(1) but coarse, and the loop
 * needs the exact earliest deadline to choose its sleep).
 *
 * Cost notes: the loop reads the root on every iteration (O(1)).  A callback
 * that re-arms its timer in the past would run forever, so one pass runs at
 * most as many callbacks as there were armed timers when it started.
 */
#include <assert.h>

#include "loop-int.h"

static struct ioc_timer *meld(struct ioc_timer *a, struct ioc_timer *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (b->deadline < a->deadline) {
		struct ioc_timer *t = a;

		a = b;
		b = t;
	}
	/* b becomes a's first child. */
	b->prev = a;
	b->sibling = a->child;
	if (a->child)
		a->child->prev = b;
	a->child = b;
	return a;
}

/* Two-pass pairing of a sibling list into one heap. */
static struct ioc_timer *merge_pairs(struct ioc_timer *first)
{
	struct ioc_timer *acc = NULL, *root = NULL;

	/* Pass 1, left to right: meld pairs, stack the results on acc. */
	while (first) {
		struct ioc_timer *a = first, *b = a->sibling, *next = NULL, *m;

		if (b)
			next = b->sibling;
		a->sibling = a->prev = NULL;
		if (b)
			b->sibling = b->prev = NULL;
		m = meld(a, b);
		m->sibling = acc;
		acc = m;
		first = next;
	}
	/* Pass 2, right to left: meld the pairs into one heap. */
	while (acc) {
		struct ioc_timer *next = acc->sibling;

		acc->sibling = NULL;
		root = meld(root, acc);
		acc = next;
	}
	if (root)
		root->prev = NULL;
	return root;
}

static void heap_remove(struct ioc_loop *loop, struct ioc_timer *t)
{
	struct ioc_timer *sub;

	if (loop->timers == t) {
		loop->timers = merge_pairs(t->child);
	} else {
		/* Cut t (with its subtree) out of its parent's child list. */
		if (t->prev->child == t)
			t->prev->child = t->sibling;
		else
			t->prev->sibling = t->sibling;
		if (t->sibling)
			t->sibling->prev = t->prev;
		sub = merge_pairs(t->child);
		loop->timers = meld(loop->timers, sub);
	}
	t->child = t->sibling = t->prev = NULL;
	t->armed = false;
	loop->ntimers--;
}

void ioc_timer_init(struct ioc_timer *t, struct ioc_loop *loop,
		    ioc_timer_cb *cb, void *opaque)
{
	*t = (struct ioc_timer){ .loop = loop, .cb = cb, .opaque = opaque };
}

void ioc_timer_arm(struct ioc_timer *t, int64_t deadline_ns)
{
	struct ioc_loop *loop = t->loop;

	if (t->armed)
		heap_remove(loop, t);
	t->deadline = deadline_ns;
	t->child = t->sibling = t->prev = NULL;
	loop->timers = meld(loop->timers, t);
	t->armed = true;
	loop->ntimers++;
}

void ioc_timer_arm_in(struct ioc_timer *t, int64_t delay_ns)
{
	ioc_timer_arm(t, ioc_now_ns() + delay_ns);
}

void ioc_timer_cancel(struct ioc_timer *t)
{
	if (t->armed)
		heap_remove(t->loop, t);
}

int64_t ioc__timers_deadline(struct ioc_loop *loop)
{
	return loop->timers ? loop->timers->deadline : -1;
}

void ioc__timers_run(struct ioc_loop *loop, bool *progress)
{
	struct ioc_timer *t;
	unsigned budget;
	int64_t now;

	if (!loop->timers)
		return;
	now = ioc_now_ns();
	budget = loop->ntimers;
	while (budget-- && (t = loop->timers) && t->deadline <= now) {
		heap_remove(loop, t);
		t->cb(t->opaque);
		*progress = true;
	}
}

void ioc__timers_cancel_all(struct ioc_loop *loop)
{
	while (loop->timers)
		heap_remove(loop, loop->timers);
	assert(loop->ntimers == 0);
}
