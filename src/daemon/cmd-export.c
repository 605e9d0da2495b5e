/*
 * Export commands: the NBD server (nbd-server-start, nbd-server-stop,
 * and its clients in __org.iocore_query-connections) and exports of any
 * type (block-export-add, block-export-del with QEMU's safe and hard
 * modes, query-block-exports).  An export leaves the list,
 * and BLOCK_EXPORT_DELETED goes to every monitor, when its driver says it
 * is gone, which for a hard deletion with clients is after the reply.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nbd/nbd.h"
#include "daemon.h"

static int export_slot(struct ioc_daemon *d, const char *id)
{
	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
		if (d->exports[i] && strcmp(d->exports[i]->id, id) == 0)
			return i;
	return -1;
}

static void export_deleted(struct ioc_export *ex, void *opaque)
{
	struct ioc_daemon *d = opaque;
	int i = export_slot(d, ex->id);

	if (i >= 0)
		d->exports[i] = NULL;
	ioc__daemon_event(d, "BLOCK_EXPORT_DELETED", json_pack("{s:s}", "id", ex->id));
}

static json_t *cmd_export_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *id = json_string_value(json_object_get(args, "id"));
	struct ioc_export *ex;
	int slot;

	if (export_slot(d, id) >= 0) {
		ioc__qmp_errf(err, "Block export id '%s' is already in use", id);
		return NULL;
	}
	slot = IOC__DAEMON_FREE_SLOT(d->exports);
	if (slot < 0) {
		ioc__qmp_errf(err, "Too many exports (at most %d)", IOC_DAEMON_MAX_EXPORTS);
		return NULL;
	}
	if (ioc_export_add(&d->env, args, 0, &ex, err->desc, sizeof(err->desc)) < 0)
		return NULL;
	ex->seq = ++d->export_seq;
	ex->deleted = export_deleted;
	ex->deleted_opaque = d;
	d->exports[slot] = ex;
	return json_object();
}

static json_t *cmd_export_del(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *id = json_string_value(json_object_get(args, "id"));
	const char *mode = json_string_value(json_object_get(args, "mode"));
	int i = export_slot(d, id);

	if (i < 0) {
		ioc__qmp_errf(err, "Export '%s' is not found", id);
		return NULL;
	}
	if (ioc_export_del(d->exports[i], mode && strcmp(mode, "hard") == 0, err->desc,
			   sizeof(err->desc)) < 0)
		return NULL;
	return json_object();
}

json_t *ioc__daemon_exports_json(struct ioc__daemon_ctl *c)
{
	struct ioc_daemon *d = (struct ioc_daemon *)c;
	json_t *list = json_array();
	unsigned long below = ~0ul;

	/* Newest first, as QEMU lists them. */
	for (;;) {
		struct ioc_export *next = NULL;

		for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
			if (d->exports[i] && d->exports[i]->seq < below &&
			    (!next || d->exports[i]->seq > next->seq))
				next = d->exports[i];
		if (!next || !list)
			return list;
		json_array_append_new(list, ioc_export_info_json(next));
		below = next->seq;
	}
}

static int nbd_start(struct ioc_daemon *d, json_t *args, bool legacy,
		     struct ioc__qmp_err *err)
{
	const char *creds = json_string_value(json_object_get(args, "tls-creds"));
	struct ioc_daemon_object *o = NULL;
	struct ioc_nbd_tls_opts tls = { .mode = IOC_NBD_TLS_REQUIRE };
	int r;

	if (creds) {
		o = ioc__daemon_object_find(d, creds);
		if (!o || !o->dir) {
			ioc__qmp_errf(err, "No TLS credentials with id '%s'", creds);
			return -ENOENT;
		}
		if (!o->server) {
			ioc__qmp_errf(err, "Expecting TLS credentials with a server endpoint");
			return -EINVAL;
		}
		tls.certificates = o->psk_file ? NULL : o->dir;
		tls.psk_file = o->psk_file;
		tls.verify_peer = o->verify_peer;
	}
	r = ioc_export_nbd_server_start(&d->env, args, legacy, o ? &tls : NULL,
					d->opts.nbd_iothreads, err->desc, sizeof(err->desc));
	if (r == 0 && o) {
		o->users++;
		d->nbd_tls = o;
	}
	return r;
}

int ioc__daemon_nbd_server_start(struct ioc_daemon *d, json_t *args, char *err,
				 size_t errlen)
{
	struct ioc__qmp_err e = { .cls = "GenericError" };
	int r;

	if (!ioc__qmp_check(ioc__export_nbd_server_opts, args, IOC_QMP_KEYVAL, err, errlen))
		return -EINVAL;
	r = nbd_start(d, args, false, &e);
	if (r < 0)
		snprintf(err, errlen, "%s", e.desc);
	return r;
}

static json_t *cmd_nbd_start(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return nbd_start(ctx, args, true, err) < 0 ? NULL : json_object();
}

/* Every NBD export goes with the server (hard), as in QEMU. */
static void nbd_stop(struct ioc_daemon *d)
{
	char msg[256];

	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
		if (d->exports[i] && strcmp(d->exports[i]->drv->type, "nbd") == 0)
			ioc_export_del(d->exports[i], true, msg, sizeof(msg));
	ioc_export_nbd_server_stop(&d->env);
	if (d->nbd_tls) {
		d->nbd_tls->users--;
		d->nbd_tls = NULL;
	}
}

static json_t *cmd_nbd_stop(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;

	if (!d->env.nbd) {
		ioc__qmp_errf(err, "NBD server not running");
		return NULL;
	}
	nbd_stop(d);
	return json_object();
}

static void stop_tick(void *opaque)
{
}

static bool any_export(struct ioc_daemon *d)
{
	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
		if (d->exports[i])
			return true;
	return false;
}

/* At exit: every export deleted (hard), and the main loop run until the
 * last is gone (a front end's requests in flight complete first), however
 * long: the nodes and I/O threads must outlive what still uses them, and
 * a node may hold acknowledged writes that only its close makes durable.
 * After 10 s the exports still there are named on stderr, once. */
void ioc__daemon_exports_stop(struct ioc_daemon *d)
{
	int64_t deadline = ioc_now_ns() + 10ll * 1000000000;
	struct ioc_timer tick;
	char msg[256];

	nbd_stop(d);
	for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
		if (d->exports[i] && !d->exports[i]->shutting_down)
			ioc_export_del(d->exports[i], true, msg, sizeof(msg));
	ioc_timer_init(&tick, d->opts.loop, stop_tick, NULL);
	while (any_export(d)) {
		if (deadline && ioc_now_ns() >= deadline) {
			for (int i = 0; i < IOC_DAEMON_MAX_EXPORTS; i++)
				if (d->exports[i])
					fprintf(stderr, "export '%s' of node '%s' still has "
						"requests in flight; waiting for them\n",
						d->exports[i]->id, d->exports[i]->node->name);
			deadline = 0;
		}
		ioc_timer_arm_in(&tick, 50 * 1000000);
		ioc_loop_poll(d->opts.loop, true);
	}
	ioc_timer_cancel(&tick);
}

static const char *const mode_values[] = { "safe", "hard", NULL };

static const struct ioc__qmp_arg args_del[] = {
	{ "id", IOC_QMP_STR, false },
	{ "mode", IOC_QMP_ENUM, true, .values = mode_values },
	{ NULL },
};

const struct ioc__qmp_cmd ioc__daemon_export_cmds[] = {
	{ "nbd-server-start", cmd_nbd_start, ioc__export_nbd_server_legacy_opts },
	{ "nbd-server-stop", cmd_nbd_stop, NULL },
	{ "block-export-add", cmd_export_add, NULL, ioc_export_spec },
	{ "block-export-del", cmd_export_del, args_del },
	IOC_DAEMON_CMD_QUERY_EXPORTS,
	IOC_DAEMON_CMD_QUERY_CONNECTIONS,
	{ NULL },
};
