/*
 * Live migration of a node between two iocore servers: the state shared
 * by the source engine (source.c), the destination (dest.c) and the
 * status machine (status.c); the QMP commands over them are
 * src/daemon/cmd-migrate.c's, the stream stream.h's and receive.h's.
 *
 * Threads.  The control socket and every status change run on the
 * front end's main loop.  The source's copy is an engine coroutine on an
 * I/O thread of its own (eng), with its answer reader, compression
 * workers and timers on that loop; the destination's receive runs on a
 * thread of its own.  Everything in struct ioc__mig below "shared" is
 * guarded by lock; the engine (or the receiving thread) reports status
 * changes and its end through an event queue drained by a bottom half on
 * the main loop (mig_bh), which alone emits QMP events, touches the
 * bitmaps, the notifier, the gate's final states and the front end.
 * Other threads reach the engine only through engine_kick() (source.c).
 */
#ifndef IOC_MIGRATE_INT_H
#define IOC_MIGRATE_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "iocore/blk.h"
#include "iocore/co.h"
#include "migrate.h"
#include "stream.h"
#include "node/dirty-cmd.h"
#include "node/node.h"
#include "qmp/qmp.h"

/* QEMU's MigrationStatus values that iocore uses. */
enum ioc__mig_status {
	IOC_MIG_ST_NONE = 0,
	IOC_MIG_ST_SETUP,
	IOC_MIG_ST_ACTIVE,
	IOC_MIG_ST_PRE_SWITCHOVER,
	IOC_MIG_ST_DEVICE,
	IOC_MIG_ST_COMPLETED,
	IOC_MIG_ST_FAILED,
	IOC_MIG_ST_CANCELLING,
	IOC_MIG_ST_CANCELLED,
};

/* The hidden dirty bitmap of a migration (not listed by the control
 * socket, not addressable by its bitmap commands). */
#define IOC_MIG_BITMAP IOC_NODE_MIG_BITMAP

enum { IOC_MIG_MIRROR_AUTO = 0, IOC_MIG_MIRROR_ON, IOC_MIG_MIRROR_OFF };

struct ioc__mig_params {
	bool events, pause_before_switchover, compress, zero_blocks;
	unsigned compress_level;        /* 0-9, QEMU's scale */
	unsigned compress_threads, decompress_threads;
	bool compress_wait_thread;
	uint64_t max_bandwidth;         /* bytes/s, 0 = unlimited */
	uint64_t downtime_limit;        /* ms */
	uint64_t granularity;           /* bytes: dirty tracking and block size */
	/* tls-creds: non-empty = TLS with this server's own --tls credentials
	 * (QEMU names an object; iocore has one set); tls-hostname: the name
	 * the destination's certificate must carry ("" = the URI's host).
	 * Zero-filled past the string (the params are compared with memcmp). */
	int active_mirror;              /* IOC_MIG_MIRROR_AUTO, _ON, _OFF */
	/* auto-converge (QEMU's capability and parameters, QEMU's defaults):
	 * while writes are mirrored, hold them for a share of the time that
	 * grows while the writer outpaces the copy (source.c). */
	bool auto_converge, cpu_throttle_tailslow;
	unsigned throttle_trigger_threshold;    /* %, 1-100 */
	unsigned cpu_throttle_initial, cpu_throttle_increment, max_cpu_throttle; /* %, 1-99 */
	/* __org.iocore_write-admission: while a migration runs, client writes
	 * answered per MiB the copy sends (0: unbounded; source.c). */
	unsigned write_admission;
	/* __org.iocore_handover: an export of shared storage is handed over
	 * (handover.c), nothing copied; __org.iocore_handover-timeout: ms
	 * the source waits for the destination to take the image and serve. */
	bool handover;
	unsigned handover_timeout;
	char tls_creds[128];
	char tls_hostname[256];
};

/* What query-migrate shows (a snapshot under lock). */
struct ioc__mig_stats {
	uint64_t transferred, total, duplicate, normal, normal_bytes;
	uint64_t page_size, dirty_rate, dirty_sync_count;
	uint64_t pass1_pos;             /* pass 1: copied up to here */
	uint64_t read_bytes;            /* bytes read and sent (amplification) */
	uint64_t bandwidth;             /* measured, bytes/s */
	bool active_mirror;             /* client writes are mirrored */
	uint64_t mirrored_writes, mirrored_bytes;
	unsigned throttle_pct, throttle_max;   /* auto-converge: now, highest */
	/* compression */
	uint64_t comp_pages, comp_busy, comp_jobs, comp_size, comp_in;
	unsigned nworkers;
	uint64_t worker_busy_ns[64];
	uint64_t worker_jobs[64];
};

#define IOC_MIG_EVQ 64

/* A client write waiting for its blocks to reach the destination (on the
 * stack of the request's coroutine, source.c). */
struct ioc__mig_mirror_req {
	struct ioc__mig_mirror_req *next;
	uint64_t offset, len;
	uint64_t seq;                   /* its last MIRROR record */
	struct ioc_co_await aw;
};

struct ioc__mig {
	struct ioc__mig_host host;      /* the front end (migrate.h) */
	struct ioc_bh *bh;              /* main loop: events, the end */
	struct ioc__mig_params p;       /* main loop; copied at start */

	/* Lock order: lock and mir_lock are never held together (each
	 * guards a few loads and stores); engine_kick() takes no lock and
	 * is called under either. */
	pthread_mutex_t lock;
	pthread_cond_t cond;            /* thread_done, to ioc__mig_free() */
	/* ---- shared (lock) ---- */
	int status;
	bool incoming;
	char error[256];
	int64_t t_start, t_setup, t_end, downtime_ns;
	struct ioc__mig_stats st;
	bool cont;                      /* migrate-continue given */
	bool dest_gone;                 /* the answer reader ended (a copy of
					 * ans_done under this lock, so the
					 * pre-switchover wait can see it) */
	bool thread_done;               /* the engine's (the receiving
					 * thread's) last word: join it */
	int result;                     /* its outcome */
	int sock;                       /* the stream, -1: shut it to cancel */
	bool end_sent;                  /* END is out: cancel no longer applies */
	struct { const char *name; int64_t v; } evq[IOC_MIG_EVQ];
	unsigned nev;
	/* ---- main loop ---- */
	atomic_bool cancel;             /* set by migrate_cancel (then a
					 * kick): read relaxed by the engine at
					 * each step (it only makes it stop;
					 * the lock orders the rest) */
	pthread_t thread;               /* destination: the receiving thread */
	bool thread_running;            /* the engine or that thread runs */
	/* ---- the source's engine (source.c, engine_kick()) ---- */
	struct ioc_iothread *eng;       /* main loop: started and stopped */
	struct ioc_loop *eng_loop;      /* its loop, set before it starts */
	struct ioc_co *eng_co;          /* the engine, set by itself before
					 * its first sleep (published by it) */
	_Atomic int eng_state;          /* running, kicked or sleeping */
	struct ioc_task eng_wake;       /* posted by the kick that ends a sleep */
	struct ioc_node *node;          /* source: the node migrated */
	struct ioc_blk *blk;            /* where its bitmaps live, the hidden
					 * one's too (ioc_node_dirty_blk()) */
	struct ioc_blk_dirty *bm;       /* source: the hidden bitmap */
	char uri[256];
	/* ---- active mirroring, guarded by mir_lock (source.c) ---- */
	pthread_mutex_t mir_lock;
	bool mir_open;                  /* the notifier may queue requests */
	/* Pass 1 has read everything below (UINT64_MAX after pass 1): a
	 * write at or above it is left to pass 1.  Release store by the
	 * engine after each read, acquire load in the notifier. */
	_Atomic uint64_t mir_cursor;
	/* auto-converge (source.c): the throttle (%, 0 = off), set by
	 * the engine and read by the notifier, and the client writes
	 * the notifier saw; relaxed both: a hint and a count. */
	_Atomic unsigned mir_throttle;
	_Atomic uint64_t mir_seen;
	/* write admission (source.c, admit()): the gap between two
	 * answered writes (ns, 0 = unbounded), stored relaxed by the engine
	 * and loaded relaxed by the notifier; the next free answer time,
	 * claimed by the notifier calls with a compare-and-swap. */
	_Atomic int64_t adm_gap;
	_Atomic int64_t adm_next;
	/* The write notifier on the migrated node (source.c,
	 * mirror_notify()), added and removed on the main loop; it admits or
	 * mirrors writes while hook is set: stored by the engine (release),
	 * loaded by the notifier (acquire). */
	struct ioc_node_notifier nt;
	bool nt_added;
	atomic_bool hook;
	/* to send: queued, then a kick (mirror_notify()) */
	struct ioc__mig_mirror_req *mir_wait, **mir_wait_tail;
	struct ioc__mig_mirror_req *mir_sent, **mir_sent_tail; /* to ack */
	uint64_t mir_acked;             /* MIRROR records the destination applied */
	uint64_t mir_bound;             /* MIRROR records that may have been sent:
					 * raised before each is submitted, so a
					 * MACK above it is a lying destination */
	bool ans_done;                  /* the answer reader ended (then a
					 * kick): */
	int ans_ret;                    /* 0: ans holds the ACK; or -errno */
	uint32_t ans_type, ans_crc;
	uint64_t ans_off;
	char ans_why[128];
	/* ---- hand-over (handover.c) ---- */
	bool handover;                  /* main loop: this job hands over */
	bool let_go;                    /* main loop: the source's node is
					 * held and inactive */
	char ho_id[IOC_MIG_MAX_SHARED_ID + 1]; /* the image's shared id, set
					 * before the engine starts */
	int ho_req;                     /* lock: what the engine (or the
					 * destination's thread) asks of the
					 * main loop (HO_REQ_*, handover.c) */
	bool ho_answered;               /* lock: done; broadcast on cond (the
					 * destination) or a kick (the engine) */
	int ho_ret;                     /* lock: its result, ho_why the reason */
	char ho_why[256];
	int64_t ho_t_hold;              /* lock: ns, when the node was held */
	/* Main loop: the coroutine that makes a node change (ho_co_fn(),
	 * handover.c: the engine's request, or _finish taking the node
	 * back), NULL when none runs; ho_doing, which.  While it is set (it
	 * may sleep in librbd, on the thread pool) _bh leaves a new request
	 * in ho_req, mig_bh joins no thread (so no _finish, no incoming
	 * finish runs beside it), no migration starts (busy()) and
	 * ioc__mig_free() runs the main loop until it is NULL.  The
	 * coroutine answers the engine (or ends the job), schedules bh
	 * (which does what waited) and clears ho_co, its last touch of this
	 * struct. */
	struct ioc_co *ho_co;
	int ho_doing;
	struct ioc_node *in_node;       /* destination: the shared image,
					 * opened inactive */
	int (*in_serve)(void *opaque, struct ioc_node *n, char *err, size_t errlen);
	/* destination */
	int listen_fd;                  /* --incoming: waiting for the source */
	char image[4096];
	struct ioc_node *in_dest;       /* a copy is written through it */
	void (*in_done)(void *opaque, int result, const char *why);
	void *in_opaque;
};

/* A line to host.log ("migration failed: ..."), when there is one. */
void ioc__mig_log(struct ioc__mig *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* status.c, the status machine.  Under m->lock: move to status
 * and queue the MIGRATION event if the machine allows the move from the
 * current status; false (nothing changed) if not. */
bool ioc__mig_set_status_locked(struct ioc__mig *m, int status);
/* Under m->lock: a new migration's setup, from none or a final status;
 * false (nothing changed) while one runs. */
bool ioc__mig_begin_locked(struct ioc__mig *m);
/* Whether the machine moves from one status to another; whether a
 * status is final (completed, failed, cancelled). */
bool ioc__mig_move_ok(int from, int to);
bool ioc__mig_final(int status);
/* The status a migration ends in: its result (0 or -errno), cancelled
 * when it was being cancelled. */
int ioc__mig_end_status(int current, int result);
/* Under m->lock: queue an event for the main loop (name static). */
void ioc__mig_event_locked(struct ioc__mig *m, const char *name, int64_t v);
int64_t ioc__mig_now_ms(void);
/* "tcp:HOST:PORT" into host and port; -EINVAL. */
int ioc__mig_parse_uri(const char *uri, char *host, size_t hl, char *port,
			   size_t pl);

/* source.c: a job (copy or hand-over) begins: the statistics, times,
 * flags and error of the last one reset, status setup (under lock);
 * or it could not start its thread (r, an errno): failed, NULL with
 * err set. */
void ioc__mig_job_begin(struct ioc__mig *m, const char *uri, uint64_t total,
			uint64_t page_size);
json_t *ioc__mig_job_failed_start(struct ioc__mig *m, int r, struct ioc__qmp_err *err);
/* Main loop: the job's end time and final status (completed, failed or
 * cancelled, by result), and the failure logged. */
void ioc__mig_job_end(struct ioc__mig *m, int result);

/* source.c: start the engine, a coroutine on an I/O thread of its own,
 * for a copy or a hand-over with parameters p (copied; main loop;
 * -errno); kick it (any thread, engine_kick()). */
int ioc__mig_engine_start(struct ioc__mig *m, const struct ioc__mig_params *p,
			  const char *uri, uint64_t size);
void ioc__mig_engine_kick(struct ioc__mig *m);

/* source.c: the engine's link to the destination, for a hand-over run on
 * it (in the engine's coroutine).  _connect: tcp:HOST:PORT, with TLS when
 * tls-creds is set; _send: all of buf; _recv: all of len before deadline
 * (ns, CLOCK_MONOTONIC; -ETIMEDOUT), what naming it in the error of a
 * stream that closed; _wait: sleep until a kick; _fail: the failure's
 * reason, unless one is set already (returns err).  Each fails with the
 * reason set, or -ECANCELED. */
struct ioc__mig_src;
int ioc_coroutine_fn ioc__mig_src_connect(struct ioc__mig_src *s, const char *uri);
int ioc_coroutine_fn ioc__mig_src_send(struct ioc__mig_src *s, const void *buf, size_t len);
int ioc_coroutine_fn ioc__mig_src_recv(struct ioc__mig_src *s, void *buf, size_t len,
				       int64_t deadline, const char *what);
void ioc_coroutine_fn ioc__mig_src_wait(struct ioc__mig_src *s);
int ioc__mig_src_fail(struct ioc__mig_src *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* handover.c: the hand-over of a node on shared storage.  _start (main
 * loop, from migrate, with the node picked) checks and starts the engine,
 * or refuses with QEMU-style err; _run (the engine) talks to the
 * destination; _bh (main loop, from mig_bh) answers what the engine or
 * the destination's thread asks (hold and inactivate, activate and
 * serve); _finish (main loop, the engine joined) retires the source or
 * gives it its node back; _receive (the destination's thread) takes one
 * over the stream. */
json_t *ioc__mig_handover_start(struct ioc__mig *m, struct ioc_node *n,
				    const char *uri, struct ioc__qmp_err *err);
int ioc_coroutine_fn ioc__mig_handover_run(struct ioc__mig_src *s, struct ioc__mig *m,
					   const struct ioc__mig_params *p, const char *uri,
					   uint64_t size);
void ioc__mig_handover_bh(struct ioc__mig *m);
void ioc__mig_handover_finish(struct ioc__mig *m);
struct ioc_mig_recv_opts;
int ioc__mig_handover_receive(struct ioc__mig *m, const struct ioc_mig_recv_opts *o,
				  char *why, size_t whylen);

/* dest.c: the destination's thread ended (main loop, from mig_bh). */
void ioc__mig_incoming_finish(struct ioc__mig *m);
/* dest.c: begin receiving on uri (migrate-incoming).  Main loop. */
int ioc__mig_incoming_start(struct ioc__mig *m, const char *uri,
				char *err, size_t errlen);

#endif
