/*
 * The vhost-user message layer over a socketpair: well-formed messages of
 * every payload shape, partial arrival, and each malformed kind (version,
 * flags, size, request, payload size, missing / extra / too many fds,
 * the end of the stream inside a message).  After every case the process
 * holds exactly the fds it held before: a rejected message leaks none.
 */
#include <dirent.h>
#include <stdlib.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "tap.h"
#include "vub-int.h"

static int sv[2];

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ASSERT_NOT_NULL(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void pair(void)
{
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	ASSERT_OK(fcntl(sv[1], F_SETFL, O_NONBLOCK));
}

static void unpair(void)
{
	close(sv[0]);
	close(sv[1]);
}

/* Send header + payload in one sendmsg with nfds fresh eventfds. */
static void send_msg(uint32_t req, uint32_t flags, const void *p, uint32_t size,
		     int nfds)
{
	uint8_t b[VUB_HDR_SIZE + 1024];
	uint32_t hdr[3] = { req, flags, size };
	union {
		char c[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} cbuf;
	int fds[16];
	struct iovec iov = { b, VUB_HDR_SIZE + size };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	ASSERT_ULE(size, 1024);
	memcpy(b, hdr, sizeof(hdr));
	if (size)
		memcpy(b + VUB_HDR_SIZE, p, size);
	if (nfds) {
		struct cmsghdr *c;

		mh.msg_control = cbuf.c;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		for (int i = 0; i < nfds; i++) {
			fds[i] = eventfd(0, EFD_CLOEXEC);
			ASSERT_GE(fds[i], 0);
		}
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	ASSERT_EQ(sendmsg(sv[0], &mh, MSG_NOSIGNAL), (ssize_t)iov.iov_len);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

static int recv_msg(struct ioc__vub_msg *m, const char **why)
{
	*why = NULL;
	return ioc__vub_msg_recv(sv[1], m, why);
}

static void expect_bad(const char *why_part)
{
	struct ioc__vub_msg m;
	const char *why;

	ASSERT_EQ(recv_msg(&m, &why), -EPROTO);
	ASSERT_NOT_NULL(why);
	if (!strstr(why, why_part))
		ioc_test_fail(__FILE__, __LINE__, "reason \"%s\", expected \"%s\"", why, why_part);
	ASSERT_EQ(m.nfds, 0);
}

static void test_good(void)
{
	struct ioc__vub_msg m;
	const char *why;
	uint64_t v = 0x1234;
	int before = count_fds();

	pair();
	send_msg(VUB_GET_FEATURES, 1, NULL, 0, 0);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_UEQ(m.request, VUB_GET_FEATURES);
	ASSERT_EQ(m.nfds, 0);

	send_msg(VUB_SET_FEATURES, 1 | VUB_FLAG_NEED_REPLY, &v, 8, 0);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_UEQ(m.p.u64, 0x1234);
	ASSERT_UEQ(m.flags & VUB_FLAG_NEED_REPLY, VUB_FLAG_NEED_REPLY);

	/* A kick fd, and the NOFD form without one. */
	v = 3;
	send_msg(VUB_SET_VRING_KICK, 1, &v, 8, 1);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_EQ(m.nfds, 1);
	ASSERT_GE(m.fds[0], 0);
	ioc__vub_msg_close_fds(m.fds[0] >= 0 ? &m : &m);
	v = 3 | VUB_VRING_NOFD;
	send_msg(VUB_SET_VRING_CALL, 1, &v, 8, 0);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_EQ(m.nfds, 0);

	/* A memory table of three regions and its three fds. */
	struct vub_mem_table_desc t = { .nregions = 3 };
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8 + 3 * 32, 3);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_EQ(m.nfds, 3);
	ASSERT_UEQ(m.p.mem.nregions, 3);
	ioc__vub_msg_close_fds(&m);

	/* GET_CONFIG with its data bytes. */
	struct vub_config_desc c = { .offset = 0, .size = 60 };
	send_msg(VUB_GET_CONFIG, 1, &c, 12 + 60, 0);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_UEQ(m.p.cfg.size, 60);

	/* REM_MEM_REG may carry one fd (closed unused). */
	struct vub_mem_one_desc one = { 0 };
	send_msg(VUB_REM_MEM_REG, 1, &one, sizeof(one), 1);
	ASSERT_OK(recv_msg(&m, &why));
	ASSERT_EQ(m.nfds, 1);
	ioc__vub_msg_close_fds(&m);
	send_msg(VUB_REM_MEM_REG, 1, &one, sizeof(one), 0);
	ASSERT_OK(recv_msg(&m, &why));

	/* The end of the stream between messages. */
	close(sv[0]);
	ASSERT_EQ(ioc__vub_msg_recv(sv[1], &m, &why), -ECONNRESET);
	close(sv[1]);
	ASSERT_EQ(count_fds(), before);
}

struct trickle {
	const uint8_t *b;
	size_t n;
};

static void *trickle_fn(void *arg)
{
	struct trickle *t = arg;

	for (size_t i = 0; i < t->n; i++)
		if (write(sv[0], t->b + i, 1) != 1)
			break;
	return NULL;
}

/* A message arriving a byte at a time, through the wait path. */
static void test_partial(void)
{
	uint8_t b[VUB_HDR_SIZE + 40];
	uint32_t hdr[3] = { VUB_SET_VRING_ADDR, 1, 40 };
	struct vhost_vring_addr a = { .index = 1, .desc_user_addr = 0x1000,
				      .used_user_addr = 0x2000, .avail_user_addr = 0x3000 };
	struct trickle t = { b, sizeof(b) };
	struct ioc__vub_msg m;
	const char *why;
	pthread_t th;

	pair();
	memcpy(b, hdr, sizeof(hdr));
	memcpy(b + VUB_HDR_SIZE, &a, sizeof(a));
	ASSERT_OK(-pthread_create(&th, NULL, trickle_fn, &t));
	ASSERT_OK(recv_msg(&m, &why));
	pthread_join(th, NULL);
	ASSERT_UEQ(m.p.addr.index, 1);
	ASSERT_UEQ(m.p.addr.avail_user_addr, 0x3000);
	unpair();
}

static void test_malformed(void)
{
	uint64_t v = 0;
	struct vub_mem_table_desc t = { .nregions = 2 };
	struct vub_config_desc c = { .size = 300 };
	int before = count_fds();

	pair();
	send_msg(VUB_GET_FEATURES, 0, NULL, 0, 0);
	expect_bad("version");
	send_msg(VUB_GET_FEATURES, 1 | VUB_FLAG_REPLY, NULL, 0, 0);
	expect_bad("reply flag");
	send_msg(99, 1, NULL, 0, 0);
	expect_bad("unsupported request");
	send_msg(0, 1, NULL, 0, 0);
	expect_bad("unsupported request");
	send_msg(19, 1, &v, 8, 0);   /* SEND_RARP: vhost-user-net's */
	expect_bad("unsupported request");
	/* SET_LOG_BASE: a log description (16 bytes) and its fd. */
	send_msg(VUB_SET_LOG_BASE, 1, &v, 8, 1);
	expect_bad("payload size");
	{
		struct vub_log_desc d = { 4096, 0 };

		send_msg(VUB_SET_LOG_BASE, 1, &d, sizeof(d), 0);
		expect_bad("file descriptor missing");
	}
	send_msg(VUB_SET_FEATURES, 1, &v, 4, 0);
	expect_bad("payload size");
	send_msg(VUB_GET_FEATURES, 1, &v, 8, 0);
	expect_bad("payload size");
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8 + 32, 2);
	expect_bad("payload size");
	t.nregions = 0;
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8, 0);
	expect_bad("region count");
	t.nregions = 9;
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8 + 8 * 32, 8);
	expect_bad("region count");
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 4, 0);
	expect_bad("shorter than its header");
	send_msg(VUB_GET_CONFIG, 1, &c, 12, 0);
	expect_bad("config access too large");
	c.size = 8;
	send_msg(VUB_GET_CONFIG, 1, &c, 12 + 4, 0);
	expect_bad("payload size");
	send_msg(VUB_SET_CONFIG, 1, &c, 8, 0);
	expect_bad("shorter than its header");

	/* fds: missing, extra, where none belongs, too many to hold. */
	t.nregions = 2;
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8 + 2 * 32, 1);
	expect_bad("missing");
	send_msg(VUB_SET_MEM_TABLE, 1, &t, 8 + 2 * 32, 3);
	expect_bad("unexpected file descriptors");
	send_msg(VUB_SET_VRING_KICK, 1, &v, 8, 0);
	expect_bad("missing");
	v = VUB_VRING_NOFD;
	send_msg(VUB_SET_VRING_KICK, 1, &v, 8, 1);
	expect_bad("unexpected file descriptors");
	v = 1u << 12;
	send_msg(VUB_SET_VRING_CALL, 1, &v, 8, 1);
	expect_bad("unknown bits");
	send_msg(VUB_SET_FEATURES, 1, &v, 8, 2);
	expect_bad("unexpected file descriptors");
	send_msg(VUB_SET_BACKEND_REQ_FD, 1, NULL, 0, 0);
	expect_bad("missing");
	send_msg(VUB_REM_MEM_REG, 1, &t, 40, 2);
	expect_bad("too many");
	/* More fds than a message may carry: the kernel truncates them
	 * (MSG_CTRUNC).  qemu-user's emulation (a cross build's suite)
	 * receives them all itself and passes some on without the flag, so
	 * the case is the kernel's only. */
	if (!getenv("IOC_CROSS_BUILD")) {
		send_msg(VUB_SET_FEATURES, 1, &v, 8, 12);
		expect_bad("too many file descriptors");
	}
	unpair();

	/* Oversized: refused from the header alone. */
	pair();
	send_msg(VUB_SET_FEATURES, 1, NULL, 0, 0);  /* size 0: wrong, but framed */
	expect_bad("payload size");
	{
		uint32_t hdr[3] = { VUB_SET_CONFIG, 1, 1u << 20 };

		ASSERT_EQ(write(sv[0], hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
		expect_bad("payload too large");
	}
	unpair();

	/* The stream ends inside a header, inside a payload (with fds). */
	pair();
	ASSERT_EQ(write(sv[0], "\x01\x00\x00", 3), 3);
	close(sv[0]);
	expect_bad("closed inside a message");
	close(sv[1]);
	pair();
	{
		uint32_t hdr[3] = { VUB_SET_MEM_TABLE, 1, 8 + 32 };
		uint32_t nreg[2] = { 1, 0 };
		union {
			char c[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} cbuf;
		uint8_t b[20];
		struct iovec iov = { b, sizeof(b) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = cbuf.c, .msg_controllen = sizeof(cbuf.c) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		int fd = eventfd(0, 0);

		memcpy(b, hdr, 12);
		memcpy(b + 12, nreg, 8);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		ASSERT_EQ(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(b));
		close(fd);
		close(sv[0]);
		expect_bad("closed inside a message");
	}
	close(sv[1]);
	ASSERT_EQ(count_fds(), before);
}

static void test_send(void)
{
	uint64_t v = 77;
	uint32_t hdr[3];
	uint64_t got;

	pair();
	ASSERT_OK(ioc__vub_msg_send(sv[1], VUB_GET_FEATURES, VUB_VERSION | VUB_FLAG_REPLY,
				    &v, 8));
	ASSERT_EQ(read(sv[0], hdr, 12), 12);
	ASSERT_UEQ(hdr[0], VUB_GET_FEATURES);
	ASSERT_UEQ(hdr[1], VUB_VERSION | VUB_FLAG_REPLY);
	ASSERT_UEQ(hdr[2], 8);
	ASSERT_EQ(read(sv[0], &got, 8), 8);
	ASSERT_UEQ(got, 77);
	ASSERT_EQ(ioc__vub_msg_send(sv[1], 1, 1, NULL, VUB_MAX_PAYLOAD + 1), -EINVAL);
	close(sv[0]);
	ASSERT_EQ(ioc__vub_msg_send(sv[1], 1, 1, NULL, 0), -EPIPE);
	close(sv[1]);
}

static void test_names(void)
{
	char b[32];

	ASSERT_STR_EQ(ioc__vub_msg_name(VUB_SET_MEM_TABLE, b, sizeof(b)), "SET_MEM_TABLE");
	ASSERT_STR_EQ(ioc__vub_msg_name(1000, b, sizeof(b)), "request 1000");
}

IOC_TEST_MAIN(
	IOC_TEST(test_good),
	IOC_TEST(test_partial),
	IOC_TEST(test_malformed),
	IOC_TEST(test_send),
	IOC_TEST(test_names),
)
