/*
 * iocore-storage-daemon: qemu-storage-daemon's command line over iocore's
 * node, export and QMP layers.  Each option group is the QMP command of
 * the same name, run in the order given (--blockdev is blockdev-add,
 * --export block-export-add, --object object-add, --nbd-server
 * nbd-server-start), so a script written for qemu-storage-daemon runs
 * unchanged, and what the daemon refuses it refuses in QEMU's words.
 * SIGINT and SIGTERM (or quit over QMP) delete the exports, stop the NBD
 * server and close the nodes, flushing them.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ioc-config.h"
#include "daemon/daemon.h"
#include "die.h"
#include "nofile.h"

static const char *prog = "iocore-storage-daemon";

static void usage(FILE *f)
{
	fprintf(f,
"Usage: %s [options]\n"
"iocore's storage daemon, with qemu-storage-daemon's options.\n"
"\n"
"  -h, --help             print this help and exit\n"
"  -V, --version          print the version and exit\n"
"  --blockdev [driver=]<driver>[,node-name=<N>][,read-only=on|off]\n"
"             [,discard=ignore|unmap][,detect-zeroes=on|off|unmap]\n"
"             [,cache.direct=on|off][,cache.no-flush=on|off][,<driver options>]\n"
"                         add a block node (also a JSON object); drivers:\n"
"                         file, host_device, null-co, raw, qcow2, rbd,\n"
"                         __org.iocore_zip, __org.iocore_zip-overlay\n"
"  --chardev socket,id=<id>,path=<path>,server=on,wait=off\n"
"                         a Unix socket for --monitor\n"
"  --export [type=]nbd,id=<id>,node-name=<node>[,name=<name>]\n"
"           [,description=<text>][,writable=on|off][,bitmaps.0=<name>]\n"
"           [,allocation-depth=on|off][,iothread=<id>]\n"
"  --export [type=]vhost-user-blk,id=<id>,node-name=<node>,addr.type=unix,\n"
"           addr.path=<path>[,writable=on|off][,num-queues=<n>]\n"
"           [,logical-block-size=<size>][,iothread=<id>]\n"
"                         export a node (also a JSON object)\n"
"  --monitor [chardev=]<id>[,mode=control]\n"
"                         serve QMP on a chardev\n"
"  --nbd-server addr.type=unix,addr.path=<path>|addr.type=inet,\n"
"               addr.host=<host>,addr.port=<port>|addr.type=fd,addr.str=<fd>\n"
"               [,tls-creds=<id>][,max-connections=<n>]\n"
"                         start the NBD server\n"
"  --object iothread,id=<id>[,poll-max-ns=<ns>][,poll-grow=<n>][,poll-shrink=<n>]\n"
"  --object tls-creds-x509,id=<id>,dir=<dir>,endpoint=server[,verify-peer=on|off]\n"
"  --object tls-creds-psk,id=<id>,dir=<dir>,endpoint=server\n"
"                         add an object\n"
"  --pidfile <path>       write the daemon's pid to <path>\n"
"  --daemonize            run in the background once every option is done\n"
"  --nbd-iothreads <n>    __org.iocore: the NBD server's I/O threads\n"
"                         (default: the number of CPUs)\n",
		prog);
}

#define die(...) ioc_tool_die(prog, __VA_ARGS__)

enum {
	OPT_BLOCKDEV = 256, OPT_CHARDEV, OPT_EXPORT, OPT_MONITOR, OPT_NBD_SERVER, OPT_OBJECT,
	OPT_PIDFILE, OPT_DAEMONIZE, OPT_NBD_IOTHREADS,
};

static void on_signal(void *opaque)
{
	int *sfd = opaque;
	struct signalfd_siginfo si;

	while (read(*sfd, &si, sizeof(si)) == sizeof(si))
		;
	ioc_loop_stop(ioc_loop_current());
}

static void on_quit(void *opaque)
{
	ioc_loop_stop(opaque);
}

static json_t *parse_group(const char *opt, const char *arg, const char *implied)
{
	char err[512];
	json_t *o = ioc__qmp_keyval_parse(arg, implied, NULL, err, sizeof(err));

	if (!o)
		die("%s %s: %s", opt, arg, err);
	return o;
}

/* Run cmd with the group as arguments; die with QEMU's shape of message. */
static void run(struct ioc_daemon *d, const char *opt, const char *arg, const char *cmd,
		const char *implied)
{
	bool is_json = false;
	char err[512];
	json_t *o = ioc__qmp_keyval_parse(arg, implied, &is_json, err, sizeof(err));
	struct ioc__qmp_err e = { .cls = "GenericError" };
	json_t *r;

	if (!o)
		die("%s %s: %s", opt, arg, err);
	r = ioc_daemon_run(d, cmd, o, is_json ? 0 : IOC_QMP_KEYVAL, &e);
	json_decref(o);
	if (!r)
		die("%s %s: %s", opt, arg, e.desc);
	json_decref(r);
}

static char *pidfile;

static void write_pidfile(const char *path)
{
	char tmp[4096], buf[32];
	int fd, n;

	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		die("Cannot open pid file: %s", strerror(errno));
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (write(fd, buf, (size_t)n) != n || close(fd) < 0 || rename(tmp, path) < 0)
		die("Cannot write pid file: %s", strerror(errno));
	pidfile = strdup(path);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "trace", required_argument, NULL, 'T' },
		{ "blockdev", required_argument, NULL, OPT_BLOCKDEV },
		{ "chardev", required_argument, NULL, OPT_CHARDEV },
		{ "export", required_argument, NULL, OPT_EXPORT },
		{ "monitor", required_argument, NULL, OPT_MONITOR },
		{ "nbd-server", required_argument, NULL, OPT_NBD_SERVER },
		{ "object", required_argument, NULL, OPT_OBJECT },
		{ "pidfile", required_argument, NULL, OPT_PIDFILE },
		{ "daemonize", no_argument, NULL, OPT_DAEMONIZE },
		{ "nbd-iothreads", required_argument, NULL, OPT_NBD_IOTHREADS },
		{ NULL, 0, NULL, 0 },
	};
	struct ioc_daemon_opts dopts = { 0 };
	struct ioc_daemon *d;
	struct ioc_loop *loop;
	bool daemonize = false;
	int ready[2] = { -1, -1 };
	int c, r;

	ioc_tool_raise_nofile();
	/* First pass: what changes how the rest runs. */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "hVT:", longopts, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("%s %s\n", prog, IOC_VERSION);
			return 0;
		case 'T':
			die("-T/--trace is not supported");
		case OPT_DAEMONIZE:
			daemonize = true;
			break;
		case OPT_NBD_IOTHREADS: {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (!*optarg || *end || v > 256)
				die("--nbd-iothreads %s: expects a number from 0 to 256", optarg);
			dopts.nbd_iothreads = (unsigned)v;
			break;
		}
		case '?':
			if (optopt)
				die("unrecognized option '-%c'", optopt);
			die("unrecognized option '%s'", argv[optind - 1]);
		default:
			break;
		}
	}
	if (optind < argc)
		die("Unexpected argument: %s", argv[optind]);
	if (daemonize) {
		pid_t pid;
		char st;

		if (pipe2(ready, O_CLOEXEC) < 0)
			die("pipe: %s", strerror(errno));
		pid = fork();
		if (pid < 0)
			die("fork: %s", strerror(errno));
		if (pid > 0) {
			/* The child says when it is ready; EOF means it failed
			 * (and said why on stderr). */
			close(ready[1]);
			return read(ready[0], &st, 1) == 1 ? 0 : 1;
		}
		close(ready[0]);
		setsid();
	}

	signal(SIGPIPE, SIG_IGN);
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	if ((r = ioc_loop_new(&loop, NULL)) < 0)
		die("loop: %s", strerror(-r));
	dopts.loop = loop;
	dopts.quit = on_quit;
	dopts.opaque = loop;
	if ((r = ioc_daemon_new(&d, &dopts)) < 0)
		die("%s", strerror(-r));

	/* Second pass: the option groups, in order. */
	optind = 1;
	while ((c = getopt_long(argc, argv, "hVT:", longopts, NULL)) != -1) {
		char err[512];
		json_t *o;

		switch (c) {
		case OPT_BLOCKDEV:
			run(d, "--blockdev", optarg, "blockdev-add", "driver");
			break;
		case OPT_EXPORT:
			run(d, "--export", optarg, "block-export-add", "type");
			break;
		case OPT_OBJECT:
			run(d, "--object", optarg, "object-add", "qom-type");
			break;
		case OPT_NBD_SERVER:
			o = parse_group("--nbd-server", optarg, NULL);
			if (ioc__daemon_nbd_server_start(d, o, err, sizeof(err)) < 0)
				die("--nbd-server %s: %s", optarg, err);
			json_decref(o);
			break;
		case OPT_CHARDEV:
			o = parse_group("--chardev", optarg, "backend");
			if (ioc_daemon_chardev_add(d, o, err, sizeof(err)) < 0)
				die("--chardev %s: %s", optarg, err);
			json_decref(o);
			break;
		case OPT_MONITOR:
			o = parse_group("--monitor", optarg, "chardev");
			if (ioc_daemon_monitor_add(d, o, err, sizeof(err)) < 0)
				die("--monitor %s: %s", optarg, err);
			json_decref(o);
			break;
		case OPT_PIDFILE:
			write_pidfile(optarg);
			break;
		default:
			break;
		}
	}

	int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);

	if (sfd < 0 || ioc_loop_set_fd(loop, sfd, on_signal, NULL, NULL, NULL, &sfd) < 0)
		die("signalfd: %s", strerror(errno));
	if (daemonize) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);

		if (write(ready[1], "", 1) != 1)
			die("cannot tell the parent: %s", strerror(errno));
		close(ready[1]);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
			close(null);
		}
	}
	ioc_loop_run(loop);
	ioc_loop_set_fd(loop, sfd, NULL, NULL, NULL, NULL, NULL);
	close(sfd);
	ioc_daemon_free(d);
	ioc_loop_free(loop);
	if (pidfile) {
		unlink(pidfile);
		free(pidfile);
	}
	return 0;
}
