/*
 * The control socket's commands: QEMU's names, arguments and result
 * fields for what iocore-nbd shares with qemu-storage-daemon (dirty
 * bitmaps, block nodes, exports, statistics), and names under the
 * __org.iocore_ prefix, QEMU's rule for vendor extensions, for the rest.
 *
 * Every export is a block node whose node name is the export name.  A
 * compressed export is a node of a vendor format, __org.iocore_zip (its
 * frame cache and decode counters in its image info), or its overlay over
 * it, shown as QEMU shows a backing chain; the bitmap commands refuse
 * it, since nothing tracks its changes.
 *
 * The table below is the only list of commands: qmp.c dispatches from
 * it, checks arguments against its specs, and query-commands prints it.
 *
 * Threads: everything here runs on the server's main loop.  Statistics
 * come from counters the I/O threads own (relaxed reads); the per-
 * connection snapshot runs on each I/O thread through ioc_loop_call(),
 * which blocks the main loop for one round trip per thread and nothing
 * else.  Bitmap changes are the block layer's management calls, which
 * the I/O threads never make.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ioc-config.h"
#include "iocore/zip.h"
#include "migrate-int.h"
#include "nbd-int.h"
#include "node/dirty-cmd.h"
#include "node/node.h"
#include "qmp/qmp.h"

struct ioc__nbd_control {
	struct ioc_node_dirty_ctx dirty; /* first: the bitmap commands' ctx */
	struct ioc_nbd_server *srv;
	struct ioc__qmp *qmp;
	struct ioc_nbd_control_opts o;
	char package[64];
	int version[3];            /* major, minor, micro of IOC_VERSION */
};

/* ---- helpers ---------------------------------------------------------- */


/* The node of a bitmap command: an export of the block layer. */
static struct ioc__nbd_export *find_node(struct ioc__nbd_control *ctl, const char *node,
					 struct ioc__qmp_err *err)
{
	struct ioc_nbd_server *srv = ctl->srv;

	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		if (!srv->exports[i] || strcmp(srv->exports[i]->name, node) != 0)
			continue;
		if (srv->exports[i]->blk)
			return srv->exports[i];
		/* A compressed export is a node, but its changes are not
		 * tracked (an overlay could be, one day). */
		ioc__qmp_errf(err, "Node '%s' is a compressed image: dirty bitmaps are not "
		     "supported on it", node);
		return NULL;
	}
	ioc__qmp_errf(err, "Cannot find device='%s' nor node-name='%s'", node, node);
	return NULL;
}

/* The bitmap commands' view of this server: an export's image. */
static struct ioc_blk *find_blk(void *ctx, const char *node, struct ioc__qmp_err *err)
{
	struct ioc__nbd_export *e = find_node(ctx, node, err);

	return e ? e->blk : NULL;
}

/* ---- commands --------------------------------------------------------- */

static json_t *cmd_query_version(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;

	return json_pack("{s:{s:i,s:i,s:i},s:s}", "qemu", "major", ctl->version[0],
			 "minor", ctl->version[1], "micro", ctl->version[2],
			 "package", ctl->package);
}

static json_t *cmd_query_commands(void *ctx, json_t *args, struct ioc__qmp_err *err);

static json_t *cmd_quit(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;

	if (ctl->o.quit)
		ctl->o.quit(ctl->o.opaque);
	return json_object();
}

/* Every export is a node named as the export (the node layer's view); a
 * compressed image under its overlay shows as the overlay's backing image,
 * not as a node of its own. */
static json_t *cmd_query_named_block_nodes(void *ctx, json_t *args,
					   struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	for (unsigned i = 0; i < srv->cfg.nexports && list; i++)
		if (srv->exports[i])
			ioc_node_query_json(list, srv->exports[i]->node, false);
	return list;
}

static json_t *cmd_query_block_exports(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	bool down = atomic_load_explicit(&srv->stopping, memory_order_relaxed);
	json_t *list = json_array();

	for (unsigned i = 0; i < srv->cfg.nexports && list; i++)
		if (srv->exports[i])
			json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}",
			"id", srv->exports[i]->name, "type", "nbd",
			"node-name", srv->exports[i]->name, "shutting-down", down));
	return list;
}

static json_t *cmd_query_blockstats(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	/* Without query-nodes QEMU lists devices, and a storage daemon has none. */
	if (!json_is_true(json_object_get(args, "query-nodes")))
		return list;
	for (unsigned i = 0; i < srv->cfg.nexports && list; i++)
		if (srv->exports[i])
			json_array_append_new(list,
					      ioc_node_blockstats_json(srv->exports[i]->node));
	return list;
}

struct conn_query {
	struct nbd_thread *t;
	struct ioc__nbd_conn_info *out;
	unsigned max, n;
};

static int conn_query_fn(void *arg)
{
	struct conn_query *cq = arg;

	cq->n = ioc__nbd_thread_conn_info(cq->t, cq->out, cq->max);
	return 0;
}

static uint64_t rd(_Atomic uint64_t *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

static json_t *opstat_json(struct ioc__nbd_opstat *o)
{
	return json_pack("{s:I,s:I,s:I,s:I}", "operations", (json_int_t)rd(&o->ops),
			 "bytes", (json_int_t)rd(&o->bytes), "failed", (json_int_t)rd(&o->failed),
			 "total-time-ns", (json_int_t)rd(&o->ns));
}

static json_t *cmd_query_connections(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	static const char *const names[IOC__NBD_ST_N] = {
		"read", "write", "flush", "trim", "write-zeroes", "block-status", "cache",
	};
	enum { MAXC = 1024 };
	struct ioc__nbd_conn_info *ci = calloc(MAXC, sizeof(*ci));
	json_t *list = json_array();

	if (!ci || !list) {
		free(ci);
		json_decref(list);
		ioc__qmp_errf(err, "out of memory");
		return NULL;
	}
	for (unsigned t = 0; t < srv->nthreads; t++) {
		struct conn_query cq = { &srv->threads[t], ci, MAXC, 0 };

		ioc_loop_call(srv->threads[t].loop, conn_query_fn, &cq);
		for (unsigned i = 0; i < cq.n && i < MAXC; i++) {
			json_t *req = json_object(), *c;
			uint64_t errors = 0;

			for (int k = 0; k < IOC__NBD_ST_N; k++) {
				json_object_set_new(req, names[k], opstat_json(&ci[i].st.op[k]));
				errors += rd(&ci[i].st.op[k].failed);
			}
			c = json_pack("{s:s,s:s,s:i,s:b,s:b,s:I,s:I,s:o}",
				      "address", ci[i].peer, "export", ci[i].export_name,
				      "thread", (int)ci[i].thread, "transmission",
				      ci[i].transmission, "tls", ci[i].tls,
				      "in-flight", (json_int_t)ci[i].inflight,
				      "errors", (json_int_t)errors, "requests", req);
			json_array_append_new(list, c);
		}
	}
	free(ci);
	return list;
}

/* The I/O threads' adaptive polling counters (relaxed reads, any thread:
 * no round trip to the threads). */
static json_t *cmd_query_polling(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	if (!list) {
		ioc__qmp_errf(err, "out of memory");
		return NULL;
	}
	for (unsigned t = 0; t < srv->nthreads; t++) {
		struct ioc_loop_poll_stats ps;

		ioc_loop_get_poll_stats(srv->threads[t].loop, &ps);
		json_array_append_new(list, json_pack(
			"{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I,s:I}",
			"thread", (int)t,
			"poll-ns-total", (json_int_t)ps.poll_ns_total,
			"polls", (json_int_t)ps.polls,
			"polls-hit", (json_int_t)ps.polls_hit,
			"polls-empty", (json_int_t)ps.polls_empty,
			"backoffs", (json_int_t)ps.backoffs,
			"sleeps", (json_int_t)ps.sleeps,
			"poll-ns-current", (json_int_t)ps.poll_ns,
			"backing-off", ps.backing_off,
			/* relaxed: counters, written by that thread only. */
			"rests", (json_int_t)atomic_load_explicit(&srv->threads[t].rests,
								  memory_order_relaxed),
			"rests-late", (json_int_t)atomic_load_explicit(
				&srv->threads[t].rests_late, memory_order_relaxed)));
	}
	return list;
}

/* Migration (migrate-source.c, migrate-dest.c): the handlers take the
 * server. */
#define MIG_CMD(fn, impl) \
	static json_t *fn(void *ctx, json_t *args, struct ioc__qmp_err *err) \
	{ return impl(((struct ioc__nbd_control *)ctx)->srv, args, err); }
MIG_CMD(cmd_mig_set_caps, ioc__nbd_mig_set_caps)
MIG_CMD(cmd_mig_query_caps, ioc__nbd_mig_query_caps)
MIG_CMD(cmd_mig_set_params, ioc__nbd_mig_set_params)
MIG_CMD(cmd_mig_query_params, ioc__nbd_mig_query_params)
MIG_CMD(cmd_mig_migrate, ioc__nbd_mig_migrate)
MIG_CMD(cmd_mig_query, ioc__nbd_mig_query)
MIG_CMD(cmd_mig_continue, ioc__nbd_mig_continue)
MIG_CMD(cmd_mig_cancel, ioc__nbd_mig_cancel)
MIG_CMD(cmd_mig_incoming, ioc__nbd_mig_incoming)
#undef MIG_CMD

void ioc__nbd_control_event(struct ioc__nbd_control *ctl, const char *name,
			    json_t *data)
{
	if (!ctl) {
		json_decref(data);
		return;
	}
	ioc__qmp_event(ctl->qmp, name, data);
}

/* ---- the table --------------------------------------------------------- */

static const struct ioc__qmp_arg args_caps[] = {
	{ "enable", IOC_QMP_ARRAY, true, .elem = IOC_QMP_ANY }, { NULL },
};
static const struct ioc__qmp_arg args_nodes[] = {
	{ "flat", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_blockstats[] = {
	{ "query-nodes", IOC_QMP_BOOL, true }, { NULL },
};

static const struct ioc__qmp_arg args_mig_caps[] = {
	{ "capabilities", IOC_QMP_ARRAY, false, .elem = IOC_QMP_ANY }, { NULL },
};
static const struct ioc__qmp_arg args_mig_params[] = {
	{ "compress-level", IOC_QMP_UINT, true },
	{ "compress-threads", IOC_QMP_UINT, true },
	{ "compress-wait-thread", IOC_QMP_BOOL, true },
	{ "decompress-threads", IOC_QMP_UINT, true },
	{ "max-bandwidth", IOC_QMP_UINT, true },
	{ "downtime-limit", IOC_QMP_UINT, true },
	{ "__org.iocore_granularity", IOC_QMP_UINT, true },
	{ "__org.iocore_active-mirror", IOC_QMP_STR, true },
	{ "__org.iocore_write-admission", IOC_QMP_UINT, true },
	{ "tls-creds", IOC_QMP_STR, true },
	{ "tls-hostname", IOC_QMP_STR, true },
	{ "throttle-trigger-threshold", IOC_QMP_UINT, true },
	{ "cpu-throttle-initial", IOC_QMP_UINT, true },
	{ "cpu-throttle-increment", IOC_QMP_UINT, true },
	{ "cpu-throttle-tailslow", IOC_QMP_BOOL, true },
	{ "max-cpu-throttle", IOC_QMP_UINT, true },
	{ NULL },
};
static const struct ioc__qmp_arg args_migrate[] = {
	{ "uri", IOC_QMP_STR, false }, { "blk", IOC_QMP_BOOL, true },
	{ "inc", IOC_QMP_BOOL, true }, { "detach", IOC_QMP_BOOL, true },
	{ "resume", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_mig_continue[] = {
	{ "state", IOC_QMP_STR, false }, { NULL },
};
static const struct ioc__qmp_arg args_mig_incoming[] = {
	{ "uri", IOC_QMP_STR, false }, { NULL },
};

static const struct ioc__qmp_cmd commands[] = {
	{ "qmp_capabilities", NULL, args_caps },
	{ "query-version", cmd_query_version, NULL },
	{ "query-commands", cmd_query_commands, NULL },
	{ "quit", cmd_quit, NULL },
	IOC_NODE_DIRTY_CMDS,
	{ "query-named-block-nodes", cmd_query_named_block_nodes, args_nodes },
	{ "query-block-exports", cmd_query_block_exports, NULL },
	{ "query-blockstats", cmd_query_blockstats, args_blockstats },
	{ "__org.iocore_query-connections", cmd_query_connections, NULL },
	{ "__org.iocore_query-polling", cmd_query_polling, NULL },
	{ "migrate-set-capabilities", cmd_mig_set_caps, args_mig_caps },
	{ "query-migrate-capabilities", cmd_mig_query_caps, NULL },
	{ "migrate-set-parameters", cmd_mig_set_params, args_mig_params },
	{ "query-migrate-parameters", cmd_mig_query_params, NULL },
	{ "migrate", cmd_mig_migrate, args_migrate },
	{ "query-migrate", cmd_mig_query, NULL },
	{ "migrate-continue", cmd_mig_continue, args_mig_continue },
	{ "migrate_cancel", cmd_mig_cancel, NULL },
	{ "migrate-incoming", cmd_mig_incoming, args_mig_incoming },
};

static json_t *cmd_query_commands(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	json_t *list = json_array();

	for (size_t i = 0; i < IOC_ARRAY_SIZE(commands) && list; i++)
		json_array_append_new(list, json_pack("{s:s}", "name", commands[i].name));
	return list;
}

/* ---- life ---------------------------------------------------------------- */

int ioc_nbd_server_add_control(struct ioc_nbd_server *srv, int fd,
			       const struct ioc_nbd_control_opts *opts)
{
	struct ioc__nbd_control *ctl;
	struct ioc__qmp_opts qo = {
		.cmds = commands,
		.ncmds = IOC_ARRAY_SIZE(commands),
	};
	int r;

	if (!srv->started || srv->control)
		return -EBUSY;
	ctl = calloc(1, sizeof(*ctl));
	if (!ctl)
		return -ENOMEM;
	ctl->srv = srv;
	ctl->dirty = (struct ioc_node_dirty_ctx){ find_blk, ctl };
	if (opts)
		ctl->o = *opts;
	snprintf(ctl->package, sizeof(ctl->package), "iocore-nbd %s", IOC_VERSION);
	/* The greeting's numbers are the package's ("X.Y.Z"). */
	if (sscanf(IOC_VERSION, "%d.%d.%d", &ctl->version[0], &ctl->version[1],
		   &ctl->version[2]) < 2) {
		ctl->version[0] = IOC_VERSION_MAJOR;
		ctl->version[1] = IOC_VERSION_MINOR;
	}
	qo.major = ctl->version[0];
	qo.minor = ctl->version[1];
	qo.micro = ctl->version[2];
	qo.ctx = ctl;
	qo.package = ctl->package;
	r = ioc__qmp_new(&ctl->qmp, srv->main_loop, fd, &qo);
	if (r < 0) {
		free(ctl);
		return r;
	}
	srv->control = ctl;
	return 0;
}

void ioc__nbd_control_stopping(struct ioc__nbd_control *ctl)
{
	struct ioc_nbd_server *srv = ctl->srv;

	for (unsigned i = 0; i < srv->cfg.nexports; i++)
		if (srv->exports[i])
			ioc__qmp_event(ctl->qmp, "BLOCK_EXPORT_DELETED",
			       json_pack("{s:s}", "id", srv->exports[i]->name));
	ioc__qmp_flush(ctl->qmp);
}

void ioc__nbd_control_free(struct ioc__nbd_control *ctl)
{
	if (!ctl)
		return;
	ioc__qmp_flush(ctl->qmp);
	ioc__qmp_free(ctl->qmp);
	free(ctl);
}
