/*
 * I/O threads: a named, optionally pinned thread that creates, runs and
 * finally frees its own loop (so the loop's ring, registered ring fd and
 * thread-local current loop all belong to that thread).
 *
 * Stop: ioc_loop_stop(), join, then free the loop on the stopping thread
 * (ioc_loop_stop() may still touch the loop after run has returned).
 *
 * Start handshake: the creator waits on a mutex/condvar until the thread
 * has created its loop (or failed) and published the result; the thread
 * sets `started` under the mutex, so the wait cannot miss it.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "loop-int.h"

struct ioc_iothread {
	pthread_t tid;
	struct ioc_loop *loop;
	struct ioc_iothread_opts opts;
	char name[16];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool started;
	int start_err;
};

static void *iothread_main(void *arg)
{
	struct ioc_iothread *t = arg;
	struct ioc_loop *loop = NULL;
	int r = 0;

	pthread_setname_np(pthread_self(), t->name);
	if (t->opts.cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(t->opts.cpu, &set);
		r = -pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	if (r == 0)
		r = ioc_loop_new(&loop, &t->opts.loop);
	if (r == 0)
		ioc_loop_set_current(loop);

	pthread_mutex_lock(&t->lock);
	t->loop = loop;
	t->start_err = r;
	t->started = true;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	if (r < 0)
		return NULL;

	ioc_loop_run(loop);
	/* The loop is freed by ioc_iothread_stop() after the join: the
	 * stopping thread may still be inside ioc_loop_stop() (touching the
	 * wakeup fields) when run returns here.  What belongs to this thread
	 * goes now: the higher layers' per-loop state (their free functions
	 * expect the loop thread) and the registered ring fd. */
	ioc__loop_free_exts(loop);
	ioc__loop_thread_exit(loop);
	return NULL;
}

int ioc_iothread_start(struct ioc_iothread **out,
		       const struct ioc_iothread_opts *opts)
{
	struct ioc_iothread *t = calloc(1, sizeof(*t));
	int r;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	if (opts) {
		t->opts = *opts;
	} else {
		t->opts.cpu = -1;
	}
	snprintf(t->name, sizeof(t->name), "%s",
		 t->opts.name ? t->opts.name : "ioc-io");
	t->opts.name = t->name;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	r = -pthread_create(&t->tid, NULL, iothread_main, t);
	if (r < 0)
		goto fail;
	pthread_mutex_lock(&t->lock);
	while (!t->started)
		pthread_cond_wait(&t->cond, &t->lock);
	pthread_mutex_unlock(&t->lock);
	r = t->start_err;
	if (r < 0) {
		pthread_join(t->tid, NULL);
		goto fail;
	}
	*out = t;
	return 0;
fail:
	pthread_cond_destroy(&t->cond);
	pthread_mutex_destroy(&t->lock);
	free(t);
	return r;
}

struct ioc_loop *ioc_iothread_loop(struct ioc_iothread *t)
{
	return t->loop;
}

int ioc_iothread_call(struct ioc_iothread *t, int (*fn)(void *arg), void *arg)
{
	return ioc_loop_call(t->loop, fn, arg);
}

void ioc_iothread_stop(struct ioc_iothread *t)
{
	if (!t)
		return;
	ioc_loop_stop(t->loop);
	pthread_join(t->tid, NULL);
	ioc_loop_free(t->loop);
	pthread_cond_destroy(&t->cond);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
