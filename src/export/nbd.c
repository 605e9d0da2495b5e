/*
 * The NBD export type over the NBD server (src/nbd): nbd-server-start
 * makes the daemon's one NBD server (its listener, TLS credentials and
 * connection limit, as qemu-storage-daemon's), and each export of type
 * "nbd" is one export of that server serving a node.  The server keeps
 * its own I/O threads, where each connection runs its handshake; an
 * export with "iothread" gives the server that I/O thread's loop, and
 * its connections move there once they chose it, as QEMU runs an
 * export's clients in its iothread's AioContext (the handshake in the
 * main one).  Without it they stay on the server's threads.  The
 * daemon's I/O thread objects outlive the exports that name them
 * (object-del refuses one in use) and leave the nodes when they stop.
 * "fixed-iothread" asks that the node not move to another thread: an
 * iocore node serves any loop and never moves, so it always holds.
 *
 * Deletion is the server's: safe refuses while a client is connected,
 * hard disconnects them; the server calls back once the last connection
 * of the export is gone, and the export is then gone too.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd/nbd.h"
#include "export.h"

/* ---- the server --------------------------------------------------------- */

static const struct ioc__qmp_arg inet_members[] = {
	{ "host", IOC_QMP_STR, false }, { "port", IOC_QMP_STR, false },
	{ "numeric", IOC_QMP_BOOL, true }, { "to", IOC_QMP_UINT, true },
	{ "ipv4", IOC_QMP_BOOL, true }, { "ipv6", IOC_QMP_BOOL, true },
	{ "keep-alive", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg vsock_members[] = {
	{ "cid", IOC_QMP_STR, false }, { "port", IOC_QMP_STR, false }, { NULL },
};
static const struct ioc__qmp_variant addr_variants[] = {
	{ "inet", inet_members }, { "unix", ioc__export_unix_members },
	{ "fd", ioc__export_fd_members }, { "vsock", vsock_members }, { NULL },
};
/* SocketAddressLegacy: {"type": T, "data": {...}}. */
static const struct ioc__qmp_arg data_inet[] = {
	{ "data", IOC_QMP_OBJECT, false, .members = inet_members }, { NULL } };
static const struct ioc__qmp_arg data_unix[] = {
	{ "data", IOC_QMP_OBJECT, false, .members = ioc__export_unix_members }, { NULL } };
static const struct ioc__qmp_arg data_fd[] = {
	{ "data", IOC_QMP_OBJECT, false, .members = ioc__export_fd_members }, { NULL } };
static const struct ioc__qmp_arg data_vsock[] = {
	{ "data", IOC_QMP_OBJECT, false, .members = vsock_members }, { NULL } };
static const struct ioc__qmp_variant legacy_variants[] = {
	{ "inet", data_inet }, { "unix", data_unix }, { "fd", data_fd },
	{ "vsock", data_vsock }, { NULL },
};

/* The NBD server's options (--nbd-server, nbd-server-start), addr in one
 * form or the other (SocketAddress or SocketAddressLegacy). */
#define NBD_SERVER_OPTS(addr_forms)                                                      \
	{ "addr", IOC_QMP_OBJECT, false, .members = ioc__export_addr_base, .tag = "type", \
	  .variants = addr_forms },                                                      \
	{ "tls-creds", IOC_QMP_STR, true },                                              \
	{ "tls-authz", IOC_QMP_STR, true },                                              \
	{ "max-connections", IOC_QMP_UINT, true, .min = 0, .max = UINT32_MAX },          \
	{ NULL }
const struct ioc__qmp_arg ioc__export_nbd_server_opts[] = { NBD_SERVER_OPTS(addr_variants) };
const struct ioc__qmp_arg ioc__export_nbd_server_legacy_opts[] = {
	NBD_SERVER_OPTS(legacy_variants)
};
#undef NBD_SERVER_OPTS

static int listen_addr(json_t *addr, bool legacy, char *err, size_t errlen)
{
	const char *type = json_string_value(json_object_get(addr, "type"));
	json_t *a = legacy ? json_object_get(addr, "data") : addr;
	int fd;

	if (strcmp(type, "unix") == 0) {
		const char *path = json_string_value(json_object_get(a, "path"));

		if (json_is_true(json_object_get(a, "abstract"))) {
			snprintf(err, errlen, "Abstract Unix sockets are not supported");
			return -ENOTSUP;
		}
		fd = ioc_nbd_listen_unix(path); /* replaces a stale socket only */
		if (fd < 0)
			snprintf(err, errlen, "Failed to bind socket to %s: %s", path,
				 ioc_strerror(fd));
		return fd;
	}
	if (strcmp(type, "inet") == 0) {
		const char *host = json_string_value(json_object_get(a, "host"));
		const char *port = json_string_value(json_object_get(a, "port"));

		fd = ioc_nbd_listen_tcp(host, port);
		if (fd < 0)
			snprintf(err, errlen, "Failed to bind socket to %s:%s: %s", host, port,
				 ioc_strerror(fd));
		return fd;
	}
	if (strcmp(type, "fd") == 0) {
		const char *s = json_string_value(json_object_get(a, "str"));
		char *end;
		long v = strtol(s, &end, 10);

		if (*s && !*end && v >= 0 && v <= INT32_MAX)
			return (int)v;
		snprintf(err, errlen, "File descriptor '%s' is not a number (monitor fd "
			 "names are not supported)", s);
		return -EINVAL;
	}
	snprintf(err, errlen, "Socket address type '%s' is not supported", type);
	return -ENOTSUP;
}

int ioc_export_nbd_server_start(struct ioc_export_env *env, json_t *opts, bool legacy,
				const struct ioc_nbd_tls_opts *tls, unsigned iothreads,
				char *err, size_t errlen)
{
	struct ioc_nbd_server_opts so = {
		.iothreads = iothreads,
		.max_connections = (unsigned)json_integer_value(json_object_get(opts,
							"max-connections")),
		.allow_empty = true,
	};
	struct ioc_nbd_server_hooks hooks = { .event = env->event, .opaque = env->opaque };
	struct ioc_nbd_server *srv;
	int fd, r;

	if (env->nbd) {
		snprintf(err, errlen, "NBD server already running");
		return -EBUSY;
	}
	if (json_object_get(opts, "tls-authz")) {
		snprintf(err, errlen, "Parameter 'tls-authz' is not supported");
		return -ENOTSUP;
	}
	fd = listen_addr(json_object_get(opts, "addr"), legacy, err, errlen);
	if (fd < 0)
		return fd;
	r = ioc_nbd_server_new(&srv, &so);
	if (r < 0) {
		close(fd);
		snprintf(err, errlen, "Could not create the NBD server: %s", ioc_strerror(r));
		return r;
	}
	ioc_nbd_server_set_hooks(srv, &hooks);
	if (tls && (r = ioc_nbd_server_set_tls(srv, tls, err, errlen)) < 0) {
		close(fd);
		ioc_nbd_server_free(srv);
		return r;
	}
	if ((r = ioc_nbd_server_add_listener(srv, fd)) < 0) {
		close(fd);
		ioc_nbd_server_free(srv);
		snprintf(err, errlen, "NBD listener: %s", ioc_strerror(r));
		return r;
	}
	if ((r = ioc_nbd_server_start(srv)) < 0) {
		ioc_nbd_server_free(srv);
		snprintf(err, errlen, "Could not start the NBD server: %s", ioc_strerror(r));
		return r;
	}
	env->nbd = srv;
	return 0;
}

void ioc_export_nbd_server_stop(struct ioc_export_env *env)
{
	if (!env->nbd)
		return;
	ioc_nbd_server_stop(env->nbd);
	ioc_nbd_server_free(env->nbd);
	env->nbd = NULL;
}

/* ---- the export ------------------------------------------------------- */

static const struct ioc__qmp_arg nbd_opts[] = {
	{ "name", IOC_QMP_STR, true },
	{ "description", IOC_QMP_STR, true },
	{ "bitmaps", IOC_QMP_ARRAY, true, .elem = IOC_QMP_REF },
	{ "allocation-depth", IOC_QMP_BOOL, true },
	{ NULL },
};

struct nbd_export {
	char *name;                     /* the NBD name */
	struct ioc_nbd_server *srv;
};

static int nbd_create(struct ioc_export *ex, json_t *opts, char *err, size_t errlen)
{
	struct ioc_nbd_server *srv = ex->env->nbd;
	const char *name = json_string_value(json_object_get(opts, "name"));
	json_t *bms = json_object_get(opts, "bitmaps"), *b;
	const char **bitmaps;
	struct ioc_blk *blk = ioc_node_dirty_blk(ex->node);
	struct nbd_export *ne;
	size_t i;
	int r;

	if (!srv) {
		snprintf(err, errlen, "NBD server not running");
		return -EINVAL;
	}
	if (!name)
		name = ex->node->name;
	if (strlen(name) > 4096) {
		snprintf(err, errlen, "export name '%.32s...' too long", name);
		return -EINVAL;
	}
	/* NULL-terminated, as many as the export names. */
	bitmaps = calloc(json_array_size(bms) + 1, sizeof(*bitmaps));
	if (!bitmaps)
		return -ENOMEM;
	json_array_foreach(bms, i, b) {
		const char *bn = json_is_string(b) ? json_string_value(b) :
				 json_string_value(json_object_get(b, "name"));

		if (!bn) {
			snprintf(err, errlen, "Invalid bitmap %zu", i);
			r = -EINVAL;
			goto out;
		}
		if (json_is_object(b) && json_object_get(b, "node") &&
		    strcmp(json_string_value(json_object_get(b, "node")), ex->node->name)) {
			snprintf(err, errlen, "Bitmaps of another node are not supported");
			r = -ENOTSUP;
			goto out;
		}
		if (!blk || !ioc_blk_dirty_find(blk, bn)) {
			snprintf(err, errlen, "Bitmap '%s' is not found", bn);
			r = -ENOENT;
			goto out;
		}
		bitmaps[i] = bn;
	}
	ne = calloc(1, sizeof(*ne));
	if (!ne || !(ne->name = strdup(name))) {
		free(ne);
		r = -ENOMEM;
		goto out;
	}
	struct ioc_nbd_export_opts eo = {
		.name = name,
		.description = json_string_value(json_object_get(opts, "description")),
		.node = ex->node,
		.bitmaps = bitmaps,
		.allocation_depth = json_is_true(json_object_get(opts, "allocation-depth")),
		.read_only = !ex->writable,
	};
	/* One I/O thread at most for NBD (checked by the export layer). */
	if (json_array_size(ex->iothreads))
		eo.loop = ex->env->iothread(ex->env->opaque,
					    json_string_value(json_array_get(ex->iothreads, 0)));
	r = ioc_nbd_server_add_export(srv, &eo);
	if (r < 0) {
		if (r == -EEXIST)
			snprintf(err, errlen, "NBD server already has export named '%s'", name);
		else
			snprintf(err, errlen, "Could not add the NBD export: %s", ioc_strerror(r));
		free(ne->name);
		free(ne);
		goto out;
	}
	ne->srv = srv;
	ex->opaque = ne;
	r = 0;
out:
	free(bitmaps);
	return r;
}

static void nbd_deleted(void *opaque, const char *name)
{
	struct ioc_export *ex = opaque;
	struct nbd_export *ne = ex->opaque;

	free(ne->name);
	free(ne);
	ioc_export_gone(ex);
}

static int nbd_del(struct ioc_export *ex, bool hard, char *err, size_t errlen)
{
	struct nbd_export *ne = ex->opaque;
	int r = ioc_nbd_server_del_export(ne->srv, ne->name, hard, nbd_deleted, ex);

	if (r == -EBUSY)
		snprintf(err, errlen, "export '%s' still in use", ex->id);
	else if (r < 0)
		snprintf(err, errlen, "Could not delete export '%s': %s", ex->id,
			 ioc_strerror(r));
	return r;
}

const struct ioc_export_drv ioc__export_drv_nbd = {
	.type = "nbd",
	.opts = nbd_opts,
	.create = nbd_create,
	.del = nbd_del,
};
