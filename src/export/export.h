/*
 * Exports: the front ends that serve block nodes (QEMU's BlockExportDriver).
 * An export has an id, a type ("nbd", "vhost-user-blk"), the node it
 * serves (held with ioc_node_use(), so blockdev-del refuses it) and the
 * driver's state.  The daemon adds and deletes exports through here; a
 * driver never knows about the daemon, only the environment it is given.
 * Main thread only, but for what drivers run on their I/O threads.
 */
#ifndef IOC_EXPORT_H
#define IOC_EXPORT_H

#include <jansson.h>
#include <stdbool.h>

#include "iocore/loop.h"
#include "node/node.h"
#include "qmp/schema.h"

struct ioc_nbd_server;
struct ioc_export;

/* What the daemon lends its exports. */
struct ioc_export_env {
	struct ioc_node_graph *graph;
	struct ioc_loop *main_loop;
	/* The loop of the I/O thread object of that id, or NULL. */
	struct ioc_loop *(*iothread)(void *opaque, const char *id);
	void *opaque;
	/* The NBD server (nbd-server-start), or NULL when not running. */
	struct ioc_nbd_server *nbd;
	/* Where the NBD server's events (a migration's) go: the monitors
	 * (steals data, a json_t). */
	void (*event)(void *opaque, const char *name, void *data);
};

struct ioc_export_drv {
	const char *type;
	const struct ioc__qmp_arg *opts;   /* the type's own members */
	/* Serve ex->node as opts (checked) asks; ex->opaque is the driver's. */
	int (*create)(struct ioc_export *ex, json_t *opts, char *err, size_t errlen);
	/* Begin deleting: safe (-EBUSY while clients use it, err says so) or
	 * hard (they are disconnected).  The driver calls ioc_export_gone()
	 * once nothing of it runs any more, maybe before returning. */
	int (*del)(struct ioc_export *ex, bool hard, char *err, size_t errlen);
	/* Driver members for query-block-exports (NULL: none). */
	void (*info)(struct ioc_export *ex, json_t *obj);
	/* The node's size changed (block_resize): tell the client if the
	 * protocol can (NULL: it cannot; NBD clients learn it on reconnect). */
	void (*resized)(struct ioc_export *ex);
};

struct ioc_export {
	char *id;
	const struct ioc_export_drv *drv;
	struct ioc_node *node;
	struct ioc_export_env *env;
	bool writable;
	bool shutting_down;             /* deletion began */
	json_t *iothreads;              /* the I/O threads' ids (an array) */
	unsigned long seq;              /* the owner's creation order */
	void *opaque;                   /* the driver's */
	/* The owner's: the export is gone (BLOCK_EXPORT_DELETED); after it
	 * returns the export is freed. */
	void (*deleted)(struct ioc_export *ex, void *opaque);
	void *deleted_opaque;
};

/* BlockExportOptions as a spec: the common members and a union on "type". */
const struct ioc__qmp_arg *ioc_export_spec(void);
const struct ioc_export_drv *ioc_export_drv_find(const char *type);

/* block-export-add: check opts (flags: IOC_QMP_KEYVAL from the command
 * line), find the node, create.  The caller checks that the id is free. */
int ioc_export_add(struct ioc_export_env *env, json_t *opts, unsigned flags,
		   struct ioc_export **out, char *err, size_t errlen);
int ioc_export_del(struct ioc_export *ex, bool hard, char *err, size_t errlen);
/* Drivers: deletion is complete (releases the node, tells the owner,
 * frees ex).  Main thread. */
void ioc_export_gone(struct ioc_export *ex);
/* query-block-exports' entry (a new reference). */
json_t *ioc_export_info_json(struct ioc_export *ex);

extern const struct ioc_export_drv ioc__export_drv_nbd;
extern const struct ioc_export_drv ioc__export_drv_vhost_user_blk;

/* The NBD server: nbd-server-start's options (NbdServerOptions or the
 * legacy QMP form, addr as SocketAddress or SocketAddressLegacy),
 * already checked, with the credentials of its tls-creds (NULL: none;
 * TLS is then required, as QEMU's NBD server requires it) on iothreads
 * I/O threads of its own.  Started on the calling (main) loop. */
struct ioc_nbd_tls_opts;
int ioc_export_nbd_server_start(struct ioc_export_env *env, json_t *opts, bool legacy,
				const struct ioc_nbd_tls_opts *tls, unsigned iothreads,
				char *err, size_t errlen);
void ioc_export_nbd_server_stop(struct ioc_export_env *env);
/* export.c: QEMU's SocketAddress as every export type takes it: the
 * "type" tag, and the members of its unix and fd variants (those of inet
 * and vsock are the type's own).  An empty member list. */
extern const struct ioc__qmp_arg ioc__export_addr_base[];
extern const struct ioc__qmp_arg ioc__export_unix_members[];
extern const struct ioc__qmp_arg ioc__export_fd_members[];
extern const struct ioc__qmp_arg ioc__export_no_members[];

extern const struct ioc__qmp_arg ioc__export_nbd_server_opts[];
extern const struct ioc__qmp_arg ioc__export_nbd_server_legacy_opts[];

#endif /* IOC_EXPORT_H */
