/*
 * Live migration, the source: send the image of a node whose writes its
 * bitmaps track (a file, qcow2...; an export's, through struct
 * ioc__mig_host) to another iocore-nbd (--incoming) while clients keep
 * using it, then hand them over, with QEMU 7.2's migration commands.
 *
 * Problem.  The image changes while it moves, a writer may outrun the
 * link (or take the cores), and compression pays only on several cores.
 *
 * Design (pre-copy, then active mirroring).
 * - A hidden dirty bitmap is added where the node's bitmaps live
 *   (ioc_node_dirty_blk()) before the first read.  Pass 1 reads the node
 *   (its block status: zeroes go as ZERO), later passes what changed; a
 *   chunk (<= 256 KiB) is cleared, then read (blk.h's rule), and goes to an
 *   in-order workqueue of compress-threads workers: records leave in read
 *   order.  Once dirty bytes / bandwidth fit downtime-limit, switch.
 * - Active mirroring: a write of any front end waits in the notifier on
 *   the node until its granules were cleared, read back, sent as a MIRROR
 *   through the same queue and acknowledged (MACK): a block's last record
 *   is its newest content, with no range locks.  While mirroring a chunk
 *   is read only under 1 MiB of send queue (pace()); writes ahead of pass
 *   1 are left to it; any end, and the hold, answers the waiting writes;
 *   admit() and throttle_check() slow the writer down.
 * - Switch-over: the node's gate holds and drains (pause-before-switchover
 *   waits for migrate-continue); the last pass, END, the ACK.  Failure
 *   before END: the gate opens, the bitmap goes, the source serves on.
 * - Runtime: the engine and the answer reader are coroutines on an I/O
 *   thread of their own, where the workers hand jobs back.  The engine
 *   sleeps only in engine_wait() (a loop timer; engine_kick() is the
 *   handshake).  The socket is non-blocking, TLS handshake included; a
 *   send waits on the loop while the reader runs (send_all()); SIOCOUTQ
 *   has no event, so a 200 us timer looks (pace()).  Reads are the node's
 *   driver on that loop (ioc_node_co_preadv_job(): not a client's, past
 *   the gate, so the last pass reads under the hold).
 *
 * Rejected.  The image file by path (a qcow2 file's bytes are not its
 * guest's); reads on the front ends' I/O threads (the copy would compete
 * with requests); the client's own buffer as the MIRROR (a range-lock
 * table); mirroring from the start or after pass 1 (NOTES.md); napping.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zstd.h>

#include "iocore/pool.h"
#include "iocore/wq.h"
#include "migrate-int.h"
#include "stream.h"
#include "util/socket.h"

#define CHUNK_MAX        (256u << 10)
#define ACK_TIMEOUT_MS   120000
#define SENT_SLACK       (64 << 10) /* see wait_sent() */
#define QUEUE_LOOK_NS    200000     /* see pace() */
#define MIRROR_QUEUE     (1 << 20)  /* see pace() */
#define CONNECT_TIMEOUT_MS 30000
#define THROTTLE_UNIT_NS   250000    /* see throttle_pause() */
#define THROTTLE_PERIOD_NS 50000000  /* see throttle_check() */
#define CHUNK_WRITES       10        /* see throttle_check() */
#define ADMIT_GAP_MAX_NS   1000000   /* see admit_update() */
#define ADMIT_WAIT_MAX_NS  50000000  /* see admit() */
#define MIG_GRAN_MAX       (64u << 20) /* the stream's blocks, whatever a bitmap may be */

static const char *const status_names[] = {
	[IOC_MIG_ST_NONE] = "none", [IOC_MIG_ST_SETUP] = "setup",
	[IOC_MIG_ST_ACTIVE] = "active", [IOC_MIG_ST_PRE_SWITCHOVER] = "pre-switchover",
	[IOC_MIG_ST_DEVICE] = "device", [IOC_MIG_ST_COMPLETED] = "completed",
	[IOC_MIG_ST_FAILED] = "failed", [IOC_MIG_ST_CANCELLING] = "cancelling",
	[IOC_MIG_ST_CANCELLED] = "cancelled",
};

int64_t ioc__mig_now_ms(void)
{
	return ioc_now_ns() / 1000000;
}

/* ---- state shared with the main loop ------------------------------------ */

void ioc__mig_event_locked(struct ioc__mig *m, const char *name, int64_t v)
{
	/* Only with capability events; a full queue drops pass events (the
	 * status events are few and never come that fast). */
	if (!m->p.events || m->nev == IOC_MIG_EVQ)
		return;
	m->evq[m->nev].name = name;
	m->evq[m->nev].v = v;
	m->nev++;
	ioc_bh_schedule(m->bh);
}

static void set_status(struct ioc__mig *m, int status)
{
	pthread_mutex_lock(&m->lock);
	ioc__mig_set_status_locked(m, status);
	pthread_mutex_unlock(&m->lock);
}

/* ---- waking the engine ------------------------------------------------- */

/*
 * The engine sleeps only in engine_wait().  Whatever may end a sleep (a
 * mirrored write queued, a worker's finished job, an answer, the socket
 * turning writable, a timer, migrate-continue, a cancel) first publishes
 * its news, then kicks.  eng_state is the handshake:
 *   engine_kick(), any thread: SLEEPING -> RUNNING, then post eng_wake,
 *     which resumes the engine on its loop; RUNNING or KICKED -> KICKED.
 *   engine_wait(): RUNNING -> SLEEPING, then yield; or, finding KICKED,
 *     back to RUNNING and return at once.
 * The engine looks at its conditions, calls engine_wait() and looks again
 * when it returns.  News published after a look is followed by a kick
 * that finds SLEEPING (and wakes the engine) or RUNNING or KICKED (and the
 * engine's next compare-and-swap fails, so it looks again): no kick is
 * lost.  Exactly one kick ends a sleep, so eng_wake is never posted again
 * before it ran.  Every kick is a read-modify-write (acq_rel), so the
 * engine's acquire, reading the last of them, sees every kicker's news;
 * the engine's release of SLEEPING gives a waking kicker eng_co.  A kick
 * never enters the engine directly, even on the engine's own thread (the
 * workqueue's callback and the reader coroutine must not run it nested).
 * Lifetime: the engine cannot end while asleep, and only the kick that
 * posts eng_wake ends a sleep; a kick after the engine ended touches only
 * eng_state.  Mirrored writes kick under mir_lock, so none kicks after
 * mirror_close() returned.  src/migrate/engine-wake.pml models it
 * (tests/migrate/test-mig-engine-model.sh).
 */
enum { ENG_RUNNING, ENG_KICKED, ENG_SLEEPING };

static void engine_wake(struct ioc_task *t)
{
	struct ioc__mig *m = ioc_container_of(t, struct ioc__mig, eng_wake);

	/* On the engine's loop, outside coroutines: enters it at once. */
	ioc_co_wake(m->eng_co);
}

static void engine_kick(struct ioc__mig *m)
{
	/* Relaxed: the compare-and-swap below is what pairs. */
	int st = atomic_load_explicit(&m->eng_state, memory_order_relaxed);

	/* Acq_rel: the release pairs with engine_wait()'s acquire (the
	 * news before this kick is seen there), the acquire with its
	 * release store of SLEEPING (eng_co and eng_loop are seen here). */
	while (!atomic_compare_exchange_weak_explicit(&m->eng_state, &st,
						      st == ENG_SLEEPING ? ENG_RUNNING
									 : ENG_KICKED,
						      memory_order_acq_rel,
						      memory_order_relaxed))
		;
	if (st == ENG_SLEEPING) {
		m->eng_wake.fn = engine_wake;
		ioc_loop_post(m->eng_loop, &m->eng_wake);
	}
}

static void source_finish(struct ioc__mig *m);
static void gate_all(struct ioc__mig *m, int state);

/* The destination's receive runs on a thread of its own (woken through
 * cond); a copy and a hand-over are the engine. */
static bool on_thread(const struct ioc__mig *m)
{
	return m->incoming;
}

/* Under lock: wake the job for a cancel or the end. */
static void job_wake_locked(struct ioc__mig *m)
{
	if (on_thread(m))
		pthread_cond_broadcast(&m->cond);
	else
		engine_kick(m);
}

/* Main loop: the engine (its I/O thread) or the receiving thread, which
 * has said its last word (thread_done), goes, and the end is reported. */
static void join_job(struct ioc__mig *m)
{
	if (on_thread(m)) {
		pthread_join(m->thread, NULL);
	} else {
		/* Its loop runs the engine's last iteration out first. */
		ioc_iothread_stop(m->eng);
		m->eng = NULL;
		m->eng_loop = NULL;
		m->eng_co = NULL;
	}
	m->thread_running = false;
	if (m->incoming)
		ioc__mig_incoming_finish(m);
	else
		source_finish(m);
}

/* Main loop: emit queued events in order; join a thread that ended. */
static void mig_bh(void *opaque)
{
	struct ioc__mig *m = opaque;
	bool done;

	ioc__mig_handover_bh(m);
	for (;;) {
		const char *name;
		int64_t v;

		pthread_mutex_lock(&m->lock);
		if (!m->nev) {
			done = m->thread_done;
			pthread_mutex_unlock(&m->lock);
			break;
		}
		name = m->evq[0].name;
		v = m->evq[0].v;
		memmove(&m->evq[0], &m->evq[1], (m->nev - 1) * sizeof(m->evq[0]));
		m->nev--;
		pthread_mutex_unlock(&m->lock);
		if (strcmp(name, "MIGRATION") == 0)
			m->host.event(m->host.opaque, name,
				      json_pack("{s:s}", "status", status_names[v]));
		else
			m->host.event(m->host.opaque, name,
				      json_pack("{s:I}", "pass", (json_int_t)v));
	}
	/* Not while a hand-over's node change runs: its end schedules
	 * this again (struct ioc__mig, ho_co). */
	if (done && m->thread_running && !m->ho_co) {
		join_job(m);
		/* The final status events. */
		ioc_bh_schedule(m->bh);
	}
}

int ioc__mig_new(struct ioc__mig **out, const struct ioc__mig_host *host)
{
	struct ioc__mig *m = calloc(1, sizeof(*m));

	*out = NULL;
	if (!m)
		return -ENOMEM;
	m->host = *host;
	m->bh = ioc_bh_new(host->main_loop, mig_bh, m);
	if (!m->bh) {
		free(m);
		return -ENOMEM;
	}
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	pthread_mutex_init(&m->mir_lock, NULL);
	m->sock = -1;
	m->listen_fd = -1;
	/* QEMU 7.2's defaults, but zero-blocks (on: storage is mostly holes)
	 * and max-bandwidth (unlimited: QEMU's 128 MiB/s is a guest's RAM
	 * budget, not a disk's). */
	m->p.zero_blocks = true;
	m->p.compress_level = 1;
	m->p.compress_threads = 8;
	m->p.decompress_threads = 2;
	m->p.compress_wait_thread = true;
	m->p.downtime_limit = 300;
	m->p.granularity = 4096;
	m->p.throttle_trigger_threshold = 50;
	m->p.cpu_throttle_initial = 20;
	m->p.cpu_throttle_increment = 10;
	m->p.max_cpu_throttle = 99;
	m->p.write_admission = 4;
	m->p.handover_timeout = 30000;
	*out = m;
	return 0;
}

void ioc__mig_log(struct ioc__mig *m, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!m->host.log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	m->host.log(m->host.opaque, msg);
}

void ioc__mig_free(struct ioc__mig *m)
{
	if (!m)
		return;
	m->in_done = NULL; /* the owner is going away too */
	if (m->thread_running) {
		pthread_mutex_lock(&m->lock);
		/* relaxed: the kick, the lock and the shutdown below order the
		 * rest. */
		atomic_store_explicit(&m->cancel, true, memory_order_relaxed);
		if (m->sock >= 0)
			shutdown(m->sock, SHUT_RDWR);
		job_wake_locked(m);
		/* The engine's last word, broadcast under the lock after
		 * thread_done is set (engine_end()); a thread is joined. */
		while (!on_thread(m) && !m->thread_done)
			pthread_cond_wait(&m->cond, &m->lock);
		pthread_mutex_unlock(&m->lock);
	}
	/* A hand-over's node change ends first (it uses m), and the one a
	 * join may start (handover.c); the loop that resumes it may run
	 * mig_bh, which may join. */
	for (;;) {
		while (m->ho_co)
			ioc_loop_poll(m->host.main_loop, true);
		if (!m->thread_running)
			break;
		join_job(m);
	}
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	ioc_bh_delete(m->bh);
	pthread_mutex_destroy(&m->lock);
	pthread_cond_destroy(&m->cond);
	pthread_mutex_destroy(&m->mir_lock);
	free(m);
}

int ioc__mig_parse_uri(const char *uri, char *host, size_t hl, char *port, size_t pl)
{
	const char *h, *colon;
	size_t n;

	if (strncmp(uri, "tcp:", 4) != 0)
		return -EINVAL;
	h = uri + 4;
	colon = strrchr(h, ':');
	if (!colon || !colon[1] || strlen(colon + 1) >= pl)
		return -EINVAL;
	n = (size_t)(colon - h);
	if (n && h[0] == '[' && h[n - 1] == ']') { /* [v6]:port */
		h++;
		n -= 2;
	}
	if (n >= hl)
		return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';
	strcpy(port, colon + 1);
	for (const char *p = port; *p; p++)
		if (*p < '0' || *p > '9')
			return -EINVAL;
	return 0;
}

/* ---- the copy (the engine) -------------------------------------------------- */

struct slot {
	struct ioc_wq_job job;
	struct ioc__mig_src *s;
	uint64_t off;
	uint32_t len;
	uint8_t *buf, *out;
	size_t out_cap, out_len;
	ZSTD_CCtx *cctx;
	int level;                      /* 0: raw */
	bool zero_detect;
	uint32_t type, crc;
	bool mirror;                    /* a MIRROR record: raw, no zero test */
	uint32_t bcrc[CHUNK_MAX / IOC_MIG_MIN_BLOCK]; /* recorded when sent */
	struct slot *next_free;         /* free, or handed back (done) */
};

struct ioc__mig_src {
	struct ioc__mig *m;
	struct ioc__mig_params p;
	struct ioc_loop *loop;          /* the engine's */
	struct ioc_timer timer;         /* ends an engine_wait() */
	struct ioc_node *node;          /* read through (the driver's loop
					 * state is dropped at the end) */
	int sock;
	void *tls;                      /* tls-creds set: the stream's session
					 * (host.tls) */
	uint64_t size;
	uint32_t block;
	struct ioc_blk_dirty *bm;
	struct ioc_mig_crcs *crcs;
	struct ioc_wq *wq;
	bool raw;                       /* compress off: see copy_inline() */
	struct slot *slots, *free_slots;
	struct slot *done, **done_tail; /* handed back by the workers, in
					 * order, to send (slot_done()) */
	unsigned nslots;
	unsigned pass;
	/* bandwidth */
	int64_t win_start;
	uint64_t win_bytes;
	int64_t pass_start;
	uint64_t pass_wire;
	uint64_t bw;                    /* measured bytes/s */
	/* active mirroring */
	bool active;
	uint64_t mir_next;              /* MIRROR records submitted */
	bool held;                      /* the switch-over holds the clients */
	bool mirrored_pass;             /* a dirty pass ran with mirroring */
	/* auto-converge: the throttle (%), periods above the threshold so
	 * far, and the current period: its start, the copy's bytes and
	 * chunks, the mirrored bytes, mir_seen at its start */
	unsigned thr_pct, thr_high;
	int64_t thr_t0;
	uint64_t thr_bg_bytes, thr_bg_recs, thr_wr_bytes, thr_seen;
	/* write admission: the current period's start and bytes copied */
	int64_t adm_t0;
	uint64_t adm_bytes;
	/* the socket's one loop handler (sock_watch()) */
	bool rd_watch;                  /* the reader waits for answers */
	bool rd_wait;                   /* the engine waits to read (the TLS
					 * handshake, a hand-over's READY) */
	bool wr_wait;                   /* the engine waits to send */
	bool want_mack;                 /* fence(): each MACK kicks */
	struct ioc_co *reader;
	bool reader_running;
	char why[256];
};

static bool cancelled(struct ioc__mig_src *s)
{
	/* relaxed: a request to stop; see struct ioc__mig. */
	return atomic_load_explicit(&s->m->cancel, memory_order_relaxed);
}

static int vfail(struct ioc__mig_src *s, int err, const char *fmt, va_list ap)
{
	if (!s->why[0])
		vsnprintf(s->why, sizeof(s->why), fmt, ap);
	return err;
}

static int fail(struct ioc__mig_src *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct ioc__mig_src *s, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err = vfail(s, err, fmt, ap);
	va_end(ap);
	return err;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Sleep until a kick or deadline (ns, CLOCK_MONOTONIC; INT64_MAX: none).
 * It may return early: the caller looks at its conditions again (the
 * handshake is above engine_kick()). */
static void ioc_coroutine_fn engine_wait(struct ioc__mig_src *s, int64_t deadline)
{
	struct ioc__mig *m = s->m;
	int st = ENG_RUNNING;

	/* Release: pairs with engine_kick()'s acquire, which then finds
	 * eng_co; acquire on failure: with the kicks' release (their news). */
	if (!atomic_compare_exchange_strong_explicit(&m->eng_state, &st, ENG_SLEEPING,
						     memory_order_acq_rel,
						     memory_order_acquire)) {
		/* Kicked meanwhile.  Acquire: pairs with the last kick's
		 * release (a kick may add itself to KICKED until here). */
		atomic_exchange_explicit(&m->eng_state, ENG_RUNNING, memory_order_acquire);
		return;
	}
	if (deadline < INT64_MAX)
		ioc_timer_arm(&s->timer, deadline);
	ioc_co_yield();
	ioc_timer_cancel(&s->timer);
}

static void engine_timer(void *opaque)
{
	struct ioc__mig_src *s = opaque;

	engine_kick(s->m);
}

/* Wait, cancellable, until deadline (a max-bandwidth pause). */
static void ioc_coroutine_fn engine_sleep_until(struct ioc__mig_src *s, int64_t deadline)
{
	while (!cancelled(s) && ioc_now_ns() < deadline)
		engine_wait(s, deadline);
}

/* Let the loop run what it has (the answer reader, the workers' handed
 * back jobs) and come back: between chunks, which otherwise never wait
 * while the link keeps up.  Nothing else wakes the engine meanwhile: it
 * is not in engine_wait(). */
static void ioc_coroutine_fn engine_yield(void)
{
	ioc_co_wake(ioc_co_self());
	ioc_co_yield();
}

static void sock_readable(void *opaque);
static void sock_writable(void *opaque);
static void sock_hs_readable(void *opaque);

/*
 * The socket's handler on the engine's loop, for both of its waiters:
 * ioc_co_wait_fd() would own the fd's one handler, and the reader waits
 * for answers while the engine waits to send.  Readable while the reader
 * runs (rd_watch) or, when no reader runs, while the engine waits to read
 * (rd_wait: the TLS handshake, a hand-over's READY); writable while the
 * engine waits in wait_sock().
 */
static int sock_watch(struct ioc__mig_src *s)
{
	return ioc_loop_set_fd(s->loop, s->sock,
			       s->rd_watch ? sock_readable : s->rd_wait ? sock_hs_readable : NULL,
			       s->wr_wait ? sock_writable : NULL, NULL, NULL, s);
}

static void sock_writable(void *opaque)
{
	struct ioc__mig_src *s = opaque;

	/* Level-triggered: off until the engine waits again. */
	s->wr_wait = false;
	sock_watch(s);
	engine_kick(s->m);
}

static void sock_hs_readable(void *opaque)
{
	struct ioc__mig_src *s = opaque;

	/* As sock_writable(). */
	s->rd_wait = false;
	sock_watch(s);
	engine_kick(s->m);
}

/* Wait until the socket may take more, or has bytes with readable (or a
 * kick: a cancel, which also shuts the socket down, or a mirrored write).
 * Try again after it either way. */
static int ioc_coroutine_fn wait_sock(struct ioc__mig_src *s, bool readable, int64_t deadline)
{
	bool *waiting = readable ? &s->rd_wait : &s->wr_wait;
	int ret;

	if (cancelled(s))
		return -ECANCELED;
	*waiting = true;
	ret = sock_watch(s);
	if (ret < 0) {
		*waiting = false;
		return fail(s, ret, "Cannot wait for the destination: %s", strerror(-ret));
	}
	engine_wait(s, deadline);
	if (*waiting) {
		*waiting = false;
		sock_watch(s);
	}
	return 0;
}

static int ioc_coroutine_fn wait_writable(struct ioc__mig_src *s, int64_t deadline)
{
	return wait_sock(s, false, deadline);
}

/* A worker: zero detection, CRC, compression. */
static void slot_job(struct ioc_wq_job *job)
{
	struct slot *sl = ioc_container_of(job, struct slot, job);

	sl->out_len = 0;
	if (!sl->mirror && sl->zero_detect && all_zero(sl->buf, sl->len)) {
		sl->type = IOC_MIG_ZERO;
		sl->crc = 0;
		return;
	}
	/* The block CRCs for the image checksum and the record's CRC, in one
	 * read of the data.  They are recorded when the record is sent, in
	 * stream order: a MIRROR and a chunk in flight may share blocks. */
	sl->crc = ioc_mig_block_crcs(sl->s->block, sl->buf, sl->len, sl->bcrc);
	sl->type = sl->mirror ? IOC_MIG_MIRROR : IOC_MIG_DATA_RAW;
	if (sl->level > 0 && !sl->mirror) {
		size_t n = ZSTD_compressCCtx(sl->cctx, sl->out, sl->out_cap, sl->buf,
					     sl->len, sl->level);

		if (!ZSTD_isError(n) && n > 0 && n < sl->len) {
			sl->type = IOC_MIG_DATA_ZSTD;
			sl->out_len = n;
		}
	}
}

static int ioc_coroutine_fn send_tls(struct ioc__mig_src *s, const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		const uint8_t *p = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left) {
			ssize_t n = s->m->host.tls->send(s->tls, p, left);

			if (n == -EAGAIN) {
				/* Again with the same p and left (migrate.h). */
				int ret = wait_writable(s, INT64_MAX);

				if (ret < 0)
					return ret;
				continue;
			}
			if (n < 0) {
				if (cancelled(s))
					return -ECANCELED;
				return fail(s, (int)n, "Unable to write to the destination "
					    "(TLS): %s", strerror((int)-n));
			}
			p += n;
			left -= (size_t)n;
		}
	}
	return 0;
}

/*
 * Send a record whole.  The socket is non-blocking: a full send queue
 * waits in wait_writable(), on the loop, so the answer reader runs
 * meanwhile.  It must: the destination answers every MIRROR with a MACK,
 * and one that blocks writing them (its socket full because nobody reads
 * here) reads no more records, so a sender blocked in send() and a reader
 * behind it on the same thread would wait for each other forever.
 */
static int ioc_coroutine_fn send_all(struct ioc__mig_src *s, struct iovec *iov, int iovcnt)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)iovcnt };
	size_t total = 0;

	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	if (s->tls)
		return send_tls(s, iov, iovcnt);
	while (total) {
		ssize_t n = sendmsg(s->sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int ret = wait_writable(s, INT64_MAX);

			if (ret < 0)
				return ret;
			continue;
		}
		if (n < 0) {
			int e = errno;

			if (cancelled(s))
				return -ECANCELED;
			return fail(s, -e, "Unable to write to the destination: %s",
				    strerror(e));
		}
		if (n == 0)
			return fail(s, -EPIPE, "Unable to write to the destination: closed");
		total -= (size_t)n;
		while (n > 0 && mh.msg_iovlen) {
			if ((size_t)n >= mh.msg_iov->iov_len) {
				n -= (ssize_t)mh.msg_iov->iov_len;
				mh.msg_iov++;
				mh.msg_iovlen--;
			} else {
				mh.msg_iov->iov_base = (uint8_t *)mh.msg_iov->iov_base + n;
				mh.msg_iov->iov_len -= (size_t)n;
				n = 0;
			}
		}
	}
	return 0;
}

/* max-bandwidth: once a window of a second has sent its share, wait (a
 * cancel cuts the wait short). */
static void ioc_coroutine_fn throttle(struct ioc__mig_src *s, uint64_t bytes)
{
	int64_t now = ioc_now_ns();
	uint64_t cap = s->p.max_bandwidth;

	if (!cap)
		return;
	if (now - s->win_start >= 1000000000) {
		s->win_start = now;
		s->win_bytes = 0;
	}
	s->win_bytes += bytes;
	int64_t due = s->win_start + (int64_t)((double)s->win_bytes * 1e9 / (double)cap);
	if (due > now)
		engine_sleep_until(s, due);
}

static int ioc_coroutine_fn send_rec(struct ioc__mig_src *s, const struct ioc_mig_rec *r,
				      const void *payload)
{
	uint8_t hdr[IOC_MIG_REC_SIZE];
	struct iovec iov[2] = {
		{ hdr, sizeof(hdr) }, { (void *)payload, r->payload_len },
	};
	int ret;

	ioc_mig_rec_encode(r, hdr);
	ret = send_all(s, iov, r->payload_len ? 2 : 1);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&s->m->lock);
	s->m->st.transferred += sizeof(hdr) + r->payload_len;
	s->p.max_bandwidth = s->m->p.max_bandwidth; /* may change on the way */
	pthread_mutex_unlock(&s->m->lock);
	s->pass_wire += sizeof(hdr) + r->payload_len;
	throttle(s, sizeof(hdr) + r->payload_len);
	return 0;
}

static int ioc_coroutine_fn send_zero(struct ioc__mig_src *s, uint64_t off, uint64_t len)
{
	struct ioc_mig_rec r = { .type = IOC_MIG_ZERO, .offset = off };
	uint64_t blocks;

	while (len) {
		/* ZERO records have no size limit but a 32-bit length. */
		uint64_t n = len > (1u << 30) ? (1u << 30) : len;
		int ret;

		r.offset = off;
		r.length = (uint32_t)n;
		ret = send_rec(s, &r, NULL);
		if (ret < 0)
			return ret;
		ioc_mig_crcs_set(s->crcs, off, n, NULL);
		blocks = (n + s->block - 1) / s->block;
		pthread_mutex_lock(&s->m->lock);
		s->m->st.duplicate += blocks;
		s->m->st.read_bytes += n;
		pthread_mutex_unlock(&s->m->lock);
		off += n;
		len -= n;
	}
	return 0;
}

/* A job came back (in order): its record goes out. */
static int ioc_coroutine_fn send_slot(struct ioc__mig_src *s, struct slot *sl)
{
	struct ioc_mig_rec r = {
		.type = sl->type, .offset = sl->off, .length = sl->len, .data_crc = sl->crc,
	};
	const void *payload = NULL;
	uint64_t blocks = (sl->len + s->block - 1) / s->block;
	int ret;

	if (sl->type == IOC_MIG_ZERO)
		return send_zero(s, sl->off, sl->len);
	ioc_mig_crcs_put(s->crcs, sl->off, sl->len, sl->bcrc);
	if (sl->type == IOC_MIG_DATA_ZSTD) {
		r.payload_len = (uint32_t)sl->out_len;
		payload = sl->out;
	} else {
		r.payload_len = sl->len;
		payload = sl->buf;
	}
	ret = send_rec(s, &r, payload);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&s->m->lock);
	s->m->st.normal += blocks;
	s->m->st.normal_bytes += sl->len;
	s->m->st.read_bytes += sl->len;
	if (sl->type == IOC_MIG_MIRROR)
		s->m->st.mirrored_bytes += sl->len;
	if (sl->type == IOC_MIG_DATA_ZSTD) {
		s->m->st.comp_pages += blocks;
		s->m->st.comp_size += sl->out_len;
		s->m->st.comp_in += sl->len;
	}
	pthread_mutex_unlock(&s->m->lock);
	return 0;
}

static void slot_put(struct ioc__mig_src *s, struct slot *sl)
{
	sl->next_free = s->free_slots;
	s->free_slots = sl;
}

/* The workqueue hands a finished job back, in order, on the engine's loop
 * (its bottom half): queue it for collect() and kick. */
static void slot_done(struct ioc_wq_job *job, void *opaque)
{
	struct slot *sl = ioc_container_of(job, struct slot, job);
	struct ioc__mig_src *s = opaque;

	sl->next_free = NULL;
	*s->done_tail = sl;
	s->done_tail = &sl->next_free;
	engine_kick(s->m);
}

/* Send the jobs handed back (waiting for at least one when wait and any
 * is in flight).  A send that waits lets more come back: they go too. */
static int ioc_coroutine_fn collect(struct ioc__mig_src *s, bool wait)
{
	struct slot *sl;
	int ret = 0;

	while (wait && !s->done && ioc_wq_in_flight(s->wq) > 0)
		engine_wait(s, INT64_MAX);
	while ((sl = s->done)) {
		s->done = sl->next_free;
		if (!s->done)
			s->done_tail = &s->done;
		if (ret == 0)
			ret = send_slot(s, sl);
		slot_put(s, sl);
	}
	return ret;
}

/* Wait until every job handed out has been sent. */
static int ioc_coroutine_fn drain(struct ioc__mig_src *s)
{
	while (ioc_wq_in_flight(s->wq) > 0 || s->done) {
		int ret = collect(s, true);

		if (ret < 0)
			return ret;
	}
	return 0;
}

static void snapshot_workers(struct ioc__mig_src *s)
{
	struct ioc_wq_worker_stats ws[64];
	int n = ioc_wq_get_stats(s->wq, ws, 64);

	pthread_mutex_lock(&s->m->lock);
	s->m->st.nworkers = n > 64 ? 64 : (unsigned)n;
	for (unsigned i = 0; i < s->m->st.nworkers; i++) {
		s->m->st.worker_busy_ns[i] = ws[i].busy_ns;
		s->m->st.worker_jobs[i] = ws[i].jobs;
	}
	pthread_mutex_unlock(&s->m->lock);
}

/* Read [off, off + len) through the node, on the engine's loop.  Not a
 * client's request: not counted in the node's statistics, and no gate
 * (only the front ends' ioc_node_co_enter() waits at one), so the last
 * pass reads while the clients are held. */
static int ioc_coroutine_fn read_full(struct ioc__mig_src *s, uint8_t *buf, uint32_t len,
				      uint64_t off)
{
	uint64_t size = atomic_load(&s->node->size);
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	int ret;

	/* Shrunk under us: what is not there reads as zeros. */
	if (off >= size || len > size - off) {
		uint64_t have = off >= size ? 0 : size - off;

		memset(buf + have, 0, len - have);
		iov.iov_len = (size_t)have;
	}
	if (!iov.iov_len)
		return 0;
	ret = ioc_node_co_preadv_job(s->node, off, &iov, 1);
	if (ret < 0)
		return fail(s, ret, "Unable to read the image at %llu: %s",
			    (unsigned long long)off, strerror(-ret));
	return 0;
}

/*
 * Without compression a chunk is read, checked for zeros, CRC'd and sent
 * by this thread, in one slot whose 256 KiB stay in this core's cache
 * from the read to the send.  Handing raw chunks to the workers cost more
 * than the work: the worker's core pulls the buffer over, the next read
 * into it pulls it back, and the read ran at a third of its speed
 * (bench/migrate/NOTES.md).  Records still leave in read order: nothing
 * is in the workqueue in this mode.
 */
static int ioc_coroutine_fn copy_inline(struct ioc__mig_src *s, uint64_t off, uint32_t len,
					bool mirror)
{
	struct slot *sl;
	int ret = drain(s);

	if (ret < 0)
		return ret;
	sl = s->free_slots;
	sl->off = off;
	sl->len = len;
	sl->mirror = mirror;
	/* The ordering rule: clear, then read (blk.h). */
	ioc_blk_dirty_reset(s->bm, off, len);
	ret = read_full(s, sl->buf, len, off);
	if (ret == 0) {
		slot_job(&sl->job);
		ret = send_slot(s, sl);
	}
	return ret;
}

/* One chunk: clear its bits, read it, hand it to a worker. */
static int ioc_coroutine_fn copy_chunk(struct ioc__mig_src *s, uint64_t off, uint32_t len,
				       bool mirror)
{
	struct slot *sl;
	bool busy = false;
	int ret;

	if (s->raw)
		return copy_inline(s, off, len, mirror);
	while (!s->free_slots) {
		if (!busy) {
			busy = true;
			pthread_mutex_lock(&s->m->lock);
			s->m->st.comp_busy++;
			pthread_mutex_unlock(&s->m->lock);
			if (!s->p.compress_wait_thread && s->p.compress && !s->active) {
				/* QEMU's compress-wait-thread off: send this one
				 * uncompressed rather than wait.  Ordering: records
				 * of one pass may go in any order (not so with
				 * MIRROR records in flight: not when active). */
				struct slot tmp = { .s = s, .off = off, .len = len,
						    .zero_detect = s->p.zero_blocks };

				tmp.buf = malloc(len);
				if (!tmp.buf)
					return fail(s, -ENOMEM, "out of memory");
				ioc_blk_dirty_reset(s->bm, off, len);
				ret = read_full(s, tmp.buf, len, off);
				if (ret == 0) {
					slot_job(&tmp.job);
					ret = send_slot(s, &tmp);
				}
				free(tmp.buf);
				return ret;
			}
		}
		ret = collect(s, true);
		if (ret < 0)
			return ret;
	}
	sl = s->free_slots;
	s->free_slots = sl->next_free;
	sl->off = off;
	sl->len = len;
	sl->mirror = mirror;
	/* The ordering rule: clear, then read (blk.h). */
	ioc_blk_dirty_reset(s->bm, off, len);
	ret = read_full(s, sl->buf, len, off);
	if (ret < 0) {
		slot_put(s, sl);
		return ret;
	}
	pthread_mutex_lock(&s->m->lock);
	s->m->st.comp_jobs++;
	pthread_mutex_unlock(&s->m->lock);
	while ((ret = ioc_wq_submit(s->wq, &sl->job)) == -EAGAIN) {
		ret = collect(s, true);
		if (ret < 0) {
			slot_put(s, sl);
			return ret;
		}
	}
	if (ret < 0) {
		slot_put(s, sl);
		return fail(s, ret, "compression workers: %s", strerror(-ret));
	}
	return collect(s, false);
}

/* ---- active mirroring -------------------------------------------------- */

#define MIRROR_MAX (64u << 20) /* larger writes are left to the passes */

static uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Under mir_lock: a request is answered (any thread; the last touch of q:
 * it lives on the stack of the coroutine this resumes). */
static void mirror_done_locked(struct ioc__mig_mirror_req *q)
{
	ioc_co_await_done(&q->aw, 0);
}

/* Under mir_lock: answer the sent requests the destination has applied. */
static void mirror_acked_locked(struct ioc__mig *m)
{
	while (m->mir_sent && m->mir_sent->seq <= m->mir_acked) {
		struct ioc__mig_mirror_req *q = m->mir_sent;

		m->mir_sent = q->next;
		if (!m->mir_sent)
			m->mir_sent_tail = &m->mir_sent;
		mirror_done_locked(q);
	}
}

static void mirror_start(struct ioc__mig_src *s)
{
	struct ioc__mig *m = s->m;

	pthread_mutex_lock(&m->mir_lock);
	m->mir_open = true;
	pthread_mutex_unlock(&m->mir_lock);
	/* Release: pairs with the notifier's acquire load (mirror_notify()),
	 * which then sees the state initialised here and when the job began. */
	atomic_store_explicit(&m->hook, true, memory_order_release);
	s->active = true;
	pthread_mutex_lock(&m->lock);
	m->st.active_mirror = true;
	pthread_mutex_unlock(&m->lock);
}

/* Take no more writes and answer every one waiting or sent: their data
 * is on the source.  Under mir_lock. */
static void mirror_release_all_locked(struct ioc__mig *m)
{
	m->mir_open = false;
	m->mir_acked = UINT64_MAX;
	mirror_acked_locked(m);
	while (m->mir_wait) {
		struct ioc__mig_mirror_req *q = m->mir_wait;

		m->mir_wait = q->next;
		mirror_done_locked(q);
	}
	m->mir_wait_tail = &m->mir_wait;
}

/* No more mirroring, admission or throttling: every waiting write is
 * answered -- its data is on the source, and once the last pass ran on
 * the destination too (it sends every block still dirty). */
static void mirror_close(struct ioc__mig *m)
{
	/* Release: pairs with the notifier's acquire load; a notifier that
	 * still saw it set finds mir_open false under the lock. */
	atomic_store_explicit(&m->hook, false, memory_order_release);
	/* Relaxed: pairs with the notifier's load (a hint). */
	atomic_store_explicit(&m->mir_throttle, 0, memory_order_relaxed);
	/* Relaxed: pairs with admit()'s load (a hint). */
	atomic_store_explicit(&m->adm_gap, 0, memory_order_relaxed);
	pthread_mutex_lock(&m->mir_lock);
	mirror_release_all_locked(m);
	pthread_mutex_unlock(&m->mir_lock);
}

/* The migration ended (any outcome): mirror_close(), and the throttle
 * shown stops. */
static void mirror_stop(struct ioc__mig_src *s)
{
	struct ioc__mig *m = s->m;

	mirror_close(m);
	pthread_mutex_lock(&m->lock);
	m->st.throttle_pct = 0; /* QEMU: the throttle stops with the migration */
	pthread_mutex_unlock(&m->lock);
}

/*
 * auto-converge's throttle, on the writer.  QEMU runs a throttled vCPU for
 * 10 ms and then stops it for 10 ms * pct / (100 - pct), so that it runs
 * (100 - pct)% of the time.  A client's unit of progress here is a write:
 * each write, once done (mirrored or not), is answered only after a pause
 * of THROTTLE_UNIT_NS * pct / (100 - pct).  Per write rather than QEMU's
 * slices: holding the writes for pct% of each 10 ms slice pauses them 90
 * ms at once at 90%, which a client sees as its p99.  The unit: at
 * max-cpu-throttle's default (99) a write pauses 25 ms, so a 16-deep
 * writer is held near 600 writes/s; 0.5 ms (50 ms) doubled the p99 and
 * did not shorten the copy (bench/migrate/NOTES.md).  One timer on the
 * request's loop; a pause that began before the end of the migration
 * runs out (at most 25 ms).
 */
static void ioc_coroutine_fn throttle_pause(struct ioc__mig *m)
{
	/* Relaxed: pairs with the stores in throttle_up() and mirror_stop();
	 * a stale value only changes one pause. */
	unsigned pct = atomic_load_explicit(&m->mir_throttle, memory_order_relaxed);

	if (!pct)
		return;
	ioc_co_sleep_ns((int64_t)THROTTLE_UNIT_NS * pct / (100 - pct));
}

/*
 * Write admission (__org.iocore_write-admission): while a migration runs,
 * client writes are answered at most write-admission per MiB the copy
 * sends, one every adm_gap ns (admit_update()).  A write is cheap in bytes
 * but not in CPU: its request, its read-back and MIRROR round trip, and
 * the client's own work share the cores with the copy, and an unbounded
 * 4 KiB writer got 13000 writes/s through while the copy ran at two
 * thirds of its idle speed (bench/migrate/NOTES.md).  QEMU's write-blocking
 * mirror bounds its writers by the target's round trip instead.  A
 * virtual clock, not a token count: each write claims the next free time
 * (adm_next, compare-and-swap) and sleeps once until it on its own loop;
 * nothing has to wake it.  No credit builds up while nobody writes (a
 * claim starts from now at the earliest), and a wait is capped at
 * ADMIT_WAIT_MAX_NS so a crowd of writers is slowed, not stalled.
 */
static void ioc_coroutine_fn admit(struct ioc__mig *m)
{
	/* Relaxed: pairs with the stores in admit_update() and mirror_stop();
	 * a stale gap only changes one write's wait. */
	int64_t gap = atomic_load_explicit(&m->adm_gap, memory_order_relaxed);
	int64_t now, next, mine;

	if (gap <= 0)
		return;
	now = ioc_now_ns();
	/* Relaxed, with the compare-and-swap below: the claims of other
	 * writes are what it pairs with; only this value is shared. */
	next = atomic_load_explicit(&m->adm_next, memory_order_relaxed);
	do {
		mine = next > now ? next : now;
	} while (!atomic_compare_exchange_weak_explicit(&m->adm_next, &next, mine + gap,
							memory_order_relaxed,
							memory_order_relaxed));
	if (mine > now)
		ioc_co_sleep_ns(mine - now > ADMIT_WAIT_MAX_NS ? ADMIT_WAIT_MAX_NS : mine - now);
}

static void ioc_coroutine_fn write_pause(struct ioc__mig *m)
{
	admit(m);
	throttle_pause(m);
}

/*
 * The write notifier on the migrated node: a write, write-zeroes or
 * discard of any front end, after the driver did it (a failed one is left
 * alone).  While the migration mirrors actively it waits, in the request's
 * coroutine and so inside the node, until those blocks are on the
 * destination or the migration closed mirroring (mirror_close(), which
 * the switch-over does before its hold: the hold waits for every request
 * inside).  m lives until the notifier is removed (source_finish()).
 */
static int ioc_coroutine_fn mirror_notify(struct ioc_node_notifier *nt, struct ioc_node *n,
					  enum ioc_node_op op, uint64_t off, uint64_t len,
					  int ret)
{
	struct ioc__mig *m = ioc_container_of(nt, struct ioc__mig, nt);
	struct ioc__mig_mirror_req q = { .offset = off, .len = len };

	/* Acquire: pairs with the release stores in mirror_start(), run()
	 * and mirror_close(). */
	if (ret < 0 || len == 0 || !atomic_load_explicit(&m->hook, memory_order_acquire))
		return 0;
	/* Relaxed: a count, read by throttle_check(). */
	atomic_fetch_add_explicit(&m->mir_seen, 1, memory_order_relaxed);
	if (len > MIRROR_MAX) {
		write_pause(m);
		return 0; /* a large one stays dirty for the passes */
	}
	/* Acquire: pairs with the release stores in copy_range() and run():
	 * a write ahead of pass 1 keeps its dirty bits, and pass 1 clears
	 * and reads it later (a stale cursor only means a write is left to
	 * the bitmap: correct either way). */
	if (off >= atomic_load_explicit(&m->mir_cursor, memory_order_acquire)) {
		write_pause(m);
		return 0;
	}
	ioc_co_await_init(&q.aw);
	pthread_mutex_lock(&m->mir_lock);
	if (!m->mir_open) {
		/* Not mirrored (yet, or any more): the bitmap has it. */
		pthread_mutex_unlock(&m->mir_lock);
		admit(m);
		return 0;
	}
	*m->mir_wait_tail = &q;
	m->mir_wait_tail = &q.next;
	/* The engine takes mir_wait between chunks, or at once when it
	 * waits (pace(), fence()).  Under mir_lock: the engine's
	 * mirror_close() takes it before the engine ends, so no kick comes
	 * after that. */
	engine_kick(m);
	pthread_mutex_unlock(&m->mir_lock);
	ioc_co_await(&q.aw);
	write_pause(m);
	return 0;
}

/* Raise the throttle (QEMU's steps: cpu-throttle-initial, then
 * cpu-throttle-increment, or with cpu-throttle-tailslow only what would
 * bring the writer's share down to the threshold; max-cpu-throttle caps
 * it).  ratio: the writer's share in the period that triggered it. */
static void throttle_up(struct ioc__mig_src *s, double ratio)
{
	unsigned next;

	if (!s->thr_pct) {
		next = s->p.cpu_throttle_initial;
	} else if (!s->p.cpu_throttle_tailslow) {
		next = s->thr_pct + s->p.cpu_throttle_increment;
	} else {
		/* The serving share that would meet the threshold, if the
		 * writer's share scales with it. */
		double serve = 100.0 - s->thr_pct;
		double ideal = serve * (s->p.throttle_trigger_threshold / 100.0) / ratio;
		double inc = serve - ideal;

		if (inc > s->p.cpu_throttle_increment)
			inc = s->p.cpu_throttle_increment;
		next = s->thr_pct + (inc > 1.0 ? (unsigned)inc : 1);
	}
	if (next > s->p.max_cpu_throttle)
		next = s->p.max_cpu_throttle;
	s->thr_pct = next;
	/* Relaxed: pairs with the notifier's load (a hint, see there). */
	atomic_store_explicit(&s->m->mir_throttle, next, memory_order_relaxed);
	pthread_mutex_lock(&s->m->lock);
	s->m->st.throttle_pct = next;
	if (next > s->m->st.throttle_max)
		s->m->st.throttle_max = next;
	pthread_mutex_unlock(&s->m->lock);
}

/*
 * After each background chunk: every THROTTLE_PERIOD_NS, QEMU's trigger
 * -- the writer's share above throttle-trigger-threshold percent of what
 * the copy sent, in two periods, raises the throttle -- with the share
 * counted both in bytes (mirrored bytes per chunk byte) and in cost
 * (client writes, mirrored or ahead of pass 1, per CHUNK_WRITES chunks),
 * the larger deciding.  QEMU counts bytes only (RAM dirtied against RAM
 * sent); on a fast link a 4 KiB write costs the servers and the client a
 * request's handling (and a MIRROR's round trip) far more than its bytes:
 * on loopback a chunk costs about ten writes, and counting a write as a
 * chunk made the throttle climb to its maximum whenever the writer kept
 * up with half the chunks (the measurements are in bench/migrate/NOTES.md).
 * QEMU checks at each
 * dirty-bitmap sync, at most once a second; pass 1 here has no sync and
 * lasts seconds, hence the fixed period, short enough that the throttle
 * climbs from 20% to 99% in under a second.
 */
static void throttle_check(struct ioc__mig_src *s, uint64_t bytes)
{
	int64_t now;

	if (!s->p.auto_converge || !s->active || s->held)
		return;
	s->thr_bg_bytes += bytes;
	s->thr_bg_recs++;
	now = ioc_now_ns();
	if (!s->thr_t0)
		s->thr_t0 = now;
	if (now - s->thr_t0 < THROTTLE_PERIOD_NS)
		return;
	/* Relaxed: pairs with the notifier's increment (a count; nothing is
	 * published with it). */
	uint64_t seen = atomic_load_explicit(&s->m->mir_seen, memory_order_relaxed);
	double rb = (double)s->thr_wr_bytes / (double)s->thr_bg_bytes;
	double rr = (double)(seen - s->thr_seen) / (double)(s->thr_bg_recs * CHUNK_WRITES);
	double r = rb > rr ? rb : rr;

	if (r * 100.0 > s->p.throttle_trigger_threshold && ++s->thr_high >= 2) {
		s->thr_high = 0;
		throttle_up(s, r);
	}
	s->thr_t0 = now;
	s->thr_seen = seen;
	s->thr_bg_bytes = s->thr_bg_recs = s->thr_wr_bytes = 0;
}

/*
 * After each background chunk: every THROTTLE_PERIOD_NS, the gap between
 * admitted writes from the copy's rate in that period, write-admission
 * writes per MiB.  Never longer than ADMIT_GAP_MAX_NS (1000 writes/s): on
 * a slow link the bound would starve the writer, while writes at that
 * rate cost the copy little, and mirrored ones are paced by the link
 * anyway.  A period without progress (the copy waiting for the link)
 * gets the longest gap.
 */
static void admit_update(struct ioc__mig_src *s, uint64_t bytes)
{
	int64_t now, gap = ADMIT_GAP_MAX_NS;

	if (!s->p.write_admission || s->held)
		return;
	s->adm_bytes += bytes;
	now = ioc_now_ns();
	if (!s->adm_t0)
		s->adm_t0 = now;
	if (now - s->adm_t0 < THROTTLE_PERIOD_NS)
		return;
	if (s->adm_bytes) {
		double writes = (double)s->adm_bytes / (1 << 20) * s->p.write_admission;
		double g = (double)(now - s->adm_t0) / writes;

		if (g < (double)ADMIT_GAP_MAX_NS)
			gap = (int64_t)g;
	}
	/* Relaxed: pairs with admit()'s load (a hint). */
	atomic_store_explicit(&s->m->adm_gap, gap, memory_order_relaxed);
	s->adm_t0 = now;
	s->adm_bytes = 0;
}

/*
 * Send what the waiting requests wrote: for each, its whole blocks are
 * cleared in the bitmap, read back from the image and submitted as
 * MIRROR jobs to the same in-order workqueue as the chunks, so records
 * leave in the order their data was read (the property that makes the
 * destination's last record of a block the newest; see the top).
 */
static int ioc_coroutine_fn mirror_service(struct ioc__mig_src *s)
{
	struct ioc__mig *m = s->m;
	struct ioc__mig_mirror_req *list, *q;
	int ret = 0;

	if (!s->active)
		return 0;
	pthread_mutex_lock(&m->mir_lock);
	list = m->mir_wait;
	m->mir_wait = NULL;
	m->mir_wait_tail = &m->mir_wait;
	pthread_mutex_unlock(&m->mir_lock);
	while ((q = list)) {
		uint64_t off = align_down(q->offset, s->block);
		uint64_t end = align_up(q->offset + q->len, s->block);
		uint64_t n = 0;

		if (end > s->size)
			end = s->size;
		s->thr_wr_bytes += end - off;
		for (; ret == 0 && off < end; off += n) {
			n = end - off > CHUNK_MAX ? CHUNK_MAX : end - off;
			pthread_mutex_lock(&m->mir_lock);
			m->mir_bound = s->mir_next + 1;
			pthread_mutex_unlock(&m->mir_lock);
			ret = copy_chunk(s, off, (uint32_t)n, true);
			if (ret == 0)
				s->mir_next++;
		}
		list = q->next; /* before q is answered */
		q->seq = s->mir_next;
		pthread_mutex_lock(&m->mir_lock);
		if (ret < 0 || q->seq <= m->mir_acked) {
			mirror_done_locked(q);
		} else {
			q->next = NULL;
			*m->mir_sent_tail = q;
			m->mir_sent_tail = &q->next;
		}
		pthread_mutex_unlock(&m->mir_lock);
		pthread_mutex_lock(&m->lock);
		m->st.mirrored_writes++;
		pthread_mutex_unlock(&m->lock);
	}
	return ret;
}

/*
 * The answer reader: a coroutine on the engine's loop that reads the
 * destination's records (MACK while the copy runs, then ACK) while the
 * engine sends.  The socket is non-blocking: it reads until the socket
 * (with TLS, the session: recv's contract in migrate.h) has nothing more,
 * then waits for readability, so it runs whenever the engine waits (see
 * send_all()).  MACK answers the mirrored writes (and kicks a fence());
 * ACK, EOF or an error ends it, recorded in ans_* under mir_lock and then
 * kicked to the engine (wait_ack(), the pre-switchover wait).  An error
 * also stops mirroring (the waiting writes are answered: the data is on
 * the source).  A cancel or the engine's end shuts the socket down,
 * which ends it.
 */
static void sock_readable(void *opaque)
{
	struct ioc__mig_src *s = opaque;

	/* The loop's thread, outside coroutines: runs the reader until it
	 * has read all there is. */
	ioc_co_wake(s->reader);
}

/* A MACK: answer the writes it covers.  0, or -EPROTO with why set. */
static int answer_mack(struct ioc__mig_src *s, const struct ioc_mig_rec *r, const char **why)
{
	struct ioc__mig *m = s->m;

	pthread_mutex_lock(&m->mir_lock);
	if (r->offset > m->mir_bound) {
		/* Acknowledging what was never sent would answer writes that
		 * are not on the destination. */
		pthread_mutex_unlock(&m->mir_lock);
		*why = "The destination acknowledged mirrored writes it was not sent";
		return -EPROTO;
	}
	if (r->offset > m->mir_acked)
		m->mir_acked = r->offset;
	mirror_acked_locked(m);
	pthread_mutex_unlock(&m->mir_lock);
	if (s->want_mack)
		engine_kick(m);
	return 0;
}

static void ioc_coroutine_fn ack_reader(void *opaque)
{
	struct ioc__mig_src *s = opaque;
	struct ioc__mig *m = s->m;
	struct ioc_mig_hdr h = { .image_size = s->size, .block_size = s->block };
	uint8_t buf[32 * IOC_MIG_REC_SIZE];
	struct ioc_mig_rec r = { 0 };
	const char *why = NULL;
	size_t got = 0;
	int ret;

	s->rd_watch = true;
	ret = sock_watch(s);
	if (ret < 0) {
		why = "Cannot wait for the destination's answers";
		goto out;
	}
	for (;;) {
		size_t used = 0;
		ssize_t n;

		if (s->tls) {
			n = m->host.tls->recv(s->tls, buf + got, sizeof(buf) - got);
		} else {
			n = recv(s->sock, buf + got, sizeof(buf) - got, MSG_DONTWAIT);
			if (n < 0)
				n = errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		if (n == -EINTR)
			continue;
		if (n == -EAGAIN) {
			/* Entered again by sock_readable(). */
			ioc_co_yield();
			continue;
		}
		if (n <= 0) {
			ret = n < 0 ? (int)n : -EPIPE;
			why = "The destination closed the stream before its answer";
			goto out;
		}
		got += (size_t)n;
		for (; got - used >= IOC_MIG_REC_SIZE; used += IOC_MIG_REC_SIZE) {
			if (ioc_mig_rec_decode(buf + used, &h, &r, &why) < 0 ||
			    (r.type != IOC_MIG_MACK && r.type != IOC_MIG_ACK)) {
				ret = -EPROTO;
				why = "Bad answer from the destination";
				goto out;
			}
			if (r.type == IOC_MIG_ACK)
				goto out; /* the last record: nothing may follow */
			ret = answer_mack(s, &r, &why);
			if (ret < 0)
				goto out;
		}
		memmove(buf, buf + used, got - used);
		got -= used;
	}
out:
	s->rd_watch = false;
	sock_watch(s);
	pthread_mutex_lock(&m->mir_lock);
	m->ans_done = true;
	m->ans_ret = ret;
	m->ans_type = r.type;
	m->ans_off = r.offset;
	m->ans_crc = r.data_crc;
	snprintf(m->ans_why, sizeof(m->ans_why), "%s", why ? why : "");
	if (ret < 0) {
		/* No MACK will come: answer the writes, take no more. */
		mirror_release_all_locked(m);
	}
	pthread_mutex_unlock(&m->mir_lock);
	/* A dead destination must also end a pause in pre-switchover, where
	 * the clients are held: dest_gone under the lock, then the kick. */
	pthread_mutex_lock(&m->lock);
	m->dest_gone = true;
	pthread_mutex_unlock(&m->lock);
	s->reader_running = false;
	engine_kick(m);
}

static uint64_t dirty_bytes(struct ioc__mig_src *s)
{
	struct ioc_blk_dirty_info di;

	ioc_blk_dirty_get_info(s->bm, &di);
	return di.count;
}

/* auto, during pass 1: mirror once what was written behind the pass could
 * no longer be sent within downtime-limit at the rate pass 1 sends. */
static void auto_start(struct ioc__mig_src *s)
{
	int64_t dt = ioc_now_ns() - s->pass_start;
	double bw;

	if (dt < 100000000 || !s->pass_wire)
		return;
	bw = (double)s->pass_wire * 1e9 / (double)dt;
	if ((double)dirty_bytes(s) * 1000.0 > (double)s->p.downtime_limit * bw)
		mirror_start(s);
}

/* One look at the send queue for pace() and wait_sent(): 1 while it holds
 * more than limit bytes and keeps moving (*last, *deadline carry that
 * between looks), 0 once it is down to limit, cannot be read, or has not
 * moved for ACK_TIMEOUT_MS; -ECANCELED on a cancel. */
static int queue_above(struct ioc__mig_src *s, int limit, int *last, int64_t *deadline)
{
	int q = 0;

	if (ioctl(s->sock, SIOCOUTQ, &q) < 0 || q <= limit)
		return 0;
	if (cancelled(s))
		return -ECANCELED;
	if (q != *last) {
		*last = q;
		*deadline = ioc__mig_now_ms() + ACK_TIMEOUT_MS;
	} else if (ioc__mig_now_ms() > *deadline) {
		return 0;
	}
	return 1;
}

/* While writes wait: serve the mirror, send what the workers finished,
 * then sleep until deadline or a kick (a mirrored write among them). */
static int ioc_coroutine_fn serve_and_wait(struct ioc__mig_src *s, int64_t deadline)
{
	int ret = mirror_service(s);

	if (ret == 0)
		ret = collect(s, false);
	if (ret == 0)
		engine_wait(s, deadline);
	return ret;
}

/*
 * While writes are mirrored, a background chunk is read only once the
 * stream's send queue (SIOCOUTQ: bytes the destination has not
 * acknowledged) is down to MIRROR_QUEUE.  A MIRROR record leaves behind
 * everything queued before it, and the socket alone holds megabytes (its
 * SO_SNDBUF): unpaced, a mirrored write waited for them to drain.  Waiting
 * writes are served meanwhile, so their records go out ahead of the next
 * chunk.  Not under the switch-over's hold: no write waits then, and the
 * last pass is downtime.  The queue has no event of its own: it is looked
 * at every QUEUE_LOOK_NS on a loop timer, and at once after each mirrored
 * write's kick, which is served then.  A cancel ends it, and so does a
 * queue that does not move for ACK_TIMEOUT_MS (the next send then meets
 * the link's state, as without pacing).
 */
static int ioc_coroutine_fn pace(struct ioc__mig_src *s)
{
	int64_t deadline = ioc__mig_now_ms() + ACK_TIMEOUT_MS;
	int last = -1;

	while (s->active && !s->held) {
		int ret = queue_above(s, MIRROR_QUEUE, &last, &deadline);

		if (ret <= 0)
			return ret;
		ret = serve_and_wait(s, ioc_now_ns() + QUEUE_LOOK_NS);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* Copy [off, off + len) in chunks (block-aligned; the last may be short). */
static int ioc_coroutine_fn copy_range(struct ioc__mig_src *s, uint64_t off, uint64_t len)
{
	while (len) {
		uint32_t n = len > CHUNK_MAX ? CHUNK_MAX : (uint32_t)len;
		int ret;

		if (cancelled(s))
			return -ECANCELED;
		ret = pace(s);
		if (ret == 0)
			ret = mirror_service(s);
		if (ret == 0)
			ret = copy_chunk(s, off, n, false);
		if (ret < 0)
			return ret;
		throttle_check(s, n);
		admit_update(s, n);
		engine_yield();
		off += n;
		len -= n;
		if (s->pass == 1) {
			/* Release: pairs with the notifier's acquire load. */
			atomic_store_explicit(&s->m->mir_cursor, off, memory_order_release);
			pthread_mutex_lock(&s->m->lock);
			s->m->st.pass1_pos = off;
			pthread_mutex_unlock(&s->m->lock);
			if (!s->active && s->p.active_mirror == IOC_MIG_MIRROR_AUTO &&
			    (off / CHUNK_MAX) % 16 == 0)
				auto_start(s);
		}
	}
	return 0;
}

static int ioc_coroutine_fn send_pass(struct ioc__mig_src *s)
{
	struct ioc_mig_rec r = { .type = IOC_MIG_PASS };
	int ret = drain(s); /* a pass's records before the next PASS */

	if (ret < 0)
		return ret;
	s->pass++;
	r.offset = s->pass;
	ret = send_rec(s, &r, NULL);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&s->m->lock);
	s->m->st.dirty_sync_count = s->pass;
	ioc__mig_event_locked(s->m, "MIGRATION_PASS", s->pass);
	pthread_mutex_unlock(&s->m->lock);
	return 0;
}

/*
 * The run at off (block-aligned) as the node's block status sees it: its
 * end, and whether it reads as zeroes.  Only whole blocks of zeroes count
 * (a run that ends inside a block makes the block data); the image's end
 * ends a run.  A status that fails or says nothing is data: reading is
 * always right.  Consecutive runs of one kind are merged, so a format's
 * per-cluster answers become one range.
 */
static int ioc_coroutine_fn next_run(struct ioc__mig_src *s, uint64_t off, uint64_t *end,
				     bool *zero)
{
	uint64_t pos = off;
	int kind = -1;

	while (pos < s->size) {
		uint64_t pnum = 0, e;
		int st = ioc_node_co_block_status(s->node, pos, s->size - pos, &pnum, NULL);
		int z;

		if (st < 0 || pnum == 0) {
			st = IOC_NODE_ST_DATA;
			pnum = s->size - pos;
		}
		e = pos + pnum >= s->size ? s->size : pos + pnum;
		z = (st & IOC_NODE_ST_ZERO) != 0;
		if (z) {
			uint64_t ze = e == s->size ? e : align_down(e, s->block);

			if (ze <= pos) {
				/* Less than a block of zeroes: its block is data. */
				z = 0;
				e = align_up(pos + 1, s->block);
			} else {
				e = ze;
			}
		} else {
			e = e == s->size ? e : align_up(e, s->block);
		}
		if (e > s->size)
			e = s->size;
		if (kind >= 0 && z != kind)
			break;
		kind = z;
		pos = e;
		/* A bound on one look: the next comes after this run's copy. */
		if (pos - off >= (64u << 20))
			break;
	}
	*end = pos;
	*zero = kind == 1;
	return 0;
}

/* Pass 1: every block; zeroes (whole blocks of them) without reading. */
static int ioc_coroutine_fn pass_full(struct ioc__mig_src *s)
{
	uint64_t off = 0;
	int ret = send_pass(s);

	if (ret < 0)
		return ret;
	while (off < s->size) {
		uint64_t end;
		bool zero;

		if (cancelled(s))
			return -ECANCELED;
		next_run(s, off, &end, &zero);
		if (zero && s->p.zero_blocks) {
			/* No reset here: the ordering rule is clear, then read,
			 * and the status that found these zeroes came before any
			 * clear.  A write into them since then keeps its bits
			 * and goes in the next pass. */
			ret = send_zero(s, off, end - off);
		} else {
			ret = copy_range(s, off, end - off);
		}
		if (ret < 0)
			return ret;
		off = end;
		pthread_mutex_lock(&s->m->lock);
		s->m->st.pass1_pos = off;
		pthread_mutex_unlock(&s->m->lock);
	}
	pthread_mutex_lock(&s->m->lock);
	s->m->st.pass1_pos = s->size;
	pthread_mutex_unlock(&s->m->lock);
	return drain(s);
}


/* A pass over what the bitmap says changed. */
static int ioc_coroutine_fn pass_dirty(struct ioc__mig_src *s)
{
	uint64_t off = 0;
	int ret = send_pass(s);

	if (ret < 0)
		return ret;
	while (off < s->size) {
		uint64_t len;
		int d = ioc_blk_dirty_extent(s->bm, off, s->size - off, &len);

		if (d < 0)
			return fail(s, d, "dirty bitmap: %s", strerror(-d));
		if (d == 1) {
			ret = copy_range(s, off, len);
			if (ret < 0)
				return ret;
		}
		off += len;
	}
	return drain(s);
}

/* Measure the bandwidth of the pass that just ended. */
static void pass_end(struct ioc__mig_src *s)
{
	int64_t now = ioc_now_ns(), dt = now - s->pass_start;

	if (dt > 1000000 && s->pass_wire > 0) {
		uint64_t bw = (uint64_t)((double)s->pass_wire * 1e9 / (double)dt);

		s->bw = s->bw ? (s->bw + bw) / 2 : bw;
	}
	s->pass_start = now;
	s->pass_wire = 0;
	snapshot_workers(s);
	pthread_mutex_lock(&s->m->lock);
	s->m->st.bandwidth = s->bw;
	pthread_mutex_unlock(&s->m->lock);
}

/* While a connect is in progress: on the loop until the socket may be
 * writable, the time is up or a cancel kicks. */
static int ioc_coroutine_fn connect_wait(void *opaque, int fd, int64_t left_ms)
{
	struct ioc__mig_src *s = opaque;
	int ret;

	s->sock = fd;
	ret = wait_writable(s, ioc_now_ns() + (left_ms + 1) * 1000000);
	s->sock = -1;
	return ret;
}

/* The TLS handshake, a step at a time on the loop (the socket stays
 * non-blocking; a cancel kicks, and a silent peer meets the deadline). */
static int ioc_coroutine_fn tls_handshake(struct ioc__mig_src *s, char *e, size_t elen)
{
	int64_t deadline = ioc_now_ns() + (int64_t)CONNECT_TIMEOUT_MS * 1000000;

	for (;;) {
		bool want_write = false;
		int r = s->m->host.tls->handshake(s->tls, &want_write, e, elen);

		if (r != -EAGAIN)
			return r;
		if (cancelled(s))
			return -ECANCELED;
		if (ioc_now_ns() >= deadline) {
			snprintf(e, elen, "no answer in %d s", CONNECT_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		if ((r = wait_sock(s, !want_write, deadline)) < 0)
			return r;
	}
}

/* The name lookup, on the loop's thread pool: it may wait seconds for a
 * resolver, and nothing on a loop may block.  getaddrinfo() cannot be
 * interrupted, so a cancel meanwhile takes effect once it returns. */
struct resolve {
	const char *host, *port;
	struct addrinfo *res;
};

static int64_t resolve_fn(void *arg)
{
	struct resolve *r = arg;

	return ioc__resolve_tcp(r->host, r->port, &r->res);
}

static int ioc_coroutine_fn connect_to(struct ioc__mig_src *s, const char *uri)
{
	char host[256], port[16];
	struct resolve rs = { host, port, NULL };
	int fd;

	if (ioc__mig_parse_uri(uri, host, sizeof(host), port, sizeof(port)) < 0)
		return fail(s, -EINVAL, "Invalid URI '%s' (tcp:HOST:PORT)", uri);
	fd = (int)ioc_pool_co_run(NULL, resolve_fn, &rs);
	if (fd == 0 && cancelled(s))
		fd = -ECANCELED;
	if (fd == 0)
		fd = ioc__connect_addrs(rs.res, CONNECT_TIMEOUT_MS, connect_wait, s);
	else if (fd != -ECANCELED)
		return fail(s, fd, "Cannot resolve '%s'", host);
	if (rs.res)
		freeaddrinfo(rs.res);
	if (fd == -ECANCELED)
		return fd;
	if (fd < 0)
		return fail(s, fd, "Failed to connect to '%s': %s", uri, strerror(-fd));
	int one = 1, buf = 4 << 20;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	pthread_mutex_lock(&s->m->lock);
	s->m->sock = fd;
	pthread_mutex_unlock(&s->m->lock);
	s->sock = fd;
	if (cancelled(s))
		return -ECANCELED;
	if (s->p.tls_creds[0]) {
		const char *name = s->p.tls_hostname[0] ? s->p.tls_hostname : host;
		char e[200] = "";
		int r;

		if (!s->m->host.tls)
			return fail(s, -EINVAL, "tls-creds is set but this server has no TLS "
				    "credentials (--tls-certificates or --tls-psk)");
		if (!s->m->host.tls->nonblock || !s->m->host.tls->handshake)
			return fail(s, -ENOTSUP, "This server's TLS sessions cannot run "
				    "non-blocking");
		r = s->m->host.tls->connect(s->m->host.opaque, fd, name, true, &s->tls, e,
					    sizeof(e));
		if (r == 0)
			r = tls_handshake(s, e, sizeof(e));
		if (r < 0)
			return cancelled(s) ? -ECANCELED :
			       fail(s, r, "TLS handshake with the destination failed: %s", e);
	}
	return 0;
}

/* ---- the link, for a hand-over that runs on the engine (handover.c) ---- */

int ioc_coroutine_fn ioc__mig_src_connect(struct ioc__mig_src *s, const char *uri)
{
	return connect_to(s, uri);
}

int ioc_coroutine_fn ioc__mig_src_send(struct ioc__mig_src *s, const void *buf, size_t len)
{
	struct iovec iov = { (void *)buf, len };

	return send_all(s, &iov, 1);
}

int ioc_coroutine_fn ioc__mig_src_recv(struct ioc__mig_src *s, void *buf, size_t len,
				       int64_t deadline, const char *what)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n;
		int ret;

		if (s->tls) {
			n = s->m->host.tls->recv(s->tls, (uint8_t *)buf + got, len - got);
		} else {
			n = recv(s->sock, (uint8_t *)buf + got, len - got, MSG_DONTWAIT);
			if (n < 0)
				n = errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		if (n == -EINTR)
			continue;
		if (n > 0) {
			got += (size_t)n;
			continue;
		}
		if (cancelled(s))
			return -ECANCELED;
		if (n != -EAGAIN)
			return fail(s, n < 0 ? (int)n : -EPIPE, "The destination closed the "
				    "stream before %s", what);
		if (ioc_now_ns() >= deadline)
			return -ETIMEDOUT;
		if ((ret = wait_sock(s, true, deadline)) < 0)
			return ret;
	}
	return 0;
}

void ioc_coroutine_fn ioc__mig_src_wait(struct ioc__mig_src *s)
{
	engine_wait(s, INT64_MAX);
}

int ioc__mig_src_fail(struct ioc__mig_src *s, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err = vfail(s, err, fmt, ap);
	va_end(ap);
	return err;
}

void ioc__mig_engine_kick(struct ioc__mig *m)
{
	engine_kick(m);
}

/*
 * Wait until the stream's send queue (bytes not yet acknowledged by the
 * destination, SIOCOUTQ) is down to SENT_SLACK, looking every
 * QUEUE_LOOK_NS on a loop timer (the answer reader runs meanwhile); a
 * cancel or a dead link ends it, and so does a queue that does not move
 * for ACK_TIMEOUT_MS (the switch-over then goes ahead and the ACK wait
 * reports the link).  Mirrored writes wait meanwhile (their records would
 * fill the queue again): the hold that follows answers them.
 */
static int ioc_coroutine_fn wait_sent(struct ioc__mig_src *s)
{
	int64_t deadline = ioc__mig_now_ms() + ACK_TIMEOUT_MS;
	int last = -1;

	for (;;) {
		int ret = queue_above(s, SENT_SLACK, &last, &deadline);

		if (ret <= 0)
			return ret;
		engine_wait(s, ioc_now_ns() + QUEUE_LOOK_NS);
	}
}

/*
 * Before the hold, while mirroring: a MIRROR record of the first block (a
 * fence) and a wait for its MACK, serving mirrored writes meanwhile.  The
 * send queue being empty (wait_sent()) says the destination's kernel has
 * the records, not that they were applied: its socket buffer held
 * megabytes of them, and after a dirty pass of scattered 4 KiB blocks
 * applying those took 7-27 ms of downtime (bench/migrate/NOTES.md).  A
 * MIRROR is applied after every earlier record on its blocks, and raw
 * records are applied by the destination's reader in order, so its MACK
 * says the backlog is gone (with compression, up to the workers' queue).
 * The block goes by the usual rule (cleared, read, sent), so sending it
 * again is harmless.  The wait sleeps until a MACK (the reader kicks
 * while want_mack), a mirrored write (served) or a cancel kicks.  An
 * answer reader that ended (failure) or ACK_TIMEOUT_MS without the MACK
 * ends it; the next steps then report the link.
 */
static int ioc_coroutine_fn fence(struct ioc__mig_src *s)
{
	struct ioc__mig *m = s->m;
	int64_t deadline = ioc_now_ns() + (int64_t)ACK_TIMEOUT_MS * 1000000;
	uint64_t seq;
	int ret;

	if (!s->active || !s->size)
		return 0;
	pthread_mutex_lock(&m->mir_lock);
	m->mir_bound = s->mir_next + 1;
	pthread_mutex_unlock(&m->mir_lock);
	ret = copy_chunk(s, 0, (uint32_t)(s->size < s->block ? s->size : s->block), true);
	if (ret == 0)
		ret = drain(s);
	if (ret < 0)
		return ret;
	seq = ++s->mir_next;
	s->want_mack = true;
	for (;;) {
		bool done;

		pthread_mutex_lock(&m->mir_lock);
		done = m->mir_acked >= seq || m->ans_done;
		pthread_mutex_unlock(&m->mir_lock);
		if (done || ioc_now_ns() >= deadline)
			break;
		if (cancelled(s)) {
			ret = -ECANCELED;
			break;
		}
		ret = serve_and_wait(s, deadline);
		if (ret < 0)
			break;
	}
	s->want_mack = false;
	return ret;
}

/* Wait for the destination's ACK (not cancellable: END is out), read by
 * ack_reader(), which kicks when it ends; the timeout is the timer. */
static int ioc_coroutine_fn wait_ack(struct ioc__mig_src *s, uint32_t sum)
{
	struct ioc__mig *m = s->m;
	int64_t deadline = ioc_now_ns() + (int64_t)ACK_TIMEOUT_MS * 1000000;
	int ret = 0;

	for (;;) {
		bool done;

		pthread_mutex_lock(&m->mir_lock);
		done = m->ans_done;
		pthread_mutex_unlock(&m->mir_lock);
		if (done || ioc_now_ns() >= deadline)
			break;
		engine_wait(s, deadline);
	}
	pthread_mutex_lock(&m->mir_lock);
	if (!m->ans_done)
		ret = fail(s, -ETIMEDOUT, "No answer from the destination");
	else if (m->ans_ret < 0)
		ret = fail(s, m->ans_ret, "%s: %s", m->ans_why, strerror(-m->ans_ret));
	else if (m->ans_off != 0)
		ret = fail(s, -(int)(m->ans_off > 4095 ? EPROTO : m->ans_off),
			   "The destination failed: %s",
			   strerror((int)(m->ans_off > 4095 ? EPROTO : m->ans_off)));
	else if (m->ans_crc != sum)
		ret = fail(s, -EBADMSG, "Image checksum mismatch (source %08x, "
			   "destination %08x)", sum, m->ans_crc);
	pthread_mutex_unlock(&m->mir_lock);
	return ret;
}

static int ioc_coroutine_fn run(struct ioc__mig_src *s, const char *uri)
{
	struct ioc__mig *m = s->m;
	struct ioc_wq_opts wo = {
		.workers = s->p.compress_threads ? s->p.compress_threads : 1,
		.ring_size = 4,
		/* Chunks of 256 KiB are a millisecond of zstd each: batching
		 * gains nothing, and with two slots per worker filling one
		 * ring first would leave the others idle. */
		.policy = IOC_WQ_ROUND_ROBIN,
		.in_order = true,
		.name = "ioc-mig-z",
		/* Handed back by a bottom half on this loop (slot_done()). */
		.loop = s->loop,
		.done = slot_done,
		.done_opaque = s,
	};
	struct ioc_mig_hdr h = { .version = IOC_MIG_VERSION, .image_size = s->size,
				 .block_size = s->block };
	uint8_t hb[IOC_MIG_HDR_SIZE];
	struct iovec iov = { hb, sizeof(hb) };
	int level = s->p.compress ? (int)s->p.compress_level : 0;
	uint32_t sum;
	uint64_t missing;
	int ret;

	ret = ioc_mig_crcs_new(&s->crcs, s->size, s->block);
	if (ret < 0)
		return fail(s, ret, "Cannot track %llu blocks: %s",
			    (unsigned long long)(s->size / s->block), strerror(-ret));
	ret = ioc_wq_new(&s->wq, &wo);
	if (ret < 0)
		return fail(s, ret, "Cannot start the compression threads: %s", strerror(-ret));
	s->raw = level <= 0;
	s->nslots = 2 * wo.workers;
	s->slots = calloc(s->nslots, sizeof(*s->slots));
	if (!s->slots)
		return fail(s, -ENOMEM, "out of memory");
	for (unsigned i = 0; i < s->nslots; i++) {
		struct slot *sl = &s->slots[i];

		sl->s = s;
		sl->job.fn = slot_job;
		sl->level = level;
		sl->zero_detect = s->p.zero_blocks;
		sl->buf = malloc(CHUNK_MAX);
		if (level > 0) {
			sl->out_cap = ZSTD_compressBound(CHUNK_MAX);
			sl->out = malloc(sl->out_cap);
			sl->cctx = ZSTD_createCCtx();
		}
		if (!sl->buf || (level > 0 && (!sl->out || !sl->cctx)))
			return fail(s, -ENOMEM, "out of memory");
		slot_put(s, sl);
	}
	ret = connect_to(s, uri);
	if (ret < 0)
		return ret;
	ioc_mig_hdr_encode(&h, hb);
	ret = send_all(s, &iov, 1);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->mir_lock);
	m->ans_done = false;
	m->ans_ret = 0;
	m->mir_acked = m->mir_bound = 0;
	m->mir_wait = m->mir_sent = NULL;
	m->mir_wait_tail = &m->mir_wait;
	m->mir_sent_tail = &m->mir_sent;
	pthread_mutex_unlock(&m->mir_lock);
	s->reader = ioc_co_create(ack_reader, s);
	if (!s->reader)
		return fail(s, -ENOMEM, "Cannot start the answer reader: %s", strerror(ENOMEM));
	s->reader_running = true;
	/* From inside this coroutine: it starts once the engine yields. */
	ioc_co_wake(s->reader);
	pthread_mutex_lock(&m->lock);
	m->st.transferred += sizeof(hb);
	m->t_setup = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	pthread_mutex_unlock(&m->lock);

	s->win_start = s->pass_start = ioc_now_ns();
	/* Relaxed, these three: mirror_start()'s release store (or the one
	 * below) publishes them. */
	atomic_store_explicit(&m->mir_cursor, 0, memory_order_relaxed);
	atomic_store_explicit(&m->adm_gap, 0, memory_order_relaxed);
	atomic_store_explicit(&m->adm_next, 0, memory_order_relaxed);
	if (s->p.active_mirror == IOC_MIG_MIRROR_ON)
		mirror_start(s);
	else if (s->p.write_admission)
		/* Release: pairs with the notifier's acquire load; it admits
		 * writes, and mirrors none until mirror_start() opens
		 * mir_open. */
		atomic_store_explicit(&m->hook, true, memory_order_release);
	ret = pass_full(s);
	if (ret < 0)
		return ret;
	/* Release: pairs with the notifier's acquire load; every write is
	 * mirrored from now on (while active). */
	atomic_store_explicit(&m->mir_cursor, UINT64_MAX, memory_order_release);
	pass_end(s);
	/* Dirty passes until what remains fits in downtime-limit. */
	for (;;) {
		uint64_t left = dirty_bytes(s);
		int64_t pass_ns = ioc_now_ns();
		double expect_ms = s->bw ? (double)left * 1000.0 / (double)s->bw : 1e9;

		/* Mirroring (auto or on): not before a dirty pass that ran
		 * with mirroring from its start, whatever the estimate, if
		 * anything is dirty.  A dirty set is scattered blocks, which
		 * the estimate from pass 1's sequential rate undercounts: the
		 * 5-15 MB written behind pass 1 before auto started mirroring
		 * held the clients 22-65 ms against a 20 ms downtime-limit
		 * (bench/migrate/NOTES.md).  After such a pass only the
		 * writes in flight at its end are left. */
		if (left == 0 || (expect_ms <= (double)s->p.downtime_limit &&
				  (s->mirrored_pass ||
				   s->p.active_mirror == IOC_MIG_MIRROR_OFF)))
			break;
		if (cancelled(s))
			return -ECANCELED;
		/* auto: a dirty pass is needed, so writes are mirrored from
		 * now on (see the top for why not later). */
		if (!s->active && s->p.active_mirror == IOC_MIG_MIRROR_AUTO)
			mirror_start(s);
		s->mirrored_pass = s->active;
		ret = pass_dirty(s);
		if (ret < 0)
			return ret;
		pass_end(s);
		pass_ns = ioc_now_ns() - pass_ns;
		pthread_mutex_lock(&m->lock);
		m->st.dirty_rate = pass_ns > 0 ? (uint64_t)((double)dirty_bytes(s) / s->block *
							   1e9 / (double)pass_ns) : 0;
		pthread_mutex_unlock(&m->lock);
	}

	/* What the last pass left in the socket's send queue would be sent
	 * after the hold and count as downtime (a few MB are tens of ms on a
	 * 1 Gbit/s link): let it go out first, and be applied (fence()). */
	ret = fence(s);
	if (ret == 0)
		ret = wait_sent(s);
	if (ret < 0)
		return ret;

	/* Switch-over: hold the clients, wait for the running requests.  A
	 * mirrored write waits inside the node for this thread, which the
	 * hold blocks: answer the waiting ones first and take no more (their
	 * blocks are dirty: the last pass sends them). */
	int64_t t_hold = ioc_now_ns();
	mirror_close(m);
	gate_all(m, IOC_NODE_GATE_HOLD);
	s->held = true;
	if (s->p.pause_before_switchover) {
		bool go = false, gone = false;

		set_status(m, IOC_MIG_ST_PRE_SWITCHOVER);
		/* Kicked by migrate-continue, migrate_cancel or the answer
		 * reader's end, each after setting cont, cancel or dest_gone. */
		while (!go && !cancelled(s)) {
			pthread_mutex_lock(&m->lock);
			go = m->cont || m->dest_gone;
			gone = m->dest_gone;
			pthread_mutex_unlock(&m->lock);
			if (!go)
				engine_wait(s, INT64_MAX);
		}
		if (cancelled(s))
			return -ECANCELED;
		if (gone) {
			/* Nothing may come from the destination before END: its
			 * end here is a lost link, whatever it said. */
			pthread_mutex_lock(&m->mir_lock);
			int err = m->ans_ret < 0 ? m->ans_ret : -EPROTO;
			char why[sizeof(m->ans_why)];

			snprintf(why, sizeof(why), "%s", m->ans_ret < 0 ? m->ans_why :
				 "The destination answered before the end of the stream");
			pthread_mutex_unlock(&m->mir_lock);
			return fail(s, err, "%s: %s", why, strerror(-err));
		}
	}
	set_status(m, IOC_MIG_ST_DEVICE);
	ret = pass_dirty(s);
	if (ret < 0)
		return ret;
	pass_end(s);
	ret = ioc_mig_crcs_checksum(s->crcs, &sum, &missing);
	if (ret < 0)
		return fail(s, -EIO, "Internal error: block %llu was never sent",
			    (unsigned long long)missing);
	{
		struct ioc_mig_rec end = { .type = IOC_MIG_END, .offset = s->size,
					   .data_crc = sum };

		pthread_mutex_lock(&m->lock);
		if (cancelled(s)) {
			pthread_mutex_unlock(&m->lock);
			return -ECANCELED;
		}
		m->end_sent = true; /* from here a cancel no longer applies */
		pthread_mutex_unlock(&m->lock);
		ret = send_rec(s, &end, NULL);
		if (ret < 0)
			return ret;
	}
	ret = wait_ack(s, sum);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	m->downtime_ns = ioc_now_ns() - t_hold;
	pthread_mutex_unlock(&m->lock);
	return 0;
}

struct start_args {
	struct ioc__mig *m;
	struct ioc__mig_params p;
	char uri[256];
	uint64_t size;
};

/* The engine's last word (its loop's thread): the outcome, then
 * thread_done, broadcast for ioc__mig_free(), and mig_bh joins. */
static void engine_end(struct ioc__mig *m, int ret, const char *why)
{
	pthread_mutex_lock(&m->lock);
	if (m->sock >= 0) {
		close(m->sock);
		m->sock = -1;
	}
	m->result = ret;
	if (ret < 0 && ret != -ECANCELED)
		snprintf(m->error, sizeof(m->error), "%s", why[0] ? why : strerror(-ret));
	m->thread_done = true;
	pthread_cond_broadcast(&m->cond);
	ioc_bh_schedule(m->bh);
	pthread_mutex_unlock(&m->lock);
}

/* The engine: a coroutine on its own I/O thread's loop. */
static void ioc_coroutine_fn source_co(void *opaque)
{
	struct start_args *a = opaque;
	struct ioc__mig *m = a->m;
	struct ioc__mig_src s = { .m = m, .p = a->p, .node = m->node, .sock = -1, .size = a->size,
			 .block = (uint32_t)a->p.granularity, .bm = m->bm };
	int ret;

	m->eng_co = ioc_co_self();
	s.loop = ioc_loop_current();
	s.done_tail = &s.done;
	ioc_timer_init(&s.timer, s.loop, engine_timer, &s);
	ret = m->handover ? ioc__mig_handover_run(&s, m, &a->p, a->uri, a->size)
			  : run(&s, a->uri);
	mirror_stop(&s);
	if (s.reader_running) {
		pthread_mutex_lock(&m->mir_lock);
		if (!m->ans_done)
			shutdown(s.sock, SHUT_RDWR); /* ends its read */
		pthread_mutex_unlock(&m->mir_lock);
		while (s.reader_running) /* its end kicks */
			engine_wait(&s, INT64_MAX);
	}
	if (s.wq) {
		snapshot_workers(&s);
		ioc_wq_free(s.wq);
	}
	for (unsigned i = 0; s.slots && i < s.nslots; i++) {
		free(s.slots[i].buf);
		free(s.slots[i].out);
		ZSTD_freeCCtx(s.slots[i].cctx);
	}
	free(s.slots);
	ioc_mig_crcs_free(s.crcs);
	if (s.tls) {
		/* The closing alert waits like the handshake did. */
		if (ret == 0)
			fcntl(s.sock, F_SETFL, fcntl(s.sock, F_GETFL) & ~O_NONBLOCK);
		m->host.tls->end(s.tls, ret == 0);
	}
	/* The reads attached this loop to the node's graph (its slot, the
	 * drivers' state on it): this loop stops with the engine.  A
	 * hand-over reads nothing. */
	if (!m->handover)
		ioc_node_loop_exit(s.node);
	if (ret < 0 && cancelled(&s))
		ret = -ECANCELED;
	free(a);
	engine_end(m, ret, s.why);
}

/* The engine's loop, first: the engine starts (and runs until it first
 * waits). */
static void engine_enter(void *opaque)
{
	struct start_args *a = opaque;
	struct ioc_co *co = ioc_co_create(source_co, a);

	if (!co) {
		struct ioc__mig *m = a->m;

		free(a);
		engine_end(m, -ENOMEM, "Cannot start the migration: out of memory");
		return;
	}
	ioc_co_enter(co);
}

/* Main loop: the engine's I/O thread, and the engine on it (with p, a
 * copy of the job's parameters).  Without adaptive polling: it waits for
 * the link and for kicks, and shares the cores with the workers and the
 * front end. */
int ioc__mig_engine_start(struct ioc__mig *m, const struct ioc__mig_params *p,
			  const char *uri, uint64_t size)
{
	struct ioc_iothread_opts o = {
		.name = "ioc-mig", .cpu = -1, .loop = { .poll_max_ns = -1 },
	};
	struct start_args *a = calloc(1, sizeof(*a));
	int r;

	if (!a)
		return -ENOMEM;
	a->m = m;
	a->p = *p;
	a->size = size;
	snprintf(a->uri, sizeof(a->uri), "%s", uri);
	r = ioc_iothread_start(&m->eng, &o);
	if (r < 0) {
		free(a);
		return r;
	}
	m->eng_loop = ioc_iothread_loop(m->eng);
	/* Relaxed: the oneshot's post publishes it to the engine, and no
	 * kicker reads it before the engine's first sleep. */
	atomic_store_explicit(&m->eng_state, ENG_RUNNING, memory_order_relaxed);
	r = ioc_loop_oneshot(m->eng_loop, engine_enter, a);
	if (r < 0) {
		free(a);
		ioc_iothread_stop(m->eng);
		m->eng = NULL;
		m->eng_loop = NULL;
	}
	return r;
}

/* The gate of every node that writes the migrated image as it is: the
 * exported node, and the file node under it when the export's node
 * passes requests to it unchanged (another front end may export that).
 * Not from a loop that submits to them. */
static void gate_all(struct ioc__mig *m, int state)
{
	struct ioc_blk *img = ioc_node_blk(m->node);

	for (struct ioc_node *n = m->node; n;
	     n = img && n->file && ioc_node_blk(n->file) == img ? n->file : NULL)
		ioc_node_set_gate(n, state);
}

/* Main loop, after the thread was joined: the end of a migration. */
static void source_finish(struct ioc__mig *m)
{
	int result;

	if (m->handover) {
		ioc__mig_handover_finish(m);
		return;
	}
	pthread_mutex_lock(&m->lock);
	result = m->result;
	pthread_mutex_unlock(&m->lock);
	if (result == 0) {
		/* The destination has the image: NBD_ESHUTDOWN to held and
		 * new requests, connections finish and close, no listener. */
		gate_all(m, IOC_NODE_GATE_SHUT);
		m->host.retire(m->host.opaque);
		ioc__mig_log(m, "migration completed: no longer serving");
	} else if (m->node && atomic_load_explicit(&m->node->gate, memory_order_relaxed) !=
		   IOC_NODE_GATE_OPEN) {
		gate_all(m, IOC_NODE_GATE_OPEN);
	}
	/* After the gate: a failed migration's hold is open again, which
	 * the removal's own drain needs. */
	if (m->nt_added)
		ioc_node_remove_notifier(m->node, &m->nt);
	m->nt_added = false;
	if (m->blk)
		ioc_blk_dirty_remove(m->blk, IOC_MIG_BITMAP);
	m->bm = NULL;
	ioc__mig_job_end(m, result);
}

void ioc__mig_job_end(struct ioc__mig *m, int result)
{
	pthread_mutex_lock(&m->lock);
	m->t_end = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, ioc__mig_end_status(m->status, result));
	pthread_mutex_unlock(&m->lock);
	if (result < 0 && result != -ECANCELED)
		ioc__mig_log(m, "migration failed: %s", m->error);
}

/* ---- QMP ------------------------------------------------------------------------ */

const struct ioc__qmp_arg ioc__mig_args_caps[] = {
	{ "capabilities", IOC_QMP_ARRAY, false, .elem = IOC_QMP_ANY }, { NULL },
};
const struct ioc__qmp_arg ioc__mig_args_params[] = {
	{ "compress-level", IOC_QMP_UINT, true },
	{ "compress-threads", IOC_QMP_UINT, true },
	{ "compress-wait-thread", IOC_QMP_BOOL, true },
	{ "decompress-threads", IOC_QMP_UINT, true },
	{ "max-bandwidth", IOC_QMP_UINT, true },
	{ "downtime-limit", IOC_QMP_UINT, true },
	{ "__org.iocore_granularity", IOC_QMP_UINT, true },
	{ "__org.iocore_active-mirror", IOC_QMP_STR, true },
	{ "__org.iocore_write-admission", IOC_QMP_UINT, true },
	{ "__org.iocore_handover-timeout", IOC_QMP_UINT, true },
	{ "tls-creds", IOC_QMP_STR, true },
	{ "tls-hostname", IOC_QMP_STR, true },
	{ "throttle-trigger-threshold", IOC_QMP_UINT, true },
	{ "cpu-throttle-initial", IOC_QMP_UINT, true },
	{ "cpu-throttle-increment", IOC_QMP_UINT, true },
	{ "cpu-throttle-tailslow", IOC_QMP_BOOL, true },
	{ "max-cpu-throttle", IOC_QMP_UINT, true },
	{ NULL },
};
const struct ioc__qmp_arg ioc__mig_args_migrate[] = {
	{ "uri", IOC_QMP_STR, false }, { "blk", IOC_QMP_BOOL, true },
	{ "inc", IOC_QMP_BOOL, true }, { "detach", IOC_QMP_BOOL, true },
	{ "resume", IOC_QMP_BOOL, true }, { NULL },
};
const struct ioc__qmp_arg ioc__mig_args_continue[] = {
	{ "state", IOC_QMP_STR, false }, { NULL },
};
const struct ioc__qmp_arg ioc__mig_args_incoming[] = {
	{ "uri", IOC_QMP_STR, false }, { NULL },
};



static bool busy(struct ioc__mig *m)
{
	int st;

	pthread_mutex_lock(&m->lock);
	st = m->status;
	pthread_mutex_unlock(&m->lock);
	return m->thread_running || m->ho_co || st == IOC_MIG_ST_SETUP ||
	       st == IOC_MIG_ST_ACTIVE || st == IOC_MIG_ST_PRE_SWITCHOVER ||
	       st == IOC_MIG_ST_DEVICE || st == IOC_MIG_ST_CANCELLING;
}

static const struct { const char *name; size_t off; } caps[] = {
	{ "zero-blocks", offsetof(struct ioc__mig_params, zero_blocks) },
	{ "compress", offsetof(struct ioc__mig_params, compress) },
	{ "events", offsetof(struct ioc__mig_params, events) },
	{ "pause-before-switchover", offsetof(struct ioc__mig_params, pause_before_switchover) },
	{ "auto-converge", offsetof(struct ioc__mig_params, auto_converge) },
	{ "__org.iocore_handover", offsetof(struct ioc__mig_params, handover) },
};

/* The capabilities and parameters a command checked, in force from now. */
static json_t *commit_params(struct ioc__mig *m, const struct ioc__mig_params *p)
{
	pthread_mutex_lock(&m->lock);
	m->p = *p;
	pthread_mutex_unlock(&m->lock);
	return json_object();
}

json_t *ioc__mig_set_caps(struct ioc__mig *m, json_t *args,
			      struct ioc__qmp_err *err)
{
	json_t *list = json_object_get(args, "capabilities"), *v;
	struct ioc__mig_params p;
	size_t i;

	if (busy(m)) {
		ioc__qmp_errf(err, "There's a migration process in progress");
		return NULL;
	}
	p = m->p;
	json_array_foreach(list, i, v) {
		const char *name = json_string_value(json_object_get(v, "capability"));
		json_t *state = json_object_get(v, "state");
		size_t k;

		if (!json_is_object(v) || !name || !json_is_boolean(state) ||
		    json_object_size(v) != 2) {
			ioc__qmp_errf(err, "Parameter 'capabilities[%zu]' expects "
			     "{\"capability\": str, \"state\": bool}", i);
			return NULL;
		}
		for (k = 0; k < IOC_ARRAY_SIZE(caps); k++)
			if (strcmp(caps[k].name, name) == 0)
				break;
		if (k == IOC_ARRAY_SIZE(caps)) {
			ioc__qmp_errf(err, "Parameter 'capability' does not accept value '%s'", name);
			return NULL;
		}
		*(bool *)((char *)&p + caps[k].off) = json_is_true(state);
	}
	return commit_params(m, &p);
}

json_t *ioc__mig_query_caps(struct ioc__mig *m, json_t *args,
				struct ioc__qmp_err *err)
{
	json_t *list;

	list = json_array();
	for (size_t k = 0; k < IOC_ARRAY_SIZE(caps) && list; k++)
		json_array_append_new(list, json_pack("{s:s,s:b}", "capability", caps[k].name,
			"state", *(bool *)((char *)&m->p + caps[k].off)));
	return list;
}

/* A string parameter (null: empty, as QEMU's StrOrNull) into buf, zero
 * filled; false with err set when it is not a string or too long. */
static bool str_param(struct ioc__qmp_err *err, const char *name, json_t *v,
		      char *buf, size_t len)
{
	const char *str = json_is_null(v) ? "" : json_string_value(v);

	if (!str) {
		ioc__qmp_errf(err, "Parameter '%s' expects a string", name);
		return false;
	}
	if (strlen(str) >= len) {
		ioc__qmp_errf(err, "Parameter '%s' is longer than %zu bytes", name, len - 1);
		return false;
	}
	memset(buf, 0, len);
	memcpy(buf, str, strlen(str));
	return true;
}

/* A percentage parameter, 1 to max (QEMU's ranges and wording). */
static bool pct_param(struct ioc__qmp_err *err, const char *name, json_t *v,
		      unsigned max, unsigned *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    json_integer_value(v) > (json_int_t)max) {
		ioc__qmp_errf(err, "Parameter '%s' expects an integer in the range of 1 to %u",
		     name, max);
		return false;
	}
	*out = (unsigned)json_integer_value(v);
	return true;
}

json_t *ioc__mig_set_params(struct ioc__mig *m, json_t *args,
				struct ioc__qmp_err *err)
{
	struct ioc__mig_params p;
	json_t *v;

	p = m->p;
#define U(key) ((v = json_object_get(args, key)) != NULL)
	if (U("compress-level")) {
		if (json_integer_value(v) > 9) {
			ioc__qmp_errf(err, "Parameter 'compress_level' expects a value between 0 and 9");
			return NULL;
		}
		p.compress_level = (unsigned)json_integer_value(v);
	}
	if (U("compress-threads")) {
		if (json_integer_value(v) < 1 || json_integer_value(v) > 255) {
			ioc__qmp_errf(err, "Parameter 'compress_threads' expects a value between 1 and 255");
			return NULL;
		}
		p.compress_threads = (unsigned)json_integer_value(v);
	}
	if (U("decompress-threads")) {
		if (json_integer_value(v) < 1 || json_integer_value(v) > 255) {
			ioc__qmp_errf(err, "Parameter 'decompress_threads' expects a value between 1 and 255");
			return NULL;
		}
		p.decompress_threads = (unsigned)json_integer_value(v);
	}
	if (U("compress-wait-thread"))
		p.compress_wait_thread = json_is_true(v);
	if (U("throttle-trigger-threshold") &&
	    !pct_param(err, "throttle_trigger_threshold", v, 100, &p.throttle_trigger_threshold))
		return NULL;
	if (U("cpu-throttle-initial") &&
	    !pct_param(err, "cpu_throttle_initial", v, 99, &p.cpu_throttle_initial))
		return NULL;
	if (U("cpu-throttle-increment") &&
	    !pct_param(err, "cpu_throttle_increment", v, 99, &p.cpu_throttle_increment))
		return NULL;
	if (U("max-cpu-throttle") &&
	    !pct_param(err, "max_cpu_throttle", v, 99, &p.max_cpu_throttle))
		return NULL;
	if (U("cpu-throttle-tailslow")) {
		if (!json_is_boolean(v)) {
			ioc__qmp_errf(err, "Parameter 'cpu-throttle-tailslow' expects a boolean");
			return NULL;
		}
		p.cpu_throttle_tailslow = json_is_true(v);
	}
	if (U("max-bandwidth"))
		p.max_bandwidth = (uint64_t)json_integer_value(v);
	if (U("downtime-limit")) {
		if (json_integer_value(v) > 2000000) {
			ioc__qmp_errf(err, "Parameter 'downtime_limit' expects a value between 0 and 2000000");
			return NULL;
		}
		p.downtime_limit = (uint64_t)json_integer_value(v);
	}
	if (U("__org.iocore_granularity")) {
		uint64_t g = (uint64_t)json_integer_value(v);

		if (g < IOC_MIG_MIN_BLOCK || g > MIG_GRAN_MAX || (g & (g - 1))) {
			ioc__qmp_errf(err, "Parameter '__org.iocore_granularity' expects a power of 2 "
			     "between %u and %u", IOC_MIG_MIN_BLOCK, MIG_GRAN_MAX);
			return NULL;
		}
		p.granularity = g;
	}
	if (U("__org.iocore_active-mirror")) {
		const char *am = json_string_value(v);

		if (am && strcmp(am, "auto") == 0)
			p.active_mirror = IOC_MIG_MIRROR_AUTO;
		else if (am && strcmp(am, "on") == 0)
			p.active_mirror = IOC_MIG_MIRROR_ON;
		else if (am && strcmp(am, "off") == 0)
			p.active_mirror = IOC_MIG_MIRROR_OFF;
		else {
			ioc__qmp_errf(err, "Parameter '__org.iocore_active-mirror' expects "
			     "'auto', 'on' or 'off'");
			return NULL;
		}
	}
	if (U("__org.iocore_write-admission")) {
		if (json_integer_value(v) > 1000000) {
			ioc__qmp_errf(err, "Parameter '__org.iocore_write-admission' expects a value "
			     "between 0 and 1000000");
			return NULL;
		}
		p.write_admission = (unsigned)json_integer_value(v);
	}
	if (U("__org.iocore_handover-timeout")) {
		if (json_integer_value(v) < 100 || json_integer_value(v) > 3600000) {
			ioc__qmp_errf(err, "Parameter '__org.iocore_handover-timeout' expects a value "
			     "between 100 and 3600000");
			return NULL;
		}
		p.handover_timeout = (unsigned)json_integer_value(v);
	}
	if (U("tls-creds") && !str_param(err, "tls-creds", v, p.tls_creds, sizeof(p.tls_creds)))
		return NULL;
	if (U("tls-hostname") &&
	    !str_param(err, "tls-hostname", v, p.tls_hostname, sizeof(p.tls_hostname)))
		return NULL;
#undef U
	/* QEMU applies max-bandwidth to a running migration; the others are
	 * taken at its start. */
	if (busy(m) && memcmp(&p, &m->p, sizeof(p)) != 0) {
		struct ioc__mig_params q = m->p;

		q.max_bandwidth = p.max_bandwidth;
		if (memcmp(&p, &q, sizeof(p)) != 0) {
			ioc__qmp_errf(err, "There's a migration process in progress");
			return NULL;
		}
	}
	return commit_params(m, &p);
}

json_t *ioc__mig_query_params(struct ioc__mig *m, json_t *args,
				  struct ioc__qmp_err *err)
{
	static const char *const am[] = {
		[IOC_MIG_MIRROR_AUTO] = "auto", [IOC_MIG_MIRROR_ON] = "on",
		[IOC_MIG_MIRROR_OFF] = "off",
	};

	return json_pack("{s:i,s:i,s:b,s:i,s:I,s:I,s:I,s:s,s:i,s:i,s:s,s:s,s:i,s:i,s:i,s:b,s:i}",
			 "compress-level", (int)m->p.compress_level,
			 "compress-threads", (int)m->p.compress_threads,
			 "compress-wait-thread", m->p.compress_wait_thread,
			 "decompress-threads", (int)m->p.decompress_threads,
			 "max-bandwidth", (json_int_t)m->p.max_bandwidth,
			 "downtime-limit", (json_int_t)m->p.downtime_limit,
			 "__org.iocore_granularity", (json_int_t)m->p.granularity,
			 "__org.iocore_active-mirror", am[m->p.active_mirror],
			 "__org.iocore_write-admission", (int)m->p.write_admission,
			 "__org.iocore_handover-timeout", (int)m->p.handover_timeout,
			 "tls-creds", m->p.tls_creds, "tls-hostname", m->p.tls_hostname,
			 "throttle-trigger-threshold", (int)m->p.throttle_trigger_threshold,
			 "cpu-throttle-initial", (int)m->p.cpu_throttle_initial,
			 "cpu-throttle-increment", (int)m->p.cpu_throttle_increment,
			 "cpu-throttle-tailslow", m->p.cpu_throttle_tailslow,
			 "max-cpu-throttle", (int)m->p.max_cpu_throttle);
}

json_t *ioc__mig_migrate(struct ioc__mig *m, json_t *args,
			     struct ioc__qmp_err *err)
{
	const char *uri = json_string_value(json_object_get(args, "uri"));
	struct ioc_node *n;
	struct ioc_blk *blk;
	uint64_t size;
	struct ioc__mig_params p;
	char host[256], port[16];
	uint64_t gran;
	int r;

	if (json_object_get(args, "blk") || json_object_get(args, "inc")) {
		if (json_is_true(json_object_get(args, "blk")) ||
		    json_is_true(json_object_get(args, "inc"))) {
			ioc__qmp_errf(err, "Parameter 'blk' is not supported: the export is always migrated");
			return NULL;
		}
	}
	if (json_is_true(json_object_get(args, "resume"))) {
		ioc__qmp_errf(err, "Parameter 'resume' is not supported: there is no postcopy");
		return NULL;
	}
	/* A destination that took its image serves it, and may send it on. */
	if (m->incoming && !busy(m) && m->listen_fd < 0 && m->host.serving(m->host.opaque)) {
		pthread_mutex_lock(&m->lock);
		if (m->status == IOC_MIG_ST_COMPLETED)
			m->incoming = false;
		pthread_mutex_unlock(&m->lock);
	}
	if (busy(m) || m->incoming) {
		ioc__qmp_errf(err, m->incoming ? "Guest is waiting for an incoming migration" :
		     "There's a migration process in progress");
		return NULL;
	}
	if (!m->host.serving(m->host.opaque)) {
		ioc__qmp_errf(err, "The server does not serve an export (migrated already?)");
		return NULL;
	}
	if (ioc__mig_parse_uri(uri, host, sizeof(host), port, sizeof(port)) < 0) {
		ioc__qmp_errf(err, "Invalid migration URI '%s' (iocore-nbd supports tcp:HOST:PORT)", uri);
		return NULL;
	}
	n = m->host.pick(m->host.opaque, err->desc, sizeof(err->desc));
	if (!n)
		return NULL;
	/* Shared storage, or the capability: nothing to copy (handover.c). */
	if (m->p.handover || ioc_node_shared_id(n))
		return ioc__mig_handover_start(m, n, uri, err);
	m->handover = false;
	/* The copy reads through the node; the bitmap lives where the node's
	 * bitmaps do (its image's, or its driver's set). */
	blk = ioc_node_dirty_blk(n);
	size = n->size;
	if (!blk || !size) {
		ioc__qmp_errf(err, "The export's node cannot be migrated (%s)",
			      size ? "its driver cannot track writes" : "empty");
		return NULL;
	}
	gran = m->p.granularity;
	/* Keep the per-block CRC array bounded (stream.h). */
	while (size / gran >= IOC_MIG_MAX_BLOCKS && gran < MIG_GRAN_MAX)
		gran *= 2;
	/* A persistent bitmap of that name can only be stale. */
	ioc_blk_dirty_remove(blk, IOC_MIG_BITMAP);
	/* The copy needs the CPU and the image's pages now (blk.h). */
	if (ioc_node_blk(n))
		ioc_blk_stop_background(ioc_node_blk(n));
	struct ioc_blk_dirty_opts bo = { .name = IOC_MIG_BITMAP, .granularity = gran };
	r = ioc_blk_dirty_add(blk, &bo, &m->bm);
	if (r < 0) {
		ioc__qmp_errf(err, "Cannot track writes for the migration: %s", strerror(-r));
		return NULL;
	}
	p = m->p;
	p.granularity = gran;
	m->node = n;
	m->blk = blk;
	ioc__mig_job_begin(m, uri, size, gran);
	/* Only when it has something to do: a node with a notifier takes no
	 * zero-copy writes (they bypass the notifiers). */
	m->nt.fn = mirror_notify;
	m->nt_added = p.active_mirror != IOC_MIG_MIRROR_OFF || p.write_admission;
	/* Relaxed: the release store in ioc_node_add_notifier() orders it. */
	atomic_store_explicit(&m->hook, false, memory_order_relaxed);
	if (m->nt_added)
		ioc_node_add_notifier(n, &m->nt);
	r = -ioc__mig_engine_start(m, &p, uri, size);
	if (r != 0) {
		if (m->nt_added)
			ioc_node_remove_notifier(n, &m->nt);
		m->nt_added = false;
		ioc_blk_dirty_remove(blk, IOC_MIG_BITMAP);
		m->bm = NULL;
		return ioc__mig_job_failed_start(m, r, err);
	}
	m->thread_running = true;
	return json_object();
}

void ioc__mig_job_begin(struct ioc__mig *m, const char *uri, uint64_t total,
			uint64_t page_size)
{
	pthread_mutex_lock(&m->lock);
	memset(&m->st, 0, sizeof(m->st));
	m->st.total = total;
	m->st.page_size = page_size;
	m->error[0] = '\0';
	m->t_start = ioc__mig_now_ms();
	m->t_setup = m->t_end = 0;
	m->downtime_ns = 0;
	m->cont = m->dest_gone = m->end_sent = m->thread_done = false;
	m->result = 0;
	/* relaxed: no job runs yet (its start orders it). */
	atomic_store_explicit(&m->cancel, false, memory_order_relaxed);
	snprintf(m->uri, sizeof(m->uri), "%s", uri);
	ioc__mig_begin_locked(m);
	pthread_mutex_unlock(&m->lock);
}

json_t *ioc__mig_job_failed_start(struct ioc__mig *m, int r, struct ioc__qmp_err *err)
{
	pthread_mutex_lock(&m->lock);
	snprintf(m->error, sizeof(m->error), "Cannot start the migration thread: %s",
		 strerror(r));
	ioc__mig_set_status_locked(m, IOC_MIG_ST_FAILED);
	pthread_mutex_unlock(&m->lock);
	ioc__qmp_errf(err, "Cannot start the migration thread: %s", strerror(r));
	return NULL;
}

json_t *ioc__mig_query(struct ioc__mig *m, json_t *args,
			   struct ioc__qmp_err *err)
{
	struct ioc__mig_stats st;
	json_t *ret, *disk, *busy_ns;
	int status;
	int64_t now = ioc__mig_now_ms(), total_ms, setup_ms;
	uint64_t remaining = 0, elapsed_ms;
	char error[256];
	double mbps;

	if (!m)
		return json_object();
	pthread_mutex_lock(&m->lock);
	status = m->status;
	st = m->st;
	snprintf(error, sizeof(error), "%s", m->error);
	total_ms = (m->t_end ? m->t_end : now) - m->t_start;
	setup_ms = (m->t_setup ? m->t_setup : now) - m->t_start;
	int64_t downtime_ms = m->downtime_ns / 1000000;
	pthread_mutex_unlock(&m->lock);
	if (status == IOC_MIG_ST_NONE)
		return json_object();
	if (m->bm && !m->incoming) {
		struct ioc_blk_dirty_info di;

		ioc_blk_dirty_get_info(m->bm, &di);
		remaining = di.count + (st.total > st.pass1_pos ? st.total - st.pass1_pos : 0);
	} else if (m->incoming) {
		remaining = st.total > st.read_bytes ? st.total - st.read_bytes : 0;
	}
	ret = json_pack("{s:s,s:s}", "status", status_names[status], "__org.iocore_mode",
			m->handover ? "handover" : "copy");
	if (!ret)
		return NULL;
	if (status == IOC_MIG_ST_SETUP) {
		json_object_set_new(ret, "total-time", json_integer(total_ms));
		return ret;
	}
	elapsed_ms = total_ms > 0 ? (uint64_t)total_ms : 1;
	mbps = (double)st.transferred * 8.0 / 1e6 / ((double)elapsed_ms / 1000.0);
	json_object_set_new(ret, "total-time", json_integer(total_ms));
	json_object_set_new(ret, "setup-time", json_integer(setup_ms));
	if (status == IOC_MIG_ST_ACTIVE || status == IOC_MIG_ST_PRE_SWITCHOVER ||
	    status == IOC_MIG_ST_DEVICE) {
		uint64_t bw = st.bandwidth ? st.bandwidth :
			      st.transferred * 1000 / elapsed_ms;

		json_object_set_new(ret, "expected-downtime",
				    json_integer(bw ? (json_int_t)(remaining * 1000 / bw)
						    : (json_int_t)m->p.downtime_limit));
	}
	if (status == IOC_MIG_ST_COMPLETED && !m->incoming)
		json_object_set_new(ret, "downtime", json_integer(downtime_ms));
	disk = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I}",
			 "transferred", (json_int_t)st.transferred,
			 "remaining", (json_int_t)remaining,
			 "total", (json_int_t)st.total,
			 "duplicate", (json_int_t)st.duplicate,
			 "normal", (json_int_t)st.normal,
			 "normal-bytes", (json_int_t)st.normal_bytes,
			 "dirty-pages-rate", (json_int_t)st.dirty_rate,
			 "mbps", mbps,
			 "dirty-sync-count", (json_int_t)st.dirty_sync_count,
			 "page-size", (json_int_t)st.page_size);
	json_object_set_new(ret, "disk", disk);
	if (!m->incoming && m->p.compress) {
		json_object_set_new(ret, "compression", json_pack(
			"{s:I,s:I,s:f,s:I,s:f}",
			"pages", (json_int_t)st.comp_pages,
			"busy", (json_int_t)st.comp_busy,
			"busy-rate", st.comp_jobs ? (double)st.comp_busy / (double)st.comp_jobs : 0.0,
			"compressed-size", (json_int_t)st.comp_size,
			"compression-rate", st.comp_size ? (double)st.comp_in / (double)st.comp_size
							 : 0.0));
	}
	if (!m->incoming) {
		busy_ns = json_array();
		for (unsigned i = 0; i < st.nworkers; i++)
			json_array_append_new(busy_ns, json_integer((json_int_t)st.worker_busy_ns[i]));
		json_object_set_new(ret, "__org.iocore_worker-busy-ns", busy_ns);
		json_object_set_new(ret, "__org.iocore_active-mirror",
				    json_boolean(st.active_mirror));
		json_object_set_new(ret, "__org.iocore_mirrored-writes",
				    json_integer((json_int_t)st.mirrored_writes));
		json_object_set_new(ret, "__org.iocore_amplification",
				    json_real(st.total ? (double)st.read_bytes / (double)st.total
						       : 0.0));
	}
	if (!m->incoming && m->p.auto_converge) {
		/* QEMU reports it with auto-converge on; 0 once it ended. */
		json_object_set_new(ret, "cpu-throttle-percentage",
				    json_integer(st.throttle_pct));
		json_object_set_new(ret, "__org.iocore_cpu-throttle-max",
				    json_integer(st.throttle_max));
	}
	if (status == IOC_MIG_ST_FAILED && error[0])
		json_object_set_new(ret, "error-desc", json_string(error));
	return ret;
}

json_t *ioc__mig_continue(struct ioc__mig *m, json_t *args,
			      struct ioc__qmp_err *err)
{
	const char *state = json_string_value(json_object_get(args, "state"));
	int st;

	if (strcmp(state, "pre-switchover") != 0) {
		ioc__qmp_errf(err, "Parameter 'state' does not accept value '%s'", state);
		return NULL;
	}
	if (!m) {
		ioc__qmp_errf(err, "Migration not in expected state: none");
		return NULL;
	}
	pthread_mutex_lock(&m->lock);
	st = m->status;
	if (st != IOC_MIG_ST_PRE_SWITCHOVER) {
		pthread_mutex_unlock(&m->lock);
		ioc__qmp_errf(err, "Migration not in expected state: %s", status_names[st]);
		return NULL;
	}
	m->cont = true;
	engine_kick(m); /* the pre-switchover wait */
	pthread_mutex_unlock(&m->lock);
	return json_object();
}

json_t *ioc__mig_cancel(struct ioc__mig *m, json_t *args,
			    struct ioc__qmp_err *err)
{

	if (!m || !m->thread_running)
		return json_object(); /* QEMU: nothing to cancel is no error */
	pthread_mutex_lock(&m->lock);
	if (!m->end_sent && !m->thread_done) {
		/* relaxed: the engine looks at it at each step; the kick
		 * (whatever it waits for) and the shutdown (a blocking TLS
		 * handshake) wake it. */
		atomic_store_explicit(&m->cancel, true, memory_order_relaxed);
		if (m->sock >= 0)
			shutdown(m->sock, SHUT_RDWR);
		job_wake_locked(m);
		ioc__mig_set_status_locked(m, IOC_MIG_ST_CANCELLING);
	}
	pthread_mutex_unlock(&m->lock);
	return json_object();
}
