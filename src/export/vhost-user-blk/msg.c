/*
 * vhost-user messages: one in, one out, on the front end's Unix socket.
 *
 * Problem: the front end (QEMU) sends a 12-byte header (request, flags,
 * size), a payload whose shape depends on the request, and file
 * descriptors in SCM_RIGHTS ancillary data (guest memory, eventfds).  A
 * confused or hostile peer can send any bytes and any number of fds; the
 * export must reject what does not fit, say why, never leak an fd, and
 * never read a payload it did not bound first.
 *
 * Design: one table, indexed by request, gives the payload size a
 * request needs (exact, or a rule for the two variable ones: a memory
 * table's regions and a config access's bytes) and how many fds it
 * carries (none, one, one per region, one unless the vring NOFD bit is
 * set, zero or one).  ioc__vub_msg_check() applies it to a message that
 * has been read whole; it is pure, so the fuzz target drives it.  recv
 * reads the header, refuses a size over VUB_MAX_PAYLOAD before reading
 * more, then the payload, collecting fds from every recvmsg() of the
 * message (the front end sends them with the header, but a stream socket
 * does not promise that).  The socket is non-blocking; recv and send wait
 * with ioc_co_wait_fd() in a coroutine (the connection's, on the control
 * loop) and with poll(2) outside one (tests, tools).
 *
 * Rejected: a read buffer with its own framing state machine driven by
 * the loop's read callback (the connection is a coroutine anyway: it
 * must wait in the middle of a message for a queue to drain, and the
 * state lives on its stack); accepting and ignoring unknown requests (the
 * fds a request carries cannot be known, and the spec lets a back end
 * close on what it does not support).
 *
 * Cost: two or three syscalls per message on the control path only.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vub-int.h"

enum fd_rule { FD_NONE, FD_ONE, FD_PER_REGION, FD_VRING, FD_ANY1 };
enum size_rule { SZ_EXACT, SZ_MEM_TABLE, SZ_CONFIG };

struct req_spec {
	const char *name;
	enum size_rule sz;
	uint32_t size;          /* SZ_EXACT */
	enum fd_rule fds;
};

#define R(id, nm, rule, n, f) [id] = { nm, rule, n, f }
static const struct req_spec specs[VUB_REQUEST_MAX] = {
	R(VUB_GET_FEATURES, "GET_FEATURES", SZ_EXACT, 0, FD_NONE),
	R(VUB_SET_FEATURES, "SET_FEATURES", SZ_EXACT, 8, FD_NONE),
	R(VUB_SET_OWNER, "SET_OWNER", SZ_EXACT, 0, FD_NONE),
	R(VUB_RESET_OWNER, "RESET_OWNER", SZ_EXACT, 0, FD_NONE),
	R(VUB_SET_MEM_TABLE, "SET_MEM_TABLE", SZ_MEM_TABLE, 0, FD_PER_REGION),
	R(VUB_SET_LOG_BASE, "SET_LOG_BASE", SZ_EXACT, sizeof(struct vub_log_desc), FD_ONE),
	R(VUB_SET_LOG_FD, "SET_LOG_FD", SZ_EXACT, 0, FD_ONE),
	R(VUB_SET_VRING_NUM, "SET_VRING_NUM", SZ_EXACT, 8, FD_NONE),
	R(VUB_SET_VRING_ADDR, "SET_VRING_ADDR", SZ_EXACT,
	  sizeof(struct vhost_vring_addr), FD_NONE),
	R(VUB_SET_VRING_BASE, "SET_VRING_BASE", SZ_EXACT, 8, FD_NONE),
	R(VUB_GET_VRING_BASE, "GET_VRING_BASE", SZ_EXACT, 8, FD_NONE),
	R(VUB_SET_VRING_KICK, "SET_VRING_KICK", SZ_EXACT, 8, FD_VRING),
	R(VUB_SET_VRING_CALL, "SET_VRING_CALL", SZ_EXACT, 8, FD_VRING),
	R(VUB_SET_VRING_ERR, "SET_VRING_ERR", SZ_EXACT, 8, FD_VRING),
	R(VUB_GET_PROTOCOL_FEATURES, "GET_PROTOCOL_FEATURES", SZ_EXACT, 0, FD_NONE),
	R(VUB_SET_PROTOCOL_FEATURES, "SET_PROTOCOL_FEATURES", SZ_EXACT, 8, FD_NONE),
	R(VUB_GET_QUEUE_NUM, "GET_QUEUE_NUM", SZ_EXACT, 0, FD_NONE),
	R(VUB_SET_VRING_ENABLE, "SET_VRING_ENABLE", SZ_EXACT, 8, FD_NONE),
	R(VUB_SET_BACKEND_REQ_FD, "SET_BACKEND_REQ_FD", SZ_EXACT, 0, FD_ONE),
	R(VUB_GET_CONFIG, "GET_CONFIG", SZ_CONFIG, 0, FD_NONE),
	R(VUB_SET_CONFIG, "SET_CONFIG", SZ_CONFIG, 0, FD_NONE),
	R(VUB_GET_INFLIGHT_FD, "GET_INFLIGHT_FD", SZ_EXACT,
	  sizeof(struct vub_inflight_desc), FD_NONE),
	R(VUB_SET_INFLIGHT_FD, "SET_INFLIGHT_FD", SZ_EXACT,
	  sizeof(struct vub_inflight_desc), FD_ONE),
	R(VUB_GET_MAX_MEM_SLOTS, "GET_MAX_MEM_SLOTS", SZ_EXACT, 0, FD_NONE),
	R(VUB_ADD_MEM_REG, "ADD_MEM_REG", SZ_EXACT,
	  sizeof(struct vub_mem_one_desc), FD_ONE),
	/* The spec: SHOULD carry none, MAY carry one (closed unused). */
	R(VUB_REM_MEM_REG, "REM_MEM_REG", SZ_EXACT,
	  sizeof(struct vub_mem_one_desc), FD_ANY1),
};
#undef R

const char *ioc__vub_msg_name(uint32_t request, char *buf, size_t len)
{
	if (request < VUB_REQUEST_MAX && specs[request].name)
		return specs[request].name;
	snprintf(buf, len, "request %u", request);
	return buf;
}

int ioc__vub_msg_check(const struct ioc__vub_msg *m, const char **why)
{
	const struct req_spec *s;
	uint32_t want;
	int nfds;

	if ((m->flags & VUB_FLAG_VERSION) != VUB_VERSION) {
		*why = "bad protocol version";
		return -EPROTO;
	}
	if (m->flags & VUB_FLAG_REPLY) {
		*why = "reply flag on a request";
		return -EPROTO;
	}
	if (m->size > VUB_MAX_PAYLOAD) {
		*why = "payload too large";
		return -EPROTO;
	}
	if (m->request >= VUB_REQUEST_MAX || !specs[m->request].name) {
		*why = "unsupported request";
		return -EPROTO;
	}
	s = &specs[m->request];
	switch (s->sz) {
	case SZ_EXACT:
		want = s->size;
		break;
	case SZ_MEM_TABLE:
		if (m->size < 8) {
			*why = "memory table shorter than its header";
			return -EPROTO;
		}
		if (m->p.mem.nregions < 1 || m->p.mem.nregions > VUB_TABLE_REGIONS) {
			*why = "memory table region count out of range";
			return -EPROTO;
		}
		want = 8 + m->p.mem.nregions * (uint32_t)sizeof(struct vub_region_desc);
		break;
	case SZ_CONFIG:
		if (m->size < 12) {
			*why = "config access shorter than its header";
			return -EPROTO;
		}
		if (m->p.cfg.size > VUB_CONFIG_MAX) {
			*why = "config access too large";
			return -EPROTO;
		}
		want = 12 + m->p.cfg.size;
		break;
	default:
		want = 0;
	}
	if (m->size != want) {
		*why = "payload size does not fit the request";
		return -EPROTO;
	}
	switch (s->fds) {
	case FD_NONE:
		nfds = 0;
		break;
	case FD_ONE:
		nfds = 1;
		break;
	case FD_PER_REGION:
		nfds = (int)m->p.mem.nregions;
		break;
	case FD_VRING:
		nfds = (m->p.u64 & VUB_VRING_NOFD) ? 0 : 1;
		if (m->p.u64 & ~(uint64_t)(VUB_VRING_IDX_MASK | VUB_VRING_NOFD)) {
			*why = "unknown bits in a vring fd message";
			return -EPROTO;
		}
		break;
	case FD_ANY1:
	default:
		if (m->nfds > 1) {
			*why = "too many file descriptors";
			return -EPROTO;
		}
		return 0;
	}
	if (m->nfds < nfds) {
		*why = "file descriptor missing";
		return -EPROTO;
	}
	if (m->nfds > nfds) {
		*why = "unexpected file descriptors";
		return -EPROTO;
	}
	return 0;
}

void ioc__vub_msg_close_fds(struct ioc__vub_msg *m)
{
	for (int i = 0; i < m->nfds; i++) {
		if (m->fds[i] >= 0)
			close(m->fds[i]);
		m->fds[i] = -1;
	}
	m->nfds = 0;
}

static int wait_io(int fd, bool out)
{
	if (ioc_in_coroutine()) {
		int r = ioc_co_wait_fd(fd, out ? IOC_CO_WRITE : IOC_CO_READ);

		return r < 0 ? r : 0;
	}
	struct pollfd p = { .fd = fd, .events = out ? POLLOUT : POLLIN };

	if (poll(&p, 1, -1) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

/* After a recvmsg (out: sendmsg) on fd failed: 0 to try again (it was
 * interrupted, or fd is ready now), or the -errno that ends the transfer. */
static int io_failed(int fd, bool out)
{
	if (errno == EINTR)
		return 0;
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return wait_io(fd, out);
	return -errno;
}

/* Read exactly len bytes into buf, taking the fds that come with them.
 * at_start: an orderly end before the first byte is -ECONNRESET, not a
 * truncated message. */
static int recv_exact(int fd, void *buf, size_t len, struct ioc__vub_msg *m,
		      bool at_start, const char **why)
{
	size_t off = 0;

	while (off < len) {
		union {
			char b[CMSG_SPACE(sizeof(int) * VUB_MAX_FDS)];
			struct cmsghdr align;
		} cbuf;
		struct iovec iov = { (char *)buf + off, len - off };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = cbuf.b, .msg_controllen = sizeof(cbuf.b),
		};
		ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
		bool too_many = false;

		if (r < 0) {
			int w = io_failed(fd, false);

			if (w < 0)
				return w;
			continue;
		}
		/* Take every fd first, so an error below leaks none. */
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int *fds = (int *)CMSG_DATA(c);

			for (size_t i = 0; i < n; i++) {
				int f;

				memcpy(&f, &fds[i], sizeof(f));
				if (m->nfds < VUB_MAX_FDS)
					m->fds[m->nfds++] = f;
				else {
					close(f);
					too_many = true;
				}
			}
		}
		/* The kernel drops (closes) what did not fit the buffer. */
		if (too_many || (mh.msg_flags & MSG_CTRUNC)) {
			*why = "too many file descriptors";
			return -EPROTO;
		}
		if (r == 0) {
			if (at_start && off == 0 && m->nfds == 0)
				return -ECONNRESET;
			*why = "connection closed inside a message";
			return -EPROTO;
		}
		off += (size_t)r;
	}
	return 0;
}

int ioc_coroutine_fn ioc__vub_msg_recv(int fd, struct ioc__vub_msg *m, const char **why)
{
	uint32_t hdr[3];
	int r;

	m->nfds = 0;
	m->size = 0;
	r = recv_exact(fd, hdr, sizeof(hdr), m, true, why);
	if (r < 0)
		goto fail;
	m->request = hdr[0];
	m->flags = hdr[1];
	m->size = hdr[2];
	if (m->size > VUB_MAX_PAYLOAD) {
		*why = "payload too large";
		r = -EPROTO;
		goto fail;
	}
	memset(&m->p, 0, sizeof(m->p));
	r = recv_exact(fd, m->p.raw, m->size, m, false, why);
	if (r < 0)
		goto fail;
	r = ioc__vub_msg_check(m, why);
	if (r < 0)
		goto fail;
	for (int i = m->nfds; i < VUB_MAX_FDS; i++)
		m->fds[i] = -1;
	return 0;
fail:
	ioc__vub_msg_close_fds(m);
	return r;
}

int ioc_coroutine_fn ioc__vub_msg_send_fd(int fd, uint32_t request, uint32_t flags,
					  const void *payload, uint32_t size, int pass_fd)
{
	uint8_t buf[VUB_HDR_SIZE + VUB_MAX_PAYLOAD];
	uint32_t hdr[3] = { request, flags, size };
	size_t len = VUB_HDR_SIZE + size, off = 0;
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cbuf;

	if (size > VUB_MAX_PAYLOAD)
		return -EINVAL;
	memcpy(buf, hdr, sizeof(hdr));
	if (size)
		memcpy(buf + VUB_HDR_SIZE, payload, size);
	while (off < len) {
		struct iovec iov = { buf + off, len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t r;

		/* The fd rides with the first byte, as QEMU expects it
		 * with the header. */
		if (pass_fd >= 0 && off == 0) {
			struct cmsghdr *c;

			mh.msg_control = cbuf.b;
			mh.msg_controllen = sizeof(cbuf.b);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
		}
		r = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (r < 0) {
			int w = io_failed(fd, true);

			if (w < 0)
				return w;
			continue;
		}
		off += (size_t)r;
	}
	return 0;
}

int ioc_coroutine_fn ioc__vub_msg_send(int fd, uint32_t request, uint32_t flags,
				       const void *payload, uint32_t size)
{
	return ioc__vub_msg_send_fd(fd, request, flags, payload, size, -1);
}
