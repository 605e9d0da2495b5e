/*
 * A node's image handed to another host and taken back: the node layer's
 * side of a hand-over migration, where both hosts open one image on
 * shared storage (an rbd image) and no data is copied.
 *
 * Problem: two hosts that both write an image, or both keep its
 * persistent bitmaps, corrupt it; the one that lets go must first make
 * what it wrote durable and its bitmaps whole in the shared store, and
 * must then not change the image by accident (a request that slipped
 * past the front end, a resize from the control socket).
 *
 * Design: the driver does the storage's part (inactivate: flush, write
 * the bitmaps back with in use cleared, release the exclusive lock;
 * activate: take the lock, load the bitmaps again and mark them in use)
 * and this file keeps the node's state, n->inactive, which the I/O path
 * checks on every change (node.c, check_change()): an inactive node
 * answers writes, write-zeroes, discards and resizes -EROFS, whoever
 * sends them.  The state is stored only here, on the main thread, with
 * no request inside the node (the caller holds its gate or serves it not
 * yet), so a relaxed load on the I/O path is enough: the drain that
 * emptied the node orders this store before any later request.  Called
 * in a coroutine, the driver may sleep in its storage's calls (on the
 * loop's thread pool) while the main loop goes on: n->changing says so
 * meanwhile, refusing a second change and the bitmap commands.
 *
 * Rejected: a read-only flag flipped at run time (read-only is the
 * user's choice and shows in queries; inactive is the job's); keeping the
 * gate shut while inactive instead (a destination that opened the node
 * inactive has no gate change to make, and reads stay possible).
 */
#include <errno.h>
#include <stdio.h>

#include "node-int.h"

const char *ioc_node_shared_id(struct ioc_node *n)
{
	return n->drv->shared_id ? n->drv->shared_id(n) : NULL;
}

bool ioc_node_is_active(struct ioc_node *n)
{
	/* Relaxed: see struct ioc_node's inactive. */
	return !atomic_load_explicit(&n->inactive, memory_order_relaxed);
}

bool ioc_node_is_changing(struct ioc_node *n)
{
	return n->changing;
}

/* Both directions: the driver's half, then the node's state; active is
 * the state to leave the node in. */
static int set_active(struct ioc_node *n, bool active, char *err, size_t errlen)
{
	int ret;

	if (!n->drv->inactivate || !n->drv->activate) {
		snprintf(err, errlen, "Node '%s' (driver %s) cannot be handed over", n->name,
			 n->drv->name);
		return -ENOTSUP;
	}
	if (ioc_node_is_active(n) == active) {
		snprintf(err, errlen, "Node '%s' is %s already", n->name,
			 active ? "active" : "inactive");
		return -EALREADY;
	}
	if (n->changing) {
		snprintf(err, errlen, "Node '%s' is changing hands already", n->name);
		return -EBUSY;
	}
	n->changing = true;
	ret = active ? n->drv->activate(n, err, errlen) : n->drv->inactivate(n, err, errlen);
	n->changing = false;
	if (ret == 0)
		/* Relaxed: see the essay. */
		atomic_store_explicit(&n->inactive, !active, memory_order_relaxed);
	return ret;
}

int ioc_node_inactivate(struct ioc_node *n, char *err, size_t errlen)
{
	return set_active(n, false, err, errlen);
}

int ioc_node_activate(struct ioc_node *n, char *err, size_t errlen)
{
	return set_active(n, true, err, errlen);
}
