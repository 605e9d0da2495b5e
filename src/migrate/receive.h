/*
 * The receiving end of a migration stream (stream.h): read it from a
 * connected socket, apply it to an image file with decompression on a
 * workqueue, check the image checksum and answer ACK.  Blocking: it runs
 * on a thread of its own (iocore-nbd --incoming), so the server's loops
 * are not involved until the image is complete and verified.
 */
#ifndef IOCORE_MIGRATE_RECEIVE_H
#define IOCORE_MIGRATE_RECEIVE_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

struct ioc_node;

struct ioc_mig_recv_stats {
	uint64_t wire_bytes;     /* bytes read from the socket */
	uint64_t data_bytes;     /* decoded bytes written (DATA records) */
	uint64_t zero_bytes;     /* bytes of ZERO records */
	uint64_t records;
	uint64_t passes;         /* PASS records seen */
	uint64_t image_size;     /* from the header, 0 before it */
};

/*
 * How the receiver reads and writes the stream when it is not the plain
 * socket (TLS): blocking calls returning bytes (at least one), 0 at EOF
 * (recv) or -errno.  A cancel must still wake recv: shutting the socket
 * down does for a transport over it.
 */
struct ioc_mig_transport {
	ssize_t (*recv)(void *t, void *buf, size_t n);
	ssize_t (*send)(void *t, const void *buf, size_t n);
	void *t;
};

struct ioc_mig_recv_opts {
	int fd;                  /* the connected stream */
	const struct ioc_mig_transport *tr; /* NULL: read and write fd */
	/* The writable node written through: resized to the sender's image
	 * size when its driver can (a file), else at least as large.  Its
	 * requests run on an I/O thread of the receiver's own, which leaves
	 * the node's loops (ioc_node_loop_exit()) before it returns. */
	struct ioc_node *node;
	unsigned threads;        /* decompression workers; 0 = online CPUs */
	/* Set by another thread to give up: the receiver returns -ECANCELED
	 * at its next record (the socket may also be shut down to wake it). */
	atomic_bool *cancel;
	/* Optional, called on the receiving thread after each record with
	 * the running totals. */
	void (*progress)(void *opaque, const struct ioc_mig_recv_stats *st);
	void *opaque;
};

/*
 * Receive until END, apply every record, flush the node, compare the
 * image checksum with END's and answer ACK (0, or the errno of a failure
 * when the socket takes it without blocking).  Beyond stream.h's checks it
 * rejects two records of one pass that share a block and PASS numbers that
 * do not follow 1, 2, ...; it keeps at most 64 MiB of payload and decoded
 * data in flight (plus one record).  Returns 0 only when the image is complete,
 * durable and equal to the sender's; otherwise -errno with a reason in
 * why (a record's offset and field where there is one).  The image's
 * content is then undefined: the caller must not serve it.
 */
int ioc_mig_receive(const struct ioc_mig_recv_opts *o,
		    struct ioc_mig_recv_stats *st, char *why, size_t whylen);

/*
 * The receiving end of a hand-over stream (stream.h, flag
 * IOC_MIG_F_HANDOVER): read the header and the HANDOVER record, blocking,
 * and return the sender's shared id in id (idlen > MAX_SHARED_ID) and the
 * image size in *size.  0, or -errno with a reason in why (a copy stream
 * is refused).  The caller then takes the image and answers with
 * ioc_mig_send_ready(): 0 once it serves it, or the errno of a failure.
 */
int ioc_mig_receive_handover(const struct ioc_mig_recv_opts *o, char *id, size_t idlen,
			     uint64_t *size, char *why, size_t whylen);
int ioc_mig_send_ready(const struct ioc_mig_recv_opts *o, int err);

#endif
