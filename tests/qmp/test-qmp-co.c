/*
 * QMP commands that yield (struct ioc__qmp_cmd's co): the loop serves
 * meanwhile, no client's command runs beside one, replies keep their
 * order, a client that goes away meanwhile is freed at the command's end
 * (ASan would see a use after free), and ioc__qmp_free() waits for it.
 *
 * "park" yields until the test enters it again (a cluster call that does
 * not answer); "pooled" waits on the loop's thread pool for a job that
 * blocks on an eventfd the test writes; "count" answers at once and says
 * whether a park was in progress when it ran.
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "iocore/co.h"
#include "iocore/loop.h"
#include "iocore/pool.h"
#include "qmp/qmp.h"
#include "tap.h"

static struct ioc_co *parked;
static bool parking;
static int counted;
static int block_fd = -1;

static json_t *ioc_coroutine_fn cmd_park(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	(void)ctx, (void)args, (void)err;
	parking = true;
	parked = ioc_co_self();
	ioc_co_yield();
	parked = NULL;
	parking = false;
	return json_pack("{s:b}", "parked", 1);
}

static int64_t block_fn(void *arg)
{
	uint64_t v;

	(void)arg;
	return read(block_fd, &v, sizeof(v)) == sizeof(v) ? 7 : -errno;
}

static json_t *ioc_coroutine_fn cmd_pooled(void *ctx, json_t *args,
					   struct ioc__qmp_err *err)
{
	(void)ctx, (void)args, (void)err;
	return json_pack("{s:I}", "ret", (json_int_t)ioc_pool_co_run(NULL, block_fn, NULL));
}

static json_t *cmd_count(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	(void)ctx, (void)args, (void)err;
	return json_pack("{s:i,s:b}", "n", counted++, "during", parking);
}

static const struct ioc__qmp_cmd cmds[] = {
	{ "qmp_capabilities", cmd_count, NULL, NULL, false }, /* answered by qmp.c */
	{ "park", cmd_park, NULL, NULL, true },
	{ "pooled", cmd_pooled, NULL, NULL, true },
	{ "count", cmd_count, NULL, NULL, false },
};

struct peer {
	int fd;                 /* the test's end */
	char buf[8192];
	size_t len;
};

static struct ioc_loop *loop;

static struct ioc__qmp *new_qmp(void)
{
	struct ioc__qmp_opts o = { .cmds = cmds, .ncmds = IOC_ARRAY_SIZE(cmds),
				   .package = "test", .major = 7, .minor = 2 };
	struct ioc__qmp *q;

	if (!loop)
		ASSERT_EQ(ioc_loop_new(&loop, NULL), 0);
	ASSERT_EQ(ioc__qmp_new(&q, loop, -1, &o), 0);
	return q;
}

static void spin(int rounds)
{
	for (int i = 0; i < rounds; i++)
		ioc_loop_poll(loop, false);
}

static void peer_send(struct peer *p, const char *s)
{
	ASSERT_EQ(write(p->fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* Everything the server sent so far, appended to p->buf. */
static void peer_read(struct peer *p)
{
	for (;;) {
		ssize_t n = recv(p->fd, p->buf + p->len, sizeof(p->buf) - 1 - p->len,
				 MSG_DONTWAIT);

		if (n <= 0)
			break;
		p->len += (size_t)n;
	}
	p->buf[p->len] = 0;
}

static unsigned lines(const struct peer *p)
{
	unsigned n = 0;

	for (const char *s = p->buf; (s = strchr(s, '\n')); s++)
		n++;
	return n;
}

static void attach(struct ioc__qmp *q, struct peer *p)
{
	int sv[2];

	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	ASSERT_EQ(ioc__qmp_attach(q, sv[0], NULL), 0);
	p->fd = sv[1];
	p->len = 0;
	peer_send(p, "{\"execute\": \"qmp_capabilities\"}");
	spin(4);
	peer_read(p);
	ASSERT_UEQ(lines(p), 2u);       /* greeting, {"return": {}} */
	ASSERT_NE(strstr(p->buf, "{\"return\": {}}"), NULL);
	p->len = 0;
}

/* A command that yields holds every client's input; what waited runs
 * after it, in order, and events go out meanwhile. */
static void test_held_in_order(void)
{
	struct ioc__qmp *q = new_qmp();
	struct peer a, b;

	attach(q, &a);
	attach(q, &b);
	counted = 0;
	peer_send(&a, "{\"execute\": \"park\", \"id\": 1}{\"execute\": \"count\", \"id\": 2}");
	spin(8);
	ASSERT_NE(parked, NULL);
	peer_send(&b, "{\"execute\": \"count\", \"id\": 3}");
	ioc__qmp_event(q, "TEST_EVENT", NULL);
	spin(8);
	peer_read(&a);
	peer_read(&b);
	ASSERT_UEQ(lines(&a), 1u);      /* the event only */
	ASSERT_UEQ(lines(&b), 1u);
	ASSERT_NE(strstr(b.buf, "TEST_EVENT"), NULL);
	ASSERT_EQ(counted, 0);
	ioc_co_enter(parked);
	spin(8);
	peer_read(&a);
	peer_read(&b);
	ASSERT_UEQ(lines(&a), 3u);
	ASSERT_UEQ(lines(&b), 2u);
	char *park = strstr(a.buf, "\"parked\""), *count = strstr(a.buf, "\"n\"");

	ASSERT_NE(park, NULL);
	ASSERT_NE(count, NULL);
	ASSERT_LT(park, count);         /* replies in the client's order */
	ASSERT_EQ(strstr(a.buf, "\"during\": true"), NULL);
	ASSERT_EQ(strstr(b.buf, "\"during\": true"), NULL);
	ASSERT_NE(strstr(b.buf, "\"id\": 3"), NULL);
	ASSERT_EQ(counted, 2);
	ioc__qmp_free(q);
	close(a.fd);
	close(b.fd);
}

/* The running command's client hangs up (the failed write of an event
 * closes it): its struct lives until the command's end. */
static void test_hangup_while_running(void)
{
	struct ioc__qmp *q = new_qmp();
	struct peer a, b;

	attach(q, &a);
	attach(q, &b);
	peer_send(&a, "{\"execute\": \"park\"}");
	spin(8);
	ASSERT_NE(parked, NULL);
	close(a.fd);
	ioc__qmp_event(q, "TEST_EVENT", NULL);
	spin(4);
	ioc_co_enter(parked);
	spin(8);
	ASSERT_EQ(parked, NULL);
	peer_send(&b, "{\"execute\": \"count\", \"id\": 9}");
	spin(8);
	peer_read(&b);
	ASSERT_NE(strstr(b.buf, "\"id\": 9"), NULL);
	ioc__qmp_free(q);
	close(b.fd);
}

/* ioc__qmp_free() with a command on the thread pool waits for it. */
static void test_free_waits(void)
{
	struct ioc__qmp *q = new_qmp();
	struct peer a;
	uint64_t one = 1;

	block_fd = eventfd(0, EFD_CLOEXEC);
	ASSERT_GE(block_fd, 0);
	attach(q, &a);
	peer_send(&a, "{\"execute\": \"pooled\"}");
	spin(8);
	/* The job blocks until this write; the free then waits for its
	 * result, and the command's reply is the last thing sent. */
	ASSERT_EQ(write(block_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
	ioc__qmp_free(q);
	peer_read(&a);
	ASSERT_NE(strstr(a.buf, "\"ret\": 7"), NULL);
	close(a.fd);
	close(block_fd);
}

IOC_TEST_MAIN(
	IOC_TEST(test_held_in_order),
	IOC_TEST(test_hangup_while_running),
	IOC_TEST(test_free_waits),
)
