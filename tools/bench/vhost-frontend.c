/*
 * vhost-user front-end: the part of QEMU's vhost-user-blk device that
 * talks to the back-end, without a guest behind it.
 *
 * Problem: a vhost-user-blk back-end (iocore's, qemu-storage-daemon's) is
 * normally exercised only by booting a VM, which measures the guest's
 * kernel as much as the back-end and cannot send a malformed request on
 * purpose.  A front-end that owns the "guest memory" itself can do both.
 *
 * Design: the control plane is synchronous (one message, then its reply
 * or REPLY_ACK, each wait bounded by a timeout), done on one thread before
 * any ring runs and after they stop.  Guest memory is one memfd region at
 * guest-physical IOC_VHF_GUEST_BASE, mapped here and by the back-end; the
 * rings and the request slots are carved out of it with a bump allocator
 * (nothing is ever freed before the device goes).  Each ring is a split
 * virtqueue driven from one thread: publish chains, decide on a kick from
 * avail_event (EVENT_IDX) or the used ring's NO_NOTIFY flag, and take
 * completions from the used ring, woken by the call eventfd or spinning.
 * Request slots own fixed descriptors, so no free list of descriptors is
 * needed and a used id maps straight back to its slot.
 *
 * Rejected: libvhost-user or QEMU's vhost code (the back-end side, or tied
 * to QEMU's memory API); the packed ring (no back-end we target needs it
 * yet); mapping the rings as C11 _Atomic objects (the layout is fixed by
 * the virtio spec as plain little-endian u16s in shared memory, so the
 * index accesses use the GNU __atomic builtins on them instead).
 *
 * Cost notes: a request is 3 descriptor writes, one avail entry and a
 * release store; a kick is an eventfd write only when the back-end asked
 * for one.  Waiting is one poll() on the call eventfd and the socket.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <linux/virtio_config.h>

#include "vhost-frontend.h"

enum {
	VHU_GET_FEATURES = 1,
	VHU_SET_FEATURES = 2,
	VHU_SET_OWNER = 3,
	VHU_SET_MEM_TABLE = 5,
	VHU_SET_VRING_NUM = 8,
	VHU_SET_VRING_ADDR = 9,
	VHU_SET_VRING_BASE = 10,
	VHU_GET_VRING_BASE = 11,
	VHU_SET_VRING_KICK = 12,
	VHU_SET_VRING_CALL = 13,
	VHU_GET_PROTOCOL_FEATURES = 15,
	VHU_SET_PROTOCOL_FEATURES = 16,
	VHU_GET_QUEUE_NUM = 17,
	VHU_SET_VRING_ENABLE = 18,
	VHU_GET_CONFIG = 24,
	VHU_GET_INFLIGHT_FD = 31,
	VHU_SET_INFLIGHT_FD = 32,
};

#define VHU_VERSION    0x1u
#define VHU_REPLY      0x4u
#define VHU_NEED_REPLY 0x8u
#define VHU_MAX_PAYLOAD 512
#define VHU_MAX_FDS    8

struct vhu_hdr {
	uint32_t request, flags, size;
};

struct vhu_state {
	uint32_t index, num;
};

struct vhu_addr {
	uint32_t index, flags;
	uint64_t desc, used, avail, log;
};

struct vhu_region {
	uint64_t gpa, size, uaddr, mmap_offset;
};

struct vhu_mem {
	uint32_t nregions, padding;
	struct vhu_region region[1];
};

struct vhu_config {
	uint32_t offset, size, flags;
	uint8_t payload[256];
};

/* Natural alignment: 24 bytes, as QEMU and libvhost-user size it. */
struct vhu_inflight {
	uint64_t mmap_size, mmap_offset;
	uint16_t num_queues, queue_size;
};

/* Messages whose reply is part of the protocol (not a REPLY_ACK). */
static bool has_reply(uint32_t req)
{
	switch (req) {
	case VHU_GET_FEATURES:
	case VHU_GET_PROTOCOL_FEATURES:
	case VHU_GET_VRING_BASE:
	case VHU_GET_QUEUE_NUM:
	case VHU_GET_CONFIG:
	case VHU_GET_INFLIGHT_FD:
		return true;
	default:
		return false;
	}
}

const char *ioc_vhf_request_name(uint32_t req)
{
	static const char *const names[] = {
		[VHU_GET_FEATURES] = "GET_FEATURES",
		[VHU_SET_FEATURES] = "SET_FEATURES",
		[VHU_SET_OWNER] = "SET_OWNER",
		[VHU_SET_MEM_TABLE] = "SET_MEM_TABLE",
		[VHU_SET_VRING_NUM] = "SET_VRING_NUM",
		[VHU_SET_VRING_ADDR] = "SET_VRING_ADDR",
		[VHU_SET_VRING_BASE] = "SET_VRING_BASE",
		[VHU_GET_VRING_BASE] = "GET_VRING_BASE",
		[VHU_SET_VRING_KICK] = "SET_VRING_KICK",
		[VHU_SET_VRING_CALL] = "SET_VRING_CALL",
		[VHU_GET_PROTOCOL_FEATURES] = "GET_PROTOCOL_FEATURES",
		[VHU_SET_PROTOCOL_FEATURES] = "SET_PROTOCOL_FEATURES",
		[VHU_GET_QUEUE_NUM] = "GET_QUEUE_NUM",
		[VHU_SET_VRING_ENABLE] = "SET_VRING_ENABLE",
		[VHU_GET_CONFIG] = "GET_CONFIG",
		[VHU_GET_INFLIGHT_FD] = "GET_INFLIGHT_FD",
		[VHU_SET_INFLIGHT_FD] = "SET_INFLIGHT_FD",
	};

	if (req < sizeof(names) / sizeof(names[0]) && names[req])
		return names[req];
	return "request";
}

const char *ioc_vhf_blk_status_name(int status)
{
	switch (status) {
	case VIRTIO_BLK_S_OK: return "ok";
	case VIRTIO_BLK_S_IOERR: return "ioerr";
	case VIRTIO_BLK_S_UNSUPP: return "unsupp";
	default: return "invalid";
	}
}

static void say(const struct ioc_vhf_dev *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void say(const struct ioc_vhf_dev *d, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "vhost-blk: %s: ", d->socket);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int send_msg(struct ioc_vhf_dev *d, uint32_t req, uint32_t flags,
		    const void *payload, uint32_t size, const int *fds, unsigned nfds)
{
	struct vhu_hdr h = { .request = req, .flags = VHU_VERSION | flags, .size = size };
	union {
		char buf[CMSG_SPACE(sizeof(int) * VHU_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov[2] = {
		{ .iov_base = &h, .iov_len = sizeof(h) },
		{ .iov_base = (void *)payload, .iov_len = size },
	};
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = size ? 2 : 1 };
	size_t total = sizeof(h) + size, sent = 0;
	ssize_t n;

	if (nfds > VHU_MAX_FDS)
		return -EINVAL;
	if (nfds) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		m.msg_control = ctl.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	if (d->verbose)
		fprintf(stderr, "vhost-blk: -> %s flags 0x%x size %u fds %u\n",
			ioc_vhf_request_name(req), h.flags, size, nfds);
	/* The fds go with the first byte; a short write (the socket's
	 * buffer is full) continues without them. */
	while (sent < total) {
		do
			n = sendmsg(d->sock, &m, MSG_NOSIGNAL);
		while (n < 0 && errno == EINTR);
		if (n < 0) {
			int err = -errno;

			say(d, "sending %s: %s", ioc_vhf_request_name(req), strerror(-err));
			return err;
		}
		sent += (size_t)n;
		m.msg_control = NULL;
		m.msg_controllen = 0;
		while (n > 0 && m.msg_iovlen > 0) {
			if ((size_t)n >= m.msg_iov[0].iov_len) {
				n -= (ssize_t)m.msg_iov[0].iov_len;
				m.msg_iov++;
				m.msg_iovlen--;
			} else {
				m.msg_iov[0].iov_base = (char *)m.msg_iov[0].iov_base + n;
				m.msg_iov[0].iov_len -= (size_t)n;
				n = 0;
			}
		}
	}
	return 0;
}

/* Read exactly len bytes before the deadline; a received fd (at most one
 * is expected) goes to *fd. */
static int recv_all(struct ioc_vhf_dev *d, void *buf, size_t len, int *fd, int64_t deadline,
		    const char *what)
{
	size_t got = 0;

	while (got < len) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * VHU_MAX_FDS)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { .iov_base = (char *)buf + got, .iov_len = len - got };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
		struct pollfd p = { .fd = d->sock, .events = POLLIN };
		int64_t left = deadline - now_ms();
		ssize_t n;
		int r;

		if (left < 0)
			left = 0;
		r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0) {
			say(d, "no reply to %s within %d ms", what, d->timeout_ms);
			return -ETIMEDOUT;
		}
		n = recvmsg(d->sock, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int err = -errno;

			say(d, "reading the reply to %s: %s", what, strerror(-err));
			return err;
		}
		if (n == 0) {
			say(d, "the back-end closed the connection instead of replying to %s",
			    what);
			return -ECONNRESET;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[VHU_MAX_FDS];

			memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
			for (size_t i = 0; i < nfd; i++) {
				if (fd && *fd < 0)
					*fd = fds[i];
				else
					close(fds[i]);
			}
		}
		got += (size_t)n;
	}
	return 0;
}

static int recv_reply(struct ioc_vhf_dev *d, uint32_t req, void *payload, uint32_t *size,
		      int *fd)
{
	int64_t deadline = now_ms() + d->timeout_ms;
	const char *what = ioc_vhf_request_name(req);
	uint8_t buf[VHU_MAX_PAYLOAD];
	struct vhu_hdr h;
	int ret;

	ret = recv_all(d, &h, sizeof(h), fd, deadline, what);
	if (ret < 0)
		return ret;
	if (h.size > VHU_MAX_PAYLOAD) {
		say(d, "reply to %s: payload of %u bytes (at most %u expected)", what,
		    h.size, VHU_MAX_PAYLOAD);
		return -EPROTO;
	}
	ret = recv_all(d, buf, h.size, fd, deadline, what);
	if (ret < 0)
		return ret;
	if (d->verbose)
		fprintf(stderr, "vhost-blk: <- %s flags 0x%x size %u\n",
			ioc_vhf_request_name(h.request), h.flags, h.size);
	if (h.request != req || (h.flags & 0x3) != VHU_VERSION || !(h.flags & VHU_REPLY)) {
		say(d, "expected the reply to %s, got request %u flags 0x%x", what,
		    h.request, h.flags);
		return -EPROTO;
	}
	if (h.size > *size) {
		say(d, "reply to %s: %u bytes, at most %u expected", what, h.size, *size);
		return -EPROTO;
	}
	memcpy(payload, buf, h.size);
	*size = h.size;
	return 0;
}

int ioc_vhf_request(struct ioc_vhf_dev *d, uint32_t req, const void *payload, uint32_t size,
		const int *fds, unsigned nfds, void *reply, uint32_t *reply_size,
		int *reply_fd)
{
	bool ack = !has_reply(req) && (d->packed & (1ull << IOC_VHF_PF_REPLY_ACK));
	int ret;

	ret = send_msg(d, req, ack ? VHU_NEED_REPLY : 0, payload, size, fds, nfds);
	if (ret < 0)
		return ret;
	if (has_reply(req)) {
		uint32_t dummy_size = 0;
		uint8_t dummy[VHU_MAX_PAYLOAD];

		if (!reply) {
			reply = dummy;
			reply_size = &dummy_size;
			dummy_size = sizeof(dummy);
		}
		return recv_reply(d, req, reply, reply_size, reply_fd);
	}
	if (ack) {
		uint64_t v = 0;
		uint32_t n = sizeof(v);

		ret = recv_reply(d, req, &v, &n, NULL);
		if (ret < 0)
			return ret;
		if (n != sizeof(v)) {
			say(d, "REPLY_ACK to %s: %u bytes, 8 expected",
			    ioc_vhf_request_name(req), n);
			return -EPROTO;
		}
		if (v) {
			say(d, "the back-end rejected %s (ack %" PRIu64 ")",
			    ioc_vhf_request_name(req), v);
			return -EPROTO;
		}
	}
	return 0;
}

static int get_u64(struct ioc_vhf_dev *d, uint32_t req, uint64_t *v)
{
	uint32_t n = sizeof(*v);
	int ret = ioc_vhf_request(d, req, NULL, 0, NULL, 0, v, &n, NULL);

	if (ret == 0 && n != sizeof(*v)) {
		say(d, "reply to %s: %u bytes, 8 expected", ioc_vhf_request_name(req), n);
		return -EPROTO;
	}
	return ret;
}

static int set_u64(struct ioc_vhf_dev *d, uint32_t req, uint64_t v)
{
	return ioc_vhf_request(d, req, &v, sizeof(v), NULL, 0, NULL, NULL, NULL);
}

/* What we can drive: everything else offered is declined. */
#define IOC_VHF_DRIVER_FEATURES                                                      \
	((1ull << VIRTIO_F_VERSION_1) | (1ull << IOC_VHF_F_PROTOCOL_FEATURES) |      \
	 (1ull << VIRTIO_RING_F_EVENT_IDX) | (1ull << VIRTIO_RING_F_INDIRECT_DESC) | \
	 (1ull << VIRTIO_BLK_F_MQ) | (1ull << VIRTIO_BLK_F_FLUSH) |              \
	 (1ull << VIRTIO_BLK_F_DISCARD) | (1ull << VIRTIO_BLK_F_WRITE_ZEROES) |  \
	 (1ull << VIRTIO_BLK_F_RO) | (1ull << VIRTIO_BLK_F_BLK_SIZE) |           \
	 (1ull << VIRTIO_BLK_F_SEG_MAX) | (1ull << VIRTIO_BLK_F_SIZE_MAX) |      \
	 (1ull << VIRTIO_BLK_F_TOPOLOGY) | (1ull << VIRTIO_BLK_F_CONFIG_WCE))

int ioc_vhf_connect(struct ioc_vhf_dev *d, const struct ioc_vhf_opts *o)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int ret;

	memset(d, 0, sizeof(*d));
	d->socket = o->socket;
	d->sock = d->mem_fd = d->inflight_fd = -1;
	d->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
	d->verbose = o->verbose;
	d->nvqs = o->queues ? o->queues : 1;
	d->queue_size = o->queue_size ? o->queue_size : 256;
	d->no_inflight = o->no_inflight;
	for (unsigned i = 0; i < IOC_VHF_MAX_QUEUES; i++)
		d->vq[i].kick_fd = d->vq[i].call_fd = -1;
	if (d->nvqs > IOC_VHF_MAX_QUEUES) {
		say(d, "at most %u queues", IOC_VHF_MAX_QUEUES);
		return -EINVAL;
	}
	if (d->queue_size > 32768 || (d->queue_size & (d->queue_size - 1))) {
		say(d, "the queue size %u is not a power of two up to 32768", d->queue_size);
		return -EINVAL;
	}
	if (strlen(o->socket) >= sizeof(sa.sun_path)) {
		say(d, "socket path too long");
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, o->socket);
	d->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (d->sock < 0 || connect(d->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = -errno;
		say(d, "connect: %s", strerror(-ret));
		goto fail;
	}

	ret = ioc_vhf_request(d, VHU_SET_OWNER, NULL, 0, NULL, 0, NULL, NULL, NULL);
	if (ret < 0)
		goto fail;
	ret = get_u64(d, VHU_GET_FEATURES, &d->features);
	if (ret < 0)
		goto fail;
	if (!(d->features & (1ull << VIRTIO_F_VERSION_1))) {
		say(d, "the back-end does not offer VIRTIO_F_VERSION_1 (features 0x%" PRIx64
		    "); legacy devices are not supported", d->features);
		ret = -ENOTSUP;
		goto fail;
	}
	d->acked = d->features & IOC_VHF_DRIVER_FEATURES & ~o->features_off;
	d->acked |= 1ull << VIRTIO_F_VERSION_1;

	if (ioc_vhf_has(d, IOC_VHF_F_PROTOCOL_FEATURES)) {
		uint64_t want = (1ull << IOC_VHF_PF_MQ) | (1ull << IOC_VHF_PF_CONFIG);

		if (!o->no_reply_ack)
			want |= 1ull << IOC_VHF_PF_REPLY_ACK;
		if (!o->no_inflight)
			want |= 1ull << IOC_VHF_PF_INFLIGHT_SHMFD;
		ret = get_u64(d, VHU_GET_PROTOCOL_FEATURES, &d->pfeatures);
		if (ret < 0)
			goto fail;
		ret = set_u64(d, VHU_SET_PROTOCOL_FEATURES, d->pfeatures & want);
		if (ret < 0)
			goto fail;
		/* From here on messages may ask for REPLY_ACK. */
		d->packed = d->pfeatures & want;
	}
	d->max_queues = 1;
	if (d->packed & (1ull << IOC_VHF_PF_MQ)) {
		uint64_t n;

		ret = get_u64(d, VHU_GET_QUEUE_NUM, &n);
		if (ret < 0)
			goto fail;
		d->max_queues = n > IOC_VHF_MAX_QUEUES ? IOC_VHF_MAX_QUEUES : (unsigned)n;
	}
	if (d->nvqs > d->max_queues) {
		say(d, "%u queues asked for, the back-end has %u", d->nvqs, d->max_queues);
		ret = -EINVAL;
		goto fail;
	}
	if (d->nvqs > 1 && !ioc_vhf_has(d, VIRTIO_BLK_F_MQ)) {
		say(d, "%u queues asked for, the back-end does not offer VIRTIO_BLK_F_MQ",
		    d->nvqs);
		ret = -EINVAL;
		goto fail;
	}
	if (d->packed & (1ull << IOC_VHF_PF_CONFIG)) {
		struct vhu_config c = { .offset = 0, .size = IOC_VHF_BLK_CONFIG_SIZE };
		uint32_t n = sizeof(c);

		ret = ioc_vhf_request(d, VHU_GET_CONFIG, &c, 12 + IOC_VHF_BLK_CONFIG_SIZE, NULL, 0,
				  &c, &n, NULL);
		if (ret < 0)
			goto fail;
		if (n != 12 + IOC_VHF_BLK_CONFIG_SIZE || c.size != IOC_VHF_BLK_CONFIG_SIZE) {
			say(d, "GET_CONFIG failed (reply of %u bytes)", n);
			ret = -EPROTO;
			goto fail;
		}
		memcpy(&d->cfg, c.payload, IOC_VHF_BLK_CONFIG_SIZE);
		d->have_config = true;
	}
	ret = set_u64(d, VHU_SET_FEATURES, d->acked);
	if (ret < 0)
		goto fail;
	return 0;

fail:
	ioc_vhf_close(d);
	return ret;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static uint64_t ring_bytes(unsigned num)
{
	return align_up(16ull * num, 4096) + align_up(6 + 2ull * num, 4096) +
	       align_up(6 + 8ull * num, 4096);
}

void *ioc_vhf_alloc(struct ioc_vhf_dev *d, uint64_t size, uint64_t align)
{
	uint64_t at = align_up(d->mem_used, align ? align : 1);

	if (at > d->mem_size || size > d->mem_size - at)
		return NULL;
	d->mem_used = at + size;
	return d->mem + at;
}

uint64_t ioc_vhf_gpa(const struct ioc_vhf_dev *d, const void *p)
{
	return IOC_VHF_GUEST_BASE + (uint64_t)((const uint8_t *)p - d->mem);
}

static int start_vq(struct ioc_vhf_dev *d, struct ioc_vhf_vq *vq, unsigned index)
{
	struct vhu_state st = { .index = index, .num = d->queue_size };
	struct vhu_addr a = { .index = index };
	uint64_t u;
	int ret;

	vq->index = index;
	vq->num = d->queue_size;
	vq->sock_fd = d->sock;
	vq->mem = d->mem;
	vq->event_idx = ioc_vhf_has(d, VIRTIO_RING_F_EVENT_IDX);
	vq->desc = ioc_vhf_alloc(d, 16ull * vq->num, 4096);
	vq->avail = ioc_vhf_alloc(d, 6 + 2ull * vq->num, 4096);
	vq->used = ioc_vhf_alloc(d, 6 + 8ull * vq->num, 4096);
	if (!vq->desc || !vq->avail || !vq->used)
		return -ENOMEM;
	vq->used_event = &vq->avail->ring[vq->num];
	vq->avail_event = (uint16_t *)&vq->used->ring[vq->num];
	vq->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	vq->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (vq->kick_fd < 0 || vq->call_fd < 0) {
		ret = -errno;
		say(d, "eventfd: %s", strerror(-ret));
		return ret;
	}
	ret = ioc_vhf_request(d, VHU_SET_VRING_NUM, &st, sizeof(st), NULL, 0, NULL, NULL, NULL);
	if (ret < 0)
		return ret;
	st.num = 0;
	ret = ioc_vhf_request(d, VHU_SET_VRING_BASE, &st, sizeof(st), NULL, 0, NULL, NULL, NULL);
	if (ret < 0)
		return ret;
	/* Ring addresses are our (the "user") addresses; descriptors carry
	 * guest-physical ones. */
	a.desc = (uint64_t)(uintptr_t)vq->desc;
	a.used = (uint64_t)(uintptr_t)vq->used;
	a.avail = (uint64_t)(uintptr_t)vq->avail;
	ret = ioc_vhf_request(d, VHU_SET_VRING_ADDR, &a, sizeof(a), NULL, 0, NULL, NULL, NULL);
	if (ret < 0)
		return ret;
	u = index;
	ret = ioc_vhf_request(d, VHU_SET_VRING_KICK, &u, sizeof(u), &vq->kick_fd, 1, NULL, NULL,
			  NULL);
	if (ret < 0)
		return ret;
	return ioc_vhf_request(d, VHU_SET_VRING_CALL, &u, sizeof(u), &vq->call_fd, 1, NULL, NULL,
			   NULL);
}

int ioc_vhf_start(struct ioc_vhf_dev *d, uint64_t data_bytes)
{
	struct vhu_mem m = { .nregions = 1 };
	int ret;

	d->mem_size = align_up((uint64_t)d->nvqs * ring_bytes(d->queue_size) + data_bytes,
			       2u << 20);
	d->mem_fd = memfd_create("vhost-blk-guest", MFD_CLOEXEC);
	if (d->mem_fd < 0 || ftruncate(d->mem_fd, (off_t)d->mem_size) < 0) {
		ret = -errno;
		say(d, "guest memory (memfd of %" PRIu64 " bytes): %s", d->mem_size,
		    strerror(-ret));
		return ret;
	}
	d->mem = mmap(NULL, d->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->mem_fd, 0);
	if (d->mem == MAP_FAILED) {
		ret = -errno;
		d->mem = NULL;
		say(d, "mmap of guest memory: %s", strerror(-ret));
		return ret;
	}
	m.region[0] = (struct vhu_region){
		.gpa = IOC_VHF_GUEST_BASE, .size = d->mem_size,
		.uaddr = (uint64_t)(uintptr_t)d->mem, .mmap_offset = 0,
	};
	ret = ioc_vhf_request(d, VHU_SET_MEM_TABLE, &m, sizeof(m), &d->mem_fd, 1, NULL, NULL, NULL);
	if (ret < 0)
		return ret;

	if (d->packed & (1ull << IOC_VHF_PF_INFLIGHT_SHMFD)) {
		struct vhu_inflight in = { .num_queues = (uint16_t)d->nvqs,
					   .queue_size = (uint16_t)d->queue_size };
		uint32_t n = sizeof(in);

		ret = ioc_vhf_request(d, VHU_GET_INFLIGHT_FD, &in, sizeof(in), NULL, 0, &in, &n,
				  &d->inflight_fd);
		if (ret < 0)
			return ret;
		if (n != sizeof(in) || d->inflight_fd < 0) {
			say(d, "GET_INFLIGHT_FD: reply of %u bytes, %s", n,
			    d->inflight_fd < 0 ? "no fd" : "with an fd");
			return -EPROTO;
		}
		d->inflight_size = in.mmap_size;
		d->inflight = mmap(NULL, in.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED,
				   d->inflight_fd, (off_t)in.mmap_offset);
		if (d->inflight == MAP_FAILED) {
			ret = -errno;
			d->inflight = NULL;
			say(d, "mmap of the inflight area (%" PRIu64 " bytes): %s",
			    in.mmap_size, strerror(-ret));
			return ret;
		}
		in.num_queues = (uint16_t)d->nvqs;
		in.queue_size = (uint16_t)d->queue_size;
		ret = ioc_vhf_request(d, VHU_SET_INFLIGHT_FD, &in, sizeof(in), &d->inflight_fd, 1,
				  NULL, NULL, NULL);
		if (ret < 0)
			return ret;
	}
	for (unsigned i = 0; i < d->nvqs; i++) {
		ret = start_vq(d, &d->vq[i], i);
		if (ret < 0)
			return ret;
	}
	if (ioc_vhf_has(d, IOC_VHF_F_PROTOCOL_FEATURES)) {
		for (unsigned i = 0; i < d->nvqs; i++) {
			struct vhu_state st = { .index = i, .num = 1 };

			ret = ioc_vhf_request(d, VHU_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0,
					  NULL, NULL, NULL);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}

int ioc_vhf_stop(struct ioc_vhf_dev *d, uint16_t *bases)
{
	struct pollfd p = { .fd = d->sock, .events = POLLRDHUP };
	int first = 0;

	/* A back-end that hung up has stopped the rings itself. */
	if (d->sock < 0 || (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))))
		return -EPIPE;

	for (unsigned i = 0; i < d->nvqs && d->sock >= 0; i++) {
		struct vhu_state st = { .index = i };
		uint32_t n = sizeof(st);
		int ret;

		if (d->vq[i].kick_fd < 0)
			continue;
		ret = ioc_vhf_request(d, VHU_GET_VRING_BASE, &st, sizeof(st), NULL, 0, &st, &n,
				      NULL);
		if (ret == 0 && n != sizeof(st))
			ret = -EPROTO;
		if (ret < 0 && !first)
			first = ret;
		if (bases)
			bases[i] = ret < 0 ? 0 : (uint16_t)st.num;
	}
	return first;
}

void ioc_vhf_close(struct ioc_vhf_dev *d)
{
	for (unsigned i = 0; i < IOC_VHF_MAX_QUEUES; i++) {
		if (d->vq[i].kick_fd >= 0)
			close(d->vq[i].kick_fd);
		if (d->vq[i].call_fd >= 0)
			close(d->vq[i].call_fd);
		d->vq[i].kick_fd = d->vq[i].call_fd = -1;
	}
	if (d->sock >= 0)
		close(d->sock);
	if (d->mem)
		munmap(d->mem, d->mem_size);
	if (d->mem_fd >= 0)
		close(d->mem_fd);
	if (d->inflight)
		munmap(d->inflight, d->inflight_size);
	if (d->inflight_fd >= 0)
		close(d->inflight_fd);
	d->sock = d->mem_fd = d->inflight_fd = -1;
	d->mem = NULL;
	d->inflight = NULL;
}

/* --- the split virtqueue, driver side --- */

void ioc_vhf_vq_publish(struct ioc_vhf_vq *vq, uint16_t head)
{
	vq->avail->ring[vq->avail_idx & (vq->num - 1)] = htole16(head);
	vq->avail_idx++;
	/* The ring entry and the chain are visible before the index that
	 * covers them.  Pairs with the back-end's acquire load of avail->idx
	 * (libvhost-user: the read barrier after reading it). */
	__atomic_store_n(&vq->avail->idx, htole16(vq->avail_idx), __ATOMIC_RELEASE);
}

/* virtio's vring_need_event(): did [old, new) cross event? */
static bool need_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

int ioc_vhf_vq_kick(struct ioc_vhf_vq *vq)
{
	uint16_t old = vq->kick_idx, new_idx = vq->avail_idx;
	bool kick;

	if (old == new_idx)
		return 0;
	vq->kick_idx = new_idx;
	/* The avail->idx store before the read of the back-end's wish: a
	 * back-end that re-reads avail->idx after publishing avail_event (or
	 * clearing NO_NOTIFY) and a full barrier either sees our entries or
	 * we see its request for a kick.  Pairs with that barrier. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (vq->event_idx)
		kick = need_event(le16toh(__atomic_load_n(vq->avail_event, __ATOMIC_RELAXED)),
				  new_idx, old);
	else
		kick = !(le16toh(__atomic_load_n(&vq->used->flags, __ATOMIC_RELAXED)) &
			 VRING_USED_F_NO_NOTIFY);
	if (!kick)
		return 0;
	uint64_t one = 1;

	if (write(vq->kick_fd, &one, sizeof(one)) != sizeof(one))
		return -errno;
	vq->kicks++;
	return 1;
}

int ioc_vhf_vq_pop_used(struct ioc_vhf_vq *vq, uint32_t *id, uint32_t *len)
{
	/* Pairs with the back-end's release of used->idx after it wrote the
	 * element (libvhost-user: the write barrier before the idx store). */
	uint16_t idx = le16toh(__atomic_load_n(&vq->used->idx, __ATOMIC_ACQUIRE));
	struct vring_used_elem *e;

	if (idx == vq->last_used)
		return 0;
	e = &vq->used->ring[vq->last_used & (vq->num - 1)];
	*id = le32toh(e->id);
	*len = le32toh(e->len);
	vq->last_used++;
	return 1;
}

static bool used_pending(struct ioc_vhf_vq *vq)
{
	/* Pairs with the back-end's release of used->idx, as in
	 * ioc_vhf_vq_pop_used(). */
	return le16toh(__atomic_load_n(&vq->used->idx, __ATOMIC_ACQUIRE)) != vq->last_used;
}

void ioc_vhf_vq_no_interrupts(struct ioc_vhf_vq *vq)
{
	/* With EVENT_IDX the flags must stay 0; used_event half the index
	 * space ahead keeps the back-end quiet for 32768 completions, and
	 * ioc_vhf_vq_wait() moves it on.  Relaxed stores: they pair with the
	 * back-end's read of used_event or flags when it decides whether to
	 * signal, and a value it sees late costs one needless call, which a
	 * polling driver never waits for. */
	if (vq->event_idx)
		__atomic_store_n(vq->used_event, htole16((uint16_t)(vq->last_used + 0x8000)),
				 __ATOMIC_RELAXED);
	else
		__atomic_store_n(&vq->avail->flags, htole16(VRING_AVAIL_F_NO_INTERRUPT),
				 __ATOMIC_RELAXED);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#endif
}

static int hung_up(struct ioc_vhf_vq *vq)
{
	struct pollfd p = { .fd = vq->sock_fd, .events = POLLRDHUP };

	return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

int ioc_vhf_vq_wait(struct ioc_vhf_vq *vq, bool poll_mode, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;

	if (poll_mode) {
		unsigned spins = 0;

		if (vq->event_idx)
			ioc_vhf_vq_no_interrupts(vq);
		while (!used_pending(vq)) {
			if (++spins % 4096 == 0) {
				if (hung_up(vq))
					return -EPIPE;
				if (now_ms() >= deadline)
					return -ETIMEDOUT;
			}
			cpu_relax();
		}
		return 0;
	}
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = vq->call_fd, .events = POLLIN },
			{ .fd = vq->sock_fd, .events = POLLRDHUP },
		};
		int64_t left;
		uint64_t v;
		int r;

		/* Ask for a call at the next completion, then look again: a
		 * completion that raced with the request is seen here, one
		 * after it signals.  The fence pairs with the back-end's
		 * barrier between its used->idx store and its read of
		 * used_event. */
		if (vq->event_idx)
			__atomic_store_n(vq->used_event, htole16(vq->last_used),
					 __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (used_pending(vq))
			return 0;
		left = deadline - now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(p, 2, (int)left);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r > 0 && (p[0].revents & POLLIN)) {
			if (read(vq->call_fd, &v, sizeof(v)) == sizeof(v))
				vq->calls++;
		}
		if (r > 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) &&
		    !used_pending(vq))
			return -EPIPE;
	}
}

/* --- virtio-blk requests --- */

/* Per slot: header, segment, id, status in one 64-byte block; the
 * indirect table; the data. */
#define SLOT_META 64

/* The data of a request goes in segments of at most size_max bytes when
 * the device set VIRTIO_BLK_F_SIZE_MAX to something (qemu-storage-daemon
 * offers the bit with 0, which limits nothing). */
static uint64_t seg_size(const struct ioc_vhf_dev *d, uint64_t data_cap)
{
	uint32_t m = ioc_vhf_has(d, VIRTIO_BLK_F_SIZE_MAX) ?
		     ioc_vhf_blk_cfg32(d, &d->cfg.size_max) : 0;

	return m && m < data_cap ? m : data_cap;
}

static unsigned slot_descs(const struct ioc_vhf_dev *d, uint64_t data_cap)
{
	uint64_t seg = seg_size(d, data_cap);

	return 2 + (unsigned)(data_cap ? (data_cap + seg - 1) / seg : 1);
}

unsigned ioc_vhf_blk_slot_descs(const struct ioc_vhf_dev *d, uint64_t data_cap, bool indirect)
{
	return indirect ? 1 : slot_descs(d, data_cap);
}

uint64_t ioc_vhf_blk_slot_bytes(const struct ioc_vhf_dev *d, uint64_t data_cap)
{
	return SLOT_META + 16ull * slot_descs(d, data_cap) + 64 + align_up(data_cap, 4096) +
	       4096;
}

int ioc_vhf_blk_slots(struct ioc_vhf_dev *d, struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *slots,
		  unsigned n, uint64_t data_cap, bool indirect)
{
	unsigned nd = slot_descs(d, data_cap);
	uint32_t seg_max = ioc_vhf_has(d, VIRTIO_BLK_F_SEG_MAX) ?
			   ioc_vhf_blk_cfg32(d, &d->cfg.seg_max) : 0;

	if (seg_max && nd - 2 > seg_max) {
		say(d, "requests of %" PRIu64 " bytes need %u segments of size_max, the "
		    "device takes %u (seg_max)", data_cap, nd - 2, seg_max);
		return -EINVAL;
	}
	if ((uint64_t)n * (indirect ? 1 : nd) > vq->num) {
		say(d, "%u requests in flight need %" PRIu64 " descriptors, the ring has %u "
		    "(a larger --queue-size or --indirect)", n,
		    (uint64_t)n * (indirect ? 1 : nd), vq->num);
		return -ENOSPC;
	}
	for (unsigned i = 0; i < n; i++) {
		struct ioc_vhf_blk_slot *s = &slots[i];
		uint8_t *meta = ioc_vhf_alloc(d, SLOT_META, 64);

		memset(s, 0, sizeof(*s));
		s->itab = ioc_vhf_alloc(d, 16ull * nd, 64);
		s->data = data_cap ? ioc_vhf_alloc(d, data_cap, 4096) : NULL;
		if (!meta || !s->itab || (data_cap && !s->data)) {
			say(d, "guest memory too small for %u slots of %" PRIu64 " bytes", n,
			    data_cap);
			return -ENOSPC;
		}
		s->hdr = (struct virtio_blk_outhdr *)meta;
		s->seg = (struct virtio_blk_discard_write_zeroes *)(meta + 16);
		s->id = (char *)(meta + 32);
		s->status = meta + 52;
		s->data_cap = data_cap;
		s->seg_size = seg_size(d, data_cap);
		s->ndesc = (uint16_t)nd;
		s->indirect = indirect;
		s->head = (uint16_t)(indirect ? i : nd * i);
	}
	return 0;
}

int ioc_vhf_blk_slot_of(const struct ioc_vhf_blk_slot *slots, unsigned n, uint32_t id)
{
	uint32_t i;

	if (!n)
		return -1;
	i = slots[0].indirect ? id : id / slots[0].ndesc;
	return i < n && slots[i].head == id ? (int)i : -1;
}

static void set_desc(struct vring_desc *d, uint64_t addr, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	d->addr = htole64(addr);
	d->len = htole32(len);
	d->flags = htole16(flags);
	d->next = htole16(next);
}

void ioc_vhf_blk_submit(struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *s, uint32_t type,
		    uint64_t sector, uint64_t len, uint32_t num_sectors, uint32_t seg_flags)
{
	struct vring_desc *t = s->indirect ? s->itab : &vq->desc[s->head];
	uint16_t base = s->indirect ? 0 : s->head, n = 0;

	s->type = type;
	s->hdr->type = htole32(type);
	s->hdr->ioprio = 0;
	s->hdr->sector = htole64(sector);
	*s->status = 0xff;
	set_desc(&t[n], ioc_vhf_vq_gpa(vq, s->hdr), 16, VRING_DESC_F_NEXT, base + n + 1);
	n++;
	switch (type) {
	case VIRTIO_BLK_T_IN:
	case VIRTIO_BLK_T_OUT: {
		uint16_t f = VRING_DESC_F_NEXT |
			     (type == VIRTIO_BLK_T_IN ? VRING_DESC_F_WRITE : 0);

		for (uint64_t at = 0; at < len; at += s->seg_size) {
			uint64_t l = len - at < s->seg_size ? len - at : s->seg_size;

			set_desc(&t[n], ioc_vhf_vq_gpa(vq, s->data + at), (uint32_t)l, f,
				 base + n + 1);
			n++;
		}
		break;
	}
	case VIRTIO_BLK_T_GET_ID:
		set_desc(&t[n], ioc_vhf_vq_gpa(vq, s->id), VIRTIO_BLK_ID_BYTES,
			 VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, base + n + 1);
		n++;
		break;
	case VIRTIO_BLK_T_DISCARD:
	case VIRTIO_BLK_T_WRITE_ZEROES:
		s->seg->sector = htole64(sector);
		s->seg->num_sectors = htole32(num_sectors);
		s->seg->flags = htole32(seg_flags);
		set_desc(&t[n], ioc_vhf_vq_gpa(vq, s->seg), 16, VRING_DESC_F_NEXT, base + n + 1);
		n++;
		break;
	default:
		break;
	}
	set_desc(&t[n], ioc_vhf_vq_gpa(vq, s->status), 1, VRING_DESC_F_WRITE, 0);
	n++;
	if (s->indirect)
		set_desc(&vq->desc[s->head], ioc_vhf_vq_gpa(vq, s->itab),
			 (uint32_t)(n * sizeof(*t)), VRING_DESC_F_INDIRECT, 0);
	ioc_vhf_vq_publish(vq, s->head);
}

uint64_t ioc_vhf_blk_capacity(const struct ioc_vhf_dev *d)
{
	return d->have_config ? le64toh(d->cfg.capacity) * 512 : 0;
}

uint32_t ioc_vhf_blk_cfg32(const struct ioc_vhf_dev *d, const void *field)
{
	uint32_t v;

	if (!d->have_config)
		return 0;
	memcpy(&v, field, sizeof(v));
	return le32toh(v);
}

uint16_t ioc_vhf_blk_cfg16(const struct ioc_vhf_dev *d, const void *field)
{
	uint16_t v;

	if (!d->have_config)
		return 0;
	memcpy(&v, field, sizeof(v));
	return le16toh(v);
}

uint32_t ioc_vhf_blk_size(const struct ioc_vhf_dev *d)
{
	uint32_t b = ioc_vhf_has(d, VIRTIO_BLK_F_BLK_SIZE) ?
		     ioc_vhf_blk_cfg32(d, &d->cfg.blk_size) : 0;

	return b ? b : 512;
}
