/*
 * iocore-nbd: serve a disk image over NBD (conventions of qemu-nbd and
 * nbdkit).  Foreground by default; SIGINT/SIGTERM stop accepting, finish
 * the requests already received, flush and exit 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ioc-config.h"
#include "iocore/blk.h"
#include "iocore/loop.h"
#include "nbd/nbd.h"
#include "daemon/nbd-control.h"
#include "inject.h"
#include "die.h"
#include "nofile.h"
#include "parse-size.h"
#include "iocore/zip.h"
#include "node/node.h"
#include "node/rbd.h"

#define MAX_LISTEN 16

static const char *prog = "iocore-nbd";

static void usage(FILE *f)
{
	fprintf(f,
"Usage: %s [options] IMAGE\n"
"Serve IMAGE (a raw file or block device) over the NBD protocol.\n"
"An IMAGE that starts with a zstd frame or a gzip member is a compressed\n"
"image (iocore-zip output, or any zstd file): its decompressed data is\n"
"served read-only.\n"
"\n"
"  -U, --unix PATH            listen on a Unix socket (only) at PATH\n"
"  -p, --port N               TCP port (default 10809)\n"
"  -b, --bind ADDR            TCP address (default 127.0.0.1)\n"
"  -r, --read-only            refuse writes\n"
"  -x, --export-name NAME     export name (default: the empty name)\n"
"  -D, --description TEXT     export description\n"
"  -f, --format raw|qcow2     the image's format (default: qcow2 for a file\n"
"                             that starts with qcow2's magic, else raw); an\n"
"                             IMAGE of the form rbd:POOL/IMAGE[@SNAP][:OPT=V...]\n"
"                             is a Ceph RBD image\n"
"      --iothreads N          I/O threads (default: number of CPUs)\n"
"      --frame-cache SIZE     compressed image: decoded frames kept in memory,\n"
"                             shared by all connections (default 256M; K, M, G)\n"
"      --overlay FILE         compressed image: make it writable, keeping every\n"
"                             change in FILE (created if missing); the\n"
"                             compressed file is never written\n"
"      --aio io_uring|threads block I/O engine (default: io_uring if available)\n"
"      --cache writeback|none host page cache use (none = O_DIRECT)\n"
"      --max-connections N    refuse connections beyond N (default: unlimited)\n"
"      --handshake-timeout S  close clients that take longer (default 10)\n"
"      --fork                 run in the background once listening\n"
"      --pid-file PATH        write the server's pid to PATH\n"
"      --splice-reads SIZE    send READs of SIZE or more (in the clear) from the\n"
"                             page cache by splice, without a copy (default: off)\n"
"      --poll-max-ns N        I/O threads busy-poll up to N ns before sleeping\n"
"                             (0 = off; default: the loop's adaptive default)\n"
"      --rest-max-ns N        a connection whose client has replies unread reads\n"
"                             requests in batches, up to N ns apart\n"
"                             (0 = never; default 200000)\n"
"      --tls off|on|require   TLS via NBD_OPT_STARTTLS (default: off, or require\n"
"                             when credentials are given)\n"
"      --tls-certificates DIR X.509: DIR/server-cert.pem, DIR/server-key.pem\n"
"                             (DIR/ca-cert.pem, DIR/ca-crl.pem check clients)\n"
"      --tls-psk FILE         pre-shared keys, \"username:hexkey\" lines (psktool)\n"
"      --tls-verify-peer      X.509: require a client certificate from the CA\n"
"      --control PATH         QMP control socket at PATH (mode 0600): dirty\n"
"                             bitmaps, statistics, migration; see iocore-ctl(1)\n"
"      --incoming tcp:ADDR:PORT|defer\n"
"                             receive IMAGE from a migrating iocore-nbd first\n"
"                             (defer: wait for migrate-incoming on --control);\n"
"                             serve it only once it is complete and verified;\n"
"                             an rbd: IMAGE is handed over, not copied\n"
"  -v, --verbose              log connections to stderr\n"
"      --inject-faults OPS=ERR[@OFF+LEN][/N][#COUNT]\n"
"                             testing: fail OPS (read,write,flush,trim,zero,all)\n"
"                             with ERR (EIO, ENOSPC, ...) where they overlap the\n"
"                             range, every Nth time, at most COUNT times\n"
"  -h, --help                 this text\n"
"  -V, --version              print the version\n"
"\n"
"Systemd socket activation (LISTEN_FDS/LISTEN_PID) replaces -U/-p/-b.\n"
"Examples:\n"
"  %s -U /tmp/nbd.sock disk.img   then: nbdinfo 'nbd+unix:///?socket=/tmp/nbd.sock'\n"
"  %s disk.img                    then: qemu-img info nbd://127.0.0.1\n"
"  %s --tls-psk keys.psk disk.img then: nbdinfo 'nbds://alice@127.0.0.1/?tls-psk-file=keys.psk'\n",
		prog, prog, prog, prog);
}

#define die(...) ioc_tool_die(prog, __VA_ARGS__)

/* -v lines: local time in ISO 8601 with milliseconds (QEMU's
 * -msg timestamp=on), or none when stderr is the journal, which stamps
 * each line itself (systemd sets JOURNAL_STREAM for its services). */
static void log_stderr(void *opaque, const char *msg)
{
	struct timespec ts;
	struct tm tm;
	char when[40], zone[8];

	if (getenv("JOURNAL_STREAM")) {
		fprintf(stderr, "%s: %s\n", prog, msg);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	strftime(zone, sizeof(zone), "%z", &tm);
	fprintf(stderr, "%s.%03ld%s %s: %s\n", when, ts.tv_nsec / 1000000, zone, prog, msg);
}

static unsigned long parse_num(const char *s, const char *what, unsigned long max)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);

	if (errno || end == s || *end || v > max || s[0] == '-')
		die("invalid %s: %s", what, s);
	return v;
}

/* A byte count in the tools' one size grammar (parse-size.h), from 1
 * byte to 1 TiB. */
static size_t parse_size(const char *s, const char *what)
{
	uint64_t v;

	if (ioc_tool_parse_size(s, &v) < 0 || v == 0 || v > (1ull << 40))
		die("invalid %s: %s", what, s);
	return (size_t)v;
}

/* Systemd socket activation: fds 3.. when LISTEN_PID is us. */
static int activation_fds(int *fds, int max)
{
	const char *pid = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS");

	if (!pid || !n)
		return 0;
	if ((pid_t)parse_num(pid, "LISTEN_PID", 1ul << 30) != getpid())
		return 0;
	int count = (int)parse_num(n, "LISTEN_FDS", MAX_LISTEN);
	for (int i = 0; i < count && i < max; i++) {
		fds[i] = 3 + i;
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	}
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return count;
}

static void on_signal(void *opaque)
{
	int *sfd = opaque;
	struct signalfd_siginfo si;

	while (read(*sfd, &si, sizeof(si)) == sizeof(si))
		;
	ioc_loop_stop(ioc_loop_current());
}

/*
 * The files this process makes (its Unix socket, control socket and pid
 * file) are removed at exit only while they are still the ones it made:
 * a restart may start the next server before this one has finished
 * closing (the frame cache, the image's flush), and that server replaces
 * the socket and pid file at the same paths.  Removing them by name would
 * take the new server's socket away, leaving it serving with no way in.
 * A file is told by its inode, taken when it was made; the pid file is
 * written under a temporary name and renamed into place, so each server's
 * is a new inode (and no reader sees half of it).  Between the check and
 * the unlink a successor could still replace the file: a window of two
 * syscalls, not the whole shutdown.
 */
struct owned {
	const char *path;
	dev_t dev;
	ino_t ino;
};

static struct owned owned_sock, owned_ctl, owned_pid;

static void own(struct owned *o, const char *path)
{
	struct stat st;

	o->path = NULL;
	if (lstat(path, &st) == 0) {
		o->path = path;
		o->dev = st.st_dev;
		o->ino = st.st_ino;
	}
}

static void unlink_owned(struct owned *o)
{
	struct stat st;

	if (o->path && lstat(o->path, &st) == 0 && st.st_dev == o->dev && st.st_ino == o->ino)
		unlink(o->path);
}

static void write_pid_file(const char *path)
{
	char tmp[4096];
	FILE *f;

	if (snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof(tmp))
		die("%s: name too long", path);
	f = fopen(tmp, "w");
	if (!f)
		die("cannot write %s: %s", tmp, strerror(errno));
	fprintf(f, "%d\n", (int)getpid());
	if (fclose(f) != 0 || rename(tmp, path) < 0) {
		int e = errno;

		unlink(tmp);
		die("cannot write %s: %s", path, strerror(e));
	}
	own(&owned_pid, path);
}

/* --incoming: what the end of the migration needs to start serving. */
struct incoming {
	struct ioc_loop *loop;
	struct ioc_nbd_server *srv;
	struct ioc_nbd_export_opts eo;
	struct ioc_blk_opts bo;
	struct ioc_blk *blk;
	/* A raw image is received through a file node of its own, deleted
	 * once received (the image is then served as every raw file is). */
	struct ioc_node_graph *graph;
	const char *recv_node;
	struct ioc_node *dest;          /* the node received through */
	const char *image, *unix_path, *bind_addr, *port;
	bool verbose;
	int exit_code;
};

static void incoming_fail(struct incoming *in, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void incoming_fail(struct incoming *in, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	in->exit_code = 1;
	ioc_loop_stop(in->loop);
}

/* Start serving the export (in->eo): its listener, then accepting. */
static int incoming_listen(struct incoming *in, char *err, size_t errlen)
{
	int r, fd;

	if ((r = ioc_nbd_server_add_export(in->srv, &in->eo)) < 0) {
		snprintf(err, errlen, "export: %s", strerror(-r));
		return r;
	}
	fd = in->unix_path ? ioc_nbd_listen_unix(in->unix_path)
			   : ioc_nbd_listen_tcp(in->bind_addr, in->port);
	if (fd < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s",
			 in->unix_path ? in->unix_path : in->bind_addr, strerror(-fd));
		return fd;
	}
	if (in->unix_path)
		own(&owned_sock, in->unix_path);
	if ((r = ioc_nbd_server_add_listener(in->srv, fd)) < 0 ||
	    (r = ioc_nbd_server_serve(in->srv)) < 0) {
		snprintf(err, errlen, "serve: %s", strerror(-r));
		return r;
	}
	return 0;
}

/* A hand-over arrived (main loop): the node is active, serve it. */
static int incoming_serve(void *opaque, struct ioc_node *n, char *err, size_t errlen)
{
	struct incoming *in = opaque;
	int r = incoming_listen(in, err, errlen);

	if (r == 0 && in->verbose)
		fprintf(stderr, "%s: incoming hand-over completed; serving %s (%llu bytes) "
			"on %s\n", prog, in->image, (unsigned long long)n->size,
			in->unix_path ? in->unix_path : in->bind_addr);
	return r;
}

/* The migration ended (main loop): serve the image only if it arrived whole. */
static void incoming_done(void *opaque, int result, const char *why)
{
	struct incoming *in = opaque;
	char err[512];
	int r;

	if (result < 0) {
		incoming_fail(in, "incoming migration failed, not serving %s: %s",
			      in->image, why && why[0] ? why : strerror(-result));
		return;
	}
	if (in->eo.node) {
		/* A qcow2 image: served through the node it was received
		 * through. */
		if (incoming_listen(in, err, sizeof(err)) < 0) {
			incoming_fail(in, "%s", err);
			return;
		}
		if (in->verbose)
			fprintf(stderr, "%s: incoming migration completed; serving %s "
				"(%llu bytes, qcow2) on %s\n", prog, in->image,
				(unsigned long long)in->eo.node->size,
				in->unix_path ? in->unix_path : in->bind_addr);
		return;
	}
	if (in->recv_node) {
		const char *cls;

		if ((r = ioc_node_del(in->graph, in->recv_node, &cls, err, sizeof(err))) < 0) {
			incoming_fail(in, "cannot close %s after receiving it: %s", in->image,
				      err);
			return;
		}
		in->recv_node = NULL;
	}
	if ((r = ioc_blk_open(&in->blk, in->image, &in->bo)) < 0) {
		incoming_fail(in, "cannot open %s: %s", in->image, strerror(-r));
		return;
	}
	nbd_inject_install(in->blk);
	in->eo.blk = in->blk;
	if (incoming_listen(in, err, sizeof(err)) < 0) {
		incoming_fail(in, "%s", err);
		return;
	}
	if (in->verbose) {
		struct ioc_blk_info info;

		ioc_blk_get_info(in->blk, &info);
		fprintf(stderr, "%s: incoming migration completed; serving %s (%llu bytes) "
			"on %s\n", prog, in->image, (unsigned long long)info.size,
			in->unix_path ? in->unix_path : in->bind_addr);
	}
}

/* A file that starts with qcow2's magic ("QFI\xfb"); a raw image never
 * does by accident often enough to matter, and -f raw says so. */
static bool probe_qcow2(const char *path)
{
	unsigned char m[4];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	bool yes = false;

	if (fd >= 0) {
		yes = pread(fd, m, 4, 0) == 4 && !memcmp(m, "QFI\xfb", 4);
		close(fd);
	}
	return yes;
}

/* The control socket's quit: stop as on SIGTERM. */
static void on_quit(void *opaque)
{
	ioc_loop_stop(opaque);
}

int main(int argc, char **argv)
{
	enum { OPT_IOTHREADS = 256, OPT_AIO, OPT_CACHE, OPT_MAXCONN, OPT_HSTIMEOUT,
	       OPT_FORK, OPT_PIDFILE, OPT_POLL, OPT_REST, OPT_TLS, OPT_TLS_CERTS, OPT_TLS_PSK,
	       OPT_TLS_VERIFY, OPT_INJECT, OPT_CONTROL, OPT_FRAME_CACHE, OPT_OVERLAY,
	       OPT_INCOMING, OPT_SPLICE_READS, OPT_FORMAT };
	static const struct option longopts[] = {
		{ "unix", required_argument, NULL, 'U' },
		{ "port", required_argument, NULL, 'p' },
		{ "bind", required_argument, NULL, 'b' },
		{ "read-only", no_argument, NULL, 'r' },
		{ "export-name", required_argument, NULL, 'x' },
		{ "description", required_argument, NULL, 'D' },
		{ "iothreads", required_argument, NULL, OPT_IOTHREADS },
		{ "aio", required_argument, NULL, OPT_AIO },
		{ "cache", required_argument, NULL, OPT_CACHE },
		{ "max-connections", required_argument, NULL, OPT_MAXCONN },
		{ "handshake-timeout", required_argument, NULL, OPT_HSTIMEOUT },
		{ "fork", no_argument, NULL, OPT_FORK },
		{ "pid-file", required_argument, NULL, OPT_PIDFILE },
		{ "poll-max-ns", required_argument, NULL, OPT_POLL },
		{ "rest-max-ns", required_argument, NULL, OPT_REST },
		{ "tls", required_argument, NULL, OPT_TLS },
		{ "tls-certificates", required_argument, NULL, OPT_TLS_CERTS },
		{ "tls-psk", required_argument, NULL, OPT_TLS_PSK },
		{ "tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY },
		{ "inject-faults", required_argument, NULL, OPT_INJECT },
		{ "control", required_argument, NULL, OPT_CONTROL },
		{ "frame-cache", required_argument, NULL, OPT_FRAME_CACHE },
		{ "splice-reads", required_argument, NULL, OPT_SPLICE_READS },
		{ "overlay", required_argument, NULL, OPT_OVERLAY },
		{ "incoming", required_argument, NULL, OPT_INCOMING },
		{ "format", required_argument, NULL, OPT_FORMAT },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *control_path = NULL;
	const char *unix_path = NULL, *port = "10809", *bind_addr = "127.0.0.1";
	const char *pid_file = NULL, *overlay = NULL, *incoming_uri = NULL, *format = NULL;
	struct ioc_nbd_export_opts eo = { .name = "" };
	struct ioc_nbd_server_opts so = { 0 };
	struct ioc_blk_opts bo = { 0 };
	struct ioc_nbd_tls_opts tls = { 0 };
	struct ioc_zip_image_opts zo = { .log = log_stderr };
	bool do_fork = false, verbose = false, tls_set = false, tcp_set = false;
	int c, r;

	while ((c = getopt_long(argc, argv, "U:p:b:rx:D:f:vhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'U': unix_path = optarg; break;
		case 'p': parse_num(optarg, "port", 65535); port = optarg; tcp_set = true; break;
		case 'b': bind_addr = optarg; tcp_set = true; break;
		case 'r': eo.read_only = bo.read_only = true; break;
		case 'x': eo.name = optarg; break;
		case 'D': eo.description = optarg; break;
		case OPT_IOTHREADS:
			so.iothreads = (unsigned)parse_num(optarg, "--iothreads", 256);
			if (!so.iothreads)
				die("--iothreads must be at least 1");
			break;
		case OPT_AIO:
			if (strcmp(optarg, "io_uring") == 0)
				bo.aio = IOC_BLK_AIO_IO_URING;
			else if (strcmp(optarg, "threads") == 0)
				bo.aio = IOC_BLK_AIO_THREADS;
			else
				die("--aio must be io_uring or threads");
			break;
		case OPT_CACHE:
			if (strcmp(optarg, "writeback") == 0)
				bo.cache = IOC_BLK_CACHE_WRITEBACK;
			else if (strcmp(optarg, "none") == 0)
				bo.cache = IOC_BLK_CACHE_NONE;
			else
				die("--cache must be writeback or none");
			break;
		case OPT_MAXCONN:
			so.max_connections = (unsigned)parse_num(optarg, "--max-connections",
								  1u << 30);
			break;
		case OPT_HSTIMEOUT: {
			unsigned long s = parse_num(optarg, "--handshake-timeout", 86400);
			so.handshake_timeout_ns = s ? (int64_t)s * 1000000000 : -1;
			break;
		}
		case OPT_FORK: do_fork = true; break;
		case OPT_PIDFILE: pid_file = optarg; break;
		case OPT_POLL: {
			long v = strtol(optarg, NULL, 10);
			so.loop.poll_max_ns = v > 0 ? v : -1;
			break;
		}
		case OPT_REST: {
			unsigned long v = parse_num(optarg, "--rest-max-ns", 1000000000);
			so.rest_max_ns = v ? (int64_t)v : -1;
			break;
		}
		case OPT_TLS:
			tls_set = true;
			if (strcmp(optarg, "off") == 0)
				tls.mode = IOC_NBD_TLS_OFF;
			else if (strcmp(optarg, "on") == 0)
				tls.mode = IOC_NBD_TLS_ON;
			else if (strcmp(optarg, "require") == 0)
				tls.mode = IOC_NBD_TLS_REQUIRE;
			else
				die("--tls must be off, on or require");
			break;
		case OPT_TLS_CERTS: tls.certificates = optarg; break;
		case OPT_TLS_PSK: tls.psk_file = optarg; break;
		case OPT_TLS_VERIFY: tls.verify_peer = true; break;
		case OPT_INJECT: {
			char err[256];
			if (nbd_inject_add(optarg, err, sizeof(err)) < 0)
				die("%s", err);
			break;
		}
		case OPT_CONTROL: control_path = optarg; break;
		case OPT_FRAME_CACHE: zo.frame_cache = parse_size(optarg, "--frame-cache"); break;
		case OPT_SPLICE_READS:
			so.splice_read_min = parse_size(optarg, "--splice-reads");
			break;
		case OPT_OVERLAY: overlay = optarg; break;
		case OPT_INCOMING: incoming_uri = optarg; break;
		case 'f': case OPT_FORMAT:
			if (strcmp(optarg, "raw") && strcmp(optarg, "qcow2"))
				die("unknown format '%s' (raw or qcow2)", optarg);
			format = optarg;
			break;
		case 'v': verbose = true; break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("iocore-nbd %s\n", IOC_VERSION); return 0;
		default: usage(stderr); return 1;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 1;
	}
	if (unix_path && tcp_set) {
		/* One listener: a silently ignored -p would look like a
		 * server that refuses its clients. */
		fprintf(stderr, "iocore-nbd: -U cannot be combined with -p or -b\n");
		return 1;
	}
	const char *image = argv[optind];
	/* Credentials alone mean TLS is wanted: require it rather than
	 * serve in the clear by default (as qemu-nbd --tls-creds does). */
	bool have_creds = tls.certificates || tls.psk_file;
	if (!tls_set && have_creds)
		tls.mode = IOC_NBD_TLS_REQUIRE;
	if (tls.mode != IOC_NBD_TLS_OFF && !have_creds)
		die("--tls %s needs --tls-certificates DIR or --tls-psk FILE",
		    tls.mode == IOC_NBD_TLS_ON ? "on" : "require");
	if (tls.mode == IOC_NBD_TLS_OFF && (have_creds || tls.verify_peer))
		die("TLS options given with --tls off");

	ioc_tool_raise_nofile();

	/* Signals: blocked before any thread exists, read through a signalfd. */
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (incoming_uri) {
		if (overlay)
			die("--incoming cannot receive into a compressed image (--overlay)");
		if (strcmp(incoming_uri, "defer") == 0 && !control_path)
			die("--incoming defer needs --control (for migrate-incoming)");
		if (getenv("LISTEN_FDS"))
			die("--incoming cannot take activated sockets");
	}

	/* Listen first, so clients can connect as soon as we report ready
	 * (an incoming migration listens once its image is complete). */
	int lfds[MAX_LISTEN], nl = incoming_uri ? 0 : activation_fds(lfds, MAX_LISTEN);
	bool activated = nl > 0;
	if (nl == 0 && !incoming_uri) {
		if (unix_path)
			lfds[0] = ioc_nbd_listen_unix(unix_path);
		else
			lfds[0] = ioc_nbd_listen_tcp(bind_addr, port);
		if (lfds[0] < 0)
			die("cannot listen on %s: %s",
			    unix_path ? unix_path : bind_addr, strerror(-lfds[0]));
		if (unix_path)
			own(&owned_sock, unix_path);
		nl = 1;
	}

	int ready[2] = { -1, -1 };
	if (do_fork) {
		if (pipe2(ready, O_CLOEXEC) < 0)
			die("pipe: %s", strerror(errno));
		pid_t pid = fork();
		if (pid < 0)
			die("fork: %s", strerror(errno));
		if (pid > 0) {
			char b;
			close(ready[1]);
			/* Exit 0 only once the child serves. */
			return read(ready[0], &b, 1) == 1 ? 0 : 1;
		}
		close(ready[0]);
		setsid();
	}

	struct ioc_loop *loop;
	if ((r = ioc_loop_new(&loop, NULL)) < 0)
		die("event loop: %s", strerror(-r));
	struct incoming in = { .loop = loop, .bo = bo, .image = image,
			       .unix_path = unix_path, .bind_addr = bind_addr,
			       .port = port, .verbose = verbose };
	/* A compressed image is recognised by its first bytes, not its name. */
	struct ioc_blk *blk = NULL;
	struct ioc_zip_image *zimg = NULL;
	struct ioc_zip_overlay *zov = NULL;
	int probe_fd = open(image, O_RDONLY | O_CLOEXEC);
	struct stat pst;
	bool compressed = false;
	if (probe_fd >= 0 && !incoming_uri) {
		compressed = fstat(probe_fd, &pst) == 0 && S_ISREG(pst.st_mode) &&
			     ioc_zip_probe(probe_fd) == 1;
		close(probe_fd);
	}
	/* qcow2 files and rbd: names are served through a block node of the
	 * node layer, as the storage daemon serves them. */
	struct ioc_node_graph *graph = NULL;
	bool qcow2 = format ? strcmp(format, "qcow2") == 0 :
		     !compressed && probe_qcow2(image);
	if (ioc__rbd_is_filename(image) || qcow2) {
		char msg[512] = "";
		json_t *o;
		const char *cls;
		struct ioc_node *node;

		if (compressed || overlay)
			die("--overlay needs a raw or compressed image file");
		if (ioc__rbd_is_filename(image)) {
			o = ioc__rbd_parse_filename(image, msg, sizeof(msg));
			if (!o)
				die("%s: %s", image, msg);
		} else {
			o = json_pack("{s:s,s:{s:s,s:s,s:s,s:{s:b}}}", "driver", "qcow2", "file",
				      "driver", "file", "filename", image,
				      "aio", bo.aio == IOC_BLK_AIO_THREADS ? "threads" : "io_uring",
				      "cache", "direct", bo.cache == IOC_BLK_CACHE_NONE);
		}
		/* --incoming: another host has the image until it hands it
		 * over (the node takes it then: handover.c). */
		if (o && incoming_uri && ioc__rbd_is_filename(image) &&
		    json_object_set_new(o, "__org.iocore_inactive", json_true()))
			die("out of memory");
		if (!o || json_object_set_new(o, "node-name", json_string("disk")) ||
		    json_object_set_new(o, "read-only", json_boolean(bo.read_only)) ||
		    json_object_set_new(o, "discard", json_string("unmap")))
			die("out of memory");
		if ((r = ioc_node_graph_new(&graph)) < 0 ||
		    ioc_node_add(graph, o, &node, &cls, msg, sizeof(msg)) < 0)
			die("cannot open %s: %s", image, msg);
		json_decref(o);
		eo.node = node;
		compressed = false;
		if (incoming_uri)
			so.defer_serving = true;
	} else if (compressed) {
		char msg[512] = "";
		if ((r = ioc_zip_image_open(&zimg, image, &zo, msg, sizeof(msg))) < 0)
			die("cannot serve compressed image %s: %s", image,
			    msg[0] ? msg : strerror(-r));
		eo.zip = zimg;
		if (overlay) {
			if ((r = ioc_zip_overlay_open(&zov, zimg, overlay, msg, sizeof(msg))) < 0)
				die("overlay: %s", msg[0] ? msg : strerror(-r));
			eo.zip_overlay = zov;
		} else {
			eo.read_only = true;
		}
	} else if (incoming_uri) {
		/* Received through a file node (created if missing), served
		 * once received (incoming_done). */
		char msg[512] = "";
		const char *cls;
		struct ioc_node *node;
		json_t *o;
		int fd = open(image, O_RDWR | O_CREAT | O_CLOEXEC, 0644);

		if (fd < 0)
			die("cannot open %s: %s", image, strerror(errno));
		close(fd);
		o = json_pack("{s:s,s:s,s:s,s:s,s:{s:b},s:s}", "driver", "file",
			      "node-name", "incoming", "filename", image,
			      "aio", bo.aio == IOC_BLK_AIO_THREADS ? "threads" : "io_uring",
			      "cache", "direct", bo.cache == IOC_BLK_CACHE_NONE,
			      "discard", "unmap");
		if (!o)
			die("out of memory");
		if ((r = ioc_node_graph_new(&graph)) < 0 ||
		    ioc_node_add(graph, o, &node, &cls, msg, sizeof(msg)) < 0)
			die("cannot open %s: %s", image, msg[0] ? msg : strerror(-r));
		json_decref(o);
		in.graph = graph;
		in.recv_node = "incoming";
		in.dest = node;
		so.defer_serving = true;
	} else {
		if (overlay)
			die("--overlay needs a compressed image; %s is not one", image);
		if ((r = ioc_blk_open(&blk, image, &bo)) < 0)
			die("cannot open %s: %s", image, strerror(-r));
		nbd_inject_install(blk);
		eo.blk = blk;
		/* Persistent dirty bitmaps beside the image. */
		if ((r = ioc_blk_dirty_load(blk)) < 0)
			die("dirty bitmaps of %s: %s", image, strerror(-r));
		if (r > 0) {
			struct ioc_blk_dirty *bv[64];
			struct ioc_blk_dirty_info bi;
			int nb = ioc_blk_dirty_handles(blk, bv, 64);

			/* Sidecars are loaded only here: fewer than 64 is the
			 * usual case, and a longer list still names the first. */
			for (int i = 0; i < nb && i < 64; i++) {
				ioc_blk_dirty_get_info(bv[i], &bi);
				if (bi.inconsistent)
					fprintf(stderr, "%s: dirty bitmap \"%s\" is inconsistent "
						"(its sidecar is torn or stale); refusing to use it\n",
						prog, bi.name);
			}
		}
	}
	if (verbose)
		so.log = log_stderr;
	struct ioc_nbd_server *srv;
	struct ioc_daemon_nbd_control *ctl = NULL;
	if ((r = ioc_nbd_server_new(&srv, &so)) < 0 ||
	    (!incoming_uri && (r = ioc_nbd_server_add_export(srv, &eo)) < 0))
		die("server: %s", strerror(-r));
	in.srv = srv;
	in.eo = eo;
	if (tls.mode != IOC_NBD_TLS_OFF) {
		char err[512];
		if ((r = ioc_nbd_server_set_tls(srv, &tls, err, sizeof(err))) < 0)
			die("TLS: %s", err);
	}
	for (int i = 0; i < nl; i++)
		if ((r = ioc_nbd_server_add_listener(srv, lfds[i])) < 0)
			die("listener: %s", strerror(-r));
	if ((r = ioc_nbd_server_start(srv)) < 0)
		die("start: %s", strerror(-r));

	if (control_path) {
		/* Created 0600: the umask applies to bind(). */
		mode_t old = umask(0177);
		unlink(control_path);
		int cfd = ioc_nbd_listen_unix(control_path);
		umask(old);
		if (cfd < 0)
			die("control socket %s: %s", control_path, strerror(-cfd));
		own(&owned_ctl, control_path);
		struct ioc_daemon_nbd_control_opts co = { .quit = on_quit, .opaque = loop };
		if ((r = ioc_daemon_nbd_control_new(&ctl, srv, loop, cfd, &co)) < 0)
			die("control socket: %s", strerror(-r));
	}
	if (incoming_uri) {
		char err[512];
		struct ioc__mig_incoming_opts io = {
			.uri = incoming_uri, .image = image,
			.done = incoming_done, .opaque = &in,
			.node = ioc__rbd_is_filename(image) ? eo.node : NULL,
			.dest = ioc__rbd_is_filename(image) ? NULL : eo.node ? eo.node : in.dest,
			.serve = ioc__rbd_is_filename(image) ? incoming_serve : NULL,
		};
		if ((r = ioc_daemon_nbd_incoming(srv, &io, err, sizeof(err))) < 0)
			die("--incoming: %s", err);
	}

	int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sfd < 0 || ioc_loop_set_fd(loop, sfd, on_signal, NULL, NULL, NULL, &sfd) < 0)
		die("signalfd: %s", strerror(errno));

	if (pid_file)
		write_pid_file(pid_file);
	if (verbose && incoming_uri) {
		fprintf(stderr, "%s: waiting for an incoming migration on %s into %s\n",
			prog, incoming_uri, image);
	} else if (verbose) {
		struct ioc_blk_info info = { .aio = "zip" };
		if (zimg) {
			struct ioc_zip_image_info zi;
			ioc_zip_image_get_info(zimg, &zi);
			info.size = zi.size;
		} else if (eo.node) {
			info.size = eo.node->size;
			info.aio = eo.node->drv->name;
		} else {
			ioc_blk_get_info(blk, &info);
		}
		char where[300];
		if (activated)
			snprintf(where, sizeof(where), "%d activated socket(s)", nl);
		else if (unix_path)
			snprintf(where, sizeof(where), "%s", unix_path);
		else
			snprintf(where, sizeof(where), "%s:%s", bind_addr, port);
		fprintf(stderr, "%s: serving %s (%llu bytes, aio %s%s%s) on %s\n", prog,
			image, (unsigned long long)info.size, info.aio,
			eo.read_only ? ", read-only" : "",
			tls.mode == IOC_NBD_TLS_REQUIRE ? ", TLS required" :
			tls.mode == IOC_NBD_TLS_ON ? ", TLS offered" : "", where);
	}
	if (do_fork) {
		/* Detach from the caller's pipes (a caller capturing our output
		 * would otherwise wait for the daemon); -v keeps stderr for logs. */
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
			if (!verbose)
				dup2(devnull, 2);
			close(devnull);
		}
		if (write(ready[1], "r", 1) != 1)
			return 1;
		close(ready[1]);
	}

	ioc_loop_run(loop);

	if (verbose) {
		struct ioc_nbd_server_stats st;
		ioc_nbd_server_get_stats(srv, &st);
		fprintf(stderr, "%s: stopping: %llu connection(s) open, %llu accepted, "
			"%llu refused, %llu requests served\n", prog,
			(unsigned long long)st.connections,
			(unsigned long long)st.accepted,
			(unsigned long long)st.refused,
			(unsigned long long)st.requests);
	}
	ioc_loop_set_fd(loop, sfd, NULL, NULL, NULL, NULL, NULL);
	close(sfd);
	r = ioc_nbd_server_stop(srv);
	if (r < 0)
		fprintf(stderr, "%s: flush at exit: %s\n", prog, strerror(-r));
	ioc_daemon_nbd_control_free(ctl);
	ioc_nbd_server_free(srv);
	if (zimg && verbose) {
		struct ioc_zip_image_info zi;
		ioc_zip_image_get_info(zimg, &zi);
		fprintf(stderr, "%s: frame cache: %llu hits, %llu misses, %llu evictions, "
			"%llu admitted; %llu decodes (%llu readahead, %llu in place), "
			"%llu stored frames read (%llu whole-frame checks, %llu page checks), "
			"%llu streaming reads, %llu errors\n",
			prog, (unsigned long long)zi.cache_hits,
			(unsigned long long)zi.cache_misses,
			(unsigned long long)zi.cache_evictions,
			(unsigned long long)zi.cache_admitted,
			(unsigned long long)zi.decodes, (unsigned long long)zi.readaheads,
			(unsigned long long)zi.direct_decodes,
			(unsigned long long)zi.stored_reads,
			(unsigned long long)zi.stored_checks,
			(unsigned long long)zi.page_checks,
			(unsigned long long)zi.stream_reads, (unsigned long long)zi.errors);
	}
	ioc_node_graph_free(graph);
	ioc_zip_overlay_close(zov);
	ioc_zip_image_close(zimg);
	if (blk)
		ioc_blk_close(blk);
	if (in.blk)
		ioc_blk_close(in.blk);
	ioc_loop_free(loop);
	unlink_owned(&owned_sock);
	unlink_owned(&owned_ctl);
	unlink_owned(&owned_pid);
	return r < 0 || in.exit_code ? 1 : 0;
}
