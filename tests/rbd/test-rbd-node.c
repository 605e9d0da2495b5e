/*
 * The rbd driver against a live cluster (started by test-rbd-node.sh,
 * which names it in CEPH_CONF and its OSD in CEPH_OSD_PID).  One phase per
 * run, chosen by argv[1], so the shell can check the image with qemu and
 * rbd(8) between them:
 *   io      refusals at open, then writes in coroutines on two loops,
 *           read back from the other loop; discard and write-zeroes read
 *           as zeroes; a second writer refused; resize; every change
 *           mirrored into $CEPH_DIR/expect.raw for qemu-img compare, and
 *           the block status map written to $CEPH_DIR/map.txt
 *   verify  what qemu-io wrote through qemu-nbd reads back here
 *   snap    snapshot rbd/img@s0 opens read-only and reads its data
 *   fault   with the OSD stopped, requests fail with EIO after the timeout
 * Nodes are opened through the node layer (ioc_node_add, with its
 * option checks against the driver's spec) and requests go through
 * ioc_node_co_*, bracketed with enter and leave as a front end does.
 */
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tap.h"
#include "iocore/co.h"
#include "iocore/loop.h"
#include "node/node.h"
#include "node/rbd.h"

#define MiB (1024 * 1024ull)

static const char *conf, *dir;
static struct ioc_node_graph *graph;

/* ---- loops on threads, and coroutines run on them -------------------- */

struct worker {
	pthread_t t;
	struct ioc_loop *loop;
	sem_t ready;
};
static struct worker workers[2];

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	if (ioc_loop_new(&w->loop, NULL) < 0)
		ioc_test_fail(__FILE__, __LINE__, "ioc_loop_new");
	sem_post(&w->ready);
	ioc_loop_run(w->loop);
	ioc_loop_free(w->loop);
	return NULL;
}

static void workers_start(void)
{
	for (int i = 0; i < 2; i++) {
		sem_init(&workers[i].ready, 0, 0);
		ASSERT_EQ(pthread_create(&workers[i].t, NULL, worker_main, &workers[i]), 0);
		sem_wait(&workers[i].ready);
	}
}

static void workers_stop(void)
{
	for (int i = 0; i < 2; i++) {
		ioc_loop_stop(workers[i].loop);
		pthread_join(workers[i].t, NULL);
	}
}

enum job_kind { J_WRITE, J_READ, J_DISCARD, J_ZERO, J_FLUSH, J_STATUS, J_TRUNCATE };

struct job {
	struct ioc_node *n;
	enum job_kind kind;
	uint64_t off, len;
	uint32_t flags;
	uint8_t *buf;
	int result;
	uint64_t pnum;          /* J_STATUS */
	sem_t *done;
};

static void ioc_coroutine_fn job_co(void *opaque)
{
	struct job *j = opaque;
	struct iovec iov[2] = {
		{ j->buf, j->len / 2 }, { j->buf + j->len / 2, j->len - j->len / 2 },
	};
	unsigned depth;

	j->result = ioc_node_co_enter(j->n);
	if (j->result < 0) {
		sem_post(j->done);
		return;
	}
	switch (j->kind) {
	case J_WRITE:
		j->result = ioc_node_co_pwritev(j->n, j->off, iov, 2, j->flags);
		break;
	case J_READ:
		j->result = ioc_node_co_preadv(j->n, j->off, iov, 2, 0);
		break;
	case J_DISCARD:
		j->result = ioc_node_co_discard(j->n, j->off, j->len, 0);
		break;
	case J_ZERO:
		j->result = ioc_node_co_write_zeroes(j->n, j->off, j->len, j->flags);
		break;
	case J_FLUSH:
		j->result = ioc_node_co_flush(j->n, 0);
		break;
	case J_STATUS:
		j->result = ioc_node_co_block_status(j->n, j->off, j->len, &j->pnum,
						     &depth);
		if (j->result >= 0 && depth != 1)
			j->result = -EBADMSG;
		break;
	case J_TRUNCATE:
		j->result = ioc_node_co_truncate(j->n, j->len);
		break;
	}
	ioc_node_leave(j->n);
	sem_post(j->done);
}

static int start_job(void *arg)
{
	struct ioc_co *co = ioc_co_create(job_co, arg);

	if (!co)
		return -ENOMEM;
	ioc_co_enter(co);
	return 0;
}

/* Start jobs[0..n) on worker w's loop, all at once, and wait for them. */
static void run_jobs(int w, struct job *jobs, int n)
{
	sem_t done;

	sem_init(&done, 0, 0);
	for (int i = 0; i < n; i++) {
		jobs[i].done = &done;
		ASSERT_OK(ioc_loop_call(workers[w].loop, start_job, &jobs[i]));
	}
	for (int i = 0; i < n; i++)
		sem_wait(&done);
	sem_destroy(&done);
}

static int run1(int w, struct ioc_node *n, enum job_kind k, uint64_t off, uint64_t len,
		uint8_t *buf, uint32_t flags)
{
	struct job j = { .n = n, .kind = k, .off = off, .len = len, .buf = buf,
			 .flags = flags };

	run_jobs(w, &j, 1);
	return j.result;
}

/* ---- nodes ----------------------------------------------------------- */

static json_t *opts_for(const char *pool, const char *image, const char *extra)
{
	json_error_t je;
	json_t *o = extra ? json_loads(extra, 0, &je) : json_object();

	ASSERT_NOT_NULL(o);
	json_object_set_new(o, "pool", json_string(pool));
	json_object_set_new(o, "image", json_string(image));
	if (!json_object_get(o, "conf"))
		json_object_set_new(o, "conf", json_string(conf));
	return o;
}

/* blockdev-add of opts as node "rbdN", read-only or not, discard=unmap. */
static int open_node(struct ioc_node **out, bool ro, json_t *opts, char *err, size_t len)
{
	static unsigned seq;
	const char *cls;
	char name[32];
	int r;

	snprintf(name, sizeof(name), "rbd%u", seq++);
	json_object_set_new(opts, "driver", json_string("rbd"));
	json_object_set_new(opts, "node-name", json_string(name));
	json_object_set_new(opts, "read-only", json_boolean(ro));
	json_object_set_new(opts, "discard", json_string("unmap"));
	err[0] = '\0';
	r = ioc_node_add(graph, opts, out, &cls, err, len);
	json_decref(opts);
	if (r < 0)
		*out = NULL;
	return r;
}

static void close_node(struct ioc_node *n)
{
	const char *cls;
	char err[256], name[IOC_NODE_NAME_MAX];

	snprintf(name, sizeof(name), "%s", n->name);
	if (ioc_node_del(graph, name, &cls, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "blockdev-del %s: %s", name, err);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull | 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static int expect_fd = -1;

static void expect_write(uint64_t off, const void *buf, size_t len)
{
	ASSERT_UEQ(pwrite(expect_fd, buf, len, (off_t)off), len);
}

static void expect_zero(uint64_t off, size_t len)
{
	ASSERT_OK(fallocate(expect_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			    (off_t)off, (off_t)len));
}

/* ---- phase io -------------------------------------------------------- */

static void test_refusals(void)
{
	struct ioc_node *n;
	char err[512], bad[600];
	int r;

	r = open_node(&n, false, opts_for("nopool", "img", NULL), err, sizeof(err));
	ioc_test_diag("wrong pool: %d %s", r, err);
	ASSERT_EQ(r, -ENOENT);
	ASSERT_NOT_NULL(strstr(err, "error opening pool nopool"));

	r = open_node(&n, false, opts_for("rbd", "noimg", NULL), err, sizeof(err));
	ioc_test_diag("wrong image: %d %s", r, err);
	ASSERT_EQ(r, -ENOENT);
	ASSERT_NOT_NULL(strstr(err, "error reading header from noimg"));

	snprintf(bad, sizeof(bad), "{\"conf\": \"%s/no-such.conf\"}", dir);
	r = open_node(&n, false, opts_for("rbd", "img", bad), err, sizeof(err));
	ioc_test_diag("wrong conf: %d %s", r, err);
	ASSERT_EQ(r, -ENOENT);
	ASSERT_NOT_NULL(strstr(err, "error reading conf file"));

	/* A user the cluster cannot authenticate: cephx asked for, no key. */
	r = open_node(&n, false, opts_for("rbd", "img",
		"{\"user\": \"nobody\", \"auth-client-required\": [\"cephx\"],"
		" \"__org.iocore_timeout\": 10}"), err, sizeof(err));
	ioc_test_diag("wrong user: %d %s", r, err);
	ASSERT_LT(r, 0);
	ASSERT_NOT_NULL(strstr(err, "error connecting"));

	r = open_node(&n, false, opts_for("rbd", "img", "{\"key-secret\": \"sec0\"}"),
		      err, sizeof(err));
	ASSERT_EQ(r, -ENOTSUP);
	ASSERT_NOT_NULL(strstr(err, "key-secret"));

	r = open_node(&n, false, opts_for("rbd", "img", "{\"snapshot\": \"s0\"}"),
		      err, sizeof(err));
	ASSERT_EQ(r, -EINVAL);
	ASSERT_STR_EQ(err, "rbd snapshots are always read-only");

	/* The node layer checks the driver's spec. */
	r = open_node(&n, false, opts_for("rbd", "img", "{\"bogus\": 1}"), err, sizeof(err));
	ASSERT_EQ(r, -EINVAL);
	ASSERT_STR_EQ(err, "Parameter 'bogus' is unexpected");
	r = open_node(&n, false, opts_for("rbd", "img", "{\"__org.iocore_timeout\": \"x\"}"),
		      err, sizeof(err));
	ioc_test_diag("timeout of the wrong type: %s", err);
	ASSERT_EQ(r, -EINVAL);
}

/* A node opened from an "rbd:" file name, as QEMU's would be. */
static void test_filename(void)
{
	char name[600], err[512];
	struct ioc_node *n;
	json_t *o;

	snprintf(name, sizeof(name), "rbd:rbd/img:conf=%s:rbd_cache=false", conf);
	o = ioc__rbd_parse_filename(name, err, sizeof(err));
	if (!o)
		ioc_test_fail(__FILE__, __LINE__, "%s: %s", name, err);
	ASSERT_OK(open_node(&n, true, o, err, sizeof(err)));
	ASSERT_UEQ(n->size, 1024 * MiB);
	ASSERT_TRUE(n->read_only);
	close_node(n);
}

#define NJOBS 8
static struct ioc_node *node;

static void test_open(void)
{
	char err[512], path[512];

	ASSERT_OK(open_node(&node, false, opts_for("rbd", "img", NULL), err, sizeof(err)));
	ASSERT_UEQ(node->size, 1024 * MiB);
	ASSERT_TRUE(node->can_discard);
	ASSERT_TRUE(node->can_block_status);
	snprintf(path, sizeof(path), "%s/expect.raw", dir);
	expect_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ASSERT_GE(expect_fd, 0);
	ASSERT_OK(ftruncate(expect_fd, (off_t)node->size));
	workers_start();
}

/* Eight writes at once on each loop (sizes from 4 KiB to 1.5 MiB,
 * crossing object boundaries), each read back from the other loop. */
static void test_write_read(void)
{
	struct job w[2][NJOBS], r[2][NJOBS];

	for (int l = 0; l < 2; l++)
		for (int i = 0; i < NJOBS; i++) {
			uint64_t len = (uint64_t)(4096 << (i % 6)) * (i == 7 ? 96 : 1);
			uint64_t off = (uint64_t)(l * NJOBS + i) * 6 * MiB + (4 * MiB - 8192);

			w[l][i] = (struct job){ .n = node, .kind = J_WRITE, .off = off,
						.len = len, .buf = malloc(len),
						.flags = i == 3 ? IOC_NODE_FUA : 0 };
			fill(w[l][i].buf, len, (uint64_t)(l * NJOBS + i) + 1);
			r[l][i] = w[l][i];
			r[l][i].kind = J_READ;
			r[l][i].buf = calloc(1, len);
		}
	run_jobs(0, w[0], NJOBS);
	run_jobs(1, w[1], NJOBS);
	for (int l = 0; l < 2; l++)
		for (int i = 0; i < NJOBS; i++) {
			ASSERT_OK(w[l][i].result);
			expect_write(w[l][i].off, w[l][i].buf, w[l][i].len);
		}
	run_jobs(1, r[0], NJOBS);
	run_jobs(0, r[1], NJOBS);
	for (int l = 0; l < 2; l++)
		for (int i = 0; i < NJOBS; i++) {
			ASSERT_OK(r[l][i].result);
			ASSERT_MEM_EQ(r[l][i].buf, w[l][i].buf, w[l][i].len);
			free(w[l][i].buf);
			free(r[l][i].buf);
		}
	ASSERT_OK(run1(0, node, J_FLUSH, 0, 0, NULL, 0));
}

static void check_zero(uint64_t off, uint64_t len)
{
	uint8_t *b = malloc(len), *z = calloc(1, len);

	memset(b, 0xee, len);
	ASSERT_OK(run1(1, node, J_READ, off, len, b, 0));
	ASSERT_MEM_EQ(b, z, len);
	free(b);
	free(z);
}

/* Discard a whole object and an unaligned piece; write zeroes with and
 * without MAY_UNMAP; each reads back as zeroes. */
static void test_discard_zeroes(void)
{
	size_t len = 2 * MiB;
	uint8_t *b = malloc(len);

	fill(b, len, 99);
	/* Data at 200 MiB .. 210 MiB first. */
	for (int i = 0; i < 5; i++) {
		ASSERT_OK(run1(0, node, J_WRITE, 200 * MiB + (uint64_t)i * len, len, b, 0));
		expect_write(200 * MiB + (uint64_t)i * len, b, len);
	}
	ASSERT_OK(run1(0, node, J_DISCARD, 204 * MiB, 4 * MiB, NULL, 0));
	expect_zero(204 * MiB, 4 * MiB);
	check_zero(204 * MiB, 4 * MiB);
	ASSERT_OK(run1(1, node, J_DISCARD, 200 * MiB + 12345, 100000, NULL, 0));
	expect_zero(200 * MiB + 12345, 100000);
	check_zero(200 * MiB + 12345, 100000);
	ASSERT_OK(run1(0, node, J_ZERO, 201 * MiB + 3, 300000, NULL, 0));
	expect_zero(201 * MiB + 3, 300000);
	check_zero(201 * MiB + 3, 300000);
	ASSERT_OK(run1(1, node, J_ZERO, 209 * MiB, MiB, NULL, IOC_NODE_MAY_UNMAP));
	expect_zero(209 * MiB, MiB);
	check_zero(209 * MiB, MiB);
	ASSERT_EQ(run1(1, node, J_ZERO, 209 * MiB, MiB, NULL, IOC_NODE_NO_FALLBACK),
		  -ENOTSUP);
	free(b);
}

/* The whole image's map, as "offset length" lines of data runs, for the
 * shell to compare with rbd diff --whole-object. */
static void test_block_status(void)
{
	char path[512];
	FILE *f;
	uint64_t off = 0, runs = 0, data = 0, dstart = 0;
	bool in_data = false;

	snprintf(path, sizeof(path), "%s/map.txt", dir);
	f = fopen(path, "w");
	ASSERT_NOT_NULL(f);
	while (off < node->size) {
		struct job j = { .n = node, .kind = J_STATUS, .off = off,
				 .len = node->size - off };

		run_jobs(runs & 1, &j, 1);
		ASSERT_GE(j.result, 0);
		ASSERT_UGT(j.pnum, 0);
		ASSERT_ULE(j.pnum, node->size - off);
		ASSERT_TRUE(j.result & IOC_NODE_ST_ALLOCATED);
		if (j.result & IOC_NODE_ST_DATA) {
			if (!in_data)
				dstart = off;
			in_data = true;
			data += j.pnum;
		} else {
			ASSERT_TRUE(j.result & IOC_NODE_ST_ZERO);
			if (in_data)
				fprintf(f, "%" PRIu64 " %" PRIu64 "\n", dstart, off - dstart);
			in_data = false;
		}
		off += j.pnum;
		runs++;
	}
	if (in_data)
		fprintf(f, "%" PRIu64 " %" PRIu64 "\n", dstart, off - dstart);
	fclose(f);
	ioc_test_diag("%" PRIu64 " status calls, %" PRIu64 " MiB data", runs, (uint64_t)(data / MiB));
	ASSERT_UGT(data, 0);
	ASSERT_ULT(data, node->size);
}

/* A second writable node on the image is refused (it names the owner);
 * a read-only one opens and reads the same data. */
static void test_second_writer(void)
{
	struct ioc_node *n2;
	char err[512];
	uint8_t a[4096], b[4096];
	int r;

	r = open_node(&n2, false, opts_for("rbd", "img", "{\"__org.iocore_timeout\": 30}"),
		      err, sizeof(err));
	ioc_test_diag("second writer: %d %s", r, err);
	ASSERT_EQ(r, -EBUSY);
	ASSERT_NOT_NULL(strstr(err, "locked by another client"));

	/* QEMU, which writes with librbd's cooperative locking, asks for
	 * the lock and is refused: its write fails, nothing is written. */
	{
		char cmd[1024];

		snprintf(cmd, sizeof(cmd), "timeout 60 qemu-io -f raw -c 'write -P 0x77 0 4k' "
			 "'rbd:rbd/img:conf=%s' >%s/qemu-lock.log 2>&1", conf, dir);
		r = system(cmd);
		snprintf(cmd, sizeof(cmd), "sed 's/^/# qemu-io: /' %s/qemu-lock.log", dir);
		if (system(cmd) != 0)
			ioc_test_diag("no qemu-io log");
		ASSERT_NE(r, 0);
		ASSERT_NE(WEXITSTATUS(r), 124); /* refused, not timed out */
	}

	ASSERT_OK(open_node(&n2, true, opts_for("rbd", "img", NULL), err, sizeof(err)));
	ASSERT_OK(run1(0, node, J_READ, 4 * MiB - 8192, sizeof(a), a, 0));
	ASSERT_OK(run1(1, n2, J_READ, 4 * MiB - 8192, sizeof(b), b, 0));
	ASSERT_MEM_EQ(a, b, sizeof(a));
	close_node(n2);
}

static void test_resize(void)
{
	ASSERT_OK(run1(0, node, J_TRUNCATE, 0, 1536 * MiB, NULL, 0));
	ASSERT_UEQ(node->size, 1536 * MiB);
	check_zero(1536 * MiB - 4096, 4096);
	ASSERT_OK(run1(1, node, J_TRUNCATE, 0, 1024 * MiB, NULL, 0));
	ASSERT_UEQ(node->size, 1024 * MiB);
}

static void test_close(void)
{
	close_node(node);
	node = NULL;
	workers_stop();
	close(expect_fd);
}

/* ---- phase verify: qemu-io wrote 0x5a over [100 MiB, +1 MiB) ----------- */

static void test_verify(void)
{
	char err[512];
	uint8_t *b = malloc(MiB), *e = malloc(MiB);

	workers_start();
	ASSERT_OK(open_node(&node, true, opts_for("rbd", "img", NULL), err, sizeof(err)));
	memset(e, 0x5a, MiB);
	ASSERT_OK(run1(0, node, J_READ, 100 * MiB, MiB, b, 0));
	ASSERT_MEM_EQ(b, e, MiB);
	close_node(node);
	workers_stop();
	free(b);
	free(e);
}

/* ---- phase snap: rbd/img@s0 was taken after phase io, then the image
 * was overwritten at 0 by qemu-io with 0x33 ---------------------------- */

static void test_snap(void)
{
	char err[512];
	struct ioc_node *s, *h;
	uint8_t a[4096], b[4096], c[4096];

	workers_start();
	ASSERT_OK(open_node(&s, true, opts_for("rbd", "img", "{\"snapshot\": \"s0\"}"),
			    err, sizeof(err)));
	ASSERT_OK(open_node(&h, true, opts_for("rbd", "img", NULL), err, sizeof(err)));
	ASSERT_OK(run1(0, s, J_READ, 4 * MiB - 8192, sizeof(a), a, 0));
	fill(c, sizeof(c), 1);
	ASSERT_MEM_EQ(a, c, sizeof(a));
	ASSERT_OK(run1(1, h, J_READ, 4 * MiB - 8192, sizeof(b), b, 0));
	memset(c, 0x33, sizeof(c));
	ASSERT_MEM_EQ(b, c, sizeof(b));
	close_node(s);
	close_node(h);
	workers_stop();
}

/* ---- phase fault ------------------------------------------------------ */

static void test_fault(void)
{
	const char *pid_s = getenv("CEPH_OSD_PID");
	char err[512];
	uint8_t b[65536];
	pid_t osd;
	int r;

	if (!pid_s)
		IOC_SKIP("CEPH_OSD_PID not set");
	osd = (pid_t)atoi(pid_s);
	workers_start();
	ASSERT_OK(open_node(&node, false, opts_for("rbd", "img",
		"{\"__org.iocore_timeout\": 3, \"cache\": {\"direct\": true}}"),
		err, sizeof(err)));
	fill(b, sizeof(b), 7);
	ASSERT_OK(run1(0, node, J_WRITE, 300 * MiB, sizeof(b), b, 0));
	ASSERT_OK(kill(osd, SIGSTOP));
	r = run1(0, node, J_WRITE, 300 * MiB, sizeof(b), b, 0);
	ioc_test_diag("write with the OSD stopped: %d", r);
	ASSERT_EQ(r, -EIO);
	r = run1(1, node, J_READ, 300 * MiB, sizeof(b), b, 0);
	ioc_test_diag("read with the OSD stopped: %d", r);
	ASSERT_EQ(r, -EIO);
	ASSERT_OK(kill(osd, SIGCONT));
	ASSERT_OK(run1(1, node, J_READ, 300 * MiB, sizeof(b), b, 0));
	close_node(node);
	workers_stop();
}

int main(int argc, char **argv)
{
	static const struct ioc_test io[] = {
		IOC_TEST(test_refusals),
		IOC_TEST(test_filename),
		IOC_TEST(test_open),
		IOC_TEST(test_write_read),
		IOC_TEST(test_discard_zeroes),
		IOC_TEST(test_block_status),
		IOC_TEST(test_second_writer),
		IOC_TEST(test_resize),
		IOC_TEST(test_close),
	};
	static const struct ioc_test verify[] = { IOC_TEST(test_verify) };
	static const struct ioc_test snap[] = { IOC_TEST(test_snap) };
	static const struct ioc_test fault[] = { IOC_TEST(test_fault) };
	const char *phase = argc > 1 ? argv[1] : "io";

	conf = getenv("CEPH_CONF");
	dir = getenv("CEPH_DIR");
	if (!conf || !dir)
		IOC_SKIP_ALL("no cluster (run by test-rbd-node.sh)");
	signal(SIGPIPE, SIG_IGN);
	if (ioc_node_graph_new(&graph) < 0)
		IOC_SKIP_ALL("ioc_node_graph_new failed");
	if (!strcmp(phase, "io"))
		return ioc_test_run(io, (int)IOC_ARRAY_SIZE(io));
	if (!strcmp(phase, "verify"))
		return ioc_test_run(verify, 1);
	if (!strcmp(phase, "snap"))
		return ioc_test_run(snap, 1);
	if (!strcmp(phase, "fault"))
		return ioc_test_run(fault, 1);
	fprintf(stderr, "phases: io verify snap fault\n");
	return 2;
}
