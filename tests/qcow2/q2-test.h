/*
 * Helpers shared by the qcow2 driver's tests: shell commands (qemu-img,
 * qemu-io), qcow2 nodes opened through the graph, whole-image reads in a
 * coroutine compared with a raw file, and a pattern generator.
 */
#ifndef IOC_Q2_TEST_H
#define IOC_Q2_TEST_H

#include <stdarg.h>
#include <sys/wait.h>

#include "../blk/blk-test.h"
#include "node/node.h"

static struct ioc_node_graph *q2t_graph;

/* Run a shell command (printf format); its exit status. */
static inline int q2t_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int q2t_sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	if (st == -1 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

#define Q2T_SH_OK(...)                                                       \
	do {                                                                 \
		int q2t_st_ = q2t_sh(__VA_ARGS__);                           \
		if (q2t_st_ != 0)                                            \
			ioc_test_fail(__FILE__, __LINE__, "command failed (%d)", \
				      q2t_st_);                              \
	} while (0)

static inline void q2t_require_qemu(void)
{
	if (q2t_sh("command -v qemu-img >/dev/null 2>&1 && command -v qemu-io >/dev/null 2>&1"))
		IOC_SKIP_ALL("qemu-img or qemu-io is not installed");
}

static inline char *q2t_path(const char *name)
{
	char *p = NULL;

	if (asprintf(&p, "%s/%s", ioc_test_tmpdir(), name) < 0)
		abort();
	return p;
}

static inline struct ioc_node_graph *q2t_get_graph(void)
{
	if (!q2t_graph)
		ASSERT_OK(ioc_node_graph_new(&q2t_graph));
	bt_get_loop();
	return q2t_graph;
}

/* Open path as a qcow2 node (extra: more members, JSON, or ""). */
static inline int q2t_open(const char *name, const char *path, bool ro, const char *extra,
			   struct ioc_node **out, char *err, size_t errlen)
{
	char js[4096];
	json_error_t je;
	json_t *o;
	const char *cls;
	int ret;

	snprintf(js, sizeof(js),
		 "{\"driver\":\"qcow2\",\"node-name\":\"%s\",\"read-only\":%s,"
		 "\"file\":{\"driver\":\"file\",\"filename\":\"%s\"%s}%s%s}",
		 name, ro ? "true" : "false", path, ro ? "" : ",\"discard\":\"unmap\"",
		 extra && extra[0] ? "," : "", extra ? extra : "");
	o = json_loads(js, 0, &je);
	ASSERT_NOT_NULL(o);
	err[0] = 0;
	if (!ioc_node_check_opts(o, 0, err, errlen)) {
		json_decref(o);
		return -EINVAL;
	}
	ret = ioc_node_add(q2t_get_graph(), o, out, &cls, err, errlen);
	json_decref(o);
	return ret;
}

static inline void q2t_close(struct ioc_node *n)
{
	char err[256];
	const char *cls;

	ASSERT_OK(ioc_node_del(q2t_graph, n->name, &cls, err, sizeof(err)));
}

static inline uint8_t *q2t_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p;
	long n;

	if (!f)
		ioc_test_fail(__FILE__, __LINE__, "open %s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	p = malloc((size_t)n + 1);
	ASSERT_NOT_NULL(p);
	ASSERT_UEQ(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return p;
}

/* xorshift64: the tests' only randomness, from a fixed start. */
static inline uint64_t q2t_rand(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* A raw file of size bytes: runs of data (compressible and not), zeroes
 * and holes, so conversions make every kind of cluster. */
static inline void q2t_make_source(const char *path, uint64_t size, uint64_t rstate)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	uint64_t x = rstate | 1, off = 0;
	uint8_t *buf = malloc(1 << 20);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ftruncate(fd, (off_t)size));
	while (off < size) {
		uint64_t r = q2t_rand(&x);
		uint64_t len = (r % 300000) + 1;
		int kind = (int)((r >> 40) % 4);

		if (len > size - off)
			len = size - off;
		if (len > (1 << 20))
			len = 1 << 20;
		if (kind == 0 || kind == 1) {
			for (uint64_t i = 0; i < len; i++)
				buf[i] = kind == 0 ? (uint8_t)q2t_rand(&x) : (uint8_t)((off + i) / 97);
			ASSERT_EQ(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
		} else if (kind == 2) {
			memset(buf, 0, len);
			ASSERT_EQ(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
		}
		off += len;
	}
	free(buf);
	close(fd);
}

struct q2t_read {
	struct ioc_node *n;
	uint8_t *out;
	uint64_t size;
	uint64_t rstate;
	int ret;
};

/* Read all of a node in chunks of varied size into out. */
static void ioc_coroutine_fn q2t_read_co(void *opaque)
{
	struct q2t_read *a = opaque;
	uint64_t x = a->rstate | 1, off = 0;

	while (off < a->size) {
		uint64_t len = q2t_rand(&x) % (300 * 1024) + 1;

		if (len > a->size - off)
			len = a->size - off;
		/* Two pieces, to cross iovec boundaries inside a cluster. */
		struct iovec iov[2] = {
			{ a->out + off, len / 3 },
			{ a->out + off + len / 3, len - len / 3 },
		};
		a->ret = ioc_node_co_preadv(a->n, off, iov, 2, 0);
		if (a->ret < 0)
			return;
		off += len;
	}
}

/* The node reads as raw (a file qemu-img wrote). */
static inline void q2t_compare_raw(struct ioc_node *n, const char *raw)
{
	size_t rlen;
	uint8_t *want = q2t_read_file(raw, &rlen);
	struct q2t_read a = { n, malloc(n->size + 1), n->size, 42, 0 };

	ASSERT_UEQ(n->size, rlen);
	bt_run_co_fn(q2t_read_co, &a);
	ASSERT_OK(a.ret);
	for (size_t i = 0; i < rlen; i++)
		if (a.out[i] != want[i])
			ioc_test_fail(__FILE__, __LINE__, "byte %zu: read %02x, qemu-img %02x", i,
				      a.out[i], want[i]);
	free(a.out);
	free(want);
}

/* The graph's teardown: every file's last case. */
static inline void q2t_teardown(void)
{
	ioc_node_graph_free(q2t_graph);
	q2t_graph = NULL;
}

/* main: qemu-img and qemu-io required (a skip of the whole file
 * otherwise), the cases given, then the teardown. */
#define Q2T_MAIN(...)                                                           \
	int main(void)                                                          \
	{                                                                       \
		static const struct ioc_test q2t_cases[] = {                    \
			__VA_ARGS__ IOC_TEST(q2t_teardown),                     \
		};                                                              \
		q2t_require_qemu();                                             \
		return ioc_test_run(q2t_cases, (int)IOC_ARRAY_SIZE(q2t_cases)); \
	}

#endif /* IOC_Q2_TEST_H */
