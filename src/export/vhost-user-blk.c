/*
 * The vhost-user-blk export type over the back end in vhost-user-blk/:
 * QEMU's options (addr as a Unix socket path or an inherited listening
 * fd, logical-block-size, num-queues), and iothread as one I/O thread or,
 * beyond QEMU, a list of them: queue i runs on the i-th modulo their
 * number, each polled in userspace while busy.  Without iothread the
 * queues run on the main loop, as QEMU's do.  The serial that GET_ID
 * answers is __org.iocore_serial, by default the export's id.  Deleting disconnects the front end
 * (its requests in flight complete first), in either mode: a guest
 * cannot be asked to let go, so safe refuses only while one is
 * connected, as QEMU refuses a safe deletion with clients.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "vhost-user-blk/vhost-user-blk.h"

/* inet and vsock pass the check (addr is open); vub_create() refuses them. */
static const struct ioc__qmp_variant addr_variants[] = {
	{ "unix", ioc__export_unix_members }, { "fd", ioc__export_fd_members },
	{ "inet", ioc__export_no_members }, { "vsock", ioc__export_no_members }, { NULL },
};

static const struct ioc__qmp_arg vub_opts[] = {
	{ "addr", IOC_QMP_OBJECT, false, .members = ioc__export_addr_base, .tag = "type",
	  .variants = addr_variants, .open = true },
	{ "logical-block-size", IOC_QMP_SIZE, true, .min = 512, .max = 65536 },
	{ "num-queues", IOC_QMP_UINT, true, .min = 1, .max = IOC_VUB_MAX_QUEUES },
	{ "__org.iocore_serial", IOC_QMP_STR, true },
	{ NULL },
};

static void vub_log(void *opaque, const char *line)
{
	fprintf(stderr, "%s\n", line);
}

static int vub_create(struct ioc_export *ex, json_t *opts, char *err, size_t errlen)
{
	json_t *addr = json_object_get(opts, "addr");
	const char *type = json_string_value(json_object_get(addr, "type"));
	json_t *threads = json_object_get(opts, "iothread");
	struct ioc_loop *loops[IOC_VUB_MAX_QUEUES];
	struct ioc__vub_export *e;
	struct ioc__vub_opts o = {
		.id = ex->id,
		.node = ex->node,
		.listen_fd = -1,
		.writable = ex->writable,
		.logical_block_size = (uint32_t)json_integer_value(json_object_get(opts,
							"logical-block-size")),
		.num_queues = (unsigned)json_integer_value(json_object_get(opts, "num-queues")),
		/* Default: the export's id, so a guest tells its disks apart
		 * (QEMU answers "vhost_user_blk" for every one). */
		.serial = json_string_value(json_object_get(opts, "__org.iocore_serial")) ?:
			  ex->id,
		.loops = loops,
		.ctrl_loop = ex->env->main_loop,
		.log = vub_log,
		.log_opaque = ex->id,
	};
	size_t i;
	json_t *t;

	if (strcmp(type, "unix") == 0) {
		if (json_is_true(json_object_get(addr, "abstract"))) {
			snprintf(err, errlen, "Abstract Unix sockets are not supported");
			return -ENOTSUP;
		}
		o.socket_path = json_string_value(json_object_get(addr, "path"));
	} else if (strcmp(type, "fd") == 0) {
		const char *s = json_string_value(json_object_get(addr, "str"));
		char *end;
		long v = strtol(s, &end, 10);

		if (!*s || *end || v < 0 || v > INT32_MAX) {
			snprintf(err, errlen, "File descriptor '%s' is not a number (monitor fd "
				 "names are not supported)", s);
			return -EINVAL;
		}
		o.listen_fd = (int)v;
	} else {
		snprintf(err, errlen, "vhost-user-blk exports only listen on Unix sockets "
			 "(addr.type=unix or fd), not '%s'", type);
		return -ENOTSUP;
	}
	/* iothread: one name, or a list of them (checked by the export layer). */
	if (json_is_string(threads)) {
		loops[o.nloops++] = ex->env->iothread(ex->env->opaque, json_string_value(threads));
	} else {
		json_array_foreach(threads, i, t) {
			if (o.nloops == IOC_VUB_MAX_QUEUES)
				break;
			loops[o.nloops++] = ex->env->iothread(ex->env->opaque,
							      json_string_value(t));
		}
	}
	return ioc__vub_export_new(&e, &o, err, errlen) ?: (ex->opaque = e, 0);
}

static void vub_done(void *opaque)
{
	ioc_export_gone(opaque);
}

static int vub_del(struct ioc_export *ex, bool hard, char *err, size_t errlen)
{
	struct ioc__vub_info info;

	ioc__vub_export_info(ex->opaque, &info);
	if (!hard && info.connected) {
		snprintf(err, errlen, "export '%s' still in use", ex->id);
		return -EBUSY;
	}
	ioc__vub_export_close(ex->opaque, vub_done, ex);
	return 0;
}

/* query-block-exports: whether a front end is connected and what each
 * queue served (iocore's members, under the vendor prefix). */
static void vub_info(struct ioc_export *ex, json_t *obj)
{
	struct ioc__vub_info info;
	json_t *q = json_array();

	ioc__vub_export_info(ex->opaque, &info);
	for (unsigned i = 0; q && i < info.num_queues; i++)
		json_array_append_new(q, json_integer((json_int_t)info.queue_requests[i]));
	json_object_set_new(obj, "__org.iocore_vhost-user-blk", json_pack("{s:b,s:I,s:I,s:o*}",
		"connected", info.connected, "connections", (json_int_t)info.connections,
		"requests", (json_int_t)info.requests, "queue-requests", q));
}

/* GET_CONFIG reads the node's size: the guest rereads it on the config-
 * change message (when the front end gave a back-end channel). */
static void vub_resized(struct ioc_export *ex)
{
	ioc__vub_export_config_changed(ex->opaque);
}

const struct ioc_export_drv ioc__export_drv_vhost_user_blk = {
	.type = "vhost-user-blk",
	.opts = vub_opts,
	.create = vub_create,
	.del = vub_del,
	.info = vub_info,
	.resized = vub_resized,
};
