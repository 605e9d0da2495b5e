/*
 * The commands every control socket of iocore answers alike: the QMP
 * core (qmp_capabilities, query-version, query-commands, quit) and the
 * reports of nodes, exports and NBD clients (query-named-block-nodes,
 * query-blockstats, query-block-exports, __org.iocore_query-connections).
 * The storage daemon's monitors
 * and iocore-nbd's control socket (nbd-control.c) put these entries in
 * their tables; the bitmap commands are the node layer's
 * (IOC_NODE_DIRTY_CMDS), shared the same way.
 *
 * Design: a handler's ctx is its owner, whose first member is a struct
 * ioc__daemon_ctl saying what differs between owners: the version
 * strings, the socket's own table, the quit hook, which nodes to list
 * (the daemon's graph with its implicit children; iocore-nbd's exports'
 * nodes alone, a compressed image under its overlay shown as the
 * overlay's backing image) and the exports' list.  What a node says of
 * itself is the node layer's (query.c), so one node reads the same on
 * either socket.
 *
 * Rejected: each socket keeping its own copy of these handlers (how
 * iocore-nbd's control socket began, in the NBD layer): the copies had
 * already drifted (the version fallback, the node lists' caps), and the
 * NBD protocol layer had to know QMP's commands.  Also rejected: making
 * iocore-nbd's socket a whole storage daemon, whose graph would then
 * have to own the nodes the NBD server makes over its images.
 *
 * Main loop only, like every handler of a command table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ioc-config.h"
#include "daemon.h"

#define MAX_LISTED 256

void ioc__daemon_ctl_init(struct ioc__daemon_ctl *c, const char *prog)
{
	snprintf(c->package, sizeof(c->package), "%s %s", prog, IOC_VERSION);
	/* The greeting's numbers are the package's ("X.Y.Z"). */
	if (sscanf(IOC_VERSION, "%d.%d.%d", &c->version[0], &c->version[1],
		   &c->version[2]) < 2) {
		c->version[0] = IOC_VERSION_MAJOR;
		c->version[1] = IOC_VERSION_MINOR;
	}
}

int ioc__daemon_ctl_serve(struct ioc__daemon_ctl *c, struct ioc_loop *loop, int fd,
			  struct ioc__qmp **out)
{
	struct ioc__qmp_opts qo = {
		.cmds = c->cmds, .ncmds = c->ncmds, .ctx = c, .package = c->package,
		.major = c->version[0], .minor = c->version[1], .micro = c->version[2],
	};

	return ioc__qmp_new(out, loop, fd, &qo);
}

json_t *ioc__daemon_cmd_query_version(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;

	return json_pack("{s:{s:i,s:i,s:i},s:s}", "qemu", "major", c->version[0],
			 "minor", c->version[1], "micro", c->version[2], "package", c->package);
}

json_t *ioc__daemon_cmd_query_commands(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;
	json_t *list = json_array();

	for (size_t i = 0; i < c->ncmds && list; i++)
		json_array_append_new(list, json_pack("{s:s}", "name", c->cmds[i].name));
	return list;
}

json_t *ioc__daemon_cmd_quit(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;

	if (c->quit)
		c->quit(c->quit_opaque);
	return json_object();
}

json_t *ioc__daemon_cmd_query_nodes(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;
	struct ioc_node *nodes[MAX_LISTED];
	unsigned n = c->nodes(c, nodes, MAX_LISTED);
	json_t *list = json_array();

	for (unsigned i = 0; i < n && list; i++)
		ioc_node_query_json(list, nodes[i], c->children);
	return list;
}

json_t *ioc__daemon_cmd_query_blockstats(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;
	struct ioc_node *nodes[MAX_LISTED];
	unsigned n;
	json_t *list = json_array();

	/* Without query-nodes QEMU lists devices, and a storage daemon has none. */
	if (!json_is_true(json_object_get(args, "query-nodes")))
		return list;
	n = c->nodes(c, nodes, MAX_LISTED);
	for (unsigned i = 0; i < n && list; i++)
		json_array_append_new(list, ioc_node_blockstats_json(nodes[i]));
	return list;
}

json_t *ioc__daemon_cmd_query_exports(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__daemon_ctl *c = ctx;

	return c->exports(c);
}

static json_t *opcount_json(const struct ioc_nbd_opcount *o)
{
	return json_pack("{s:I,s:I,s:I,s:I}", "operations", (json_int_t)o->ops,
			 "bytes", (json_int_t)o->bytes, "failed", (json_int_t)o->failed,
			 "total-time-ns", (json_int_t)o->ns);
}

/* Each NBD client: its I/O thread (the server's, by index, or -1 for its
 * export's iothread) and the OS thread serving it, as query-iothreads
 * names threads.  The snapshot runs on each thread through the server
 * (ioc_nbd_server_conns()), blocking the main loop for one round trip
 * per thread and nothing else.  No server: no clients. */
json_t *ioc__daemon_cmd_query_connections(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	static const char *const names[IOC_NBD_OP_N] = {
		"read", "write", "flush", "trim", "write-zeroes", "block-status", "cache",
	};
	enum { MAXC = 1024 };
	struct ioc__daemon_ctl *c = ctx;
	struct ioc_nbd_server *srv = c->nbd ? c->nbd(c) : NULL;
	struct ioc_nbd_conn_info *ci = calloc(MAXC, sizeof(*ci));
	json_t *list = json_array();
	unsigned n;

	if (!ci || !list) {
		free(ci);
		json_decref(list);
		ioc__qmp_errf(err, "out of memory");
		return NULL;
	}
	n = srv ? ioc_nbd_server_conns(srv, ci, MAXC) : 0;
	for (unsigned i = 0; i < n; i++) {
		json_t *req = json_object();
		uint64_t errors = 0;

		for (int k = 0; k < IOC_NBD_OP_N; k++) {
			json_object_set_new(req, names[k], opcount_json(&ci[i].op[k]));
			errors += ci[i].op[k].failed;
		}
		json_array_append_new(list, json_pack("{s:s,s:s,s:i,s:I,s:b,s:b,s:I,s:I,s:o}",
			"address", ci[i].peer, "export", ci[i].export_name,
			"thread", ci[i].thread, "thread-id", (json_int_t)ci[i].thread_id,
			"transmission", ci[i].transmission,
			"tls", ci[i].tls, "in-flight", (json_int_t)ci[i].inflight,
			"errors", (json_int_t)errors, "requests", req));
	}
	free(ci);
	return list;
}

const struct ioc__qmp_arg ioc__daemon_args_caps[] = {
	{ "enable", IOC_QMP_ARRAY, true, .elem = IOC_QMP_ANY }, { NULL },
};
const struct ioc__qmp_arg ioc__daemon_args_nodes[] = {
	{ "flat", IOC_QMP_BOOL, true }, { NULL },
};
const struct ioc__qmp_arg ioc__daemon_args_blockstats[] = {
	{ "query-nodes", IOC_QMP_BOOL, true }, { NULL },
};
