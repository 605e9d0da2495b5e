/*
 * iocore-nbd's control socket: QMP, as qemu-storage-daemon speaks it, over
 * one NBD server (nbd-control.c lists the commands).  Main loop only.
 */
#ifndef IOC_DAEMON_NBD_CONTROL_H
#define IOC_DAEMON_NBD_CONTROL_H

#include "iocore/loop.h"
#include "migrate/migrate.h"
#include "nbd/nbd.h"

struct ioc_daemon_nbd_control;

struct ioc_daemon_nbd_control_opts {
	/* quit (may be NULL): the caller then stops the server as on SIGTERM. */
	void (*quit)(void *opaque);
	void *opaque;
};

/* Serve the control socket on the listening socket fd (the control's
 * once this succeeds) on loop, the server's main loop, after
 * ioc_nbd_server_start(); it takes the server's hooks (its events, its
 * stop).  One per server. */
int ioc_daemon_nbd_control_new(struct ioc_daemon_nbd_control **out,
			       struct ioc_nbd_server *srv, struct ioc_loop *loop, int fd,
			       const struct ioc_daemon_nbd_control_opts *opts);
/* After ioc_nbd_server_stop() (whose last events it sends), before
 * ioc_nbd_server_free(): gives the server's hooks back. */
void ioc_daemon_nbd_control_free(struct ioc_daemon_nbd_control *ctl);

/* --incoming (cmd-migrate.c): srv, started with defer_serving, receives
 * its image from a migration's source (migrate.h says how), its
 * migration made as for the control socket's commands.  0 or -errno with
 * err. */
int ioc_daemon_nbd_incoming(struct ioc_nbd_server *srv, const struct ioc__mig_incoming_opts *o,
			    char *err, size_t errlen);

#endif /* IOC_DAEMON_NBD_CONTROL_H */
