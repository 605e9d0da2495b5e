/*
 * iocore NBD server: serves block nodes (src/node) over the NBD protocol
 * (NetworkBlockDevice/nbd doc/proto.md, fixed newstyle, structured replies,
 * extended headers, base:allocation, and QEMU's qemu:dirty-bitmap:NAME and
 * qemu:allocation-depth).  What a control socket reports of it
 * (connections, statistics, polling) and hears from it (events, the stop)
 * are plain functions below; the commands are the daemon layer's
 * (src/daemon/nbd-control.c for iocore-nbd).  Private to the daemon
 * layers (iocore-nbd and the storage daemon link it); an export may
 * also name an image the caller opened (blk, zip), served through a node
 * the server makes over it.
 *
 * A server owns N I/O threads (each running one loop); listening sockets
 * are watched on the loop of the thread that starts the server, and each
 * accepted connection runs its handshake on one of those threads, then
 * lives there, or on its export's own loop when the export has one
 * (opts.loop: the storage daemon's iothread=), with one coroutine per
 * request.  Call every function from the thread that created the server
 * (its "main" loop), unless it says otherwise.  All results are 0 (or a
 * count / fd) or -errno.
 */
#ifndef IOCORE_NBD_H
#define IOCORE_NBD_H

#include "iocore/common.h"
#include "iocore/loop.h"
#include "iocore/blk.h"
#include "qmp/qmp.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_nbd_server;
struct ioc_zip_image;
struct ioc_zip_overlay;
struct ioc_node;

typedef void ioc_nbd_log_fn(void *opaque, const char *msg);

struct ioc_nbd_server_opts {
	unsigned iothreads;           /* I/O threads; 0 = number of CPUs */
	unsigned max_connections;     /* 0 = unlimited; extra ones are closed */
	unsigned max_inflight;        /* requests in flight per connection; 0 = 128 */
	int64_t handshake_timeout_ns; /* 0 = 10 s; negative = none */
	ioc_nbd_log_fn *log;          /* per-connection logs; NULL = silent */
	void *log_opaque;
	struct ioc_loop_opts loop;    /* options of each I/O thread's loop */
	/* Start the I/O threads without serving: exports and listeners
	 * may still be added after ioc_nbd_server_start(), until
	 * ioc_nbd_server_serve() starts accepting.  For a destination of a
	 * migration, which must not serve before its image is complete
	 * (iocore-nbd --incoming). */
	bool defer_serving;
	/* Start and serve with no export yet: the storage daemon adds them
	 * later (block-export-add), as qemu-storage-daemon's nbd-server-start
	 * allows. */
	bool allow_empty;
	/* READs of at least this many bytes in the clear go from the page
	 * cache to the socket by splice(2), without a copy into the server;
	 * 0 = never (the default: it saves the server CPU but costs a client
	 * on the same host more than it saves, iocore-nbd(8)). */
	size_t splice_read_min;
	/* A connection whose client has our replies unread rests (reads no
	 * requests) up to this long between batches; 0 = 200 us, negative =
	 * never (iocore-nbd(8), --rest-max-ns). */
	int64_t rest_max_ns;
};

struct ioc_nbd_export_opts {
	const char *name;             /* NULL or "" = the default export */
	const char *description;      /* NULL = none */
	struct ioc_blk *blk;          /* served; not owned by the server */
	/* Or, instead of blk: a compressed image (iocore/zip.h), served
	 * read-only; not owned by the server. */
	struct ioc_zip_image *zip;
	/* With zip, optional: its copy-on-write overlay; the export then
	 * takes writes (unless read_only).  Not owned by the server. */
	struct ioc_zip_overlay *zip_overlay;
	/* Or: a block node of the storage daemon's graph (its node layer),
	 * served through it; not owned by the server. */
	struct ioc_node *node;
	/* With node: the dirty bitmaps offered as qemu:dirty-bitmap:NAME
	 * (NULL-terminated; NULL: none), and qemu:allocation-depth. */
	const char *const *bitmaps;
	bool allocation_depth;
	bool read_only;               /* refuse writes even if blk is writable */
	/* Where the export's connections run once their handshake chose it
	 * (conn.c, "The move"): a loop of the caller's, running until the
	 * export is deleted and the server stopped, which leaves the nodes
	 * it submitted to when it stops (ioc_node_loop_exit()), as for any
	 * other front end on it.  NULL: the server's own I/O threads. */
	struct ioc_loop *loop;
};

/*
 * TLS (NBD_OPT_STARTTLS, with GnuTLS).  OFF refuses STARTTLS; ON lets each
 * client choose; REQUIRE answers every option but STARTTLS and ABORT with
 * NBD_REP_ERR_TLS_REQD until the client upgrades (proto.md's FORCEDTLS).
 * Credentials: X.509 from a directory laid out as for qemu-nbd and nbdkit
 * (server-cert.pem and server-key.pem; ca-cert.pem and ca-crl.pem, if
 * present, check client certificates), and/or pre-shared keys from a file
 * of "username:hexkey" lines as psktool(1) writes them.
 */
enum ioc_nbd_tls {
	IOC_NBD_TLS_OFF = 0,
	IOC_NBD_TLS_ON,
	IOC_NBD_TLS_REQUIRE,
};

struct ioc_nbd_tls_opts {
	enum ioc_nbd_tls mode;
	const char *certificates;     /* X.509 directory, or NULL */
	const char *psk_file;         /* PSK file, or NULL */
	bool verify_peer;             /* X.509: require a client certificate
				       * signed by ca-cert.pem */
};

/* Create a server (no thread started yet). */
int ioc_nbd_server_new(struct ioc_nbd_server **out,
		       const struct ioc_nbd_server_opts *opts);
/* Add an export (before start, or while serving: the daemon's
 * block-export-add).  -EEXIST, -ENOSPC. */
int ioc_nbd_server_add_export(struct ioc_nbd_server *srv,
			      const struct ioc_nbd_export_opts *opts);
/*
 * Delete an export, also while serving (QMP's block-export-del).  Safe
 * (hard false): -EBUSY while a client uses it.  Hard: its clients are
 * disconnected.  deleted(opaque, name) runs on the main loop once the
 * export is gone (maybe before this returns).  -ENOENT: no such export.
 */
int ioc_nbd_server_del_export(struct ioc_nbd_server *srv, const char *name, bool hard,
			      void (*deleted)(void *opaque, const char *name), void *opaque);
/* Clients in transmission on the export of that name (0 when none). */
unsigned ioc_nbd_server_export_clients(struct ioc_nbd_server *srv, const char *name);
/* Set up TLS; before start.  Loads the credentials now, so a missing or
 * bad file fails here: -errno, and when err is not NULL a message naming
 * the file and GnuTLS's reason.  -ENOTSUP if built without GnuTLS. */
int ioc_nbd_server_set_tls(struct ioc_nbd_server *srv,
			   const struct ioc_nbd_tls_opts *opts,
			   char *err, size_t errlen);
/* Serve a listening socket (the server closes it).  Before start. */
int ioc_nbd_server_add_listener(struct ioc_nbd_server *srv, int fd);
/* Start the I/O threads and watch the listeners on the calling thread's
 * current loop (which the caller then runs). */
int ioc_nbd_server_start(struct ioc_nbd_server *srv);
/* With opts.defer_serving: start accepting on the listeners (at least
 * one export needed).  -EBUSY without defer_serving or when serving. */
int ioc_nbd_server_serve(struct ioc_nbd_server *srv);
/*
 * Graceful stop: stop accepting; let every connection finish the requests
 * it has received (connections still in the handshake are closed), send
 * their replies and close; then flush every export.  Runs the calling
 * thread's loop until done, however long a node takes to answer (said on
 * stderr after 20 s).  Returns 0 or the first flush error.
 */
int ioc_nbd_server_stop(struct ioc_nbd_server *srv);
/* Free a stopped (or never started) server. */
void ioc_nbd_server_free(struct ioc_nbd_server *srv);

/*
 * What a control socket above the server hears of it, on the main loop:
 * event, a QMP event (a migration's; the callee owns data, a jansson
 * json_t *); stopping, ioc_nbd_server_stop() has begun and the exports
 * are about to go.  Either may be NULL; set before start or while
 * serving, from the main loop (the only thread that reads them); NULL
 * hooks: events are dropped.  One listener at a time: -EBUSY while
 * another's are set (NULL gives them back).
 */
struct ioc_nbd_server_hooks {
	void (*event)(void *opaque, const char *name, void *data);
	void (*stopping)(void *opaque);
	void *opaque;
};
int ioc_nbd_server_set_hooks(struct ioc_nbd_server *srv,
			     const struct ioc_nbd_server_hooks *hooks);

/* The exports, in the server's order: up to max into out[], returns how
 * many were written.  name and node live until the export is deleted. */
struct ioc_nbd_export_info {
	const char *name;
	struct ioc_node *node;
};
unsigned ioc_nbd_server_exports(struct ioc_nbd_server *srv, struct ioc_nbd_export_info *out,
				unsigned max);
/* ioc_nbd_server_stop() has begun.  Any thread. */
bool ioc_nbd_server_stopping(struct ioc_nbd_server *srv);

/* Request counters by command (QEMU's BlockAcctStats without the merged
 * and timed parts). */
enum {
	IOC_NBD_OP_READ, IOC_NBD_OP_WRITE, IOC_NBD_OP_FLUSH, IOC_NBD_OP_TRIM,
	IOC_NBD_OP_ZERO, IOC_NBD_OP_STATUS, IOC_NBD_OP_CACHE, IOC_NBD_OP_N,
};
struct ioc_nbd_opcount {
	uint64_t ops, bytes, failed, ns;
};
/* A snapshot of one connection. */
struct ioc_nbd_conn_info {
	char peer[64];
	char export_name[256];          /* truncated */
	int thread;                     /* its I/O thread's index, or -1: its
					 * export's loop (opts.loop) */
	long thread_id;                 /* the OS thread serving it (gettid) */
	bool transmission;              /* past the handshake */
	bool tls;
	uint64_t inflight;
	struct ioc_nbd_opcount op[IOC_NBD_OP_N];
};
/* Snapshot up to max connections into out[], thread by thread (the
 * server's, then the exports' loops), each on its own thread
 * (ioc_loop_call(): the main loop waits one round trip per thread and
 * nothing else).  Returns how many were written.  Main loop, while
 * started. */
unsigned ioc_nbd_server_conns(struct ioc_nbd_server *srv, struct ioc_nbd_conn_info *out,
			      unsigned max);

/* The I/O threads (0 before start) and the adaptive polling of thread t,
 * with the rests of its connections (relaxed reads of counters that
 * thread writes: no round trip).  -ENOENT: no such thread.  Main loop. */
struct ioc_nbd_thread_poll {
	struct ioc_loop_poll_stats loop;
	uint64_t rests, rests_late;
};
unsigned ioc_nbd_server_nthreads(struct ioc_nbd_server *srv);
int ioc_nbd_server_thread_poll(struct ioc_nbd_server *srv, unsigned t,
			       struct ioc_nbd_thread_poll *out);

/*
 * What a job over the server's exports needs of it (live migration,
 * src/migrate, which the daemon layer wires to it): the main loop, events
 * through the hooks (the callee owns data, a json_t *), the log, whether
 * it serves or waits for an image (opts.defer_serving, started, not yet
 * serving), and retire: serve no more (close the listeners, every
 * connection finishes what it received and closes; the job shut the
 * node).  One job per server: stop(job) runs first thing in
 * ioc_nbd_server_stop() and ioc_nbd_server_free(), and must end it.
 * Main loop.
 */
struct ioc_loop *ioc_nbd_server_main_loop(struct ioc_nbd_server *srv);
void ioc_nbd_server_event(struct ioc_nbd_server *srv, const char *name, void *data);
void ioc_nbd_server_log(struct ioc_nbd_server *srv, const char *msg);
bool ioc_nbd_server_serving(struct ioc_nbd_server *srv);
bool ioc_nbd_server_waiting(struct ioc_nbd_server *srv);
void ioc_nbd_server_retire(struct ioc_nbd_server *srv);
void ioc_nbd_server_set_job(struct ioc_nbd_server *srv, void *job, void (*stop)(void *job));
void *ioc_nbd_server_job(struct ioc_nbd_server *srv);
/*
 * TLS sessions on a job's own socket, with the server's
 * credentials (ioc_nbd_server_set_tls(); has_tls says whether there are
 * any): accept is a server handshake (client certificates required with
 * verify_peer), connect a client one (X.509: ca-cert.pem verifies the
 * peer against hostname, client-cert.pem and client-key.pem are presented
 * if present; PSK: the file's first line).  -errno with the reason in
 * err.  Both handshakes block, except a connect with step, which only
 * sets the session up: the caller then calls handshake until it returns
 * 0 (-EAGAIN: wait for the socket to be writable if *want_write, else
 * readable).  recv and send return bytes, 0 at EOF
 * (recv), or -errno, -EAGAIN when the socket is non-blocking and would
 * block (a send then wants the same buffer and length again); end frees
 * the session, after a closing alert when bye.  The job's threads.
 */
bool ioc_nbd_server_has_tls(struct ioc_nbd_server *srv);
int ioc_nbd_server_tls_accept(struct ioc_nbd_server *srv, int fd, void **sess,
			      char *err, size_t errlen);
int ioc_nbd_server_tls_connect(struct ioc_nbd_server *srv, int fd, const char *hostname,
			       bool step, void **sess, char *err, size_t errlen);
int ioc_nbd_tls_session_handshake(void *sess, bool *want_write, char *err, size_t errlen);
ssize_t ioc_nbd_tls_session_recv(void *sess, void *buf, size_t len);
ssize_t ioc_nbd_tls_session_send(void *sess, const void *buf, size_t len);
void ioc_nbd_tls_session_end(void *sess, bool bye);

struct ioc_nbd_server_stats {
	uint64_t accepted;      /* connections accepted */
	uint64_t refused;       /* closed at once: --max-connections */
	uint64_t connections;   /* open now */
	uint64_t requests;      /* transmission requests served */
};
/* Any thread (the exports' loops' requests included). */
void ioc_nbd_server_get_stats(struct ioc_nbd_server *srv,
			      struct ioc_nbd_server_stats *st);

/* Listening sockets (non-blocking, close-on-exec).  Return the fd or -errno. */
int ioc_nbd_listen_unix(const char *path);
int ioc_nbd_listen_tcp(const char *host, const char *port);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_NBD_H */
