/*
 * Private interface between the NBD server's files (server.c, conn.c,
 * export-blk.c, export-zip.c).
 */
#ifndef IOC_NBD_INT_H
#define IOC_NBD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include <jansson.h>

#include "iocore/co.h"

#include "nbd/nbd.h"
#include "nbd-proto.h"
#include "util/latch.h"

#define IOC_NBD_MAX_EXPORTS     64
#define IOC_NBD_MAX_LISTENERS   16

/* Request counters by command (IOC_NBD_OP_*).  Each set has one writer
 * (an I/O thread, for its connections and its share of each export),
 * which adds with relaxed load + store; a control socket reads them
 * relaxed: a statistic. */
struct ioc__nbd_opstat {
	_Atomic uint64_t ops, bytes, failed, ns;
};
struct ioc__nbd_stats {
	struct ioc__nbd_opstat op[IOC_NBD_OP_N];
	_Atomic uint64_t wr_highest;    /* end of the furthest write */
};

/* One I/O thread of the server, or one export loop of the caller's
 * (placed: ioc_nbd_export_opts.loop, shared by the exports that name
 * it); its connections live in conn.c. */
#define IOC_NBD_REST_MAX_NS 200000  /* default longest rest (conn.c) */

struct nbd_thread {
	struct ioc_nbd_server *srv;
	struct ioc_iothread *th;        /* NULL when placed */
	struct ioc_loop *loop;
	bool placed;
	unsigned exports;               /* placed: exports (live or dying,
					 * not yet reaped) whose connections
					 * run here; 0: idle.  Main loop. */
	struct conn *conns;             /* loop thread only */
	struct ioc_task stop_task;
	struct ioc_task kill_task;
	_Atomic uint64_t requests;      /* written by this thread only */
	struct ioc_task retire_task;     /* ioc__nbd_retire() (conn.c) */
	/* The end of the request that just finished inline, for the next one
	 * parsed right after it to start from (conn.c, req_co()); 0 when a
	 * recv, a send or a loop iteration came between: read the clock. */
	int64_t clk;
	/* Rests of this thread's connections (conn.c), written by this
	 * thread only, read by ioc_nbd_server_thread_poll(). */
	_Atomic uint64_t rests, rests_late;
	bool map_shared;                /* more than one connection (conn.c) */
} IOC_CACHE_ALIGNED;


struct listener {
	struct ioc_nbd_server *srv;
	int fd;
	struct ioc_timer backoff;       /* re-arm after EMFILE and friends */
};


struct ioc__nbd_tls_creds;
struct ioc__nbd_tls;

struct ioc_nbd_server {
	struct ioc_nbd_server_opts opts;
	struct ioc__nbd_tls_creds *tls;  /* NULL: TLS off */
	struct ioc__nbd_cfg cfg;
	struct ioc__nbd_export *exports[IOC_NBD_MAX_EXPORTS];
	struct listener listeners[IOC_NBD_MAX_LISTENERS];
	unsigned nlisteners;
	struct ioc_loop *main_loop;
	struct nbd_thread *threads;
	unsigned nthreads, next_thread;
	/* The exports' loops (server.c, "Exports on a loop of their own"):
	 * never freed before the server, an idle one reused for the next
	 * loop.  Written on the main loop (release), read anywhere. */
	struct nbd_thread *placed[IOC_NBD_MAX_EXPORTS];
	_Atomic uint64_t nconns;        /* open connections */
	_Atomic uint64_t accepted, refused;
	_Atomic int stopping;           /* 1: ioc_nbd_server_stop() began;
					 * 2: its grace period is over */
	/* Spliced READs and WRITEs from these sizes up (0: off; conn.c);
	 * zc_refuse, for tests, makes every socket refuse splice(2). */
	size_t zc_read_min, zc_write_min;
	bool zc_refuse;
	/* READ replies may point into the image's mapping (conn.c sets the
	 * connections' map_reads; off only for tests and A/B runs). */
	bool map_reads;
	bool map_all;                   /* IOC_NBD_TEST_MAP=all: map_small always */
	/* WRITE payloads may be received into the image's mapping (conn.c,
	 * wmap_begin(); IOC_NBD_TEST_MAPW=off: never, tests and A/B runs). */
	bool map_writes;
	uint32_t rest_max_ns;           /* 0: no rests (conn.c) */
	bool started;
	bool serving;                   /* listeners watched (ioc_nbd_server_serve) */
	struct ioc_nbd_server_hooks hooks; /* main loop only */
	struct ioc_node_graph *graph;   /* of the nodes made over opts.blk and
					 * opts.zip exports (export-node.c) */
	struct ioc__nbd_export *dying[IOC_NBD_MAX_EXPORTS]; /* deleted, not yet
					 * reaped (main thread) */
	struct nbd_gone {
		struct ioc_task task;   /* the last connection of a dying
					 * export: reap it (server.c) */
		struct ioc_nbd_server *srv;
		unsigned index;
	} gone[IOC_NBD_MAX_EXPORTS];
	void *job;                      /* ioc_nbd_server_set_job(), or NULL */
	void (*job_stop)(void *job);
	/* ioc_nbd_server_retire() ran: no more serving.  Written on the
	 * main loop; a connection arriving on its export's loop reads it
	 * (conn.c, conn_arrive()). */
	atomic_bool retiring;
	struct ioc__latch retired;      /* threads yet to drain (conn.c) */
};

/* server.c: stop accepting (close the listeners).  Main loop. */
void ioc__nbd_close_listeners(struct ioc_nbd_server *srv);
/* server.c: every thread that may hold connections, i from 0 below
 * ioc__nbd_threads_end(): the server's own, then the exports' loops in
 * use (NULL for a hole).  Main loop. */
unsigned ioc__nbd_threads_end(const struct ioc_nbd_server *srv);
struct nbd_thread *ioc__nbd_thread_at(struct ioc_nbd_server *srv, unsigned i);

/* conn.c: snapshot up to max connections of thread t into out[]; returns
 * how many were written.  Runs on t's loop (through ioc_loop_call()). */
unsigned ioc__nbd_thread_conn_info(struct nbd_thread *t, struct ioc_nbd_conn_info *out,
				   unsigned max);
/* conn.c: add one request's outcome to a set of counters (its writer). */
void ioc__nbd_stats_account(struct ioc__nbd_stats *st, const struct ioc__nbd_req *r,
			    int64_t ns);

/* An event to hooks.event, else nowhere (steals data).  Main loop. */
void ioc__nbd_event(struct ioc_nbd_server *srv, const char *name, json_t *data);

/* Log a message through opts.log (no-op without one).  Any thread. */
void ioc__nbd_log(struct ioc_nbd_server *srv, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* conn.c: close every connection of thread t that chose export e (they
 * finish nothing more: QEMU's hard removal).  Returns how many.  On t. */
int ioc__nbd_thread_kill_export(struct nbd_thread *t, const struct ioc__nbd_export *e);
/* server.c: a connection that counted e is gone (any I/O thread). */
void ioc__nbd_export_release(struct ioc__nbd_export *e);

/* conn.c: take an accepted socket to thread t (which then owns it).
 * Returns 0 or -ENOMEM (fd left to the caller).  Accepting thread. */
int ioc__nbd_conn_accept(struct nbd_thread *t, int fd);
/* conn.c: posted to each I/O thread by ioc_nbd_server_stop(): drain
 * (stop_task) and, after the grace period, close what is left (kill_task). */
void ioc__nbd_thread_stop(struct ioc_task *task);
void ioc__nbd_thread_kill(struct ioc_task *task);

/* tls.c: GnuTLS behind a non-blocking interface (see tls.c).  Calls that
 * can wait return -EAGAIN and set *want_write when GnuTLS waits to write
 * rather than to read; failures return -errno with *msg saying why. */
int ioc__nbd_tls_creds_new(struct ioc__nbd_tls_creds **out,
			   const struct ioc_nbd_tls_opts *o, char *err, size_t errlen);
void ioc__nbd_tls_creds_free(struct ioc__nbd_tls_creds *cr);
int ioc__nbd_tls_new(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
		     int fd, const char **msg);
void ioc__nbd_tls_free(struct ioc__nbd_tls *t);
int ioc__nbd_tls_handshake(struct ioc__nbd_tls *t, bool *want_write, const char **msg);
/* Bytes (0 at EOF), -EAGAIN or -EPROTO. */
ssize_t ioc__nbd_tls_recv(struct ioc__nbd_tls *t, void *buf, size_t len,
			  bool *want_write, const char **msg);
/* Bytes taken (at most one record), -EAGAIN (call again with the same
 * buf and len) or -EPIPE. */
ssize_t ioc__nbd_tls_send(struct ioc__nbd_tls *t, const void *buf, size_t len,
			  const char **msg);
/* Decrypted bytes buffered inside GnuTLS (the socket may be empty). */
size_t ioc__nbd_tls_pending(struct ioc__nbd_tls *t);
void ioc__nbd_tls_bye(struct ioc__nbd_tls *t);
void ioc__nbd_tls_describe(struct ioc__nbd_tls *t, char *buf, size_t len);
/* Sessions on a job's own socket (nbd.h, ioc_nbd_server_tls_*, wraps
 * them): accept with the server's credentials, connect with client
 * credentials made from the same files; free with ioc__nbd_tls_free.
 * Both handshake, blocking, before they return, except a connect with
 * step: its caller runs the handshake with ioc__nbd_tls_mig_handshake()
 * (0 when done, -EAGAIN with *want_write saying what to wait for, or
 * -errno with the reason in err). */
int ioc__nbd_tls_mig_accept(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			    int fd, char *err, size_t errlen);
int ioc__nbd_tls_mig_connect(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			     int fd, const char *hostname, bool step, char *err,
			     size_t errlen);
int ioc__nbd_tls_mig_handshake(void *opaque, bool *want_write, char *err, size_t errlen);
ssize_t ioc__nbd_tls_mig_recv(void *opaque, void *buf, size_t len);
ssize_t ioc__nbd_tls_mig_send(void *opaque, const void *buf, size_t len);

/* export-node.c: an export of node n (opts->node, or a node made over
 * opts->blk or opts->zip, whose one reference the export then holds: own). */
int ioc__nbd_node_export_new(struct ioc__nbd_export **out,
			     const struct ioc_nbd_export_opts *opts, struct ioc_node *n,
			     bool own);
/* Frees an export of either backend (neither owns what it serves). */
/* An export with its name and description copied from opts (checked
 * against the protocol's string limit) and everything else zero. */
int ioc__nbd_export_alloc(struct ioc__nbd_export **out,
			  const struct ioc_nbd_export_opts *opts);
void ioc__nbd_export_free(struct ioc__nbd_export *e);

#endif /* IOC_NBD_INT_H */
