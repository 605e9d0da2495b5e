/*
 * iocore-ctl: a command-line client for iocore-nbd's control socket
 * (QMP).  It negotiates capabilities, sends one command built from
 * key=value arguments and prints the reply: readable text by default,
 * the reply's JSON with --json.  "events" prints events as they come.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "iocore-ctl";
static bool opt_json;

static void usage(FILE *f)
{
	fprintf(f,
"Usage: %s -s PATH [--json] COMMAND [KEY=VALUE | KEY:=JSON ...]\n"
"       %s -s PATH [--json] events\n"
"       %s -s PATH migrate tcp:HOST:PORT [--wait] [KEY=VALUE ...]\n"
"Send a QMP command to the control socket iocore-nbd serves at PATH and\n"
"print the reply.  KEY=VALUE passes true, false and integers as such and\n"
"anything else as a string; KEY:=JSON passes any JSON value.\n"
"\n"
"  -s, --socket PATH   the control socket\n"
"  -j, --json          print the reply's JSON (one line) instead of text\n"
"  -h, --help          this text\n"
"\n"
"Examples:\n"
"  %s -s ctl.sock block-dirty-bitmap-add node=disk name=b0 persistent=true\n"
"  %s -s ctl.sock query-named-block-nodes\n"
"  %s -s ctl.sock block-dirty-bitmap-merge node=disk target=b0 bitmaps:='[\"b1\"]'\n"
"  %s -s ctl.sock events\n"
"  %s -s ctl.sock migrate tcp:192.0.2.7:4444 --wait\n"
"\n"
"migrate with --wait follows the migration (copied, rate, remaining, dirty\n"
"rate) until it ends, prints the totals, and exits 0 only if it completed.\n",
		prog, prog, prog, prog, prog, prog, prog, prog);
}

/* ---- the connection ---------------------------------------------------- */

static int sock = -1;
static char inbuf[1 << 20];
static size_t inlen;

static int connect_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "%s: socket path too long\n", prog);
		return -1;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "%s: cannot connect to %s: %s\n", prog, path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* The next message (replies and events end in CRLF), or NULL at EOF. */
static json_t *next_message(void)
{
	for (;;) {
		char *nl = memchr(inbuf, '\n', inlen);

		if (nl) {
			size_t n = (size_t)(nl - inbuf) + 1;
			json_error_t err;
			json_t *v = json_loadb(inbuf, n, 0, &err);

			memmove(inbuf, inbuf + n, inlen - n);
			inlen -= n;
			if (!v) {
				fprintf(stderr, "%s: bad reply: %s\n", prog, err.text);
				continue;
			}
			return v;
		}
		if (inlen == sizeof(inbuf)) {
			fprintf(stderr, "%s: reply too long\n", prog);
			return NULL;
		}
		ssize_t r = read(sock, inbuf + inlen, sizeof(inbuf) - inlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return NULL;
		inlen += (size_t)r;
	}
}

static int send_message(json_t *v)
{
	char *s = json_dumps(v, JSON_COMPACT);
	size_t n = s ? strlen(s) : 0, off = 0;

	while (s && off < n) {
		ssize_t r = write(sock, s + off, n - off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	free(s);
	return s && off == n ? 0 : -1;
}

/* Send a command and wait for its reply (printing events that come in
 * between when following them). */
static json_t *execute(const char *cmd, json_t *args)
{
	json_t *req = json_pack("{s:s}", "execute", cmd), *m;

	if (args)
		json_object_set(req, "arguments", args);
	if (send_message(req) < 0) {
		json_decref(req);
		return NULL;
	}
	json_decref(req);
	while ((m = next_message())) {
		if (json_object_get(m, "return") || json_object_get(m, "error"))
			return m;
		json_decref(m); /* an event */
	}
	return NULL;
}

/* ---- arguments ----------------------------------------------------------- */

static json_t *parse_value(const char *s)
{
	char *end;

	if (strcmp(s, "true") == 0)
		return json_true();
	if (strcmp(s, "false") == 0)
		return json_false();
	if (*s && (*s != '-' || s[1])) {
		errno = 0;
		long long v = strtoll(s, &end, 10);
		if (!*end && !errno)
			return json_integer(v);
	}
	return json_string(s);
}

static json_t *parse_args(int argc, char **argv)
{
	json_t *args = json_object();

	for (int i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '='), *key;
		json_t *v;

		if (!eq || eq == argv[i]) {
			fprintf(stderr, "%s: argument '%s' is not KEY=VALUE\n", prog, argv[i]);
			exit(2);
		}
		key = strndup(argv[i], (size_t)(eq - argv[i]));
		if (eq[-1] == ':') {
			json_error_t err;

			key[eq - argv[i] - 1] = '\0';
			v = json_loads(eq + 1, JSON_DECODE_ANY, &err);
			if (!v) {
				fprintf(stderr, "%s: %s: bad JSON: %s\n", prog, key, err.text);
				exit(2);
			}
		} else {
			v = parse_value(eq + 1);
		}
		json_object_set_new(args, key, v);
		free(key);
	}
	return args;
}

/* ---- printing -------------------------------------------------------------- */

static const char *human(uint64_t b, char *buf, size_t len)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)b;
	int i = 0;

	while (v >= 1024 && i < 5) {
		v /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", v, u[i]);
	return buf;
}

static uint64_t u64(json_t *o, const char *k)
{
	return (uint64_t)json_integer_value(json_object_get(o, k));
}

static const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : "";
}

static void print_nodes(json_t *ret)
{
	size_t i, j;
	json_t *n, *b;
	char h1[32], h2[32];

	json_array_foreach(ret, i, n) {
		json_t *img = json_object_get(n, "image");

		json_t *ov = json_object_get(img, "__org.iocore_zip-overlay");
		json_t *z;

		printf("node %s: %s, %s%s\n", str(n, "node-name"), str(n, "file"),
		       human(u64(img, "virtual-size"), h1, sizeof(h1)),
		       json_is_true(json_object_get(n, "ro")) ? ", read-only" : "");
		if (ov) {
			printf("  overlay: %" PRIu64 " clusters written, %" PRIu64 " zeroed, "
			       "over %s\n", u64(ov, "clusters-written"),
			       u64(ov, "clusters-zero"), str(n, "backing_file"));
			img = json_object_get(img, "backing-image");
		}
		z = json_object_get(img, "__org.iocore_zip");
		if (z) {
			printf("  compressed: %s on disk (%s), %" PRIu64 " frames of zeros\n",
			       human(u64(img, "actual-size"), h1, sizeof(h1)),
			       str(z, "indexed-by"), u64(z, "zero-frames"));
			printf("  frame cache: %s of %s, %" PRIu64 " hits, %" PRIu64 " misses, %"
			       PRIu64 " evictions; %" PRIu64 " decodes, %" PRIu64
			       " stored reads, %" PRIu64 " errors\n",
			       human(u64(z, "frame-cache-bytes"), h1, sizeof(h1)),
			       human(u64(z, "frame-cache-size"), h2, sizeof(h2)),
			       u64(z, "cache-hits"), u64(z, "cache-misses"),
			       u64(z, "cache-evictions"), u64(z, "decodes"),
			       u64(z, "stored-reads"), u64(z, "errors"));
		}
		json_array_foreach(json_object_get(n, "dirty-bitmaps"), j, b) {
			bool inc = json_is_true(json_object_get(b, "inconsistent"));

			printf("  bitmap %-16s %10s dirty, granularity %s%s%s%s\n",
			       str(b, "name"), human(u64(b, "count"), h1, sizeof(h1)),
			       human(u64(b, "granularity"), h2, sizeof(h2)),
			       json_is_true(json_object_get(b, "recording")) ? ", recording" :
			       ", disabled",
			       json_is_true(json_object_get(b, "persistent")) ? ", persistent" : "",
			       inc ? ", INCONSISTENT" : "");
		}
	}
}

static void print_blockstats(json_t *ret)
{
	size_t i;
	json_t *n;
	char h1[32], h2[32];

	json_array_foreach(ret, i, n) {
		json_t *s = json_object_get(n, "stats");

		printf("node %s:\n", str(n, "node-name"));
		printf("  read   %10" PRIu64 " ops %12s  failed %" PRIu64 "\n",
		       u64(s, "rd_operations"), human(u64(s, "rd_bytes"), h1, sizeof(h1)),
		       u64(s, "failed_rd_operations"));
		printf("  write  %10" PRIu64 " ops %12s  failed %" PRIu64 "\n",
		       u64(s, "wr_operations"), human(u64(s, "wr_bytes"), h2, sizeof(h2)),
		       u64(s, "failed_wr_operations"));
		printf("  flush  %10" PRIu64 " ops %12s  failed %" PRIu64 "\n",
		       u64(s, "flush_operations"), "", u64(s, "failed_flush_operations"));
		printf("  unmap  %10" PRIu64 " ops %12s  failed %" PRIu64 "\n",
		       u64(s, "unmap_operations"), human(u64(s, "unmap_bytes"), h1, sizeof(h1)),
		       u64(s, "failed_unmap_operations"));
	}
}

static void print_connections(json_t *ret)
{
	size_t i;
	json_t *c;
	const char *k;
	json_t *st;
	char h[32];

	if (!json_array_size(ret))
		printf("no connections\n");
	json_array_foreach(ret, i, c) {
		int th = (int)json_integer_value(json_object_get(c, "thread"));
		char where[64];

		/* -1: the export's own I/O thread (iothread=). */
		if (th >= 0)
			snprintf(where, sizeof(where), "thread %d", th);
		else
			snprintf(where, sizeof(where), "the export's I/O thread");
		printf("%s export \"%s\" %s (tid %" PRIu64 ")%s%s, %" PRIu64 " in flight, %"
		       PRIu64 " errors\n", str(c, "address"), str(c, "export"), where,
		       u64(c, "thread-id"),
		       json_is_true(json_object_get(c, "tls")) ? ", TLS" : "",
		       json_is_true(json_object_get(c, "transmission")) ? "" : ", handshake",
		       u64(c, "in-flight"), u64(c, "errors"));
		json_object_foreach(json_object_get(c, "requests"), k, st) {
			if (!u64(st, "operations"))
				continue;
			printf("  %-13s %10" PRIu64 " ops %12s  failed %" PRIu64 "\n", k,
			       u64(st, "operations"), human(u64(st, "bytes"), h, sizeof(h)),
			       u64(st, "failed"));
		}
	}
}

static void print_reply(const char *cmd, json_t *ret)
{
	char *s;

	if (opt_json) {
		s = json_dumps(ret, JSON_COMPACT | JSON_ENCODE_ANY);
		printf("%s\n", s ? s : "null");
		free(s);
		return;
	}
	if (strcmp(cmd, "query-named-block-nodes") == 0) {
		print_nodes(ret);
	} else if (strcmp(cmd, "query-blockstats") == 0) {
		print_blockstats(ret);
	} else if (strcmp(cmd, "__org.iocore_query-connections") == 0) {
		print_connections(ret);
	} else if (strcmp(cmd, "query-block-exports") == 0) {
		size_t i;
		json_t *e;

		json_array_foreach(ret, i, e)
			printf("export %s: %s, node %s%s\n", str(e, "id"), str(e, "type"),
			       str(e, "node-name"),
			       json_is_true(json_object_get(e, "shutting-down")) ?
			       ", shutting down" : "");
	} else if (json_is_object(ret) && json_object_size(ret) == 0) {
		printf("OK\n");
	} else {
		s = json_dumps(ret, JSON_INDENT(2) | JSON_ENCODE_ANY);
		printf("%s\n", s ? s : "null");
		free(s);
	}
}

/* ---- migrate --wait ---------------------------------------------------- */

static double num(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_number(v) ? json_number_value(v) : 0;
}

static void print_progress(json_t *q, bool tty)
{
	json_t *d = json_object_get(q, "disk");
	uint64_t total = u64(d, "total"), rem = u64(d, "remaining");
	uint64_t copied = total > rem ? total - rem : 0;
	char h1[32], h2[32], h3[32], h4[32], h5[32];

	printf("%s%-14s copied %s of %s (%.0f%%), %s/s, remaining %s, dirty %s/s, "
	       "pass %" PRIu64 "%s", tty ? "\r" : "", str(q, "status"),
	       human(copied, h1, sizeof(h1)), human(total, h2, sizeof(h2)),
	       total ? 100.0 * (double)copied / (double)total : 0.0,
	       human((uint64_t)(num(d, "mbps") * 1e6 / 8), h3, sizeof(h3)),
	       human(rem, h4, sizeof(h4)),
	       human(u64(d, "dirty-pages-rate") * u64(d, "page-size"), h5, sizeof(h5)),
	       u64(d, "dirty-sync-count"), tty ? "\033[K" : "\n");
	fflush(stdout);
}

static void print_totals(json_t *q)
{
	json_t *d = json_object_get(q, "disk"), *c = json_object_get(q, "compression");
	char h1[32], h2[32], h3[32];

	printf("migration %s in %" PRIu64 " ms", str(q, "status"), u64(q, "total-time"));
	if (json_object_get(q, "downtime"))
		printf(", downtime %" PRIu64 " ms", u64(q, "downtime"));
	printf("\n  image %s: %s on the wire, %" PRIu64 " zero and %" PRIu64
	       " data blocks of %s, %" PRIu64 " passes, %.1f Mbit/s\n",
	       human(u64(d, "total"), h1, sizeof(h1)),
	       human(u64(d, "transferred"), h2, sizeof(h2)), u64(d, "duplicate"),
	       u64(d, "normal"), human(u64(d, "page-size"), h3, sizeof(h3)),
	       u64(d, "dirty-sync-count"), num(d, "mbps"));
	if (c)
		printf("  compression: %" PRIu64 " blocks to %s (ratio %.2f), workers busy "
		       "%" PRIu64 " times\n", u64(c, "pages"),
		       human(u64(c, "compressed-size"), h1, sizeof(h1)),
		       num(c, "compression-rate"), u64(c, "busy"));
	if (json_object_get(q, "__org.iocore_amplification"))
		printf("  copy amplification %.2f\n", num(q, "__org.iocore_amplification"));
	if (json_object_get(q, "error-desc"))
		printf("  error: %s\n", str(q, "error-desc"));
}

/* Poll query-migrate until the migration ends; 0 if it completed. */
static int migrate_wait(void)
{
	bool tty = isatty(STDOUT_FILENO) && !opt_json;

	for (;;) {
		json_t *r = execute("query-migrate", NULL), *q;
		const char *st;
		int rc;

		if (!r || !(q = json_object_get(r, "return"))) {
			fprintf(stderr, "%s: query-migrate failed\n", prog);
			json_decref(r);
			return 1;
		}
		st = str(q, "status");
		if (!strcmp(st, "completed") || !strcmp(st, "failed") ||
		    !strcmp(st, "cancelled") || !st[0]) {
			if (tty)
				printf("\n");
			if (opt_json) {
				char *s = json_dumps(q, JSON_COMPACT);
				printf("%s\n", s ? s : "");
				free(s);
			} else {
				print_totals(q);
			}
			rc = strcmp(st, "completed") == 0 ? 0 : 1;
			json_decref(r);
			return rc;
		}
		if (!opt_json)
			print_progress(q, tty);
		json_decref(r);
		struct timespec ts = { 0, 250 * 1000000 };
		nanosleep(&ts, NULL);
	}
}

static int follow_events(const char *path)
{
	json_t *m;

	if (!opt_json) {
		printf("# events from %s (interrupt to stop)\n", path);
		fflush(stdout);
	}
	while ((m = next_message())) {
		json_t *ts = json_object_get(m, "timestamp");

		if (!json_object_get(m, "event")) {
			json_decref(m);
			continue;
		}
		if (opt_json) {
			char *s = json_dumps(m, JSON_COMPACT);

			printf("%s\n", s ? s : "");
			free(s);
		} else {
			time_t t = (time_t)json_integer_value(json_object_get(ts, "seconds"));
			struct tm tm;
			char when[32], *data;

			gmtime_r(&t, &tm);
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
			data = json_dumps(json_object_get(m, "data"), JSON_COMPACT);
			printf("%s.%06d %s %s\n", when,
			       (int)json_integer_value(json_object_get(ts, "microseconds")),
			       str(m, "event"), data ? data : "");
			free(data);
		}
		fflush(stdout);
		json_decref(m);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = NULL, *cmd;
	json_t *greeting, *r, *args;
	int c, rc = 0;

	while ((c = getopt_long(argc, argv, "+s:jh", longopts, NULL)) != -1) {
		switch (c) {
		case 's': path = optarg; break;
		case 'j': opt_json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!path || optind >= argc) {
		usage(stderr);
		return 2;
	}
	cmd = argv[optind];
	bool wait = false;
	if (strcmp(cmd, "migrate") == 0) {
		/* migrate URI [--wait] [KEY=VALUE...]: the URI and --wait are
		 * taken out before the KEY=VALUE parsing. */
		int k = optind + 1;
		const char *uri = NULL;

		for (int i = optind + 1; i < argc; i++) {
			if (strcmp(argv[i], "--wait") == 0 || strcmp(argv[i], "-w") == 0)
				wait = true;
			else if (!uri && !strchr(argv[i], '='))
				uri = argv[i];
			else
				argv[k++] = argv[i];
		}
		args = parse_args(k - optind - 1, argv + optind + 1);
		if (uri)
			json_object_set_new(args, "uri", json_string(uri));
	} else {
		args = parse_args(argc - optind - 1, argv + optind + 1);
	}
	sock = connect_unix(path);
	if (sock < 0)
		return 1;
	greeting = next_message();
	if (!greeting || !json_object_get(greeting, "QMP")) {
		fprintf(stderr, "%s: %s does not speak QMP\n", prog, path);
		return 1;
	}
	json_decref(greeting);
	r = execute("qmp_capabilities", NULL);
	if (!r || !json_object_get(r, "return")) {
		fprintf(stderr, "%s: capabilities negotiation failed\n", prog);
		return 1;
	}
	json_decref(r);
	if (strcmp(cmd, "events") == 0) {
		json_decref(args);
		return follow_events(path);
	}
	r = execute(cmd, json_object_size(args) ? args : NULL);
	json_decref(args);
	if (!r) {
		fprintf(stderr, "%s: connection closed before the reply\n", prog);
		return 1;
	}
	if (json_object_get(r, "error")) {
		json_t *e = json_object_get(r, "error");

		if (opt_json) {
			char *s = json_dumps(e, JSON_COMPACT);
			fprintf(stderr, "%s\n", s ? s : "");
			free(s);
		} else {
			fprintf(stderr, "%s: %s: %s\n", prog, str(e, "class"), str(e, "desc"));
		}
		rc = 1;
	} else if (wait) {
		rc = migrate_wait();
	} else {
		print_reply(cmd, json_object_get(r, "return"));
	}
	json_decref(r);
	close(sock);
	return rc;
}
