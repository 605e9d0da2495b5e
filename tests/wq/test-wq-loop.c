/* Completions delivered on an event loop (opts.loop + done callback). */
#include <errno.h>
#include <stdatomic.h>

#include "iocore/loop.h"
#include "iocore/wq.h"
#include "tap.h"

struct tjob {
	struct ioc_wq_job job;
	uint64_t id;
	unsigned work;
	_Atomic unsigned runs;
};

struct ctx {
	struct ioc_wq *wq;
	struct tjob *jobs;
	uint64_t njobs, submitted, done, next_expected;
	bool in_order, order_ok, free_in_callback;
};

static void tjob_fn(struct ioc_wq_job *job)
{
	struct tjob *t = ioc_container_of(job, struct tjob, job);
	volatile uint64_t x = t->id;

	for (unsigned i = 0; i < t->work; i++)
		x = x * 3 + 1;
	atomic_fetch_add_explicit(&t->runs, 1, memory_order_relaxed);
}

static void submit_more(struct ctx *c)
{
	while (c->submitted < c->njobs) {
		struct tjob *t = &c->jobs[c->submitted];

		t->job.fn = tjob_fn;
		t->id = c->submitted;
		t->work = (unsigned)(t->id % 13) * 50;
		if (ioc_wq_submit(c->wq, &t->job) == -EAGAIN)
			break;
		c->submitted++;
	}
}

static void on_done(struct ioc_wq_job *job, void *opaque)
{
	struct ctx *c = opaque;
	struct tjob *t = ioc_container_of(job, struct tjob, job);

	if (atomic_load_explicit(&t->runs, memory_order_relaxed) != 1)
		c->order_ok = false;
	if (c->in_order && t->id != c->next_expected)
		c->order_ok = false;
	c->next_expected++;
	c->done++;
	if (c->free_in_callback && c->done == c->njobs / 2) {
		ioc_wq_free(c->wq);  /* from inside the drain: deferred free */
		c->wq = NULL;
		return;
	}
	if (c->wq)
		submit_more(c);
}

static void run(bool in_order, enum ioc_wq_policy policy)
{
	struct ioc_loop *loop;
	struct ctx c = { .in_order = in_order, .order_ok = true };
	int64_t deadline = ioc_now_ns() + 3000 * 1000000ll;

	c.njobs = ioc_test_scaled(200000);
	c.jobs = calloc(c.njobs, sizeof(*c.jobs));
	ASSERT_NOT_NULL(c.jobs);
	ASSERT_OK(ioc_loop_new(&loop, NULL));

	struct ioc_wq_opts o = { .workers = 2, .ring_size = 32, .policy = policy,
				 .in_order = in_order, .loop = loop,
				 .done = on_done, .done_opaque = &c };
	ASSERT_OK(ioc_wq_new(&c.wq, &o));
	submit_more(&c);
	while (c.done < c.submitted) {
		ioc_loop_poll(loop, true);
		if (ioc_now_ns() > deadline)
			c.njobs = c.submitted;  /* stop submitting, drain */
	}
	ASSERT_TRUE(c.order_ok);
	ASSERT_UEQ(c.done, c.submitted);
	ASSERT_UEQ(ioc_wq_in_flight(c.wq), 0);
	ioc_test_diag("%" PRIu64 " jobs through the loop", c.done);
	ioc_wq_free(c.wq);
	ioc_loop_free(loop);
	free(c.jobs);
}

static void test_loop_unordered(void) { run(false, IOC_WQ_FILL); }
static void test_loop_in_order(void) { run(true, IOC_WQ_ROUND_ROBIN); }

static void test_loop_requires_done(void)
{
	struct ioc_loop *loop;
	struct ioc_wq *wq;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	struct ioc_wq_opts o = { .workers = 1, .loop = loop };
	ASSERT_EQ(ioc_wq_new(&wq, &o), -EINVAL);
	ioc_loop_free(loop);
}

/* Free from inside a done callback, and free while a notification is
 * still queued on the loop: the task must not touch the freed wq (ASan). */
static void test_loop_free_paths(void)
{
	struct ioc_loop *loop;
	struct ctx c = { .order_ok = true, .free_in_callback = true };
	unsigned rounds = (unsigned)ioc_test_scaled(20);

	c.njobs = 2000;
	c.jobs = calloc(c.njobs, sizeof(*c.jobs));
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	struct ioc_wq_opts o = { .workers = 2, .ring_size = 64, .loop = loop,
				 .done = on_done, .done_opaque = &c };
	ASSERT_OK(ioc_wq_new(&c.wq, &o));
	submit_more(&c);
	while (c.wq)
		ioc_loop_poll(loop, true);
	ASSERT_UGE(c.done, c.njobs / 2);

	/* Queued notification outlives the wq. */
	c.free_in_callback = false;
	for (unsigned r = 0; r < rounds; r++) {
		struct tjob t = { .job.fn = tjob_fn };

		ASSERT_OK(ioc_wq_new(&c.wq, &o));
		ASSERT_OK(ioc_wq_submit(c.wq, &t.job));
		/* free joins the worker after it ran the job and posted. */
		ioc_wq_free(c.wq);
		c.wq = NULL;
		ASSERT_EQ(atomic_load(&t.runs), 1);
		/* Run the orphaned task (if any); it frees itself. */
		while (ioc_loop_poll(loop, false))
			;
	}
	ioc_loop_free(loop);
	free(c.jobs);
}

IOC_TEST_MAIN(
	IOC_TEST(test_loop_requires_done),
	IOC_TEST(test_loop_unordered),
	IOC_TEST(test_loop_in_order),
	IOC_TEST(test_loop_free_paths),
)
