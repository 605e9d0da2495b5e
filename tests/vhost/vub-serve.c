/*
 * A small vhost-user-blk server for the tests: opens a file node and
 * serves it with the export until SIGTERM or SIGINT.
 *
 *   vub-serve --socket PATH --file IMAGE [--queues N] [--iothreads K]
 *             [--read-only] [--serial S] [--logical-block-size B]
 *             [--node-opts ,KEY=VALUE...]   (appended to the file node's)
 *
 * Prints "ready" on stdout once the socket listens.  The export's log
 * lines go to stderr.  Queues are spread over K I/O threads (0: all on
 * the main loop).  At exit it prints each queue's request count and each
 * I/O thread's polling counters to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "node/node.h"
#include "qmp/schema.h"
#include "vhost-user-blk.h"

static struct ioc_loop *main_loop;
static int sfd;

static void on_signal(void *opaque)
{
	struct signalfd_siginfo si;

	if (read(sfd, &si, sizeof(si)) == sizeof(si))
		ioc_loop_stop(main_loop);
}

static void log_line(void *opaque, const char *line)
{
	fprintf(stderr, "%s\n", line);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "file", required_argument, NULL, 'f' },
		{ "queues", required_argument, NULL, 'q' },
		{ "iothreads", required_argument, NULL, 't' },
		{ "read-only", no_argument, NULL, 'r' },
		{ "serial", required_argument, NULL, 'S' },
		{ "logical-block-size", required_argument, NULL, 'b' },
		{ "node-opts", required_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 },
	};
	const char *sock = NULL, *file = NULL, *serial = NULL, *nopts = "", *cls;
	unsigned queues = 1, nthreads = 0, lbs = 0;
	bool ro = false;
	struct ioc_iothread *th[16];
	struct ioc_loop *loops[16];
	struct ioc_node_graph *g;
	struct ioc_node *n;
	struct ioc__vub_export *e;
	char err[512], kv[1024];
	json_t *o;
	sigset_t ss;
	int c, r;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'f': file = optarg; break;
		case 'q': queues = (unsigned)atoi(optarg); break;
		case 't': nthreads = (unsigned)atoi(optarg); break;
		case 'r': ro = true; break;
		case 'S': serial = optarg; break;
		case 'b': lbs = (unsigned)atoi(optarg); break;
		case 'o': nopts = optarg; break;
		default: return 2;
		}
	}
	if (!sock || !file || nthreads > 16) {
		fprintf(stderr, "usage: vub-serve --socket PATH --file IMAGE [options]\n");
		return 2;
	}
	if (ioc_loop_new(&main_loop, NULL) < 0)
		return 1;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	sfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sfd < 0 || ioc_loop_set_fd(main_loop, sfd, on_signal, NULL, NULL, NULL, NULL) < 0)
		return 1;
	for (unsigned i = 0; i < nthreads; i++) {
		struct ioc_iothread_opts to = { .name = "vub-io", .cpu = -1 };

		if (ioc_iothread_start(&th[i], &to) < 0)
			return 1;
		loops[i] = ioc_iothread_loop(th[i]);
	}
	if (ioc_node_graph_new(&g) < 0)
		return 1;
	snprintf(kv, sizeof(kv), "driver=file,node-name=disk,filename=%s%s%s", file,
		 ro ? ",read-only=on" : "", nopts);
	o = ioc__qmp_keyval_parse(kv, NULL, NULL, err, sizeof(err));
	if (!o || !ioc_node_check_opts(o, IOC_QMP_KEYVAL, err, sizeof(err)) ||
	    ioc_node_add(g, o, &n, &cls, err, sizeof(err)) < 0) {
		fprintf(stderr, "vub-serve: %s\n", err);
		return 1;
	}
	json_decref(o);
	struct ioc__vub_opts eo = {
		.id = "vub0", .node = n, .socket_path = sock, .listen_fd = -1,
		.writable = !ro, .logical_block_size = lbs, .num_queues = queues,
		.serial = serial, .loops = loops, .nloops = nthreads,
		.ctrl_loop = main_loop, .log = log_line,
	};
	r = ioc__vub_export_new(&e, &eo, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "vub-serve: %s\n", err);
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	ioc_loop_run(main_loop);
	{
		struct ioc__vub_info info;

		ioc__vub_export_info(e, &info);
		for (unsigned i = 0; i < info.num_queues; i++)
			fprintf(stderr, "queue %u: %llu requests\n", i,
				(unsigned long long)info.queue_requests[i]);
		for (unsigned i = 0; i < nthreads; i++) {
			struct ioc_loop_poll_stats ps;

			ioc_loop_get_poll_stats(loops[i], &ps);
			fprintf(stderr, "io thread %u: %llu polls, %llu found work\n", i,
				(unsigned long long)ps.polls, (unsigned long long)ps.polls_hit);
		}
	}
	ioc__vub_export_free(e);
	for (unsigned i = 0; i < nthreads; i++) {
		ioc_node_graph_detach_loop(g, loops[i]);
		ioc_iothread_stop(th[i]);
	}
	ioc_node_graph_free(g);
	ioc_loop_set_fd(main_loop, sfd, NULL, NULL, NULL, NULL, NULL);
	close(sfd);
	ioc_loop_free(main_loop);
	return 0;
}
