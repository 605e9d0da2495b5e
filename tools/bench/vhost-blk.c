/*
 * iocore-bench vhost-blk: a vhost-user-blk front-end as a benchmark and a
 * test driver, without a guest.
 *
 * Problem: measuring a vhost-user-blk back-end, or checking how it handles
 * bad input, otherwise needs a VM whose kernel adds its own cost and only
 * ever sends well-formed requests.
 *
 * Design: vhost-frontend.c does the handshake and the rings; this file is
 * the request loop of qemu-img bench (count requests, depth in flight,
 * one size) with fio's access patterns (read, write, randread, randwrite,
 * a read/write mix), run on one thread per ring: --queues Q rings on each
 * of --devices N connections make N x Q threads, each with its own slots,
 * sharing nothing until the results are summed.  Latency goes into a
 * log-linear histogram per thread (about 3% resolution, no allocation per
 * request).  Three other modes share that loop's parts: --verify writes a
 * pattern and reads it back, --op sends one request of any type, --bad
 * sends one deliberately malformed request and reports what the back-end
 * answered (a status byte, the connection closed, or nothing before the
 * timeout) and whether it still serves a good request afterwards.
 * --busy-rings K loads only the first K rings and leaves the others
 * started and idle, and --idle S starts every ring and sends nothing for
 * S seconds: what idle devices cost a back-end, and the busy one.
 *
 * Rejected: one thread polling every ring (a 2-queue run would then be
 * bound by one core and measure this tool); an array of every latency
 * (8 bytes a request, and a sort at the end); a guest kernel's virtio-blk
 * driver over a real VM (the thing this replaces).
 *
 * Every wait is bounded by --timeout, so a back-end that drops a request
 * fails the run instead of hanging it.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nofile.h"
#include "parse-size.h"
#include "vhost-blk.h"
#include "vhost-frontend.h"

#define MAX_DEVICES 128

enum rw { RW_READ, RW_WRITE, RW_RANDREAD, RW_RANDWRITE, RW_MIX };
static const char *const rw_names[] = { "read", "write", "randread", "randwrite", "mix" };

/* What became of one request. */
enum outcome {
	OUT_OK, OUT_IOERR, OUT_UNSUPP, OUT_INVALID, OUT_UNTOUCHED, OUT_CLOSED, OUT_TIMEOUT,
	OUT_N
};
static const char *const outcome_names[OUT_N] = {
	"ok", "ioerr", "unsupp", "invalid", "untouched", "closed", "timeout",
};

struct hist {
	uint64_t b[64 + 40 * 32];
	uint64_t n, max;
};

static unsigned hist_bucket(uint64_t v)
{
	unsigned e;

	if (v < 64)
		return (unsigned)v;
	e = 63u - (unsigned)__builtin_clzll(v);
	if (e > 45)
		return sizeof(((struct hist *)0)->b) / sizeof(uint64_t) - 1;
	return 64 + (e - 6) * 32 + (unsigned)((v >> (e - 5)) & 31);
}

static uint64_t hist_value(unsigned i)
{
	unsigned e;

	if (i < 64)
		return i;
	e = (i - 64) / 32 + 6;
	return (1ull << e) + ((uint64_t)((i - 64) % 32) << (e - 5)) + (1ull << (e - 6));
}

static void hist_add(struct hist *h, uint64_t v)
{
	h->b[hist_bucket(v)]++;
	h->n++;
	if (v > h->max)
		h->max = v;
}

static uint64_t hist_pct(const struct hist *h, double pct)
{
	uint64_t want = (uint64_t)((double)h->n * pct / 100.0 + 0.5), seen = 0;

	if (!h->n)
		return 0;
	if (want < 1)
		want = 1;
	for (unsigned i = 0; i < sizeof(h->b) / sizeof(h->b[0]); i++) {
		seen += h->b[i];
		if (seen >= want)
			return hist_value(i) < h->max ? hist_value(i) : h->max;
	}
	return h->max;
}

struct cfg {
	const char *sockets[MAX_DEVICES];
	unsigned nsockets, devices, queues, queue_size;
	unsigned busy_rings;      /* 0: every ring carries load */
	unsigned idle_s;          /* --idle: start the rings, wait, stop */
	uint64_t count, depth, size, offset, range, length, seed;
	enum rw rw;
	unsigned mix_read;
	bool verify, json, poll, indirect, quiet, unmap, info;
	const char *op, *bad, *input, *output;
	int pattern;
	unsigned expect;          /* bitmask of enum outcome */
	bool expect_set;
	int timeout_ms;
	struct ioc_vhf_opts vo;
};

struct worker {
	const struct cfg *c;
	struct ioc_vhf_dev *dev;
	struct ioc_vhf_vq *vq;
	unsigned devno, qno, index, nworkers;
	struct ioc_vhf_blk_slot *slots;
	unsigned nslots, *free, nfree, inflight;
	uint64_t count, issued, done;
	uint64_t part_start, part_len, seq_at;  /* this worker's share */
	uint64_t rng;
	int phase;                /* --verify: 0 writing, 1 reading */
	uint64_t vnext;           /* --verify: next block of this worker */
	uint64_t out[OUT_N];
	uint64_t bytes, mismatches, bad_used, first_bad_off;
	uint64_t len_wrong;       /* OK, but a used len other than written bytes */
	bool any_mismatch;
	struct hist lat;
	int64_t t0, t_end;
	int err;
	pthread_t tid;
	pthread_barrier_t *bar;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* The --verify pattern: each 8-byte word holds its own byte offset on the
 * disk, mixed with the seed, so a block at the wrong place shows. */
static uint64_t pattern_word(uint64_t off, uint64_t seed)
{
	return off ^ (seed * 0x9e3779b97f4a7c15ull) ^ 0x5a5a0000a5a50000ull;
}

static void fill_pattern(uint8_t *p, uint64_t len, uint64_t off, uint64_t seed)
{
	for (uint64_t i = 0; i + 8 <= len; i += 8) {
		uint64_t v = htole64(pattern_word(off + i, seed));

		memcpy(p + i, &v, 8);
	}
}

/* Returns the byte offset of the first difference, or UINT64_MAX. */
static uint64_t check_pattern(const uint8_t *p, uint64_t len, uint64_t off, uint64_t seed)
{
	for (uint64_t i = 0; i + 8 <= len; i += 8) {
		uint64_t v;

		memcpy(&v, p + i, 8);
		if (le64toh(v) != pattern_word(off + i, seed))
			return off + i;
	}
	return UINT64_MAX;
}

static enum outcome status_outcome(uint8_t st)
{
	switch (st) {
	case VIRTIO_BLK_S_OK: return OUT_OK;
	case VIRTIO_BLK_S_IOERR: return OUT_IOERR;
	case VIRTIO_BLK_S_UNSUPP: return OUT_UNSUPP;
	case 0xff: return OUT_UNTOUCHED;
	default: return OUT_INVALID;
	}
}

/* The next request of a benchmark or --verify worker. */
static void next_req(struct worker *w, uint32_t *type, uint64_t *off)
{
	const struct cfg *c = w->c;
	uint64_t blocks = w->part_len / c->size;
	bool read;

	if (c->verify) {
		*type = w->phase ? VIRTIO_BLK_T_IN : VIRTIO_BLK_T_OUT;
		*off = c->offset + (w->index + w->vnext * w->nworkers) * c->size;
		w->vnext++;
		return;
	}
	switch (c->rw) {
	case RW_READ:
	case RW_WRITE:
		*off = w->part_start + w->seq_at;
		w->seq_at += c->size;
		if (w->seq_at + c->size > w->part_len)
			w->seq_at = 0;
		*type = c->rw == RW_READ ? VIRTIO_BLK_T_IN : VIRTIO_BLK_T_OUT;
		return;
	default:
		*off = w->part_start + (xorshift(&w->rng) % blocks) * c->size;
		read = c->rw == RW_RANDREAD ||
		       (c->rw == RW_MIX && xorshift(&w->rng) % 100 < c->mix_read);
		*type = read ? VIRTIO_BLK_T_IN : VIRTIO_BLK_T_OUT;
		return;
	}
}

static void complete(struct worker *w, uint32_t id, uint32_t len, int64_t t)
{
	const struct cfg *c = w->c;
	int slot = ioc_vhf_blk_slot_of(w->slots, w->nslots, id);
	struct ioc_vhf_blk_slot *s;
	enum outcome o;

	if (slot < 0 || w->slots[slot].t_submit == 0) {
		/* Not a request of ours in flight: the back-end is wrong. */
		w->bad_used++;
		return;
	}
	s = &w->slots[slot];
	hist_add(&w->lat, (uint64_t)(t - s->t_submit));
	o = status_outcome(*s->status);
	w->out[o]++;
	if (o == OUT_OK) {
		w->bytes += c->size;
		/* The device should report what it wrote: the data of a
		 * read and the status byte. */
		if (len != (s->type == VIRTIO_BLK_T_IN ? c->size : 0) + 1)
			w->len_wrong++;
	}
	if (c->verify && s->type == VIRTIO_BLK_T_IN && o == OUT_OK) {
		uint64_t off = le64toh(s->hdr->sector) * 512;
		uint64_t bad = check_pattern(s->data, c->size, off, c->seed);

		if (bad != UINT64_MAX) {
			if (!w->mismatches)
				w->first_bad_off = bad;
			w->mismatches++;
		}
	}
	s->t_submit = 0;
	w->free[w->nfree++] = (unsigned)slot;
	w->inflight--;
	w->done++;
}

/* One phase: count requests, depth in flight. */
static int run_phase(struct worker *w, uint64_t count)
{
	const struct cfg *c = w->c;
	uint64_t issued = 0, done0 = w->done;

	while (w->done - done0 < count) {
		uint32_t id, len;
		int64_t t;
		int ret;

		while (issued < count && w->nfree) {
			unsigned slot = w->free[--w->nfree];
			struct ioc_vhf_blk_slot *s = &w->slots[slot];
			uint32_t type;
			uint64_t off;

			next_req(w, &type, &off);
			if (c->verify && type == VIRTIO_BLK_T_OUT)
				fill_pattern(s->data, c->size, off, c->seed);
			s->t_submit = now_ns();
			ioc_vhf_blk_submit(w->vq, s, type, off / 512, c->size, 0, 0);
			w->inflight++;
			issued++;
		}
		ioc_vhf_vq_kick(w->vq);
		if (!ioc_vhf_vq_pop_used(w->vq, &id, &len)) {
			ret = ioc_vhf_vq_wait(w->vq, c->poll, c->timeout_ms);
			if (ret < 0) {
				w->out[ret == -EPIPE ? OUT_CLOSED : OUT_TIMEOUT] += w->inflight;
				fprintf(stderr, "vhost-blk: %s queue %u: %s with %u requests in "
					"flight\n", c->sockets[w->devno], w->qno,
					ret == -EPIPE ? "the back-end closed the connection" :
					"no completion before the timeout", w->inflight);
				return ret;
			}
			continue;
		}
		t = now_ns();
		do
			complete(w, id, len, t);
		while (ioc_vhf_vq_pop_used(w->vq, &id, &len));
		if (w->bad_used) {
			fprintf(stderr, "vhost-blk: %s queue %u: the back-end returned a used "
				"id that is not a request in flight\n", c->sockets[w->devno],
				w->qno);
			return -EPROTO;
		}
	}
	return 0;
}

static void *worker_main(void *opaque)
{
	struct worker *w = opaque;

	pthread_barrier_wait(w->bar);
	w->t0 = now_ns();
	if (w->c->poll)
		ioc_vhf_vq_no_interrupts(w->vq);
	w->err = run_phase(w, w->count);
	if (!w->err && w->c->verify) {
		w->phase = 1;
		w->vnext = 0;
		w->err = run_phase(w, w->count);
	}
	w->t_end = now_ns();
	return NULL;
}

static int parse_expect(const char *s, unsigned *mask)
{
	char buf[256], *save = NULL;

	*mask = 0;
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		unsigned i;

		if (!strcmp(t, "any")) {
			*mask = (1u << OUT_N) - 1;
			continue;
		}
		for (i = 0; i < OUT_N && strcmp(t, outcome_names[i]); i++)
			;
		if (i == OUT_N)
			return -EINVAL;
		*mask |= 1u << i;
	}
	return *mask ? 0 : -EINVAL;
}

static const char *expect_str(unsigned mask, char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = 0;
	for (unsigned i = 0; i < OUT_N; i++)
		if (mask & (1u << i))
			at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%s",
					       at ? "," : "", outcome_names[i]);
	return buf;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: iocore-bench vhost-blk --socket PATH [--socket PATH...] [options]\n"
		"  drive vhost-user-blk back-ends as a guest's virtio-blk driver would\n"
		"  --socket PATH       a back-end's socket; repeat for several devices\n"
		"  --devices N         use N devices (a PATH with %%d is numbered 0..N-1)\n"
		"  --queues Q          rings per device, one thread each (default 1)\n"
		"  --queue-size N      descriptors per ring (default: enough for --depth)\n"
		"  --count N           requests in all (default 75000)\n"
		"  --depth D           requests in flight on each ring (default 64)\n"
		"  --size BYTES        request size (default 4k)\n"
		"  --rw MODE           read|write|randread|randwrite|mix (default read)\n"
		"  --mix-read PCT      reads in %% of --rw mix (default 70)\n"
		"  --offset BYTES      start of the area used (default 0)\n"
		"  --range BYTES       its length (default: to the end of the device)\n"
		"  --verify            write a pattern to --count blocks, read it back, check\n"
		"  --seed N            the --verify pattern's seed (default 1)\n"
		"  --poll              spin on the used ring instead of waiting for calls\n"
		"  --indirect          one indirect descriptor table per request\n"
		"  --no-event-idx      do not negotiate VIRTIO_RING_F_EVENT_IDX\n"
		"  --no-inflight       do not negotiate INFLIGHT_SHMFD\n"
		"  --op OP             one request: read|write|flush|get-id|discard|write-zeroes\n"
		"  --length BYTES      its length (default --size)\n"
		"  --unmap             write-zeroes with VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP\n"
		"  --input FILE        the data of --op write (default: --pattern)\n"
		"  --output FILE       where --op read puts the data\n"
		"  --pattern BYTE      the byte --op write writes (default: the --verify pattern)\n"
		"  --bad KIND          one malformed request: desc-oob, desc-loop, short-header,\n"
		"                      status-size, no-status, past-end, straddle-end, write-ro,\n"
		"                      bad-type, head-oob, avail-jump, len-wrap\n"
		"  --expect-status L   outcomes that count as success, comma-separated: ok,\n"
		"                      ioerr, unsupp, invalid, untouched, closed, timeout, any\n"
		"                      (default ok; with --bad: ioerr,unsupp,closed)\n"
		"  --timeout MS        bound on every wait (default 30000; 3000 with --bad)\n"
		"  --busy-rings K      load only the first K rings (device by device), start\n"
		"                      the others and leave them idle\n"
		"  --idle SECONDS      start every ring, send nothing for SECONDS, stop\n"
		"  --info              print the negotiated features and the config, and exit\n"
		"  --json              one JSON object on stdout\n"
		"  --verbose           log the vhost-user messages to stderr\n"
		"  -q, --quiet         no line announcing the run\n");
}

static void print_info(const struct cfg *c, struct ioc_vhf_dev *d, FILE *f)
{
	const struct virtio_blk_config *k = &d->cfg;

	if (c->json) {
		fprintf(f, "\"capacity\":%" PRIu64 ",\"blk_size\":%u,\"num_queues\":%u,"
			"\"max_queues\":%u,\"features\":\"0x%" PRIx64 "\",\"acked\":\"0x%"
			PRIx64 "\",\"protocol_features\":\"0x%" PRIx64 "\","
			"\"protocol_acked\":\"0x%" PRIx64 "\",\"size_max\":%u,\"seg_max\":%u,"
			"\"max_discard_sectors\":%u,\"max_discard_seg\":%u,"
			"\"discard_sector_alignment\":%u,\"max_write_zeroes_sectors\":%u,"
			"\"max_write_zeroes_seg\":%u,\"write_zeroes_may_unmap\":%u,"
			"\"read_only\":%s,\"wce\":%u",
			ioc_vhf_blk_capacity(d), ioc_vhf_blk_size(d),
			ioc_vhf_has(d, VIRTIO_BLK_F_MQ) ? ioc_vhf_blk_cfg16(d, &k->num_queues) : 1,
			d->max_queues, d->features, d->acked, d->pfeatures, d->packed,
			ioc_vhf_has(d, VIRTIO_BLK_F_SIZE_MAX) ?
				ioc_vhf_blk_cfg32(d, &k->size_max) : 0,
			ioc_vhf_blk_cfg32(d, &k->seg_max),
			ioc_vhf_blk_cfg32(d, &k->max_discard_sectors),
			ioc_vhf_blk_cfg32(d, &k->max_discard_seg),
			ioc_vhf_blk_cfg32(d, &k->discard_sector_alignment),
			ioc_vhf_blk_cfg32(d, &k->max_write_zeroes_sectors),
			ioc_vhf_blk_cfg32(d, &k->max_write_zeroes_seg), k->write_zeroes_may_unmap,
			ioc_vhf_has(d, VIRTIO_BLK_F_RO) ? "true" : "false", k->wce);
		return;
	}
	fprintf(f, "%s: capacity %" PRIu64 " bytes, block size %u, %u queue(s) of %u, "
		"features 0x%" PRIx64 " (accepted 0x%" PRIx64 "), protocol 0x%" PRIx64
		" (accepted 0x%" PRIx64 ")\n", d->socket, ioc_vhf_blk_capacity(d),
		ioc_vhf_blk_size(d),
		ioc_vhf_has(d, VIRTIO_BLK_F_MQ) ? ioc_vhf_blk_cfg16(d, &k->num_queues) : 1,
		d->max_queues, d->features, d->acked, d->pfeatures, d->packed);
	fprintf(f, "  %s%s%s%s%s%s%s, size_max %u, seg_max %u, discard max %u sectors x %u seg "
		"(align %u), write-zeroes max %u sectors x %u seg%s\n",
		ioc_vhf_has(d, VIRTIO_BLK_F_RO) ? "read-only" : "writable",
		ioc_vhf_has(d, VIRTIO_BLK_F_FLUSH) ? ", flush" : "",
		ioc_vhf_has(d, VIRTIO_BLK_F_DISCARD) ? ", discard" : "",
		ioc_vhf_has(d, VIRTIO_BLK_F_WRITE_ZEROES) ? ", write-zeroes" : "",
		ioc_vhf_has(d, VIRTIO_RING_F_EVENT_IDX) ? ", event-idx" : "",
		ioc_vhf_has(d, VIRTIO_RING_F_INDIRECT_DESC) ? ", indirect" : "",
		(d->packed & (1ull << IOC_VHF_PF_INFLIGHT_SHMFD)) ? ", inflight" : "",
		ioc_vhf_has(d, VIRTIO_BLK_F_SIZE_MAX) ? ioc_vhf_blk_cfg32(d, &k->size_max) : 0,
		ioc_vhf_blk_cfg32(d, &k->seg_max), ioc_vhf_blk_cfg32(d, &k->max_discard_sectors),
		ioc_vhf_blk_cfg32(d, &k->max_discard_seg),
		ioc_vhf_blk_cfg32(d, &k->discard_sector_alignment),
		ioc_vhf_blk_cfg32(d, &k->max_write_zeroes_sectors),
		ioc_vhf_blk_cfg32(d, &k->max_write_zeroes_seg),
		k->write_zeroes_may_unmap ? ", may unmap" : "");
}

/* --- one request: --op and --bad --- */

struct one {
	enum outcome o;
	uint8_t status;
	uint32_t used_len;
	bool probed, serving;
};

/* Wait for the one request at s; fills r. */
static void wait_one(const struct cfg *c, struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *s,
		     struct one *r)
{
	uint32_t id, len;
	int ret;

	ioc_vhf_vq_kick(vq);
	for (;;) {
		if (ioc_vhf_vq_pop_used(vq, &id, &len)) {
			if (id != s->head) {
				fprintf(stderr, "vhost-blk: used id %u, expected %u\n", id,
					s->head);
				r->o = OUT_INVALID;
				return;
			}
			r->status = *s->status;
			r->used_len = len;
			r->o = status_outcome(r->status);
			return;
		}
		ret = ioc_vhf_vq_wait(vq, c->poll, c->timeout_ms);
		if (ret < 0) {
			r->o = ret == -EPIPE ? OUT_CLOSED : OUT_TIMEOUT;
			return;
		}
	}
}

static int op_type(const char *op, uint32_t *type)
{
	static const struct { const char *name; uint32_t type; } ops[] = {
		{ "read", VIRTIO_BLK_T_IN }, { "write", VIRTIO_BLK_T_OUT },
		{ "flush", VIRTIO_BLK_T_FLUSH }, { "get-id", VIRTIO_BLK_T_GET_ID },
		{ "discard", VIRTIO_BLK_T_DISCARD },
		{ "write-zeroes", VIRTIO_BLK_T_WRITE_ZEROES },
	};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		if (!strcmp(op, ops[i].name)) {
			*type = ops[i].type;
			return 0;
		}
	}
	return -EINVAL;
}

static int read_file_into(const char *path, uint8_t *buf, uint64_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;
	uint64_t got = 0;

	if (fd < 0)
		return -errno;
	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -ENODATA;
			break;
		}
		got += (uint64_t)n;
	}
	close(fd);
	return ret;
}

static int write_file_from(const char *path, const uint8_t *buf, uint64_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), ret = 0;
	uint64_t put = 0;

	if (fd < 0)
		return -errno;
	while (put < len) {
		ssize_t n = write(fd, buf + put, len - put);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			break;
		}
		put += (uint64_t)n;
	}
	if (close(fd) < 0 && !ret)
		ret = -errno;
	return ret;
}

/* The malformed requests of --bad. */
enum bad_kind {
	BAD_DESC_OOB, BAD_LEN_WRAP, BAD_DESC_LOOP, BAD_SHORT_HEADER, BAD_STATUS_SIZE,
	BAD_NO_STATUS, BAD_PAST_END, BAD_STRADDLE_END, BAD_WRITE_RO, BAD_BAD_TYPE,
	BAD_HEAD_OOB, BAD_AVAIL_JUMP, BAD_N
};

static const struct bad_desc {
	const char *name, *what;
	bool corrupts_ring;      /* no good request can follow it */
} bad_kinds[BAD_N] = {
	[BAD_DESC_OOB] = { "desc-oob", "a data buffer outside the memory table" },
	[BAD_LEN_WRAP] = { "len-wrap", "a data buffer wrapping around the address space" },
	[BAD_DESC_LOOP] = { "desc-loop", "a chain looping back to its head" },
	[BAD_SHORT_HEADER] = { "short-header", "an 8-byte request header" },
	[BAD_STATUS_SIZE] = { "status-size", "a status buffer of 0 bytes" },
	[BAD_NO_STATUS] = { "no-status", "no device-writable buffer" },
	[BAD_PAST_END] = { "past-end", "a read starting at the capacity" },
	[BAD_STRADDLE_END] = { "straddle-end", "a read crossing the capacity" },
	[BAD_WRITE_RO] = { "write-ro", "a write (for a read-only device)" },
	[BAD_BAD_TYPE] = { "bad-type", "an unknown request type" },
	[BAD_HEAD_OOB] = { "head-oob", "an avail entry naming no descriptor", true },
	[BAD_AVAIL_JUMP] = { "avail-jump", "avail->idx moved by more than the ring", true },
};

static int bad_lookup(const char *name)
{
	for (int i = 0; i < BAD_N; i++)
		if (!strcmp(name, bad_kinds[i].name))
			return i;
	return -EINVAL;
}

static void set_desc(struct vring_desc *t, uint64_t addr, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	t->addr = htole64(addr);
	t->len = htole32(len);
	t->flags = htole16(flags);
	t->next = htole16(next);
}

/* Build the malformed request kind in s (direct descriptors head..head+2)
 * and publish it. */
static void build_bad(enum bad_kind kind, struct ioc_vhf_dev *d, struct ioc_vhf_vq *vq,
		      struct ioc_vhf_blk_slot *s, uint64_t len)
{
	struct vring_desc *t = &vq->desc[s->head];
	uint64_t hdr = ioc_vhf_vq_gpa(vq, s->hdr), data = ioc_vhf_vq_gpa(vq, s->data);
	uint64_t st = ioc_vhf_vq_gpa(vq, s->status);
	uint64_t cap_sectors = ioc_vhf_blk_capacity(d) / 512;
	uint16_t h = s->head, next = VRING_DESC_F_NEXT, wr = VRING_DESC_F_WRITE;
	uint32_t l = (uint32_t)len, type = VIRTIO_BLK_T_IN;
	uint64_t sector = 0;

	set_desc(&t[0], hdr, 16, next, h + 1);
	set_desc(&t[1], data, l, next | wr, h + 2);
	set_desc(&t[2], st, 1, wr, 0);
	switch (kind) {
	case BAD_DESC_OOB:
		set_desc(&t[1], IOC_VHF_GUEST_BASE + d->mem_size + 4096, l, next | wr, h + 2);
		break;
	case BAD_LEN_WRAP:
		set_desc(&t[1], UINT64_MAX - 511, l, next | wr, h + 2);
		break;
	case BAD_DESC_LOOP: /* header -> data -> header -> ... */
		set_desc(&t[1], data, l, next | wr, h);
		break;
	case BAD_SHORT_HEADER:
		set_desc(&t[0], hdr, 8, next, h + 1);
		break;
	case BAD_STATUS_SIZE:
		set_desc(&t[2], st, 0, wr, 0);
		break;
	case BAD_NO_STATUS: /* a write: header and data, nothing writable */
		type = VIRTIO_BLK_T_OUT;
		set_desc(&t[1], data, l, 0, 0);
		break;
	case BAD_PAST_END:
		sector = cap_sectors;
		break;
	case BAD_STRADDLE_END:
		sector = cap_sectors ? cap_sectors - 1 : 0;
		break;
	case BAD_WRITE_RO:
		type = VIRTIO_BLK_T_OUT;
		set_desc(&t[1], data, l, next, h + 2);
		break;
	case BAD_BAD_TYPE:
		type = 0x7777;
		break;
	case BAD_HEAD_OOB:
		ioc_vhf_vq_publish(vq, (uint16_t)vq->num);
		return;
	case BAD_AVAIL_JUMP:
		vq->avail->ring[vq->avail_idx & (vq->num - 1)] = htole16(h);
		vq->avail_idx = (uint16_t)(vq->avail_idx + vq->num + 1);
		/* Pairs with the back-end's acquire load of avail->idx. */
		__atomic_store_n(&vq->avail->idx, htole16(vq->avail_idx), __ATOMIC_RELEASE);
		return;
	case BAD_N:
		return;
	}
	s->type = type;
	s->hdr->type = htole32(type);
	s->hdr->ioprio = 0;
	s->hdr->sector = htole64(sector);
	*s->status = 0xff;
	ioc_vhf_vq_publish(vq, h);
}

static void print_one(const struct cfg *c, struct ioc_vhf_dev *d, const char *what,
		      const char *about, uint64_t off, uint64_t len, const struct one *r,
		      const char *id)
{
	if (c->json) {
		printf("{\"tool\":\"iocore-bench\",\"cmd\":\"vhost-blk\",\"%s\":\"%s\","
		       "\"offset\":%" PRIu64 ",\"length\":%" PRIu64 ",\"outcome\":\"%s\","
		       "\"status\":%d,\"used_len\":%u",
		       c->bad ? "bad" : "op", what, off, len, outcome_names[r->o],
		       r->o <= OUT_UNTOUCHED ? r->status : -1, r->used_len);
		if (id)
			printf(",\"id\":\"%s\"", id);
		if (about)
			printf(",\"about\":\"%s\"", about);
		if (r->probed)
			printf(",\"still_serving\":%s", r->serving ? "true" : "false");
		printf(",");
		print_info(c, d, stdout);
		printf("}\n");
		return;
	}
	if (about)
		printf("bad %s (%s), length %" PRIu64 ": ", what, about, len);
	else
		printf("op %s offset %" PRIu64 " length %" PRIu64 ": ", what, off, len);
	if (r->o <= OUT_UNTOUCHED)
		printf("status %u (%s)%s, used len %u", r->status, outcome_names[r->o],
		       r->o == OUT_UNTOUCHED ? ": used, but the status byte was not written" : "",
		       r->used_len);
	else if (r->o == OUT_CLOSED)
		printf("the back-end closed the connection");
	else
		printf("no completion within %d ms", c->timeout_ms);
	if (id)
		printf(", id \"%s\"", id);
	if (r->probed)
		printf("; a good read afterwards: %s", r->serving ? "served" : "not served");
	printf("\n");
}

/* The data buffer --op and --bad need: the request's length for reads,
 * writes and the malformed requests, a page for the others. */
static uint64_t one_data_cap(const struct cfg *c)
{
	uint64_t len = c->length ? c->length : c->size;

	if (c->bad || !c->op || !strcmp(c->op, "read") || !strcmp(c->op, "write"))
		return len;
	return 4096;
}

static int run_one(const struct cfg *c, struct ioc_vhf_dev *d)
{
	struct ioc_vhf_vq *vq = &d->vq[0];
	struct ioc_vhf_blk_slot s[2];
	uint64_t len = c->length ? c->length : c->size, off = c->offset;
	struct one r = { 0 };
	char id[VIRTIO_BLK_ID_BYTES + 1] = "";
	int bad = c->bad ? bad_lookup(c->bad) : -1;
	uint32_t type = 0;
	int ret;

	if (len > UINT32_MAX) {
		fprintf(stderr, "vhost-blk: --length above 4 GiB\n");
		return 1;
	}
	if (c->op && op_type(c->op, &type) < 0) {
		fprintf(stderr, "vhost-blk: unknown --op '%s'\n", c->op);
		return 1;
	}
	/* --bad builds direct chains; --op may go indirect. */
	ret = ioc_vhf_blk_slots(d, vq, s, 2, one_data_cap(c), c->indirect && !c->bad);
	if (ret < 0)
		return 1;
	if (c->bad) {
		if (bad < 0) {
			fprintf(stderr, "vhost-blk: unknown --bad '%s'\n", c->bad);
			return 1;
		}
		build_bad((enum bad_kind)bad, d, vq, &s[0], len);
	} else {
		if (type == VIRTIO_BLK_T_OUT) {
			if (c->input) {
				ret = read_file_into(c->input, s[0].data, len);
				if (ret < 0) {
					fprintf(stderr, "vhost-blk: %s: %s\n", c->input,
						strerror(-ret));
					return 1;
				}
			} else if (c->pattern >= 0) {
				memset(s[0].data, c->pattern, len);
			} else {
				fill_pattern(s[0].data, len, off, c->seed);
			}
		}
		ioc_vhf_blk_submit(vq, &s[0], type, off / 512, len,
			       (uint32_t)(len / 512),
			       c->unmap ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0);
	}
	wait_one(c, vq, &s[0], &r);
	if (!c->bad && type == VIRTIO_BLK_T_GET_ID && r.o == OUT_OK) {
		memcpy(id, s[0].id, VIRTIO_BLK_ID_BYTES);
		for (char *p = id; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				*p = '?';
	}
	if (!c->bad && type == VIRTIO_BLK_T_IN && r.o == OUT_OK && c->output) {
		ret = write_file_from(c->output, s[0].data, len);
		if (ret < 0) {
			fprintf(stderr, "vhost-blk: %s: %s\n", c->output, strerror(-ret));
			return 1;
		}
	}
	if (c->bad && r.o != OUT_CLOSED && !bad_kinds[bad].corrupts_ring) {
		/* Does it still serve a good request?  (Not after corrupting
		 * the avail ring: no good request can follow that.) */
		struct one p = { 0 };

		ioc_vhf_blk_submit(vq, &s[1], VIRTIO_BLK_T_IN, 0, 512, 0, 0);
		wait_one(c, vq, &s[1], &p);
		r.probed = true;
		r.serving = p.o == OUT_OK;
	}
	print_one(c, d, c->bad ? bad_kinds[bad].name : c->op,
		  c->bad ? bad_kinds[bad].what : NULL, c->bad ? 0 : off, len, &r,
		  type == VIRTIO_BLK_T_GET_ID && !c->bad ? id : NULL);
	if (!(c->expect & (1u << r.o))) {
		char want[128];

		fprintf(stderr, "vhost-blk: %s: outcome %s, expected %s\n",
			c->bad ? c->bad : c->op, outcome_names[r.o],
			expect_str(c->expect, want, sizeof(want)));
		return 1;
	}
	if (c->op && type == VIRTIO_BLK_T_IN && c->pattern < 0 && !c->output && !c->input &&
	    c->verify && r.o == OUT_OK) {
		uint64_t at = check_pattern(s[0].data, len, off, c->seed);

		if (at != UINT64_MAX) {
			fprintf(stderr, "vhost-blk: data differs from the pattern at byte %"
				PRIu64 "\n", at);
			return 1;
		}
	}
	return 0;
}

/* --- the benchmark --- */

static int run_bench(struct cfg *c, struct ioc_vhf_dev *devs, unsigned ndev)
{
	unsigned nw = ndev * c->queues;

	if (c->busy_rings && c->busy_rings < nw)
		nw = c->busy_rings;
	struct worker *ws = calloc(nw, sizeof(*ws));
	struct hist *all = calloc(1, sizeof(*all));
	pthread_barrier_t bar;
	uint64_t out[OUT_N] = { 0 }, bytes = 0, mism = 0, done = 0, kicks = 0, calls = 0;
	uint64_t len_wrong = 0, bad_used = 0;
	int64_t t0 = INT64_MAX, t1 = 0;
	int rc = 0;

	if (!ws || !all) {
		fprintf(stderr, "vhost-blk: out of memory\n");
		return 1;
	}
	pthread_barrier_init(&bar, NULL, nw + 1);
	for (unsigned i = 0; i < nw; i++) {
		struct worker *w = &ws[i];
		unsigned per_dev = c->queues;
		uint64_t part;

		w->c = c;
		w->devno = i / per_dev;
		w->qno = i % per_dev;
		w->dev = &devs[w->devno];
		w->vq = &w->dev->vq[w->qno];
		/* --verify: blocks interleave over the rings of a device;
		 * otherwise each ring gets count/rings and its own part. */
		w->index = w->qno;
		w->nworkers = per_dev;
		w->count = c->count / nw + (i < c->count % nw);
		if (c->verify)
			w->count = c->count / per_dev + (w->qno < c->count % per_dev);
		part = (c->range / per_dev) / c->size * c->size;
		w->part_start = c->offset + w->qno * part;
		w->part_len = part;
		w->rng = c->seed * 0x2545f4914f6cdd1dull + i * 0x9e3779b97f4a7c15ull + 1;
		w->nslots = (unsigned)c->depth;
		w->slots = calloc(w->nslots, sizeof(*w->slots));
		w->free = calloc(w->nslots, sizeof(*w->free));
		w->bar = &bar;
		if (!w->slots || !w->free) {
			fprintf(stderr, "vhost-blk: out of memory\n");
			return 1;
		}
		if (ioc_vhf_blk_slots(w->dev, w->vq, w->slots, w->nslots, c->size, c->indirect) < 0)
			return 1;
		for (unsigned k = 0; k < w->nslots; k++) {
			w->free[w->nfree++] = w->nslots - 1 - k;
			/* Benchmark writes carry data, not the zero pages. */
			if (!c->verify)
				memset(w->slots[k].data, 0x5a, c->size);
		}
		if (pthread_create(&w->tid, NULL, worker_main, w)) {
			fprintf(stderr, "vhost-blk: pthread_create failed\n");
			return 1;
		}
	}
	if (!c->quiet && !c->json)
		printf("Sending %" PRIu64 " %s requests, %" PRIu64 " bytes each, %" PRIu64
		       " in flight on each of %u ring(s) x %u device(s), %s%s\n",
		       c->count, c->verify ? "verify (write, then read)" : rw_names[c->rw],
		       c->size, c->depth, c->queues, ndev, c->poll ? "polling" : "call eventfd",
		       c->indirect ? ", indirect" : "");
	pthread_barrier_wait(&bar);
	for (unsigned i = 0; i < nw; i++) {
		struct worker *w = &ws[i];

		pthread_join(w->tid, NULL);
		if (w->err)
			rc = 1;
		if (w->t0 < t0)
			t0 = w->t0;
		if (w->t_end > t1)
			t1 = w->t_end;
		for (int o = 0; o < OUT_N; o++)
			out[o] += w->out[o];
		bytes += w->bytes;
		mism += w->mismatches;
		done += w->done;
		len_wrong += w->len_wrong;
		bad_used += w->bad_used;
		kicks += w->vq->kicks;
		calls += w->vq->calls;
		for (size_t b = 0; b < sizeof(all->b) / sizeof(all->b[0]); b++)
			all->b[b] += w->lat.b[b];
		all->n += w->lat.n;
		if (w->lat.max > all->max)
			all->max = w->lat.max;
		if (w->mismatches)
			fprintf(stderr, "vhost-blk: %s queue %u: %" PRIu64 " blocks differ from "
				"what was written, the first at byte %" PRIu64 "\n",
				c->sockets[w->devno], w->qno, w->mismatches, w->first_bad_off);
	}
	pthread_barrier_destroy(&bar);

	double secs = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0;
	double iops = secs > 0 ? (double)done / secs : 0;
	double mbs = secs > 0 ? (double)bytes / secs / 1e6 : 0;

	if (c->json) {
		printf("{\"tool\":\"iocore-bench\",\"cmd\":\"vhost-blk\",\"rw\":\"%s\","
		       "\"size\":%" PRIu64 ",\"depth\":%" PRIu64 ",\"queues\":%u,"
		       "\"devices\":%u,\"mode\":\"%s\",\"indirect\":%s,\"event_idx\":%s,"
		       "\"requests\":%" PRIu64 ",\"seconds\":%.6f,\"iops\":%.1f,"
		       "\"mb_s\":%.1f,\"lat_us\":{\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
		       "\"kicks\":%" PRIu64 ",\"calls\":%" PRIu64 ",\"mismatches\":%" PRIu64
		       ",\"used_len_wrong\":%" PRIu64 ",\"bad_used_ids\":%" PRIu64
		       ",\"status\":{",
		       c->verify ? "verify" : rw_names[c->rw], c->size, c->depth, c->queues,
		       ndev, c->poll ? "poll" : "call", c->indirect ? "true" : "false",
		       ioc_vhf_has(&devs[0], VIRTIO_RING_F_EVENT_IDX) ? "true" : "false", done,
		       secs, iops, mbs, (double)hist_pct(all, 50) / 1e3,
		       (double)hist_pct(all, 99) / 1e3, (double)all->max / 1e3, kicks, calls,
		       mism, len_wrong, bad_used);
		for (int o = 0; o < OUT_N; o++)
			printf("%s\"%s\":%" PRIu64, o ? "," : "", outcome_names[o], out[o]);
		printf("},");
		print_info(c, &devs[0], stdout);
		printf("}\n");
	} else {
		printf("Run completed in %.3f seconds.\n", secs);
		printf("%.1f requests/s, %.1f MB/s, latency p50 %.1f us p99 %.1f us max %.1f us"
		       " (%" PRIu64 " kicks, %" PRIu64 " calls)\n", iops, mbs,
		       (double)hist_pct(all, 50) / 1e3, (double)hist_pct(all, 99) / 1e3,
		       (double)all->max / 1e3, kicks, calls);
		if (done != out[OUT_OK] || out[OUT_CLOSED] || out[OUT_TIMEOUT]) {
			printf("outcomes:");
			for (int o = 0; o < OUT_N; o++)
				if (out[o])
					printf(" %s %" PRIu64, outcome_names[o], out[o]);
			printf("\n");
		}
		if (len_wrong)
			printf("%" PRIu64 " requests completed OK with a used length other "
			       "than the bytes written\n", len_wrong);
		if (c->verify)
			printf("verify: %" PRIu64 " blocks written and read back, %" PRIu64
			       " differ\n", out[OUT_OK] / 2, mism);
	}
	for (int o = 0; o < OUT_N; o++) {
		if (out[o] && !(c->expect & (1u << o))) {
			fprintf(stderr, "vhost-blk: %" PRIu64 " requests ended %s\n", out[o],
				outcome_names[o]);
			rc = 1;
		}
	}
	if (mism)
		rc = 1;
	for (unsigned i = 0; i < nw; i++) {
		free(ws[i].slots);
		free(ws[i].free);
	}
	free(ws);
	free(all);
	return rc;
}

int ioc_bench_vhost_blk(int argc, char **argv)
{
	enum { OPT_SOCKET = 256, OPT_DEVICES, OPT_QUEUES, OPT_QSIZE, OPT_COUNT, OPT_DEPTH, OPT_SIZE,
	       OPT_RW, OPT_MIXREAD, OPT_OFFSET, OPT_RANGE, OPT_VERIFY, OPT_SEED, OPT_POLL,
	       OPT_INDIRECT,
	       OPT_NOEVIDX, OPT_NOINFL, OPT_OP, OPT_LENGTH, OPT_UNMAP, OPT_INPUT, OPT_OUTPUT,
	       OPT_PATTERN, OPT_BAD, OPT_EXPECT, OPT_TIMEOUTMS, OPT_INFO, OPT_JSON, OPT_VERBOSE,
	       OPT_BUSY, OPT_IDLE };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "devices", required_argument, NULL, OPT_DEVICES },
		{ "queues", required_argument, NULL, OPT_QUEUES },
		{ "queue-size", required_argument, NULL, OPT_QSIZE },
		{ "count", required_argument, NULL, OPT_COUNT },
		{ "depth", required_argument, NULL, OPT_DEPTH },
		{ "size", required_argument, NULL, OPT_SIZE },
		{ "rw", required_argument, NULL, OPT_RW },
		{ "mix-read", required_argument, NULL, OPT_MIXREAD },
		{ "offset", required_argument, NULL, OPT_OFFSET },
		{ "range", required_argument, NULL, OPT_RANGE },
		{ "verify", no_argument, NULL, OPT_VERIFY },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "poll", no_argument, NULL, OPT_POLL },
		{ "indirect", no_argument, NULL, OPT_INDIRECT },
		{ "no-event-idx", no_argument, NULL, OPT_NOEVIDX },
		{ "no-inflight", no_argument, NULL, OPT_NOINFL },
		{ "op", required_argument, NULL, OPT_OP },
		{ "length", required_argument, NULL, OPT_LENGTH },
		{ "unmap", no_argument, NULL, OPT_UNMAP },
		{ "input", required_argument, NULL, OPT_INPUT },
		{ "output", required_argument, NULL, OPT_OUTPUT },
		{ "pattern", required_argument, NULL, OPT_PATTERN },
		{ "bad", required_argument, NULL, OPT_BAD },
		{ "expect-status", required_argument, NULL, OPT_EXPECT },
		{ "timeout", required_argument, NULL, OPT_TIMEOUTMS },
		{ "info", no_argument, NULL, OPT_INFO },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "verbose", no_argument, NULL, OPT_VERBOSE },
		{ "busy-rings", required_argument, NULL, OPT_BUSY },
		{ "idle", required_argument, NULL, OPT_IDLE },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct cfg C;
	static struct ioc_vhf_dev devs[MAX_DEVICES];
	static char names[MAX_DEVICES][108];
	struct cfg *c = &C;
	uint64_t v;
	unsigned ndev = 0;
	int opt, rc = 1;

	memset(c, 0, sizeof(*c));
	c->queues = 1;
	c->count = 75000;
	c->depth = 64;
	c->size = 4096;
	c->mix_read = 70;
	c->seed = 1;
	c->pattern = -1;
	c->timeout_ms = -1;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "hq", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_SOCKET:
			if (c->nsockets == MAX_DEVICES) {
				fprintf(stderr, "vhost-blk: at most %d sockets\n", MAX_DEVICES);
				return 1;
			}
			c->sockets[c->nsockets++] = optarg;
			break;
		case OPT_DEVICES: case OPT_QUEUES: case OPT_QSIZE: case OPT_COUNT: case OPT_DEPTH:
		case OPT_SIZE: case OPT_MIXREAD: case OPT_OFFSET: case OPT_RANGE: case OPT_SEED:
		case OPT_LENGTH: case OPT_PATTERN: case OPT_TIMEOUTMS: case OPT_BUSY: case OPT_IDLE:
			if (ioc_tool_parse_size(optarg, &v) < 0) {
				fprintf(stderr, "vhost-blk: invalid number '%s'\n", optarg);
				return 1;
			}
			switch (opt) {
			case OPT_DEVICES: c->devices = (unsigned)v; break;
			case OPT_QUEUES: c->queues = (unsigned)v; break;
			case OPT_QSIZE: c->queue_size = (unsigned)v; break;
			case OPT_COUNT: c->count = v; break;
			case OPT_DEPTH: c->depth = v; break;
			case OPT_SIZE: c->size = v; break;
			case OPT_MIXREAD: c->mix_read = (unsigned)v; break;
			case OPT_OFFSET: c->offset = v; break;
			case OPT_RANGE: c->range = v; break;
			case OPT_SEED: c->seed = v; break;
			case OPT_LENGTH: c->length = v; break;
			case OPT_PATTERN: c->pattern = (int)(v & 0xff); break;
			case OPT_TIMEOUTMS: c->timeout_ms = (int)v; break;
			case OPT_BUSY: c->busy_rings = (unsigned)v; break;
			case OPT_IDLE: c->idle_s = v > 86400 ? 86400 : (unsigned)v; break;
			}
			break;
		case OPT_RW: {
			unsigned i;

			for (i = 0; i < 5 && strcmp(optarg, rw_names[i]); i++)
				;
			if (i == 5) {
				fprintf(stderr, "vhost-blk: --rw read|write|randread|"
					"randwrite|mix\n");
				return 1;
			}
			c->rw = (enum rw)i;
			break;
		}
		case OPT_VERIFY: c->verify = true; break;
		case OPT_POLL: c->poll = true; break;
		case OPT_INDIRECT: c->indirect = true; break;
		case OPT_NOEVIDX: c->vo.features_off |= 1ull << VIRTIO_RING_F_EVENT_IDX; break;
		case OPT_NOINFL: c->vo.no_inflight = true; break;
		case OPT_OP: c->op = optarg; break;
		case OPT_UNMAP: c->unmap = true; break;
		case OPT_INPUT: c->input = optarg; break;
		case OPT_OUTPUT: c->output = optarg; break;
		case OPT_BAD: c->bad = optarg; break;
		case OPT_EXPECT:
			if (parse_expect(optarg, &c->expect) < 0) {
				fprintf(stderr, "vhost-blk: --expect-status: a comma-"
					"separated list of ok, ioerr, unsupp, invalid, "
					"untouched, closed, timeout, any\n");
				return 1;
			}
			c->expect_set = true;
			break;
		case OPT_INFO: c->info = true; break;
		case OPT_JSON: c->json = true; break;
		case OPT_VERBOSE: c->vo.verbose = true; break;
		case 'q': c->quiet = true; break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (optind < argc || !c->nsockets) {
		usage(stderr);
		return 1;
	}
	if (c->devices > MAX_DEVICES) {
		fprintf(stderr, "vhost-blk: at most %d devices\n", MAX_DEVICES);
		return 1;
	}
	/* --devices N with one PATH holding %d: PATH numbered 0..N-1. */
	if (c->devices && c->nsockets == 1 && strstr(c->sockets[0], "%d")) {
		/* Not a format string: only the first %d is replaced. */
		const char *tmpl = c->sockets[0], *at = strstr(tmpl, "%d");
		int pre = (int)(at - tmpl);

		for (unsigned i = 0; i < c->devices; i++) {
			snprintf(names[i], sizeof(names[i]), "%.*s%u%s", pre, tmpl, i, at + 2);
			c->sockets[i] = names[i];
		}
		c->nsockets = c->devices;
	}
	if (c->devices && c->devices != c->nsockets) {
		fprintf(stderr, "vhost-blk: --devices %u but %u socket(s) given\n", c->devices,
			c->nsockets);
		return 1;
	}
	if (c->op && c->bad) {
		fprintf(stderr, "vhost-blk: --op and --bad exclude each other\n");
		return 1;
	}
	if (c->op && op_type(c->op, &(uint32_t){ 0 }) < 0) {
		fprintf(stderr, "vhost-blk: unknown --op '%s'\n", c->op);
		return 1;
	}
	if (c->bad && bad_lookup(c->bad) < 0) {
		fprintf(stderr, "vhost-blk: unknown --bad '%s'\n", c->bad);
		return 1;
	}
	if (c->depth == 0 || c->depth > 32768 || c->size == 0 || c->size % 512 ||
	    c->size > (1u << 30) || c->queues == 0 || c->queues > IOC_VHF_MAX_QUEUES ||
	    c->mix_read > 100) {
		fprintf(stderr, "vhost-blk: invalid --depth, --size (a multiple of 512 up to "
			"1G), --queues or --mix-read\n");
		return 1;
	}
	if (c->offset % 512 || c->range % 512) {
		fprintf(stderr, "vhost-blk: --offset and --range must be multiples of 512\n");
		return 1;
	}
	if (!c->expect_set)
		c->expect = c->bad ? (1u << OUT_IOERR) | (1u << OUT_UNSUPP) | (1u << OUT_CLOSED) :
			1u << OUT_OK;
	if (c->timeout_ms < 0)
		c->timeout_ms = c->bad ? 3000 : 30000;
	if (c->op || c->bad)
		c->queues = 1;

	ioc_tool_raise_nofile();
	c->vo.queues = c->queues;
	c->vo.queue_size = c->queue_size;
	c->vo.timeout_ms = c->timeout_ms < 10000 ? 10000 : c->timeout_ms;

	for (ndev = 0; ndev < c->nsockets; ndev++) {
		struct ioc_vhf_dev *d = &devs[ndev];
		uint64_t slots, slot_size;

		c->vo.socket = c->sockets[ndev];
		if (ioc_vhf_connect(d, &c->vo) < 0)
			goto out;
		if (c->indirect && !ioc_vhf_has(d, VIRTIO_RING_F_INDIRECT_DESC)) {
			fprintf(stderr, "vhost-blk: %s: --indirect, but the back-end does not "
				"offer VIRTIO_RING_F_INDIRECT_DESC\n", d->socket);
			ndev++;
			goto out;
		}
		if (c->info)
			continue;
		slots = (c->op || c->bad) ? 2 : c->depth * c->queues;
		slot_size = (c->op || c->bad) ? one_data_cap(c) : c->size;
		/* Without --queue-size: enough descriptors for the slots of
		 * one ring (their data in segments of the device's size_max),
		 * 256 at least, as a power of two. */
		if (!c->queue_size) {
			uint64_t need = (slots / c->queues) *
					ioc_vhf_blk_slot_descs(d, slot_size,
							   c->indirect && !c->bad);

			d->queue_size = 256;
			while (d->queue_size < need && d->queue_size < 32768)
				d->queue_size <<= 1;
		}
		if (ioc_vhf_start(d, slots * ioc_vhf_blk_slot_bytes(d, slot_size)) < 0) {
			ndev++;
			goto out;
		}
	}
	if (c->info) {
		for (unsigned i = 0; i < ndev; i++) {
			if (c->json) {
				printf("{\"socket\":\"%s\",", devs[i].socket);
				print_info(c, &devs[i], stdout);
				printf("}\n");
			} else {
				print_info(c, &devs[i], stdout);
			}
		}
		rc = 0;
		goto out;
	}
	if (!c->range) {
		uint64_t cap = ioc_vhf_blk_capacity(&devs[0]);

		for (unsigned i = 1; i < ndev; i++)
			if (ioc_vhf_blk_capacity(&devs[i]) < cap)
				cap = ioc_vhf_blk_capacity(&devs[i]);
		c->range = cap > c->offset ? cap - c->offset : 0;
	}
	if (c->idle_s) {
		struct timespec ts = { c->idle_s, 0 };

		if (!c->quiet && !c->json)
			printf("%u device(s) x %u ring(s) started, idle for %u s\n", ndev,
			       c->queues, c->idle_s);
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		rc = 0;
	} else if (c->op || c->bad) {
		rc = run_one(c, &devs[0]);
	} else if (c->range / c->queues < c->size ||
		   (c->verify && c->count * c->size > c->range)) {
		fprintf(stderr, "vhost-blk: the area (%" PRIu64 " bytes from %" PRIu64 ") is too "
			"small for %s\n", c->range, c->offset,
			c->verify ? "--count blocks of --size" : "--size on each ring");
		rc = 1;
	} else {
		rc = run_bench(c, devs, ndev);
	}
out:
	for (unsigned i = 0; i < ndev; i++) {
		/* The rings stop before the connection goes, as a guest's
		 * device reset stops them; a back-end that hung up cannot. */
		if (devs[i].mem)
			ioc_vhf_stop(&devs[i], NULL);
		ioc_vhf_close(&devs[i]);
	}
	return rc;
}
