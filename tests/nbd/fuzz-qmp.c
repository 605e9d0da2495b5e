/*
 * Fuzz target for the control socket's QMP layer (src/qmp/qmp.c): the input
 * is everything a client sends.  It is fed to one attached client in
 * pieces (the first byte chooses the piece size, so objects split across
 * reads are covered), with a table whose commands take every argument
 * type; the replies go to a socketpair that is drained as it fills.
 *
 * Built two ways, like fuzz-nbd.c: a libFuzzer target with -Dfuzz=true and
 * clang, and always an ordinary test (IOC_FUZZ_STANDALONE) running seeds
 * and deterministic mutations of them, which checks that every session
 * ends with the client still attached or closed, and that a well-formed
 * session gets one reply per command.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "iocore/loop.h"
#include "qmp/qmp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *echo(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	if (json_is_true(json_object_get(args, "fail"))) {
		snprintf(err->desc, sizeof(err->desc), "asked to fail");
		return NULL;
	}
	return json_deep_copy(args);
}

static const struct ioc__qmp_arg args_all[] = {
	{ "s", IOC_QMP_STR, false }, { "u", IOC_QMP_UINT, true },
	{ "b", IOC_QMP_BOOL, true }, { "a", IOC_QMP_ARRAY, true },
	{ "fail", IOC_QMP_BOOL, true }, { NULL },
};

static const struct ioc__qmp_cmd cmds[] = {
	{ "qmp_capabilities", NULL, NULL },
	{ "echo", echo, args_all },
	{ "noargs", echo, NULL },
};

static struct ioc_loop *loop;
static size_t replies; /* lines received in the last run */

static void drain(int fd)
{
	char buf[65536];
	ssize_t n;

	while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		for (ssize_t i = 0; i < n; i++)
			replies += buf[i] == '\n';
}

static int run_one(const uint8_t *data, size_t size)
{
	struct ioc__qmp_opts o = {
		.cmds = cmds, .ncmds = sizeof(cmds) / sizeof(cmds[0]),
		.package = "fuzz", .max_msg = 4096, .max_out = 65536,
	};
	struct ioc__qmp *q;
	struct ioc__qmp_client *c;
	size_t piece, off = 0;
	int sv[2];

	if (!loop && ioc_loop_new(&loop, NULL) < 0)
		abort();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	if (ioc__qmp_new(&q, loop, -1, &o) < 0 || ioc__qmp_attach(q, sv[0], &c) < 0)
		abort();
	replies = 0;
	/* The first byte is the piece size, not input. */
	piece = size ? (size_t)data[0] % 64 + 1 : 1;
	if (size) {
		data++;
		size--;
	}
	while (off < size) {
		size_t n = size - off < piece ? size - off : piece;

		if (ioc__qmp_input(c, data + off, n) < 0)
			break; /* closed: oversized message or a client that does not read */
		off += n;
		drain(sv[1]);
	}
	drain(sv[1]);
	ioc__qmp_free(q);
	close(sv[1]);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return run_one(data, size);
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-standalone.h"

static const char *const seeds[] = {
	"{\"execute\":\"qmp_capabilities\"}{\"execute\":\"echo\",\"arguments\":{\"s\":\"x\","
	"\"u\":5,\"b\":true,\"a\":[1,{\"k\":null}]},\"id\":[1,\"2\"]}",
	"{\"execute\":\"echo\"}{\"execute\":\"qmp_capabilities\"}{\"execute\":\"noargs\","
	"\"id\":{\"a\":\"}\\\"[\"}}",
	"{\"execute\":\"qmp_capabilities\"} {\"execute\":\"echo\",\"arguments\":{\"s\":1}}"
	"{\"execute\":\"echo\",\"arguments\":{\"u\":-1,\"s\":\"\"}}{not json}] 12 "
	"{\"execute\":\"echo\",\"arguments\":{\"s\":\"a\",\"zz\":0}}"
	"{\"execute\":\"echo\",\"arguments\":{\"s\":\"a\",\"fail\":true}}",
	"{\"execute\":\"qmp_capabilities\"}{\"execute\":\"echo\",\"arguments\":"
	"{\"s\":\"\\u0000\\ud800\",\"a\":[[[[[[[[[[]]]]]]]]]]}}",
};

static void write_corpus(const char *dir)
{
	for (size_t i = 0; i < IOC_ARRAY_SIZE(seeds); i++) {
		char name[32], b[1024];
		size_t n = strlen(seeds[i]);

		if (n + 1 > sizeof(b))
			exit(1);
		snprintf(name, sizeof(name), "seed-%zu", i);
		b[0] = 7; /* the piece-size byte */
		memcpy(b + 1, seeds[i], n);
		ioc_fuzz_write(dir, name, b, n + 1);
	}
}

static void test_seeds(void)
{
	/* Seed 0 with every piece size: two replies, whatever the split. */
	for (int p = 0; p < 64; p++) {
		size_t n = strlen(seeds[0]) + 1;
		uint8_t *b = malloc(n);

		b[0] = (uint8_t)p;
		memcpy(b + 1, seeds[0], n - 1);
		run_one(b, n);
		/* greeting + capabilities + echo */
		ASSERT_UEQ(replies, 3);
		free(b);
	}
	/* Seed 2: every bad input gets exactly one reply. */
	{
		size_t n = strlen(seeds[2]) + 1;
		uint8_t *b = malloc(n);

		b[0] = 63;
		memcpy(b + 1, seeds[2], n - 1);
		run_one(b, n);
		ASSERT_UEQ(replies, 1 + 1 + 7); /* greeting, capabilities, 7 errors */
		free(b);
	}
}

static void test_mutations(void)
{
	unsigned long rounds = ioc_test_scaled(20000);
	uint64_t r = 88172645463325252ull;

	for (unsigned long i = 0; i < rounds; i++) {
		const char *s = seeds[i % (sizeof(seeds) / sizeof(seeds[0]))];
		size_t n = strlen(s) + 1;
		uint8_t *b = malloc(n + 8);

		b[0] = (uint8_t)i;
		memcpy(b + 1, s, n - 1);
		for (int k = 0; k < 3; k++) {
			r ^= r << 13;
			r ^= r >> 7;
			r ^= r << 17;
			b[1 + r % (n - 1)] = (uint8_t)(r >> 32);
		}
		run_one(b, n - (r >> 40) % 4);
		free(b);
	}
	/* An oversized message and a flood of replies end the client. */
	{
		size_t n = 100000;
		uint8_t *b = malloc(n);

		memset(b, ' ', n);
		static const char head[] = "\x3f{\"execute\":\"qmp_capabilities\"}{\"s\":\"";

		memcpy(b, head, sizeof(head) - 1);
		run_one(b, n);
		for (size_t k = 1; k + 33 <= n; k += 33)
			memcpy(b + k, "{\"execute\":\"qmp_capabilities\"}  ", 33);
		run_one(b, n);
		free(b);
	}
}

IOC_FUZZ_MAIN(write_corpus, IOC_TEST(test_seeds), IOC_TEST(test_mutations))
#endif
