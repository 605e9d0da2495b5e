/*
 * Fuzz target for the migration stream (src/migrate): the input is
 * everything a sender writes.  It goes two ways:
 *  - through the decoders directly: the header, then every 32-byte record
 *    header after it (under a stand-in header when the input's is bad),
 *    and the payload of each DATA record whose bytes are present;
 *  - through the receiver, written into a socketpair by a thread, with a
 *    memfd (a tmpfs file) as the image and one or two workers (the last
 *    byte chooses); a stream whose header has the hand-over flag through
 *    the hand-over receiver too, which must refuse what the other takes.
 * A crash, a sanitizer report, a leak, or a failure without a reason is a
 * bug.  Memory stays bounded whatever the input claims: the decoders
 * check lengths against the header and MAX_CHUNK before anything is
 * allocated on their strength.
 *
 * Built two ways, like tests/nbd/fuzz-qmp.c: a libFuzzer target with
 * -Dfuzz=true and clang, and always an ordinary test (IOC_FUZZ_STANDALONE)
 * running valid streams (which must be accepted), their truncations,
 * byte flips, and field changes with the record's CRC fixed up (so they
 * reach the checks behind the CRC), then the checked-in corpus in
 * tests/migrate/corpus/stream/.  --write-corpus DIR writes that corpus.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mig-test-node.h"
#include "receive.h"
#include "stream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void decode_all(const uint8_t *data, size_t size)
{
	static const struct ioc_mig_hdr fallback = {
		IOC_MIG_VERSION, 0, 1 << 20, 4096,
	};
	struct ioc_mig_hdr h;
	const char *why = NULL;
	size_t off = IOC_MIG_HDR_SIZE;

	if (size < IOC_MIG_HDR_SIZE)
		return;
	if (ioc_mig_hdr_decode(data, &h, &why) < 0) {
		if (!why)
			abort();
		h = fallback;
	}
	while (size - off >= IOC_MIG_REC_SIZE) {
		struct ioc_mig_rec r;
		void *out;

		why = NULL;
		if (ioc_mig_rec_decode(data + off, &h, &r, &why) < 0) {
			if (!why)
				abort();
			off += IOC_MIG_REC_SIZE;
			continue;
		}
		off += IOC_MIG_REC_SIZE;
		if (r.type != IOC_MIG_DATA_RAW && r.type != IOC_MIG_DATA_ZSTD &&
		    r.type != IOC_MIG_MIRROR)
			continue;
		if (r.payload_len > size - off)
			break;
		/* length <= MAX_CHUNK: the decoder checked it. */
		out = malloc(r.length);
		if (!out)
			abort();
		why = NULL;
		if (ioc_mig_payload_decode(&r, data + off, out, &why) < 0 && !why)
			abort();
		free(out);
		off += r.payload_len;
	}
}

struct feed {
	int fd;
	const uint8_t *p;
	size_t len;
};

static void *feeder(void *arg)
{
	struct feed *f = arg;
	size_t off = 0;

	while (off < f->len) {
		ssize_t n = send(f->fd, f->p + off, f->len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the receiver gave up and closed its end */
		off += (size_t)n;
	}
	shutdown(f->fd, SHUT_WR);
	return NULL;
}

/* The receiver over the input; returns its result, its reason in why. */
static int receive_all(const uint8_t *data, size_t size, char *why, size_t whylen)
{
	struct ioc_mig_recv_stats st;
	struct ioc_mig_recv_opts o = { .threads = size && data[size - 1] & 1 ? 2 : 1 };
	struct feed f = { .p = data, .len = size };
	pthread_t t;
	int sv[2], ret;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	o.fd = sv[0];
	f.fd = sv[1];
	int image_fd = memfd_create("fuzz-migrate-image", MFD_CLOEXEC);
	struct mt_node node;

	if (image_fd < 0 || mt_node_open(&node, image_fd) < 0 ||
	    pthread_create(&t, NULL, feeder, &f) != 0)
		abort();
	o.node = node.n;
	why[0] = '\0';
	if (size >= IOC_MIG_HDR_SIZE && data[15] & IOC_MIG_F_HANDOVER) {
		char id[IOC_MIG_MAX_SHARED_ID + 1];
		uint64_t isize = 0;

		ret = ioc_mig_receive_handover(&o, id, sizeof(id), &isize, why, whylen);
		if (ret == 0 && (isize == 0 || strlen(id) == 0 || strlen(id) > IOC_MIG_MAX_SHARED_ID))
			abort();
		if (ret == 0)
			(void)ioc_mig_send_ready(&o, 0);
		st.wire_bytes = 0;
		st.image_size = isize;
		st.records = 1;
	} else {
		ret = ioc_mig_receive(&o, &st, why, whylen);
	}
	close(sv[0]);
	pthread_join(t, NULL);
	close(sv[1]);
	mt_node_close(&node);
	close(image_fd);
	/* Every failure says why; success needs a whole stream. */
	if (ret > 0 || (ret < 0 && !why[0]))
		abort();
	if (ret == 0 && (st.wire_bytes > size || st.image_size == 0 ||
			 st.records == 0))
		abort();
	return ret;
}

static int run_one(const uint8_t *data, size_t size, char *why, size_t whylen)
{
	decode_all(data, size);
	return receive_all(data, size, why, whylen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[512];

	run_one(data, size, why, sizeof(why));
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-standalone.h"
#include "mig-test-util.h"

static int run(const uint8_t *p, size_t n)
{
	/* A private copy, so a read past the end is caught on the exact
	 * allocation by ASan. */
	uint8_t *c = malloc(n ? n : 1);
	char why[512];
	int ret;

	memcpy(c, p, n);
	ret = run_one(c, n, why, sizeof(why));
	free(c);
	ioc_fuzz_runs++;
	return ret;
}

/* The valid streams: small, every record type, two passes. */
static void sample_stream(int which, struct mt_stream *s)
{
	uint8_t buf[9 * 4096];

	mt_fill(buf, sizeof(buf), (uint64_t)which, 1);
	switch (which) {
	case 0: /* 3 blocks and a short one: raw, zstd, zeros, then a pass 2 */
		mt_begin(s, 3 * 4096 + 100, 4096);
		mt_pass(s, 1);
		mt_raw(s, 0, buf, 4096);
		mt_zstd(s, 4096, buf + 4096, 4096);
		mt_zero(s, 2 * 4096, 4096 + 100);
		mt_pass(s, 2);
		mt_zstd(s, 2 * 4096, buf, 4096);
		mt_raw(s, 0, buf + 100, 4096);
		break;
	case 1: /* one short block, no PASS records */
		mt_begin(s, 1000, 65536);
		mt_raw(s, 0, buf, 1000);
		break;
	case 4: /* a hand-over: no data, the shared image's name */
		mt_handover(s, 1 << 30, "rbd:rbd//img;cluster=5e2b2c71-1111-2222-3333-444455556666");
		return;
	case 3: /* MIRROR records over a pass's records, and before them */
		mt_begin(s, 8 * 4096, 4096);
		mt_pass(s, 1);
		mt_zstd(s, 0, buf, 4 * 4096);
		mt_mirror(s, 4096, buf + 4096, 4096);
		mt_mirror(s, 5 * 4096, buf + 200, 2 * 4096);
		mt_raw(s, 4 * 4096, buf + 300, 4 * 4096);
		mt_pass(s, 2);
		mt_mirror(s, 0, buf + 400, 8 * 4096);
		break;
	default: /* holes and one compressed record spanning blocks */
		mt_begin(s, 64 * 4096, 4096);
		mt_pass(s, 1);
		mt_zero(s, 0, 32 * 4096);
		mt_zstd(s, 32 * 4096, buf, 3 * 4096);
		mt_zero(s, 35 * 4096, 29 * 4096);
		break;
	}
	mt_end(s, mt_checksum(s));
}

#define NSAMPLES 5
#define SAMPLE_HANDOVER 4

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void mutate_all(const struct mt_stream *s, uint64_t salt)
{
	size_t recs[64], nrec = 0, n = s->len;
	uint8_t *m = malloc(n);
	uint64_t x = salt | 1;

	ASSERT_OK(run(s->p, n));
	for (int i = 0; i < 9; i++)
		ASSERT_LT(run(s->p, n * (size_t)i / 9), 0);
	/* Where the records are. */
	for (size_t off = IOC_MIG_HDR_SIZE; off + IOC_MIG_REC_SIZE <= n && nrec < 64;) {
		uint32_t plen = (uint32_t)s->p[off + 20] << 24 | (uint32_t)s->p[off + 21] << 16 |
				(uint32_t)s->p[off + 22] << 8 | s->p[off + 23];

		recs[nrec++] = off;
		off += IOC_MIG_REC_SIZE + plen;
	}
	for (unsigned long i = 0; i < ioc_test_scaled(60); i++) {
		size_t pos;

		memcpy(m, s->p, n);
		if (i % 3 == 0) {
			/* Anywhere: mostly caught by a CRC. */
			pos = (size_t)(xorshift(&x) % n);
			m[pos] ^= (uint8_t)(xorshift(&x) | 1);
		} else {
			/* A field of a header, with its CRC made right. */
			size_t r = i % 3 == 1 ? 0 : recs[xorshift(&x) % nrec];
			size_t field = (size_t)(xorshift(&x) % 28);
			size_t crc_at = r + 28;

			m[r + field] ^= (uint8_t)(1u << (xorshift(&x) % 8));
			put_be32(m + crc_at, ioc_mig_crc(m + r, 28));
		}
		run(m, n);
	}
	free(m);
}

static void test_generated(void)
{
	for (int i = 0; i < NSAMPLES; i++) {
		struct mt_stream s;

		sample_stream(i, &s);
		mutate_all(&s, 1000 + (uint64_t)i);
		mt_free(&s);
	}
	/* Garbage, and headers of extreme sizes with nothing after them. */
	{
		uint8_t g[512];
		uint64_t x = 77;
		struct ioc_mig_hdr h = { IOC_MIG_VERSION, 0, IOC_MIG_MAX_BLOCKS * 4096, 4096 };

		for (int i = 0; i < 16; i++) {
			for (size_t k = 0; k < sizeof(g); k++)
				g[k] = (uint8_t)xorshift(&x);
			ASSERT_LT(run(g, (size_t)i * 31), 0);
		}
		ioc_mig_hdr_encode(&h, g);
		ASSERT_EQ(run(g, IOC_MIG_HDR_SIZE), -EPROTO);
		h.block_size = IOC_MIG_MAX_BLOCK;
		h.image_size = 1;
		ioc_mig_hdr_encode(&h, g);
		ASSERT_EQ(run(g, IOC_MIG_HDR_SIZE), -EPROTO);
	}
	ioc_test_diag("%lu inputs", ioc_fuzz_runs);
}

/* The checked-in corpus: files named valid-* must be accepted, the
 * others rejected (a directory given as the argument: run, unchecked). */
static void check_file(const char *name, const uint8_t *p, size_t n, void *opaque)
{
	int ret = run(p, n);

	(void)opaque;
	if (!ioc_fuzz_dir && strncmp(name, "valid-", 6) == 0)
		ASSERT_OK(ret);
	else if (!ioc_fuzz_dir)
		ASSERT_LT(ret, 0);
}

static void test_saved_corpus(void)
{
	ioc_fuzz_corpus("tests/migrate/corpus/stream", check_file, NULL);
}

/* The valid streams, one cut short and one with a corrupted payload. */
static void write_corpus(const char *dir)
{
	char name[64];

	for (int i = 0; i < NSAMPLES; i++) {
		struct mt_stream s;

		sample_stream(i, &s);
		if (i == SAMPLE_HANDOVER)
			snprintf(name, sizeof(name), "valid-handover.bin");
		else
			snprintf(name, sizeof(name), "valid-%d.bin", i);
		ioc_fuzz_write(dir, name, s.p, s.len);
		if (i == SAMPLE_HANDOVER) {
			/* The same record in a copy stream: refused. */
			s.p[15] = 0;
			s.p[28] = s.p[29] = s.p[30] = s.p[31] = 0;
			{
				uint32_t c = ioc_mig_crc(s.p, 28);

				put_be32(s.p + 28, c);
			}
			ioc_fuzz_write(dir, "handover-in-copy-stream.bin", s.p, s.len);
		}
		if (i == 0) {
			ioc_fuzz_write(dir, "truncated.bin", s.p, s.len - 40);
			s.p[IOC_MIG_HDR_SIZE + 2 * IOC_MIG_REC_SIZE + 9] ^= 1;
			ioc_fuzz_write(dir, "bad-data-crc.bin", s.p, s.len);
		}
		mt_free(&s);
	}
}

IOC_FUZZ_MAIN(write_corpus, IOC_TEST(test_generated), IOC_TEST(test_saved_corpus))
#endif
