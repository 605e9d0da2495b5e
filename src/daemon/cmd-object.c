/*
 * Objects (object-add, object-del, --object): I/O threads, each a loop on
 * a thread of its own (QEMU's poll-max-ns, poll-grow and poll-shrink set
 * its adaptive polling), and TLS credentials for the NBD server, X.509
 * from a directory laid out as QEMU's tls-creds-x509 wants it or
 * pre-shared keys from DIR/keys.psk as tls-creds-psk wants it.  The
 * credentials are read when the NBD server starts with them, and an
 * object something uses cannot be deleted.  query-iothreads lists the
 * threads as QEMU's system emulator does.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon.h"

static const char *const qom_types[] = {
	"iothread", "tls-creds-x509", "tls-creds-psk", "tls-creds-anon", "authz-simple",
	"secret", "memory-backend-file", "memory-backend-memfd", "throttle-group", NULL,
};
static const char *const endpoint_values[] = { "server", "client", NULL };

static const struct ioc__qmp_arg base[] = {
	{ "qom-type", IOC_QMP_ENUM, false, .values = qom_types },
	{ "id", IOC_QMP_STR, false },
	{ NULL },
};
static const struct ioc__qmp_arg iothread_props[] = {
	{ "poll-max-ns", IOC_QMP_INT, true, .min = 0, .max = INT32_MAX },
	{ "poll-grow", IOC_QMP_INT, true, .min = 0, .max = INT32_MAX },
	{ "poll-shrink", IOC_QMP_INT, true, .min = 0, .max = INT32_MAX },
	{ "aio-max-batch", IOC_QMP_INT, true, .min = 0, .max = INT32_MAX },
	{ NULL },
};
/* The properties of QEMU's tls-creds class, which every tls-creds-*
 * type inherits. */
#define TLS_CREDS_PROPS                                                  \
	{ "dir", IOC_QMP_STR, true },                                    \
	{ "endpoint", IOC_QMP_ENUM, true, .values = endpoint_values },   \
	{ "verify-peer", IOC_QMP_BOOL, true },                           \
	{ "loaded", IOC_QMP_BOOL, true },                                \
	{ "priority", IOC_QMP_STR, true }
static const struct ioc__qmp_arg x509_props[] = {
	TLS_CREDS_PROPS,
	{ "sanity-check", IOC_QMP_BOOL, true },
	{ NULL },
};
static const struct ioc__qmp_arg psk_props[] = {
	TLS_CREDS_PROPS,
	{ "username", IOC_QMP_STR, true },
	{ NULL },
};
#undef TLS_CREDS_PROPS
static const struct ioc__qmp_arg open_props[] = { { NULL } };
static const struct ioc__qmp_variant variants[] = {
	{ "iothread", iothread_props }, { "tls-creds-x509", x509_props },
	{ "tls-creds-psk", psk_props }, { "tls-creds-anon", open_props },
	{ "authz-simple", open_props }, { "secret", open_props },
	{ "memory-backend-file", open_props }, { "memory-backend-memfd", open_props },
	{ "throttle-group", open_props }, { NULL },
};
static const struct ioc__qmp_arg spec = {
	.name = "", .type = IOC_QMP_OBJECT, .members = base, .tag = "qom-type",
	.variants = variants, .open = true,
};

static const struct ioc__qmp_arg *object_spec(void)
{
	return &spec;
}

const struct ioc__qmp_arg *ioc_daemon_object_spec(void)
{
	return &spec;
}

struct ioc_daemon_object *ioc__daemon_object_find(struct ioc_daemon *d, const char *id)
{
	for (unsigned i = 0; id && i < IOC_DAEMON_MAX_OBJECTS; i++)
		if (d->objects[i] && strcmp(d->objects[i]->id, id) == 0)
			return d->objects[i];
	return NULL;
}

/* On an I/O thread about to stop: it leaves every node of the graph. */
static int leave_nodes(void *arg)
{
	struct ioc_daemon *d = arg;
	struct ioc_node *nodes[256];
	unsigned n = ioc_node_list(d->graph, nodes, IOC_ARRAY_SIZE(nodes));

	for (unsigned i = 0; i < n && i < IOC_ARRAY_SIZE(nodes); i++)
		ioc_node_loop_exit(nodes[i]);
	ioc_node_graph_detach_loop(d->graph, ioc_loop_current());
	return 0;
}

static void object_free(struct ioc_daemon *d, struct ioc_daemon_object *o)
{
	if (o->iothread) {
		ioc_iothread_call(o->iothread, leave_nodes, d);
		ioc_iothread_stop(o->iothread);
	}
	free(o->dir);
	free(o->psk_file);
	free(o->id);
	free(o);
}

static json_t *cmd_object_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *type = json_string_value(json_object_get(args, "qom-type"));
	const char *id = json_string_value(json_object_get(args, "id"));
	const struct ioc__qmp_variant *v = variants;
	struct ioc_daemon_object *o;
	int slot, r;

	while (v->value && strcmp(v->value, type))
		v++;
	if (v->members == open_props) {
		ioc__qmp_errf(err, "Object type '%s' is not supported by this daemon", type);
		return NULL;
	}
	if (ioc__daemon_object_find(d, id)) {
		ioc__qmp_errf(err, "attempt to add duplicate property '%s' to object "
				 "(type 'container')", id);
		return NULL;
	}
	slot = IOC__DAEMON_FREE_SLOT(d->objects);
	if (slot < 0) {
		ioc__qmp_errf(err, "Too many objects (at most %d)", IOC_DAEMON_MAX_OBJECTS);
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (!o || !(o->id = strdup(id))) {
		free(o);
		ioc__qmp_errf(err, "Out of memory");
		return NULL;
	}
	o->type = v->value;
	if (strcmp(type, "iothread") == 0) {
		struct ioc_iothread_opts to = { .name = "ioc-iothread", .cpu = -1 };
		json_t *pm = json_object_get(args, "poll-max-ns");

		if (pm)
			to.loop.poll_max_ns = json_integer_value(pm) ? json_integer_value(pm)
								      : -1;
		to.loop.poll_grow = (unsigned)json_integer_value(json_object_get(args,
							"poll-grow"));
		to.loop.poll_shrink = (unsigned)json_integer_value(json_object_get(args,
							"poll-shrink"));
		r = ioc_iothread_start(&o->iothread, &to);
		if (r < 0) {
			ioc__qmp_errf(err, "Could not start iothread '%s': %s", id,
					 ioc_strerror(r));
			object_free(d, o);
			return NULL;
		}
	} else {
		const char *dir = json_string_value(json_object_get(args, "dir"));
		const char *ep = json_string_value(json_object_get(args, "endpoint"));

		if (!dir) {
			ioc__qmp_errf(err, "Parameter 'dir' is missing");
			object_free(d, o);
			return NULL;
		}
		o->dir = strdup(dir);
		o->server = !ep || strcmp(ep, "client") != 0;
		/* QEMU's default: a server verifies its clients' certificates. */
		o->verify_peer = !json_is_false(json_object_get(args, "verify-peer"));
		if (strcmp(type, "tls-creds-psk") == 0) {
			if (asprintf(&o->psk_file, "%s/keys.psk", dir) < 0)
				o->psk_file = NULL;
			o->verify_peer = false;
		}
		if (!o->dir || (strcmp(type, "tls-creds-psk") == 0 && !o->psk_file)) {
			ioc__qmp_errf(err, "Out of memory");
			object_free(d, o);
			return NULL;
		}
	}
	d->objects[slot] = o;
	return json_object();
}

static json_t *cmd_object_del(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	const char *id = json_string_value(json_object_get(args, "id"));

	for (int i = 0; i < IOC_DAEMON_MAX_OBJECTS; i++) {
		struct ioc_daemon_object *o = d->objects[i];
		bool used = false;

		if (!o || strcmp(o->id, id) != 0)
			continue;
		for (int k = 0; k < IOC_DAEMON_MAX_EXPORTS; k++) {
			size_t j;
			json_t *t;

			json_array_foreach(d->exports[k] ? d->exports[k]->iothreads : NULL, j, t)
				used |= strcmp(json_string_value(t), id) == 0;
		}
		if (used || o->users) {
			ioc__qmp_errf(err, "object '%s' is in use, can not be deleted", id);
			return NULL;
		}
		d->objects[i] = NULL;
		object_free(d, o);
		return json_object();
	}
	ioc__qmp_errf(err, "object '%s' not found", id);
	return NULL;
}

struct tid_arg {
	long tid;
};

static int get_tid(void *arg)
{
	((struct tid_arg *)arg)->tid = (long)syscall(SYS_gettid);
	return 0;
}

static json_t *cmd_query_iothreads(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_daemon *d = ctx;
	json_t *list = json_array();

	for (int i = 0; i < IOC_DAEMON_MAX_OBJECTS && list; i++) {
		struct ioc_daemon_object *o = d->objects[i];
		struct tid_arg t = { 0 };

		if (!o || !o->iothread)
			continue;
		ioc_iothread_call(o->iothread, get_tid, &t);
		json_array_append_new(list, json_pack("{s:s,s:I,s:I,s:i,s:i,s:i}",
			"id", o->id, "thread-id", (json_int_t)t.tid, "poll-max-ns", (json_int_t)0,
			"poll-grow", 0, "poll-shrink", 0, "aio-max-batch", 0));
	}
	return list;
}

/* The coroutine pool, process-wide: "created" not growing under a steady
 * load is the pool doing its job (no stack mapped after warm-up). */
static json_t *cmd_query_coroutines(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_co_pool_stats st;

	ioc_co_pool_get_stats(&st);
	return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "created", (json_int_t)st.created,
			 "reused", (json_int_t)st.reused, "freed", (json_int_t)st.freed,
			 "pooled", (json_int_t)st.pooled, "max-pooled", (json_int_t)st.max_pooled,
			 "reserved", (json_int_t)st.reserved);
}

void ioc__daemon_objects_free(struct ioc_daemon *d)
{
	for (int i = 0; i < IOC_DAEMON_MAX_OBJECTS; i++) {
		if (d->objects[i])
			object_free(d, d->objects[i]);
		d->objects[i] = NULL;
	}
}

static const struct ioc__qmp_arg args_del[] = {
	{ "id", IOC_QMP_STR, false }, { NULL },
};

const struct ioc__qmp_cmd ioc__daemon_object_cmds[] = {
	{ "object-add", cmd_object_add, NULL, object_spec },
	{ "object-del", cmd_object_del, args_del },
	{ "query-iothreads", cmd_query_iothreads, NULL },
	{ "__org.iocore_query-coroutines", cmd_query_coroutines, NULL },
	{ NULL },
};
