/*
 * The export table: BlockExportOptions checked in one place (the common
 * members, then the type's own through a union on "type"), the node found
 * and held, and the driver created.  Deleting asks the driver, which may
 * finish at once (no clients) or later (its clients' connections close);
 * either way ioc_export_gone() releases the node and tells the owner, who
 * emits BLOCK_EXPORT_DELETED.  No driver is told anything about another.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"

static const struct ioc_export_drv *const drivers[] = {
	&ioc__export_drv_nbd,
	&ioc__export_drv_vhost_user_blk,
};

/* QEMU's BlockExportType: every type it knows, so that a type iocore
 * lacks is refused by name rather than as an unknown value. */
static const char *const type_values[] = {
	"nbd", "vhost-user-blk", "fuse", "vduse-blk", NULL,
};

static const struct ioc__qmp_arg common_opts[] = {
	{ "type", IOC_QMP_ENUM, false, .values = type_values },
	{ "id", IOC_QMP_STR, false },
	{ "node-name", IOC_QMP_STR, false },
	{ "writable", IOC_QMP_BOOL, true },
	{ "writethrough", IOC_QMP_BOOL, true },
	/* One name, or (vhost-user-blk) a list of them: checked below. */
	{ "iothread", IOC_QMP_ANY, true },
	{ "fixed-iothread", IOC_QMP_BOOL, true },
	{ NULL },
};

static const char *const addr_types[] = { "inet", "unix", "fd", "vsock", NULL };

const struct ioc__qmp_arg ioc__export_addr_base[] = {
	{ "type", IOC_QMP_ENUM, false, .values = addr_types }, { NULL },
};
const struct ioc__qmp_arg ioc__export_unix_members[] = {
	{ "path", IOC_QMP_STR, false }, { "abstract", IOC_QMP_BOOL, true },
	{ "tight", IOC_QMP_BOOL, true }, { NULL },
};
const struct ioc__qmp_arg ioc__export_fd_members[] = {
	{ "str", IOC_QMP_STR, false }, { NULL },
};
const struct ioc__qmp_arg ioc__export_no_members[] = { { NULL } };

static struct ioc__qmp_variant variants[IOC_ARRAY_SIZE(type_values)];
static struct ioc__qmp_arg spec;
static pthread_once_t spec_once = PTHREAD_ONCE_INIT;

static void spec_init(void)
{
	size_t k = 0;

	for (const char *const *t = type_values; *t; t++) {
		const struct ioc_export_drv *d = ioc_export_drv_find(*t);

		/* A type without a driver: its members are not checked here;
		 * ioc_export_add() refuses it by name. */
		variants[k++] = (struct ioc__qmp_variant){ *t, d ? d->opts : ioc__export_no_members };
	}
	spec = (struct ioc__qmp_arg){ .name = "x", .type = IOC_QMP_OBJECT,
				      .members = common_opts, .tag = "type",
				      .variants = variants };
}

const struct ioc__qmp_arg *ioc_export_spec(void)
{
	pthread_once(&spec_once, spec_init);
	return &spec;
}

const struct ioc_export_drv *ioc_export_drv_find(const char *type)
{
	for (size_t i = 0; type && i < IOC_ARRAY_SIZE(drivers); i++)
		if (strcmp(drivers[i]->type, type) == 0)
			return drivers[i];
	return NULL;
}

static bool check(json_t *opts, unsigned flags, char *err, size_t errlen)
{
	const char *type = json_string_value(json_object_get(opts, "type"));

	/* A known type without a driver: only its name matters. */
	if (type && !ioc_export_drv_find(type)) {
		for (const char *const *t = type_values; *t; t++) {
			if (strcmp(*t, type) == 0) {
				snprintf(err, errlen, "Export type '%s' is not supported by "
					 "this daemon", type);
				return false;
			}
		}
	}
	return ioc__qmp_check_value(ioc_export_spec(), opts, flags, err, errlen);
}

int ioc_export_add(struct ioc_export_env *env, json_t *opts, unsigned flags,
		   struct ioc_export **out, char *err, size_t errlen)
{
	const char *nodename, *type;
	json_t *th, *t;
	struct ioc_export *ex;
	struct ioc_node *n;
	char desc[128];
	size_t i;
	int ret;

	if (!check(opts, flags, err, errlen))
		return -EINVAL;
	nodename = json_string_value(json_object_get(opts, "node-name"));
	type = json_string_value(json_object_get(opts, "type"));
	th = json_object_get(opts, "iothread");
	n = ioc_node_find(env->graph, nodename);
	if (!n) {
		snprintf(err, errlen, "Cannot find device='' nor node-name='%s'", nodename);
		return -ENOENT;
	}
	if (th && !json_is_string(th) &&
	    !(json_is_array(th) && json_array_size(th) && strcmp(type, "vhost-user-blk") == 0)) {
		snprintf(err, errlen, json_is_array(th) ?
			 "Parameter 'iothread' takes a list only for vhost-user-blk exports" :
			 "Invalid parameter type for 'iothread', expected: string");
		return -EINVAL;
	}
	json_array_foreach(json_is_array(th) ? th : NULL, i, t) {
		if (!json_is_string(t)) {
			snprintf(err, errlen, "Invalid parameter type for 'iothread[%zu]', "
				 "expected: string", i);
			return -EINVAL;
		}
	}
	for (i = 0; i < (json_is_array(th) ? json_array_size(th) : th ? 1 : 0); i++) {
		const char *id = json_string_value(json_is_array(th) ? json_array_get(th, i) : th);

		if (!env->iothread(env->opaque, id)) {
			snprintf(err, errlen, "iothread \"%s\" not found", id);
			return -ENOENT;
		}
	}
	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return -ENOMEM;
	ex->id = strdup(json_string_value(json_object_get(opts, "id")));
	ex->iothreads = json_is_array(th) ? json_deep_copy(th) : th ? json_pack("[O]", th)
								    : json_array();
	ex->drv = ioc_export_drv_find(type);
	ex->env = env;
	ex->node = n;
	ex->writable = json_is_true(json_object_get(opts, "writable"));
	if (!ex->id || !ex->iothreads) {
		ret = -ENOMEM;
		goto fail;
	}
	if (ex->writable && n->read_only) {
		snprintf(err, errlen, "Block node is read-only");
		ret = -EPERM;
		goto fail;
	}
	ret = ex->drv->create(ex, opts, err, errlen);
	if (ret < 0)
		goto fail;
	snprintf(desc, sizeof(desc), "block export '%s'", ex->id);
	ioc_node_use(n, desc);
	*out = ex;
	return 0;
fail:
	json_decref(ex->iothreads);
	free(ex->id);
	free(ex);
	return ret;
}

int ioc_export_del(struct ioc_export *ex, bool hard, char *err, size_t errlen)
{
	int ret;

	if (ex->shutting_down && !hard) {
		snprintf(err, errlen, "Export '%s' is already shutting down", ex->id);
		return -EBUSY;
	}
	ex->shutting_down = true;
	ret = ex->drv->del(ex, hard, err, errlen);
	if (ret < 0)
		ex->shutting_down = false;
	return ret;
}

void ioc_export_gone(struct ioc_export *ex)
{
	struct ioc_node *n = ex->node;

	if (ex->deleted)
		ex->deleted(ex, ex->deleted_opaque);
	ioc_node_unuse(n);
	json_decref(ex->iothreads);
	free(ex->id);
	free(ex);
}

json_t *ioc_export_info_json(struct ioc_export *ex)
{
	json_t *j = json_pack("{s:s,s:s,s:s,s:b}", "id", ex->id, "type", ex->drv->type,
			      "node-name", ex->node->name, "shutting-down", ex->shutting_down);

	if (j && ex->drv->info)
		ex->drv->info(ex, j);
	return j;
}
