/*
 * The vhost-user front-end library (tools/bench/vhost-frontend.c) against
 * a stub back-end in a thread of this test, so that it runs without
 * qemu-storage-daemon and can check what the daemon would not show: the
 * order and flags of the messages (need_reply only once REPLY_ACK is
 * negotiated), the INFLIGHT_SHMFD exchange, the kick and call suppression
 * rules, and how the front-end takes a back-end that misbehaves (a used
 * id it never made available, a hang-up, silence, a refused message).
 *
 * The stub serves a 1 MiB RAM disk: it maps the memory table, walks
 * direct and indirect chains, and signals per EVENT_IDX or NO_INTERRUPT.
 * It is a fixture, not a back-end: it trusts the front-end's chains.
 */
#include <endian.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <linux/virtio_config.h>

#include "tap.h"
#include "vhost-frontend.h"

#define DISK_SIZE (1u << 20)
#define MAX_MSGS 256

enum stub_mode { STUB_OK, STUB_BOGUS_ID, STUB_HANGUP_ON_KICK, STUB_SILENT,
		 STUB_NACK_MEM_TABLE };

struct svq {
	unsigned num;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	int kick, call;
	bool enabled;
	uint16_t last_avail, used_idx;
};

struct stub {
	char dir[64], path[108];
	int lfd, fd, stop;
	pthread_t tid;
	/* What it offers. */
	uint64_t features, pfeatures;
	unsigned nq;
	uint32_t size_max;       /* with VIRTIO_BLK_F_SIZE_MAX */
	enum stub_mode mode;
	/* What it was told. */
	uint64_t acked, packed;
	uint8_t *mem, *map;
	uint64_t mem_gpa, mem_size, mem_ua, map_size;
	int inflight_fd;
	bool inflight_set;
	struct svq vq[4];
	uint8_t disk[DISK_SIZE];
	unsigned nmsgs;
	uint32_t req[MAX_MSGS], flags[MAX_MSGS];
	unsigned calls;
	unsigned max_segs;       /* the most data segments one request had */
};

static uint8_t *gpa2p(struct stub *s, uint64_t gpa, uint64_t len)
{
	if (gpa < s->mem_gpa || gpa - s->mem_gpa > s->mem_size ||
	    len > s->mem_size - (gpa - s->mem_gpa))
		return NULL;
	return s->mem + (gpa - s->mem_gpa);
}

static void *ua2p(struct stub *s, uint64_t ua)
{
	return ua >= s->mem_ua && ua - s->mem_ua < s->mem_size ? s->mem + (ua - s->mem_ua)
								: NULL;
}

static int stub_send(struct stub *s, uint32_t req, const void *p, uint32_t size, int fd)
{
	uint32_t h[3] = { req, 0x1 | 0x4, size };
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} ctl;
	struct iovec iov[2] = { { h, 12 }, { (void *)p, size } };
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		m.msg_control = ctl.b;
		m.msg_controllen = sizeof(ctl.b);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(s->fd, &m, MSG_NOSIGNAL) == (ssize_t)(12 + size) ? 0 : -1;
}

/* One request from the front-end: header, payload, fds. */
static int stub_recv(struct stub *s, uint32_t *h, uint8_t *payload, int *fds, int *nfds)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr a;
	} ctl;
	struct iovec iov = { h, 12 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b) };
	size_t got = 0;

	*nfds = 0;
	if (recvmsg(s->fd, &m, MSG_WAITALL) != 12)
		return -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_type == SCM_RIGHTS) {
			*nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			memcpy(fds, CMSG_DATA(c), (size_t)*nfds * sizeof(int));
		}
	}
	if (h[2] > 512)
		return -1;
	while (got < h[2]) {
		ssize_t n = read(s->fd, payload + got, h[2] - got);

		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static bool need_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

/* Run one chain on the RAM disk; returns the bytes written to the
 * front-end's buffers. */
static uint32_t stub_exec(struct stub *s, struct svq *q, uint16_t head)
{
	struct { uint8_t *p; uint32_t len; bool w; } seg[8];
	struct vring_desc *t = q->desc;
	unsigned n = 0, tn = q->num;
	uint16_t i = head;
	uint32_t written = 0;

	if (le16toh(t[i].flags) & VRING_DESC_F_INDIRECT) {
		tn = le32toh(t[i].len) / 16;
		t = (struct vring_desc *)gpa2p(s, le64toh(t[i].addr), le32toh(t[i].len));
		i = 0;
	}
	for (;;) {
		if (n == 8 || i >= tn || !t)
			return 0;
		seg[n].len = le32toh(t[i].len);
		seg[n].p = gpa2p(s, le64toh(t[i].addr), seg[n].len);
		seg[n].w = le16toh(t[i].flags) & VRING_DESC_F_WRITE;
		if (!seg[n].p)
			return 0;
		n++;
		if (!(le16toh(t[i].flags) & VRING_DESC_F_NEXT))
			break;
		i = le16toh(t[i].next);
	}
	if (n < 2 || seg[0].len < 16 || !seg[n - 1].w)
		return 0;

	struct virtio_blk_outhdr hdr;
	uint64_t off, len = 0;
	uint8_t st = VIRTIO_BLK_S_OK;

	if (n - 2 > s->max_segs)
		s->max_segs = n - 2;
	for (unsigned k = 1; k + 1 < n; k++)
		if (s->size_max && seg[k].len > s->size_max)
			return 0;
	memcpy(&hdr, seg[0].p, 16);
	off = le64toh(hdr.sector) * 512;
	for (unsigned k = 1; k + 1 < n; k++)
		len += seg[k].len;
	switch (le32toh(hdr.type)) {
	case VIRTIO_BLK_T_IN:
	case VIRTIO_BLK_T_OUT:
		if (off > DISK_SIZE || len > DISK_SIZE - off) {
			st = VIRTIO_BLK_S_IOERR;
			break;
		}
		for (unsigned k = 1; k + 1 < n; k++) {
			if (le32toh(hdr.type) == VIRTIO_BLK_T_IN) {
				memcpy(seg[k].p, s->disk + off, seg[k].len);
				written += seg[k].len;
			} else {
				memcpy(s->disk + off, seg[k].p, seg[k].len);
			}
			off += seg[k].len;
		}
		break;
	case VIRTIO_BLK_T_FLUSH:
		break;
	case VIRTIO_BLK_T_GET_ID:
		memcpy(seg[1].p, "stub", 5);
		written += seg[1].len;
		break;
	default:
		st = VIRTIO_BLK_S_UNSUPP;
	}
	seg[n - 1].p[seg[n - 1].len - 1] = st;
	return written + 1;
}

static void stub_serve(struct stub *s, struct svq *q)
{
	bool event_idx = s->acked & (1ull << VIRTIO_RING_F_EVENT_IDX);
	uint16_t old = q->used_idx, avail;
	uint64_t v;

	if (read(q->kick, &v, sizeof(v)) < 0)
		return;
	if (!q->enabled || s->mode == STUB_SILENT)
		return;
	for (;;) {
		avail = le16toh(__atomic_load_n(&q->avail->idx, __ATOMIC_ACQUIRE));
		if (avail == q->last_avail)
			break;
		while (q->last_avail != avail) {
			uint16_t head = le16toh(q->avail->ring[q->last_avail % q->num]);
			struct vring_used_elem *e = &q->used->ring[q->used_idx % q->num];
			uint32_t len = stub_exec(s, q, head);

			q->last_avail++;
			e->id = htole32(s->mode == STUB_BOGUS_ID ? head + 1u : head);
			e->len = htole32(len);
			q->used_idx++;
			__atomic_store_n(&q->used->idx, htole16(q->used_idx), __ATOMIC_RELEASE);
		}
		if (event_idx)
			__atomic_store_n((uint16_t *)&q->used->ring[q->num], htole16(q->last_avail),
					 __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
	}
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (event_idx ? need_event(le16toh(q->avail->ring[q->num]), q->used_idx, old) :
	    !(le16toh(q->avail->flags) & VRING_AVAIL_F_NO_INTERRUPT)) {
		v = 1;
		if (write(q->call, &v, sizeof(v)) == sizeof(v))
			s->calls++;
	}
}

/* Returns false when the connection is to end. */
static bool stub_message(struct stub *s)
{
	uint8_t p[512] = { 0 };
	uint32_t h[3];
	int fds[8], nfds;
	uint64_t u64, ack = 0;
	bool replied = false;

	if (stub_recv(s, h, p, fds, &nfds) < 0)
		return false;
	if (s->nmsgs < MAX_MSGS) {
		s->req[s->nmsgs] = h[0];
		s->flags[s->nmsgs++] = h[1];
	}
	memcpy(&u64, p, 8);
	switch (h[0]) {
	case 1: /* GET_FEATURES */
		stub_send(s, h[0], &s->features, 8, -1);
		replied = true;
		break;
	case 2: s->acked = u64; break;
	case 3: break;
	case 5: { /* SET_MEM_TABLE */
		uint64_t r[4];

		memcpy(r, p + 8, sizeof(r));
		s->mem_gpa = r[0];
		s->mem_size = r[1];
		s->mem_ua = r[2];
		s->map_size = r[1] + r[3];
		s->map = mmap(NULL, s->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		close(fds[0]);
		if (s->map == MAP_FAILED) {
			s->map = NULL;
			return false;
		}
		s->mem = s->map + r[3];
		if (s->mode == STUB_NACK_MEM_TABLE)
			ack = 1;
		break;
	}
	case 8: s->vq[p[0]].num = (unsigned)(u64 >> 32); break;
	case 9: { /* SET_VRING_ADDR */
		uint32_t idx;
		uint64_t a[4];

		memcpy(&idx, p, 4);
		memcpy(a, p + 8, sizeof(a));
		s->vq[idx].desc = ua2p(s, a[0]);
		s->vq[idx].used = ua2p(s, a[1]);
		s->vq[idx].avail = ua2p(s, a[2]);
		break;
	}
	case 10: s->vq[p[0]].last_avail = (uint16_t)(u64 >> 32); break;
	case 11: { /* GET_VRING_BASE */
		uint32_t st[2] = { p[0], s->vq[p[0]].last_avail };

		stub_send(s, h[0], st, 8, -1);
		replied = true;
		break;
	}
	case 12:
		s->vq[u64 & 0xff].kick = fds[0];
		/* Without protocol features a ring starts enabled. */
		if (!(s->acked & (1ull << IOC_VHF_F_PROTOCOL_FEATURES)))
			s->vq[u64 & 0xff].enabled = true;
		break;
	case 13: s->vq[u64 & 0xff].call = fds[0]; break;
	case 15:
		stub_send(s, h[0], &s->pfeatures, 8, -1);
		replied = true;
		break;
	case 16: s->packed = u64; break;
	case 17: {
		uint64_t n = s->nq;

		stub_send(s, h[0], &n, 8, -1);
		replied = true;
		break;
	}
	case 18: s->vq[p[0]].enabled = p[4]; break;
	case 24: { /* GET_CONFIG */
		struct virtio_blk_config c = { 0 };

		c.capacity = htole64(DISK_SIZE / 512);
		c.blk_size = htole32(512);
		c.num_queues = htole16((uint16_t)s->nq);
		c.size_max = htole32(s->size_max);
		c.seg_max = htole32(6);
		memcpy(p + 12, &c, IOC_VHF_BLK_CONFIG_SIZE);
		stub_send(s, h[0], p, h[2], -1);
		replied = true;
		break;
	}
	case 31: { /* GET_INFLIGHT_FD */
		uint64_t in[3];
		int fd = memfd_create("stub-inflight", MFD_CLOEXEC);

		memcpy(in, p, sizeof(in));
		in[0] = 4096;
		in[1] = 0;
		if (fd < 0 || ftruncate(fd, 4096) < 0)
			return false;
		stub_send(s, h[0], in, 24, fd);
		close(fd);
		replied = true;
		break;
	}
	case 32:
		s->inflight_set = nfds == 1 && h[2] == 24;
		if (nfds == 1)
			s->inflight_fd = fds[0];
		break;
	default:
		return false;
	}
	if (!replied && (h[1] & 0x8))
		stub_send(s, h[0], &ack, 8, -1);
	return true;
}

static void *stub_main(void *opaque)
{
	struct stub *s = opaque;
	struct pollfd p[2] = { { .fd = s->lfd, .events = POLLIN },
			       { .fd = s->stop, .events = POLLIN } };

	if (poll(p, 2, 10000) <= 0 || !(p[0].revents & POLLIN))
		return NULL;
	s->fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
	for (;;) {
		struct pollfd w[2 + 4];
		unsigned n = 0;

		w[n++] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
		w[n++] = (struct pollfd){ .fd = s->stop, .events = POLLIN };
		for (unsigned i = 0; i < 4; i++)
			w[n++] = (struct pollfd){ .fd = s->vq[i].kick > 0 ? s->vq[i].kick : -1,
						  .events = POLLIN };
		if (poll(w, n, 10000) <= 0 || w[1].revents)
			break;
		if (w[0].revents && !stub_message(s))
			break;
		for (unsigned i = 0; i < 4; i++) {
			if (!(w[2 + i].revents & POLLIN))
				continue;
			if (s->mode == STUB_HANGUP_ON_KICK)
				goto out;
			stub_serve(s, &s->vq[i]);
		}
	}
out:
	close(s->fd);
	s->fd = -1;
	return NULL;
}

static struct stub *stub_start(uint64_t features, uint64_t pfeatures, unsigned nq,
			       enum stub_mode mode, uint32_t size_max)
{
	struct stub *s = calloc(1, sizeof(*s));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	ASSERT_NOT_NULL(s);
	strcpy(s->dir, "/tmp/ioc-vhf.XXXXXX");
	ASSERT_NOT_NULL(mkdtemp(s->dir));
	snprintf(s->path, sizeof(s->path), "%s/sock", s->dir);
	strcpy(sa.sun_path, s->path);
	s->features = features;
	s->pfeatures = pfeatures;
	s->nq = nq;
	s->mode = mode;
	s->size_max = size_max;
	s->fd = s->inflight_fd = -1;
	for (unsigned i = 0; i < 4; i++)
		s->vq[i].kick = s->vq[i].call = -1;
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(s->lfd, 0);
	ASSERT_OK(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(s->lfd, 1));
	s->stop = eventfd(0, EFD_CLOEXEC);
	ASSERT_GE(s->stop, 0);
	ASSERT_EQ(pthread_create(&s->tid, NULL, stub_main, s), 0);
	return s;
}

/* Stops the thread; what the stub saw stays readable until stub_free(). */
static void stub_stop(struct stub *s)
{
	uint64_t one = 1;

	ASSERT_EQ(write(s->stop, &one, 8), 8);
	pthread_join(s->tid, NULL);
	close(s->lfd);
	close(s->stop);
	for (unsigned i = 0; i < 4; i++) {
		if (s->vq[i].kick >= 0)
			close(s->vq[i].kick);
		if (s->vq[i].call >= 0)
			close(s->vq[i].call);
	}
	if (s->inflight_fd >= 0)
		close(s->inflight_fd);
	if (s->map)
		munmap(s->map, s->map_size);
	unlink(s->path);
	rmdir(s->dir);
}

static void stub_free(struct stub *s)
{
	free(s);
}

#define ALL_FEATURES ((1ull << VIRTIO_F_VERSION_1) | (1ull << IOC_VHF_F_PROTOCOL_FEATURES) | \
		      (1ull << VIRTIO_RING_F_EVENT_IDX) |                             \
		      (1ull << VIRTIO_RING_F_INDIRECT_DESC) | (1ull << VIRTIO_BLK_F_MQ) | \
		      (1ull << VIRTIO_BLK_F_FLUSH) | (1ull << VIRTIO_BLK_F_BLK_SIZE))
#define ALL_PFEATURES ((1ull << IOC_VHF_PF_MQ) | (1ull << IOC_VHF_PF_REPLY_ACK) |         \
		       (1ull << IOC_VHF_PF_CONFIG) | (1ull << IOC_VHF_PF_INFLIGHT_SHMFD))

/* One request on slot sl, waited for: its status. */
static int do_io(struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *sl, uint32_t type, uint64_t sector,
		 uint64_t len, bool poll_mode)
{
	uint32_t id, ulen;
	int ret;

	ioc_vhf_blk_submit(vq, sl, type, sector, len, 0, 0);
	ioc_vhf_vq_kick(vq);
	while (!ioc_vhf_vq_pop_used(vq, &id, &ulen)) {
		ret = ioc_vhf_vq_wait(vq, poll_mode, 5000);
		if (ret < 0)
			return ret;
	}
	ASSERT_EQ(id, sl->head);
	return *sl->status;
}

static void test_handshake(void)
{
	struct stub *s = stub_start(ALL_FEATURES, ALL_PFEATURES, 2, STUB_OK, 0);
	struct ioc_vhf_opts o = { .socket = s->path, .queues = 2, .timeout_ms = 5000 };
	struct ioc_vhf_dev d;
	uint16_t bases[2];
	bool acks = false;

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_UEQ(d.packed, ALL_PFEATURES);
	ASSERT_EQ(d.max_queues, 2);
	ASSERT_UEQ(ioc_vhf_blk_capacity(&d), DISK_SIZE);
	ASSERT_OK(ioc_vhf_start(&d, 1 << 20));
	ASSERT_OK(ioc_vhf_stop(&d, bases));
	ioc_vhf_close(&d);
	stub_stop(s);
	/* Every message is version 1; need_reply appears only after
	 * SET_PROTOCOL_FEATURES (16), then on every message without a reply
	 * of its own. */
	ASSERT_EQ(s->req[0], 3); /* SET_OWNER first */
	for (unsigned i = 0; i < s->nmsgs; i++) {
		bool has_reply = s->req[i] == 1 || s->req[i] == 11 || s->req[i] == 15 ||
				 s->req[i] == 17 || s->req[i] == 24 || s->req[i] == 31;

		ASSERT_EQ(s->flags[i] & 3, 1);
		if (!acks)
			ASSERT_EQ(s->flags[i] & 8, 0);
		else
			ASSERT_EQ(!!(s->flags[i] & 8), !has_reply);
		if (s->req[i] == 16)
			acks = true;
	}
	ASSERT_TRUE(s->inflight_set);
	ASSERT_TRUE(s->vq[0].enabled && s->vq[1].enabled);
	ASSERT_UEQ(s->acked & (1ull << IOC_VHF_F_PROTOCOL_FEATURES),
		   1ull << IOC_VHF_F_PROTOCOL_FEATURES);
	stub_free(s);
}

/* Write a pattern in every ring set-up, read it back, and find it in the
 * stub's disk too. */
static void roundtrip_max(uint64_t features_off, bool indirect, bool poll_mode,
			  uint32_t size_max)
{
	struct stub *s = stub_start(ALL_FEATURES | (1ull << VIRTIO_BLK_F_SIZE_MAX) |
				    (1ull << VIRTIO_BLK_F_SEG_MAX), ALL_PFEATURES, 1, STUB_OK,
				    size_max);
	struct ioc_vhf_opts o = { .socket = s->path, .timeout_ms = 5000,
			      .features_off = features_off };
	struct ioc_vhf_blk_slot sl[4];
	static uint8_t want[65536];
	struct ioc_vhf_dev d;

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_OK(ioc_vhf_start(&d, 4 * ioc_vhf_blk_slot_bytes(&d, 65536)));
	ASSERT_OK(ioc_vhf_blk_slots(&d, &d.vq[0], sl, 4, 65536, indirect));
	if (poll_mode)
		ioc_vhf_vq_no_interrupts(&d.vq[0]);
	for (unsigned r = 0; r < 40; r++) {
		uint64_t blk = r % (DISK_SIZE / 65536);

		for (unsigned i = 0; i < 65536; i++)
			want[i] = (uint8_t)(i * 7 + r);
		memcpy(sl[r % 4].data, want, 65536);
		ASSERT_EQ(do_io(&d.vq[0], &sl[r % 4], VIRTIO_BLK_T_OUT, blk * 128, 65536,
				poll_mode), VIRTIO_BLK_S_OK);
		memset(sl[(r + 1) % 4].data, 0, 65536);
		ASSERT_EQ(do_io(&d.vq[0], &sl[(r + 1) % 4], VIRTIO_BLK_T_IN, blk * 128, 65536,
				poll_mode), VIRTIO_BLK_S_OK);
		ASSERT_MEM_EQ(sl[(r + 1) % 4].data, want, 65536);
	}
	ASSERT_EQ(do_io(&d.vq[0], &sl[0], VIRTIO_BLK_T_FLUSH, 0, 0, poll_mode), 0);
	ASSERT_EQ(do_io(&d.vq[0], &sl[0], VIRTIO_BLK_T_GET_ID, 0, 0, poll_mode), 0);
	ASSERT_STR_EQ(sl[0].id, "stub");
	ASSERT_EQ(do_io(&d.vq[0], &sl[0], VIRTIO_BLK_T_IN, DISK_SIZE / 512, 512, poll_mode),
		  VIRTIO_BLK_S_IOERR);
	ASSERT_EQ(do_io(&d.vq[0], &sl[0], 0x77, 0, 0, poll_mode), VIRTIO_BLK_S_UNSUPP);
	ASSERT_OK(ioc_vhf_stop(&d, NULL));
	ioc_vhf_close(&d);
	stub_stop(s);
	/* Polling asked for no calls, and got none.  (With calls, whether
	 * one comes depends on who is faster: nothing to assert.) */
	if (poll_mode)
		ASSERT_EQ(s->calls, 0);
	ASSERT_EQ(s->vq[0].last_avail, 84);
	/* The stub's disk holds the last pattern written to each block (read
	 * once its thread is joined: it wrote the disk through its own
	 * mapping of the rings, which a race detector cannot pair up). */
	for (unsigned blk = 0; blk < DISK_SIZE / 65536; blk++) {
		/* Its last round of the 40, one block per round in turn. */
		unsigned r = blk + (DISK_SIZE / 65536) * ((39 - blk) / (DISK_SIZE / 65536));

		for (unsigned i = 0; i < 65536; i++)
			want[i] = (uint8_t)(i * 7 + r);
		ASSERT_MEM_EQ(s->disk + blk * 65536, want, 65536);
	}
	/* Data in segments of at most size_max, as the device asked. */
	ASSERT_EQ(s->max_segs, size_max ? 65536 / size_max : 1);
	stub_free(s);
}

static void roundtrip(uint64_t features_off, bool indirect, bool poll_mode)
{
	roundtrip_max(features_off, indirect, poll_mode, 0);
}

static void test_roundtrip_event_idx(void) { roundtrip(0, false, false); }
static void test_roundtrip_no_event_idx(void)
{
	roundtrip(1ull << VIRTIO_RING_F_EVENT_IDX, false, false);
}
static void test_roundtrip_indirect(void) { roundtrip(0, true, false); }
static void test_roundtrip_poll(void)
{
	roundtrip(1ull << VIRTIO_RING_F_EVENT_IDX, false, true);
}
static void test_roundtrip_poll_event_idx(void) { roundtrip(0, true, true); }
static void test_roundtrip_size_max(void) { roundtrip_max(0, false, false, 16384); }
static void test_roundtrip_size_max_indirect(void)
{
	roundtrip_max(0, true, false, 16384);
}

/* More segments than seg_max: refused when the slots are made. */
static void test_seg_max(void)
{
	struct stub *s = stub_start(ALL_FEATURES | (1ull << VIRTIO_BLK_F_SIZE_MAX) |
				    (1ull << VIRTIO_BLK_F_SEG_MAX), ALL_PFEATURES, 1, STUB_OK,
				    4096);
	struct ioc_vhf_opts o = { .socket = s->path, .timeout_ms = 5000 };
	struct ioc_vhf_blk_slot sl[1];
	struct ioc_vhf_dev d;

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_OK(ioc_vhf_start(&d, ioc_vhf_blk_slot_bytes(&d, 65536)));
	ASSERT_EQ(ioc_vhf_blk_slots(&d, &d.vq[0], sl, 1, 65536, false), -EINVAL);
	ioc_vhf_close(&d);
	stub_stop(s);
	stub_free(s);
}

/* The kick decision, from the ring fields the back-end writes. */
static void test_kick_suppression(void)
{
	struct stub *s = stub_start(ALL_FEATURES, ALL_PFEATURES, 1, STUB_SILENT, 0);
	struct ioc_vhf_opts o = { .socket = s->path, .timeout_ms = 5000 };
	struct ioc_vhf_blk_slot sl[8];
	struct ioc_vhf_dev d;
	struct ioc_vhf_vq *vq;

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_OK(ioc_vhf_start(&d, 8 * ioc_vhf_blk_slot_bytes(&d, 4096)));
	vq = &d.vq[0];
	ASSERT_OK(ioc_vhf_blk_slots(&d, vq, sl, 8, 4096, false));
	ASSERT_TRUE(vq->event_idx);
	/* avail_event = 0: the first entry (index 0) crosses it. */
	ioc_vhf_blk_submit(vq, &sl[0], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 1);
	/* Still 0: entries 1 and 2 do not cross it again. */
	ioc_vhf_blk_submit(vq, &sl[1], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ioc_vhf_blk_submit(vq, &sl[2], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 0);
	/* The back-end asks to be kicked at index 4: entry 3 does not reach
	 * it, entries 4 and 5 together do. */
	*vq->avail_event = htole16(4);
	ioc_vhf_blk_submit(vq, &sl[3], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 0);
	ioc_vhf_blk_submit(vq, &sl[4], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ioc_vhf_blk_submit(vq, &sl[5], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 1);
	/* Nothing new: no kick. */
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 0);
	/* Without EVENT_IDX the used ring's NO_NOTIFY flag decides. */
	vq->event_idx = false;
	vq->used->flags = htole16(VRING_USED_F_NO_NOTIFY);
	ioc_vhf_blk_submit(vq, &sl[6], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 0);
	vq->used->flags = 0;
	ioc_vhf_blk_submit(vq, &sl[7], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ASSERT_EQ(ioc_vhf_vq_kick(vq), 1);
	/* The silent stub completes nothing: the wait is bounded. */
	ASSERT_EQ(ioc_vhf_vq_wait(vq, false, 100), -ETIMEDOUT);
	ASSERT_EQ(ioc_vhf_vq_wait(vq, true, 100), -ETIMEDOUT);
	ioc_vhf_close(&d);
	stub_stop(s);
	stub_free(s);
}

static void test_misbehaving(void)
{
	struct ioc_vhf_blk_slot sl[2];
	struct ioc_vhf_dev d;
	struct stub *s;
	uint32_t id, len;

	/* A used id that was never made available shows as such. */
	s = stub_start(ALL_FEATURES, ALL_PFEATURES, 1, STUB_BOGUS_ID, 0);
	struct ioc_vhf_opts o = { .socket = s->path, .timeout_ms = 5000 };

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_OK(ioc_vhf_start(&d, 2 * ioc_vhf_blk_slot_bytes(&d, 4096)));
	ASSERT_OK(ioc_vhf_blk_slots(&d, &d.vq[0], sl, 2, 4096, false));
	ioc_vhf_blk_submit(&d.vq[0], &sl[0], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ioc_vhf_vq_kick(&d.vq[0]);
	ASSERT_OK(ioc_vhf_vq_wait(&d.vq[0], false, 5000));
	ASSERT_EQ(ioc_vhf_vq_pop_used(&d.vq[0], &id, &len), 1);
	ASSERT_NE(id, sl[0].head);
	ioc_vhf_close(&d);
	stub_stop(s);
	stub_free(s);

	/* A hang-up ends the wait at once. */
	s = stub_start(ALL_FEATURES, ALL_PFEATURES, 1, STUB_HANGUP_ON_KICK, 0);
	o.socket = s->path;
	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_OK(ioc_vhf_start(&d, 2 * ioc_vhf_blk_slot_bytes(&d, 4096)));
	ASSERT_OK(ioc_vhf_blk_slots(&d, &d.vq[0], sl, 2, 4096, false));
	ioc_vhf_blk_submit(&d.vq[0], &sl[0], VIRTIO_BLK_T_FLUSH, 0, 0, 0, 0);
	ioc_vhf_vq_kick(&d.vq[0]);
	ASSERT_EQ(ioc_vhf_vq_wait(&d.vq[0], false, 5000), -EPIPE);
	ASSERT_EQ(ioc_vhf_stop(&d, NULL), -EPIPE);
	ioc_vhf_close(&d);
	stub_stop(s);
	stub_free(s);

	/* A refused SET_MEM_TABLE (a non-zero REPLY_ACK) fails the start. */
	s = stub_start(ALL_FEATURES, ALL_PFEATURES, 1, STUB_NACK_MEM_TABLE, 0);
	o.socket = s->path;
	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_EQ(ioc_vhf_start(&d, 4096), -EPROTO);
	ioc_vhf_close(&d);
	stub_stop(s);
	stub_free(s);

	/* No VIRTIO_F_VERSION_1: refused before anything else. */
	s = stub_start(ALL_FEATURES & ~(1ull << VIRTIO_F_VERSION_1), 0, 1, STUB_OK, 0);
	o.socket = s->path;
	ASSERT_EQ(ioc_vhf_connect(&d, &o), -ENOTSUP);
	stub_stop(s);
	stub_free(s);

	/* More queues than the back-end has. */
	s = stub_start(ALL_FEATURES, ALL_PFEATURES, 1, STUB_OK, 0);
	o.socket = s->path;
	o.queues = 2;
	ASSERT_EQ(ioc_vhf_connect(&d, &o), -EINVAL);
	stub_stop(s);
	stub_free(s);
}

/* A back-end without protocol features: no GET_PROTOCOL_FEATURES, no
 * SET_VRING_ENABLE (its rings start enabled), no config, one queue. */
static void test_no_protocol_features(void)
{
	struct stub *s = stub_start((1ull << VIRTIO_F_VERSION_1) |
				    (1ull << VIRTIO_RING_F_EVENT_IDX), 0, 1, STUB_OK, 0);
	struct ioc_vhf_opts o = { .socket = s->path, .timeout_ms = 5000 };
	struct ioc_vhf_blk_slot sl[1];
	struct ioc_vhf_dev d;

	ASSERT_OK(ioc_vhf_connect(&d, &o));
	ASSERT_FALSE(d.have_config);
	ASSERT_OK(ioc_vhf_start(&d, ioc_vhf_blk_slot_bytes(&d, 4096)));
	ASSERT_OK(ioc_vhf_blk_slots(&d, &d.vq[0], sl, 1, 4096, false));
	ASSERT_EQ(do_io(&d.vq[0], &sl[0], VIRTIO_BLK_T_IN, 0, 4096, false), 0);
	ioc_vhf_stop(&d, NULL);
	ioc_vhf_close(&d);
	stub_stop(s);
	for (unsigned i = 0; i < s->nmsgs; i++) {
		ASSERT_NE(s->req[i], 15);
		ASSERT_NE(s->req[i], 18);
		ASSERT_EQ(s->flags[i] & 8, 0);
	}
	stub_free(s);
}

IOC_TEST_MAIN(
	IOC_TEST(test_handshake),
	IOC_TEST(test_roundtrip_event_idx),
	IOC_TEST(test_roundtrip_no_event_idx),
	IOC_TEST(test_roundtrip_indirect),
	IOC_TEST(test_roundtrip_poll),
	IOC_TEST(test_roundtrip_poll_event_idx),
	IOC_TEST(test_roundtrip_size_max),
	IOC_TEST(test_roundtrip_size_max_indirect),
	IOC_TEST(test_seg_max),
	IOC_TEST(test_kick_suppression),
	IOC_TEST(test_misbehaving),
	IOC_TEST(test_no_protocol_features),
)
