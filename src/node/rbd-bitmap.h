/* Persistent dirty bitmaps of an rbd node, kept in the cluster
 * (rbd-bitmap.c).  Control thread only. */
#ifndef IOC_NODE_RBD_BITMAP_H
#define IOC_NODE_RBD_BITMAP_H

#include <stdbool.h>
#include <stddef.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <rados/librados.h>
#include <rbd/librbd.h>
#pragma GCC diagnostic pop

#include "iocore/pool.h"
#include "node/node.h"

enum rbd_bm_mode {
	RBD_BM_READ,     /* read-only node or snapshot: load, never write */
	RBD_BM_OWNER,    /* writable, the only writer: full persistence */
	RBD_BM_SHARED,   /* writable without the exclusive lock (lock=auto):
			  * loaded inconsistent, marked in use, nothing added */
};

struct rbd_bitmaps;

/* A call that waits on the cluster (a monitor that does not answer holds
 * rados_connect; an OSD that does not answer, a flush or a close, for
 * ever): on the loop's thread pool from a coroutine (a QMP command, the
 * main loop's hand-over coroutine), so that it holds only its caller and
 * the loop goes on; directly elsewhere (the command line, an exit).  arg
 * outlives the job (the coroutine waits for it).  Both rbd files use it. */
int ioc__rbd_blocking(ioc_pool_fn *fn, void *arg);

/* Load the image's bitmaps into a set that becomes n->dirty_set (n->size
 * set), and in OWNER/SHARED mode mark them in use in the cluster before
 * returning.  io is the bitmaps' own ioctx (the image's pool and
 * namespace), owned from here on (destroyed by _free), failure or not. */
int ioc__rbd_bitmaps_open(struct ioc_node *n, rados_t cluster, rados_ioctx_t io,
			  rbd_image_t image, enum rbd_bm_mode mode, struct rbd_bitmaps **out,
			  char *err, size_t errlen);
/* Clean close (no request runs): the bits written, in use cleared. */
int ioc__rbd_bitmaps_close(struct rbd_bitmaps *b);
void ioc__rbd_bitmaps_free(struct rbd_bitmaps *b);
/* A hand-over (no request runs): inactivate writes the bits back with in
 * use cleared, as a clean close does, and refuses every change until
 * activate, which marks them in use again once the object is found as
 * this node left it (-ESTALE when another client changed it meanwhile:
 * the bits here would miss its writes).  Both need the exclusive lock. */
int ioc__rbd_bitmaps_inactivate(struct rbd_bitmaps *b);
int ioc__rbd_bitmaps_activate(struct rbd_bitmaps *b, char *err, size_t errlen);
/* A resize: -EBUSY while the node has a bitmap, else the set follows. */
int ioc_coroutine_fn ioc__rbd_bitmaps_resize(struct rbd_bitmaps *b, uint64_t size);

#endif
