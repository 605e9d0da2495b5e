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

/* A node, then its implicit children (named ones are listed on their
 * own), as QEMU lists every node of the graph once. */
static void list_node(json_t *list, struct ioc_node *n)
{
	json_t *j = ioc_node_info_json(n);
	struct ioc_blk *blk = ioc_node_blk(n);

	/* Bitmaps belong to the node whose image keeps them; QEMU leaves the
	 * member out when there are none. */
	if (j && blk && n->drv->blk && n->drv != ioc_node_drv_find("raw")) {
		json_t *bm = ioc_node_dirty_list_json(blk);

		if (json_array_size(bm))
			json_object_set_new(j, "dirty-bitmaps", bm);
		else
			json_decref(bm);
	}
	json_array_append_new(list, j);
	if (n->file && !n->file->in_graph)
		list_node(list, n->file);
	if (n->backing && !n->backing->in_graph)
		list_node(list, n->backing);
}

static json_t *cmd_query_named_block_nodes(void *ctx, json_t *args,
					   struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	struct ioc_node *nodes[256];
	unsigned n = ioc_node_list(d->graph, nodes, IOC_ARRAY_SIZE(nodes));
	json_t *list = json_array();

	for (unsigned i = 0; i < n && i < IOC_ARRAY_SIZE(nodes) && list; i++)
		list_node(list, nodes[i]);
	return list;
}

static uint64_t rd(_Atomic uint64_t *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

static json_t *stats_json(struct ioc_node *n)
{
	struct ioc_node_stats s;
	struct ioc_node_opstat *o = s.op;

	ioc_node_get_stats(n, &s);
	/* QEMU counts write-zeroes as writes. */
	return json_pack(
		"{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
		"s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:b,s:b,s:[]}",
		"rd_bytes", (json_int_t)rd(&o[IOC_NODE_OP_READ].bytes),
		"wr_bytes", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].bytes) +
					 rd(&o[IOC_NODE_OP_ZERO].bytes)),
		"unmap_bytes", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].bytes),
		"rd_operations", (json_int_t)rd(&o[IOC_NODE_OP_READ].ops),
		"wr_operations", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].ops) +
					      rd(&o[IOC_NODE_OP_ZERO].ops)),
		"flush_operations", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].ops),
		"unmap_operations", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].ops),
		"failed_rd_operations", (json_int_t)rd(&o[IOC_NODE_OP_READ].failed),
		"failed_wr_operations", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].failed) +
						     rd(&o[IOC_NODE_OP_ZERO].failed)),
		"failed_flush_operations", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].failed),
		"failed_unmap_operations", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].failed),
		"rd_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_READ].ns),
		"wr_total_time_ns", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].ns) +
						 rd(&o[IOC_NODE_OP_ZERO].ns)),
		"flush_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].ns),
		"unmap_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].ns),
		"wr_highest_offset", (json_int_t)rd(&s.wr_highest),
		"rd_merged", (json_int_t)0, "wr_merged", (json_int_t)0,
		"unmap_merged", (json_int_t)0,
		"invalid_rd_operations", 0, "invalid_wr_operations", 0,
		"invalid_flush_operations", 0, "invalid_unmap_operations", 0,
		"account_invalid", 0, "account_failed", 1, "timed_stats");
}

static void stats_node(json_t *list, struct ioc_node *n)
{
	json_t *e = json_pack("{s:s,s:o}", "node-name", n->name, "stats", stats_json(n));

	if (e && n->file)
		json_object_set_new(e, "parent", json_pack("{s:s,s:o}", "node-name",
							   n->file->name, "stats",
							   stats_json(n->file)));
	if (e && n->backing)
		json_object_set_new(e, "backing", json_pack("{s:s,s:o}", "node-name",
							    n->backing->name, "stats",
							    stats_json(n->backing)));
	json_array_append_new(list, e);
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
		stats_node(list, nodes[i]);
	return list;
}

/* ---- bitmaps -------------------------------------------------------------- */

static struct ioc_blk *find_blk(void *ctx, const char *node, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	struct ioc_node *n = ioc_node_find(d->graph, node);
	struct ioc_blk *blk;

	if (!n) {
		ioc__daemon_errf(err, "Cannot find device='%s' nor node-name='%s'", node, node);
		return NULL;
	}
	blk = ioc_node_blk(n);
	if (!blk)
		ioc__daemon_errf(err, "Node '%s' (driver %s) does not support dirty bitmaps",
				 node, n->drv->name);
	return blk;
}

#define DIRTY_CTX(ctx) (&(struct ioc_node_dirty_ctx){ find_blk, (ctx) })

static json_t *cmd_bitmap_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_add(DIRTY_CTX(ctx), args, err);
}

static json_t *cmd_bitmap_remove(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_remove(DIRTY_CTX(ctx), args, err);
}

static json_t *cmd_bitmap_clear(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_clear(DIRTY_CTX(ctx), args, err);
}

static json_t *cmd_bitmap_enable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_record(DIRTY_CTX(ctx), args, true, err);
}

static json_t *cmd_bitmap_disable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_record(DIRTY_CTX(ctx), args, false, err);
}

static json_t *cmd_bitmap_merge(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return ioc_node_dirty_cmd_merge(DIRTY_CTX(ctx), args, err);
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
	{ "block-dirty-bitmap-add", cmd_bitmap_add, ioc_node_dirty_args_add },
	{ "block-dirty-bitmap-remove", cmd_bitmap_remove, ioc_node_dirty_args_bitmap },
	{ "block-dirty-bitmap-clear", cmd_bitmap_clear, ioc_node_dirty_args_bitmap },
	{ "block-dirty-bitmap-enable", cmd_bitmap_enable, ioc_node_dirty_args_bitmap },
	{ "block-dirty-bitmap-disable", cmd_bitmap_disable, ioc_node_dirty_args_bitmap },
	{ "block-dirty-bitmap-merge", cmd_bitmap_merge, ioc_node_dirty_args_merge },
	{ NULL },
};
