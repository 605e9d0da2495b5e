/*
 * Private interface between the node layer's files: the graph (graph.c),
 * the I/O path (node.c), the drain (drain.c) and the drivers.
 */
#ifndef IOC_NODE_INT_H
#define IOC_NODE_INT_H

#include "node.h"

struct ioc_node_graph {
	/* Never the same for two graphs of a process, even at one address:
	 * what a thread's cached slot index is keyed by (node.c, "Slots"). */
	uint64_t gen;
	pthread_mutex_t lock;           /* loops[] (attach from any loop) */
	struct ioc_loop *loops[IOC_NODE_MAX_SLOTS];
	unsigned nslots;                /* loops[] used up to here */
	struct ioc_node **nodes;        /* creation order; main thread */
	unsigned nnodes, cap;
	unsigned implicit;              /* the N of the next "#blockN" */
};

extern const struct ioc_node_drv ioc__node_drv_file;
extern const struct ioc_node_drv ioc__node_drv_host_device;
extern const struct ioc_node_drv ioc__node_drv_null_co;
extern const struct ioc_node_drv ioc__node_drv_raw;
extern const struct ioc_node_drv ioc__node_drv_zip;
extern const struct ioc_node_drv ioc__node_drv_zip_overlay;
extern const struct ioc_node_drv ioc__node_drv_qcow2;

/* node.c: the calling loop's slot of n (NULL: not counted). */
struct ioc_node_slot *ioc__node_my_slot(struct ioc_node *n);
/* node.c: nt off n's list, false when it was not on it; no drain, so for
 * ioc_node_remove_notifier() and for drivers closing with no request left. */
bool ioc__node_unlink_notifier(struct ioc_node *n, struct ioc_node_notifier *nt);
/* node.c: a notifier fn for drivers with bitmaps of their own: marks each
 * write's range, failed ones too, in n->dirty_set. */
int ioc__node_mark_dirty_set(struct ioc_node_notifier *nt, struct ioc_node *n,
			     enum ioc_node_op op, uint64_t off, uint64_t len, int ret);

/* graph.c: a node of drv with the defaults and no driver state yet
 * (name NULL: implicit), one reference; NULL when out of memory. */
struct ioc_node *ioc__node_new(struct ioc_node_graph *g, const struct ioc_node_drv *drv,
			       const char *name);

/* drain.c: set up and tear down a node's gate. */
void ioc__node_gate_init(struct ioc_node *n);
void ioc__node_gate_destroy(struct ioc_node *n);

/* graph.c: n's file name, a copy of path that the node frees. */
void ioc__node_set_filename(struct ioc_node *n, const char *path);

/* Helpers for drivers: a JSON member or a default. */
const char *ioc__node_opt_str(json_t *opts, const char *key, const char *dflt);
bool ioc__node_opt_bool(json_t *opts, const char *key, bool dflt);
int64_t ioc__node_opt_int(json_t *opts, const char *key, int64_t dflt);
/* Single-buffer I/O for drivers with such an interface: the iovec as one
 * buffer, bounced when there are several. */
void *ioc__node_iov_flat(const struct iovec *iov, int iovcnt, size_t len, bool *bounced);
void ioc__node_iov_scatter(const struct iovec *iov, int iovcnt, const void *buf,
			   size_t len);

#endif /* IOC_NODE_INT_H */
