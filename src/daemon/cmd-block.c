/*
 * Block commands: nodes (blockdev-add, blockdev-del, block_resize), what
 * they are and what they did (query-named-block-nodes, query-blockstats:
 * cmd-core.c's, over every node of the graph), and the dirty bitmaps of
 * a node's image.  blockdev-add and -del, block_resize and the bitmap add
 * and remove may wait on a cluster (an rbd node): they run as coroutine
 * commands.
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

static json_t *ioc_coroutine_fn cmd_blockdev_del(void *ctx, json_t *args,
						  struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *name = json_string_value(json_object_get(args, "node-name"));

	if (ioc_node_del(d->graph, name, &err->cls, err->desc, sizeof(err->desc)) < 0)
		return NULL;
	return json_object();
}

/* ---- bitmaps -------------------------------------------------------------- */

struct ioc_node *ioc__daemon_find_node(void *ctx, const char *node)
{
	struct ioc_daemon *d = ctx;

	return ioc_node_find(d->graph, node);
}

struct resize {
	struct ioc_node *n;
	uint64_t size;
	int ret;
	struct ioc_co_await aw;         /* the command's coroutine waits here */
};

/* On the resize's thread, outside the coroutine: the loop leaves the node
 * (it stops next), then the command goes on (on its own loop). */
static void resize_end(void *arg)
{
	struct resize *r = arg;

	ioc_node_loop_exit(r->n);
	ioc_co_await_done(&r->aw, r->ret);
}

static void ioc_coroutine_fn resize_co(void *arg)
{
	struct resize *r = arg;

	r->ret = ioc_node_co_truncate(r->n, r->size);
	if (ioc_loop_oneshot(ioc_loop_current(), resize_end, r) < 0) {
		r->ret = r->ret < 0 ? r->ret : -ENOMEM;
		resize_end(r);  /* rare; the node's state on this loop goes now */
	}
}

static void resize_start(void *arg)
{
	struct resize *r = arg;
	struct ioc_co *co = ioc_co_create(resize_co, r);

	if (!co) {
		ioc_co_await_done(&r->aw, -ENOMEM);
		return;
	}
	ioc_co_enter(co);
}

/* block_resize: the node's driver resizes, then every export of the node
 * that can tell its client does.  The driver's call runs on a short-lived
 * I/O thread (not the main loop: the node would keep a slot there, and an
 * rbd node would wake it on every completion) while the command, a
 * coroutine, waits; the main loop serves on. */
static json_t *ioc_coroutine_fn cmd_block_resize(void *ctx, json_t *args,
						  struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *name = json_string_value(json_object_get(args, "node-name"));
	const char *dev = json_string_value(json_object_get(args, "device"));
	struct resize r = { .size = (uint64_t)json_integer_value(json_object_get(args, "size")) };
	struct ioc_iothread_opts to = { .name = "ioc-resize", .cpu = -1 };
	struct ioc_iothread *t;
	int ret;

	if (!name && !dev) {
		ioc__qmp_errf(err, "Need device or node-name");
		return NULL;
	}
	r.n = ioc_node_find(d->graph, name ? name : dev);
	if (!r.n) {
		ioc__qmp_errf(err, "Cannot find device='%s' nor node-name='%s'", dev ? dev : "",
			      name ? name : "");
		return NULL;
	}
	/* The image is another host's, or is becoming so. */
	if (ioc_node_is_changing(r.n) || !ioc_node_is_active(r.n)) {
		ioc__qmp_errf(err, "Node '%s' is %s", r.n->name, ioc_node_is_changing(r.n) ?
			      "being handed over" : "inactive");
		return NULL;
	}
	if ((int64_t)r.size < 0) {
		ioc__qmp_errf(err, "Parameter 'size' expects a >0 size");
		return NULL;
	}
	/* A client that cannot be told of a new size must not see one (QEMU:
	 * an NBD export does not share the resize permission). */
	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++) {
		struct ioc_export *ex = d->exports[i];

		if (ex && ex->node == r.n && !ex->drv->resized) {
			ioc__qmp_errf(err, "Node '%s' is exported by '%s' (%s), whose clients "
				      "cannot be told of a new size", r.n->name, ex->id,
				      ex->drv->type);
			return NULL;
		}
	}
	ioc_co_await_init(&r.aw);
	ret = ioc_iothread_start(&t, &to);
	if (ret == 0) {
		ret = ioc_loop_oneshot(ioc_iothread_loop(t), resize_start, &r);
		if (ret == 0)
			ret = (int)ioc_co_await(&r.aw);
		ioc_iothread_stop(t);
	}
	if (ret < 0)
		r.ret = ret;
	if (r.ret < 0) {
		ioc__qmp_errf(err, r.ret == -ENOTSUP ? "Block driver '%s' does not support "
			      "resizing" : r.ret == -EPERM ? "Node '%s' is read-only" :
			      "Could not resize: %s", r.ret == -ENOTSUP ? r.n->drv->name :
			      r.ret == -EPERM ? r.n->name : ioc_strerror(r.ret));
		return NULL;
	}
	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
		if (d->exports[i] && d->exports[i]->node == r.n && d->exports[i]->drv->resized)
			d->exports[i]->drv->resized(d->exports[i]);
	return json_object();
}

static const struct ioc__qmp_arg args_resize[] = {
	{ "device", IOC_QMP_STR, true }, { "node-name", IOC_QMP_STR, true },
	{ "size", IOC_QMP_INT, false }, { NULL },
};

static const struct ioc__qmp_arg args_del[] = {
	{ "node-name", IOC_QMP_STR, false }, { NULL },
};

const struct ioc__qmp_cmd ioc__daemon_block_cmds[] = {
	{ "blockdev-add", cmd_blockdev_add, NULL, ioc_node_blockdev_spec, true },
	{ "blockdev-del", cmd_blockdev_del, args_del, NULL, true },
	{ "block_resize", cmd_block_resize, args_resize, NULL, true },
	IOC_DAEMON_CMD_QUERY_NODES,
	IOC_DAEMON_CMD_QUERY_BLOCKSTATS,
	IOC_NODE_DIRTY_CMDS,
	{ NULL },
};
