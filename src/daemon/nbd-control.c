/*
 * iocore-nbd's control socket: the storage daemon's commands where the
 * two agree (cmd-core.c's QMP core and reports, the NBD connections, the
 * node layer's bitmap commands, the NBD server's migration commands)
 * over the nodes of one NBD server's exports, and one of its own under
 * the __org.iocore_ prefix, QEMU's rule for vendor extensions: the I/O
 * threads' polling.
 *
 * Every export is a block node whose node name is the export name.  A
 * compressed export is a node of a vendor format, __org.iocore_zip, or
 * its overlay over it, shown as QEMU shows a backing chain; the bitmap
 * commands refuse it, since nothing tracks its changes.
 *
 * Design: the NBD server offers what a control socket needs as plain
 * functions (its exports, connection snapshots, polling counters) and two
 * hooks (its events, its stop); this file turns them into QMP.  It sits in
 * the daemon layer, beside the monitors whose handlers it shares, rather
 * than in a layer of its own between export and daemon: such a layer
 * would hold either these two commands alone, or the shared handlers
 * too, and then be the daemon layer's core under another name.
 *
 * Threads: everything here runs on the server's main loop.  Bitmap changes are the block layer's
 * management calls, which the I/O threads never make.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "nbd-control.h"

struct ioc_daemon_nbd_control {
	struct ioc__daemon_ctl ctl;     /* first: the shared commands' ctx */
	struct ioc_nbd_server *srv;
	struct ioc__qmp *qmp;
};

#define CTL(ctx) ((struct ioc_daemon_nbd_control *)(ctx))

/* ---- what the shared commands see ------------------------------------- */

static unsigned export_nodes(struct ioc__daemon_ctl *c, struct ioc_node **out, unsigned max)
{
	struct ioc_nbd_export_info e[IOC_DAEMON_MAX_EXPORTS];
	unsigned n = ioc_nbd_server_exports(CTL(c)->srv, e, IOC_ARRAY_SIZE(e));

	for (unsigned i = 0; i < n && i < max; i++)
		out[i] = e[i].node;
	return n < max ? n : max;
}

static json_t *exports_json(struct ioc__daemon_ctl *c)
{
	struct ioc_nbd_export_info e[IOC_DAEMON_MAX_EXPORTS];
	unsigned n = ioc_nbd_server_exports(CTL(c)->srv, e, IOC_ARRAY_SIZE(e));
	bool down = ioc_nbd_server_stopping(CTL(c)->srv);
	json_t *list = json_array();

	for (unsigned i = 0; i < n && list; i++)
		json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}", "id", e[i].name,
						      "type", "nbd", "node-name", e[i].name,
						      "shutting-down", down));
	return list;
}

/* A bitmap command's node: an export's. */
static struct ioc_node *find_node(void *ctx, const char *node)
{
	struct ioc_nbd_export_info e[IOC_DAEMON_MAX_EXPORTS];
	unsigned n = ioc_nbd_server_exports(CTL(ctx)->srv, e, IOC_ARRAY_SIZE(e));

	for (unsigned i = 0; i < n; i++)
		if (strcmp(e[i].name, node) == 0)
			return e[i].node;
	return NULL;
}

/* ---- its own commands -------------------------------------------------- */

static json_t *cmd_query_polling(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_nbd_server *srv = CTL(ctx)->srv;
	json_t *list = json_array();
	struct ioc_nbd_thread_poll tp;

	if (!list) {
		ioc__qmp_errf(err, "out of memory");
		return NULL;
	}
	for (unsigned t = 0; ioc_nbd_server_thread_poll(srv, t, &tp) == 0; t++)
		json_array_append_new(list, json_pack(
			"{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I,s:I}",
			"thread", (int)t,
			"poll-ns-total", (json_int_t)tp.loop.poll_ns_total,
			"polls", (json_int_t)tp.loop.polls,
			"polls-hit", (json_int_t)tp.loop.polls_hit,
			"polls-empty", (json_int_t)tp.loop.polls_empty,
			"backoffs", (json_int_t)tp.loop.backoffs,
			"sleeps", (json_int_t)tp.loop.sleeps,
			"poll-ns-current", (json_int_t)tp.loop.poll_ns,
			"backing-off", tp.loop.backing_off,
			"rests", (json_int_t)tp.rests, "rests-late", (json_int_t)tp.rests_late));
	return list;
}

static struct ioc_nbd_server *server(struct ioc__daemon_ctl *c)
{
	return CTL(c)->srv;
}

/* Replies keep this order (query-commands lists it). */
static const struct ioc__qmp_cmd commands[] = {
	IOC_DAEMON_CORE_CMDS,
	IOC_NODE_DIRTY_CMDS,
	IOC_DAEMON_CMD_QUERY_NODES,
	IOC_DAEMON_CMD_QUERY_EXPORTS,
	IOC_DAEMON_CMD_QUERY_BLOCKSTATS,
	IOC_DAEMON_CMD_QUERY_CONNECTIONS,
	{ "__org.iocore_query-polling", cmd_query_polling, NULL },
	IOC_DAEMON_MIG_CMDS,
};

/* ---- the server's hooks ------------------------------------------------- */

static void on_event(void *opaque, const char *name, void *data)
{
	ioc__qmp_event(CTL(opaque)->qmp, name, data);
}

/* The stop has begun: every export goes, and the clients hear it now,
 * before the server's last flush and the process's exit. */
static void on_stopping(void *opaque)
{
	struct ioc_daemon_nbd_control *ctl = opaque;
	struct ioc_nbd_export_info e[IOC_DAEMON_MAX_EXPORTS];
	unsigned n = ioc_nbd_server_exports(ctl->srv, e, IOC_ARRAY_SIZE(e));

	for (unsigned i = 0; i < n; i++)
		ioc__qmp_event(ctl->qmp, "BLOCK_EXPORT_DELETED",
			       json_pack("{s:s}", "id", e[i].name));
	ioc__qmp_flush(ctl->qmp);
}

/* ---- life ----------------------------------------------------------------- */

int ioc_daemon_nbd_control_new(struct ioc_daemon_nbd_control **out,
			       struct ioc_nbd_server *srv, struct ioc_loop *loop, int fd,
			       const struct ioc_daemon_nbd_control_opts *opts)
{
	struct ioc_daemon_nbd_control *ctl = calloc(1, sizeof(*ctl));
	int r;

	if (!ctl)
		return -ENOMEM;
	ctl->ctl = (struct ioc__daemon_ctl){
		.dirty = { find_node, ctl },
		.cmds = commands, .ncmds = IOC_ARRAY_SIZE(commands),
		.quit = opts ? opts->quit : NULL, .quit_opaque = opts ? opts->opaque : NULL,
		.nodes = export_nodes, .children = false,
		.exports = exports_json, .nbd = server,
	};
	ioc__daemon_ctl_init(&ctl->ctl, "iocore-nbd");
	ctl->srv = srv;
	/* The hooks first: a second control socket of one server is
	 * refused (-EBUSY) before it listens. */
	r = ioc_nbd_server_set_hooks(srv, &(struct ioc_nbd_server_hooks){
		.event = on_event, .stopping = on_stopping, .opaque = ctl });
	if (r < 0) {
		free(ctl);
		return r;
	}
	r = ioc__daemon_ctl_serve(&ctl->ctl, loop, fd, &ctl->qmp);
	if (r < 0) {
		ioc_nbd_server_set_hooks(srv, NULL);
		free(ctl);
		return r;
	}
	*out = ctl;
	return 0;
}

void ioc_daemon_nbd_control_free(struct ioc_daemon_nbd_control *ctl)
{
	if (!ctl)
		return;
	ioc_nbd_server_set_hooks(ctl->srv, NULL);
	ioc__qmp_flush(ctl->qmp);
	ioc__qmp_free(ctl->qmp);
	free(ctl);
}
