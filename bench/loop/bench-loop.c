/*
 * Event loop benchmarks: iocore against libuv and libevent, same binary.
 *
 *   bench-loop --case scal     --backend B --idle N [--seconds S]
 *       Polling scalability (QEMU's fdmon split): two loops on two threads play eventfd
 *       ping-pong through handlers that also have io_poll callbacks (a
 *       shared sequence number, like a virtqueue index), while each loop
 *       also carries N idle handlers with io_poll callbacks.  The idle ones
 *       were active once (each kicked at start), so they sat in the polled
 *       set and must have dropped out (poll_idle_ns = 50 ms) before the
 *       measurement starts.  Metric: round trips/s.
 *   bench-loop --case iter     --backend B --idle N
 *       One loop, a BH rescheduling itself, N idle handlers with poll
 *       callbacks: iterations/s (the scal property without a second thread).
 *   bench-loop --case bh       --impl iocore|libuv --backend B [--spin]
 *       Cross-thread wakeup round trip: loop A schedules a BH on loop B,
 *       whose BH schedules one back (libuv: uv_async_send both ways).
 *   bench-loop --case pingpong --impl iocore|libuv|libevent --backend B
 *       One byte bounced over two pipes between loops on two threads.
 *       --edge declares the handlers edge (multishot poll on io_uring).
 *   Options measuring io_uring features: --no-poll (adaptive polling off),
 *   --coop (COOP_TASKRUN instead of DEFER_TASKRUN), --no-reg-ring,
 *   --spin (poll with pause instead of sched_yield between rounds).
 *   --pin same|split (scal): loop A's thread on the first allowed CPU, B's
 *   on the same one or on the second; the rows then carry threads=1cpu or
 *   threads=2cpus.
 *
 * Each run prints two JSON rows (bench/loop/run.sh): round trips per
 * wall-clock second and per CPU-second of the process.  The stop protocol is
 * the same for every implementation: A's deadline check sets `stop`, sends
 * one last message so B sees it, and both loops leave.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "iocore/loop.h"
#include "src/loop/ablation.h"

#ifdef IOC_HAVE_LIBUV
#include <uv.h>
#endif
#ifdef IOC_HAVE_LIBEVENT
#include <event2/event.h>
#endif

static const char *opt_case = "pingpong", *opt_impl = "iocore";
static const char *opt_backend = "auto";
static int opt_idle;
static double opt_seconds = 2.0;
static bool opt_edge, opt_no_poll, opt_coop, opt_no_reg, opt_spin;
/* --pin same|split: 1 or 2 (0: not pinned); pinned counts the loop threads
 * that got their CPU (the rows name the placement only when both did).
 * Plain int: A counts before creating B, B counts in its thread, and the
 * rows are printed after pthread_join(B), which orders all three. */
static int opt_pin;
static int pinned;
static char cmdline[512];

static atomic_bool stop_flag;
static int64_t deadline_ns;
static uint64_t rounds; /* counted by side A */

static void die(const char *what, int err)
{
	fprintf(stderr, "bench-loop: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(2);
}

static enum ioc_fdmon backend_enum(void)
{
	if (!strcmp(opt_backend, "poll"))
		return IOC_FDMON_POLL;
	if (!strcmp(opt_backend, "epoll"))
		return IOC_FDMON_EPOLL;
	if (!strcmp(opt_backend, "io_uring"))
		return IOC_FDMON_IO_URING;
	return IOC_FDMON_AUTO;
}

static double cpu_seconds(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void print_row(const char *metric, double value, const char *error)
{
	char params[128];

	if (!strcmp(opt_case, "scal") || !strcmp(opt_case, "iter"))
		snprintf(params, sizeof(params), "backend=%s,idle=%d%s",
			 opt_backend, opt_idle,
			 pinned < 2 ? "" :
			 opt_pin == 1 ? ",threads=1cpu" : ",threads=2cpus");
	else
		snprintf(params, sizeof(params), "backend=%s%s%s%s%s%s",
			 opt_backend, opt_spin ? ",spin" : "",
			 opt_edge ? ",edge" : "", opt_no_poll ? ",no_poll" : "",
			 opt_coop ? ",coop_taskrun" : "",
			 opt_no_reg ? ",no_reg_ring" : "");
	printf("{\"suite\":\"loop\",\"case\":\"%s\",\"params\":\"%s\","
	       "\"impl\":\"%s\",\"peer\":%s,\"metric\":\"%s\",",
	       opt_case, params, opt_impl,
	       strcmp(opt_impl, "iocore") ? "true" : "false", metric);
	if (error)
		printf("\"value\":null,\"error\":\"%s\",", error);
	else
		printf("\"value\":%.1f,", value);
	printf("\"better\":\"higher\",\"cmd\":\"%s\"}\n", cmdline);
}

static inline bool past_deadline(void)
{
	/* Check the clock every 256 rounds only. */
	return (rounds & 255) == 0 && ioc_now_ns() >= deadline_ns;
}

/* What a side does after receiving the ball, the same for every impl. */
enum turn {
	TURN_PASS,       /* pass the ball back */
	TURN_PASS_STOP,  /* pass it once more (so the peer sees the stop), stop */
	TURN_STOP,       /* stop without passing */
};

/* Side A counts the round and, past the deadline, raises the stop flag;
 * side B stops when it sees the flag. */
static enum turn take_turn(bool is_a)
{
	if (is_a) {
		rounds++;
		if (!past_deadline())
			return TURN_PASS;
		/* Relaxed: the pass that follows (a pipe write, an eventfd,
		 * a BH) orders it before B's load below. */
		atomic_store_explicit(&stop_flag, true, memory_order_relaxed);
		return TURN_PASS_STOP;
	}
	/* Relaxed: pairs with A's store above through the pass that
	 * delivered the ball. */
	return atomic_load_explicit(&stop_flag, memory_order_relaxed) ? TURN_STOP
								       : TURN_PASS;
}

/* ---- iocore: two loops ----------------------------------------------- */

struct side {
	struct ioc_loop *loop;
	struct side *peer;
	int rfd, wfd;            /* pingpong: pipes; scal: eventfds */
	atomic_uint_fast64_t seq; /* scal: written by the peer */
	uint64_t seen;
	struct ioc_bh *bh;
	bool is_a;
	pthread_t tid;
	pthread_barrier_t *bar;
	int *idle_fds;
};

static struct side side_a, side_b;
static unsigned ablate; /* IOC__LOOP_NO_* from --coop, --no-reg-ring */

static struct ioc_loop_opts loop_opts(void)
{
	struct ioc_loop_opts o = { .fdmon = backend_enum() };

	if (opt_no_poll)
		o.poll_max_ns = -1;
	if (opt_coop)
		ablate |= IOC__LOOP_NO_DEFER;
	o.poll_spin = opt_spin;
	if (opt_no_reg)
		ablate |= IOC__LOOP_NO_REG_RING;
	if (!strcmp(opt_case, "scal"))
		o.poll_idle_ns = 50000000;
	return o;
}

/* pingpong: one byte back and forth. */
static void pp_read(void *opaque)
{
	struct side *s = opaque;
	enum turn t;
	char c;

	if (read(s->rfd, &c, 1) != 1)
		return;
	t = take_turn(s->is_a);
	if (t != TURN_STOP && write(s->wfd, &c, 1) < 0)
		die("write", errno);
	if (t != TURN_PASS)
		ioc_loop_stop(s->loop);
}

/* scal: eventfd ping-pong; the peer's sequence number is what io_poll
 * checks without a syscall. */
static void scal_work(struct side *s)
{
	enum turn t;
	uint64_t v;

	/* The eventfd is drained; polling may have found the work first. */
	if (read(s->rfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		die("read", errno);
	/* Acquire: pairs with the release increment below on the peer. */
	v = atomic_load_explicit(&s->seq, memory_order_acquire);
	if (v == s->seen)
		return;
	s->seen = v;
	t = take_turn(s->is_a);
	if (t != TURN_PASS)
		ioc_loop_stop(s->loop);
	if (t == TURN_STOP)
		return;
	/* Release: pairs with the acquire load above on the peer. */
	atomic_fetch_add_explicit(&s->peer->seq, 1, memory_order_release);
	v = 1;
	if (write(s->peer->rfd, &v, sizeof(v)) < 0)
		die("write", errno);
}

static void scal_read(void *opaque)
{
	scal_work(opaque);
}

static bool scal_poll(void *opaque)
{
	struct side *s = opaque;

	/* Relaxed: a hint; scal_work() re-reads with acquire. */
	return atomic_load_explicit(&s->seq, memory_order_relaxed) != s->seen;
}

static void idle_read(void *opaque)
{
	uint64_t v;

	if (read((int)(intptr_t)opaque, &v, sizeof(v)) < 0 && errno != EAGAIN)
		die("read", errno);
}

static bool idle_poll(void *opaque)
{
	(void)opaque;
	return false;
}

/* bh: cross-thread BH round trip. */
static void bh_cb(void *opaque)
{
	struct side *s = opaque;
	enum turn t = take_turn(s->is_a);

	if (t != TURN_STOP)
		ioc_bh_schedule(s->peer->bh);
	if (t != TURN_PASS)
		ioc_loop_stop(s->loop);
}

/*
 * iter: one loop, one BH that reschedules itself, N idle handlers with
 * poll callbacks (active once, then idle past poll_idle_ns).  Iterations/s
 * of a busy loop on one thread, where the cost of an iteration is all
 * that is measured: the scalability property without cross-thread noise.
 */
static unsigned long iter_polls;

static bool iter_idle_poll(void *opaque)
{
	(void)opaque;
	iter_polls++;
	return false;
}

static void iter_bh(void *opaque)
{
	struct side *s = opaque;

	rounds++;
	if (past_deadline())
		ioc_loop_stop(s->loop);
	else
		ioc_bh_schedule(s->bh);
}

static void scal_warmup(struct side *s);
static void side_teardown(struct side *s);

static double run_iter(void)
{
	struct ioc_loop_opts o = loop_opts();
	struct side *s = &side_a;
	int64_t start;
	int r;

	*s = (struct side){ .is_a = true };
	o.poll_idle_ns = 50000000;
	r = ioc__loop_new_ablated(&s->loop, &o, ablate);
	if (r < 0)
		die("ioc_loop_new", r);
	s->idle_fds = calloc((size_t)opt_idle + 1, sizeof(int));
	for (int i = 0; i < opt_idle; i++) {
		int fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC); /* active once */

		if (fd < 0)
			die("eventfd", errno);
		s->idle_fds[i] = fd;
		r = ioc_loop_set_fd(s->loop, fd, idle_read, NULL, iter_idle_poll,
				    idle_read, (void *)(intptr_t)fd);
		if (r < 0)
			die("set_fd", r);
	}
	scal_warmup(s);
	s->bh = ioc_bh_new(s->loop, iter_bh, s);
	iter_polls = 0;
	start = ioc_now_ns();
	deadline_ns = start + (int64_t)(opt_seconds * 1e9);
	ioc_bh_schedule(s->bh);
	ioc_loop_run(s->loop);
	double secs = (double)(ioc_now_ns() - start) / 1e9;

	fprintf(stderr, "  idle io_poll calls during the run: %lu\n", iter_polls);
	side_teardown(s);
	return (double)rounds / secs;
}

static void side_setup(struct side *s)
{
	struct ioc_loop_opts o = loop_opts();
	int r = ioc__loop_new_ablated(&s->loop, &o, ablate);

	if (r < 0)
		die("ioc_loop_new", r);
	if (!strcmp(opt_case, "pingpong")) {
		r = ioc_loop_set_fd(s->loop, s->rfd, pp_read, NULL, NULL, NULL, s);
		/* pp_read does not drain the pipe: edge mode is only valid
		 * because exactly one byte is ever in flight. */
		if (r == 0 && opt_edge)
			r = ioc_loop_set_fd_edge(s->loop, s->rfd, true);
	} else if (!strcmp(opt_case, "scal")) {
		r = ioc_loop_set_fd(s->loop, s->rfd, scal_read, NULL, scal_poll,
				    scal_read, s);
		s->idle_fds = calloc((size_t)opt_idle + 1, sizeof(int));
		for (int i = 0; r == 0 && i < opt_idle; i++) {
			uint64_t one = 1;
			int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

			if (fd < 0)
				die("eventfd", errno);
			s->idle_fds[i] = fd;
			r = ioc_loop_set_fd(s->loop, fd, idle_read, NULL,
					    idle_poll, idle_read,
					    (void *)(intptr_t)fd);
			/* Active once, so it joins the polled set. */
			if (write(fd, &one, sizeof(one)) < 0)
				die("write", errno);
		}
	} else {
		s->bh = ioc_bh_new(s->loop, bh_cb, s);
	}
	if (r < 0)
		die("set_fd", r);
}

static void nop_timer(void *opaque)
{
	(void)opaque;
}

/* scal: let the idle handlers drop out of the polled set. */
static void scal_warmup(struct side *s)
{
	struct ioc_timer t;
	int64_t end = ioc_now_ns() + 150000000;

	ioc_timer_init(&t, s->loop, nop_timer, NULL);
	while (ioc_now_ns() < end) {
		ioc_timer_arm_in(&t, 10000000);
		ioc_loop_poll(s->loop, true);
	}
	ioc_timer_cancel(&t);
}

/* --pin: side A on the first CPU of the process's affinity mask (read
 * before anyone is pinned: threads inherit their creator's mask), B on
 * the same CPU (same) or the second (split). */
static cpu_set_t pin_mask;

static void pin_to(int nth)
{
	cpu_set_t one;
	int seen = 0;

	if (!opt_pin)
		return;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &pin_mask) || seen++ != nth)
			continue;
		CPU_ZERO(&one);
		CPU_SET(c, &one);
		if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0)
			pinned++;
		return;
	}
}

static void *side_b_main(void *arg)
{
	struct side *s = arg;

	pin_to(opt_pin == 2 ? 1 : 0);
	side_setup(s);
	if (!strcmp(opt_case, "scal"))
		scal_warmup(s);
	pthread_barrier_wait(s->bar);
	pthread_barrier_wait(s->bar); /* A is set up too */
	ioc_loop_run(s->loop);
	return NULL;
}

static void side_teardown(struct side *s)
{
	struct ioc_loop_stats st;

	ioc_loop_get_stats(s->loop, &st);
	fprintf(stderr, "  %s: backend %s, %llu iterations, %llu blocking, "
		"%llu poll hits, %llu misses, %llu notifies, "
		"polled %u of %u, poll_ns %lld\n", s->is_a ? "A" : "B",
		st.backend, (unsigned long long)st.iterations,
		(unsigned long long)st.blocking_waits,
		(unsigned long long)st.poll_hits,
		(unsigned long long)st.poll_misses,
		(unsigned long long)st.notifies, st.polled_handlers,
		st.handlers, (long long)st.poll_ns);
	if (s->bh)
		ioc_bh_delete(s->bh);
	for (int i = 0; s->idle_fds && i < opt_idle; i++) {
		ioc_loop_set_fd(s->loop, s->idle_fds[i], NULL, NULL, NULL, NULL,
				NULL);
		close(s->idle_fds[i]);
	}
	free(s->idle_fds);
	ioc_loop_set_fd(s->loop, s->rfd, NULL, NULL, NULL, NULL, NULL);
	ioc_loop_free(s->loop);
}

static double run_iocore(void)
{
	pthread_barrier_t bar;
	int p1[2], p2[2];
	int64_t start;

	pthread_barrier_init(&bar, NULL, 2);
	side_a = (struct side){ .is_a = true, .peer = &side_b, .bar = &bar };
	side_b = (struct side){ .peer = &side_a, .bar = &bar };
	if (!strcmp(opt_case, "pingpong")) {
		if (pipe2(p1, O_NONBLOCK | O_CLOEXEC) || pipe2(p2, O_NONBLOCK | O_CLOEXEC))
			die("pipe", errno);
		side_a.rfd = p1[0];
		side_b.wfd = p1[1];
		side_b.rfd = p2[0];
		side_a.wfd = p2[1];
	} else if (!strcmp(opt_case, "scal")) {
		side_a.rfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		side_b.rfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	if (opt_pin && sched_getaffinity(0, sizeof(pin_mask), &pin_mask) < 0)
		CPU_ZERO(&pin_mask);
	pin_to(0);
	if (pthread_create(&side_b.tid, NULL, side_b_main, &side_b))
		die("pthread_create", errno);
	side_setup(&side_a);
	if (!strcmp(opt_case, "scal"))
		scal_warmup(&side_a);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);

	start = ioc_now_ns();
	deadline_ns = start + (int64_t)(opt_seconds * 1e9);
	/* Serve the first ball to B. */
	if (!strcmp(opt_case, "pingpong")) {
		if (write(side_a.wfd, "x", 1) < 0)
			die("write", errno);
	} else if (!strcmp(opt_case, "scal")) {
		uint64_t one = 1;

		atomic_fetch_add(&side_b.seq, 1);
		if (write(side_b.rfd, &one, sizeof(one)) < 0)
			die("write", errno);
	} else {
		ioc_bh_schedule(side_b.bh);
	}
	ioc_loop_run(side_a.loop);
	double secs = (double)(ioc_now_ns() - start) / 1e9;

	pthread_join(side_b.tid, NULL);
	side_teardown(&side_a);
	side_teardown(&side_b);
	pthread_barrier_destroy(&bar);
	return (double)rounds / secs;
}

/* ---- libuv ------------------------------------------------------------ */

#ifdef IOC_HAVE_LIBUV
struct uvside {
	uv_loop_t loop;
	uv_async_t async;
	uv_poll_t poll;
	struct uvside *peer;
	int rfd, wfd;
	bool is_a;
	pthread_t tid;
	pthread_barrier_t *bar;
};

static struct uvside uv_a, uv_b;

static void uv_close_all(struct uvside *s)
{
	if (!strcmp(opt_case, "bh"))
		uv_close((uv_handle_t *)&s->async, NULL);
	else
		uv_close((uv_handle_t *)&s->poll, NULL);
}

static void luv_async_cb(uv_async_t *h)
{
	struct uvside *s = h->data;
	enum turn t = take_turn(s->is_a);

	if (t != TURN_STOP)
		uv_async_send(&s->peer->async);
	if (t != TURN_PASS)
		uv_close_all(s);
}

static void luv_poll_cb(uv_poll_t *h, int status, int events)
{
	struct uvside *s = h->data;
	enum turn t;
	char c;

	(void)status;
	(void)events;
	if (read(s->rfd, &c, 1) != 1)
		return;
	t = take_turn(s->is_a);
	if (t != TURN_STOP && write(s->wfd, &c, 1) < 0)
		die("write", errno);
	if (t != TURN_PASS)
		uv_close_all(s);
}

static void uv_side_setup(struct uvside *s)
{
	uv_loop_init(&s->loop);
	if (!strcmp(opt_case, "bh")) {
		uv_async_init(&s->loop, &s->async, luv_async_cb);
		s->async.data = s;
	} else {
		uv_poll_init(&s->loop, &s->poll, s->rfd);
		s->poll.data = s;
		uv_poll_start(&s->poll, UV_READABLE, luv_poll_cb);
	}
}

static void *uv_b_main(void *arg)
{
	struct uvside *s = arg;

	uv_side_setup(s);
	pthread_barrier_wait(s->bar);
	pthread_barrier_wait(s->bar);
	uv_run(&s->loop, UV_RUN_DEFAULT);
	uv_loop_close(&s->loop);
	return NULL;
}

static double run_libuv(void)
{
	pthread_barrier_t bar;
	int p1[2], p2[2];
	int64_t start;

	if (strcmp(opt_case, "pingpong") && strcmp(opt_case, "bh"))
		return -1;
	pthread_barrier_init(&bar, NULL, 2);
	uv_a = (struct uvside){ .is_a = true, .peer = &uv_b, .bar = &bar };
	uv_b = (struct uvside){ .peer = &uv_a, .bar = &bar };
	if (!strcmp(opt_case, "pingpong")) {
		if (pipe2(p1, O_NONBLOCK | O_CLOEXEC) || pipe2(p2, O_NONBLOCK | O_CLOEXEC))
			die("pipe", errno);
		uv_a.rfd = p1[0];
		uv_b.wfd = p1[1];
		uv_b.rfd = p2[0];
		uv_a.wfd = p2[1];
	}
	pthread_create(&uv_b.tid, NULL, uv_b_main, &uv_b);
	uv_side_setup(&uv_a);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	start = ioc_now_ns();
	deadline_ns = start + (int64_t)(opt_seconds * 1e9);
	if (!strcmp(opt_case, "bh")) {
		uv_async_send(&uv_b.async);
	} else if (write(uv_a.wfd, "x", 1) < 0) {
		die("write", errno);
	}
	uv_run(&uv_a.loop, UV_RUN_DEFAULT);
	double secs = (double)(ioc_now_ns() - start) / 1e9;

	pthread_join(uv_b.tid, NULL);
	uv_loop_close(&uv_a.loop);
	return (double)rounds / secs;
}
#endif

/* ---- libevent ----------------------------------------------------------- */

#ifdef IOC_HAVE_LIBEVENT
struct evside {
	struct event_base *base;
	struct event *ev;
	int rfd, wfd;
	bool is_a;
	pthread_t tid;
	pthread_barrier_t *bar;
};

static struct evside ev_a, ev_b;

static void ev_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct evside *s = arg;
	enum turn t;
	char c;

	(void)fd;
	(void)what;
	if (read(s->rfd, &c, 1) != 1)
		return;
	t = take_turn(s->is_a);
	if (t != TURN_STOP && write(s->wfd, &c, 1) < 0)
		die("write", errno);
	if (t != TURN_PASS)
		event_base_loopbreak(s->base);
}

static void ev_side_setup(struct evside *s)
{
	s->base = event_base_new();
	s->ev = event_new(s->base, s->rfd, EV_READ | EV_PERSIST, ev_read_cb, s);
	event_add(s->ev, NULL);
}

static void *ev_b_main(void *arg)
{
	struct evside *s = arg;

	ev_side_setup(s);
	pthread_barrier_wait(s->bar);
	pthread_barrier_wait(s->bar);
	event_base_dispatch(s->base);
	return NULL;
}

static double run_libevent(void)
{
	pthread_barrier_t bar;
	int p1[2], p2[2];
	int64_t start;

	if (strcmp(opt_case, "pingpong"))
		return -1;
	pthread_barrier_init(&bar, NULL, 2);
	ev_a = (struct evside){ .is_a = true, .bar = &bar };
	ev_b = (struct evside){ .bar = &bar };
	if (pipe2(p1, O_NONBLOCK | O_CLOEXEC) || pipe2(p2, O_NONBLOCK | O_CLOEXEC))
		die("pipe", errno);
	ev_a.rfd = p1[0];
	ev_b.wfd = p1[1];
	ev_b.rfd = p2[0];
	ev_a.wfd = p2[1];
	pthread_create(&ev_b.tid, NULL, ev_b_main, &ev_b);
	ev_side_setup(&ev_a);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	start = ioc_now_ns();
	deadline_ns = start + (int64_t)(opt_seconds * 1e9);
	if (write(ev_a.wfd, "x", 1) < 0)
		die("write", errno);
	event_base_dispatch(ev_a.base);
	double secs = (double)(ioc_now_ns() - start) / 1e9;

	pthread_join(ev_b.tid, NULL);
	event_free(ev_a.ev);
	event_free(ev_b.ev);
	event_base_free(ev_a.base);
	event_base_free(ev_b.base);
	return (double)rounds / secs;
}
#endif

int main(int argc, char **argv)
{
	size_t off = 0;
	double v = -1, cpu0, cpu;
	const char *err = NULL;

	for (int i = 0; i < argc; i++)
		off += (size_t)snprintf(cmdline + off, sizeof(cmdline) - off,
					"%s%s", i ? " " : "", argv[i]);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *n = i + 1 < argc ? argv[i + 1] : "";

		if (!strcmp(a, "--case"))
			opt_case = n, i++;
		else if (!strcmp(a, "--impl"))
			opt_impl = n, i++;
		else if (!strcmp(a, "--backend"))
			opt_backend = n, i++;
		else if (!strcmp(a, "--idle"))
			opt_idle = atoi(n), i++;
		else if (!strcmp(a, "--seconds"))
			opt_seconds = atof(n), i++;
		else if (!strcmp(a, "--edge"))
			opt_edge = true;
		else if (!strcmp(a, "--no-poll"))
			opt_no_poll = true;
		else if (!strcmp(a, "--coop"))
			opt_coop = true;
		else if (!strcmp(a, "--spin"))
			opt_spin = true;
		else if (!strcmp(a, "--pin") && (!strcmp(n, "same") || !strcmp(n, "split")))
			opt_pin = !strcmp(n, "same") ? 1 : 2, i++;
		else if (!strcmp(a, "--no-reg-ring"))
			opt_no_reg = true;
		else {
			fprintf(stderr, "usage: bench-loop --case scal|bh|pingpong "
				"--impl iocore|libuv|libevent --backend B "
				"[--idle N] [--seconds S]\n");
			return 2;
		}
	}
	if (opt_idle > 0) {
		struct rlimit rl;

		getrlimit(RLIMIT_NOFILE, &rl);
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	cpu0 = cpu_seconds();
	if (!strcmp(opt_impl, "iocore") && !strcmp(opt_case, "iter")) {
		v = run_iter();
	} else if (!strcmp(opt_impl, "iocore")) {
		v = run_iocore();
	} else if (!strcmp(opt_impl, "libuv")) {
#ifdef IOC_HAVE_LIBUV
		v = run_libuv();
		if (v < 0)
			err = "case not implemented for libuv";
#else
		err = "libuv not built in";
#endif
	} else if (!strcmp(opt_impl, "libevent")) {
#ifdef IOC_HAVE_LIBEVENT
		v = run_libevent();
		if (v < 0)
			err = "case not implemented for libevent";
#else
		err = "libevent not built in";
#endif
	} else {
		err = "unknown impl";
	}
	cpu = cpu_seconds() - cpu0;
	print_row(strcmp(opt_case, "iter") ? "roundtrips/s" : "iterations/s",
		  v, err);
	/* Round trips per CPU-second of the whole process (both loop
	 * threads, setup included): steadier than wall-clock rates on a
	 * shared machine, and it charges polling for the CPU it burns. */
	print_row(strcmp(opt_case, "iter") ? "roundtrips/cpu-s" :
		  "iterations/cpu-s", cpu > 0 && v > 0 ?
		  (double)rounds / cpu : 0, err);
	return 0;
}
