/*
 * nbd-soak: iocore-nbd under a long, mixed, hostile load, checked byte for
 * byte (make soak; SOAK_SECONDS, default 600).
 *
 * The problem.  Unit and integration tests each look at one thing for a
 * moment.  Bugs that need time or a crowd (a leak per connection, a race
 * between a client leaving and its request finishing, a refused connection
 * that is never counted down, a wrong byte once in a million requests)
 * only show when everything happens at once for minutes.
 *
 * The design.  This program starts the server (as its child, through
 * --fork and PR_SET_CHILD_SUBREAPER, so the exit status is ours to read)
 * on a fresh image with --max-connections and fault injection, then runs,
 * all at once, until the time is up:
 *
 * - verifiers (libnbd, plain and TLS-PSK): each owns one slice of the image
 *   and keeps its shadow copy with a per-byte "known" map.  It reads
 *   (comparing every known byte), writes (some FUA), writes zeroes, trims
 *   (the range becomes unknown: the protocol promises nothing about it)
 *   and flushes, over two connections, so what one connection wrote the
 *   other must read (the server advertises CAN_MULTI_CONN);
 * - a chaos client (the raw test client): connects and leaves at every
 *   step of the handshake, leaves in the middle of a write's payload or
 *   with reads unanswered, sends garbage, all on a slice nobody verifies;
 * - a handshake flood: bursts of connections that read the greeting and go;
 * - a limit prober: opens connections until the server refuses one (the
 *   --max-connections limit is hit), then closes them and checks that a
 *   new connection is served again (the limit is released);
 * - a sampler: the server's RSS from /proc once a second.
 *
 * Faults.  --inject-faults fails one attempt in INJECT_EVERY of reads,
 * writes, write-zeroes and trims that overlap two marked slices (one plain
 * verifier's, one TLS verifier's), with EIO.  So a request may fail only if
 * it overlaps a marked slice, and only with EIO; after a failed write,
 * zero or trim the range is unknown until rewritten.  Flushes are never
 * injected and FUA requests never touch a marked slice: a failed sync would
 * make every later flush fail by design (blk.c, "Write-back errors"), which
 * test-nbd-faults checks on its own.
 *
 * The verdict is one line, "soak: N requests, M MiB, X mismatches, Y
 * unexpected errors, peak RSS R MiB, RSS growth G%", and a non-zero exit
 * on any mismatch, unexpected error, server death or exit failure, a limit
 * never hit or never released, or RSS growth over 10% in the second half
 * (the larger of the 5 samples around the half-way point against the
 * larger of the last 5).
 *
 * Rejected: Python with libnbd's bindings (one core's worth of the GIL
 * does not keep the server busy on 2 cores); random shared ranges between
 * verifiers (concurrent writers to one range make the expected content a
 * set, and the checker would be as complex as the server).
 */
#include <fcntl.h>
#include <getopt.h>
#include <libnbd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "nbd-client.h"

#define SLICE          (4u << 20)
#define NPLAIN         4
#define NTLS           2
#define NVERIFY        (NPLAIN + NTLS)
#define CHAOS_SLICE    NVERIFY          /* the slice after the verifiers' */
#define IMG_SIZE       ((uint64_t)(NVERIFY + 1) * SLICE)
#define MAX_CONNS      (2 * NVERIFY + 16)
#define INJECT_EVERY   40
#define MAX_REQ        (256u << 10)

static const unsigned marked[] = { 0, NPLAIN }; /* a plain and a TLS slice */

/* stop: set by the main thread when the time is up, polled by every
 * thread; relaxed, since it carries no data (the joins order the
 * results).  The counters are relaxed too: summed after the joins. */
static atomic_bool stop;
static _Atomic uint64_t n_requests, n_bytes, n_mismatch, n_unexpected;
static _Atomic uint64_t n_injected, n_limit_hits, n_limit_released, n_chaos;
static char dir[256], img[300], sock[300], pidf[300], psk[300];
static pid_t server_pid;

#define FAIL(...) do { fprintf(stderr, "soak: " __VA_ARGS__); fputc('\n', stderr); } while (0)

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static bool is_marked(unsigned slice)
{
	for (size_t i = 0; i < sizeof(marked) / sizeof(marked[0]); i++)
		if (marked[i] == slice)
			return true;
	return false;
}

/* ---- verifiers ------------------------------------------------------- */

struct verifier {
	unsigned id;
	bool tls;
	struct nbd_handle *h[2];
	uint8_t *shadow, *known;  /* SLICE bytes each */
	uint8_t *buf;
	uint64_t seed;
	pthread_t thr;
};

static struct nbd_handle *open_handle(bool tls)
{
	struct nbd_handle *h = nbd_create();

	if (!h)
		return NULL;
	if (tls && (nbd_set_tls(h, LIBNBD_TLS_REQUIRE) < 0 ||
		    nbd_set_tls_psk_file(h, psk) < 0 ||
		    nbd_set_tls_username(h, "soak") < 0))
		goto fail;
	/* The connection limit may be held by the prober for a moment. */
	for (int i = 0; i < 200; i++) {
		if (nbd_connect_unix(h, sock) == 0)
			return h;
		nbd_close(h);
		if (!(h = nbd_create()))
			return NULL;
		if (tls && (nbd_set_tls(h, LIBNBD_TLS_REQUIRE) < 0 ||
			    nbd_set_tls_psk_file(h, psk) < 0 ||
			    nbd_set_tls_username(h, "soak") < 0))
			goto fail;
		usleep(10000); /* back-off between attempts, not synchronisation */
	}
fail:
	FAIL("cannot connect (%s): %s", tls ? "TLS" : "plain", nbd_get_error());
	nbd_close(h);
	return NULL;
}

/* A failed request: fine only if injected (EIO on a marked slice, for an
 * operation the rule covers).  Returns true if it was expected. */
static bool failure(struct verifier *v, const char *what, uint64_t off, uint64_t len,
		    bool injectable)
{
	int err = nbd_get_errno();

	if (injectable && is_marked(v->id) && err == EIO) {
		atomic_fetch_add_explicit(&n_injected, 1, memory_order_relaxed);
		return true;
	}
	atomic_fetch_add_explicit(&n_unexpected, 1, memory_order_relaxed);
	FAIL("verifier %u: %s at %llu+%llu failed: %s (errno %d)", v->id, what,
	     (unsigned long long)off, (unsigned long long)len, nbd_get_error(), err);
	return false;
}

static void check_read(struct verifier *v, uint64_t rel, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++) {
		if (v->known[rel + i] && v->buf[i] != v->shadow[rel + i]) {
			atomic_fetch_add_explicit(&n_mismatch, 1, memory_order_relaxed);
			FAIL("verifier %u: mismatch at image offset %llu: read 0x%02x, "
			     "wrote 0x%02x", v->id,
			     (unsigned long long)((uint64_t)v->id * SLICE + rel + i),
			     v->buf[i], v->shadow[rel + i]);
			return;
		}
	}
}

static void one_request(struct verifier *v)
{
	uint64_t r = rnd(&v->seed);
	uint64_t len = (512u << (r % 10)) > MAX_REQ ? MAX_REQ : 512u << (r % 10);
	uint64_t rel, off;
	struct nbd_handle *h = v->h[(r >> 8) & 1];
	unsigned op = (unsigned)((r >> 16) % 100);
	bool fua = (r >> 24) % 4 == 0 && !is_marked(v->id);

	if ((r >> 30) % 8 == 0)
		len -= (r >> 40) % 511;    /* some unaligned lengths */
	rel = rnd(&v->seed) % (SLICE - len + 1);
	if ((r >> 33) % 2)
		rel &= ~(uint64_t)511;
	off = (uint64_t)v->id * SLICE + rel;

	if (op < 45) {
		if (nbd_pread(h, v->buf, len, off, 0) < 0)
			failure(v, "read", off, len, true);
		else
			check_read(v, rel, len);
	} else if (op < 80) {
		uint64_t salt = rnd(&v->seed);
		for (uint64_t i = 0; i < len; i++)
			v->buf[i] = (uint8_t)((salt >> ((i % 8) * 8)) + i / 8);
		if (nbd_pwrite(h, v->buf, len, off, fua ? LIBNBD_CMD_FLAG_FUA : 0) < 0) {
			if (failure(v, "write", off, len, true))
				memset(v->known + rel, 0, len);
		} else {
			memcpy(v->shadow + rel, v->buf, len);
			memset(v->known + rel, 1, len);
		}
	} else if (op < 88) {
		if (nbd_zero(h, len, off, fua ? LIBNBD_CMD_FLAG_FUA : 0) < 0) {
			if (failure(v, "write zeroes", off, len, true))
				memset(v->known + rel, 0, len);
		} else {
			memset(v->shadow + rel, 0, len);
			memset(v->known + rel, 1, len);
		}
	} else if (op < 95) {
		/* Whatever happens, the protocol promises nothing about the
		 * range afterwards. */
		memset(v->known + rel, 0, len);
		if (nbd_trim(h, len, off, 0) < 0)
			failure(v, "trim", off, len, true);
	} else {
		if (nbd_flush(h, 0) < 0)
			failure(v, "flush", 0, 0, false);
		len = 0;
	}
	atomic_fetch_add_explicit(&n_requests, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&n_bytes, len, memory_order_relaxed);
}

static void *verifier_main(void *arg)
{
	struct verifier *v = arg;

	while (!atomic_load_explicit(&stop, memory_order_relaxed))
		one_request(v);
	/* Final pass: the whole slice, from the other connection. */
	for (uint64_t rel = 0; rel < SLICE; rel += MAX_REQ) {
		uint64_t off = (uint64_t)v->id * SLICE + rel;
		if (nbd_pread(v->h[1], v->buf, MAX_REQ, off, 0) < 0)
			failure(v, "final read", off, MAX_REQ, true);
		else
			check_read(v, rel, MAX_REQ);
	}
	if (nbd_flush(v->h[0], 0) < 0)
		failure(v, "final flush", 0, 0, false);
	return NULL;
}

/* ---- chaos, flood, limit -------------------------------------------- */

/* A raw connection through the handshake; -1 when refused or failed. */
static int raw_go(struct cl_conn *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = cl_connect_unix(sock);
	if (c->fd < 0)
		return -1;
	c->structured = true;
	if (cl_go(c, "") != 0) {
		close(c->fd);
		return -1;
	}
	return 0;
}

static void *chaos_main(void *arg)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	uint8_t *payload = calloc(1, 65536);
	const uint64_t base = (uint64_t)CHAOS_SLICE * SLICE;

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		struct cl_conn c;
		uint64_t r = rnd(&seed);
		int fd;

		switch (r % 6) {
		case 0: /* connect and go */
			fd = cl_connect_unix(sock);
			if (fd >= 0)
				close(fd);
			break;
		case 1: /* leave after the greeting, or mid-options */
			fd = cl_connect_unix(sock);
			if (fd >= 0 && cl_greeting(fd) >= 0 && (r >> 8) % 2)
				cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE);
			if (fd >= 0)
				close(fd);
			break;
		case 2: /* leave in the middle of a write's payload */
			if (raw_go(&c) == 0) {
				cl_req(&c, 0, NBD_CMD_WRITE, 1, base + (r >> 20) % (SLICE - 65536),
				       65536, NULL);
				cl_write(c.fd, payload, (r >> 12) % 65536);
				close(c.fd);
			}
			break;
		case 3: /* requests in flight, replies never read */
			if (raw_go(&c) == 0) {
				for (int i = 0; i < 16; i++)
					cl_req(&c, 0, i % 2 ? NBD_CMD_READ : NBD_CMD_WRITE, (uint64_t)i,
					       base + (uint64_t)i * 65536, 65536,
					       i % 2 ? NULL : payload);
				close(c.fd);
			}
			break;
		case 4: /* garbage in transmission: the server hangs up */
			if (raw_go(&c) == 0) {
				cl_write(c.fd, "garbage garbage garbage garbage!", 32);
				close(c.fd);
			}
			break;
		case 5: /* a clean session on the chaos slice */
			if (raw_go(&c) == 0) {
				cl_cmd(&c, 0, NBD_CMD_WRITE, base, 4096, payload);
				cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL);
				cl_req(&c, 0, NBD_CMD_DISC, 2, 0, 0, NULL);
				close(c.fd);
			}
			break;
		}
		atomic_fetch_add_explicit(&n_chaos, 1, memory_order_relaxed);
	}
	free(payload);
	return arg;
}

static void *flood_main(void *arg)
{
	enum { BURST = 48 };

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		int fds[BURST];

		for (int i = 0; i < BURST; i++)
			fds[i] = cl_connect_unix(sock);
		for (int i = 0; i < BURST; i++) {
			if (fds[i] < 0)
				continue;
			if (i % 2)
				cl_greeting(fds[i]); /* refused ones just see EOF */
			close(fds[i]);
		}
		atomic_fetch_add_explicit(&n_chaos, 1, memory_order_relaxed);
	}
	return arg;
}

/* Whether a fresh connection gets a greeting (not refused at the limit). */
static int greeted(void)
{
	int fd = cl_connect_unix(sock);
	int r;

	if (fd < 0)
		return -1;
	r = cl_greeting(fd) >= 0;
	if (!r) {
		close(fd);
		return -1;
	}
	return fd;
}

static void *limit_main(void *arg)
{
	uint64_t round = 0;

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		int fds[MAX_CONNS + 8], n = 0;
		bool hit = false;

		/* Fill up to the limit: the first refusal is the limit. */
		while (n < MAX_CONNS + 8) {
			int fd = greeted();
			if (fd < 0) {
				hit = true;
				break;
			}
			fds[n++] = fd;
		}
		for (int i = 0; i < n; i++)
			close(fds[i]);
		if (!hit) {
			atomic_fetch_add_explicit(&n_unexpected, 1, memory_order_relaxed);
			FAIL("limit: %d connections accepted, limit %d", n, MAX_CONNS);
		} else {
			atomic_fetch_add_explicit(&n_limit_hits, 1, memory_order_relaxed);
		}
		/* Released: the server counts our closes down as it sees them. */
		bool ok = false;
		for (int i = 0; i < 500 && !ok; i++) {
			int fd = greeted();
			if (fd >= 0) {
				close(fd);
				ok = true;
			} else {
				usleep(10000); /* bounded retry while the closes land */
			}
		}
		if (ok) {
			atomic_fetch_add_explicit(&n_limit_released, 1, memory_order_relaxed);
		} else {
			atomic_fetch_add_explicit(&n_unexpected, 1, memory_order_relaxed);
			FAIL("limit: never released after round %llu", (unsigned long long)round);
		}
		round++;
		/* A round every couple of seconds: a cadence, not a handshake. */
		for (int i = 0; i < 20 && !atomic_load_explicit(&stop, memory_order_relaxed); i++)
			usleep(100000);
	}
	return arg;
}

/* ---- the server ------------------------------------------------------ */

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return (x > y) - (x < y);
}

/* The median of five samples. */
static long median5(const long *v)
{
	long w[5];

	memcpy(w, v, sizeof(w));
	qsort(w, 5, sizeof(w[0]), cmp_long);
	return w[2];
}

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static bool server_alive(void)
{
	int st;

	return waitpid(server_pid, &st, WNOHANG) == 0;
}

static int start_server(const char *bin)
{
	char rule[2][96], maxc[16];
	int fd, st;
	pid_t p;

	snprintf(img, sizeof(img), "%s/img", dir);
	snprintf(sock, sizeof(sock), "%s/sock", dir);
	snprintf(pidf, sizeof(pidf), "%s/pid", dir);
	snprintf(psk, sizeof(psk), "%s/keys.psk", dir);
	fd = open(img, O_CREAT | O_RDWR | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)IMG_SIZE) < 0)
		return -1;
	close(fd);
	FILE *f = fopen(psk, "w");
	if (!f)
		return -1;
	fprintf(f, "soak:");
	for (int i = 0; i < 32; i++)
		fprintf(f, "%02x", (unsigned)(i * 37 + 11) & 0xff);
	fprintf(f, "\n");
	fclose(f);
	for (int i = 0; i < 2; i++)
		snprintf(rule[i], sizeof(rule[i]), "read,write,zero,trim=EIO@%llu+%u/%d",
			 (unsigned long long)marked[i] * SLICE, SLICE, INJECT_EVERY);
	snprintf(maxc, sizeof(maxc), "%d", MAX_CONNS);
	/* The server's --fork parent exits once the child serves; as the
	 * subreaper we inherit the child and read its exit status. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		return -1;
	p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		execl(bin, bin, "--fork", "--pid-file", pidf, "-U", sock,
		      "--max-connections", maxc, "--handshake-timeout", "5",
		      "--tls", "on", "--tls-psk", psk,
		      "--inject-faults", rule[0], "--inject-faults", rule[1],
		      img, (char *)NULL);
		_exit(127);
	}
	if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	f = fopen(pidf, "r");
	if (!f || fscanf(f, "%d", &server_pid) != 1)
		return -1;
	fclose(f);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *bin = NULL;
	long seconds = 600;
	int c;

	while ((c = getopt(argc, argv, "s:b:")) != -1) {
		if (c == 's')
			seconds = strtol(optarg, NULL, 10);
		else if (c == 'b')
			bin = optarg;
	}
	if (!bin || seconds < 4) {
		fprintf(stderr, "usage: nbd-soak -b PATH/iocore-nbd [-s SECONDS (>= 4)]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/iocore-soak-XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(dir) || start_server(bin) < 0) {
		FAIL("cannot start %s: %s", bin, strerror(errno));
		return 1;
	}

	struct verifier v[NVERIFY];
	pthread_t chaos, flood, limit;
	bool setup_ok = true;

	for (unsigned i = 0; i < NVERIFY; i++) {
		v[i] = (struct verifier){ .id = i, .tls = i >= NPLAIN,
					  .seed = 0x1234567ull * (i + 1) };
		v[i].shadow = calloc(1, SLICE);
		v[i].known = malloc(SLICE);
		if (v[i].known)
			memset(v[i].known, 1, SLICE); /* a fresh image reads zeroes */
		v[i].buf = malloc(MAX_REQ);
		v[i].h[0] = open_handle(v[i].tls);
		v[i].h[1] = open_handle(v[i].tls);
		if (!v[i].h[0] || !v[i].h[1] || !v[i].shadow || !v[i].known || !v[i].buf)
			setup_ok = false;
	}
	if (!setup_ok) {
		kill(server_pid, SIGKILL);
		return 1;
	}
	for (unsigned i = 0; i < NVERIFY; i++)
		pthread_create(&v[i].thr, NULL, verifier_main, &v[i]);
	pthread_create(&chaos, NULL, chaos_main, NULL);
	pthread_create(&flood, NULL, flood_main, NULL);
	pthread_create(&limit, NULL, limit_main, NULL);

	/* The sampler: one RSS sample a second. */
	long *rss = calloc((size_t)seconds + 8, sizeof(long));
	long nsamp = 0, peak = 0;
	bool died = false;
	double t0 = now_s();
	while (now_s() - t0 < (double)seconds) {
		sleep(1); /* the sampling period, not synchronisation */
		if (!server_alive()) {
			died = true;
			FAIL("the server died during the run");
			break;
		}
		long k = rss_kib(server_pid);
		if (k > 0 && nsamp < seconds + 8) {
			rss[nsamp++] = k;
			if (k > peak)
				peak = k;
		}
	}
	atomic_store_explicit(&stop, true, memory_order_relaxed);
	for (unsigned i = 0; i < NVERIFY; i++)
		pthread_join(v[i].thr, NULL);
	pthread_join(chaos, NULL);
	pthread_join(flood, NULL);
	pthread_join(limit, NULL);
	for (unsigned i = 0; i < NVERIFY; i++) {
		nbd_shutdown(v[i].h[0], 0);
		nbd_shutdown(v[i].h[1], 0);
		nbd_close(v[i].h[0]);
		nbd_close(v[i].h[1]);
		free(v[i].shadow);
		free(v[i].known);
		free(v[i].buf);
	}

	/* RSS growth over the second half: the median of five samples around
	 * the middle against the median of the last five.  A leak raises
	 * every sample; a median ignores the one-second peaks of a handshake
	 * flood or a burst of TLS sessions that a maximum would report. */
	double growth = 0;
	if (nsamp >= 10) {
		long mid = median5(&rss[nsamp / 2 - 2]);
		long end = median5(&rss[nsamp - 5]);

		growth = mid > 0 ? 100.0 * (double)(end - mid) / (double)mid : 0;
	}
	free(rss);

	/* Stop the server: it must flush and exit 0. */
	int st = 0;
	bool exit_ok = false;
	if (!died) {
		kill(server_pid, SIGTERM);
		if (waitpid(server_pid, &st, 0) == server_pid)
			exit_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (!exit_ok)
			FAIL("the server's exit: %s %d", WIFSIGNALED(st) ? "signal" : "status",
			     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	}
	unlink(img);
	unlink(psk);
	unlink(sock);
	unlink(pidf);
	rmdir(dir);

	uint64_t mism = atomic_load(&n_mismatch), unexp = atomic_load(&n_unexpected);
	fprintf(stderr, "soak: %llu injected errors seen, %llu chaos/flood rounds, "
		"limit hit %llu times and released %llu times\n",
		(unsigned long long)atomic_load(&n_injected),
		(unsigned long long)atomic_load(&n_chaos),
		(unsigned long long)atomic_load(&n_limit_hits),
		(unsigned long long)atomic_load(&n_limit_released));
	bool ok = !died && exit_ok && mism == 0 && unexp == 0 && growth <= 10.0 &&
		atomic_load(&n_limit_hits) > 0 && atomic_load(&n_limit_released) > 0 &&
		atomic_load(&n_injected) > 0;
	if (atomic_load(&n_injected) == 0)
		FAIL("no injected error was seen: the fault path went unexercised");
	if (growth > 10.0)
		FAIL("server RSS grew %.1f%% in the second half", growth);
	printf("soak: %llu requests, %llu MiB, %llu mismatches, %llu unexpected errors, "
	       "peak RSS %ld MiB, RSS growth %.1f%%\n",
	       (unsigned long long)atomic_load(&n_requests),
	       (unsigned long long)(atomic_load(&n_bytes) >> 20),
	       (unsigned long long)mism, (unsigned long long)unexp, peak / 1024, growth);
	return ok ? 0 : 1;
}
