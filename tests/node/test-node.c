/*
 * The node layer: options checked against the schema as QEMU words its
 * errors, the graph's names and references, I/O through the file and raw
 * drivers with its statistics, discard and detect-zeroes modes, write
 * notifiers, and the drain holding requests of another I/O thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../blk/blk-test.h"
#include "node/node.h"
#include "qmp/schema.h"

static struct ioc_node_graph *graph;
static char *img_path;

static json_t *parse(const char *kv)
{
	char desc[256];
	json_t *o = ioc__qmp_keyval_parse(kv, NULL, NULL, desc, sizeof(desc));

	if (!o)
		ioc_test_fail(__FILE__, __LINE__, "keyval %s: %s", kv, desc);
	return o;
}

/* Add a node from a keyval string; returns the error text (static) or NULL. */
static const char *add_kv(const char *kv, struct ioc_node **out)
{
	static char err[512];
	json_t *o = parse(kv);
	const char *cls;
	int r;

	if (!ioc_node_check_opts(o, IOC_QMP_KEYVAL, err, sizeof(err))) {
		json_decref(o);
		return err;
	}
	r = ioc_node_add(graph, o, out, &cls, err, sizeof(err));
	json_decref(o);
	return r < 0 ? err : NULL;
}

static void setup(void)
{
	char kv[512];
	struct ioc_node *n;

	if (graph)
		return;
	ASSERT_OK(ioc_node_graph_new(&graph));
	img_path = bt_make_image(NULL, "node.img", 4 << 20, true);
	snprintf(kv, sizeof(kv), "driver=file,node-name=disk,filename=%s", img_path);
	ASSERT_NULL(add_kv(kv, &n));
}

static void test_keyval(void)
{
	char desc[256];
	json_t *o = ioc__qmp_keyval_parse("driver=file,cache.direct=on,filename=a,,b",
					  NULL, NULL, desc, sizeof(desc));

	ASSERT_NOT_NULL(o);
	ASSERT_STR_EQ(json_string_value(json_object_get(o, "filename")), "a,b");
	ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(o, "cache"),
						       "direct")), "on");
	json_decref(o);
	o = ioc__qmp_keyval_parse("iothread,id=io0", "qom-type", NULL, desc, sizeof(desc));
	ASSERT_NOT_NULL(o);
	ASSERT_STR_EQ(json_string_value(json_object_get(o, "qom-type")), "iothread");
	json_decref(o);
	/* QEMU's downstream names keep the dots of their domain; what follows
	 * them nests as anywhere, and a "__" without the prefix's '_' splits. */
	o = ioc__qmp_keyval_parse("__org.iocore_lock=auto,__org.iocore_conf.rbd_cache=false,"
				  "__a.b=1", NULL, NULL, desc, sizeof(desc));
	ASSERT_NOT_NULL(o);
	ASSERT_STR_EQ(json_string_value(json_object_get(o, "__org.iocore_lock")), "auto");
	ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(o, "__org.iocore_conf"),
						       "rbd_cache")), "false");
	ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(o, "__a"), "b")), "1");
	json_decref(o);
	ASSERT_NULL(ioc__qmp_keyval_parse("a=1,b", NULL, NULL, desc, sizeof(desc)));
	o = ioc__qmp_keyval_parse("{\"driver\": \"file\"}", NULL, NULL, desc, sizeof(desc));
	ASSERT_NOT_NULL(o);
	json_decref(o);
}

/* The messages qemu-storage-daemon 7.2 gives for the same options. */
static void test_errors(void)
{
	char kv[512];
	struct ioc_node *n;

	setup();
	snprintf(kv, sizeof(kv), "driver=file,node-name=x,filename=%s,aio=bogus", img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Parameter 'aio' does not accept value 'bogus'");
	ASSERT_STR_EQ(add_kv("driver=bogus,node-name=x", &n),
		     "Parameter 'driver' does not accept value 'bogus'");
	snprintf(kv, sizeof(kv), "driver=file,node-name=disk,filename=%s", img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Duplicate nodes with node-name='disk'");
	snprintf(kv, sizeof(kv), "driver=file,node-name=1bad,filename=%s", img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Invalid node-name: '1bad'");
	snprintf(kv, sizeof(kv), "driver=file,filename=%s", img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "'node-name' must be specified for the root node");
	ASSERT_STR_EQ(add_kv("driver=file,node-name=x,filename=/nonexistent/x", &n),
		     "Could not open '/nonexistent/x': No such file or directory");
	snprintf(kv, sizeof(kv), "driver=file,node-name=x,filename=%s,extra=1", img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Parameter 'extra' is unexpected");
	snprintf(kv, sizeof(kv), "driver=file,node-name=x,filename=%s,read-only=maybe",
		 img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Parameter 'read-only' expects 'on' or 'off'");
	snprintf(kv, sizeof(kv), "driver=file,node-name=x,filename=%s,cache.direct=2",
		 img_path);
	ASSERT_STR_EQ(add_kv(kv, &n), "Parameter 'cache.direct' expects 'on' or 'off'");
	ASSERT_STR_EQ(add_kv("driver=raw,node-name=x,file=nosuch", &n),
		     "Cannot find device='nosuch' nor node-name='nosuch'");
}

struct io_args {
	struct ioc_node *n;
	int ret[8];
};

static void ioc_coroutine_fn io_co(void *arg)
{
	struct io_args *a = arg;
	char buf[8192], zero[8192] = { 0 };

	memset(buf, 0xab, sizeof(buf));
	a->ret[0] = ioc_node_co_pwrite(a->n, 4096, buf, sizeof(buf), 0);
	memset(buf, 0, sizeof(buf));
	a->ret[1] = ioc_node_co_pread(a->n, 4096, buf, sizeof(buf), 0);
	a->ret[2] = buf[0] == (char)0xab && buf[8191] == (char)0xab;
	a->ret[3] = ioc_node_co_pread(a->n, a->n->size - 100, buf, 200, 0);
	a->ret[4] = ioc_node_co_flush(a->n, 0);
	a->ret[5] = ioc_node_co_write_zeroes(a->n, 4096, 4096, IOC_NODE_MAY_UNMAP);
	a->ret[6] = ioc_node_co_pread(a->n, 4096, buf, 4096, 0);
	a->ret[7] = memcmp(buf, zero, 4096) == 0;
}

static void test_io_and_stats(void)
{
	struct io_args a = { 0 };
	struct ioc_node_stats st;

	setup();
	a.n = ioc_node_find(graph, "disk");
	ASSERT_NOT_NULL(a.n);
	ASSERT_UEQ(a.n->size, 4 << 20);
	bt_run_co_fn(io_co, &a);
	ASSERT_EQ(a.ret[0], 0);
	ASSERT_EQ(a.ret[1], 0);
	ASSERT_EQ(a.ret[2], 1);
	ASSERT_EQ(a.ret[3], -EINVAL);
	ASSERT_EQ(a.ret[4], 0);
	ASSERT_EQ(a.ret[5], 0);
	ASSERT_EQ(a.ret[6], 0);
	ASSERT_EQ(a.ret[7], 1);
	ioc_node_get_stats(a.n, &st);
	ASSERT_UEQ(st.op[IOC_NODE_OP_WRITE].ops, 1);
	ASSERT_UEQ(st.op[IOC_NODE_OP_WRITE].bytes, 8192);
	ASSERT_UEQ(st.op[IOC_NODE_OP_READ].ops, 3);
	ASSERT_UEQ(st.op[IOC_NODE_OP_READ].failed, 1);
	ASSERT_UEQ(st.op[IOC_NODE_OP_ZERO].ops, 1);
	ASSERT_UEQ(st.wr_highest, 4096 + 8192);
}

/* raw over the file with an offset: a slice, and writes land at the
 * offset in the file. */
struct slice_args {
	struct ioc_node *n;
	int ret;
};

static void ioc_coroutine_fn slice_co(void *arg)
{
	struct slice_args *a = arg;
	char buf[512];

	memset(buf, 0x5c, sizeof(buf));
	a->ret = ioc_node_co_pwrite(a->n, 0, buf, sizeof(buf), 0);
}

static void test_raw_slice(void)
{
	struct slice_args a = { 0 };
	struct ioc_node *n;
	char buf[512];
	int fd;

	setup();
	ASSERT_NULL(add_kv("driver=raw,node-name=slice,file=disk,offset=1M,size=64k", &n));
	ASSERT_UEQ(n->size, 65536);
	ASSERT_STR_EQ(add_kv("driver=raw,node-name=s2,file=disk,offset=1M,size=4M", &n),
		     "The sum of offset (1048576) and size (4194304) has to be smaller or "
		     "equal to the actual size of the containing file (4194304)");
	a.n = ioc_node_find(graph, "slice");
	bt_run_co_fn(slice_co, &a);
	ASSERT_EQ(a.ret, 0);
	fd = open(img_path, O_RDONLY);
	ASSERT_EQ(pread(fd, buf, sizeof(buf), 1 << 20), 512);
	close(fd);
	ASSERT_EQ(buf[0], 0x5c);
	ASSERT_EQ(buf[511], 0x5c);
	/* The file node is now held by a named parent. */
	const char *cls;
	char err[256];

	ASSERT_EQ(ioc_node_del(graph, "disk", &cls, err, sizeof(err)), -EBUSY);
	ASSERT_STR_EQ(err, "Block device disk is in use");
	ASSERT_EQ(ioc_node_del(graph, "slice", &cls, err, sizeof(err)), 0);
	ASSERT_EQ(ioc_node_del(graph, "nosuch", &cls, err, sizeof(err)), -ENOENT);
	ASSERT_STR_EQ(err, "Failed to find node with node-name='nosuch'");
}

/* ---- notifiers -------------------------------------------------------- */

struct seen {
	struct ioc_node_notifier nt;
	unsigned calls;
	uint64_t off, len;
	enum ioc_node_op op;
};

static int seen_fn(struct ioc_node_notifier *nt, struct ioc_node *n, enum ioc_node_op op,
		   uint64_t off, uint64_t len, int ret)
{
	struct seen *s = ioc_container_of(nt, struct seen, nt);

	s->calls++;
	s->off = off;
	s->len = len;
	s->op = op;
	return 0;
}

static void ioc_coroutine_fn notify_co(void *arg)
{
	struct ioc_node *n = arg;
	char buf[4096] = { 0 };

	buf[1] = 1;
	ioc_node_co_pwrite(n, 8192, buf, sizeof(buf), 0);
	ioc_node_co_discard(n, 65536, 4096, 0);
	ioc_node_co_pread(n, 0, buf, sizeof(buf), 0);
}

static void test_notifiers(void)
{
	struct ioc_node *n;
	struct seen s = { .nt.fn = seen_fn };

	setup();
	n = ioc_node_find(graph, "disk");
	ioc_node_add_notifier(n, &s.nt);
	bt_run_co_fn(notify_co, n);
	/* The write and the discard (ignored by discard=ignore, but still
	 * a change for a tracker to see), not the read. */
	ASSERT_EQ(s.calls, 2);
	ASSERT_EQ(s.op, IOC_NODE_OP_DISCARD);
	ASSERT_UEQ(s.off, 65536);
	ioc_node_remove_notifier(n, &s.nt);
	bt_run_co_fn(notify_co, n);
	ASSERT_EQ(s.calls, 2);
}

/* detect-zeroes=unmap turns a zero write into write-zeroes. */
static void ioc_coroutine_fn dz_co(void *arg)
{
	struct ioc_node *n = arg;
	char buf[65536] = { 0 };

	ioc_node_co_pwrite(n, 0, buf, sizeof(buf), 0);
}

static void test_detect_zeroes(void)
{
	char kv[512];
	struct ioc_node *n;
	struct ioc_node_stats st;
	const char *cls;
	char err[256];

	setup();
	snprintf(kv, sizeof(kv), "driver=file,node-name=dz,filename=%s,detect-zeroes=unmap,"
		 "discard=unmap", img_path);
	ASSERT_NULL(add_kv(kv, &n));
	bt_run_co_fn(dz_co, n);
	ioc_node_get_stats(n, &st);
	ASSERT_UEQ(st.op[IOC_NODE_OP_WRITE].ops, 0);
	ASSERT_UEQ(st.op[IOC_NODE_OP_ZERO].ops, 1);
	ASSERT_EQ(ioc_node_del(graph, "dz", &cls, err, sizeof(err)), 0);
}

/* ---- the drain across threads ------------------------------------------ */

struct drain_args {
	struct ioc_node *n;
	_Atomic int phase;          /* 1: entered; 2: past the held enter */
	int held_ret;
	int efd;
};

static void ioc_coroutine_fn drain_co(void *arg)
{
	struct drain_args *a = arg;
	char b[512];

	a->held_ret = ioc_node_co_enter(a->n);
	if (a->held_ret == 0) { /* a refused request is not inside */
		ioc_node_co_pread(a->n, 0, b, sizeof(b), 0);
		ioc_node_leave(a->n);
	}
	/* Release: pairs with the acquire load in test_drain(). */
	atomic_store_explicit(&a->phase, 2, memory_order_release);
	uint64_t one = 1;

	ASSERT_EQ(write(a->efd, &one, sizeof(one)), 8);
}

static int start_drain_co(void *arg)
{
	struct ioc_co *co = ioc_co_create(drain_co, arg);

	ioc_co_enter(co);
	return 0;
}

static void test_drain(void)
{
	struct ioc_iothread *t;
	struct drain_args a = { .efd = eventfd(0, 0) };
	uint64_t v;

	setup();
	a.n = ioc_node_find(graph, "disk");
	ASSERT_OK(ioc_iothread_start(&t, NULL));
	ioc_node_set_gate(a.n, IOC_NODE_GATE_HOLD);
	ASSERT_OK(ioc_iothread_call(t, start_drain_co, &a));
	/* The coroutine waits at the gate: nothing has run past enter (its
	 * phase is only stored after leave). */
	ASSERT_EQ(atomic_load_explicit(&a.phase, memory_order_acquire), 0);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_OPEN);
	ASSERT_EQ(read(a.efd, &v, sizeof(v)), 8);
	ASSERT_EQ(atomic_load_explicit(&a.phase, memory_order_acquire), 2);
	ASSERT_EQ(a.held_ret, 0);
	/* SHUT refuses. */
	ioc_node_set_gate(a.n, IOC_NODE_GATE_SHUT);
	ASSERT_OK(ioc_iothread_call(t, start_drain_co, &a));
	ASSERT_EQ(read(a.efd, &v, sizeof(v)), 8);
	ASSERT_EQ(a.held_ret, -ESHUTDOWN);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_OPEN);
	ioc_node_graph_detach_loop(graph, ioc_iothread_loop(t));
	ioc_iothread_stop(t);
	close(a.efd);
}

/* A change outside a coroutine: a HOLD cuts it short on its loop, so the
 * drain does not wait for its owner to leave. */
struct cut_args {
	struct ioc_node *n;
	struct ioc_node_cut cut;
	bool entered;
	_Atomic int cuts;           /* times fn ran */
};

static void cut_fn(struct ioc_node_cut *cut)
{
	struct cut_args *a = ioc_container_of(cut, struct cut_args, cut);

	ioc_node_leave_cut(a->n, cut);
	/* Relaxed: read after the gate change returned (its latch orders it). */
	atomic_fetch_add_explicit(&a->cuts, 1, memory_order_relaxed);
}

static int enter_cut_fn(void *arg)
{
	struct cut_args *a = arg;

	a->entered = ioc_node_enter_cut(a->n, &a->cut);
	return 0;
}

static void test_drain_cut(void)
{
	struct ioc_iothread *t;
	struct cut_args a = { .cut.fn = cut_fn };

	setup();
	a.n = ioc_node_find(graph, "disk");
	ASSERT_OK(ioc_iothread_start(&t, NULL));
	ASSERT_OK(ioc_iothread_call(t, enter_cut_fn, &a));
	ASSERT_TRUE(a.entered);
	/* Returns only if the cut left: the loop never leaves on its own. */
	ioc_node_set_gate(a.n, IOC_NODE_GATE_HOLD);
	ASSERT_EQ(atomic_load_explicit(&a.cuts, memory_order_relaxed), 1);
	/* Not open: refused, and nothing to cut. */
	ASSERT_OK(ioc_iothread_call(t, enter_cut_fn, &a));
	ASSERT_FALSE(a.entered);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_SHUT);
	ASSERT_EQ(atomic_load_explicit(&a.cuts, memory_order_relaxed), 1);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_OPEN);
	/* Open again: a cut enters and leaves by itself; a HOLD then finds
	 * nothing to cut. */
	ASSERT_OK(ioc_iothread_call(t, enter_cut_fn, &a));
	ASSERT_TRUE(a.entered);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_SHUT);
	ASSERT_EQ(atomic_load_explicit(&a.cuts, memory_order_relaxed), 2);
	ioc_node_set_gate(a.n, IOC_NODE_GATE_OPEN);
	ioc_node_graph_detach_loop(graph, ioc_iothread_loop(t));
	ioc_iothread_stop(t);
}

static void test_info(void)
{
	json_t *j;

	setup();
	j = ioc_node_info_json(ioc_node_find(graph, "disk"));
	ASSERT_NOT_NULL(j);
	ASSERT_STR_EQ(json_string_value(json_object_get(j, "drv")), "file");
	ASSERT_STR_EQ(json_string_value(json_object_get(j, "file")), img_path);
	ASSERT_EQ(json_integer_value(json_object_get(json_object_get(j, "image"),
						     "virtual-size")), 4 << 20);
	json_decref(j);
}

static void test_teardown(void)
{
	setup();
	ioc_node_graph_free(graph);
	graph = NULL;
	unlink(img_path);
	free(img_path);
}

IOC_TEST_MAIN(
	IOC_TEST(test_keyval),
	IOC_TEST(test_errors),
	IOC_TEST(test_io_and_stats),
	IOC_TEST(test_raw_slice),
	IOC_TEST(test_notifiers),
	IOC_TEST(test_detect_zeroes),
	IOC_TEST(test_drain),
	IOC_TEST(test_drain_cut),
	IOC_TEST(test_info),
	IOC_TEST(test_teardown))
