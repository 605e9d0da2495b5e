/*
 * The commands every control socket of iocore answers alike: the QMP
 * core (qmp_capabilities, query-version, query-commands, quit) and the
 * reports of nodes and exports (query-named-block-nodes,
 * query-blockstats, query-block-exports).  The storage daemon's monitors
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

const struct ioc__qmp_arg ioc__daemon_args_caps[] = {
	{ "enable", IOC_QMP_ARRAY, true, .elem = IOC_QMP_ANY }, { NULL },
};
const struct ioc__qmp_arg ioc__daemon_args_nodes[] = {
	{ "flat", IOC_QMP_BOOL, true }, { NULL },
};
const struct ioc__qmp_arg ioc__daemon_args_blockstats[] = {
	{ "query-nodes", IOC_QMP_BOOL, true }, { NULL },
};
