/*
 * bench-zc-send: what it costs a server to send cached file data to a
 * socket, by each way the kernel offers, side by side in one run:
 *
 *   copy     pread() into a buffer, send() it (iocore-nbd below the
 *            threshold, and every peer)
 *   splice   splice() file -> pipe, splice() pipe -> socket (iocore-nbd's
 *            zero-copy reads)
 *   zerocopy pread() into a buffer, send(MSG_ZEROCOPY), completions reaped
 *            from the error queue before the buffer is reused (TCP only:
 *            Unix sockets refuse SO_ZEROCOPY)
 *
 * over a Unix socket pair and loopback TCP, in chunks of 64 KiB and 1 MiB.
 * The sender's thread CPU time per MiB is the server's cost; the receiver
 * (a thread that recv()s and drops) stands in for the client.  Printed:
 * MiB/s and sender CPU us/MiB, and both as ratios to "copy" of the same
 * socket and chunk.  Usage: bench-zc-send [--quick] [FILE_DIR]
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double now(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *drain(void *arg)
{
	int fd = *(int *)arg;
	static __thread char buf[1 << 20];

	while (recv(fd, buf, sizeof(buf), 0) > 0)
		;
	return NULL;
}

static int pair(bool tcp, int sv[2])
{
	if (!tcp)
		return socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &l) < 0 || listen(ls, 1) < 0)
		return -1;
	sv[0] = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(sv[0], (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	sv[1] = accept(ls, NULL, NULL);
	close(ls);
	setsockopt(sv[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return sv[1] < 0 ? -1 : 0;
}

static int send_all(int fd, const char *p, size_t n, int flags)
{
	while (n) {
		ssize_t s = send(fd, p, n, flags);

		if (s < 0 && errno == ENOBUFS && (flags & MSG_ZEROCOPY))
			return -ENOBUFS;
		if (s < 0)
			return -errno;
		p += s;
		n -= (size_t)s;
	}
	return 0;
}

/* Wait for every MSG_ZEROCOPY send up to id hi to be notified. */
static int zc_reap(int fd, uint32_t *done, uint32_t want, bool *copied)
{
	while (*done < want) {
		char ctl[128];
		struct msghdr m = { .msg_control = ctl, .msg_controllen = sizeof(ctl) };

		if (recvmsg(fd, &m, MSG_ERRQUEUE) < 0) {
			if (errno == EAGAIN || errno == EINTR) {
				struct timespec t = { 0, 20000 };
				nanosleep(&t, NULL);
				continue;
			}
			return -errno;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			struct sock_extended_err *e = (void *)CMSG_DATA(c);

			if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY)
				continue;
			if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
				*copied = true;
			*done = e->ee_data + 1;
		}
	}
	return 0;
}

enum { COPY, SPLICE, ZEROCOPY, NMODES };
static const char *const mode_name[] = { "copy", "splice", "zerocopy" };

/* Send total bytes of file fd in chunks; returns MiB/s, *cpu sender us/MiB. */
static double run(int mode, bool tcp, int fd, size_t file_size, size_t chunk,
		  size_t total, double *cpu, const char **note)
{
	int sv[2], pfd[2] = { -1, -1 }, one = 1;
	pthread_t th;
	char *buf = aligned_alloc(4096, chunk);
	uint32_t zc_sent = 0, zc_done = 0;
	bool copied = false;
	double w0, c0, w1, c1;

	*note = "";
	if (pair(tcp, sv) < 0) {
		*note = "no socket";
		return -1;
	}
	if (mode == ZEROCOPY && setsockopt(sv[0], SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one))) {
		*note = "SO_ZEROCOPY refused";
		close(sv[0]);
		close(sv[1]);
		free(buf);
		return -1;
	}
	if (mode == SPLICE) {
		if (pipe(pfd) < 0 || fcntl(pfd[1], F_SETPIPE_SZ, (int)chunk) < (int)chunk) {
			*note = "pipe";
			return -1;
		}
	}
	pthread_create(&th, NULL, drain, &sv[1]);
	w0 = now(CLOCK_MONOTONIC);
	c0 = now(CLOCK_THREAD_CPUTIME_ID);
	for (size_t done = 0; done < total; done += chunk) {
		off_t off = (off_t)(done % (file_size - file_size % chunk));
		int r = 0;

		if (mode == SPLICE) {
			size_t in = 0;
			while (in < chunk) {
				loff_t o = off + (loff_t)in;
				ssize_t n = splice(fd, &o, pfd[1], NULL, chunk - in, 0);
				if (n <= 0)
					abort();
				in += (size_t)n;
			}
			while (in) {
				ssize_t n = splice(pfd[0], NULL, sv[0], NULL, in, SPLICE_F_MORE);
				if (n <= 0)
					abort();
				in -= (size_t)n;
			}
			continue;
		}
		if (mode == ZEROCOPY && zc_reap(sv[0], &zc_done, zc_sent, &copied) < 0)
			abort(); /* the buffer is reused: its last send must be done */
		if (pread(fd, buf, chunk, off) != (ssize_t)chunk)
			abort();
		r = send_all(sv[0], buf, chunk, mode == ZEROCOPY ? MSG_ZEROCOPY : 0);
		if (r < 0)
			abort();
		if (mode == ZEROCOPY)
			zc_sent++;
	}
	if (mode == ZEROCOPY && zc_reap(sv[0], &zc_done, zc_sent, &copied) < 0)
		abort();
	c1 = now(CLOCK_THREAD_CPUTIME_ID);
	shutdown(sv[0], SHUT_WR);
	pthread_join(th, NULL);
	w1 = now(CLOCK_MONOTONIC);
	if (copied)
		*note = "kernel copied (SO_EE_CODE_ZEROCOPY_COPIED)";
	close(sv[0]);
	close(sv[1]);
	if (pfd[0] >= 0) {
		close(pfd[0]);
		close(pfd[1]);
	}
	free(buf);
	double mib = (double)total / (1 << 20);
	*cpu = (c1 - c0) * 1e6 / mib;
	return mib / (w1 - w0);
}

int main(int argc, char **argv)
{
	bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
	const char *dir = argc > 1 + quick ? argv[1 + quick] : "/dev/shm";
	size_t file_size = 64u << 20, total = (quick ? 256u : 1024u) << 20;
	char path[512];
	static const size_t chunks[] = { 64u << 10, 1u << 20 };

	snprintf(path, sizeof(path), "%s/bench-zc-send.%d", dir, (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0) {
		perror(path);
		return 1;
	}
	unlink(path);
	char *b = malloc(1 << 20);
	memset(b, 0x5a, 1 << 20);
	for (size_t o = 0; o < file_size; o += 1 << 20)
		if (pwrite(fd, b, 1 << 20, (off_t)o) != 1 << 20)
			return 1;
	free(b);
	/* Round robin, three rounds, medians: the machine is shared. */
	double mbs[2][2][NMODES][3], cpu[2][2][NMODES][3];
	const char *notes[2][2][NMODES];
	for (int rnd = 0; rnd < 3; rnd++)
		for (int t = 0; t < 2; t++)
			for (int c = 0; c < 2; c++)
				for (int m = 0; m < NMODES; m++)
					mbs[t][c][m][rnd] = run(m, t, fd, file_size, chunks[c], total,
								&cpu[t][c][m][rnd], &notes[t][c][m]);
	for (int t = 0; t < 2; t++) {
		for (int c = 0; c < 2; c++) {
			double ref_m = 0, ref_c = 0;
			for (int m = 0; m < NMODES; m++) {
				double *x = mbs[t][c][m], *y = cpu[t][c][m], tmp;
				/* median of three */
				for (int i = 0; i < 2; i++)
					for (int j = 0; j < 2 - i; j++) {
						if (x[j] > x[j + 1]) { tmp = x[j]; x[j] = x[j + 1]; x[j + 1] = tmp; }
						if (y[j] > y[j + 1]) { tmp = y[j]; y[j] = y[j + 1]; y[j + 1] = tmp; }
					}
				if (m == COPY) {
					ref_m = x[1];
					ref_c = y[1];
				}
				if (x[1] < 0) {
					printf("%-4s %4zuK %-9s -- %s\n", t ? "tcp" : "unix",
					       chunks[c] >> 10, mode_name[m], notes[t][c][m]);
					continue;
				}
				printf("%-4s %4zuK %-9s %7.0f MiB/s (%.2fx)  sender CPU %6.1f us/MiB (%.2fx) %s\n",
				       t ? "tcp" : "unix", chunks[c] >> 10, mode_name[m], x[1],
				       x[1] / ref_m, y[1], y[1] / ref_c, notes[t][c][m]);
			}
		}
	}
	close(fd);
	return 0;
}
