/*
 * Fuzz target: the vhost-user message layer.  The first input byte says
 * how many eventfds ride with the first sendmsg (0..15: more than a
 * message may carry, too); the rest is the byte stream the front end
 * writes.  The export's side reads messages until the stream ends or one
 * is refused.  Checked: no crash, no read past what was bounded, and no
 * fd left open afterwards (the lowest free fd is the same before and
 * after the run).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vub-int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int lowest_free_fd(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

static unsigned long good, refused;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2], before = lowest_free_fd(), nfds = 0, fds[16];
	struct ioc__vub_msg m;

	if (size < 1 || size > 60000)
		return 0;
	nfds = data[0] % 16;
	data++;
	size--;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	/* Everything is written before reading (the socket buffer holds
	 * it), then the writer's end is closed: the reader sees the stream
	 * and its end. */
	{
		union {
			char c[CMSG_SPACE(sizeof(int) * 16)];
			struct cmsghdr align;
		} cb;
		struct iovec iov = { (void *)data, size };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		for (int i = 0; i < nfds; i++)
			fds[i] = eventfd(0, EFD_CLOEXEC);
		if (nfds && size) {
			struct cmsghdr *c;

			mh.msg_control = cb.c;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
		}
		if (size && sendmsg(sv[0], &mh, MSG_NOSIGNAL) != (ssize_t)size)
			abort();
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		close(sv[0]);
	}
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	for (;;) {
		const char *why = NULL;
		int r = ioc__vub_msg_recv(sv[1], &m, &why);

		if (r < 0) {
			if (r == -EPROTO && !why)
				abort();   /* a refusal always names its reason */
			refused += r == -EPROTO;
			break;
		}
		good++;
		if (ioc__vub_msg_check(&m, &why) < 0)
			abort();   /* recv hands out checked messages only */
		ioc__vub_msg_close_fds(&m);
	}
	close(sv[1]);
	if (lowest_free_fd() != before)
		abort();
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-runner.h"

static bool fuzz_report(void)
{
	printf("# %lu messages read, %lu refused\n", good, refused);
	return good > 100 && refused > 100;
}

static void msg(struct input *in, uint32_t req, uint32_t flags, const void *p, uint32_t size)
{
	uint32_t hdr[3] = { req, flags, size };

	put(in, hdr, sizeof(hdr));
	if (size)
		put(in, p, size);
}

static unsigned make_inputs(struct input *ins)
{
	uint64_t v = 0;
	struct vhost_vring_state st = { 0, 128 };
	struct vhost_vring_addr a = { 0 };
	struct vub_mem_table_desc t = { .nregions = 2 };
	struct vub_mem_one_desc one = { 0 };
	struct vub_config_desc c = { .size = 60 };
	unsigned n = 0;

	/* A whole start-up conversation, its fds with the first message. */
	ins[n].b[ins[n].n++] = 2;
	msg(&ins[n], VUB_SET_MEM_TABLE, 1, &t, 8 + 2 * 32);
	msg(&ins[n], VUB_GET_FEATURES, 1, NULL, 0);
	msg(&ins[n], VUB_SET_FEATURES, 1 | VUB_FLAG_NEED_REPLY, &v, 8);
	msg(&ins[n], VUB_GET_PROTOCOL_FEATURES, 1, NULL, 0);
	msg(&ins[n], VUB_SET_PROTOCOL_FEATURES, 1, &v, 8);
	msg(&ins[n], VUB_GET_QUEUE_NUM, 1, NULL, 0);
	msg(&ins[n], VUB_GET_CONFIG, 1, &c, 12 + 60);
	msg(&ins[n], VUB_SET_VRING_NUM, 1, &st, 8);
	msg(&ins[n], VUB_SET_VRING_BASE, 1, &st, 8);
	msg(&ins[n], VUB_SET_VRING_ADDR, 1, &a, sizeof(a));
	v = VUB_VRING_NOFD;
	msg(&ins[n], VUB_SET_VRING_KICK, 1, &v, 8);
	msg(&ins[n], VUB_SET_VRING_CALL, 1, &v, 8);
	msg(&ins[n], VUB_SET_VRING_ENABLE, 1, &st, 8);
	msg(&ins[n], VUB_GET_VRING_BASE, 1, &st, 8);
	msg(&ins[n], VUB_GET_MAX_MEM_SLOTS, 1, NULL, 0);
	msg(&ins[n], VUB_REM_MEM_REG, 1, &one, sizeof(one));
	n++;
	/* One fd each. */
	ins[n].b[ins[n].n++] = 1;
	msg(&ins[n], VUB_ADD_MEM_REG, 1, &one, sizeof(one));
	n++;
	ins[n].b[ins[n].n++] = 1;
	v = 0;
	msg(&ins[n], VUB_SET_VRING_KICK, 1, &v, 8);
	n++;
	ins[n].b[ins[n].n++] = 1;
	msg(&ins[n], VUB_SET_BACKEND_REQ_FD, 1, NULL, 0);
	n++;
	/* The dirty log: SET_LOG_BASE and SET_LOG_FD, one fd each; a log
	 * description one byte short. */
	ins[n].b[ins[n].n++] = 1;
	{
		struct vub_log_desc d = { 4096, 0 };

		msg(&ins[n], VUB_SET_LOG_BASE, 1, &d, sizeof(d));
		n++;
		ins[n].b[ins[n].n++] = 1;
		msg(&ins[n], VUB_SET_LOG_FD, 1, NULL, 0);
		n++;
		ins[n].b[ins[n].n++] = 1;
		msg(&ins[n], VUB_SET_LOG_BASE, 1, &d, sizeof(d) - 1);
		n++;
	}
	/* Eight regions and eight fds; nine fds. */
	ins[n].b[ins[n].n++] = 8;
	t.nregions = 8;
	msg(&ins[n], VUB_SET_MEM_TABLE, 1, &t, 8 + 8 * 32);
	n++;
	ins[n].b[ins[n].n++] = 9;
	msg(&ins[n], VUB_SET_MEM_TABLE, 1, &t, 8 + 8 * 32);
	n++;
	/* The inflight region: GET (no fd), SET with its fd, then SET
	 * without one, and a GET of the wrong size. */
	{
		struct vub_inflight_desc d = { 4096, 0, 2, 128 };

		ins[n].b[ins[n].n++] = 1;
		msg(&ins[n], VUB_SET_INFLIGHT_FD, 1, &d, sizeof(d));
		msg(&ins[n], VUB_GET_INFLIGHT_FD, 1, &d, sizeof(d));
		msg(&ins[n], VUB_SET_INFLIGHT_FD, 1, &d, sizeof(d));
		n++;
		ins[n].b[ins[n].n++] = 0;
		msg(&ins[n], VUB_GET_INFLIGHT_FD, 1, &d, sizeof(d) - 4);
		n++;
	}
	/* SET_CONFIG of the write-cache byte; an oversized header. */
	ins[n].b[ins[n].n++] = 0;
	c.offset = 32;
	c.size = 1;
	msg(&ins[n], VUB_SET_CONFIG, 1, &c, 13);
	{
		uint32_t hdr[3] = { VUB_SET_CONFIG, 1, 0x7fffffff };

		put(&ins[n], hdr, sizeof(hdr));
	}
	n++;
	return n;
}
#endif
