/*
 * The migration's TLS sessions (src/nbd/tls.c, ioc__nbd_tls_mig_*()) on a
 * non-blocking socket, as the source's engine uses them (migrate.h's
 * contract): recv returns -EAGAIN when nothing is there, a send that
 * fills the socket returns -EAGAIN and, called again with the same
 * buffer once the peer reads, delivers every byte once and in order.
 * Both handshakes block (PSK, over a socketpair).
 */
#include "ioc-config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tap.h"
#include "nbd-int.h"

static struct ioc__nbd_tls_creds *creds;
static char dir[] = "/tmp/ioc-tls-mig.XXXXXX";
static char psk[sizeof(dir) + 16];

struct peer {
	int fd;
	struct ioc__nbd_tls *t;
	int ret;
	char err[256];
	size_t want;            /* bytes the reader expects */
	uint64_t got, bad;      /* read, and out of pattern */
};

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 7 + (i >> 11));
}

static void *accept_thread(void *opaque)
{
	struct peer *p = opaque;

	p->ret = ioc__nbd_tls_mig_accept(&p->t, creds, p->fd, p->err, sizeof(p->err));
	return NULL;
}

/* The blocking peer: read want bytes and check them. */
static void *read_thread(void *opaque)
{
	struct peer *p = opaque;
	uint8_t buf[8192];

	while (p->got < p->want) {
		ssize_t n = ioc__nbd_tls_mig_recv(p->t, buf, sizeof(buf));

		if (n <= 0) {
			p->ret = n < 0 ? (int)n : -EPIPE;
			return NULL;
		}
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(p->got + (uint64_t)i))
				p->bad++;
		p->got += (uint64_t)n;
	}
	return NULL;
}

/* The rest of a stepped client handshake on a non-blocking fd, waiting
 * in poll() for what each -EAGAIN asks. */
static int step_on(struct peer *cli)
{
	for (;;) {
		bool want_write = false;
		struct pollfd pf = { .fd = cli->fd };
		int r = ioc__nbd_tls_mig_handshake(cli->t, &want_write, cli->err,
						   sizeof(cli->err));

		if (r != -EAGAIN)
			return r;
		pf.events = want_write ? POLLOUT : POLLIN;
		if (poll(&pf, 1, 10000) != 1)
			return -ETIMEDOUT;
	}
}

/* A session pair: *cli on a non-blocking fd (its handshake stepped),
 * *srv on a blocking one. */
static void pair(struct peer *cli, struct peer *srv)
{
	bool want_write = true;
	int sv[2];
	pthread_t th;

	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	memset(cli, 0, sizeof(*cli));
	memset(srv, 0, sizeof(*srv));
	cli->fd = sv[0];
	srv->fd = sv[1];
	ASSERT_EQ(fcntl(cli->fd, F_SETFL, fcntl(cli->fd, F_GETFL) | O_NONBLOCK), 0);
	ASSERT_EQ(ioc__nbd_tls_mig_connect(&cli->t, creds, cli->fd, "localhost", true,
					   cli->err, sizeof(cli->err)), 0);
	/* No server runs yet: the first step sends the hello and must come
	 * back for the answer instead of blocking. */
	ASSERT_EQ(ioc__nbd_tls_mig_handshake(cli->t, &want_write, cli->err,
					     sizeof(cli->err)), -EAGAIN);
	ASSERT_EQ(want_write, false);
	ASSERT_EQ(pthread_create(&th, NULL, accept_thread, srv), 0);
	cli->ret = step_on(cli);
	if (cli->ret < 0)
		shutdown(cli->fd, SHUT_RDWR); /* ends the server's handshake */
	pthread_join(th, NULL);
	if (cli->ret < 0 || srv->ret < 0)
		ioc_test_diag("handshake: %s / %s", cli->err, srv->err);
	ASSERT_EQ(cli->ret, 0);
	ASSERT_EQ(srv->ret, 0);
}

static void unpair(struct peer *cli, struct peer *srv)
{
	ioc__nbd_tls_free(cli->t);
	ioc__nbd_tls_free(srv->t);
	close(cli->fd);
	close(srv->fd);
}

static void setup(void);

static void test_recv_eagain(void)
{
	struct peer cli, srv;
	struct pollfd pf;
	char buf[64];

	setup();
	pair(&cli, &srv);
	/* Nothing sent: -EAGAIN, not a wait (nor a spin). */
	ASSERT_EQ(ioc__nbd_tls_mig_recv(cli.t, buf, sizeof(buf)), -EAGAIN);
	ASSERT_EQ(ioc__nbd_tls_mig_send(srv.t, "answer", 6), 6);
	/* Readable, then the bytes; then -EAGAIN again. */
	pf = (struct pollfd){ .fd = cli.fd, .events = POLLIN };
	ASSERT_EQ(poll(&pf, 1, -1), 1);
	ssize_t n;
	while ((n = ioc__nbd_tls_mig_recv(cli.t, buf, sizeof(buf))) == -EAGAIN)
		ASSERT_EQ(poll(&pf, 1, -1), 1);
	ASSERT_EQ(n, 6);
	ASSERT_EQ(memcmp(buf, "answer", 6), 0);
	ASSERT_EQ(ioc__nbd_tls_mig_recv(cli.t, buf, sizeof(buf)), -EAGAIN);
	unpair(&cli, &srv);
}

static void test_send_again(void)
{
	enum { LEN = 4 << 20 };
	struct peer cli, srv;
	uint8_t *data = malloc(LEN);
	size_t off = 0;
	unsigned eagain = 0;
	pthread_t th;

	setup();
	ASSERT_NOT_NULL(data);
	for (size_t i = 0; i < LEN; i++)
		data[i] = pattern(i);
	pair(&cli, &srv);
	/* Fill the socket until it refuses: nobody reads yet. */
	for (;;) {
		ssize_t n = ioc__nbd_tls_mig_send(cli.t, data + off, LEN - off);

		if (n == -EAGAIN)
			break;
		ASSERT_GT(n, 0);
		off += (size_t)n;
		ASSERT_LT(off, LEN); /* a socketpair holds far less */
	}
	/* The reader drains; the same buffer again until all is out. */
	srv.want = LEN;
	ASSERT_EQ(pthread_create(&th, NULL, read_thread, &srv), 0);
	while (off < LEN) {
		ssize_t n = ioc__nbd_tls_mig_send(cli.t, data + off, LEN - off);

		if (n == -EAGAIN) {
			struct pollfd pf = { .fd = cli.fd, .events = POLLOUT };

			eagain++;
			ASSERT_EQ(poll(&pf, 1, -1), 1);
			continue;
		}
		ASSERT_GT(n, 0);
		off += (size_t)n;
	}
	pthread_join(th, NULL);
	ASSERT_EQ(srv.ret, 0);
	ASSERT_UEQ(srv.got, LEN);
	ASSERT_UEQ(srv.bad, 0);
	ioc_test_diag("%u sends waited", eagain + 1);
	unpair(&cli, &srv);
	free(data);
}

/* The source reads the key file at each connect: it goes at the end. */
static void cleanup(void)
{
	ioc__nbd_tls_creds_free(creds);
	unlink(psk);
	rmdir(dir);
}

static void setup(void)
{
	struct ioc_nbd_tls_opts o = { .mode = IOC_NBD_TLS_ON };
	char err[256];
	FILE *f;

	if (!IOC_HAVE_GNUTLS)
		IOC_SKIP("built without GnuTLS");
	if (creds)
		return;
	if (!mkdtemp(dir))
		IOC_SKIP("no temporary directory");
	snprintf(psk, sizeof(psk), "%s/keys.psk", dir);
	f = fopen(psk, "w");
	if (!f)
		IOC_SKIP("cannot write the key file");
	fprintf(f, "alice:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n");
	fclose(f);
	o.psk_file = psk;
	atexit(cleanup);
	if (ioc__nbd_tls_creds_new(&creds, &o, err, sizeof(err)) < 0)
		ioc_test_diag("%s", err);
	ASSERT_NOT_NULL(creds);
}

IOC_TEST_MAIN(
	IOC_TEST(test_recv_eagain),
	IOC_TEST(test_send_again),
)
