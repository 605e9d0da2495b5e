/*
 * Block commands: nodes (blockdev-add, blockdev-del), what they are and
 * what they did (query-named-block-nodes, query-blockstats, counted once
 * per node by the node layer whatever front end asked), and the dirty
 * bitmaps of a node's image.
 */
#include <errno.h>
#include <string.h>

#include "node/dirty-cmd.h"
#include "daemon.h"

static json_t *cmd_blockdev_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;

	if (ioc_node_add(d->graph, args, NULL, &err->cls, err->desc, sizeof(err->desc)) < 0)
		return NULL;
	return json_object();
}

static json_t *cmd_blockdev_del(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *name = json_string_value(json_object_get(args, "node-name"));

	if (ioc_node_del(d->graph, name, &err->cls, err->desc, sizeof(err->desc)) < 0)
		return NULL;
	return json_object();
}

static json_t *cmd_query_named_block_nodes(void *ctx, json_t *args,
					   struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	struct ioc_node *nodes[256];
	unsigned n = ioc_node_list(d->graph, nodes, IOC_ARRAY_SIZE(nodes));
	json_t *list = json_array();

	for (unsigned i = 0; i < n && i < IOC_ARRAY_SIZE(nodes) && list; i++)
		ioc_node_query_json(list, nodes[i], true);
	return list;
}

static json_t *cmd_query_blockstats(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	struct ioc_node *nodes[256];
	unsigned n = ioc_node_list(d->graph, nodes, IOC_ARRAY_SIZE(nodes));
	json_t *list = json_array();

	/* Without query-nodes QEMU lists devices, and a storage daemon has none. */
	if (!json_is_true(json_object_get(args, "query-nodes")))
		return list;
	for (unsigned i = 0; i < n && i < IOC_ARRAY_SIZE(nodes) && list; i++)
		json_array_append_new(list, ioc_node_blockstats_json(nodes[i]));
	return list;
}

/* ---- bitmaps -------------------------------------------------------------- */

struct ioc_blk *ioc__daemon_find_blk(void *ctx, const char *node, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	struct ioc_node *n = ioc_node_find(d->graph, node);
	struct ioc_blk *blk;

	if (!n) {
		ioc__qmp_errf(err, "Cannot find device='%s' nor node-name='%s'", node, node);
		return NULL;
	}
	blk = ioc_node_blk(n);
	if (!blk)
		ioc__qmp_errf(err, "Node '%s' (driver %s) does not support dirty bitmaps",
				 node, n->drv->name);
	return blk;
}

static const struct ioc__qmp_arg args_del[] = {
	{ "node-name", IOC_QMP_STR, false }, { NULL },
};
static const struct ioc__qmp_arg args_nodes[] = {
	{ "flat", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_blockstats[] = {
	{ "query-nodes", IOC_QMP_BOOL, true }, { NULL },
};

const struct ioc__qmp_cmd ioc__daemon_block_cmds[] = {
	{ "blockdev-add", cmd_blockdev_add, NULL, ioc_node_blockdev_spec },
	{ "blockdev-del", cmd_blockdev_del, args_del },
	{ "query-named-block-nodes", cmd_query_named_block_nodes, args_nodes },
	{ "query-blockstats", cmd_query_blockstats, args_blockstats },
	IOC_NODE_DIRTY_CMDS,
	{ NULL },
};
