/*
 * The vhost-user-blk export: serves a block node to a VM's virtio-blk
 * device through a vhost-user front end (QEMU's vhost-user-blk-pci) on a
 * Unix socket.  One front end at a time; when it goes, the export starts
 * over and waits for the next.
 *
 * Threads: create, query and free on the control loop's thread (the
 * daemon's main loop), outside the data path.  Queue i runs on
 * loops[i % nloops], each a running loop (an I/O thread's) that outlives
 * the export.  Private to the daemon layers: not part of libiocore's API.
 */
#ifndef IOC_VHOST_USER_BLK_H
#define IOC_VHOST_USER_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "iocore/loop.h"

struct ioc_node;
struct ioc__vub_export;

#define IOC_VUB_MAX_QUEUES 64
#define IOC_VUB_SERIAL_MAX 20            /* VIRTIO_BLK_ID_BYTES */

struct ioc__vub_opts {
	const char *id;                  /* for log lines ("" when NULL) */
	/* Referenced for the export's life; marking it in use (blockdev-del
	 * refuses it) is the caller's, as the export layer does. */
	struct ioc_node *node;
	/* Where the front end connects: a path to bind (a stale socket
	 * there is replaced), or, when path is NULL, a listening Unix
	 * socket (listen_fd >= 0) the export takes over and closes. */
	const char *socket_path;
	int listen_fd;
	bool writable;                   /* false: VIRTIO_BLK_F_RO */
	uint32_t logical_block_size;     /* 512 (0) .. 65536, a power of two */
	unsigned num_queues;             /* 1 (0) .. IOC_VUB_MAX_QUEUES */
	const char *serial;              /* GET_ID (at most 20 bytes; NULL: "") */
	/* I/O threads' loops; none: every queue on the control loop. */
	struct ioc_loop *const *loops;
	unsigned nloops;
	/* The control loop (messages, the socket); NULL: the caller's. */
	struct ioc_loop *ctrl_loop;
	/* Log lines (no newline); NULL: stderr.  Control loop's thread, or
	 * a queue's loop thread for a faulty ring. */
	void (*log)(void *opaque, const char *line);
	void *log_opaque;
};

/* 0, or -errno with err filled (the message QEMU would give). */
int ioc__vub_export_new(struct ioc__vub_export **out, const struct ioc__vub_opts *o,
			char *err, size_t errlen);
/* Begin deleting: stop listening and disconnect the front end (its
 * in-flight requests complete first).  done(opaque) runs on the control
 * loop once nothing of the export runs any more and it is freed, maybe
 * before this returns (no front end connected). */
void ioc__vub_export_close(struct ioc__vub_export *e, void (*done)(void *opaque),
			   void *opaque);
/* close() and wait for it: from a coroutine by yielding; from a loop
 * callback or plain code on the control loop's thread, by polling it. */
void ioc__vub_export_free(struct ioc__vub_export *e);

/* GET_ID's answer from now on. */
void ioc__vub_export_set_serial(struct ioc__vub_export *e, const char *serial);

/* Tell the front end the config space changed (the capacity after a
 * resize: GET_CONFIG reads the node's size), on the back-end channel when
 * it gave one (SET_BACKEND_REQ_FD).  0, -ENOTCONN (no front end or no
 * channel), or the send's -errno. */
int ioc__vub_export_config_changed(struct ioc__vub_export *e);

struct ioc__vub_info {
	bool connected;                  /* a front end is on the socket */
	unsigned num_queues;
	unsigned queues_started;
	uint64_t features;               /* acknowledged by the front end */
	uint64_t protocol_features;
	uint64_t connections;            /* accepted since creation */
	uint64_t requests;               /* virtio-blk requests completed */
	uint64_t queue_requests[IOC_VUB_MAX_QUEUES];   /* ... per queue */
	const char *socket_path;         /* NULL when given a listening fd */
};
void ioc__vub_export_info(struct ioc__vub_export *e, struct ioc__vub_info *info);

#endif /* IOC_VHOST_USER_BLK_H */
