/*
 * Cross-thread wakeup stress (meant for TSan too): producers post tasks and
 * schedule BHs to a loop running on an iothread and wait for each to be
 * acknowledged.  The loop sleeps between items (polling disabled in one
 * case), so every item exercises the sleep/wake handshake.  A lost wakeup
 * leaves an item unacknowledged: the producer's bounded wait times out and
 * the count of sent vs acknowledged items fails the test.  Each case runs
 * for a time (1 s, 0.3 s for the hammer) that IOC_TEST_SCALE stretches,
 * as make check-aarch64 does under emulation.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#include "loop-test.h"

enum { PRODUCERS = 3 };

struct producer {
	pthread_t tid;
	struct ioc_loop *loop;
	struct ioc_task task;
	struct ioc_bh *bh;
	atomic_int acked;        /* set by the loop, cleared by the producer */
	unsigned long sent, got, lost;
	int64_t deadline;
	bool use_notify;
};

static void ack(struct producer *p)
{
	/* Release: pairs with the acquire load in wait_ack(). */
	atomic_store_explicit(&p->acked, 1, memory_order_release);
	syscall(SYS_futex, &p->acked, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void task_fn(struct ioc_task *t)
{
	ack(ioc_container_of(t, struct producer, task));
}

static void bh_fn(void *opaque)
{
	ack(opaque);
}

/* Wait up to 20 s for the ack (a loaded sanitizer run is slow, a lost
 * wakeup is forever); false means the wakeup was lost. */
static bool wait_ack(struct producer *p)
{
	int64_t end = ioc_now_ns() + 20ll * 1000000000;

	while (!atomic_load_explicit(&p->acked, memory_order_acquire)) {
		int64_t left = end - ioc_now_ns();
		struct timespec ts;

		if (left <= 0)
			return false;
		ts.tv_sec = left / 1000000000;
		ts.tv_nsec = left % 1000000000;
		syscall(SYS_futex, &p->acked, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
	}
	return true;
}

static void *producer_main(void *arg)
{
	struct producer *p = arg;

	for (unsigned long i = 0; ioc_now_ns() < p->deadline; i++) {
		atomic_store_explicit(&p->acked, 0, memory_order_relaxed);
		if (i & 1)
			ioc_bh_schedule(p->bh);
		else
			ioc_loop_post(p->loop, &p->task);
		if (p->use_notify && (i & 3) == 0)
			ioc_loop_notify(p->loop);
		p->sent++;
		if (!wait_ack(p)) {
			p->lost++;
			break;
		}
		p->got++;
	}
	return NULL;
}

static int make_bhs(void *arg)
{
	struct producer *ps = arg;

	for (int i = 0; i < PRODUCERS; i++)
		ps[i].bh = ioc_bh_new(ps[i].loop, bh_fn, &ps[i]);
	return 0;
}

static int delete_bhs(void *arg)
{
	struct producer *ps = arg;

	for (int i = 0; i < PRODUCERS; i++)
		ioc_bh_delete(ps[i].bh);
	return 0;
}

static int get_stats(void *arg)
{
	ioc_loop_get_stats(ioc_loop_current(), arg);
	return 0;
}

static void run_stress(int64_t poll_max_ns, unsigned long ms)
{
	struct ioc_iothread_opts o = { .cpu = -1,
				       .loop.poll_max_ns = poll_max_ns };
	struct producer ps[PRODUCERS];
	struct ioc_iothread *t;
	struct ioc_loop *loop;
	struct ioc_loop_stats st;
	unsigned long sent = 0, got = 0, lost = 0;
	int r;

	r = ioc_iothread_start(&t, &o);
	if (r < 0 && !strcmp(test_backend(), "io_uring"))
		IOC_SKIP("io_uring unavailable");
	ASSERT_OK(r);
	loop = ioc_iothread_loop(t);
	memset(ps, 0, sizeof(ps));
	for (int i = 0; i < PRODUCERS; i++) {
		ps[i].loop = loop;
		ps[i].task.fn = task_fn;
		ps[i].deadline = ioc_now_ns() + (int64_t)ms * 1000000;
		ps[i].use_notify = i == 0;
		atomic_init(&ps[i].acked, 0);
	}
	ASSERT_EQ(ioc_iothread_call(t, make_bhs, ps), 0);
	for (int i = 0; i < PRODUCERS; i++)
		ASSERT_OK(-pthread_create(&ps[i].tid, NULL, producer_main, &ps[i]));
	for (int i = 0; i < PRODUCERS; i++) {
		pthread_join(ps[i].tid, NULL);
		sent += ps[i].sent;
		got += ps[i].got;
		lost += ps[i].lost;
	}
	ASSERT_EQ(ioc_iothread_call(t, delete_bhs, ps), 0);
	ASSERT_EQ(ioc_iothread_call(t, get_stats, &st), 0);
	ioc_test_diag("backend %s poll_max %lld: %lu round trips, %lu lost, "
		      "%llu iterations, %llu blocking waits, %llu notifies",
		      st.backend, (long long)poll_max_ns, got, lost,
		      (unsigned long long)st.iterations,
		      (unsigned long long)st.blocking_waits,
		      (unsigned long long)st.notifies);
	ioc_iothread_stop(t);
	ASSERT_UEQ(lost, 0);
	ASSERT_UEQ(got, sent);
	ASSERT_UGT(got, 0);
}

static void test_wakeups_sleeping(void)
{
	run_stress(-1, ioc_test_scaled(1000));
}

static void test_wakeups_polling(void)
{
	run_stress(0, ioc_test_scaled(1000));
}

/* Many threads hammer one BH while the loop runs it: every burst of
 * schedules is followed by at least one run, and none after the last. */
struct hammer {
	struct ioc_bh *bh;
	int64_t deadline;
	atomic_ulong scheduled;
};

static atomic_ulong hammer_runs;

static void hammer_cb(void *opaque)
{
	(void)opaque;
	atomic_fetch_add_explicit(&hammer_runs, 1, memory_order_relaxed);
}

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;

	while (ioc_now_ns() < h->deadline) {
		ioc_bh_schedule(h->bh);
		atomic_fetch_add_explicit(&h->scheduled, 1, memory_order_relaxed);
	}
	return NULL;
}

static void test_bh_hammer(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	struct hammer h = { 0 };
	pthread_t tids[4];
	unsigned long runs;

	h.bh = ioc_bh_new(loop, hammer_cb, NULL);
	h.deadline = ioc_now_ns() + (int64_t)ioc_test_scaled(300) * 1000000;
	atomic_store(&hammer_runs, 0);
	for (int i = 0; i < 4; i++)
		ASSERT_OK(-pthread_create(&tids[i], NULL, hammer_main, &h));
	while (ioc_now_ns() < h.deadline)
		ioc_loop_poll(loop, false);
	for (int i = 0; i < 4; i++)
		pthread_join(tids[i], NULL);
	/* Everything scheduled before the joins runs exactly once more at
	 * most: drain, then nothing is pending. */
	ioc_loop_poll(loop, false);
	runs = atomic_load(&hammer_runs);
	ASSERT_UGT(runs, 0);
	ASSERT_ULE(runs, atomic_load(&h.scheduled));
	ASSERT_FALSE(ioc_loop_poll(loop, false));
	ASSERT_UEQ(atomic_load(&hammer_runs), runs);
	ioc_bh_delete(h.bh);
	ioc_loop_free(loop);
}

IOC_TEST_MAIN(
	IOC_TEST(test_wakeups_sleeping),
	IOC_TEST(test_wakeups_polling),
	IOC_TEST(test_bh_hammer),
)
