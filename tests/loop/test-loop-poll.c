/*
 * Adaptive polling's back-off, checked on counters and states only.
 *
 * The events are ours: a helper thread writes the handler's eventfd only
 * once the loop's "sleeps" counter shows it went to sleep, so every poll
 * before that ends empty however fast or slow the machine is; a handler
 * whose io_poll returns true finds work on every poll.  The grow/shrink
 * factors are 1 so that the poll window, once opened, stays open, and the
 * back-off periods are either far longer than any run (it cannot expire
 * during the test) or 1 ns (it has expired by the next iteration).  The
 * loop spins between poll rounds instead of yielding, so every poll's time
 * counts as its cost whatever else the machine runs.
 */
#include <sched.h>
#include <unistd.h>

#include "loop-test.h"

#define FOREVER_NS (1000ll * 1000000000) /* a back-off no test outlives */
/* A sleep priced so high that any window with a hit pays for itself,
 * however long a preempted poll takes: where a test wants hits never to
 * back off, only the counting can make it fail, not the machine's load. */
#define PRICELESS_WAKE_NS (1000ll * 1000000000)

struct waker {
	struct ioc_loop *loop;
	int efd;
	atomic_bool stop;
	bool hit;       /* io_poll finds work (loop thread only) */
	unsigned reads; /* io_read calls (loop thread only) */
};

static bool w_poll(void *opaque)
{
	struct waker *w = opaque;

	return w->hit;
}

static void w_read(void *opaque)
{
	struct waker *w = opaque;

	eventfd_drain(w->efd);
	w->reads++;
}

/* Write the eventfd once per sleep of the loop: readiness always comes
 * after the poll window has ended empty. */
static void *waker_thread(void *arg)
{
	struct waker *w = arg;
	struct ioc_loop_poll_stats ps;
	uint64_t seen = 0;

	/* Relaxed: the flag only ends the loop; join orders the rest. */
	while (!atomic_load_explicit(&w->stop, memory_order_relaxed)) {
		ioc_loop_get_poll_stats(w->loop, &ps);
		if (ps.sleeps == seen) {
			sched_yield();
			continue;
		}
		seen = ps.sleeps;
		eventfd_kick(w->efd);
	}
	return NULL;
}

static void waker_start(struct waker *w, struct ioc_loop *loop,
			pthread_t *th)
{
	memset(w, 0, sizeof(*w));
	w->loop = loop;
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_GE(w->efd, 0);
	atomic_init(&w->stop, false);
	ASSERT_OK(ioc_loop_set_fd(loop, w->efd, w_read, NULL, w_poll, NULL, w));
	ASSERT_OK(pthread_create(th, NULL, waker_thread, w));
}

static void waker_stop(struct waker *w, pthread_t th)
{
	atomic_store_explicit(&w->stop, true, memory_order_relaxed);
	ASSERT_OK(pthread_join(th, NULL));
	ASSERT_OK(ioc_loop_set_fd(w->loop, w->efd, NULL, NULL, NULL, NULL, NULL));
	close(w->efd);
}

/* Iterate until at least one back-off was entered (bounded). */
static void run_until_backoff(struct ioc_loop *loop,
			      struct ioc_loop_poll_stats *ps)
{
	for (int i = 0; i < 100000; i++) {
		ioc_loop_poll(loop, true);
		ioc_loop_get_poll_stats(loop, ps);
		if (ps->backoffs)
			return;
	}
	ASSERT_UGT(ps->backoffs, 0);
}

static struct ioc_loop_opts fixed_window(int64_t backoff_ns)
{
	return (struct ioc_loop_opts){
		.poll_max_ns = 1000000000, /* never "a long sleep" */
		.poll_grow = 1, .poll_shrink = 1,
		.poll_backoff_min_ns = backoff_ns,
		.poll_backoff_max_ns = backoff_ns,
		/* Spin, not sched_yield(): a yield that ran another thread
		 * (the waker, or anything else on a busy machine) is not
		 * counted as polling cost, so with yields a loaded machine
		 * could make every poll look free and no back-off happen. */
		.poll_spin = true,
	};
}

/* Polls that always end empty back off, and while backing off the loop
 * spends no more time polling. */
static void test_empty_polls_back_off(void)
{
	struct ioc_loop_opts o = fixed_window(FOREVER_NS);
	struct ioc_loop *loop = test_loop_new(&o);
	struct ioc_loop_poll_stats ps, ps2;
	struct waker w;
	pthread_t th;

	waker_start(&w, loop, &th);
	run_until_backoff(loop, &ps);
	ASSERT_UEQ(ps.backoffs, 1);
	ASSERT_UEQ(ps.polls_hit, 0);
	ASSERT_UEQ(ps.polls_empty, ps.polls);
	ASSERT_UGE(ps.polls, 1);
	ASSERT_UGT(ps.poll_ns_total, 0);
	ASSERT_TRUE(ps.backing_off);
	ASSERT_EQ(ps.poll_ns, 0);

	unsigned reads = w.reads;

	for (int i = 0; i < 200; i++)
		ioc_loop_poll(loop, true);
	ioc_loop_get_poll_stats(loop, &ps2);
	ASSERT_UGE(w.reads, reads + 100);    /* the loop did work meanwhile */
	ASSERT_UEQ(ps2.polls, ps.polls);     /* ... without polling */
	ASSERT_UEQ(ps2.poll_ns_total, ps.poll_ns_total);
	ASSERT_UEQ(ps2.backoffs, 1);
	ASSERT_TRUE(ps2.backing_off);

	waker_stop(&w, th);
	ioc_loop_free(loop);
}

/* After a back-off the loop probes; when polling pays again it stays on. */
static void test_backoff_probe_comes_back(void)
{
	struct ioc_loop_opts o = fixed_window(1);
	struct ioc_loop *loop;

	o.poll_wake_cost_ns = PRICELESS_WAKE_NS; /* empty windows still lose */
	loop = test_loop_new(&o);
	struct ioc_loop_poll_stats ps, ps2;
	struct waker w;
	pthread_t th;

	waker_start(&w, loop, &th);
	run_until_backoff(loop, &ps);
	w.hit = true; /* from now on every poll finds work */
	for (int i = 0; i < 1000; i++)
		ioc_loop_poll(loop, true);
	ioc_loop_get_poll_stats(loop, &ps2);
	ASSERT_UGE(ps2.polls, ps.polls + 900);
	ASSERT_UGE(ps2.polls_hit, 900);
	ASSERT_UEQ(ps2.backoffs, ps.backoffs);
	ASSERT_FALSE(ps2.backing_off);
	ASSERT_GT(ps2.poll_ns, 0);

	waker_stop(&w, th);
	ioc_loop_free(loop);
}

static bool always(void *opaque)
{
	(void)opaque;
	return true;
}

/* A poll-only handler that always has work: open the window (a notify
 * makes the first iteration's wait short), then iterate. */
static struct ioc_loop *hit_loop(struct ioc_loop_opts *o, int *fd)
{
	struct ioc_loop *loop = test_loop_new(o);
	struct ioc_loop_poll_stats ps;

	/* Any fd number will do for a poll-only handler. */
	*fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_GE(*fd, 0);
	ASSERT_OK(ioc_loop_set_fd(loop, *fd, NULL, NULL, always, NULL, NULL));
	for (int i = 0; i < 1000; i++) {
		ioc_loop_notify(loop);
		ioc_loop_poll(loop, true);
		ioc_loop_get_poll_stats(loop, &ps);
		if (ps.poll_ns > 0)
			break;
	}
	ASSERT_GT(ps.poll_ns, 0);
	return loop;
}

/* Polls that find work at once never back off. */
static void test_hits_never_back_off(void)
{
	struct ioc_loop_opts o = fixed_window(FOREVER_NS);
	struct ioc_loop_poll_stats ps;
	int fd;
	struct ioc_loop *loop;

	o.poll_wake_cost_ns = PRICELESS_WAKE_NS;
	loop = hit_loop(&o, &fd);
	for (int i = 0; i < 2000; i++)
		ioc_loop_poll(loop, true);
	ioc_loop_get_poll_stats(loop, &ps);
	ASSERT_UGE(ps.polls_hit, 2000);
	ASSERT_UEQ(ps.polls_empty, 0);
	ASSERT_UEQ(ps.backoffs, 0);
	ASSERT_FALSE(ps.backing_off);
	ioc_loop_free(loop);
	close(fd);
}

/* Hits that cost more than a sleep would have (here: any hit, against a
 * sleep priced at 1 ns) back off too; with no cost given, never. */
static void test_costly_hits_back_off(void)
{
	struct ioc_loop_opts o = fixed_window(FOREVER_NS);
	struct ioc_loop *loop;
	struct ioc_loop_poll_stats ps, ps2;
	int fd, i;

	o.poll_wake_cost_ns = 1;
	loop = hit_loop(&o, &fd);
	/* The notify keeps a backed-off loop, which has nothing else to
	 * wake it, from sleeping for good. */
	for (i = 0; i < 100000; i++) {
		ioc_loop_notify(loop);
		ioc_loop_poll(loop, true);
		ioc_loop_get_poll_stats(loop, &ps);
		if (ps.backoffs)
			break;
	}
	ASSERT_UEQ(ps.backoffs, 1);
	ASSERT_UEQ(ps.polls_empty, 0);
	ASSERT_TRUE(ps.backing_off);
	for (i = 0; i < 200; i++) {
		ioc_loop_notify(loop);
		ioc_loop_poll(loop, true);
	}
	ioc_loop_get_poll_stats(loop, &ps2);
	ASSERT_UEQ(ps2.polls, ps.polls);
	ASSERT_UEQ(ps2.backoffs, 1);
	ioc_loop_free(loop);
	close(fd);

	o.poll_wake_cost_ns = -1; /* the policy off */
	loop = hit_loop(&o, &fd);
	for (i = 0; i < 1000; i++)
		ioc_loop_poll(loop, true);
	ioc_loop_get_poll_stats(loop, &ps);
	ASSERT_UEQ(ps.backoffs, 0);
	ASSERT_UGE(ps.polls_hit, 1000);
	ioc_loop_free(loop);
	close(fd);
}

IOC_TEST_MAIN(
	IOC_TEST(test_empty_polls_back_off),
	IOC_TEST(test_backoff_probe_comes_back),
	IOC_TEST(test_hits_never_back_off),
	IOC_TEST(test_costly_hits_back_off),
)
