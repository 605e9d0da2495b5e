/*
 * The storage daemon's core: one command table assembled from the areas
 * (block, export, object), the QMP monitors that serve it, and the events
 * it sends them.  A command-line option group is the same command run
 * through ioc_daemon_run() with keyval coercion, so --blockdev and
 * blockdev-add cannot disagree: one spec, one checker, one handler.
 *
 * Rejected: a parser per option that builds the objects itself (how the
 * NBD tool grew its flags): every option would need its QMP twin written
 * again, and their checks and messages would drift apart.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd/nbd.h"
#include "daemon.h"

void ioc__daemon_event(struct ioc_daemon *d, const char *name, json_t *data)
{
	/* Each monitor serialises the same object; none changes it. */
	for (unsigned i = 0; i < d->nmonitors; i++)
		ioc__qmp_event(d->monitors[i], name, json_incref(data));
	json_decref(data);
}

/* ---- the table ---------------------------------------------------------- */

static const struct ioc__qmp_cmd core_cmds[] = {
	IOC_DAEMON_CORE_CMDS,
	{ NULL },
};

static const struct ioc__qmp_cmd *const areas[] = {
	core_cmds, ioc__daemon_block_cmds, ioc__daemon_export_cmds, ioc__daemon_object_cmds,
	ioc__daemon_migrate_cmds,
};

static struct ioc__qmp_cmd table[128];
static size_t ntable;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	for (size_t a = 0; a < IOC_ARRAY_SIZE(areas); a++)
		for (const struct ioc__qmp_cmd *c = areas[a]; c->name; c++)
			if (ntable < IOC_ARRAY_SIZE(table))
				table[ntable++] = *c;
}

struct run_co {
	const struct ioc__qmp_cmd *cmd;
	struct ioc_daemon *d;
	json_t *args, *ret;
	struct ioc__qmp_err *err;
	bool done;
};

static void ioc_coroutine_fn run_co(void *opaque)
{
	struct run_co *r = opaque;

	r->ret = r->cmd->fn(r->d, r->args, r->err);
	r->done = true;
}

json_t *ioc_daemon_run(struct ioc_daemon *d, const char *name, json_t *args, unsigned flags,
		       struct ioc__qmp_err *err)
{
	const struct ioc__qmp_cmd *cmd = NULL;
	bool ok;

	pthread_once(&table_once, table_init);
	err->cls = "GenericError";
	for (size_t i = 0; i < ntable && !cmd; i++)
		if (strcmp(table[i].name, name) == 0)
			cmd = &table[i];
	if (!cmd || !cmd->fn) {
		err->cls = "CommandNotFound";
		ioc__qmp_errf(err, "The command %s has not been found", name);
		return NULL;
	}
	ok = cmd->spec ? ioc__qmp_check_value(cmd->spec(), args, flags, err->desc,
					      sizeof(err->desc))
		       : ioc__qmp_check(cmd->args, args, flags, err->desc, sizeof(err->desc));
	if (!ok)
		return NULL;
	if (cmd->co && !ioc_co_self()) {
		/* The command line, before any monitor: a coroutine, and the
		 * loop run until it ends. */
		struct run_co r = { cmd, d, args, NULL, err, false };
		struct ioc_co *co = ioc_co_create(run_co, &r);

		if (!co) {
			ioc__qmp_errf(err, "out of memory");
			return NULL;
		}
		ioc_co_enter(co);
		while (!r.done)
			ioc_loop_poll(d->opts.loop, true);
		return r.ret;
	}
	return cmd->fn(d, args, err);
}

/* ---- the monitors -------------------------------------------------------- */

static const char *const backend_values[] = { "socket", NULL };

static const struct ioc__qmp_arg chardev_opts[] = {
	{ "backend", IOC_QMP_ENUM, false, .values = backend_values },
	{ "id", IOC_QMP_STR, false },
	{ "path", IOC_QMP_STR, false },
	{ "server", IOC_QMP_BOOL, true },
	{ "wait", IOC_QMP_BOOL, true },
	{ NULL },
};

int ioc_daemon_chardev_add(struct ioc_daemon *d, json_t *opts, char *err, size_t errlen)
{
	const char *id, *path;
	int fd;

	if (!ioc__qmp_check(chardev_opts, opts, IOC_QMP_KEYVAL, err, errlen))
		return -EINVAL;
	id = json_string_value(json_object_get(opts, "id"));
	path = json_string_value(json_object_get(opts, "path"));
	if (!json_is_true(json_object_get(opts, "server"))) {
		snprintf(err, errlen, "chardev '%s': only server=on sockets are supported", id);
		return -ENOTSUP;
	}
	if (json_is_true(json_object_get(opts, "wait"))) {
		snprintf(err, errlen, "chardev '%s': wait=on is not supported (use wait=off)",
			 id);
		return -ENOTSUP;
	}
	for (unsigned i = 0; i < d->nchardevs; i++) {
		if (strcmp(d->chardevs[i].id, id) == 0) {
			snprintf(err, errlen, "attempt to add duplicate property '%s' to object "
				 "(type 'container')", id);
			return -EEXIST;
		}
	}
	if (d->nchardevs == IOC_DAEMON_MAX_MONITORS) {
		snprintf(err, errlen, "Too many chardevs (at most %d)", IOC_DAEMON_MAX_MONITORS);
		return -ENOSPC;
	}
	fd = ioc_nbd_listen_unix(path);
	if (fd < 0) {
		snprintf(err, errlen, "Failed to bind socket to %s: %s", path, ioc_strerror(fd));
		return fd;
	}
	d->chardevs[d->nchardevs].id = strdup(id);
	d->chardevs[d->nchardevs].path = strdup(path);
	d->chardevs[d->nchardevs].fd = fd;
	d->nchardevs++;
	return 0;
}

static const char *const mode_values[] = { "control", NULL };

static const struct ioc__qmp_arg monitor_opts[] = {
	{ "chardev", IOC_QMP_STR, false },
	{ "mode", IOC_QMP_ENUM, true, .values = mode_values },
	{ "pretty", IOC_QMP_BOOL, true },
	{ "id", IOC_QMP_STR, true },
	{ NULL },
};

int ioc_daemon_monitor_add(struct ioc_daemon *d, json_t *opts, char *err, size_t errlen)
{
	const char *id;
	int r;

	if (!ioc__qmp_check(monitor_opts, opts, IOC_QMP_KEYVAL, err, errlen))
		return -EINVAL;
	if (json_is_true(json_object_get(opts, "pretty"))) {
		snprintf(err, errlen, "Parameter 'pretty' is not supported");
		return -ENOTSUP;
	}
	id = json_string_value(json_object_get(opts, "chardev"));
	for (unsigned i = 0; i < d->nchardevs; i++) {
		if (strcmp(d->chardevs[i].id, id) != 0)
			continue;
		if (d->chardevs[i].fd < 0) {
			snprintf(err, errlen, "chardev '%s' is already in use", id);
			return -EBUSY;
		}
		if (d->nmonitors == IOC_DAEMON_MAX_MONITORS)
			return -ENOSPC;
		r = ioc__daemon_ctl_serve(&d->ctl, d->opts.loop, d->chardevs[i].fd,
					  &d->monitors[d->nmonitors]);
		if (r < 0) {
			snprintf(err, errlen, "monitor: %s", ioc_strerror(r));
			return r;
		}
		d->chardevs[i].fd = -1; /* the monitor's now */
		d->nmonitors++;
		return 0;
	}
	snprintf(err, errlen, "chardev \"%s\" not found", id);
	return -ENOENT;
}

/* ---- life ----------------------------------------------------------------- */

static void nbd_event(void *opaque, const char *name, void *data)
{
	ioc__daemon_event(opaque, name, data);
}

static unsigned graph_nodes(struct ioc__daemon_ctl *c, struct ioc_node **out, unsigned max)
{
	unsigned n = ioc_node_list(((struct ioc_daemon *)c)->graph, out, max);

	return n < max ? n : max;
}

static struct ioc_nbd_server *daemon_nbd(struct ioc__daemon_ctl *c)
{
	return ((struct ioc_daemon *)c)->env.nbd;
}

static struct ioc_loop *iothread_loop(void *opaque, const char *id)
{
	struct ioc_daemon_object *o = ioc__daemon_object_find(opaque, id);

	return o && o->iothread ? ioc_iothread_loop(o->iothread) : NULL;
}

int ioc_daemon_new(struct ioc_daemon **out, const struct ioc_daemon_opts *opts)
{
	struct ioc_daemon *d = calloc(1, sizeof(*d));
	int r;

	if (!d)
		return -ENOMEM;
	d->opts = *opts;
	pthread_once(&table_once, table_init);
	d->ctl = (struct ioc__daemon_ctl){
		.dirty = { ioc__daemon_find_node, d },
		.cmds = table, .ncmds = ntable,
		.quit = opts->quit, .quit_opaque = opts->opaque,
		.nodes = graph_nodes, .children = true,
		.exports = ioc__daemon_exports_json, .nbd = daemon_nbd,
	};
	ioc__daemon_ctl_init(&d->ctl, "iocore");
	r = ioc_node_graph_new(&d->graph);
	if (r < 0) {
		free(d);
		return r;
	}
	d->env = (struct ioc_export_env){
		.graph = d->graph, .main_loop = opts->loop, .iothread = iothread_loop,
		.opaque = d, .event = nbd_event,
	};
	*out = d;
	return 0;
}

void ioc_daemon_free(struct ioc_daemon *d)
{
	if (!d)
		return;
	ioc__daemon_exports_stop(d);
	for (unsigned i = 0; i < d->nmonitors; i++) {
		ioc__qmp_flush(d->monitors[i]);
		ioc__qmp_free(d->monitors[i]);
	}
	for (unsigned i = 0; i < d->nchardevs; i++) {
		if (d->chardevs[i].fd >= 0)
			close(d->chardevs[i].fd);
		unlink(d->chardevs[i].path);
		free(d->chardevs[i].path);
		free(d->chardevs[i].id);
	}
	/* The I/O threads first: each leaves the nodes it used, which then
	 * close without calling back into a stopped loop. */
	ioc__daemon_objects_free(d);
	ioc_node_graph_free(d->graph);
	free(d);
}
