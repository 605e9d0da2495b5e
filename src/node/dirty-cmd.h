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

/* How a socket finds the image of the node named node: the image, or NULL
 * with err set (no such node, or one without bitmaps). */
struct ioc_node_dirty_ctx {
	struct ioc_blk *(*find)(void *ctx, const char *node, struct ioc__qmp_err *err);
	void *ctx;
};

extern const struct ioc__qmp_arg ioc_node_dirty_args_add[];
extern const struct ioc__qmp_arg ioc_node_dirty_args_bitmap[];
extern const struct ioc__qmp_arg ioc_node_dirty_args_merge[];

json_t *ioc_node_dirty_cmd_add(const struct ioc_node_dirty_ctx *c, json_t *args,
			       struct ioc__qmp_err *err);
json_t *ioc_node_dirty_cmd_remove(const struct ioc_node_dirty_ctx *c, json_t *args,
				  struct ioc__qmp_err *err);
json_t *ioc_node_dirty_cmd_clear(const struct ioc_node_dirty_ctx *c, json_t *args,
				 struct ioc__qmp_err *err);
json_t *ioc_node_dirty_cmd_record(const struct ioc_node_dirty_ctx *c, json_t *args, bool on,
				  struct ioc__qmp_err *err);
json_t *ioc_node_dirty_cmd_merge(const struct ioc_node_dirty_ctx *c, json_t *args,
				 struct ioc__qmp_err *err);
/* The node's "dirty-bitmaps": newest first, the migration's hidden. */
json_t *ioc_node_dirty_list_json(struct ioc_blk *blk);

#endif /* IOC_NODE_DIRTY_CMD_H */
