/*
 * The storage daemon: owns the node graph, the exports, the I/O thread and
 * TLS objects and the QMP monitors, and answers qemu-storage-daemon's
 * commands over them.  The command line is the same commands: --blockdev
 * is blockdev-add, --export is block-export-add, and so on, run through
 * the one table (ioc_daemon_run()).  Main loop thread only.
 */
#ifndef IOC_DAEMON_H
#define IOC_DAEMON_H

#include <jansson.h>
#include <stdbool.h>

#include "export/export.h"
#include "migrate/migrate.h"
#include "nbd/nbd.h"
#include "iocore/loop.h"
#include "node/dirty-cmd.h"
#include "node/node.h"
#include "qmp/qmp.h"

struct ioc_daemon;

struct ioc_daemon_opts {
	struct ioc_loop *loop;          /* the main loop (the caller runs it) */
	/* quit over QMP: the caller stops the daemon as on SIGTERM. */
	void (*quit)(void *opaque);
	void *opaque;
	unsigned nbd_iothreads;         /* the NBD server's threads; 0 = CPUs */
	void (*log)(void *opaque, const char *msg);
};

int ioc_daemon_new(struct ioc_daemon **out, const struct ioc_daemon_opts *opts);
/* Stop every export (hard), the NBD server and the monitors; close the
 * nodes and the objects. */
void ioc_daemon_free(struct ioc_daemon *d);

/* Run one command of the table (args already parsed; flags IOC_QMP_KEYVAL
 * when they came from the command line's key=value syntax).  Returns the
 * result (a new reference) or NULL with err's class and text set. */
json_t *ioc_daemon_run(struct ioc_daemon *d, const char *cmd, json_t *args, unsigned flags,
		       struct ioc__qmp_err *err);

/* --chardev socket,id=ID,path=P,server=on,wait=off: a listening socket
 * that --monitor chardev=ID serves QMP on.  opts as parsed (keyval). */
int ioc_daemon_chardev_add(struct ioc_daemon *d, json_t *opts, char *err, size_t errlen);
int ioc_daemon_monitor_add(struct ioc_daemon *d, json_t *opts, char *err, size_t errlen);

/* The command table's specs for the command line's option groups. */
const struct ioc__qmp_arg *ioc_daemon_object_spec(void);

/* ---- private to src/daemon: the areas' handlers ------------------------ */

/*
 * What the commands every control socket of iocore shares (cmd-core.c)
 * ask of the socket's owner: the storage daemon, or iocore-nbd's control
 * socket (nbd-control.c).  The first member of the owner, so that one
 * handler's ctx is both; it starts with the bitmap commands' ctx.
 */
struct ioc__daemon_ctl {
	struct ioc_node_dirty_ctx dirty;
	const struct ioc__qmp_cmd *cmds; /* the socket's table, for query-commands */
	size_t ncmds;
	char package[64];                /* query-version and the greeting */
	int version[3];
	void (*quit)(void *opaque);      /* quit (may be NULL) */
	void *quit_opaque;
	/* The nodes query-named-block-nodes and query-blockstats report: up
	 * to max into out[], how many written; children: list each node's
	 * unnamed children after it, as QEMU lists a graph. */
	unsigned (*nodes)(struct ioc__daemon_ctl *c, struct ioc_node **out, unsigned max);
	bool children;
	/* query-block-exports' list (a new reference, or NULL). */
	json_t *(*exports)(struct ioc__daemon_ctl *c);
	/* The NBD server the migration commands run on and whose clients
	 * __org.iocore_query-connections lists, or NULL when none runs
	 * ("NBD server not running"). */
	struct ioc_nbd_server *(*nbd)(struct ioc__daemon_ctl *c);
};

/* Fill package ("PROG VERSION") and version from IOC_VERSION. */
void ioc__daemon_ctl_init(struct ioc__daemon_ctl *c, const char *prog);
/* Serve c's table as QMP on the listening socket fd (the server's once
 * this succeeds) on loop. */
int ioc__daemon_ctl_serve(struct ioc__daemon_ctl *c, struct ioc_loop *loop, int fd,
			  struct ioc__qmp **out);

/* cmd-core.c: the shared commands, each a table entry (ctx: a struct
 * ioc__daemon_ctl). */
ioc__qmp_fn ioc__daemon_cmd_query_version, ioc__daemon_cmd_query_commands,
	    ioc__daemon_cmd_quit, ioc__daemon_cmd_query_nodes,
	    ioc__daemon_cmd_query_blockstats, ioc__daemon_cmd_query_exports,
	    ioc__daemon_cmd_query_connections;
extern const struct ioc__qmp_arg ioc__daemon_args_caps[], ioc__daemon_args_nodes[],
	ioc__daemon_args_blockstats[];
#define IOC_DAEMON_CORE_CMDS                                                       \
	{ "qmp_capabilities", NULL, ioc__daemon_args_caps },                       \
	{ "query-version", ioc__daemon_cmd_query_version, NULL },                  \
	{ "query-commands", ioc__daemon_cmd_query_commands, NULL },                \
	{ "quit", ioc__daemon_cmd_quit, NULL }
#define IOC_DAEMON_CMD_QUERY_NODES                                                 \
	{ "query-named-block-nodes", ioc__daemon_cmd_query_nodes, ioc__daemon_args_nodes }
#define IOC_DAEMON_CMD_QUERY_BLOCKSTATS                                            \
	{ "query-blockstats", ioc__daemon_cmd_query_blockstats, ioc__daemon_args_blockstats }
#define IOC_DAEMON_CMD_QUERY_EXPORTS                                               \
	{ "query-block-exports", ioc__daemon_cmd_query_exports, NULL }
/* The NBD server's clients (c->nbd(c)'s; none without a server). */
#define IOC_DAEMON_CMD_QUERY_CONNECTIONS                                           \
	{ "__org.iocore_query-connections", ioc__daemon_cmd_query_connections, NULL }

struct ioc_daemon_object {
	char *id;
	const char *type;               /* "iothread", "tls-creds-x509", ... */
	struct ioc_iothread *iothread;  /* iothread */
	char *dir;                      /* tls-creds-* */
	bool verify_peer, server;
	char *psk_file;                 /* tls-creds-psk: DIR/keys.psk */
	unsigned users;                 /* the NBD server's tls-creds */
};

#define IOC_DAEMON_MAX_OBJECTS  64
#define IOC_DAEMON_MAX_EXPORTS  1024
#define IOC_DAEMON_MAX_MONITORS 16

/* The index of the first empty (NULL) entry of the pointer array arr
 * (a daemon's objects or exports), or -1 when every entry is taken. */
#define IOC__DAEMON_FREE_SLOT(arr) __extension__({                           \
	int slot_ = -1;                                                        \
	for (int i_ = 0; i_ < (int)IOC_ARRAY_SIZE(arr) && slot_ < 0; i_++)     \
		if (!(arr)[i_])                                                \
			slot_ = i_;                                            \
	slot_;                                                                 \
})

struct ioc_daemon {
	struct ioc__daemon_ctl ctl;     /* first: the shared commands' ctx */
	struct ioc_daemon_opts opts;
	struct ioc_node_graph *graph;
	struct ioc_export_env env;
	struct ioc_daemon_object *objects[IOC_DAEMON_MAX_OBJECTS];
	struct ioc_export *exports[IOC_DAEMON_MAX_EXPORTS];
	struct ioc__qmp *monitors[IOC_DAEMON_MAX_MONITORS];
	unsigned nmonitors;
	struct { char *id; int fd; char *path; } chardevs[IOC_DAEMON_MAX_MONITORS];
	unsigned nchardevs;
	unsigned long export_seq;       /* creation order of exports */
	struct ioc_daemon_object *nbd_tls;  /* the NBD server's credentials */
};

typedef json_t *ioc_daemon_fn(struct ioc_daemon *d, json_t *args, struct ioc__qmp_err *err);

/* An event to every monitor (steals data). */
void ioc__daemon_event(struct ioc_daemon *d, const char *name, json_t *data);
struct ioc_daemon_object *ioc__daemon_object_find(struct ioc_daemon *d, const char *id);

/* cmd-block.c: the node named node, for the bitmap commands (ioc_node_dirty_ctx). */
struct ioc_node *ioc__daemon_find_node(void *ctx, const char *node);
extern const struct ioc__qmp_cmd ioc__daemon_block_cmds[];
/* cmd-export.c */
extern const struct ioc__qmp_cmd ioc__daemon_export_cmds[];
/* query-block-exports of the daemon: newest first. */
json_t *ioc__daemon_exports_json(struct ioc__daemon_ctl *c);
void ioc__daemon_exports_stop(struct ioc_daemon *d);
/* --nbd-server: NbdServerOptions, the flat SocketAddress (keyval). */
int ioc__daemon_nbd_server_start(struct ioc_daemon *d, json_t *args, char *err,
				 size_t errlen);
/* cmd-migrate.c: live migration's commands (src/migrate) on the node
 * c->nbd(c) exports, for either socket. */
ioc__qmp_fn ioc__daemon_mig_set_caps, ioc__daemon_mig_query_caps, ioc__daemon_mig_set_params,
	    ioc__daemon_mig_query_params, ioc__daemon_mig_migrate, ioc__daemon_mig_query,
	    ioc__daemon_mig_continue, ioc__daemon_mig_cancel, ioc__daemon_mig_incoming;
#define IOC_DAEMON_MIG_CMDS                                                          \
	{ "migrate-set-capabilities", ioc__daemon_mig_set_caps, ioc__mig_args_caps },   \
	{ "query-migrate-capabilities", ioc__daemon_mig_query_caps, NULL },                \
	{ "migrate-set-parameters", ioc__daemon_mig_set_params, ioc__mig_args_params }, \
	{ "query-migrate-parameters", ioc__daemon_mig_query_params, NULL },                \
	{ "migrate", ioc__daemon_mig_migrate, ioc__mig_args_migrate },                  \
	{ "query-migrate", ioc__daemon_mig_query, NULL },                                  \
	{ "migrate-continue", ioc__daemon_mig_continue, ioc__mig_args_continue },       \
	{ "migrate_cancel", ioc__daemon_mig_cancel, NULL },                                \
	{ "migrate-incoming", ioc__daemon_mig_incoming, ioc__mig_args_incoming }
extern const struct ioc__qmp_cmd ioc__daemon_migrate_cmds[];
/* cmd-object.c */
extern const struct ioc__qmp_cmd ioc__daemon_object_cmds[];
void ioc__daemon_objects_free(struct ioc_daemon *d);

#endif /* IOC_DAEMON_H */
