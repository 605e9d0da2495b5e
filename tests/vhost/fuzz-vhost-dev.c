/*
 * Fuzz target: the device state machine and the data path behind it.
 * The input is a program for a front end: each op byte picks a message
 * (framed as msg.c wants, so that it reaches dev.c, with queue indices,
 * sizes, bases, features and fds taken from the bytes after it, GET and
 * SET_INFLIGHT_FD among them), a write into guest memory, a kick, or raw
 * bytes.  The export runs on this
 * thread's loop over a null-co node (reads fill guest memory with
 * zeroes), polled after every op.  At the end the front end hangs up:
 * the export must tear the connection down in bounded time, hold no fd
 * of it (the lowest free fd is back where it was before the run) and
 * accept the next front end.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/node.h"
#include "qmp/schema.h"
#include "vub-export.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define GMEM    (256u << 10)
#define UVA     0x10000000ull
#define GPA2    0x100000ull            /* ADD_MEM_REG's region */
#define UVA2    0x20000000ull

static struct ioc_loop *loop;
static struct ioc_node_graph *graph;
static struct ioc__vub_export *exp;
static char path[108];
static uint8_t *gmem;
static int memfd, memfd2, memfd3, logfd, kick[2], call[2], cli;
#define INFLIGHT_MAX (2 * 16448)           /* two queues of 1024 entries */
static unsigned long ops_run, conversations;

static void quiet(void *opaque, const char *line)
{
}

/* The export lives as long as the process: its socket goes at exit. */
static void unlink_socket(void)
{
	unlink(path);
}

static void setup(void)
{
	struct ioc_node *n;
	const char *cls;
	char err[256];
	json_t *o;

	if (ioc_loop_new(&loop, NULL) < 0 || ioc_node_graph_new(&graph) < 0)
		abort();
	o = ioc__qmp_keyval_parse("driver=null-co,node-name=n,size=1M,read-zeroes=on",
				  NULL, NULL, err, sizeof(err));
	if (!o || !ioc_node_check_opts(o, IOC_QMP_KEYVAL, err, sizeof(err)) ||
	    ioc_node_add(graph, o, &n, &cls, err, sizeof(err)) < 0) {
		fprintf(stderr, "node: %s\n", err);
		abort();
	}
	json_decref(o);
	snprintf(path, sizeof(path), "/tmp/ioc-fuzz-vub-%d.sock", (int)getpid());
	struct ioc__vub_opts eo = {
		.id = "fuzz", .node = n, .socket_path = path, .listen_fd = -1,
		.writable = true, .num_queues = 2, .serial = "fuzz", .ctrl_loop = loop,
		.log = quiet,
	};
	if (ioc__vub_export_new(&exp, &eo, err, sizeof(err)) < 0) {
		fprintf(stderr, "export: %s\n", err);
		abort();
	}
	atexit(unlink_socket);
	memfd = memfd_create("guest", MFD_CLOEXEC);
	memfd2 = memfd_create("guest2", MFD_CLOEXEC);
	memfd3 = memfd_create("inflight", MFD_CLOEXEC);   /* SET_INFLIGHT_FD's */
	logfd = memfd_create("log", MFD_CLOEXEC);
	if (memfd < 0 || memfd2 < 0 || memfd3 < 0 || logfd < 0 || ftruncate(memfd, GMEM) < 0 ||
	    ftruncate(memfd2, GMEM) < 0 || ftruncate(logfd, 4096) < 0)
		abort();
	gmem = mmap(NULL, GMEM, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (gmem == MAP_FAILED)
		abort();
	for (int i = 0; i < 2; i++) {
		kick[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		call[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	}
}

/* Run the loop until nothing moves; drop what the export sent. */
static void pump(void)
{
	char sink[4096];
	uint64_t v;

	for (int i = 0; i < 64 && ioc_loop_poll(loop, false); i++)
		;
	while (recv(cli, sink, sizeof(sink), MSG_DONTWAIT) > 0)
		;
	for (int i = 0; i < 2; i++)
		if (read(call[i], &v, 8) < 0) {
			/* nothing signalled */
		}
}

static void send_all(const void *b, size_t len, const int *fds, int nfds)
{
	union {
		char c[CMSG_SPACE(sizeof(int) * 2)];
		struct cmsghdr align;
	} cb;
	size_t off = 0;

	for (int tries = 0; off < len && tries < 1000; tries++) {
		struct iovec iov = { (char *)b + off, len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t r;

		if (nfds && off == 0) {
			struct cmsghdr *c;

			mh.msg_control = cb.c;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
		}
		r = sendmsg(cli, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (r > 0)
			off += (size_t)r;
		else if (r < 0 && errno != EAGAIN)
			return;   /* the export hung up */
		pump();
	}
}

static void msg(uint32_t req, uint32_t flags, const void *p, uint32_t size, const int *fds,
		int nfds)
{
	uint8_t b[VUB_HDR_SIZE + VUB_MAX_PAYLOAD];
	uint32_t hdr[3] = { req, VUB_VERSION | flags, size };

	memcpy(b, hdr, sizeof(hdr));
	if (size)
		memcpy(b + VUB_HDR_SIZE, p, size);
	send_all(b, VUB_HDR_SIZE + size, fds, nfds);
}

struct cursor {
	const uint8_t *p;
	size_t n;
};

static uint64_t take(struct cursor *c, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes && c->n; i++, c->p++, c->n--)
		v |= (uint64_t)*c->p << (8 * i);
	return v;
}

static void op(struct cursor *c)
{
	unsigned o = (unsigned)take(c, 1) % 18, q = (unsigned)take(c, 1);
	unsigned qi = q & 1;
	uint32_t fl = (q & 0x80) ? VUB_FLAG_NEED_REPLY : 0;
	uint64_t v;

	switch (o) {
	case 0:
		msg(VUB_GET_FEATURES, 0, NULL, 0, NULL, 0);
		msg(VUB_GET_PROTOCOL_FEATURES, 0, NULL, 0, NULL, 0);
		break;
	case 1:
		v = (q & 2) ? take(c, 8) : exp->features;
		if (q & 4)
			v &= ~(1ull << VIRTIO_RING_F_EVENT_IDX);
		msg(VUB_SET_FEATURES, fl, &v, 8, NULL, 0);
		break;
	case 2:
		v = (q & 2) ? take(c, 8) : exp->protocol_features;
		msg(VUB_SET_PROTOCOL_FEATURES, fl, &v, 8, NULL, 0);
		break;
	case 3: {
		struct vub_mem_table_desc t = { .nregions = 1 };
		int fd = dup(memfd);

		t.r[0] = (struct vub_region_desc){ 0, (q & 2) ? take(c, 4) : GMEM, UVA,
						   (q & 4) ? take(c, 2) : 0 };
		msg(VUB_SET_MEM_TABLE, fl, &t, 8 + 32, &fd, 1);
		close(fd);
		break;
	}
	case 4: {
		struct vhost_vring_state st = { qi, 1u << (take(c, 1) % 10) };

		msg(VUB_SET_VRING_NUM, fl, &st, 8, NULL, 0);
		break;
	}
	case 5: {
		struct vhost_vring_addr a = { .index = qi };
		uint64_t base = UVA + qi * 0x8000;

		a.desc_user_addr = (q & 2) ? UVA + take(c, 3) : base;
		a.avail_user_addr = (q & 4) ? UVA + take(c, 3) : base + 0x2000;
		a.used_user_addr = (q & 8) ? UVA + take(c, 3) : base + 0x4000;
		if (q & 16) {   /* log the used ring, at its address or not */
			a.flags = 1u << VHOST_VRING_F_LOG;
			a.log_guest_addr = (q & 32) ? take(c, 8) : a.used_user_addr - UVA;
		}
		msg(VUB_SET_VRING_ADDR, fl, &a, sizeof(a), NULL, 0);
		break;
	}
	case 6: {
		struct vhost_vring_state st = { qi, (uint32_t)take(c, 2) };

		msg(VUB_SET_VRING_BASE, fl, &st, 8, NULL, 0);
		break;
	}
	case 7:
	case 8: {
		int fd = dup(o == 7 ? kick[qi] : call[qi]);

		v = qi | ((q & 2) ? VUB_VRING_NOFD : 0);
		msg(o == 7 ? VUB_SET_VRING_KICK : VUB_SET_VRING_CALL, fl, &v, 8, &fd,
		    (q & 2) ? 0 : 1);
		close(fd);
		break;
	}
	case 9: {
		struct vhost_vring_state st = { qi, (q >> 1) & 1 };

		msg(VUB_SET_VRING_ENABLE, fl, &st, 8, NULL, 0);
		break;
	}
	case 10: {
		struct vhost_vring_state st = { qi, 0 };

		msg(VUB_GET_VRING_BASE, 0, &st, 8, NULL, 0);
		break;
	}
	case 11: {
		/* Guest memory: descriptors, rings, headers, as the bytes say. */
		unsigned off = (unsigned)take(c, 2) * 4 % GMEM, len = (unsigned)take(c, 1);

		for (unsigned i = 0; i < len && c->n && off + i < GMEM; i++)
			gmem[off + i] = (uint8_t)take(c, 1);
		break;
	}
	case 12:
		v = 1;
		if (write(kick[qi], &v, 8) < 0)
			abort();
		break;
	case 13: {
		struct vub_config_desc cf = { .offset = (uint32_t)take(c, 1),
					      .size = (uint32_t)take(c, 1) % 64 };

		cf.data[0] = (uint8_t)take(c, 1);
		msg((q & 2) ? VUB_SET_CONFIG : VUB_GET_CONFIG, fl, &cf, 12 + cf.size, NULL, 0);
		break;
	}
	case 14: {
		struct vub_mem_one_desc one = { 0 };
		int fd = dup(memfd2);

		one.r = (struct vub_region_desc){ GPA2, GMEM, UVA2, 0 };
		if (q & 2)
			msg(VUB_REM_MEM_REG, fl, &one, sizeof(one), NULL, 0);
		else
			msg(VUB_ADD_MEM_REG, fl, &one, sizeof(one), &fd, 1);
		close(fd);
		break;
	}
	case 15: {
		/* The dirty log: SET_LOG_BASE over the whole guest (or the
		 * size and offset the bytes say; an eventfd instead of a
		 * memfd), or SET_LOG_FD. */
		struct vub_log_desc d = { (q & 2) ? take(c, 4) : 64, (q & 4) ? take(c, 2) : 0 };
		int fd = dup((q & 8) ? call[qi] : logfd);

		if (q & 16)
			msg(VUB_SET_LOG_FD, fl, NULL, 0, &fd, 1);
		else
			msg(VUB_SET_LOG_BASE, fl, &d, sizeof(d), &fd, 1);
		close(fd);
		break;
	}
	case 16: {
		/* GET_INFLIGHT_FD (its reply's fd is dropped by pump()'s
		 * recv), or SET_INFLIGHT_FD of memfd3; the shape from the
		 * bytes, the size and offset fitting it unless q says. */
		struct vub_inflight_desc d = { .num_queues = (uint16_t)(take(c, 1) % 4),
					       .queue_size = (uint16_t)(1u << (take(c, 1) % 17)) };
		int fd = dup(memfd3);

		d.mmap_size = d.num_queues * ioc__vub_inflight_queue_bytes(d.queue_size);
		if (q & 4) {
			d.mmap_size = take(c, 4);
			d.mmap_offset = take(c, 2);
		}
		if (q & 2)
			msg(VUB_SET_INFLIGHT_FD, fl, &d, sizeof(d), &fd, 1);
		else
			msg(VUB_GET_INFLIGHT_FD, 0, &d, sizeof(d), NULL, 0);
		close(fd);
		break;
	}
	default: {
		/* Raw bytes on the socket. */
		uint8_t b[64];
		unsigned len = (unsigned)take(c, 1) % sizeof(b);

		for (unsigned i = 0; i < len; i++)
			b[i] = (uint8_t)take(c, 1);
		send_all(b, len, NULL, 0);
	}
	}
	ops_run++;
	pump();
}

static int lowest_free_fd(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct cursor c = { data, size };
	struct ioc__vub_info info;
	int before;

	if (!loop)
		setup();
	memset(gmem, 0, GMEM);
	/* A zeroed inflight region each run, as a front end makes one. */
	if (ftruncate(memfd3, 0) < 0 || ftruncate(memfd3, INFLIGHT_MAX) < 0)
		abort();
	before = lowest_free_fd();
	cli = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (cli < 0 || connect(cli, (struct sockaddr *)&a, sizeof(a)) < 0)
		abort();
	pump();
	for (int i = 0; i < 300 && c.n; i++)
		op(&c);
	close(cli);
	/* The teardown: bounded, whatever the conversation left behind. */
	for (int i = 0; i < 100000; i++) {
		ioc__vub_export_info(exp, &info);
		if (!info.connected)
			break;
		ioc_loop_poll(loop, false);
	}
	ioc__vub_export_info(exp, &info);
	if (info.connected) {
		fprintf(stderr, "the export did not let go of the connection\n");
		abort();
	}
	if (lowest_free_fd() != before) {
		fprintf(stderr, "an fd of the connection is still open\n");
		abort();
	}
	conversations++;
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-runner.h"

static bool fuzz_report(void)
{
	struct ioc__vub_info info;

	ioc__vub_export_info(exp, &info);
	printf("# %lu conversations, %lu ops, %llu requests completed\n", conversations,
	       ops_run, (unsigned long long)info.requests);
	return info.requests > 100;
}

/* A front end's start-up: features, memory, queue qi up and a request. */
static void startup(struct input *in, unsigned qi)
{
	static const uint8_t boot[] = {
		0, 0,           /* GET_FEATURES, GET_PROTOCOL_FEATURES */
		8, 0,           /* SET_VRING_CALL 0 before SET_FEATURES */
		2, 0,           /* SET_PROTOCOL_FEATURES: all offered */
		1, 0,           /* SET_FEATURES: all offered */
		3, 0x80,        /* SET_MEM_TABLE, NEED_REPLY */
	};
	uint8_t qsteps[] = {
		4, 0, 4,        /* SET_VRING_NUM 16 */
		6, 0, 0, 0,     /* SET_VRING_BASE 0 */
		5, 0,           /* SET_VRING_ADDR */
		7, 0,           /* SET_VRING_KICK */
		8, 0,           /* SET_VRING_CALL */
		9, 2,           /* SET_VRING_ENABLE 1 */
	};
	put(in, boot, sizeof(boot));
	qsteps[1] = (uint8_t)qi;
	qsteps[4] = (uint8_t)qi;
	qsteps[8] = (uint8_t)qi;
	qsteps[10] = (uint8_t)qi;
	qsteps[12] = (uint8_t)qi;
	qsteps[14] = (uint8_t)(2 | qi);
	put(in, qsteps, sizeof(qsteps));
}

/* Guest memory op: len bytes at off (a multiple of 4). */
static void poke(struct input *in, unsigned off, const void *p, unsigned len)
{
	uint8_t h[4] = { 11, 0, (uint8_t)(off / 4), (uint8_t)(off / 4 >> 8) };
	uint8_t l = (uint8_t)len;

	put(in, h, 4);
	put(in, &l, 1);
	put(in, p, len);
}

/* A read of 512 bytes on queue qi (its ring at qi * 0x8000), posted as
 * avail entry idx, and a kick. */
static void request(struct input *in, unsigned qi, uint16_t idx, uint32_t type)
{
	unsigned base = qi * 0x8000;
	struct vring_desc d[3] = {
		{ 0x10000, 16, VRING_DESC_F_NEXT, 1 },
		{ 0x11000, 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2 },
		{ 0x12000, 1, VRING_DESC_F_WRITE, 0 },
	};
	struct virtio_blk_outhdr h = { type, 0, 8 };
	uint16_t ring = 0, aidx = (uint16_t)(idx + 1);
	uint8_t k[2] = { 12, (uint8_t)qi };

	if (type == VIRTIO_BLK_T_OUT)
		d[1].flags = VRING_DESC_F_NEXT;
	poke(in, base, d, sizeof(d));
	poke(in, 0x10000, &h, sizeof(h));
	poke(in, base + 0x2000 + 4 + 2 * (idx % 16), &ring, 2);
	poke(in, (base + 0x2000 + 2) & ~3u, (uint8_t[]){ 0, 0, (uint8_t)aidx, (uint8_t)(aidx >> 8) }, 4);
	put(in, k, 2);
}

static unsigned make_inputs(struct input *ins)
{
	unsigned n = 0;

	/* Start-up and reads on queue 0. */
	startup(&ins[n], 0);
	for (uint16_t i = 0; i < 6; i++)
		request(&ins[n], 0, i, VIRTIO_BLK_T_IN);
	n++;
	/* Both queues, writes, then stop and restart queue 0. */
	startup(&ins[n], 0);
	startup(&ins[n], 1);
	for (uint16_t i = 0; i < 4; i++) {
		request(&ins[n], 0, i, VIRTIO_BLK_T_OUT);
		request(&ins[n], 1, i, VIRTIO_BLK_T_IN);
	}
	put(&ins[n], (uint8_t[]){ 10, 0 }, 2);   /* GET_VRING_BASE 0 */
	put(&ins[n], (uint8_t[]){ 7, 0 }, 2);    /* SET_VRING_KICK 0: restart */
	request(&ins[n], 0, 4, VIRTIO_BLK_T_GET_ID);
	n++;
	/* Memory by ADD/REM_MEM_REG under running queues; config access. */
	startup(&ins[n], 1);
	put(&ins[n], (uint8_t[]){ 14, 0, 13, 0, 32, 1, 0, 14, 2 }, 9);
	request(&ins[n], 1, 0, VIRTIO_BLK_T_FLUSH);
	put(&ins[n], (uint8_t[]){ 13, 2, 32, 1, 0 }, 5);
	request(&ins[n], 1, 1, 99);
	n++;
	/* Inflight tracking: GET and SET_INFLIGHT_FD (two queues of 16)
	 * before the ring starts, reads, a stop, the region set again and
	 * a restart that finds what the stop left; then SET_INFLIGHT_FD on
	 * a running queue, which ends the connection. */
	put(&ins[n], (uint8_t[]){ 0, 0, 8, 0, 2, 0, 1, 0, 3, 0x80 }, 10);
	put(&ins[n], (uint8_t[]){ 16, 0, 2, 4, 16, 0x82, 2, 4 }, 8);
	put(&ins[n], (uint8_t[]){ 4, 0, 4, 6, 0, 0, 0, 5, 0, 7, 0, 8, 0, 9, 2 }, 15);
	for (uint16_t i = 0; i < 4; i++)
		request(&ins[n], 0, i, VIRTIO_BLK_T_IN);
	put(&ins[n], (uint8_t[]){ 10, 0, 16, 0x82, 2, 4, 7, 0 }, 8);
	request(&ins[n], 0, 4, VIRTIO_BLK_T_OUT);
	put(&ins[n], (uint8_t[]){ 16, 0x82, 2, 4 }, 4);
	n++;
	/* Inflight messages of bad shapes and sizes. */
	put(&ins[n], (uint8_t[]){ 0, 0, 2, 0, 16, 0, 3, 4, 16, 0, 1, 16 }, 12);
	n++;
	put(&ins[n], (uint8_t[]){ 0, 0, 2, 0, 16, 0x86, 1, 4, 0xff, 0xff, 0xff, 0xff, 0, 0 }, 14);
	n++;
	/* Without EVENT_IDX, NOFD kick and call. */
	put(&ins[n], (uint8_t[]){ 2, 0, 1, 4, 3, 0, 4, 0, 4, 5, 0, 7, 2, 8, 2, 9, 2 }, 17);
	request(&ins[n], 0, 0, VIRTIO_BLK_T_IN);
	n++;
	/* Dirty logging (LOG_ALL is among the features startup takes): a
	 * log, the used ring logged, reads; a second log at an offset, the
	 * log fd; turned off. */
	startup(&ins[n], 0);
	put(&ins[n], (uint8_t[]){ 15, 0, 5, 16 }, 4);
	for (uint16_t i = 0; i < 3; i++)
		request(&ins[n], 0, i, VIRTIO_BLK_T_IN);
	put(&ins[n], (uint8_t[]){ 15, 4, 3, 0, 15, 16 }, 6);
	request(&ins[n], 0, 3, VIRTIO_BLK_T_GET_ID);
	/* SET_FEATURES VERSION_1, PROTOCOL_FEATURES, EVENT_IDX: no LOG_ALL. */
	put(&ins[n], (uint8_t[]){ 1, 2, 0, 0, 0, 0x60, 1, 0, 0, 0, 5, 0 }, 12);
	request(&ins[n], 0, 4, VIRTIO_BLK_T_IN);
	n++;
	/* A log the size of its file and past it; an eventfd as the log. */
	startup(&ins[n], 1);
	put(&ins[n], (uint8_t[]){ 15, 3, 0, 0x10, 0, 0 }, 6);
	request(&ins[n], 1, 0, VIRTIO_BLK_T_IN);
	put(&ins[n], (uint8_t[]){ 15, 3, 1, 0x10, 0, 0 }, 6);
	n++;
	startup(&ins[n], 1);
	put(&ins[n], (uint8_t[]){ 15, 9 }, 2);
	n++;
	return n;
}
#endif
