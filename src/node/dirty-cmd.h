/*
 * The dirty-bitmap QMP commands over the block layer's bitmaps, for any
 * control socket (dirty-cmd.c).  Main thread.
 */
#ifndef IOC_NODE_DIRTY_CMD_H
#define IOC_NODE_DIRTY_CMD_H

#include <jansson.h>

#include "iocore/blk.h"
#include "qmp/qmp.h"

/* A migration's own bitmap: hidden from the user's commands and lists. */
#define IOC_NODE_MIG_BITMAP "__org.iocore_migration"

struct ioc_node;

/* How a socket finds the node named node (NULL: it has none by that name);
 * the commands check the rest (a hand-over, no bitmaps) themselves. */
struct ioc_node_dirty_ctx {
	struct ioc_node *(*find)(void *ctx, const char *node);
	void *ctx;
};

extern const struct ioc__qmp_arg ioc_node_dirty_args_add[];
extern const struct ioc__qmp_arg ioc_node_dirty_args_bitmap[];
extern const struct ioc__qmp_arg ioc_node_dirty_args_merge[];

/* The handlers, for a command table whose ctx starts with a struct
 * ioc_node_dirty_ctx (IOC_NODE_DIRTY_CMDS lists them). */
ioc__qmp_fn ioc_node_dirty_cmd_add, ioc_node_dirty_cmd_remove, ioc_node_dirty_cmd_clear,
	    ioc_node_dirty_cmd_enable, ioc_node_dirty_cmd_disable, ioc_node_dirty_cmd_merge;

#define IOC_NODE_DIRTY_CMDS                                                           \
	{ "block-dirty-bitmap-add", ioc_node_dirty_cmd_add, ioc_node_dirty_args_add,         \
	  NULL, true },                                                                     \
	{ "block-dirty-bitmap-remove", ioc_node_dirty_cmd_remove, ioc_node_dirty_args_bitmap, \
	  NULL, true },                                                                     \
	{ "block-dirty-bitmap-clear", ioc_node_dirty_cmd_clear, ioc_node_dirty_args_bitmap },   \
	{ "block-dirty-bitmap-enable", ioc_node_dirty_cmd_enable, ioc_node_dirty_args_bitmap }, \
	{ "block-dirty-bitmap-disable", ioc_node_dirty_cmd_disable,                        \
	  ioc_node_dirty_args_bitmap },                                                     \
	{ "block-dirty-bitmap-merge", ioc_node_dirty_cmd_merge, ioc_node_dirty_args_merge }
/* The node's "dirty-bitmaps": newest first, the migration's hidden. */
json_t *ioc_node_dirty_list_json(struct ioc_blk *blk);

#endif /* IOC_NODE_DIRTY_CMD_H */
