/*
 * bench-qcow2: random 4 KiB reads through a node on 1..N loops, each loop
 * its own thread with `depth` coroutines, for a fixed number of reads per
 * loop; prints reads per second.  The node is a qcow2 image (warm L2
 * cache: the hit path without the lock) or, with "raw", the file itself,
 * for the cost the format adds.  NOTES.md has the runs.
 *
 *   bench-qcow2 IMAGE qcow2|raw LOOPS DEPTH READS_PER_LOOP
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/node.h"

struct worker {
	struct ioc_node *n;
	unsigned depth, reads, id;
	unsigned done_co;
	int err;
};

struct one {
	struct worker *w;
	uint64_t x;
};

static void ioc_coroutine_fn read_co(void *opaque)
{
	struct one *o = opaque;
	struct worker *w = o->w;
	char buf[4096] __attribute__((aligned(4096)));
	uint64_t blocks = w->n->size / 4096;

	for (unsigned i = 0; i < w->reads / w->depth; i++) {
		o->x ^= o->x << 13;
		o->x ^= o->x >> 7;
		o->x ^= o->x << 17;
		int r = ioc_node_co_pread(w->n, (o->x % blocks) * 4096, buf, 4096, 0);

		if (r < 0)
			w->err = r;
	}
	w->done_co++;
}

static void *worker(void *opaque)
{
	struct worker *w = opaque;
	struct ioc_loop *loop;
	struct one *os = calloc(w->depth, sizeof(*os));

	if (ioc_loop_new(&loop, NULL) < 0 || !os) {
		w->err = -ENOMEM;
		return NULL;
	}
	for (unsigned i = 0; i < w->depth; i++) {
		os[i] = (struct one){ w, 0x9e3779b97f4a7c15ull * (w->id * 1000 + i + 1) };
		ioc_co_enter(ioc_co_create(read_co, &os[i]));
	}
	while (w->done_co < w->depth)
		ioc_loop_poll(loop, true);
	ioc_node_graph_detach_loop(w->n->graph, loop);
	ioc_loop_free(loop);
	free(os);
	return NULL;
}

int main(int argc, char **argv)
{
	struct ioc_node_graph *g;
	struct ioc_node *n;
	struct worker ws[64];
	pthread_t t[64];
	char js[1024], err[512];
	const char *cls;
	json_t *o;
	unsigned loops, depth, reads;
	int64_t t0, t1;

	if (argc != 6) {
		fprintf(stderr, "usage: %s IMAGE qcow2|raw LOOPS DEPTH READS_PER_LOOP\n", argv[0]);
		return 2;
	}
	loops = (unsigned)atoi(argv[3]);
	depth = (unsigned)atoi(argv[4]);
	reads = (unsigned)atoi(argv[5]);
	if (!loops || loops > 64 || !depth) {
		fprintf(stderr, "1..64 loops, depth 1 or more\n");
		return 2;
	}
	if (strcmp(argv[2], "raw") == 0)
		snprintf(js, sizeof(js), "{\"driver\":\"file\",\"node-name\":\"b\",\"read-only\":true,"
			 "\"filename\":\"%s\"}", argv[1]);
	else
		snprintf(js, sizeof(js), "{\"driver\":\"qcow2\",\"node-name\":\"b\",\"read-only\":"
			 "true,\"file\":{\"driver\":\"file\",\"filename\":\"%s\"}}", argv[1]);
	o = json_loads(js, 0, NULL);
	if (ioc_node_graph_new(&g) < 0 || !o || !ioc_node_check_opts(o, 0, err, sizeof(err)) ||
	    ioc_node_add(g, o, &n, &cls, err, sizeof(err)) < 0) {
		fprintf(stderr, "open: %s\n", err);
		return 1;
	}
	/* One pass to warm the cache (and the page cache). */
	ws[0] = (struct worker){ n, depth, reads, 0, 0, 0 };
	worker(&ws[0]);
	t0 = ioc_now_ns();
	for (unsigned i = 0; i < loops; i++) {
		ws[i] = (struct worker){ n, depth, reads, i + 1, 0, 0 };
		pthread_create(&t[i], NULL, worker, &ws[i]);
	}
	for (unsigned i = 0; i < loops; i++) {
		pthread_join(t[i], NULL);
		if (ws[i].err) {
			fprintf(stderr, "read: %s\n", ioc_strerror(ws[i].err));
			return 1;
		}
	}
	t1 = ioc_now_ns();
	printf("%s loops=%u depth=%u reads=%u: %.0f reads/s\n", argv[2], loops, depth,
	       loops * (reads / depth * depth),
	       (double)loops * (reads / depth * depth) / ((double)(t1 - t0) / 1e9));
	json_decref(o);
	ioc_node_graph_free(g);
	return 0;
}
