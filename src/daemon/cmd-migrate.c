/*
 * Migration commands: live migration of an NBD server's export of a file
 * node to an iocore destination (iocore-nbd --incoming), QEMU's migrate,
 * query-migrate, migrate_cancel, the capabilities and parameters, with
 * their MIGRATION and MIGRATION_PASS events on the socket's clients.  The
 * migration is the NBD server's (src/nbd): it copies the export's image,
 * mirrors its clients' writes and hands them over at the switch-over.
 * Each handler finds its server through the socket's owner (the
 * daemon's nbd-server-start, or iocore-nbd's one server), so the
 * daemon's monitors and iocore-nbd's control socket share them.
 */
#include "nbd/nbd.h"
#include "daemon.h"

#define MIG_CMD(name, impl)                                                         \
	json_t *ioc__daemon_mig_##name(void *ctx, json_t *args, struct ioc__qmp_err *err) \
	{                                                                           \
		struct ioc__daemon_ctl *c = ctx;                                    \
		struct ioc_nbd_server *srv = c->nbd ? c->nbd(c) : NULL;             \
		if (!srv) {                                                         \
			ioc__qmp_errf(err, "NBD server not running");               \
			return NULL;                                                \
		}                                                                   \
		return impl(srv, args, err);                                        \
	}

MIG_CMD(set_caps, ioc__nbd_mig_set_caps)
MIG_CMD(query_caps, ioc__nbd_mig_query_caps)
MIG_CMD(set_params, ioc__nbd_mig_set_params)
MIG_CMD(query_params, ioc__nbd_mig_query_params)
MIG_CMD(migrate, ioc__nbd_mig_migrate)
MIG_CMD(query, ioc__nbd_mig_query)
MIG_CMD(continue, ioc__nbd_mig_continue)
MIG_CMD(cancel, ioc__nbd_mig_cancel)
MIG_CMD(incoming, ioc__nbd_mig_incoming)

const struct ioc__qmp_cmd ioc__daemon_migrate_cmds[] = {
	IOC_DAEMON_MIG_CMDS,
	{ NULL },
};
