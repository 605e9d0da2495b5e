/*
 * The migration receiver (src/migrate/receive.c) on a socketpair: a
 * feeder thread writes a stream built by mig-test-util.h and reads the
 * receiver's ACK, the receiver writes a file in the test directory, and
 * the file is compared with the builder's model byte for byte.  Then the
 * failures: truncations at every kind of boundary, corrupted payloads and
 * record headers, a wrong image checksum, a block never sent, protocol
 * errors, a failing write, and cancellation; each must fail with its
 * errno and a reason.
 * Nothing here depends on timing: the feeder and the receiver meet only
 * through the socket, and cancellation wakes the receiver by shutdown(2).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"
#include "mig-test-util.h"
#include "mig-test-node.h"
#include "receive.h"

struct feeder {
	int fd;                 /* the sender's end */
	int peer_fd;            /* the receiver's end (shut down on cancel) */
	const uint8_t *p;
	size_t len;
	atomic_bool *cancel;    /* set: cancel after writing, instead of EOF */
	uint8_t ack[1 << 16];   /* the answers: MACKs, then an ACK */
	size_t ack_len;
	pthread_t thread;
};

static void *feed(void *arg)
{
	struct feeder *f = arg;
	size_t off = 0;

	while (off < f->len) {
		ssize_t n = send(f->fd, f->p + off, f->len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the receiver gave up and closed its end */
		off += (size_t)n;
	}
	if (f->cancel) {
		/* Release: pairs with the receiver's acquire load of the flag.
		 * Then wake it if it sleeps in read(): shut its end down. */
		atomic_store_explicit(f->cancel, true, memory_order_release);
		shutdown(f->peer_fd, SHUT_RD);
	} else {
		shutdown(f->fd, SHUT_WR);
	}
	/* The answers, until the receiver's end is closed. */
	while (f->ack_len < sizeof(f->ack)) {
		ssize_t n = recv(f->fd, f->ack + f->ack_len, sizeof(f->ack) - f->ack_len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		f->ack_len += (size_t)n;
	}
	return NULL;
}

struct result {
	int ret;
	char why[512];
	struct ioc_mig_recv_stats st;
	bool have_ack;
	struct ioc_mig_rec ack;
	uint64_t macks, last_mack;
	unsigned long progress_calls;
};

static void on_progress(void *opaque, const struct ioc_mig_recv_stats *st)
{
	struct result *r = opaque;

	ASSERT_UGE(st->records, r->progress_calls);
	r->progress_calls++;
}

static char image_path[512];
static bool nonblocking_receiver; /* the receiver's end O_NONBLOCK */

static int open_image(size_t prefill)
{
	int fd;

	snprintf(image_path, sizeof(image_path), "%s/mig-image", ioc_test_tmpdir());
	fd = open(image_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ASSERT_GE(fd, 0);
	/* Old content the stream must overwrite (and a size it must fix). */
	if (prefill) {
		uint8_t *junk = malloc(prefill);

		memset(junk, 0xa5, prefill);
		ASSERT_UEQ(pwrite(fd, junk, prefill, 0), prefill);
		free(junk);
	}
	return fd;
}

/* Receive len bytes of stream into image_fd with threads workers. */
static void receive(const uint8_t *p, size_t len, int image_fd, unsigned threads,
		    atomic_bool *cancel, struct result *res)
{
	struct feeder f = { .p = p, .len = len, .cancel = cancel };
	struct ioc_mig_recv_opts o = {
		.threads = threads, .cancel = cancel,
		.progress = on_progress, .opaque = res,
	};
	struct mt_node node;
	int sv[2];

	memset(res, 0, sizeof(*res));
	ASSERT_OK(mt_node_open(&node, image_fd));
	o.node = node.n;
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	if (nonblocking_receiver)
		ASSERT_OK(fcntl(sv[0], F_SETFL, O_NONBLOCK));
	o.fd = f.peer_fd = sv[0];
	f.fd = sv[1];
	ASSERT_EQ(pthread_create(&f.thread, NULL, feed, &f), 0);
	res->ret = ioc_mig_receive(&o, &res->st, res->why, sizeof(res->why));
	mt_node_close(&node);
	close(sv[0]);
	ASSERT_EQ(pthread_join(f.thread, NULL), 0);
	close(sv[1]);
	ASSERT_UEQ(f.ack_len % IOC_MIG_REC_SIZE, 0);
	for (size_t off = 0; off < f.ack_len; off += IOC_MIG_REC_SIZE) {
		struct ioc_mig_hdr h = { IOC_MIG_VERSION, 0, 4096, 4096 };
		struct ioc_mig_rec a;

		ASSERT_FALSE(res->have_ack); /* nothing after the ACK */
		ASSERT_OK(ioc_mig_rec_decode(f.ack + off, &h, &a, NULL));
		if (a.type == IOC_MIG_MACK) {
			/* Cumulative, one per MIRROR record here. */
			ASSERT_UEQ(a.offset, res->last_mack + 1);
			res->last_mack = a.offset;
			res->macks++;
			continue;
		}
		ASSERT_UEQ(a.type, IOC_MIG_ACK);
		res->ack = a;
		res->have_ack = true;
	}
	if (res->ret < 0)
		ioc_test_diag("receiver: %s", res->why);
}

static void check_image(int fd, const struct mt_stream *s)
{
	uint8_t *got = malloc((size_t)s->image_size);
	struct stat sb;

	ASSERT_OK(fstat(fd, &sb));
	ASSERT_UEQ(sb.st_size, s->image_size);
	ASSERT_UEQ(pread(fd, got, (size_t)s->image_size, 0), s->image_size);
	ASSERT_MEM_EQ(got, s->model, (size_t)s->image_size);
	free(got);
}

static void close_image(int fd)
{
	close(fd);
	unlink(image_path);
}

#define ASSERT_WHY(res, text)                                                   \
	do {                                                                    \
		if (!strstr((res)->why, (text)))                                \
			ioc_test_fail(__FILE__, __LINE__, "reason \"%s\" lacks \"%s\"", \
				      (res)->why, (text));                      \
	} while (0)

/* Three passes: pass 2 rewrites blocks of pass 1 (data over data, zeros
 * over data, data over zeros, raw over zstd), pass 3 the short last block
 * and a block of pass 2. */
static void build_passes(struct mt_stream *s, uint8_t *buf)
{
	const uint32_t bs = 4096, chunk = 16 * bs;

	mt_begin(s, 40 * chunk + 1000, bs); /* 2.5 MiB and a short block */
	mt_pass(s, 1);
	for (uint32_t i = 0; i < 40; i++) {
		uint64_t off = (uint64_t)i * chunk;

		mt_fill(buf, chunk, i, i % 2);
		if (i % 5 == 4)
			mt_zero(s, off, chunk);
		else if (i % 2)
			mt_zstd(s, off, buf, chunk);
		else
			mt_raw(s, off, buf, chunk);
	}
	mt_fill(buf, 1000, 1000, 0);
	mt_raw(s, 40ull * chunk, buf, 1000);
	mt_pass(s, 2);
	for (uint32_t i = 0; i < 40; i += 3) {
		uint64_t off = (uint64_t)i * chunk + 2 * bs;

		mt_fill(buf, 3 * bs, 100 + i, i % 2);
		if (i % 9 == 0)
			mt_zero(s, off, 3 * bs);
		else if (i % 2)
			mt_raw(s, off, buf, 3 * bs);
		else
			mt_zstd(s, off, buf, 3 * bs);
	}
	mt_pass(s, 3);
	mt_fill(buf, 1000 + bs, 7, 1);
	mt_zstd(s, 40ull * chunk - bs, buf, bs + 1000); /* to the end */
	mt_raw(s, 3 * chunk + 2 * bs, buf, bs);
	mt_end(s, mt_checksum(s));
}

static void test_receive_passes(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	struct result res;

	build_passes(&s, buf);
	for (unsigned threads = 1; threads <= 3; threads++) {
		/* Prefilled longer than the image: resized down, junk replaced. */
		int fd = open_image((size_t)s.image_size + 12345);

		/* The last round on a non-blocking socket. */
		nonblocking_receiver = threads == 3;
		receive(s.p, s.len, fd, threads, NULL, &res);
		nonblocking_receiver = false;
		ASSERT_OK(res.ret);
		ASSERT_STR_EQ(res.why, "");
		ASSERT_TRUE(res.have_ack);
		ASSERT_UEQ(res.ack.offset, 0);
		ASSERT_UEQ(res.ack.data_crc, mt_checksum(&s));
		ASSERT_UEQ(res.st.image_size, s.image_size);
		ASSERT_UEQ(res.st.wire_bytes, s.len);
		ASSERT_UEQ(res.st.passes, 3);
		ASSERT_UEQ(res.st.records, 3 + 41 + 14 + 2 + 1);
		ASSERT_UEQ(res.st.zero_bytes, 8 * 16 * 4096 + 5 * 3 * 4096);
		ASSERT_UEQ(res.st.data_bytes, 32 * 16 * 4096 + 1000 + 9 * 3 * 4096 +
			   4096 + 1000 + 4096);
		ASSERT_UEQ(res.progress_calls, res.st.records);
		check_image(fd, &s);
		close_image(fd);
	}
	mt_free(&s);
	free(buf);
}

/* Large records on a fresh (empty) file with several workers: more than
 * the receiver keeps in flight, and one image spanning many of them. */
static void test_receive_large(void)
{
	const uint32_t chunk = 4u << 20;
	unsigned n = (unsigned)ioc_test_scaled(8);
	uint8_t *buf = malloc(chunk);
	struct mt_stream s;
	struct result res;
	int fd;

	mt_begin(&s, (uint64_t)n * chunk, 65536);
	for (unsigned i = 0; i < n; i++) {
		mt_fill(buf, chunk, i, i % 3 != 0);
		if (i % 3)
			mt_zstd(&s, (uint64_t)i * chunk, buf, chunk);
		else
			mt_raw(&s, (uint64_t)i * chunk, buf, chunk);
	}
	mt_end(&s, mt_checksum(&s));
	fd = open_image(0);
	receive(s.p, s.len, fd, 2, NULL, &res);
	ASSERT_OK(res.ret);
	ASSERT_UEQ(res.ack.data_crc, mt_checksum(&s));
	check_image(fd, &s);
	close_image(fd);
	mt_free(&s);
	free(buf);
}

/* Raw records past the file size limit with several writes in flight:
 * the first write that fails names its record, every write in flight is
 * collected, and the sender hears the errno; the blocks before the limit
 * hold the stream's data.  Then one raw record too large for the ring
 * (written alone) on a file with no limit. */
static void test_raw_write_error(void)
{
	const uint32_t bs = 4096, chunk = 16 * bs;
	uint8_t *buf = malloc(5u << 20);
	struct rlimit old, lim;
	struct mt_stream s;
	struct result res;
	int fd;

	mt_begin(&s, 32 * chunk, bs);
	for (uint32_t i = 0; i < 32; i++) {
		mt_fill(buf, chunk, i, 1);
		mt_raw(&s, (uint64_t)i * chunk, buf, chunk);
	}
	mt_end(&s, mt_checksum(&s));
	fd = open_image(32 * chunk); /* full size: no resize past the limit */
	ASSERT_OK(getrlimit(RLIMIT_FSIZE, &old));
	lim = old;
	lim.rlim_cur = 20 * chunk;
	signal(SIGXFSZ, SIG_IGN);
	ASSERT_OK(setrlimit(RLIMIT_FSIZE, &lim));
	receive(s.p, s.len, fd, 2, NULL, &res);
	ASSERT_OK(setrlimit(RLIMIT_FSIZE, &old));
	ASSERT_EQ(res.ret, -EFBIG);
	ASSERT_WHY(&res, "record 21 (DATA_RAW) at image offset 1310720, length 65536: "
		   "cannot write to the image");
	ASSERT_TRUE(res.have_ack);
	ASSERT_UEQ(res.ack.offset, EFBIG);
	{
		uint8_t *got = malloc(20 * chunk);

		ASSERT_UEQ(pread(fd, got, 20 * chunk, 0), 20 * chunk);
		ASSERT_MEM_EQ(got, s.model, 20 * chunk);
		free(got);
	}
	close_image(fd);
	mt_free(&s);

	mt_begin(&s, (5u << 20) + 3 * chunk, bs);
	mt_fill(buf, chunk, 1, 1);
	mt_raw(&s, 0, buf, chunk);
	mt_fill(buf, 5u << 20, 2, 1);
	mt_raw(&s, chunk, buf, 5u << 20);
	mt_fill(buf, 2 * chunk, 3, 1);
	mt_raw(&s, chunk + (5u << 20), buf, 2 * chunk);
	mt_end(&s, mt_checksum(&s));
	fd = open_image(0);
	receive(s.p, s.len, fd, 1, NULL, &res);
	ASSERT_OK(res.ret);
	ASSERT_UEQ(res.st.data_bytes, s.image_size);
	check_image(fd, &s);
	close_image(fd);
	mt_free(&s);
	free(buf);
}

static void expect_fail(const uint8_t *p, size_t len, int err, const char *text,
			bool ack, int line)
{
	struct result res;
	int fd = open_image(4096);

	receive(p, len, fd, 2, NULL, &res);
	close_image(fd);
	if (res.ret != err)
		ioc_test_fail(__FILE__, line, "expected %d, got %d (%s)", err, res.ret,
			      res.why);
	if (!strstr(res.why, text))
		ioc_test_fail(__FILE__, line, "reason \"%s\" lacks \"%s\"", res.why, text);
	/* The sender hears the errno (the socket still works). */
	if (ack && (!res.have_ack || res.ack.offset != (uint64_t)-err))
		ioc_test_fail(__FILE__, line, "no ACK with errno %d", -err);
}

#define EXPECT_FAIL(p, len, err, text) expect_fail(p, len, err, text, true, __LINE__)

static void test_truncated(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	size_t first_payload = IOC_MIG_HDR_SIZE + 2 * IOC_MIG_REC_SIZE;

	build_passes(&s, buf);
	EXPECT_FAIL(s.p, 0, -EPROTO, "truncated: EOF after 0 of 32 bytes of the stream header");
	EXPECT_FAIL(s.p, 10, -EPROTO, "truncated: EOF after 10 of 32 bytes of the stream header");
	EXPECT_FAIL(s.p, IOC_MIG_HDR_SIZE, -EPROTO, "truncated: EOF before END, after 0 records");
	EXPECT_FAIL(s.p, IOC_MIG_HDR_SIZE + 5, -EPROTO,
		    "truncated: EOF after 5 of 32 bytes of record 1's header");
	EXPECT_FAIL(s.p, first_payload + 100, -EPROTO,
		    "truncated: EOF after 100 of 65536 bytes of record 2's payload");
	EXPECT_FAIL(s.p, s.len - IOC_MIG_REC_SIZE, -EPROTO, "truncated: EOF before END");
	EXPECT_FAIL(s.p, s.len - 1, -EPROTO, "truncated: EOF after 31 of 32 bytes");
	mt_free(&s);
	free(buf);
}

static void test_corrupted(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	size_t raw_payload = IOC_MIG_HDR_SIZE + 2 * IOC_MIG_REC_SIZE;
	size_t zstd_rec = raw_payload + 65536;

	build_passes(&s, buf);
	/* A byte of a raw payload: the record's data CRC catches it. */
	s.p[raw_payload + 777] ^= 0x10;
	EXPECT_FAIL(s.p, s.len, -EBADMSG, "record 2 (DATA_RAW) at image offset 0: data CRC mismatch");
	s.p[raw_payload + 777] ^= 0x10;
	/* A byte in the middle of a zstd frame. */
	{
		uint32_t plen = (uint32_t)s.p[zstd_rec + 20] << 24 |
				(uint32_t)s.p[zstd_rec + 21] << 16 |
				(uint32_t)s.p[zstd_rec + 22] << 8 | s.p[zstd_rec + 23];

		ASSERT_UEQ(s.p[zstd_rec + 3], IOC_MIG_DATA_ZSTD);
		s.p[zstd_rec + IOC_MIG_REC_SIZE + plen / 2] ^= 0x01;
		EXPECT_FAIL(s.p, s.len, -EBADMSG, "record 3 (DATA_ZSTD) at image offset 65536");
		s.p[zstd_rec + IOC_MIG_REC_SIZE + plen / 2] ^= 0x01;
	}
	/* A record header's byte: its own CRC. */
	s.p[zstd_rec + 10] ^= 0x01;
	EXPECT_FAIL(s.p, s.len, -EPROTO, "record 3 at stream byte 65632 (type 2, offset 1099511693312");
	EXPECT_FAIL(s.p, s.len, -EPROTO, "header CRC");
	s.p[zstd_rec + 10] ^= 0x01;
	/* The stream header's. */
	s.p[17] ^= 0x01;
	EXPECT_FAIL(s.p, s.len, -EPROTO, "header: header CRC mismatch");
	s.p[17] ^= 0x01;
	s.p[0] ^= 0x01;
	EXPECT_FAIL(s.p, s.len, -EPROTONOSUPPORT, "magic");
	mt_free(&s);
	free(buf);
}

static void test_wrong_checksum(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	uint32_t sum;

	build_passes(&s, buf);
	sum = mt_checksum(&s);
	s.len -= IOC_MIG_REC_SIZE;
	mt_end(&s, sum ^ 0x80);
	{
		char want[128];

		snprintf(want, sizeof(want), "image checksum mismatch: received image 0x%08x, "
			 "sender's 0x%08x", sum, sum ^ 0x80);
		EXPECT_FAIL(s.p, s.len, -EBADMSG, want);
	}
	mt_free(&s);
	free(buf);
}

static void test_protocol_errors(void)
{
	uint8_t buf[4 * 4096];
	struct mt_stream s;
	size_t mark;

	mt_fill(buf, sizeof(buf), 1, 0);
	/* A block never sent. */
	mt_begin(&s, 4 * 4096, 4096);
	mt_raw(&s, 0, buf, 2 * 4096);
	mt_raw(&s, 3 * 4096, buf, 4096);
	mt_end(&s, mt_checksum(&s));
	EXPECT_FAIL(s.p, s.len, -ENODATA, "block 2 (image offset 8192) was never sent");
	mt_free(&s);
	/* Passes out of order. */
	mt_begin(&s, 4 * 4096, 4096);
	mt_pass(&s, 1);
	mt_raw(&s, 0, buf, 4 * 4096);
	mt_pass(&s, 3);
	mt_end(&s, mt_checksum(&s));
	EXPECT_FAIL(s.p, s.len, -EPROTO, "pass 3 after pass 1");
	mt_free(&s);
	/* Two records of one pass on the same block. */
	mt_begin(&s, 4 * 4096, 4096);
	mt_pass(&s, 1);
	mt_raw(&s, 0, buf, 2 * 4096);
	mt_zero(&s, 4096, 3 * 4096);
	mt_end(&s, mt_checksum(&s));
	EXPECT_FAIL(s.p, s.len, -EPROTO,
		    "record 3 (ZERO) at image offset 4096: block 1 already written in this pass");
	mt_free(&s);
	/* An ACK from the sender. */
	mt_begin(&s, 4 * 4096, 4096);
	mt_rec(&s, IOC_MIG_ACK, 0, 0, 0, 0);
	EXPECT_FAIL(s.p, s.len, -EPROTO, "record 1 at stream byte 32: ACK from the sender");
	mt_free(&s);
	/* Records the decoder rejects, with their fields in the reason. */
	mt_begin(&s, 4 * 4096, 4096);
	mark = s.len;
	mt_rec(&s, IOC_MIG_DATA_RAW, 4 * 4096, 4096, 4096, 0);
	EXPECT_FAIL(s.p, s.len, -EPROTO, "offset 16384, length 4096, payload_len 4096): "
		    "record: offset outside the image");
	s.len = mark;
	mt_rec(&s, IOC_MIG_DATA_RAW, 100, 4096, 4096, 0);
	EXPECT_FAIL(s.p, s.len, -EPROTO, "not block-aligned");
	s.len = mark;
	mt_rec(&s, IOC_MIG_END, 4096, 0, 0, 0);
	EXPECT_FAIL(s.p, s.len, -EPROTO, "END offset is not the image size");
	mt_free(&s);
}

static void test_cancel(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	struct result res;
	atomic_bool cancel;
	int fd;

	build_passes(&s, buf);
	/* Part of the stream, then the flag and a shutdown: wherever the
	 * receiver is (reading, between records), it gives up. */
	for (size_t cut = 0; cut < s.len; cut += s.len / 5) {
		atomic_init(&cancel, false);
		fd = open_image(0);
		receive(s.p, cut, fd, 2, &cancel, &res);
		close_image(fd);
		ASSERT_EQ(res.ret, -ECANCELED);
		ASSERT_WHY(&res, "cancelled");
	}
	/* Cancelled before it starts, with the whole stream available. */
	atomic_init(&cancel, true);
	fd = open_image(0);
	{
		struct ioc_mig_recv_opts o = { .threads = 1, .cancel = &cancel };
		struct mt_node node;
		char why[256];
		int sv[2];

		ASSERT_OK(mt_node_open(&node, fd));
		o.node = node.n;
		ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
		ASSERT_EQ(send(sv[1], s.p, 4096, 0), 4096);
		o.fd = sv[0];
		ASSERT_EQ(ioc_mig_receive(&o, NULL, why, sizeof(why)), -ECANCELED);
		ASSERT_NOT_NULL(strstr(why, "cancelled before record 1"));
		mt_node_close(&node);
		close(sv[0]);
		close(sv[1]);
	}
	close_image(fd);
	mt_free(&s);
	free(buf);
}

/* MIRROR records overlapping everything: each lands after the records
 * before it and under those after it.  Compressed 1 MiB records take the
 * workers a while, so a receiver that did not wait for the job in flight
 * under a MIRROR would have it land last, and the image would differ. */
static void build_mirrors(struct mt_stream *s, uint8_t *buf, uint64_t *nmirror)
{
	const uint32_t bs = 4096, chunk = 256 * bs;
	uint64_t n = 0;

	mt_begin(s, 8ull * chunk, bs);
	mt_pass(s, 1);
	for (uint32_t i = 0; i < 8; i++) {
		uint64_t off = (uint64_t)i * chunk;

		mt_fill(buf, chunk, 7 + i, 1);
		if (i == 5) {
			/* A MIRROR before the pass's record of the same blocks. */
			mt_fill(buf, bs, 500, 0);
			mt_mirror(s, off + 9 * bs, buf, bs);
			n++;
			mt_fill(buf, chunk, 7 + i, 1);
		}
		mt_zstd(s, off, buf, chunk);
		for (uint32_t k = 0; k < 3; k++) {
			mt_fill(buf, 2 * bs, 1000 + i * 3 + k, 0);
			mt_mirror(s, off + (k * 61 % 250) * bs, buf, 2 * bs);
			n++;
		}
	}
	mt_pass(s, 2);
	mt_fill(buf, chunk, 99, 0);
	mt_raw(s, 2ull * chunk, buf, chunk);
	mt_mirror(s, 2ull * chunk + 5 * bs, buf + 77, bs);
	mt_mirror(s, 2ull * chunk + 5 * bs, buf + 99, 3 * bs);
	n += 2;
	mt_end(s, mt_checksum(s));
	*nmirror = n;
}

static void test_mirror_order(void)
{
	uint8_t *buf = malloc(1 << 20);
	struct mt_stream s;
	uint64_t n;

	build_mirrors(&s, buf, &n);
	for (unsigned threads = 1; threads <= 4; threads *= 2) {
		struct result res;
		int fd = open_image(4096);

		receive(s.p, s.len, fd, threads, NULL, &res);
		ASSERT_OK(res.ret);
		ASSERT_TRUE(res.have_ack);
		ASSERT_UEQ(res.ack.offset, 0);
		ASSERT_UEQ(res.macks, n);
		ASSERT_UEQ(res.last_mack, n);
		check_image(fd, &s);
		close_image(fd);
	}
	mt_free(&s);
	free(buf);
}

static void test_mirror_errors(void)
{
	uint8_t buf[8192];
	struct mt_stream s;
	struct result res;
	int fd;

	/* A corrupted MIRROR payload: no MACK for it, EBADMSG. */
	mt_fill(buf, sizeof(buf), 3, 0);
	mt_begin(&s, 4 * 4096, 4096);
	mt_pass(&s, 1);
	mt_raw(&s, 0, buf, 8192);
	mt_mirror(&s, 4096, buf, 4096);
	s.p[s.len - 10] ^= 1;
	mt_raw(&s, 8192, buf, 8192);
	mt_end(&s, mt_checksum(&s));
	fd = open_image(0);
	receive(s.p, s.len, fd, 2, NULL, &res);
	ASSERT_EQ(res.ret, -EBADMSG);
	ASSERT_WHY(&res, "MIRROR");
	ASSERT_UEQ(res.macks, 0);
	close_image(fd);
	mt_free(&s);
	/* payload_len != length: a protocol error. */
	mt_begin(&s, 4 * 4096, 4096);
	mt_pass(&s, 1);
	mt_rec(&s, IOC_MIG_MIRROR, 0, 4096, 100, 0);
	mt_put(&s, buf, 100);
	fd = open_image(0);
	receive(s.p, s.len, fd, 2, NULL, &res);
	ASSERT_EQ(res.ret, -EPROTO);
	close_image(fd);
	mt_free(&s);
}

IOC_TEST_MAIN(
	IOC_TEST(test_receive_passes),
	IOC_TEST(test_receive_large),
	IOC_TEST(test_raw_write_error),
	IOC_TEST(test_truncated),
	IOC_TEST(test_corrupted),
	IOC_TEST(test_wrong_checksum),
	IOC_TEST(test_protocol_errors),
	IOC_TEST(test_cancel),
	IOC_TEST(test_mirror_order),
	IOC_TEST(test_mirror_errors),
)
