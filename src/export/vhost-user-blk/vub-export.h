/*
 * vhost-user-blk export internals shared by blk.c, queue.c, dev.c and
 * export.c (the layers that serve a node; msg.c and vring.c need only
 * vub-int.h).
 */
#ifndef IOC_VUB_EXPORT_H
#define IOC_VUB_EXPORT_H

#include "vub-int.h"
#include "node/node.h"
#include "vhost-user-blk.h"

struct ioc__vub_queue;

/* One virtio-blk request, from pop to push; a slot of its queue. */
struct ioc__vub_req {
	struct ioc__vub_queue *q;
	struct ioc__vub_req *next_free;
	struct ioc__vub_elem e;
	struct iovec data[VUB_REQ_IOV];  /* e's data bytes, header/status cut */
};

/*
 * A virtqueue and its data path.  The fields above "loop-private" are
 * written by the control coroutine while the queue is stopped (it moved
 * to the queue's loop to stop it, so the loop saw every write before);
 * the rest only on the queue's loop.
 */
struct ioc__vub_queue {
	struct ioc__vub_export *exp;
	unsigned index;
	struct ioc_loop *loop;
	struct ioc__vub_vring vr;        /* num, addresses, base, call_fd */
	int kick_fd, err_fd;             /* -1: none (NOFD kick: polled) */
	bool kick_set;                   /* SET_VRING_KICK came (fd or NOFD) */
	bool want_enable;                /* SET_VRING_ENABLE's last word */
	bool running;                    /* started, as the control thread
					  * last saw it (for the info) */

	/* loop-private */
	bool started, enabled, starved;
	struct ioc__vub_req *reqs, *free;
	unsigned nreqs, inflight;
	struct ioc_co *drain_waiter;     /* woken at inflight == 0 */
	struct ioc_bh *flush_bh;
	bool flush_pending;
	struct ioc_timer nofd_timer;
	_Atomic uint64_t completed;      /* relaxed: statistics */
	/* Heads in flight before a restart, taken before the avail ring. */
	struct ioc__vub_resubmit *resubmit;
	unsigned nresubmit, resubmit_pos, resubmit_cap;
};

struct ioc__vub_export {
	char id[64];
	struct ioc_node *node;
	struct ioc_loop *ctrl;
	int listen_fd;
	char *socket_path;
	bool read_only;
	uint32_t lbs;
	unsigned num_queues;
	char serial[IOC_VUB_SERIAL_MAX];
	_Atomic bool wce;                /* relaxed: the guest's cache mode */
	/* A file the front end passed shrank under its mapping (guard.c
	 * sets it in its SIGBUS handler; queues stop on it); cleared when
	 * the connection's mappings are gone.  Relaxed. */
	_Atomic bool mem_shrunk;
	uint64_t features, protocol_features;   /* offered */
	void (*log)(void *opaque, const char *line);
	void *log_opaque;

	struct ioc__vub_conn *conn;      /* control thread */
	bool closing;                    /* close() began */
	void (*done)(void *opaque);      /* ... and wants to hear the end */
	void *done_opaque;
	uint64_t connections;
	struct ioc__vub_queue q[];
};

struct ioc__vub_conn {
	struct ioc__vub_export *exp;
	int fd;
	uint64_t features, protocol_features;   /* acknowledged */
	/* SET_INFLIGHT_FD's region: inflight_nq queues of inflight_qbytes
	 * each from inflight_base, rings of up to inflight_qsize entries. */
	void *inflight_map;
	size_t inflight_map_len;
	uint8_t *inflight_base;
	unsigned inflight_nq, inflight_qsize;
	uint64_t inflight_qbytes;
	int inflight_guard;              /* guard.c's slot + 1; 0: none */
	struct ioc__vub_mem *mem;
	int backend_fd;
	struct ioc__vub_log *log;        /* SET_LOG_BASE's bitmap, or NULL */
	int log_fd;                      /* SET_LOG_FD's eventfd (kept, unused) */
};

void ioc__vub_log(struct ioc__vub_export *e, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* guard.c: a mapping of a front end's file [map, map + len) whose
 * truncation sets *flag instead of killing the process.  Returns the
 * slot + 1 to give back to ioc__vub_guard_del() before the unmap, or 0
 * when it cannot be guarded (the table is full, no handler); g == 0 is
 * a no-op. */
int ioc__vub_guard_add(void *map, size_t len, _Atomic bool *flag);
void ioc__vub_guard_del(int g);

/* blk.c: run one popped request (in a new coroutine); the slot goes back
 * to the queue through ioc__vub_queue_complete(). */
void ioc__vub_blk_start(struct ioc__vub_req *r);
void ioc__vub_blk_config(struct ioc__vub_export *e, struct virtio_blk_config *cfg);

/* queue.c: the data path; every call on the queue's loop, and the ones
 * marked ioc_coroutine_fn from the control coroutine moved there. */
int ioc__vub_queue_init(struct ioc__vub_queue *q);
void ioc__vub_queue_fini(struct ioc__vub_queue *q);
void ioc__vub_queue_complete(struct ioc__vub_req *r, uint32_t used_len);
int ioc_coroutine_fn ioc__vub_queue_start(struct ioc__vub_queue *q,
					  const struct ioc__vub_mem *mem);
void ioc_coroutine_fn ioc__vub_queue_stop(struct ioc__vub_queue *q);
/* Pause, wait for in-flight requests, re-map under mem, resume. */
void ioc_coroutine_fn ioc__vub_queue_remap(struct ioc__vub_queue *q,
					   const struct ioc__vub_mem *mem);
void ioc_coroutine_fn ioc__vub_queue_set_call(struct ioc__vub_queue *q, int fd);
void ioc_coroutine_fn ioc__vub_queue_set_enable(struct ioc__vub_queue *q, bool on);

/* dev.c: one message; < 0 ends the connection (logged). */
int ioc_coroutine_fn ioc__vub_dev_dispatch(struct ioc__vub_conn *c,
					   struct ioc__vub_msg *m);
/* Stop every queue, unmap guest memory, close the fds: the state of a
 * device no front end has touched. */
void ioc_coroutine_fn ioc__vub_dev_reset(struct ioc__vub_conn *c);
/* Move the calling (control) coroutine to q's loop, and back. */
void ioc_coroutine_fn ioc__vub_to_queue(struct ioc__vub_queue *q);
void ioc_coroutine_fn ioc__vub_to_ctrl(struct ioc__vub_export *e);

#endif /* IOC_VUB_EXPORT_H */
