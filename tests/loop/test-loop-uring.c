/*
 * io_uring operations on the loop (ioc_loop_get_sqe) on every backend, the
 * multishot (edge) handler path, and the clean fallback when io_uring_setup
 * is denied (a seccomp filter in a child process).
 */
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <liburing.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "loop-test.h"

struct nop {
	struct ioc_uring_op op;
	int *done;
	int res;
};

static void nop_cb(struct ioc_uring_op *op, int res, uint32_t flags)
{
	struct nop *n = ioc_container_of(op, struct nop, op);

	(void)flags;
	n->res = res;
	(*n->done)++;
}

static struct ioc_loop *uring_loop(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);

	if (!ioc_loop_has_uring(loop)) {
		ioc_loop_free(loop);
		IOC_SKIP("io_uring unavailable");
	}
	return loop;
}

static void test_nops(void)
{
	enum { N = 1000 }; /* more than the SQ holds */
	struct ioc_loop *loop = uring_loop();
	static struct nop nops[N];
	struct ioc_loop_stats st;
	int done = 0;

	for (int i = 0; i < N; i++) {
		struct io_uring_sqe *sqe;

		nops[i] = (struct nop){ .op.cb = nop_cb, .done = &done, .res = -1 };
		sqe = ioc_loop_get_sqe(loop, &nops[i].op);
		ASSERT_NOT_NULL(sqe);
		io_uring_prep_nop(sqe);
	}
	POLL_UNTIL(loop, done == N);
	for (int i = 0; i < N; i++)
		ASSERT_EQ(nops[i].res, 0);
	ioc_loop_get_stats(loop, &st);
	ASSERT_TRUE(st.has_uring);
	ASSERT_EQ(st.uring_private, strcmp(st.backend, "io_uring") != 0);
	ioc_loop_free(loop);
}

/* A read on a pipe through the ring, the data written from another op's
 * callback: submissions from callbacks work and are batched. */
struct rw {
	struct ioc_uring_op op;
	struct ioc_loop *loop;
	int fd;
	char buf[16];
	int res, calls;
};

static void read_cb(struct ioc_uring_op *op, int res, uint32_t flags)
{
	struct rw *r = ioc_container_of(op, struct rw, op);

	(void)flags;
	r->res = res;
	r->calls++;
}

static void write_cb(struct ioc_uring_op *op, int res, uint32_t flags)
{
	struct rw *w = ioc_container_of(op, struct rw, op);

	(void)flags;
	w->res = res;
	w->calls++;
}

static void test_pipe_read(void)
{
	struct ioc_loop *loop = uring_loop();
	struct rw r = { .op.cb = read_cb, .loop = loop };
	struct rw w = { .op.cb = write_cb, .loop = loop };
	struct io_uring_sqe *sqe;
	int p[2];

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	r.fd = p[0];
	w.fd = p[1];
	sqe = ioc_loop_get_sqe(loop, &r.op);
	ASSERT_NOT_NULL(sqe);
	io_uring_prep_read(sqe, r.fd, r.buf, sizeof(r.buf), 0);
	/* Not submitted before the iteration ends: nothing completes yet. */
	memcpy(w.buf, "hello", 5);
	sqe = ioc_loop_get_sqe(loop, &w.op);
	io_uring_prep_write(sqe, w.fd, w.buf, 5, 0);
	ASSERT_OK(ioc_loop_flush_sqes(loop));
	POLL_UNTIL(loop, r.calls == 1 && w.calls == 1);
	ASSERT_EQ(w.res, 5);
	ASSERT_EQ(r.res, 5);
	ASSERT_MEM_EQ(r.buf, "hello", 5);
	close(p[0]);
	close(p[1]);
	ioc_loop_free(loop);
}

/* Edge handlers (multishot poll on io_uring): every write is seen. */
static int edge_reads;
static void edge_read(void *opaque)
{
	int fd = (int)(intptr_t)opaque;

	edge_reads += (int)eventfd_drain(fd);
}

static void test_edge_handler(void)
{
	struct ioc_loop *loop = test_loop_new(NULL);
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	ASSERT_EQ(ioc_loop_set_fd_edge(loop, fd, true), -ENOENT);
	ASSERT_OK(ioc_loop_set_fd(loop, fd, edge_read, NULL, NULL, NULL,
				  (void *)(intptr_t)fd));
	ASSERT_OK(ioc_loop_set_fd_edge(loop, fd, true));
	edge_reads = 0;
	for (int i = 1; i <= 200; i++) {
		eventfd_kick(fd);
		POLL_UNTIL(loop, edge_reads == i);
	}
	/* Switch the mask while armed (cancel + re-arm path). */
	ASSERT_OK(ioc_loop_set_fd(loop, fd, edge_read, edge_read, NULL, NULL,
				  (void *)(intptr_t)fd));
	ioc_loop_poll(loop, false);
	ASSERT_OK(ioc_loop_set_fd(loop, fd, edge_read, NULL, NULL, NULL,
				  (void *)(intptr_t)fd));
	eventfd_kick(fd);
	POLL_UNTIL(loop, edge_reads == 201);
	ASSERT_OK(ioc_loop_set_fd(loop, fd, NULL, NULL, NULL, NULL, NULL));
	ioc_loop_poll(loop, false);
	close(fd);
	ioc_loop_free(loop);
}

/* Cross-loop BH ping-pong with polling off: every round trip sleeps and
 * is woken by the other loop's owed eventfd write. */
struct pingpong {
	struct ioc_bh *bh;
	struct pingpong *peer;
	int count, limit;
};

static void pp_cb(void *opaque)
{
	struct pingpong *p = opaque;

	if (++p->count < p->limit)
		ioc_bh_schedule(p->peer->bh);
}

static struct pingpong pp_b;
static int make_b(void *arg)
{
	pp_b.bh = ioc_bh_new(ioc_loop_current(), pp_cb, &pp_b);
	(void)arg;
	return 0;
}

static int get_b_stats(void *arg)
{
	ioc_loop_get_stats(ioc_loop_current(), arg);
	ioc_bh_delete(pp_b.bh);
	return 0;
}

static void test_cross_loop_wakeups(void)
{
	struct ioc_iothread_opts o = { .cpu = -1, .loop.poll_max_ns = -1 };
	struct ioc_loop_opts lo = o.loop;
	struct ioc_iothread *t;
	struct ioc_loop *a;
	struct ioc_loop_stats sa, sb;
	struct pingpong pp_a = { 0 };
	int r;

	r = ioc_loop_new(&a, &lo);
	if (r < 0 && !strcmp(test_backend(), "io_uring"))
		IOC_SKIP("io_uring unavailable");
	ASSERT_OK(r);
	ASSERT_OK(ioc_iothread_start(&t, &o));
	pp_b = (struct pingpong){ .limit = INT32_MAX, .peer = &pp_a };
	pp_a = (struct pingpong){ .limit = 2000, .peer = &pp_b };
	ASSERT_OK(ioc_iothread_call(t, make_b, NULL));
	pp_a.bh = ioc_bh_new(a, pp_cb, &pp_a);
	ioc_bh_schedule(pp_b.bh);
	/* a stops the exchange at its limit. */
	while (pp_a.count < pp_a.limit)
		ioc_loop_poll(a, true);
	ASSERT_OK(ioc_iothread_call(t, get_b_stats, &sb));
	ioc_loop_get_stats(a, &sa);
	ioc_test_diag("eventfd wakeups of a %llu, of b %llu",
		      (unsigned long long)sa.notifies,
		      (unsigned long long)sb.notifies);
	ASSERT_EQ(pp_b.count, pp_a.limit);
	ASSERT_UGT(sa.notifies + sb.notifies, 0);
	ioc_iothread_stop(t);
	ioc_bh_delete(pp_a.bh);
	ioc_loop_free(a);
}

/* io_uring_setup denied by seccomp: the loop falls back and says so. */
static int denied_child(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = IOC_ARRAY_SIZE(f), .filter = f };
	struct ioc_loop_opts o = { .fdmon = IOC_FDMON_IO_URING };
	struct ioc_loop *loop;
	struct ioc_loop_stats st;
	int fd;

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return 77;
	if (ioc_loop_new(&loop, &o) != -EPERM)
		return 1;
	ioc__loop_auto_fdmon = IOC_FDMON_AUTO;
	if (ioc_loop_new(&loop, NULL))
		return 2;
	ioc_loop_get_stats(loop, &st);
	if (strcmp(st.backend, "epoll") || !st.uring_denied ||
	    st.uring_error != -EPERM)
		return 3;
	if (ioc_loop_has_uring(loop) || ioc_loop_get_sqe(loop, NULL))
		return 4;
	/* Still a working loop. */
	fd = eventfd(1, EFD_NONBLOCK);
	edge_reads = 0;
	if (ioc_loop_set_fd(loop, fd, edge_read, NULL, NULL, NULL,
			    (void *)(intptr_t)fd))
		return 5;
	while (!edge_reads)
		ioc_loop_poll(loop, true);
	ioc_loop_set_fd(loop, fd, NULL, NULL, NULL, NULL, NULL);
	ioc_loop_free(loop);
	return 0;
}

static void test_uring_denied(void)
{
	pid_t pid;
	int status;

	fflush(stdout);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0)
		_exit(denied_child());
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	ASSERT_TRUE(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		IOC_SKIP("seccomp unavailable");
	ASSERT_EQ(WEXITSTATUS(status), 0);
}

IOC_TEST_MAIN(
	IOC_TEST(test_nops),
	IOC_TEST(test_pipe_read),
	IOC_TEST(test_edge_handler),
	IOC_TEST(test_cross_loop_wakeups),
	IOC_TEST(test_uring_denied),
)
