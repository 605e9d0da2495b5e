/*
 * The export against a front end written here: a blocking client that
 * speaks vhost-user as QEMU does, with guest memory in a memfd and rings
 * it builds by hand.  It checks the device state machine (features,
 * config, memory tables by SET_MEM_TABLE and by ADD/REM_MEM_REG, queue
 * start, stop and restart on one connection), each virtio-blk request
 * type with its error answers, a ring fault (the queue stops and the
 * error eventfd fires), malformed messages that end one connection while
 * the export goes on serving the next, a second front end refused, a
 * read-only export, dirty logging (exactly the pages each request wrote,
 * logs replaced and turned off, SET_LOG_BASE messages refused), and that
 * no fd outlives the export.
 *
 * The export runs on an I/O thread (its control loop) with its two queues
 * on a second one; the node is a file in the test's scratch directory.
 */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "tap.h"
#include "../blk/blk-test.h"
#include "node/node.h"
#include "qmp/schema.h"
#include "vub-export.h"

#define MEMSZ    (4u << 20)
#define QN       16
#define IMG_SIZE (1u << 20)
#define HDR_GPA  0x200000u
#define DATA_GPA 0x210000u
#define STAT_GPA 0x2ff000u

static struct ioc_node_graph *graph;
static struct ioc_node *node;
static struct ioc_iothread *ctrl_th, *io_th;
static char sock_path[256], ro_path[256], *img;

struct fe {
	int sock, memfd;
	uint8_t *mem;
	int kick[2], call[2], err[2];
	uint16_t avail[2], used_seen[2];
	uint8_t *extra;            /* ADD_MEM_REG's region */
	int extra_fd;
};

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

/* ---- the export on its thread ------------------------------------------------- */

struct mk {
	struct ioc__vub_export *e;
	const char *path;
	bool writable;
	char err[256];
	int r;
};

static int mk_fn(void *arg)
{
	struct mk *m = arg;
	struct ioc_loop *l = ioc_iothread_loop(io_th);
	struct ioc__vub_opts o = {
		.id = "t", .node = node, .socket_path = m->path, .listen_fd = -1,
		.writable = m->writable, .num_queues = 2, .serial = "iocore-serial-0123456789",
		.loops = &l, .nloops = 1,
	};

	m->r = ioc__vub_export_new(&m->e, &o, m->err, sizeof(m->err));
	return 0;
}

static int free_fn(void *arg)
{
	ioc__vub_export_free(arg);
	return 0;
}

struct close_arg {
	struct ioc__vub_export *e;
	_Atomic bool done;
};

static void closed_cb(void *opaque)
{
	/* Pairs with the test thread's acquire load. */
	atomic_store_explicit((_Atomic bool *)opaque, true, memory_order_release);
}

static int close_fn(void *arg)
{
	struct close_arg *a = arg;

	ioc__vub_export_close(a->e, closed_cb, &a->done);
	return 0;
}

static int config_changed_fn(void *arg)
{
	struct { struct ioc__vub_export *e; int r; } *a = arg;

	a->r = ioc__vub_export_config_changed(a->e);
	return 0;
}

static int info_fn(void *arg)
{
	struct { struct ioc__vub_export *e; struct ioc__vub_info i; } *a = arg;

	ioc__vub_export_info(a->e, &a->i);
	return 0;
}

static struct ioc__vub_export *export_new(const char *path, bool writable)
{
	struct mk m = { .path = path, .writable = writable };

	ioc_iothread_call(ctrl_th, mk_fn, &m);
	if (m.r < 0)
		ioc_test_fail(__FILE__, __LINE__, "export: %s", m.err);
	return m.e;
}

/* ---- the front end ------------------------------------------------------------- */

static int fe_connect(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof(a)));
	return fd;
}

static void fe_send(struct fe *f, uint32_t req, uint32_t flags, const void *p, uint32_t size,
		    const int *fds, int nfds)
{
	uint8_t b[VUB_HDR_SIZE + VUB_MAX_PAYLOAD];
	uint32_t hdr[3] = { req, VUB_VERSION | flags, size };
	union {
		char c[CMSG_SPACE(sizeof(int) * VUB_MAX_FDS)];
		struct cmsghdr align;
	} cb;
	struct iovec iov = { b, VUB_HDR_SIZE + size };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	memcpy(b, hdr, sizeof(hdr));
	if (size)
		memcpy(b + VUB_HDR_SIZE, p, size);
	if (nfds) {
		struct cmsghdr *c;

		mh.msg_control = cb.c;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	ASSERT_EQ(sendmsg(f->sock, &mh, MSG_NOSIGNAL), (ssize_t)iov.iov_len);
}

/* Read a reply (5 s at most); returns its payload size, -1 at EOF. */
static int fe_reply(struct fe *f, uint32_t req, void *p, size_t cap)
{
	uint32_t hdr[3];
	struct pollfd pf = { f->sock, POLLIN, 0 };

	ASSERT_EQ(poll(&pf, 1, 5000), 1);
	ssize_t r = recv(f->sock, hdr, sizeof(hdr), MSG_WAITALL);

	if (r == 0)
		return -1;
	ASSERT_EQ(r, (ssize_t)sizeof(hdr));
	ASSERT_UEQ(hdr[0], req);
	ASSERT_UEQ(hdr[1], VUB_VERSION | VUB_FLAG_REPLY);
	ASSERT_ULE(hdr[2], cap);
	if (hdr[2])
		ASSERT_EQ(recv(f->sock, p, hdr[2], MSG_WAITALL), (ssize_t)hdr[2]);
	return (int)hdr[2];
}

/* Read a reply that carries one fd (5 s at most); its payload size. */
static int fe_reply_fd(struct fe *f, uint32_t req, void *p, size_t cap, int *fd)
{
	uint8_t b[VUB_HDR_SIZE + VUB_MAX_PAYLOAD];
	union {
		char c[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct iovec iov = { b, VUB_HDR_SIZE };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.c,
			     .msg_controllen = sizeof(cb.c) };
	struct pollfd pf = { f->sock, POLLIN, 0 };
	uint32_t hdr[3];

	*fd = -1;
	ASSERT_EQ(poll(&pf, 1, 5000), 1);
	ASSERT_EQ(recvmsg(f->sock, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC), VUB_HDR_SIZE);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	memcpy(hdr, b, sizeof(hdr));
	ASSERT_UEQ(hdr[0], req);
	ASSERT_UEQ(hdr[1], VUB_VERSION | VUB_FLAG_REPLY);
	ASSERT_ULE(hdr[2], cap);
	if (hdr[2])
		ASSERT_EQ(recv(f->sock, p, hdr[2], MSG_WAITALL), (ssize_t)hdr[2]);
	return (int)hdr[2];
}

static uint64_t fe_get_u64(struct fe *f, uint32_t req)
{
	uint64_t v = 0;

	fe_send(f, req, 0, NULL, 0, NULL, 0);
	ASSERT_EQ(fe_reply(f, req, &v, 8), 8);
	return v;
}

/* Send with NEED_REPLY and return the ack (0 success). */
static uint64_t fe_acked(struct fe *f, uint32_t req, const void *p, uint32_t size,
			 const int *fds, int nfds)
{
	uint64_t v = 99;

	fe_send(f, req, VUB_FLAG_NEED_REPLY, p, size, fds, nfds);
	ASSERT_EQ(fe_reply(f, req, &v, 8), 8);
	return v;
}

/* The export closed the connection: the next read sees the end. */
static void fe_expect_closed(struct fe *f)
{
	char c;
	struct pollfd pf = { f->sock, POLLIN, 0 };

	ASSERT_EQ(poll(&pf, 1, 5000), 1);
	ASSERT_EQ(recv(f->sock, &c, 1, 0), 0);
}

static uint64_t ring_gpa(unsigned q)
{
	return 0x10000u * (q + 1);
}

static void fe_open(struct fe *f, const char *path)
{
	memset(f, 0, sizeof(*f));
	f->sock = fe_connect(path);
	f->memfd = memfd_create("guest", MFD_CLOEXEC);
	ASSERT_GE(f->memfd, 0);
	ASSERT_OK(ftruncate(f->memfd, MEMSZ));
	f->mem = mmap(NULL, MEMSZ, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
	ASSERT_TRUE(f->mem != MAP_FAILED);
	f->extra_fd = -1;
	for (int i = 0; i < 2; i++) {
		f->kick[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		f->call[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		f->err[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	}
}

static void fe_close(struct fe *f)
{
	close(f->sock);
	munmap(f->mem, MEMSZ);
	close(f->memfd);
	if (f->extra) {
		munmap(f->extra, MEMSZ);
		close(f->extra_fd);
	}
	for (int i = 0; i < 2; i++) {
		close(f->kick[i]);
		close(f->call[i]);
		close(f->err[i]);
	}
}

static bool fe_inflight;   /* fe_negotiate acknowledges INFLIGHT_SHMFD */

static uint64_t extra_pf;   /* protocol features fe_negotiate also takes */

static void fe_negotiate(struct fe *f)
{
	uint64_t feat, pf;

	feat = fe_get_u64(f, VUB_GET_FEATURES);
	ASSERT_TRUE(feat & (1ull << VIRTIO_F_VERSION_1));
	ASSERT_TRUE(feat & (1ull << VUB_F_LOG_ALL));
	/* As QEMU: LOG_ALL only while migrating. */
	feat &= ~(1ull << VUB_F_LOG_ALL);
	ASSERT_TRUE(feat & (1ull << VUB_F_PROTOCOL_FEATURES));
	ASSERT_TRUE(feat & (1ull << VIRTIO_RING_F_EVENT_IDX));
	pf = fe_get_u64(f, VUB_GET_PROTOCOL_FEATURES);
	ASSERT_TRUE(pf & (1ull << VUB_PROTO_F_REPLY_ACK));
	ASSERT_TRUE(pf & (1ull << VUB_PROTO_F_INFLIGHT_SHMFD));
	pf &= (1ull << VUB_PROTO_F_REPLY_ACK) | (1ull << VUB_PROTO_F_CONFIG) |
	      (1ull << VUB_PROTO_F_MQ) | (1ull << VUB_PROTO_F_CONFIGURE_MEM_SLOTS) |
	      (1ull << VUB_PROTO_F_BACKEND_REQ) | extra_pf |
	      (fe_inflight ? 1ull << VUB_PROTO_F_INFLIGHT_SHMFD : 0);
	fe_send(f, VUB_SET_PROTOCOL_FEATURES, 0, &pf, 8, NULL, 0);
	fe_send(f, VUB_SET_OWNER, 0, NULL, 0, NULL, 0);
	/* QEMU sends a call fd before the features: accepted. */
	uint64_t idx = 0;
	fe_send(f, VUB_SET_VRING_CALL, 0, &idx, 8, &f->call[0], 1);
	feat &= ~(1ull << VIRTIO_BLK_F_CONFIG_WCE) | feat;
	ASSERT_UEQ(fe_acked(f, VUB_SET_FEATURES, &feat, 8, NULL, 0), 0);
}

static void fe_mem_table(struct fe *f)
{
	struct vub_mem_table_desc t = { .nregions = 1 };

	t.r[0] = (struct vub_region_desc){ 0, MEMSZ, (uint64_t)(uintptr_t)f->mem, 0 };
	ASSERT_UEQ(fe_acked(f, VUB_SET_MEM_TABLE, &t, 8 + 32, &f->memfd, 1), 0);
}

static void *gpa(struct fe *f, uint64_t a)
{
	return f->mem + a;
}

static bool nofd_next;   /* the next fe_start_ring: NOFD kick and call */

static void fe_start_ring(struct fe *f, unsigned q, uint16_t base)
{
	struct vhost_vring_state st = { q, QN };
	uint64_t g = ring_gpa(q), u = (uint64_t)(uintptr_t)f->mem;
	struct vhost_vring_addr a = { .index = q, .desc_user_addr = u + g,
				      .avail_user_addr = u + g + 0x1000,
				      .used_user_addr = u + g + 0x2000 };
	uint64_t idx = q;

	fe_send(f, VUB_SET_VRING_NUM, 0, &st, 8, NULL, 0);
	st.num = base;
	fe_send(f, VUB_SET_VRING_BASE, 0, &st, 8, NULL, 0);
	fe_send(f, VUB_SET_VRING_ADDR, 0, &a, sizeof(a), NULL, 0);
	fe_send(f, VUB_SET_VRING_ERR, 0, &idx, 8, &f->err[q], 1);
	if (nofd_next) {
		idx |= VUB_VRING_NOFD;
		fe_send(f, VUB_SET_VRING_KICK, 0, &idx, 8, NULL, 0);
		fe_send(f, VUB_SET_VRING_CALL, 0, &idx, 8, NULL, 0);
		nofd_next = false;
	} else {
		fe_send(f, VUB_SET_VRING_KICK, 0, &idx, 8, &f->kick[q], 1);
		fe_send(f, VUB_SET_VRING_CALL, 0, &idx, 8, &f->call[q], 1);
	}
	st.num = 1;
	ASSERT_UEQ(fe_acked(f, VUB_SET_VRING_ENABLE, &st, 8, NULL, 0), 0);
	f->avail[q] = f->used_seen[q] = base;
}

static uint16_t fe_stop_ring(struct fe *f, unsigned q)
{
	struct vhost_vring_state st = { q, 0 };

	fe_send(f, VUB_GET_VRING_BASE, 0, &st, 8, NULL, 0);
	ASSERT_EQ(fe_reply(f, VUB_GET_VRING_BASE, &st, sizeof(st)), 8);
	ASSERT_UEQ(st.index, q);
	return (uint16_t)st.num;
}

struct seg {
	uint64_t gpa;
	uint32_t len;
	bool write;
};

static void fe_kick(struct fe *f, unsigned q)
{
	uint64_t one = 1;

	ASSERT_EQ(write(f->kick[q], &one, 8), 8);
}

/* Post a chain on ring q, without a kick. */
static void fe_queue(struct fe *f, unsigned q, const struct seg *s, unsigned n)
{
	uint64_t g = ring_gpa(q);
	struct vring_desc *d = gpa(f, g);
	struct vring_avail *av = gpa(f, g + 0x1000);

	for (unsigned i = 0; i < n; i++)
		d[i] = (struct vring_desc){ s[i].gpa, s[i].len,
			(uint16_t)((s[i].write ? VRING_DESC_F_WRITE : 0) |
				   (i + 1 < n ? VRING_DESC_F_NEXT : 0)), (uint16_t)(i + 1) };
	av->ring[f->avail[q] % QN] = 0;
	av->ring[QN] = f->used_seen[q];   /* used_event: signal the next one */
	f->avail[q]++;
	__atomic_store_n(&av->idx, f->avail[q], __ATOMIC_RELEASE);
}

/* Post a chain on ring q and kick. */
static void fe_post(struct fe *f, unsigned q, const struct seg *s, unsigned n)
{
	fe_queue(f, q, s, n);
	fe_kick(f, q);
}

/* Wait (5 s at most) for the next used entry of ring q; its len. */
static uint32_t fe_wait(struct fe *f, unsigned q)
{
	struct vring_used *u = gpa(f, ring_gpa(q) + 0x2000);
	struct pollfd pf = { f->call[q], POLLIN, 0 };
	uint64_t v;

	while (__atomic_load_n(&u->idx, __ATOMIC_ACQUIRE) == f->used_seen[q]) {
		ASSERT_EQ(poll(&pf, 1, 5000), 1);
		ASSERT_EQ(read(f->call[q], &v, 8), 8);
	}
	uint32_t len = u->ring[f->used_seen[q] % QN].len;

	f->used_seen[q]++;
	return len;
}

static uint8_t *status(struct fe *f)
{
	return gpa(f, STAT_GPA);
}

/* A request: header, data of len bytes (direction by type), status. */
static uint8_t fe_req(struct fe *f, unsigned q, uint32_t type, uint64_t sector,
		      uint32_t len, uint32_t *used)
{
	struct virtio_blk_outhdr *h = gpa(f, HDR_GPA);
	bool in = type == VIRTIO_BLK_T_IN || type == VIRTIO_BLK_T_GET_ID;
	struct seg s[3] = {
		{ HDR_GPA, 16, false },
		{ DATA_GPA, len, in },
		{ STAT_GPA, 1, true },
	};
	uint32_t u;

	h->type = type;
	h->ioprio = 0;
	h->sector = sector;
	*status(f) = 0xee;
	if (len)
		fe_post(f, q, s, 3);
	else {
		s[1] = s[2];
		fe_post(f, q, s, 2);
	}
	u = fe_wait(f, q);
	if (used)
		*used = u;
	return *status(f);
}

/* ---- the cases --------------------------------------------------------------- */

static void setup(void)
{
	char kv[512], err[512];
	const char *cls;
	json_t *o;

	if (graph)
		return;
	img = bt_make_image(NULL, "vub.img", IMG_SIZE, true);
	snprintf(sock_path, sizeof(sock_path), "%.200s/vub.sock", ioc_test_tmpdir());
	snprintf(ro_path, sizeof(ro_path), "%.200s/vub-ro.sock", ioc_test_tmpdir());
	ASSERT_OK(ioc_node_graph_new(&graph));
	snprintf(kv, sizeof(kv), "driver=file,node-name=disk,filename=%s,discard=unmap", img);
	o = ioc__qmp_keyval_parse(kv, NULL, NULL, err, sizeof(err));
	ASSERT_NOT_NULL(o);
	ASSERT_TRUE(ioc_node_check_opts(o, IOC_QMP_KEYVAL, err, sizeof(err)));
	if (ioc_node_add(graph, o, &node, &cls, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "node: %s", err);
	json_decref(o);
	ASSERT_OK(ioc_iothread_start(&ctrl_th, NULL));
	ASSERT_OK(ioc_iothread_start(&io_th, NULL));
}

static void test_requests(void)
{
	int before;
	struct ioc__vub_export *e;
	struct fe f;
	uint32_t used;
	uint8_t *data;
	struct virtio_blk_config cfg;

	setup();
	before = count_fds();
	e = export_new(sock_path, true);
	fe_open(&f, sock_path);
	data = gpa(&f, DATA_GPA);
	fe_negotiate(&f);
	ASSERT_UEQ(fe_get_u64(&f, VUB_GET_QUEUE_NUM), 2);
	ASSERT_UEQ(fe_get_u64(&f, VUB_GET_MAX_MEM_SLOTS), VUB_MAX_REGIONS);
	{
		struct vub_config_desc c = { .offset = 0, .size = 60 };

		fe_send(&f, VUB_GET_CONFIG, 0, &c, 12 + 60, NULL, 0);
		ASSERT_EQ(fe_reply(&f, VUB_GET_CONFIG, &c, sizeof(c)), 12 + 60);
		memcpy(&cfg, c.data, 60);
		ASSERT_UEQ(cfg.capacity, IMG_SIZE / 512);
		ASSERT_UEQ(cfg.blk_size, 512);
		ASSERT_UEQ(cfg.num_queues, 2);
		ASSERT_UEQ(cfg.seg_max, VUB_SEG_MAX);
		ASSERT_UEQ(cfg.wce, 1);
		/* Past the config space: the spec's empty answer. */
		c.offset = 250;
		c.size = 10;
		fe_send(&f, VUB_GET_CONFIG, 0, &c, 12 + 10, NULL, 0);
		ASSERT_EQ(fe_reply(&f, VUB_GET_CONFIG, &c, sizeof(c)), 0);
	}
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	fe_start_ring(&f, 1, 0);

	/* OUT then IN, on both queues. */
	for (unsigned i = 0; i < 4096; i++)
		data[i] = (uint8_t)(i * 13 + 1);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_OUT, 8, 4096, &used), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(used, 1);
	memset(data, 0, 4096);
	ASSERT_UEQ(fe_req(&f, 1, VIRTIO_BLK_T_IN, 8, 4096, &used), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(used, 4097);
	for (unsigned i = 0; i < 4096; i++)
		ASSERT_UEQ(data[i], (uint8_t)(i * 13 + 1));
	{
		uint8_t b[16];
		int fd = open(img, O_RDONLY);

		ASSERT_EQ(pread(fd, b, 16, 8 * 512), 16);
		close(fd);
		ASSERT_MEM_EQ(b, data, 16);
	}
	/* The end of the disk, and sizes that are not sectors. */
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, IMG_SIZE / 512 - 1, 512, NULL), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, IMG_SIZE / 512 - 1, 1024, NULL), VIRTIO_BLK_S_IOERR);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_OUT, IMG_SIZE / 512, 512, NULL), VIRTIO_BLK_S_IOERR);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, UINT64_MAX / 256, 512, NULL), VIRTIO_BLK_S_IOERR);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 0, 100, NULL), VIRTIO_BLK_S_IOERR);
	/* FLUSH, GET_ID, an unknown type. */
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0, &used), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(used, 1);
	memset(data, 0, 64);
	ASSERT_UEQ(fe_req(&f, 1, VIRTIO_BLK_T_GET_ID, 0, 64, &used), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(used, 21);
	ASSERT_MEM_EQ(data, "iocore-serial-012345", 20);
	ASSERT_UEQ(data[20], 0);
	ASSERT_UEQ(fe_req(&f, 0, 99, 0, 512, NULL), VIRTIO_BLK_S_UNSUPP);

	/* WRITE_ZEROES (with UNMAP) reads back as zeroes. */
	{
		struct { uint64_t sector; uint32_t num, flags; } *dz = (void *)data;

		memset(data + 1024, 0x5a, 512);
		dz[0].sector = 0;
		dz[0].num = 8;
		dz[0].flags = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_WRITE_ZEROES, 0, 16, NULL), VIRTIO_BLK_S_OK);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 0, 4096, NULL), VIRTIO_BLK_S_OK);
		for (unsigned i = 0; i < 4096; i++)
			ASSERT_UEQ(data[i], 0);
		dz[0] = (typeof(dz[0])){ 16, 8, 0 };
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 16, NULL), VIRTIO_BLK_S_OK);
		dz[0].flags = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;   /* not for discard */
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 16, NULL), VIRTIO_BLK_S_UNSUPP);
		dz[0] = (typeof(dz[0])){ IMG_SIZE / 512 - 4, 8, 0 };
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 16, NULL), VIRTIO_BLK_S_IOERR);
		dz[0] = (typeof(dz[0])){ 0, 8, 2 };
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_WRITE_ZEROES, 0, 16, NULL), VIRTIO_BLK_S_UNSUPP);
		for (int i = 0; i < 17; i++)
			dz[i] = (typeof(dz[0])){ (uint64_t)i * 8, 8, 0 };
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 17 * 16, NULL), VIRTIO_BLK_S_UNSUPP);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_WRITE_ZEROES, 0, 16 * 16, NULL), VIRTIO_BLK_S_OK);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 20, NULL), VIRTIO_BLK_S_IOERR);
	}
	/* The write cache off: writes still work (FUA). */
	{
		struct vub_config_desc c = { .offset = offsetof(struct virtio_blk_config, wce),
					     .size = 1, .data = { 0 } };

		ASSERT_UEQ(fe_acked(&f, VUB_SET_CONFIG, &c, 13, NULL, 0), 0);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_OUT, 8, 512, NULL), VIRTIO_BLK_S_OK);
		c.offset = 0;   /* capacity: not writable */
		ASSERT_UEQ(fe_acked(&f, VUB_SET_CONFIG, &c, 13, NULL, 0), 1);
	}
	/* A chain without a header: answered empty, the ring goes on. */
	{
		struct seg s[1] = { { STAT_GPA, 1, true } };

		fe_post(&f, 0, s, 1);
		ASSERT_UEQ(fe_wait(&f, 0), 0);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	}

	/* Stop and restart on the same connection (SeaBIOS, then Linux). */
	ASSERT_UEQ(fe_stop_ring(&f, 0), f.avail[0]);
	fe_start_ring(&f, 0, f.avail[0]);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 8, 512, NULL), VIRTIO_BLK_S_OK);

	/* GET_VRING_BASE waits for the queue's in-flight requests: with the
	 * node's gate held a read parks in ioc_node_co_enter(), and the
	 * reply comes only once the gate opens, after the completion. */
	{
		struct virtio_blk_outhdr *h = gpa(&f, HDR_GPA);
		struct seg s[3] = { { HDR_GPA, 16, false }, { DATA_GPA, 512, true },
				    { STAT_GPA, 1, true } };
		struct vhost_vring_state st = { 0, 0 };
		struct vring_used *u = gpa(&f, ring_gpa(0) + 0x2000);
		struct pollfd pf = { f.sock, POLLIN, 0 };

		ioc_node_set_gate(node, IOC_NODE_GATE_HOLD);
		h->type = VIRTIO_BLK_T_IN;
		h->sector = 0;
		fe_post(&f, 0, s, 3);
		/* The device took it when it moves avail_event past it (it
		 * arms after taking what is there); 5 s at most. */
		for (int i = 0; i < 5000 && __atomic_load_n((uint16_t *)&u->ring[QN],
							       __ATOMIC_ACQUIRE) != f.avail[0]; i++)
			usleep(1000);
		ASSERT_UEQ(*(uint16_t *)&u->ring[QN], f.avail[0]);
		fe_send(&f, VUB_GET_VRING_BASE, 0, &st, 8, NULL, 0);
		/* Not an ordering guess: the reply must not come while the
		 * request is held, however long we look. */
		ASSERT_EQ(poll(&pf, 1, 200), 0);
		ASSERT_UEQ(u->idx, f.used_seen[0]);
		ioc_node_set_gate(node, IOC_NODE_GATE_OPEN);
		ASSERT_EQ(fe_reply(&f, VUB_GET_VRING_BASE, &st, sizeof(st)), 8);
		ASSERT_UEQ(st.num, f.avail[0]);
		ASSERT_UEQ(u->idx, (uint16_t)(f.used_seen[0] + 1));
		ASSERT_UEQ(*status(&f), VIRTIO_BLK_S_OK);
		f.used_seen[0]++;
		fe_start_ring(&f, 0, f.avail[0]);
		f.used_seen[0] = u->idx;
	}

	/* A second memory region by ADD_MEM_REG, data there, then gone. */
	{
		struct vub_mem_one_desc one = { 0 };
		struct virtio_blk_outhdr *h = gpa(&f, HDR_GPA);
		struct seg s[3] = { { HDR_GPA, 16, false }, { 0x10000000, 512, true },
				    { STAT_GPA, 1, true } };
		struct pollfd pf = { f.err[0], POLLIN, 0 };

		f.extra_fd = memfd_create("extra", MFD_CLOEXEC);
		ASSERT_OK(ftruncate(f.extra_fd, MEMSZ));
		f.extra = mmap(NULL, MEMSZ, PROT_READ | PROT_WRITE, MAP_SHARED, f.extra_fd, 0);
		one.r = (struct vub_region_desc){ 0x10000000, MEMSZ, (uint64_t)(uintptr_t)f.extra, 0 };
		ASSERT_UEQ(fe_acked(&f, VUB_ADD_MEM_REG, &one, sizeof(one), &f.extra_fd, 1), 0);
		/* Overlapping the first: refused, the connection ends
		 * (checked on a connection of its own below). */
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 8, 512, NULL), VIRTIO_BLK_S_OK);
		h->type = VIRTIO_BLK_T_IN;
		h->sector = 8;
		memset(f.extra, 0xff, 512);
		fe_post(&f, 0, s, 3);
		ASSERT_UEQ(fe_wait(&f, 0), 513);
		ASSERT_UEQ(*status(&f), VIRTIO_BLK_S_OK);
		ASSERT_MEM_EQ(f.extra, data, 512);
		ASSERT_UEQ(fe_acked(&f, VUB_REM_MEM_REG, &one, sizeof(one), NULL, 0), 0);
		/* Now the buffer is outside guest memory: the ring stops
		 * and says so on its error eventfd. */
		fe_post(&f, 0, s, 3);
		ASSERT_EQ(poll(&pf, 1, 5000), 1);
	}
	/* A stopped ring restarts cleanly. */
	{
		uint16_t base = fe_stop_ring(&f, 0), used_idx;

		/* The faulty entry was not taken: a restart from that base
		 * would meet it again.  Start past it, as a driver that
		 * reset the device would start afresh. */
		ASSERT_UEQ(base, f.avail[0] - 1);
		used_idx = ((struct vring_used *)gpa(&f, ring_gpa(0) + 0x2000))->idx;
		fe_start_ring(&f, 0, f.avail[0]);
		f.used_seen[0] = used_idx;
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	}
	/* A loop in the chain: ring fault again. */
	{
		struct vring_desc *d = gpa(&f, ring_gpa(1));
		struct vring_avail *av = gpa(&f, ring_gpa(1) + 0x1000);
		struct pollfd pf = { f.err[1], POLLIN, 0 };
		uint64_t one = 1;

		d[0] = (struct vring_desc){ HDR_GPA, 16, VRING_DESC_F_NEXT, 1 };
		d[1] = (struct vring_desc){ HDR_GPA, 16, VRING_DESC_F_NEXT, 0 };
		av->ring[f.avail[1]++ % QN] = 0;
		__atomic_store_n(&av->idx, f.avail[1], __ATOMIC_RELEASE);
		ASSERT_EQ(write(f.kick[1], &one, 8), 8);
		ASSERT_EQ(poll(&pf, 1, 5000), 1);
	}
	{
		struct { struct ioc__vub_export *e; struct ioc__vub_info i; } a = { e };

		ioc_iothread_call(ctrl_th, info_fn, &a);
		ASSERT_TRUE(a.i.connected);
		ASSERT_UEQ(a.i.num_queues, 2);
		ASSERT_UGE(a.i.requests, 20);
	}

	/* The back-end channel: a config change notice reaches it. */
	{
		int sv[2];
		uint32_t hdr[3];
		struct { struct ioc__vub_export *e; int r; } a = { e, 0 };

		ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
		ASSERT_UEQ(fe_acked(&f, VUB_SET_BACKEND_REQ_FD, NULL, 0, &sv[1], 1), 0);
		close(sv[1]);
		ioc_iothread_call(ctrl_th, config_changed_fn, &a);
		ASSERT_OK(a.r);
		ASSERT_EQ(recv(sv[0], hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
		ASSERT_UEQ(hdr[0], VUB_BACKEND_CONFIG_CHANGE_MSG);
		ASSERT_UEQ(hdr[2], 0);
		close(sv[0]);
	}

	/* A second front end while this one is connected: refused. */
	{
		struct fe g = { .sock = fe_connect(sock_path) };

		fe_expect_closed(&g);
		close(g.sock);
	}
	fe_close(&f);

	/* Reconnect: the device starts over. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 8, 512, NULL), VIRTIO_BLK_S_OK);
	/* Disconnect with the rings running: the export resets itself. */
	fe_close(&f);
	ioc_iothread_call(ctrl_th, free_fn, e);
	ASSERT_EQ(count_fds(), before);
}

/* Messages that end a connection; the export serves the next one. */
static void test_bad_front_ends(void)
{
	struct ioc__vub_export *e;
	struct fe f;
	int before;

	setup();
	before = count_fds();
	e = export_new(sock_path, true);

	/* A memory region larger than its file. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_mem_table_desc t = { .nregions = 1 };

		t.r[0] = (struct vub_region_desc){ 0, 2 * MEMSZ, (uint64_t)(uintptr_t)f.mem, 0 };
		fe_send(&f, VUB_SET_MEM_TABLE, VUB_FLAG_NEED_REPLY, &t, 40, &f.memfd, 1);
		fe_expect_closed(&f);
	}
	fe_close(&f);

	/* Overlapping regions. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_mem_table_desc t = { .nregions = 2 };
		int fds[2] = { f.memfd, f.memfd };

		t.r[0] = (struct vub_region_desc){ 0, MEMSZ / 2, 0x1000000, 0 };
		t.r[1] = (struct vub_region_desc){ MEMSZ / 4, MEMSZ / 2, 0x2000000, 0 };
		fe_send(&f, VUB_SET_MEM_TABLE, 0, &t, 8 + 64, fds, 2);
		fe_expect_closed(&f);
	}
	fe_close(&f);

	/* Features not offered; a vring index out of range; a bad version;
	 * an unknown request; a missing fd. */
	{
		uint64_t bad = 1ull << 60;
		struct vhost_vring_state st = { 7, 16 };
		static const struct { uint32_t req, flags, size; } m[] = {
			{ VUB_SET_FEATURES, 0, 8 },
			{ VUB_SET_VRING_NUM, 0, 8 },
			{ VUB_GET_FEATURES, 2, 0 },
			{ 77, 0, 0 },
			{ VUB_SET_VRING_KICK, 0, 8 },
		};

		for (size_t i = 0; i < IOC_ARRAY_SIZE(m); i++) {
			const void *p = i == 1 ? (const void *)&st : (const void *)&bad;

			fe_open(&f, sock_path);
			if (i == 4)
				bad = 0;
			{
				uint8_t b[12 + 8];
				uint32_t hdr[3] = { m[i].req, m[i].flags ? m[i].flags : 1, m[i].size };

				memcpy(b, hdr, 12);
				memcpy(b + 12, p, 8);
				ASSERT_EQ(send(f.sock, b, 12 + m[i].size, MSG_NOSIGNAL),
					  (ssize_t)(12 + m[i].size));
			}
			fe_expect_closed(&f);
			fe_close(&f);
		}
	}
	/* And after all that, a good one. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	fe_mem_table(&f);
	fe_start_ring(&f, 1, 0);
	ASSERT_UEQ(fe_req(&f, 1, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	/* A ring without eventfds (NOFD kick and call): the export polls
	 * it, the front end watches used->idx (5 s at most). */
	{
		struct virtio_blk_outhdr *h = gpa(&f, HDR_GPA);
		struct seg s[3] = { { HDR_GPA, 16, false }, { DATA_GPA, 512, true },
				    { STAT_GPA, 1, true } };
		struct vring_used *u = gpa(&f, ring_gpa(0) + 0x2000);
		struct vring_desc *d = gpa(&f, ring_gpa(0));
		struct vring_avail *av = gpa(&f, ring_gpa(0) + 0x1000);
		int waited = 0;

		nofd_next = true;
		fe_start_ring(&f, 0, 0);
		h->type = VIRTIO_BLK_T_IN;
		h->sector = 0;
		*status(&f) = 0xee;
		for (unsigned i = 0; i < 3; i++)
			d[i] = (struct vring_desc){ s[i].gpa, s[i].len,
				(uint16_t)((s[i].write ? VRING_DESC_F_WRITE : 0) |
					   (i < 2 ? VRING_DESC_F_NEXT : 0)), (uint16_t)(i + 1) };
		av->ring[0] = 0;
		__atomic_store_n(&av->idx, 1, __ATOMIC_RELEASE);   /* no kick */
		while (__atomic_load_n(&u->idx, __ATOMIC_ACQUIRE) != 1 && waited++ < 5000)
			usleep(1000);
		ASSERT_UEQ(u->idx, 1);
		ASSERT_UEQ(*status(&f), VIRTIO_BLK_S_OK);
	}
	/* Free with a front end connected and its rings running. */
	ioc_iothread_call(ctrl_th, free_fn, e);
	fe_expect_closed(&f);
	fe_close(&f);
	ASSERT_EQ(count_fds(), before);
}

static void test_read_only(void)
{
	struct ioc__vub_export *e;
	struct fe f;
	uint64_t feat;

	setup();
	e = export_new(ro_path, false);
	fe_open(&f, ro_path);
	feat = fe_get_u64(&f, VUB_GET_FEATURES);
	ASSERT_TRUE(feat & (1ull << VIRTIO_BLK_F_RO));
	ASSERT_FALSE(feat & (1ull << VIRTIO_BLK_F_DISCARD));
	ASSERT_FALSE(feat & (1ull << VIRTIO_BLK_F_WRITE_ZEROES));
	fe_negotiate(&f);
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 0, 512, NULL), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_OUT, 0, 512, NULL), VIRTIO_BLK_S_IOERR);
	{
		struct { uint64_t sector; uint32_t num, flags; } *dz = gpa(&f, DATA_GPA);

		dz->sector = 0;
		dz->num = 1;
		dz->flags = 0;
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_WRITE_ZEROES, 0, 16, NULL), VIRTIO_BLK_S_IOERR);
		ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_DISCARD, 0, 16, NULL), VIRTIO_BLK_S_IOERR);
	}
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	/* close() with a front end connected returns at once; its callback
	 * comes once the connection is torn down (5 s at most). */
	{
		struct close_arg a = { e, false };

		ioc_iothread_call(ctrl_th, close_fn, &a);
		fe_expect_closed(&f);
		for (int i = 0; i < 5000 && !atomic_load_explicit(&a.done, memory_order_acquire);
		     i++)
			usleep(1000);
		ASSERT_TRUE(atomic_load_explicit(&a.done, memory_order_acquire));
	}
	fe_close(&f);
}

/* ---- inflight tracking ---------------------------------------------------------- */

/* Request k of the inflight case: a 512-byte read of sector 8 + k whose
 * chain sits at descriptors 3k..3k+2 (head 3k), with its own header,
 * buffer and status byte. */
#define IF_HDR(k)  (HDR_GPA + 64u * (k))
#define IF_DATA(k) (DATA_GPA + 4096u * (k))
#define IF_STAT(k) (STAT_GPA + (k))

static void fe_post_k(struct fe *f, unsigned q, unsigned k, bool kick)
{
	uint64_t g = ring_gpa(q);
	struct vring_desc *d = (struct vring_desc *)gpa(f, g) + 3 * k;
	struct vring_avail *av = gpa(f, g + 0x1000);
	struct virtio_blk_outhdr *h = gpa(f, IF_HDR(k));
	uint16_t head = (uint16_t)(3 * k);

	h->type = VIRTIO_BLK_T_IN;
	h->ioprio = 0;
	h->sector = 8 + k;
	*(uint8_t *)gpa(f, IF_STAT(k)) = 0xee;
	memset(gpa(f, IF_DATA(k)), 0, 512);
	d[0] = (struct vring_desc){ IF_HDR(k), 16, VRING_DESC_F_NEXT, (uint16_t)(head + 1) };
	d[1] = (struct vring_desc){ IF_DATA(k), 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
				    (uint16_t)(head + 2) };
	d[2] = (struct vring_desc){ IF_STAT(k), 1, VRING_DESC_F_WRITE, 0 };
	av->ring[f->avail[q] % QN] = head;
	av->ring[QN] = f->used_seen[q];
	f->avail[q]++;
	__atomic_store_n(&av->idx, f->avail[q], __ATOMIC_RELEASE);
	if (kick) {
		uint64_t one = 1;

		ASSERT_EQ(write(f->kick[q], &one, 8), 8);
	}
}

/* The device took every avail entry of ring q: it moved avail_event
 * there (it arms after taking what is there); 5 s at most. */
static void fe_wait_taken(struct fe *f, unsigned q)
{
	struct vring_used *u = gpa(f, ring_gpa(q) + 0x2000);
	int i;

	for (i = 0; i < 5000 && __atomic_load_n((uint16_t *)&u->ring[QN], __ATOMIC_ACQUIRE) !=
				      f->avail[q]; i++)
		usleep(1000);
	ASSERT_UEQ(*(uint16_t *)&u->ring[QN], f->avail[q]);
}

/*
 * Wait (5 s at most) until ring q's used->idx reaches idx.  As a driver
 * re-arms its interrupt: used_event is moved to the index seen, then
 * (full fence, pairing with the device's fence between its used->idx
 * store and its used_event load) used->idx is read again, so the next
 * completion signals however the device batches them.  Without the
 * re-arm only a batch crossing the old used_event signals, and requests
 * that complete one by one leave the wait without a wake-up.
 */
static void fe_wait_used(struct fe *f, unsigned q, uint16_t idx)
{
	struct vring_used *u = gpa(f, ring_gpa(q) + 0x2000);
	struct vring_avail *av = gpa(f, ring_gpa(q) + 0x1000);
	struct pollfd pf = { f->call[q], POLLIN, 0 };
	uint16_t seen;
	uint64_t v;

	while ((seen = __atomic_load_n(&u->idx, __ATOMIC_ACQUIRE)) != idx) {
		__atomic_store_n(&av->ring[QN], seen, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&u->idx, __ATOMIC_ACQUIRE) != seen)
			continue;
		ASSERT_EQ(poll(&pf, 1, 5000), 1);
		ASSERT_EQ(read(f->call[q], &v, 8), 8);
	}
}

/*
 * Wait (5 s at most) until the inflight region agrees with used->idx.
 * The back end stores used->idx first and clears the batch's flags after
 * it (inflight.c says why), so a front end that has seen a completion
 * in the used ring may still see its flag set; the region's used_idx is
 * stored last with a release store, and this acquire load pairs with it.
 */
static void fe_wait_region(struct vub_inflight_queue *iq, uint16_t idx)
{
	int i;

	for (i = 0; i < 5000 && __atomic_load_n(&iq->used_idx, __ATOMIC_ACQUIRE) != idx; i++)
		usleep(1000);
	ASSERT_UEQ(__atomic_load_n(&iq->used_idx, __ATOMIC_ACQUIRE), idx);
}

static int fe_get_inflight(struct fe *f, struct vub_inflight_desc *d)
{
	int fd;

	fe_send(f, VUB_GET_INFLIGHT_FD, 0, d, sizeof(*d), NULL, 0);
	ASSERT_EQ(fe_reply_fd(f, VUB_GET_INFLIGHT_FD, d, sizeof(*d), &fd), (int)sizeof(*d));
	ASSERT_GE(fd, 0);
	return fd;
}

/*
 * A back end that dies with requests in flight, as kill -9 leaves it:
 * three reads are taken and held at the node's gate; the guest memory
 * and the inflight region as they are then are what a crash leaves
 * behind.  To that state is added a completion published out of order
 * whose flag was not yet cleared (the crash fell between the used->idx
 * store and the clear).  The held requests are then let go and the
 * connection closed; the crash state is put back, and a new connection
 * hands the region back with SET_INFLIGHT_FD (no GET, as QEMU does on a
 * reconnect) and restarts the ring from used->idx.  Exactly the two
 * requests still in flight must complete, once each; the one already
 * published must not run again; a new request after them is served as
 * the next used entry.
 */
static void test_inflight(void)
{
	struct ioc__vub_export *e;
	struct vub_inflight_desc d = { .num_queues = 2, .queue_size = QN };
	struct vring_used *u;
	struct vub_inflight_queue *iq;
	uint8_t *region, *saved_region, saved_used[0x1000];
	uint64_t qbytes;
	uint16_t base;
	int before, ifd;
	struct fe f;

	setup();
	before = count_fds();
	e = export_new(sock_path, true);
	fe_inflight = true;
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	ifd = fe_get_inflight(&f, &d);
	qbytes = ioc__vub_inflight_queue_bytes(QN);
	ASSERT_UEQ(d.num_queues, 2);
	ASSERT_UEQ(d.queue_size, QN);
	ASSERT_UEQ(d.mmap_offset, 0);
	ASSERT_UGE(d.mmap_size, 2 * qbytes);
	/* Sealed at its size: shrinking it under the back end's mapping
	 * (a SIGBUS there) is refused. */
	ASSERT_TRUE(fcntl(ifd, F_GET_SEALS) & F_SEAL_SHRINK);
	ASSERT_EQ(ftruncate(ifd, 0), -1);
	ASSERT_EQ(errno, EPERM);
	region = mmap(NULL, d.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, ifd, 0);
	ASSERT_TRUE(region != MAP_FAILED);
	for (unsigned i = 0; i < 2; i++) {
		iq = (struct vub_inflight_queue *)(region + i * qbytes);
		ASSERT_UEQ(iq->version, 1);
		ASSERT_UEQ(iq->desc_num, QN);
		ASSERT_UEQ(iq->used_idx, 0);
		for (unsigned h = 0; h < QN; h++)
			ASSERT_UEQ(iq->desc[h].inflight, 0);
	}
	iq = (struct vub_inflight_queue *)region;
	ASSERT_UEQ(fe_acked(&f, VUB_SET_INFLIGHT_FD, &d, sizeof(d), &ifd, 1), 0);
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	u = gpa(&f, ring_gpa(0) + 0x2000);

	/* Tracked while it runs: a request in and out leaves nothing in
	 * flight and the region's used_idx at used->idx. */
	fe_post_k(&f, 0, 0, true);
	ASSERT_UEQ(fe_wait(&f, 0), 513);
	ASSERT_UEQ(*(uint8_t *)gpa(&f, IF_STAT(0)), VIRTIO_BLK_S_OK);
	fe_wait_region(iq, 1);
	ASSERT_UEQ(iq->desc[0].inflight, 0);

	/* Three in flight, held at the gate. */
	ioc_node_set_gate(node, IOC_NODE_GATE_HOLD);
	for (unsigned k = 0; k < 3; k++)
		fe_post_k(&f, 0, k, k == 2);
	fe_wait_taken(&f, 0);
	ASSERT_UEQ(u->idx, 1);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_UEQ(iq->desc[3 * k].inflight, 1);
	ASSERT_ULT(iq->desc[0].counter, iq->desc[3].counter);
	ASSERT_ULT(iq->desc[3].counter, iq->desc[6].counter);

	/* The crash state, plus request 1 (head 3) published out of order,
	 * its flag still set. */
	saved_region = malloc(d.mmap_size);
	ASSERT_NOT_NULL(saved_region);
	memcpy(saved_region, region, d.mmap_size);
	memcpy(saved_used, u, sizeof(saved_used));
	{
		struct vring_used *su = (struct vring_used *)saved_used;
		struct vub_inflight_queue *sq = (struct vub_inflight_queue *)saved_region;

		su->ring[1 % QN] = (struct vring_used_elem){ 3, 513 };
		su->idx = 2;
		sq->desc[3].next = sq->last_batch_head;
		sq->last_batch_head = 3;
	}

	/* Let them go, and the front end goes away. */
	ioc_node_set_gate(node, IOC_NODE_GATE_OPEN);
	fe_wait_used(&f, 0, 4);
	fe_wait_region(iq, 4);   /* its last store, before we overwrite it */
	close(f.sock);

	/* Back to the crash state; the guest's buffers as before. */
	memcpy(region, saved_region, d.mmap_size);
	memcpy(u, saved_used, sizeof(saved_used));
	for (unsigned k = 0; k < 3; k++) {
		*(uint8_t *)gpa(&f, IF_STAT(k)) = k == 1 ? 0x77 : 0xee;
		memset(gpa(&f, IF_DATA(k)), 0, 512);
	}

	/* The reconnect: SET_INFLIGHT_FD with the same region, the ring
	 * from used->idx (what QEMU restores when GET_VRING_BASE failed). */
	f.sock = fe_connect(sock_path);
	fe_negotiate(&f);
	{
		uint64_t v;

		/* The old connection's signals.  A reply on the new one
		 * means the old one is torn down (the export serves one
		 * front end at a time), so none can come after this. */
		while (read(f.call[0], &v, 8) == 8) {
		}
	}
	ASSERT_UEQ(fe_acked(&f, VUB_SET_INFLIGHT_FD, &d, sizeof(d), &ifd, 1), 0);
	fe_mem_table(&f);
	ioc_node_set_gate(node, IOC_NODE_GATE_HOLD);
	fe_start_ring(&f, 0, 2);
	ASSERT_UEQ(u->idx, 2);   /* the two resubmitted are held */
	ioc_node_set_gate(node, IOC_NODE_GATE_OPEN);
	/* The guest's used_event (1) is behind used->idx (2): the entry
	 * published by the dead back end was never signalled.  The first
	 * batch after the restart signals anyway, or the guest would wait
	 * for the index to wrap. */
	{
		struct pollfd pf = { f.call[0], POLLIN, 0 };

		ASSERT_UEQ(*(uint16_t *)&((struct vring_avail *)gpa(&f, ring_gpa(0) + 0x1000))
				    ->ring[QN], 1);
		ASSERT_EQ(poll(&pf, 1, 5000), 1);
	}
	fe_wait_used(&f, 0, 4);
	{
		uint32_t a = u->ring[2 % QN].id, b = u->ring[3 % QN].id;

		/* In either order: they run at once and complete as they
		 * finish. */
		ASSERT_TRUE((a == 0 && b == 6) || (a == 6 && b == 0));
	}
	ASSERT_UEQ(*(uint8_t *)gpa(&f, IF_STAT(0)), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(*(uint8_t *)gpa(&f, IF_STAT(2)), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(*(uint8_t *)gpa(&f, IF_STAT(1)), 0x77);   /* not run again */
	{
		uint8_t b[512];
		int fd = open(img, O_RDONLY);

		ASSERT_EQ(pread(fd, b, 512, 10 * 512), 512);
		close(fd);
		ASSERT_MEM_EQ(gpa(&f, IF_DATA(2)), b, 512);
	}
	/* Nothing more came: the next request is the next used entry. */
	f.avail[0] = 4;
	f.used_seen[0] = 4;
	fe_post_k(&f, 0, 1, true);
	ASSERT_UEQ(fe_wait(&f, 0), 513);
	ASSERT_UEQ(u->idx, 5);
	ASSERT_UEQ(u->ring[4 % QN].id, 3);
	fe_wait_region(iq, 5);
	for (unsigned h = 0; h < QN; h++)
		ASSERT_UEQ(iq->desc[h].inflight, 0);
	base = fe_stop_ring(&f, 0);
	ASSERT_UEQ(base, 5);

	fe_close(&f);
	munmap(region, d.mmap_size);
	close(ifd);
	free(saved_region);
	fe_inflight = false;
	ioc_iothread_call(ctrl_th, free_fn, e);
	ASSERT_EQ(count_fds(), before);
}

/* GET/SET_INFLIGHT_FD that do not fit end the connection; the export
 * serves the next one. */
static void test_inflight_bad(void)
{
	struct ioc__vub_export *e;
	struct fe f;
	int before, ifd, small;
	const uint64_t qbytes = ioc__vub_inflight_queue_bytes(QN);
	static const struct vub_inflight_desc bad_get[] = {
		{ 0, 0, 0, QN },             /* no queue */
		{ 0, 0, 3, QN },             /* more queues than the device */
		{ 0, 0, 1, 0 },              /* no entries */
		{ 0, 0, 1, 24 },             /* not a power of two */
		{ 0, 0, 1, 65535 },
	};

	setup();
	before = count_fds();
	e = export_new(sock_path, true);
	small = memfd_create("small", MFD_CLOEXEC);
	ASSERT_OK(ftruncate(small, 4096));

	/* Not negotiated. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_inflight_desc d = { 0, 0, 1, QN };

		fe_send(&f, VUB_GET_INFLIGHT_FD, 0, &d, sizeof(d), NULL, 0);
		fe_expect_closed(&f);
	}
	fe_close(&f);

	fe_inflight = true;
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bad_get); i++) {
		fe_open(&f, sock_path);
		fe_negotiate(&f);
		fe_send(&f, VUB_GET_INFLIGHT_FD, 0, &bad_get[i], sizeof(bad_get[i]), NULL, 0);
		fe_expect_closed(&f);
		fe_close(&f);
	}
	/* SET_INFLIGHT_FD: the shapes above, a region smaller than its
	 * queues, larger than its file, an offset that wraps, a wrong
	 * payload size, no fd. */
	{
		const struct vub_inflight_desc bad_set[] = {
			bad_get[0], bad_get[1], bad_get[3],
			{ qbytes, 0, 2, QN },
			{ 8192, 0, 1, QN },
			{ qbytes, UINT64_MAX - 100, 1, QN },
		};

		for (size_t i = 0; i < IOC_ARRAY_SIZE(bad_set) + 2; i++) {
			fe_open(&f, sock_path);
			fe_negotiate(&f);
			if (i < IOC_ARRAY_SIZE(bad_set))
				fe_send(&f, VUB_SET_INFLIGHT_FD, VUB_FLAG_NEED_REPLY, &bad_set[i],
					sizeof(bad_set[i]), &small, 1);
			else if (i == IOC_ARRAY_SIZE(bad_set))
				fe_send(&f, VUB_SET_INFLIGHT_FD, 0, &bad_set[4], 16, &small, 1);
			else
				fe_send(&f, VUB_SET_INFLIGHT_FD, 0, &bad_set[4], 24, NULL, 0);
			fe_expect_closed(&f);
			fe_close(&f);
		}
	}
	/* With a queue running. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_inflight_desc d = { .num_queues = 2, .queue_size = QN };

		ifd = fe_get_inflight(&f, &d);
		fe_mem_table(&f);
		fe_start_ring(&f, 0, 0);
		fe_send(&f, VUB_SET_INFLIGHT_FD, 0, &d, sizeof(d), &ifd, 1);
		fe_expect_closed(&f);
		close(ifd);
	}
	fe_close(&f);
	/* A ring larger than its region: the queue does not start, the
	 * connection goes on. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_inflight_desc d = { .num_queues = 2, .queue_size = QN / 2 };

		ifd = fe_get_inflight(&f, &d);
		ASSERT_UEQ(fe_acked(&f, VUB_SET_INFLIGHT_FD, &d, sizeof(d), &ifd, 1), 0);
		close(ifd);
		fe_mem_table(&f);
		fe_start_ring(&f, 0, 0);
		{
			struct { struct ioc__vub_export *e; struct ioc__vub_info i; } a = { e };

			ioc_iothread_call(ctrl_th, info_fn, &a);
			ASSERT_TRUE(a.i.connected);
			ASSERT_UEQ(a.i.queues_started, 0);
		}
	}
	fe_close(&f);
	/* A region of the front end's own, in a memfd that allows seals:
	 * taken, and sealed against shrinking under the mapping. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_inflight_desc d = { qbytes, 0, 1, QN };

		ifd = memfd_create("fe-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		ASSERT_GE(ifd, 0);
		ASSERT_OK(ftruncate(ifd, (off_t)qbytes));
		ASSERT_FALSE(fcntl(ifd, F_GET_SEALS) & F_SEAL_SHRINK);
		ASSERT_UEQ(fe_acked(&f, VUB_SET_INFLIGHT_FD, &d, sizeof(d), &ifd, 1), 0);
		ASSERT_TRUE(fcntl(ifd, F_GET_SEALS) & F_SEAL_SHRINK);
		ASSERT_EQ(ftruncate(ifd, 0), -1);
		close(ifd);
	}
	fe_close(&f);
	/* And then a good one. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	{
		struct vub_inflight_desc d = { .num_queues = 1, .queue_size = QN };

		ifd = fe_get_inflight(&f, &d);
		ASSERT_UEQ(fe_acked(&f, VUB_SET_INFLIGHT_FD, &d, sizeof(d), &ifd, 1), 0);
		close(ifd);
	}
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	/* Queue 1 is past the region's one queue: served, not tracked. */
	fe_start_ring(&f, 1, 0);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(fe_req(&f, 1, VIRTIO_BLK_T_FLUSH, 0, 0, NULL), VIRTIO_BLK_S_OK);
	fe_inflight = false;
	fe_close(&f);
	close(small);
	ioc_iothread_call(ctrl_th, free_fn, e);
	ASSERT_EQ(count_fds(), before);
}

/* ---- dirty logging ------------------------------------------------------------ */

#define LOG_BYTES (MEMSZ / 4096 / 8)     /* the whole guest, one bit a page */

struct dlog {
	int fd;
	uint8_t *map, *bits;
};

static void dlog_new(struct dlog *l, uint64_t offset)
{
	l->fd = memfd_create("log", MFD_CLOEXEC);
	ASSERT_GE(l->fd, 0);
	ASSERT_OK(ftruncate(l->fd, (off_t)(offset + LOG_BYTES)));
	l->map = mmap(NULL, offset + LOG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
	ASSERT_TRUE(l->map != MAP_FAILED);
	l->bits = l->map + offset;
}

static void dlog_free(struct dlog *l, uint64_t offset)
{
	munmap(l->map, offset + LOG_BYTES);
	close(l->fd);
}

/* SET_LOG_BASE: the reply has no payload. */
static void fe_set_log(struct fe *f, struct dlog *l, uint64_t offset)
{
	struct vub_log_desc d = { LOG_BYTES, offset };

	fe_send(f, VUB_SET_LOG_BASE, 0, &d, sizeof(d), &l->fd, 1);
	ASSERT_EQ(fe_reply(f, VUB_SET_LOG_BASE, NULL, 0), 0);
}

static void fe_features(struct fe *f, bool log_all)
{
	uint64_t feat = fe_get_u64(f, VUB_GET_FEATURES);

	if (!log_all)
		feat &= ~(1ull << VUB_F_LOG_ALL);
	ASSERT_UEQ(fe_acked(f, VUB_SET_FEATURES, &feat, 8, NULL, 0), 0);
}

/* SET_VRING_ADDR on running ring q, its used ring logged or not. */
static void fe_log_used(struct fe *f, unsigned q, bool on)
{
	uint64_t g = ring_gpa(q), u = (uint64_t)(uintptr_t)f->mem;
	struct vhost_vring_addr a = { .index = q,
		.flags = on ? 1u << VHOST_VRING_F_LOG : 0,
		.desc_user_addr = u + g, .avail_user_addr = u + g + 0x1000,
		.used_user_addr = u + g + 0x2000, .log_guest_addr = g + 0x2000 };

	ASSERT_UEQ(fe_acked(f, VUB_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
}

/* The log holds exactly these pages (a 0-terminated list), and is
 * cleared for the next check. */
static void check_pages(struct dlog *l, const uint64_t *pages)
{
	for (uint64_t p = 0; p < LOG_BYTES * 8; p++) {
		bool want = false, got = l->bits[p / 8] & (1u << (p % 8));

		for (const uint64_t *w = pages; *w; w++)
			want |= *w == p;
		if (want != got)
			ioc_test_fail(__FILE__, __LINE__, "page %#llx %s in the log",
				      (unsigned long long)p, got ? "set" : "not set");
	}
	memset(l->bits, 0, LOG_BYTES);
}

/* A request on ring q: header, len bytes of data at data_gpa (written by
 * the device for IN and GET_ID), status; returns the status. */
static uint8_t fe_req_at(struct fe *f, unsigned q, uint32_t type, uint64_t data_gpa,
			 uint32_t len)
{
	struct virtio_blk_outhdr *h = gpa(f, HDR_GPA);
	bool in = type == VIRTIO_BLK_T_IN || type == VIRTIO_BLK_T_GET_ID;
	struct seg s[3] = { { HDR_GPA, 16, false }, { data_gpa, len, in },
			    { STAT_GPA, 1, true } };

	h->type = type;
	h->sector = 8;
	*status(f) = 0xee;
	fe_post(f, q, s, 3);
	fe_wait(f, q);
	return *status(f);
}

static void test_dirty_log(void)
{
	struct ioc__vub_export *e;
	struct fe f;
	struct dlog l1, l2;
	int before;
	const uint64_t used0 = (ring_gpa(0) + 0x2000) / 4096, stat = STAT_GPA / 4096;

	setup();
	before = count_fds();
	e = export_new(sock_path, true);
	fe_open(&f, sock_path);
	{
		uint64_t pf = fe_get_u64(&f, VUB_GET_PROTOCOL_FEATURES);

		ASSERT_TRUE(pf & (1ull << VUB_PROTO_F_LOG_SHMFD));
	}
	extra_pf = 1ull << VUB_PROTO_F_LOG_SHMFD;
	fe_negotiate(&f);
	extra_pf = 0;
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	fe_start_ring(&f, 1, 0);
	dlog_new(&l1, 0);
	fe_set_log(&f, &l1, 0);

	/* A log but no LOG_ALL: nothing is marked. */
	ASSERT_UEQ(fe_req_at(&f, 0, VIRTIO_BLK_T_IN, DATA_GPA, 4096), VIRTIO_BLK_S_OK);
	check_pages(&l1, (const uint64_t[]){ 0 });

	/* LOG_ALL, ring 0's used ring logged.  A read of two pages starting
	 * mid-page marks the three pages it wrote, the status byte's and
	 * the used ring's; not the header's, the ring's other parts. */
	fe_features(&f, true);
	fe_log_used(&f, 0, true);
	ASSERT_UEQ(fe_req_at(&f, 0, VIRTIO_BLK_T_IN, DATA_GPA + 0x800, 8192), VIRTIO_BLK_S_OK);
	check_pages(&l1, (const uint64_t[]){ used0, DATA_GPA / 4096, DATA_GPA / 4096 + 1,
					     DATA_GPA / 4096 + 2, stat, 0 });
	/* A write writes only the status byte; ring 1's used ring is not
	 * logged (no VRING_F_LOG). */
	ASSERT_UEQ(fe_req_at(&f, 1, VIRTIO_BLK_T_OUT, DATA_GPA, 8192), VIRTIO_BLK_S_OK);
	check_pages(&l1, (const uint64_t[]){ stat, 0 });
	/* GET_ID writes its 20 bytes, here across a page boundary. */
	ASSERT_UEQ(fe_req_at(&f, 0, VIRTIO_BLK_T_GET_ID, 0x220ff0, 64), VIRTIO_BLK_S_OK);
	check_pages(&l1, (const uint64_t[]){ used0, 0x220, 0x221, stat, 0 });
	/* A read refused (past the disk) writes, and marks, only its
	 * status byte. */
	{
		struct virtio_blk_outhdr *h = gpa(&f, HDR_GPA);
		struct seg s[3] = { { HDR_GPA, 16, false }, { 0x230000, 512, true },
				    { STAT_GPA, 1, true } };

		h->type = VIRTIO_BLK_T_IN;
		h->sector = IMG_SIZE / 512;
		fe_post(&f, 0, s, 3);
		fe_wait(&f, 0);
		ASSERT_UEQ(*status(&f), VIRTIO_BLK_S_IOERR);
		check_pages(&l1, (const uint64_t[]){ used0, stat, 0 });
	}

	/* A new log (at an odd offset in its file: byte-wide ORs) replaces
	 * the old one, which sees nothing more. */
	dlog_new(&l2, 3);
	fe_set_log(&f, &l2, 3);
	ASSERT_UEQ(fe_req_at(&f, 1, VIRTIO_BLK_T_IN, DATA_GPA, 4096), VIRTIO_BLK_S_OK);
	check_pages(&l2, (const uint64_t[]){ DATA_GPA / 4096, stat, 0 });
	check_pages(&l1, (const uint64_t[]){ 0 });
	ASSERT_UEQ(l2.map[0] | l2.map[1] | l2.map[2], 0);
	/* Ring 0's used ring logging off, then LOG_ALL off. */
	fe_log_used(&f, 0, false);
	ASSERT_UEQ(fe_req_at(&f, 0, VIRTIO_BLK_T_IN, DATA_GPA, 4096), VIRTIO_BLK_S_OK);
	check_pages(&l2, (const uint64_t[]){ DATA_GPA / 4096, stat, 0 });
	fe_log_used(&f, 0, true);
	fe_features(&f, false);
	ASSERT_UEQ(fe_req_at(&f, 0, VIRTIO_BLK_T_IN, DATA_GPA, 4096), VIRTIO_BLK_S_OK);
	check_pages(&l2, (const uint64_t[]){ 0 });
	fe_close(&f);

	/* SET_LOG_BASE messages refused, each ending its connection: without
	 * LOG_SHMFD, of zero bytes, with offset + size overflowing, larger
	 * than its file, of the wrong payload size, without an fd. */
	{
		static const struct { uint64_t size, offset; uint32_t len; int nfds;
				      bool shmfd; } bad[] = {
			{ LOG_BYTES, 0, 16, 1, false },
			{ 0, 0, 16, 1, true },
			{ UINT64_MAX - 8, 16, 16, 1, true },
			{ LOG_BYTES, 1, 16, 1, true },
			{ LOG_BYTES, 0, 8, 1, true },
			{ LOG_BYTES, 0, 16, 0, true },
		};

		for (size_t i = 0; i < IOC_ARRAY_SIZE(bad); i++) {
			struct vub_log_desc d = { bad[i].size, bad[i].offset };

			fe_open(&f, sock_path);
			extra_pf = bad[i].shmfd ? 1ull << VUB_PROTO_F_LOG_SHMFD : 0;
			fe_negotiate(&f);
			extra_pf = 0;
			fe_send(&f, VUB_SET_LOG_BASE, 0, &d, bad[i].len, &l1.fd, bad[i].nfds);
			fe_expect_closed(&f);
			fe_close(&f);
		}
	}
	dlog_free(&l1, 0);
	dlog_free(&l2, 3);
	ioc_iothread_call(ctrl_th, free_fn, e);
	ASSERT_EQ(count_fds(), before);
}

/*
 * A front end truncates the guest memory it passed (a memfd it could not
 * seal) under a running queue: the queue stops and says so on its error
 * eventfd, the process lives on, and the next connection is served.
 * Without the guard the export's next look at the ring kills the process
 * with SIGBUS.  After the truncation the front end must not touch its own
 * mapping either: the request is queued first, only the kick comes after.
 */
static void test_memory_shrinks(void)
{
	struct ioc__vub_export *e;
	struct seg s[3] = {
		{ HDR_GPA, 16, false }, { DATA_GPA, 4096, true }, { STAT_GPA, 1, true },
	};
	struct pollfd pf;
	struct fe f;
	uint64_t v;

	setup();
	e = export_new(sock_path, true);
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 0, 4096, NULL), VIRTIO_BLK_S_OK);
	((struct virtio_blk_outhdr *)gpa(&f, HDR_GPA))->type = VIRTIO_BLK_T_IN;
	fe_queue(&f, 0, s, 3);
	ASSERT_OK(ftruncate(f.memfd, 0));
	fe_kick(&f, 0);
	pf = (struct pollfd){ f.err[0], POLLIN, 0 };
	ASSERT_EQ(poll(&pf, 1, 5000), 1);
	ASSERT_EQ(read(f.err[0], &v, 8), 8);
	fe_close(&f);

	/* The same export, a new front end with memory that stays. */
	fe_open(&f, sock_path);
	fe_negotiate(&f);
	fe_mem_table(&f);
	fe_start_ring(&f, 0, 0);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_IN, 0, 4096, NULL), VIRTIO_BLK_S_OK);
	ASSERT_UEQ(fe_req(&f, 0, VIRTIO_BLK_T_OUT, 8, 4096, NULL), VIRTIO_BLK_S_OK);
	fe_close(&f);
	ioc_iothread_call(ctrl_th, free_fn, e);
}

static void test_teardown(void)
{
	ioc_node_graph_detach_loop(graph, ioc_iothread_loop(io_th));
	ioc_node_graph_detach_loop(graph, ioc_iothread_loop(ctrl_th));
	ioc_iothread_stop(io_th);
	ioc_iothread_stop(ctrl_th);
	ioc_node_graph_free(graph);
	unlink(img);
	free(img);
}

IOC_TEST_MAIN(
	IOC_TEST(test_requests),
	IOC_TEST(test_bad_front_ends),
	IOC_TEST(test_read_only),
	IOC_TEST(test_inflight),
	IOC_TEST(test_inflight_bad),
	IOC_TEST(test_dirty_log),
	IOC_TEST(test_memory_shrinks),
	IOC_TEST(test_teardown),
)
