/*
 * Migration commands: live migration of the daemon's NBD export of a file
 * node to an iocore destination (iocore-nbd --incoming), QEMU's migrate,
 * query-migrate, migrate_cancel, the capabilities and parameters, with
 * their MIGRATION and MIGRATION_PASS events on every monitor.  The
 * migration is the NBD server's (src/nbd): it copies the export's image,
 * mirrors its clients' writes and hands them over at the switch-over.
 */
#include "nbd/nbd.h"
#include "daemon.h"

IOC_NBD_MIG_HANDLERS(cmd_mig, ((struct ioc_daemon *)ctx)->env.nbd)

const struct ioc__qmp_cmd ioc__daemon_migrate_cmds[] = {
	IOC_NBD_MIG_CMDS(cmd_mig),
	{ NULL },
};
