/* Event loop basics, run against every backend (IOC_FDMON). */
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "loop-test.h"

/* ---- creation, current loop, stats, ext -------------------------------- */

static int ext_freed;
static void ext_free(void *p)
{
	ASSERT_PTR_EQ(p, &ext_freed);
	ext_freed++;
}

static void test_new_free_current(void)
{
	struct ioc_loop *a, *b;
	struct ioc_loop_stats st;

	ioc_loop_set_current(NULL);
	a = test_loop_new(NULL);
	ASSERT_PTR_EQ(ioc_loop_current(), a);
	b = test_loop_new(NULL);
	ASSERT_PTR_EQ(ioc_loop_current(), a); /* already had one */
	ASSERT_TRUE(ioc_loop_in_thread(a));
	ioc_loop_poll(b, false);
	ASSERT_PTR_EQ(ioc_loop_current(), b); /* polling makes it current */

	ioc_loop_get_stats(a, &st);
	ASSERT_NOT_NULL(st.backend);
	ASSERT_UEQ(st.handlers, 0);
	ASSERT_FALSE(ioc_loop_poll(a, false));
	ASSERT_PTR_EQ(ioc_loop_current(), a);
	ioc_loop_free(b); /* not current: unchanged */
	ASSERT_PTR_EQ(ioc_loop_current(), a);

	ioc_loop_set_ext(a, IOC_LOOP_EXT_USER, &ext_freed, ext_free);
	ASSERT_PTR_EQ(ioc_loop_get_ext(a, IOC_LOOP_EXT_USER), &ext_freed);
	ASSERT_NULL(ioc_loop_get_ext(a, IOC_LOOP_EXT_POOL));
	ioc_loop_free(a);
	ASSERT_NULL(ioc_loop_current());
	ASSERT_EQ(ext_freed, 1);
}

static void test_bad_opts(void)
{
	struct ioc_loop *loop = (void *)1;
	struct ioc_loop_opts o = { .fdmon = 42 };

	ASSERT_EQ(ioc_loop_new(&loop, &o), -EINVAL);
	ASSERT_NULL(loop);
}

/* ---- fd readiness ------------------------------------------------------- */

struct fdctx {
	struct ioc_loop *loop;
	int fd;
	int reads, writes;
	bool remove_self, readd_self, remove_other;
	struct fdctx *other;
};

static void on_read(void *opaque)
{
	struct fdctx *c = opaque;

	c->reads++;
	eventfd_drain(c->fd);
	if (c->remove_other)
		ASSERT_OK(ioc_loop_set_fd(c->loop, c->other->fd, NULL, NULL,
					  NULL, NULL, NULL));
	if (c->remove_self || c->readd_self)
		ASSERT_OK(ioc_loop_set_fd(c->loop, c->fd, NULL, NULL, NULL,
					  NULL, NULL));
	if (c->readd_self) {
		c->readd_self = false;
		ASSERT_OK(ioc_loop_set_fd(c->loop, c->fd, on_read, NULL, NULL,
					  NULL, c));
	}
}

static void on_write(void *opaque)
{
	struct fdctx *c = opaque;

	c->writes++;
	/* Writable forever: stop asking. */
	ASSERT_OK(ioc_loop_set_fd(c->loop, c->fd, NULL, NULL, NULL, NULL,
				  NULL));
}

static void test_readiness(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct fdctx c = { .loop = loop };
	struct fdctx w = { .loop = loop };
	int p[2];
	struct ioc_loop_stats st;

	c.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_GE(c.fd, 0);
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, on_read, NULL, NULL, NULL, &c));
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.handlers, 1);

	/* Nothing ready: a non-blocking poll makes no progress. */
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	ASSERT_EQ(c.reads, 0);

	eventfd_kick(c.fd);
	POLL_UNTIL(loop, c.reads == 1);
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	ASSERT_EQ(c.reads, 1);

	/* Level-triggered: a second event after the drain is reported. */
	eventfd_kick(c.fd);
	POLL_UNTIL(loop, c.reads == 2);

	/* Write readiness on a pipe. */
	ASSERT_OK(pipe2(p, O_NONBLOCK | O_CLOEXEC));
	w.fd = p[1];
	ASSERT_OK(ioc_loop_set_fd(loop, w.fd, NULL, on_write, NULL, NULL, &w));
	POLL_UNTIL(loop, w.writes == 1);
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	ASSERT_EQ(w.writes, 1);

	/* Update in place: the eventfd handler now also wants writes. */
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, on_read, on_write, NULL, NULL,
				  &c));
	POLL_UNTIL(loop, c.writes == 1);

	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, NULL, NULL, NULL, NULL, NULL));
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.handlers, 0);
	/* Removing an unknown fd is a no-op; a negative fd is refused. */
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, NULL, NULL, NULL, NULL, NULL));
	ASSERT_EQ(ioc_loop_set_fd(loop, -1, on_read, NULL, NULL, NULL, &c),
		  -EBADF);
	close(c.fd);
	close(p[0]);
	close(p[1]);
	ioc_loop_free(loop);
}

/* Mask changes on an armed fd, both ways (io_uring updates in place). */
struct maskctx {
	struct ioc_loop *loop;
	int fd, reads, writes;
};

static void mask_read(void *opaque);
static void mask_write(void *opaque)
{
	struct maskctx *m = opaque;

	m->writes++;
	/* Back to read only, from inside the write callback. */
	ASSERT_OK(ioc_loop_set_fd(m->loop, m->fd, mask_read, NULL, NULL, NULL,
				  m));
}

static void mask_read(void *opaque)
{
	struct maskctx *m = opaque;
	char buf[64];

	m->reads++;
	ASSERT_GT(read(m->fd, buf, sizeof(buf)), 0);
}

static void test_mask_update(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct maskctx m = { .loop = loop };
	int sv[2];

	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
			     0, sv));
	m.fd = sv[0];
	for (int round = 1; round <= 50; round++) {
		/* Read only, nothing to read: armed, quiet. */
		ASSERT_OK(ioc_loop_set_fd(loop, m.fd, mask_read, NULL, NULL,
					  NULL, &m));
		ioc_loop_poll(loop, false);
		ASSERT_EQ(m.reads, round - 1);
		/* Add write interest: the socket is writable at once. */
		ASSERT_OK(ioc_loop_set_fd(loop, m.fd, mask_read, mask_write,
					  NULL, NULL, &m));
		POLL_UNTIL(loop, m.writes == round);
		ioc_loop_poll(loop, false);
		ASSERT_EQ(m.writes, round); /* write interest was dropped */
		/* Data: the read side still works. */
		ASSERT_EQ(write(sv[1], "x", 1), 1);
		POLL_UNTIL(loop, m.reads == round);
	}
	ASSERT_OK(ioc_loop_set_fd(loop, m.fd, NULL, NULL, NULL, NULL, NULL));
	close(sv[0]);
	close(sv[1]);
	ioc_loop_free(loop);
}

static void test_remove_in_callback(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct fdctx a = { .loop = loop }, b = { .loop = loop };

	a.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	b.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	/* Own removal. */
	a.remove_self = true;
	ASSERT_OK(ioc_loop_set_fd(loop, a.fd, on_read, NULL, NULL, NULL, &a));
	eventfd_kick(a.fd);
	POLL_UNTIL(loop, a.reads == 1);
	eventfd_kick(a.fd);
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	ASSERT_EQ(a.reads, 1);

	/* Remove and re-add itself from its own callback. */
	a.remove_self = false;
	a.readd_self = true;
	ASSERT_OK(ioc_loop_set_fd(loop, a.fd, on_read, NULL, NULL, NULL, &a));
	POLL_UNTIL(loop, a.reads == 2);
	eventfd_kick(a.fd);
	POLL_UNTIL(loop, a.reads == 3);

	/*
	 * Both ready in the same iteration; whichever runs first removes the
	 * other, which then must not run.
	 */
	a.remove_other = true;
	a.other = &b;
	b.remove_other = true;
	b.other = &a;
	ASSERT_OK(ioc_loop_set_fd(loop, b.fd, on_read, NULL, NULL, NULL, &b));
	eventfd_kick(a.fd);
	eventfd_kick(b.fd);
	POLL_UNTIL(loop, a.reads + b.reads >= 4);
	ASSERT_EQ(a.reads + b.reads, 4);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(a.reads + b.reads, 4);

	/* Removal then close inside the callback, fd number reused. */
	ioc_loop_free(loop);
	close(a.fd);
	close(b.fd);
}

/* 10,000 fds registered; only the kicked ones run. */
static int many_hits;
static void many_read(void *opaque)
{
	int fd = (int)(intptr_t)opaque;

	eventfd_drain(fd);
	many_hits++;
}

static void test_many_fds(void)
{
	enum { N = 10000 };
	struct rlimit rl;
	struct ioc_loop *loop;
	struct ioc_loop_stats st;
	static int fds[N];

	ASSERT_OK(getrlimit(RLIMIT_NOFILE, &rl));
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < N + 200)
		IOC_SKIP("RLIMIT_NOFILE hard limit below 10200");
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < N + 200) {
		rl.rlim_cur = N + 200;
		ASSERT_OK(setrlimit(RLIMIT_NOFILE, &rl));
	}
	loop = test_loop_new(NULL);
	for (int i = 0; i < N; i++) {
		fds[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		ASSERT_GE(fds[i], 0);
		ASSERT_OK(ioc_loop_set_fd(loop, fds[i], many_read, NULL, NULL,
					  NULL, (void *)(intptr_t)fds[i]));
	}
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.handlers, N);
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	many_hits = 0;
	for (int i = 0; i < N; i += 97)
		eventfd_kick(fds[i]);
	POLL_UNTIL(loop, many_hits == (N + 96) / 97);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(many_hits, (N + 96) / 97);
	/* All at once. */
	many_hits = 0;
	for (int i = 0; i < N; i++)
		eventfd_kick(fds[i]);
	POLL_UNTIL(loop, many_hits == N);
	for (int i = 0; i < N; i += 2)
		ASSERT_OK(ioc_loop_set_fd(loop, fds[i], NULL, NULL, NULL,
					  NULL, NULL));
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.handlers, N / 2);
	ioc_loop_free(loop); /* removes the rest */
	for (int i = 0; i < N; i++)
		close(fds[i]);
}

/* ---- bottom halves -------------------------------------------------------- */

struct bhctx {
	struct ioc_bh *bh;
	int runs;
	bool delete_self, resched;
};

static void bh_cb(void *opaque)
{
	struct bhctx *c = opaque;

	c->runs++;
	if (c->resched) {
		c->resched = false;
		ioc_bh_schedule(c->bh);
	}
	if (c->delete_self)
		ioc_bh_delete(c->bh);
}

static int oneshot_runs;
static void oneshot_cb(void *opaque)
{
	ASSERT_PTR_EQ(opaque, &oneshot_runs);
	oneshot_runs++;
}

static void test_bh(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct bhctx c = { 0 };
	struct bhctx d = { 0 };

	c.bh = ioc_bh_new(loop, bh_cb, &c);
	ASSERT_NOT_NULL(c.bh);
	ASSERT_FALSE(ioc_loop_poll(loop, false));

	/* Idempotent while pending. */
	ioc_bh_schedule(c.bh);
	ioc_bh_schedule(c.bh);
	ASSERT_TRUE(ioc_loop_poll(loop, false));
	ASSERT_EQ(c.runs, 1);
	ASSERT_FALSE(ioc_loop_poll(loop, false));

	/* Cancel. */
	ioc_bh_schedule(c.bh);
	ioc_bh_cancel(c.bh);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(c.runs, 1);
	/* Schedule after cancel runs it again. */
	ioc_bh_schedule(c.bh);
	ioc_bh_cancel(c.bh);
	ioc_bh_schedule(c.bh);
	POLL_UNTIL(loop, c.runs == 2);

	/* A BH rescheduling itself runs again on the next pass, not in a
	 * loop inside this one; blocking poll does not sleep meanwhile. */
	c.resched = true;
	ioc_bh_schedule(c.bh);
	ioc_loop_poll(loop, true);
	ASSERT_GE(c.runs, 3);
	POLL_UNTIL(loop, c.runs == 4);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(c.runs, 4);

	/* Delete from inside its own callback. */
	c.delete_self = true;
	ioc_bh_schedule(c.bh);
	POLL_UNTIL(loop, c.runs == 5);

	/* Delete while pending: never runs, no leak. */
	d.bh = ioc_bh_new(loop, bh_cb, &d);
	ioc_bh_schedule(d.bh);
	ioc_bh_delete(d.bh);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(d.runs, 0);

	/* One-shot BHs. */
	oneshot_runs = 0;
	ASSERT_OK(ioc_loop_oneshot(loop, oneshot_cb, &oneshot_runs));
	ASSERT_OK(ioc_loop_oneshot(loop, oneshot_cb, &oneshot_runs));
	POLL_UNTIL(loop, oneshot_runs == 2);

	/* Freed with BHs pending: they do not run, nothing leaks. */
	d.bh = ioc_bh_new(loop, bh_cb, &d);
	ioc_bh_schedule(d.bh);
	ioc_bh_delete(d.bh);
	ASSERT_OK(ioc_loop_oneshot(loop, oneshot_cb, &oneshot_runs));
	ioc_loop_free(loop);
	ASSERT_EQ(oneshot_runs, 2);
}

/* Tasks run in FIFO order. */
struct seqtask {
	struct ioc_task task;
	int id;
	int *log, *n;
};

static void seq_fn(struct ioc_task *t)
{
	struct seqtask *s = ioc_container_of(t, struct seqtask, task);

	s->log[(*s->n)++] = s->id;
}

static void test_tasks_fifo(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct seqtask ts[16];
	int log[16], n = 0;

	for (int i = 0; i < 16; i++) {
		ts[i] = (struct seqtask){ .task.fn = seq_fn, .id = i,
					  .log = log, .n = &n };
		ioc_loop_post(loop, &ts[i].task);
	}
	ASSERT_TRUE(ioc_loop_poll(loop, false));
	ASSERT_EQ(n, 16);
	for (int i = 0; i < 16; i++)
		ASSERT_EQ(log[i], i);
	ioc_loop_free(loop);
}

/* BHs scheduled from 4 threads at once: none lost, none run twice. */
enum { BH_THREADS = 4 };

struct bhthread {
	pthread_t tid;
	struct ioc_loop *loop;
	struct ioc_bh **bhs;
	unsigned n;
	pthread_barrier_t *bar;
};

static atomic_uint bh_total;
static unsigned char *bh_ran; /* per-BH run count, loop thread only */

static void count_cb(void *opaque)
{
	unsigned idx = (unsigned)(uintptr_t)opaque;

	bh_ran[idx]++;
	/* Relaxed: read by the loop thread itself. */
	atomic_fetch_add_explicit(&bh_total, 1, memory_order_relaxed);
}

static void *bh_thread(void *arg)
{
	struct bhthread *t = arg;

	pthread_barrier_wait(t->bar);
	for (unsigned i = 0; i < t->n; i++)
		ioc_bh_schedule(t->bhs[i]);
	return NULL;
}

static void test_bh_threads(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	unsigned per = (unsigned)ioc_test_scaled(20000);
	unsigned total = per * BH_THREADS;
	struct bhthread th[BH_THREADS];
	struct ioc_bh **bhs = calloc(total, sizeof(*bhs));
	pthread_barrier_t bar;

	bh_ran = calloc(total, 1);
	atomic_store(&bh_total, 0);
	for (unsigned i = 0; i < total; i++)
		bhs[i] = ioc_bh_new(loop, count_cb, (void *)(uintptr_t)i);
	pthread_barrier_init(&bar, NULL, BH_THREADS + 1);
	for (int i = 0; i < BH_THREADS; i++) {
		th[i] = (struct bhthread){ .loop = loop, .bhs = bhs + i * per,
					   .n = per, .bar = &bar };
		ASSERT_OK(-pthread_create(&th[i].tid, NULL, bh_thread, &th[i]));
	}
	pthread_barrier_wait(&bar);
	POLL_UNTIL(loop, atomic_load(&bh_total) == total);
	for (int i = 0; i < BH_THREADS; i++)
		pthread_join(th[i].tid, NULL);
	ioc_loop_poll(loop, false);
	ASSERT_UEQ(atomic_load(&bh_total), total);
	for (unsigned i = 0; i < total; i++) {
		ASSERT_EQ(bh_ran[i], 1);
		ioc_bh_delete(bhs[i]);
	}
	pthread_barrier_destroy(&bar);
	free(bhs);
	free(bh_ran);
	ioc_loop_free(loop);
}

/*
 * Nested iterations (QEMU's AIO_WAIT_WHILE): a callback polls the loop
 * until work it depends on has run: a BH scheduled from another thread,
 * then an fd that becomes ready, then a BH that was queued behind it in
 * the same pass.
 */
struct nest {
	struct ioc_loop *loop;
	struct ioc_bh *outer, *inner, *later;
	int fd;
	bool inner_ran, later_ran, fd_ran, done;
};

static void *schedule_inner(void *arg)
{
	ioc_bh_schedule(((struct nest *)arg)->inner);
	return NULL;
}

static void nest_inner(void *opaque)
{
	((struct nest *)opaque)->inner_ran = true;
}

static void nest_later(void *opaque)
{
	((struct nest *)opaque)->later_ran = true;
}

static void nest_fd(void *opaque)
{
	struct nest *n = opaque;

	eventfd_drain(n->fd);
	n->fd_ran = true;
}

static void nest_outer(void *opaque)
{
	struct nest *n = opaque;
	pthread_t tid;

	ASSERT_OK(-pthread_create(&tid, NULL, schedule_inner, n));
	while (!n->inner_ran)
		ioc_loop_poll(n->loop, true);
	pthread_join(tid, NULL);
	eventfd_kick(n->fd);
	while (!n->fd_ran)
		ioc_loop_poll(n->loop, true);
	/* `later` was drained with us and waits behind us: a nested
	 * iteration runs it. */
	while (!n->later_ran)
		ioc_loop_poll(n->loop, true);
	n->done = true;
}

static void test_nested_poll(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct nest n = { .loop = loop };

	n.outer = ioc_bh_new(loop, nest_outer, &n);
	n.inner = ioc_bh_new(loop, nest_inner, &n);
	n.later = ioc_bh_new(loop, nest_later, &n);
	n.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_OK(ioc_loop_set_fd(loop, n.fd, nest_fd, NULL, NULL, NULL, &n));
	ioc_bh_schedule(n.outer);
	ioc_bh_schedule(n.later);
	POLL_UNTIL(loop, n.done);
	ASSERT_TRUE(n.inner_ran && n.fd_ran && n.later_ran);
	ioc_bh_delete(n.outer);
	ioc_bh_delete(n.inner);
	ioc_bh_delete(n.later);
	ASSERT_OK(ioc_loop_set_fd(loop, n.fd, NULL, NULL, NULL, NULL, NULL));
	close(n.fd);
	ioc_loop_free(loop);
}

/* ---- timers ------------------------------------------------------------- */

struct tctx {
	struct ioc_timer t;
	int id;
	int *log, *n;
	int rearm;
	int64_t deadline_seen;
};

static void timer_cb(void *opaque)
{
	struct tctx *c = opaque;

	c->deadline_seen = ioc_now_ns();
	c->log[(*c->n)++] = c->id;
	if (c->rearm > 0) {
		c->rearm--;
		ioc_timer_arm_in(&c->t, 1000);
	}
}

static void test_timers(void)
{
	enum { N = 64 };
	struct ioc_loop *loop = test_loop_new(NULL);
	static struct tctx tc[N];
	int log[4 * N], n = 0;
	int64_t base = ioc_now_ns() + 2000000; /* 2 ms from now */
	unsigned seed = 12345;

	/* Distinct deadlines in shuffled order. */
	int perm[N];

	for (int i = 0; i < N; i++)
		perm[i] = i;
	for (int i = N - 1; i > 0; i--) {
		int j = (int)((seed = seed * 1103515245 + 12345) >> 16) % (i + 1);
		int x = perm[i];

		perm[i] = perm[j];
		perm[j] = x;
	}
	for (int k = 0; k < N; k++) {
		int i = perm[k];

		tc[i] = (struct tctx){ .id = i, .log = log, .n = &n };
		ioc_timer_init(&tc[i].t, loop, timer_cb, &tc[i]);
		ioc_timer_arm(&tc[i].t, base + (int64_t)i * 10000);
		ASSERT_TRUE(ioc_timer_pending(&tc[i].t));
	}
	/* Cancel every 8th; re-arm #1 to fire last. */
	for (int i = 0; i < N; i += 8)
		ioc_timer_cancel(&tc[i].t);
	ioc_timer_cancel(&tc[0].t); /* twice is fine */
	ioc_timer_arm(&tc[1].t, base + (int64_t)N * 10000);

	POLL_UNTIL(loop, n == N - N / 8);
	ASSERT_EQ(log[n - 1], 1);
	for (int k = 1; k < n - 1; k++)
		ASSERT_LT(log[k - 1] == 1 ? -1 : log[k - 1], log[k]);
	for (int k = 0; k < n; k++) {
		ASSERT_NE(log[k] % 8, 0);
		ASSERT_GE(tc[log[k]].deadline_seen, tc[log[k]].t.deadline);
		ASSERT_FALSE(ioc_timer_pending(&tc[log[k]].t));
	}

	/* A timer that re-arms itself from its callback. */
	n = 0;
	tc[2].rearm = 5;
	ioc_timer_arm_in(&tc[2].t, 0);
	POLL_UNTIL(loop, n == 6);
	ASSERT_FALSE(ioc_timer_pending(&tc[2].t));

	/* Free with timers armed cancels them. */
	ioc_timer_arm_in(&tc[3].t, 1000000000);
	ioc_timer_arm_in(&tc[4].t, 2000000000);
	ioc_loop_free(loop);
	ASSERT_FALSE(ioc_timer_pending(&tc[3].t));
	ASSERT_FALSE(ioc_timer_pending(&tc[4].t));
}

/* The heap stays ordered through many random arms/re-arms/cancels. */
static void test_timer_heap_random(void)
{
	enum { N = 500 };
	struct ioc_loop *loop = test_loop_new(NULL);
	static struct tctx tc[N];
	static int log[N * 2];
	int n = 0;
	unsigned seed = 777;
	int64_t base = ioc_now_ns() + 1000000000; /* far: nothing fires */

	for (int i = 0; i < N; i++) {
		tc[i] = (struct tctx){ .id = i, .log = log, .n = &n };
		ioc_timer_init(&tc[i].t, loop, timer_cb, &tc[i]);
	}
	for (int round = 0; round < 20000; round++) {
		int i = (int)((seed = seed * 1103515245 + 12345) >> 8) % N;

		if ((seed >> 4) % 5 == 0)
			ioc_timer_cancel(&tc[i].t);
		else
			ioc_timer_arm(&tc[i].t,
				      base + (int64_t)((seed >> 3) % 100000));
	}
	/* Bring all armed deadlines to the past keeping their order. */
	int armed = 0;

	for (int i = 0; i < N; i++)
		if (ioc_timer_pending(&tc[i].t)) {
			armed++;
			ioc_timer_arm(&tc[i].t, tc[i].t.deadline - base - 1000000000);
		}
	ASSERT_GT(armed, 0);
	ioc_loop_poll(loop, false);
	ASSERT_EQ(n, armed);
	for (int k = 1; k < n; k++)
		ASSERT_LE(tc[log[k - 1]].t.deadline, tc[log[k]].t.deadline);
	ioc_loop_free(loop);
}

/* ---- cross-thread: stop, notify, call, iothread ----------------------- */

static void *stop_thread(void *arg)
{
	ioc_loop_stop(arg);
	return NULL;
}

static void test_stop_other_thread(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	pthread_t tid;

	for (int i = 0; i < 20; i++) {
		ASSERT_OK(-pthread_create(&tid, NULL, stop_thread, loop));
		ASSERT_EQ(ioc_loop_run(loop), 0); /* returns once stopped */
		pthread_join(tid, NULL);
	}
	/* Stopped before running: returns at once. */
	ioc_loop_stop(loop);
	ASSERT_EQ(ioc_loop_run(loop), 0);
	ioc_loop_free(loop);
}

static void *notify_thread(void *arg)
{
	ioc_loop_notify(arg);
	return NULL;
}

static void test_notify(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	pthread_t tid;

	/* A blocking poll with nothing registered returns after a notify. */
	for (int i = 0; i < 20; i++) {
		ASSERT_OK(-pthread_create(&tid, NULL, notify_thread, loop));
		ioc_loop_poll(loop, true);
		pthread_join(tid, NULL);
	}
	ioc_loop_free(loop);
}

static int call_fn(void *arg)
{
	struct ioc_loop *expect = arg;

	ASSERT_TRUE(ioc_loop_in_thread(expect));
	ASSERT_PTR_EQ(ioc_loop_current(), expect);
	return 42;
}

static void test_iothread(void)
{
	struct ioc_iothread_opts o = { .name = "ioc-test", .cpu = -1 };
	struct ioc_iothread *t;
	struct ioc_loop *loop;
	int r;

	r = ioc_iothread_start(&t, &o);
	if (r < 0 && !strcmp(test_backend(), "io_uring"))
		IOC_SKIP("io_uring unavailable");
	ASSERT_OK(r);
	loop = ioc_iothread_loop(t);
	ASSERT_NOT_NULL(loop);
	ASSERT_FALSE(ioc_loop_in_thread(loop));
	for (int i = 0; i < 100; i++)
		ASSERT_EQ(ioc_iothread_call(t, call_fn, loop), 42);
	ASSERT_EQ(ioc_loop_call(loop, call_fn, loop), 42);
	ioc_iothread_stop(t);

	/* Pinned to CPU 0 and default name. */
	o = (struct ioc_iothread_opts){ .cpu = 0 };
	ASSERT_OK(ioc_iothread_start(&t, &o));
	ASSERT_EQ(ioc_iothread_call(t, call_fn, ioc_iothread_loop(t)), 42);
	ioc_iothread_stop(t);
}

static int self_call(void *arg)
{
	return *(int *)arg + 1;
}

static void test_call_own_thread(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	int x = 6;

	ASSERT_EQ(ioc_loop_call(loop, self_call, &x), 7);
	ioc_loop_free(loop);
}

/* ---- userspace polling ----------------------------------------------------- */

struct pollctx {
	struct ioc_loop *loop;
	int fd;
	atomic_int work;  /* pending work units seen by io_poll */
	int polls, readies, reads;
};

static bool pc_poll(void *opaque)
{
	struct pollctx *c = opaque;

	c->polls++;
	/* Relaxed: same thread or a test thread whose store we just need
	 * to see eventually. */
	return atomic_load_explicit(&c->work, memory_order_relaxed) > 0;
}

static void pc_ready(void *opaque)
{
	struct pollctx *c = opaque;

	c->readies++;
	atomic_store(&c->work, 0);
	eventfd_drain(c->fd);
}

static void pc_read(void *opaque)
{
	struct pollctx *c = opaque;

	c->reads++;
	atomic_store(&c->work, 0);
	eventfd_drain(c->fd);
}

static void nop_timer(void *opaque)
{
	(void)opaque;
}

static void test_poll_handlers(void)
{
	struct ioc_loop_opts o = { .poll_max_ns = 1000000,
				   .poll_idle_ns = 20000000 };
	struct ioc_loop *loop = test_loop_new(&o);
	struct pollctx c = { .loop = loop };
	struct ioc_loop_stats st;

	c.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, pc_read, NULL, pc_poll, pc_ready,
				  &c));
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.polled_handlers, 0); /* not active yet */

	/* fd activity puts it in the polled set. */
	atomic_store(&c.work, 1);
	eventfd_kick(c.fd);
	POLL_UNTIL(loop, c.reads + c.readies == 1);
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.polled_handlers, 1);

	/* Now work is found by polling (the eventfd is written too, so a
	 * backend that cannot poll still gets there). */
	for (int i = 0; i < 50; i++) {
		int before = c.reads + c.readies;

		atomic_store(&c.work, 1);
		eventfd_kick(c.fd);
		POLL_UNTIL(loop, c.reads + c.readies > before);
	}
	ASSERT_GT(c.polls, 0);

	/* Idle past poll_idle_ns: it leaves the polled set.  A 1 ms timer
	 * bounds each blocking iteration. */
	{
		struct ioc_timer t;
		int64_t dl = ioc_now_ns() + 10ll * 1000000000;

		ioc_timer_init(&t, loop, nop_timer, NULL);
		do {
			ASSERT_LT(ioc_now_ns(), dl);
			ioc_timer_arm_in(&t, 1000000);
			ioc_loop_poll(loop, true);
			ioc_loop_get_stats(loop, &st);
		} while (st.polled_handlers != 0);
		ioc_timer_cancel(&t);
	}
	/* Still watched by fd monitoring. */
	{
		int before = c.reads + c.readies;

		eventfd_kick(c.fd);
		POLL_UNTIL(loop, c.reads + c.readies > before);
	}
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, NULL, NULL, NULL, NULL, NULL));
	close(c.fd);
	ioc_loop_free(loop);
}

/*
 * Scalable polling: idle handlers leave the polled set, and then their io_poll is
 * never called again however many there are; an idle loop sleeps.
 */
enum { NIDLE = 1000 };
static int idle_fds[NIDLE];
static unsigned long idle_polls;

static bool idle_poll(void *opaque)
{
	(void)opaque;
	idle_polls++;
	return false;
}

static void idle_read(void *opaque)
{
	eventfd_drain((int)(intptr_t)opaque);
}

static void test_polled_set_scales(void)
{
	struct ioc_loop_opts o = { .poll_idle_ns = 20000000 };
	struct ioc_loop *loop;
	struct ioc_loop_stats st;
	struct pollctx c;
	struct ioc_timer t;
	uint64_t waits;
	int64_t dl;

	loop = test_loop_new(&o);
	for (int i = 0; i < NIDLE; i++) {
		idle_fds[i] = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC); /* ready */
		ASSERT_GE(idle_fds[i], 0);
		ASSERT_OK(ioc_loop_set_fd(loop, idle_fds[i], idle_read, NULL,
					  idle_poll, idle_read,
					  (void *)(intptr_t)idle_fds[i]));
	}
	/* All were active once (a wait reports up to 256 at a time). */
	for (int i = 0; i < 8; i++)
		ioc_loop_poll(loop, false);
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.polled_handlers, NIDLE);

	/* Idle for poll_idle_ns: they all drop out. */
	ioc_timer_init(&t, loop, nop_timer, NULL);
	dl = ioc_now_ns() + 10ll * 1000000000;
	do {
		ASSERT_LT(ioc_now_ns(), dl);
		ioc_timer_arm_in(&t, 1000000);
		ioc_loop_poll(loop, true);
		ioc_loop_get_stats(loop, &st);
	} while (st.polled_handlers != 0);

	/* One active handler: only it is polled. */
	memset(&c, 0, sizeof(c));
	c.loop = loop;
	c.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, pc_read, NULL, pc_poll, pc_ready,
				  &c));
	idle_polls = 0;
	for (int i = 0; i < 200; i++) {
		int before = c.reads + c.readies;

		atomic_store(&c.work, 1);
		eventfd_kick(c.fd);
		POLL_UNTIL(loop, c.reads + c.readies > before);
	}
	ioc_loop_get_stats(loop, &st);
	ASSERT_UEQ(st.polled_handlers, 1);
	ASSERT_UEQ(idle_polls, 0);

	/* Nothing happens: the loop sleeps in the kernel, polling off. */
	ASSERT_OK(ioc_loop_set_fd(loop, c.fd, NULL, NULL, NULL, NULL, NULL));
	close(c.fd);
	waits = st.blocking_waits;
	for (int i = 0; i < 10; i++) {
		ioc_timer_arm_in(&t, 2000000);
		ioc_loop_poll(loop, true);
	}
	ioc_loop_get_stats(loop, &st);
	ASSERT_UGT(st.blocking_waits, waits);
	ASSERT_EQ(st.poll_ns, 0);
	ASSERT_UEQ(idle_polls, 0);
	ioc_timer_cancel(&t);
	for (int i = 0; i < NIDLE; i++)
		close(idle_fds[i]);
	ioc_loop_free(loop);
}

/*
 * A handler without io_poll no longer switches adaptive polling off on
 * epoll/poll: poll rounds check the kernel with a non-blocking wait, so
 * the window grows after short sleeps.  The fd is still dispatched, and
 * with nothing happening the loop shrinks the window to 0 and sleeps.
 */
static int plain_reads;

static void plain_read(void *opaque)
{
	plain_reads++;
	eventfd_drain(*(int *)opaque);
}

static void test_plain_fd_polls(void)
{
	struct ioc_loop_opts o = { .poll_max_ns = 1000000 };
	struct ioc_loop *loop = test_loop_new(&o);
	struct ioc_loop_stats st;
	struct ioc_timer t;
	uint64_t waits;
	int64_t dl;
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ioc_loop_set_fd(loop, fd, plain_read, NULL, NULL, NULL,
				  &fd));
	ioc_timer_init(&t, loop, nop_timer, NULL);
	/* Short sleeps grow the window: the fd is ready before each wait, so
	 * the wait is the syscall alone and every poll round finds it (a
	 * timer's sleep would hang on the scheduler: on a loaded machine, or
	 * under qemu-user, 10 us often sleeps past poll_max_ns).  Liveness
	 * only: a preempted wait just takes another round. */
	dl = ioc_now_ns() + 60ll * 1000000000;
	do {
		ASSERT_LT(ioc_now_ns(), dl);
		eventfd_kick(fd);
		ioc_loop_poll(loop, true);
		ioc_loop_get_stats(loop, &st);
	} while (st.poll_ns == 0);

	plain_reads = 0;
	for (int i = 0; i < 20; i++) {
		eventfd_kick(fd);
		POLL_UNTIL(loop, plain_reads == i + 1);
	}

	/* Idle: long sleeps shrink the window to 0, the loop blocks. */
	ioc_loop_get_stats(loop, &st);
	waits = st.blocking_waits;
	for (int i = 0; i < 20; i++) {
		ioc_timer_arm_in(&t, 2000000);
		ioc_loop_poll(loop, true);
	}
	ioc_loop_get_stats(loop, &st);
	ASSERT_UGT(st.blocking_waits, waits);
	ASSERT_EQ(st.poll_ns, 0);
	ioc_timer_cancel(&t);
	ASSERT_OK(ioc_loop_set_fd(loop, fd, NULL, NULL, NULL, NULL, NULL));
	close(fd);
	ioc_loop_free(loop);
}

IOC_TEST_MAIN(
	IOC_TEST(test_new_free_current),
	IOC_TEST(test_bad_opts),
	IOC_TEST(test_readiness),
	IOC_TEST(test_mask_update),
	IOC_TEST(test_remove_in_callback),
	IOC_TEST(test_many_fds),
	IOC_TEST(test_bh),
	IOC_TEST(test_tasks_fifo),
	IOC_TEST(test_bh_threads),
	IOC_TEST(test_nested_poll),
	IOC_TEST(test_timers),
	IOC_TEST(test_timer_heap_random),
	IOC_TEST(test_stop_other_thread),
	IOC_TEST(test_notify),
	IOC_TEST(test_iothread),
	IOC_TEST(test_call_own_thread),
	IOC_TEST(test_poll_handlers),
	IOC_TEST(test_plain_fd_polls),
	IOC_TEST(test_polled_set_scales),
)
