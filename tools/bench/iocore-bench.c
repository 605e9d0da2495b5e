/*
 * iocore-bench: benchmarks of iocore's layers as command-line tools.
 *
 *   iocore-bench blk [-c count] [-d depth] [-s size] [-S step] [-o offset]
 *                    [-w] [-i io_uring|threads] [-t writeback|none] [-f raw]
 *                    [--pattern N] [--flush-interval N [--no-drain]]
 *                    [--driver file|null] [--null-size SIZE]
 *                    [--fast-path on|off] [--json] [-q] FILE
 *   iocore-bench vhost-blk --socket PATH [options]   (see vhost-blk.c)
 *
 * "blk" is qemu-img bench's request loop on iocore's block layer, with its
 * flags and their meaning: count requests of size bytes, depth in flight,
 * the first at offset, each next one step bytes further (default: size),
 * wrapping at the end of the image; -w writes instead of reading.  Like
 * qemu-img (whose blk_aio_* runs each request in its own coroutine), every
 * request is its own coroutine, created when the request is issued and
 * gone when it completes.  The time is from the first submission to the
 * last completion.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "iocore/blk.h"
#include "iocore/co.h"
#include "iocore/loop.h"

#include "parse-size.h"
#include "vhost-blk.h"

struct blk_bench {
	struct ioc_blk *blk;
	struct ioc_loop *loop;
	uint64_t remaining;    /* requests not yet completed */
	uint64_t to_submit;    /* requests not yet issued */
	unsigned in_flight, depth;
	uint64_t offset, step, image_size, bufsize;
	bool write;
	char *buf;
	unsigned *free_slots;  /* stack of buffer slots not in use */
	unsigned nfree;
	int err;
	uint64_t err_offset;
	/* --flush-interval: a flush after every flush_interval writes, by
	 * default once the requests before it completed (--no-drain: at once,
	 * alongside them). */
	uint64_t flush_interval, issued, flushed_at;
	bool drain, in_flush;
	unsigned flushes;      /* flushes in flight */
};

static struct blk_bench B;

static void blk_bench_issue(void);

static void ioc_coroutine_fn blk_bench_request(void *opaque)
{
	unsigned slot = (unsigned)(uintptr_t)opaque;
	uint64_t offset = B.offset;
	struct iovec iov = {
		.iov_base = B.buf + (size_t)slot * B.bufsize,
		.iov_len = B.bufsize,
	};
	int ret;

	/* Advance for the next request before we may yield. */
	B.offset += B.step;
	B.offset = B.image_size ? B.offset % B.image_size : 0;
	ret = B.write ? ioc_blk_co_pwritev(B.blk, offset, &iov, 1, 0) :
		ioc_blk_co_preadv(B.blk, offset, &iov, 1, 0);
	B.in_flight--;
	B.remaining--;
	B.free_slots[B.nfree++] = slot;
	if (ret < 0 && !B.err) {
		B.err = ret;
		B.err_offset = offset;
		B.remaining -= B.to_submit;
		B.to_submit = 0;
	}
	blk_bench_issue();
}

static void ioc_coroutine_fn blk_bench_flush(void *opaque)
{
	int ret = ioc_blk_co_flush(B.blk, 0);

	(void)opaque;
	B.flushes--;
	B.in_flush = false;
	if (ret < 0 && !B.err) {
		B.err = ret;
		B.remaining -= B.to_submit;
		B.to_submit = 0;
	}
	blk_bench_issue();
}

/* Time for a flush before the next request?  Returns true when issuing
 * must wait for it. */
static bool blk_bench_flush_point(void)
{
	struct ioc_co *co;

	if (!B.flush_interval || B.issued == 0 || B.issued % B.flush_interval ||
	    B.flushed_at == B.issued)
		return false;
	if (B.drain && B.in_flight > 0)
		return true; /* the last completion calls us again */
	co = ioc_co_create(blk_bench_flush, NULL);
	if (!co) {
		if (!B.err)
			B.err = -ENOMEM;
		B.remaining -= B.to_submit;
		B.to_submit = 0;
		return true;
	}
	B.flushed_at = B.issued;
	B.flushes++;
	B.in_flush = B.drain;
	ioc_co_wake(co);
	return B.drain;
}

/* Keep depth requests in flight: each gets a fresh coroutine, started by
 * ioc_co_wake(): from a finishing request that posts it to the loop
 * (entering it there would nest without bound when requests complete at
 * once); from outside a coroutine it enters at once. */
static void blk_bench_issue(void)
{
	while (B.to_submit && B.in_flight < B.depth && !B.in_flush) {
		if (blk_bench_flush_point())
			return;
		unsigned slot = B.free_slots[--B.nfree];
		struct ioc_co *co = ioc_co_create(blk_bench_request,
						  (void *)(uintptr_t)slot);

		if (!co) {
			B.free_slots[B.nfree++] = slot;
			if (!B.err)
				B.err = -ENOMEM;
			B.remaining -= B.to_submit;
			B.to_submit = 0;
			return;
		}
		B.to_submit--;
		B.in_flight++;
		B.issued++;
		ioc_co_wake(co);
	}
	/* Like qemu-img, a last flush when the count ends on the interval. */
	if (!B.to_submit && !B.in_flight && !B.in_flush && !B.err)
		blk_bench_flush_point();
}

static void blk_usage(FILE *f)
{
	fprintf(f,
		"usage: iocore-bench blk [-c count] [-d depth] [-s size] [-S step]\n"
		"           [-o offset] [-w] [-i io_uring|threads] [-t writeback|none]\n"
		"           [-f raw] [--pattern N] [--flush-interval N [--no-drain]]\n"
		"           [--driver file|null] [--null-size SIZE]\n"
		"           [--fast-path on|off] [--json] [--poll-max-ns N]\n"
		"           [--dirty-bitmaps N] [-q] [FILE]\n"
		"  --poll-max-ns N   the loop's adaptive polling cap (0 = default,\n"
		"                    negative = no polling)\n"
		"  --dirty-bitmaps N N recording in-memory dirty bitmaps (64 KiB\n"
		"                    granules) on the image: the cost of change tracking\n");
}

static int cmd_blk(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "pattern", required_argument, NULL, 'P' },
		{ "driver", required_argument, NULL, 'D' },
		{ "null-size", required_argument, NULL, 'N' },
		{ "fast-path", required_argument, NULL, 'F' },
		{ "json", no_argument, NULL, 'J' },
		{ "poll-max-ns", required_argument, NULL, 'L' },
		{ "flush-interval", required_argument, NULL, 'I' },
		{ "no-drain", no_argument, NULL, 'R' },
		{ "dirty-bitmaps", required_argument, NULL, 'B' },
		{ NULL, 0, NULL, 0 },
	};
	struct ioc_blk_opts opts = { .aio = IOC_BLK_AIO_THREADS, .null_size = 1ull << 30 };
	uint64_t count = 75000, depth = 64, bufsize = 4096, step = 0, offset = 0;
	uint64_t v, nbitmaps = 0;
	int pattern = 0, c, ret;
	bool json = false, quiet = false, no_drain = false;
	const char *path = NULL, *aio_name = "threads", *cache_name = "writeback";
	struct ioc_blk_info info;
	struct ioc_loop_opts lopts = { 0 };

	optind = 1;
	while ((c = getopt_long(argc, argv, "hc:d:s:S:o:wi:t:f:qnU", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
		case 'd':
		case 's':
		case 'S':
		case 'o':
		case 'N':
			if (ioc_tool_parse_size(optarg, &v) < 0) {
				fprintf(stderr, "iocore-bench: invalid number '%s'\n", optarg);
				return 1;
			}
			if (c == 'c') count = v;
			else if (c == 'd') depth = v;
			else if (c == 's') bufsize = v;
			else if (c == 'S') step = v;
			else if (c == 'o') offset = v;
			else opts.null_size = v;
			break;
		case 'w':
			B.write = true;
			break;
		case 'i':
			aio_name = optarg;
			if (!strcmp(optarg, "io_uring"))
				opts.aio = IOC_BLK_AIO_IO_URING;
			else if (!strcmp(optarg, "threads"))
				opts.aio = IOC_BLK_AIO_THREADS;
			else {
				fprintf(stderr, "iocore-bench: -i io_uring|threads\n");
				return 1;
			}
			break;
		case 't':
			cache_name = optarg;
			if (!strcmp(optarg, "writeback"))
				opts.cache = IOC_BLK_CACHE_WRITEBACK;
			else if (!strcmp(optarg, "none"))
				opts.cache = IOC_BLK_CACHE_NONE;
			else {
				fprintf(stderr, "iocore-bench: -t writeback|none\n");
				return 1;
			}
			break;
		case 'f':
			if (strcmp(optarg, "raw")) {
				fprintf(stderr, "iocore-bench: only -f raw is supported\n");
				return 1;
			}
			break;
		case 'q':
			quiet = true;
			break;
		case 'P':
			pattern = atoi(optarg);
			break;
		case 'D':
			if (!strcmp(optarg, "null"))
				opts.driver = IOC_BLK_DRIVER_NULL;
			else if (!strcmp(optarg, "file"))
				opts.driver = IOC_BLK_DRIVER_FILE;
			else {
				fprintf(stderr, "iocore-bench: --driver file|null\n");
				return 1;
			}
			break;
		case 'F':
			if (!strcmp(optarg, "on"))
				opts.no_fast_path = false;
			else if (!strcmp(optarg, "off"))
				opts.no_fast_path = true;
			else {
				fprintf(stderr, "iocore-bench: --fast-path on|off\n");
				return 1;
			}
			break;
		case 'J':
			json = true;
			break;
		case 'L':
			lopts.poll_max_ns = strtoll(optarg, NULL, 0);
			break;
		case 'I':
			if (ioc_tool_parse_size(optarg, &B.flush_interval) < 0) {
				fprintf(stderr, "iocore-bench: invalid flush interval\n");
				return 1;
			}
			break;
		case 'R':
			no_drain = true;
			break;
		case 'B':
			if (ioc_tool_parse_size(optarg, &nbitmaps) < 0 ||
			    nbitmaps > IOC_BLK_DIRTY_MAX) {
				fprintf(stderr, "iocore-bench: --dirty-bitmaps 0..%u\n",
					IOC_BLK_DIRTY_MAX);
				return 1;
			}
			break;
		case 'n':
		case 'U':
			break; /* qemu-img's native AIO and force-share: no meaning here */
		case 'h':
			blk_usage(stdout);
			return 0;
		default:
			blk_usage(stderr);
			return 1;
		}
	}
	if (optind < argc)
		path = argv[optind++];
	if (optind < argc || (!path && opts.driver == IOC_BLK_DRIVER_FILE)) {
		blk_usage(stderr);
		return 1;
	}
	if (depth == 0 || depth > 65536 || bufsize == 0 || bufsize > (1u << 30)) {
		fprintf(stderr, "iocore-bench: invalid depth or size\n");
		return 1;
	}
	if (step == 0)
		step = bufsize;
	if (B.flush_interval && !B.write) {
		fprintf(stderr, "iocore-bench: --flush-interval is only for writes (-w)\n");
		return 1;
	}
	if (no_drain && !B.flush_interval) {
		fprintf(stderr, "iocore-bench: --no-drain needs --flush-interval\n");
		return 1;
	}
	B.drain = !no_drain;
	if (opts.read_only == false && !B.write)
		opts.read_only = true;

	ret = ioc_loop_new(&B.loop, &lopts);
	if (ret < 0) {
		fprintf(stderr, "iocore-bench: loop: %s\n", ioc_strerror(ret));
		return 1;
	}
	ret = ioc_blk_open(&B.blk, path, &opts);
	if (ret < 0) {
		fprintf(stderr, "iocore-bench: %s: %s\n", path ? path : "null",
			ioc_strerror(ret));
		ioc_loop_free(B.loop);
		return 1;
	}
	for (uint64_t i = 0; i < nbitmaps; i++) {
		char name[16];
		struct ioc_blk_dirty_opts dopts = { .name = name };

		snprintf(name, sizeof(name), "b%u", (unsigned)i);
		ret = ioc_blk_dirty_add(B.blk, &dopts, NULL);
		if (ret < 0) {
			fprintf(stderr, "iocore-bench: dirty bitmap: %s\n", ioc_strerror(ret));
			return 1;
		}
	}
	ioc_blk_get_info(B.blk, &info);
	if (opts.driver == IOC_BLK_DRIVER_FILE && opts.aio == IOC_BLK_AIO_IO_URING &&
	    !ioc_loop_has_uring(B.loop))
		fprintf(stderr, "iocore-bench: io_uring unavailable, using threads\n");
	B.depth = (unsigned)depth;
	B.bufsize = bufsize;
	B.step = step;
	B.image_size = info.size;
	B.offset = B.image_size ? offset % B.image_size : 0;
	B.remaining = B.to_submit = count;
	B.free_slots = calloc(depth, sizeof(*B.free_slots));
	if (!B.free_slots ||
	    posix_memalign((void **)&B.buf, 4096, (size_t)(depth * bufsize))) {
		fprintf(stderr, "iocore-bench: out of memory\n");
		return 1;
	}
	memset(B.buf, pattern, (size_t)(depth * bufsize));
	for (unsigned i = 0; i < depth; i++)
		B.free_slots[B.nfree++] = (unsigned)depth - 1 - i;

	if (!quiet && !json)
		printf("Sending %" PRIu64 " %s requests, %" PRIu64 " bytes each, %"
		       PRIu64 " in parallel (starting at offset %" PRIu64
		       ", step size %" PRIu64 ")\n", count,
		       B.write ? "write" : "read", bufsize, depth, offset, step);

	int64_t t0 = ioc_now_ns();

	blk_bench_issue();
	while (B.remaining > 0 || B.flushes > 0)
		ioc_loop_poll(B.loop, true);

	double secs = (double)(ioc_now_ns() - t0) / 1e9;
	double rate = secs > 0 ? (double)count / secs : 0;

	if (B.err) {
		fprintf(stderr, "iocore-bench: failed request at offset %" PRIu64 ": %s\n",
			B.err_offset, ioc_strerror(B.err));
	} else if (json) {
		printf("{\"tool\":\"iocore-bench\",\"cmd\":\"blk\",\"driver\":\"%s\","
		       "\"aio\":\"%s\",\"cache\":\"%s\",\"fast_path\":%s,\"write\":%s,"
		       "\"requests\":%" PRIu64 ",\"depth\":%" PRIu64 ",\"size\":%" PRIu64
		       ",\"seconds\":%.6f,\"requests_per_s\":%.1f}\n",
		       opts.driver == IOC_BLK_DRIVER_NULL ? "null" : "file",
		       info.aio, cache_name, opts.no_fast_path ? "false" : "true",
		       B.write ? "true" : "false", count, depth, bufsize, secs, rate);
	} else {
		printf("Run completed in %.3f seconds.\n", secs);
		printf("%.1f requests/s (aio=%s, cache=%s, fast-path=%s)\n", rate,
		       info.aio, cache_name, opts.no_fast_path ? "off" : "on");
	}
	(void)aio_name;
	ioc_blk_close(B.blk);
	ioc_loop_free(B.loop);
	free(B.buf);
	free(B.free_slots);
	return B.err ? 1 : 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: iocore-bench COMMAND [options]\n"
		"commands:\n"
		"  blk        qemu-img bench's request loop on iocore's block layer\n"
		"  vhost-blk  a vhost-user-blk front-end driving a back-end's socket\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 1;
	}
	if (!strcmp(argv[1], "blk"))
		return cmd_blk(argc - 1, argv + 1);
	if (!strcmp(argv[1], "vhost-blk"))
		return ioc_bench_vhost_blk(argc - 1, argv + 1);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "iocore-bench: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 1;
}
