/*
 * Live migration of one block node between two iocore servers (QEMU 7.2's
 * migration commands), as a job over the node: what the daemon layer
 * drives.  The job copies the node's image file to the destination,
 * mirrors the writes of every front end on the node (a write notifier),
 * and at the switch-over holds and drains the node (its gate); the front
 * end that serves it (the NBD server) is reached only through struct
 * ioc__mig_host, which the daemon layer fills.  Main loop, unless said.
 */
#ifndef IOC_MIGRATE_H
#define IOC_MIGRATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "iocore/loop.h"
#include "qmp/qmp.h"

struct ioc_node;

/* A session (TLS) on the migration's own socket, on the job's threads.
 * The destination's socket and the hand-over's block; the copy's engine
 * keeps its socket non-blocking, handshake included (source.c), and needs
 * nonblock. */
struct ioc__mig_tls_ops {
	/* A client (source) or server (destination) handshake on fd; the
	 * session in *sess, or -errno with the reason in err.  A connect
	 * with step only makes the session (*sess, 0): handshake then runs
	 * it, on a non-blocking fd. */
	int (*connect)(void *opaque, int fd, const char *hostname, bool step, void **sess,
		       char *err, size_t errlen);
	/* One go at a stepped handshake: 0 when done; -EAGAIN when the
	 * socket would block, to call again once it is writable (*want_write)
	 * or readable; or -errno with the reason in err. */
	int (*handshake)(void *sess, bool *want_write, char *err, size_t errlen);
	int (*accept)(void *opaque, int fd, void **sess, char *err, size_t errlen);
	/* Bytes, 0 at EOF (recv), or -errno.  On a non-blocking socket
	 * -EAGAIN where the socket would block: the caller waits for it to
	 * be readable (recv) or writable (send) and calls again; a send
	 * that returned -EAGAIN is called again with the same buffer and
	 * length (GnuTLS has taken them already).  recv returns -EAGAIN
	 * only once the session holds no decrypted bytes, so waiting for
	 * the socket then loses none.  One recv and one send may be pending
	 * at a time, from one thread or two. */
	ssize_t (*recv)(void *sess, void *buf, size_t len);
	ssize_t (*send)(void *sess, const void *buf, size_t len);
	/* recv and send keep the -EAGAIN contract above (a capability:
	 * without it the source refuses TLS). */
	bool nonblock;
	/* Free the session, after a closing alert when bye. */
	void (*end)(void *sess, bool bye);
};

/* What the migration needs of the front end that serves the node.  Every
 * callback on the main loop; opaque is theirs. */
struct ioc__mig_host {
	struct ioc_loop *main_loop;
	void *opaque;
	/* A QMP event (MIGRATION, MIGRATION_PASS) to the control sockets;
	 * the callee owns data. */
	void (*event)(void *opaque, const char *name, json_t *data);
	void (*log)(void *opaque, const char *msg);
	/* migrate: whether the front end serves (not once a migration
	 * completed); then the node to send (one whose image is a file: a
	 * node with ioc_node_blk(); or one on shared storage, which is
	 * handed over: ioc_node_shared_id()), or NULL with QEMU's message
	 * in err. */
	bool (*serving)(void *opaque);
	struct ioc_node *(*pick)(void *opaque, char *err, size_t errlen);
	/* The destination has the image and the node is shut: the front end
	 * tells its clients to go and serves no more. */
	void (*retire)(void *opaque);
	/* Incoming: the front end waits for the image (started, not yet
	 * serving). */
	bool (*waiting)(void *opaque);
	/* NULL: no TLS (the stream is plain; a TLS peer fails). */
	const struct ioc__mig_tls_ops *tls;
};

/* The migration state of one front end (both ends' commands). */
struct ioc__mig;
int ioc__mig_new(struct ioc__mig **out, const struct ioc__mig_host *host);
/* Stop a migration in progress (cancel and join its thread, open the
 * node's gate again) and free the state: before the front end stops. */
void ioc__mig_free(struct ioc__mig *m);

/*
 * Incoming live migration (the destination side), on a front end that
 * waits for its image (host->waiting): listen on uri ("tcp:ADDR:PORT", or
 * "defer" to wait for migrate-incoming), accept one connection and receive
 * the source's image through the writable node dest (resized to the
 * source's size when its driver can, else at least as large; image is its
 * name in messages).  done runs once on the main loop: result 0 when the
 * image is complete, durable and verified (the caller then serves it),
 * otherwise -errno with the reason; the image must then not be served.
 * Returns 0 or -errno (err says why).
 */
struct ioc__mig_incoming_opts {
	const char *uri;
	const char *image;
	void (*done)(void *opaque, int result, const char *why);
	void *opaque;
	/* A node on shared storage, opened inactive (an rbd image): the
	 * source hands it over instead of copying (handover.c).  Once the
	 * stream names the same image, the node is activated and serve runs:
	 * the front end serves it (0) or says why not (-errno); done then
	 * runs only on failure.  image is only its name in messages. */
	struct ioc_node *node;
	/* A copy (node NULL): the node written through, opened read-write
	 * by the caller (a file node, a qcow2 node...), kept open by it
	 * until done has run. */
	struct ioc_node *dest;
	int (*serve)(void *opaque, struct ioc_node *n, char *err, size_t errlen);
};
int ioc__mig_incoming_setup(struct ioc__mig *m, const struct ioc__mig_incoming_opts *o,
				char *err, size_t errlen);

/* The QMP commands' bodies (src/daemon/cmd-migrate.c), and the specs of
 * their arguments. */
json_t *ioc__mig_set_caps(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_query_caps(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_set_params(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_query_params(struct ioc__mig *m, json_t *args,
				  struct ioc__qmp_err *err);
json_t *ioc__mig_migrate(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_query(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_continue(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_cancel(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);
json_t *ioc__mig_incoming(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err);

extern const struct ioc__qmp_arg ioc__mig_args_caps[], ioc__mig_args_params[],
	ioc__mig_args_migrate[], ioc__mig_args_continue[],
	ioc__mig_args_incoming[];

#endif /* IOC_MIGRATE_H */
