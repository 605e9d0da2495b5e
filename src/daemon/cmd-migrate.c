/*
 * Migration commands: live migration of the node an NBD server exports
 * (read through the node) to an iocore destination (iocore-nbd
 * --incoming), QEMU's migrate, query-migrate, migrate_cancel, the
 * capabilities and parameters, with their MIGRATION and MIGRATION_PASS events on the
 * socket's clients.  The migration is a job over the node (src/migrate):
 * it copies the node's image, mirrors the writes of its front ends and
 * drains the node at the switch-over.  What it needs of the NBD server
 * (the export to send, events, the log, TLS on its own socket, telling
 * the clients to go at the end) this file wires to it (struct
 * ioc__mig_host), so neither knows the other; the server keeps the job
 * and stops it first when it stops.  Each handler finds its server
 * through the socket's owner (the daemon's nbd-server-start, or
 * iocore-nbd's one server), so the daemon's monitors and iocore-nbd's
 * control socket share them.
 */
#include <errno.h>
#include <stdio.h>

#include "migrate/migrate.h"
#include "nbd/nbd.h"
#include "node/node.h"
#include "daemon.h"
#include "nbd-control.h"

/* ---- the NBD server as the migration's host ------------------------------ */

static void host_event(void *opaque, const char *name, json_t *data)
{
	ioc_nbd_server_event(opaque, name, data);
}

static void host_log(void *opaque, const char *msg)
{
	ioc_nbd_server_log(opaque, msg);
}

static bool host_serving(void *opaque)
{
	return ioc_nbd_server_serving(opaque);
}

/* The one export whose node can be copied (read through the node, its
 * writes tracked in the node's bitmaps: a file, qcow2...) or is on shared
 * storage (handed over). */
static struct ioc_node *host_pick(void *opaque, char *err, size_t errlen)
{
	struct ioc_nbd_export_info e[IOC_DAEMON_MAX_EXPORTS];
	unsigned n = ioc_nbd_server_exports(opaque, e, IOC_ARRAY_SIZE(e));
	struct ioc_node *node = NULL;

	for (unsigned i = 0; i < n; i++) {
		if (!ioc_node_dirty_blk(e[i].node) && !ioc_node_shared_id(e[i].node))
			continue;
		if (node) {
			snprintf(err, errlen, "Migration of more than one export is not supported");
			return NULL;
		}
		node = e[i].node;
	}
	if (!node)
		snprintf(err, errlen, "No export of an image that tracks writes, or of "
			 "shared storage, to migrate");
	return node;
}

static void host_retire(void *opaque)
{
	ioc_nbd_server_retire(opaque);
}

static bool host_waiting(void *opaque)
{
	return ioc_nbd_server_waiting(opaque);
}

static int tls_connect(void *opaque, int fd, const char *hostname, bool step, void **sess,
		       char *err, size_t errlen)
{
	return ioc_nbd_server_tls_connect(opaque, fd, hostname, step, sess, err, errlen);
}

static int tls_accept(void *opaque, int fd, void **sess, char *err, size_t errlen)
{
	return ioc_nbd_server_tls_accept(opaque, fd, sess, err, errlen);
}

static const struct ioc__mig_tls_ops nbd_tls = {
	.connect = tls_connect, .handshake = ioc_nbd_tls_session_handshake,
	.accept = tls_accept, .recv = ioc_nbd_tls_session_recv,
	.send = ioc_nbd_tls_session_send, .end = ioc_nbd_tls_session_end,
	.nonblock = true,
};

static void job_stop(void *job)
{
	ioc__mig_free(job);
}

/* The server's migration, made on first use. */
static struct ioc__mig *mig_of(struct ioc_nbd_server *srv, char *err, size_t errlen)
{
	struct ioc__mig *m = ioc_nbd_server_job(srv);
	struct ioc__mig_host host = {
		.main_loop = ioc_nbd_server_main_loop(srv), .opaque = srv,
		.event = host_event, .log = host_log, .serving = host_serving,
		.pick = host_pick, .retire = host_retire, .waiting = host_waiting,
		.tls = ioc_nbd_server_has_tls(srv) ? &nbd_tls : NULL,
	};

	if (m)
		return m;
	if (ioc__mig_new(&m, &host) < 0) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	ioc_nbd_server_set_job(srv, m, job_stop);
	return m;
}

int ioc_daemon_nbd_incoming(struct ioc_nbd_server *srv, const struct ioc__mig_incoming_opts *o,
			    char *err, size_t errlen)
{
	struct ioc__mig *m = mig_of(srv, err, errlen);

	return m ? ioc__mig_incoming_setup(m, o, err, errlen) : -ENOMEM;
}

#define MIG_CMD(name, impl)                                                         \
	json_t *ioc__daemon_mig_##name(void *ctx, json_t *args, struct ioc__qmp_err *err) \
	{                                                                           \
		struct ioc__daemon_ctl *c = ctx;                                    \
		struct ioc_nbd_server *srv = c->nbd ? c->nbd(c) : NULL;             \
		struct ioc__mig *m;                                             \
		if (!srv) {                                                         \
			ioc__qmp_errf(err, "NBD server not running");               \
			return NULL;                                                \
		}                                                                   \
		m = mig_of(srv, err->desc, sizeof(err->desc));                      \
		return m ? impl(m, args, err) : NULL;                               \
	}

MIG_CMD(set_caps, ioc__mig_set_caps)
MIG_CMD(query_caps, ioc__mig_query_caps)
MIG_CMD(set_params, ioc__mig_set_params)
MIG_CMD(query_params, ioc__mig_query_params)
MIG_CMD(migrate, ioc__mig_migrate)
MIG_CMD(query, ioc__mig_query)
MIG_CMD(continue, ioc__mig_continue)
MIG_CMD(cancel, ioc__mig_cancel)
MIG_CMD(incoming, ioc__mig_incoming)

const struct ioc__qmp_cmd ioc__daemon_migrate_cmds[] = {
	IOC_DAEMON_MIG_CMDS,
	{ NULL },
};
