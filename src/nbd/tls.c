/*
 * TLS for the NBD server: GnuTLS credentials and sessions behind a small
 * non-blocking interface for conn.c.  Problem: NBD crosses networks
 * (migration, backup to another host), and proto.md upgrades a session in
 * place with NBD_OPT_STARTTLS.  The connection code is non-blocking and
 * event driven: it must never wait inside a TLS call, and every library
 * failure must come back as a message, never an abort.  Design:
 *  - ioc_nbd_server_set_tls() loads credentials once; every connection on
 *    every I/O thread shares them read-only (GnuTLS credentials and priority
 *    caches are safe to share once set up).  X.509 files follow qemu-nbd's
 *    and nbdkit's directory layout; PSK keys are psktool's "username:hexkey"
 *    file.  Priorities are the system's defaults (gnutls_priority_init2,
 *    DEF_APPEND), plus the PSK key exchanges when a PSK file is set.
 *  - A GNUTLS_NONBLOCK session per connection works the socket itself
 *    (gnutls_transport_set_int).  Every call here returns -EAGAIN instead of
 *    waiting, saying which direction GnuTLS waits for, so conn.c registers
 *    for readability or writability and calls again.
 *  - conn.c gathers replies in a 16 KiB staging buffer per TLS connection
 *    (one copy before encryption) and hands ioc__nbd_tls_send() at most that
 *    one record at a time, so several 4 KiB reads share a record and a
 *    send(2).  After -EAGAIN GnuTLS wants the same arguments again (it has
 *    already encrypted them): the buffer stays untouched until the call
 *    succeeds.
 *  - Decrypted bytes may wait in GnuTLS: ioc__nbd_tls_pending() says so.
 *  - A job's own socket (the migration stream, src/migrate, through
 *    ioc_nbd_server_tls_*() in server.c) uses the same credentials in
 *    sessions on the job's threads: the destination handshakes as a server
 *    with them; the source builds client credentials per migration from the
 *    same files (ca-cert.pem to verify the destination against its host
 *    name, client-cert.pem and client-key.pem if present, the first PSK
 *    line).  Both handshake blocking; then the destination's socket keeps
 *    blocking, the source's turns non-blocking and its recv/send return
 *    -EAGAIN for its loop to wait on.  A cancel shuts the socket down.
 *
 * Rejected.  kTLS (the kernel encrypting after a user-space handshake) would
 * keep the data path's sendmsg, but needs the session keys exported into
 * setsockopt per cipher and falls back to this path where the kernel lacks
 * the tls module: not worth it without a benchmark.  A TLS proxy in front
 * (stunnel) cannot do STARTTLS inside the NBD handshake.
 */
#include "ioc-config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nbd-int.h"

#if IOC_HAVE_GNUTLS
#include <gnutls/gnutls.h>

struct ioc__nbd_tls_creds {
	gnutls_certificate_credentials_t x509;
	gnutls_psk_server_credentials_t psk;
	gnutls_priority_t prio;
	bool verify_peer;
	char *dir, *psk_file;           /* for the migration client */
};

struct ioc__nbd_tls {
	gnutls_session_t s;
	bool psk;
	/* migration client only: owned by the session */
	gnutls_certificate_credentials_t cx509;
	gnutls_psk_client_credentials_t cpsk;
};

static int gnutls_errno(int r)
{
	switch (r) {
	case GNUTLS_E_FILE_ERROR:
		return -ENOENT;
	case GNUTLS_E_MEMORY_ERROR:
		return -ENOMEM;
	default:
		return -EINVAL;
	}
}

static bool readable(const char *path)
{
	return access(path, R_OK) == 0;
}

/* GnuTLS's error r as -errno, with "<what>: <GnuTLS's reason>" in err. */
static int __attribute__((format(printf, 4, 5)))
tls_fail(int r, char *err, size_t errlen, const char *what, ...)
{
	va_list ap;
	size_t n;

	if (errlen) {
		va_start(ap, what);
		vsnprintf(err, errlen, what, ap);
		va_end(ap);
		n = strlen(err);
		snprintf(err + n, errlen - n, ": %s", gnutls_strerror(r));
	}
	return gnutls_errno(r);
}

/* New X.509 credentials in *x; -errno with the reason in err. */
static int x509_new(gnutls_certificate_credentials_t *x, char *err, size_t errlen)
{
	int r = gnutls_certificate_allocate_credentials(x);

	return r < 0 ? tls_fail(r, err, errlen, "X.509 credentials") : 0;
}

/* Add the PEM certificate and its key to x; -errno with the reason in err. */
static int x509_add_key(gnutls_certificate_credentials_t x, const char *cert, const char *key,
			char *err, size_t errlen)
{
	int r = gnutls_certificate_set_x509_key_file(x, cert, key, GNUTLS_X509_FMT_PEM);

	return r < 0 ? tls_fail(r, err, errlen, "%s, %s", cert, key) : 0;
}

/* Add the PEM CA certificates at ca to x as trusted; -errno with the
 * reason in err. */
static int x509_add_ca(gnutls_certificate_credentials_t x, const char *ca,
		       char *err, size_t errlen)
{
	int r = gnutls_certificate_set_x509_trust_file(x, ca, GNUTLS_X509_FMT_PEM);

	return r < 0 ? tls_fail(r, err, errlen, "%s", ca) : 0;
}

/* A file we cannot do without: 0 if readable, else -errno with the path
 * and the reason in err. */
static int need_file(const char *path, char *err, size_t errlen)
{
	int e;

	if (readable(path))
		return 0;
	e = errno;
	snprintf(err, errlen, "%s: %s", path, strerror(e));
	return -e;
}

/* A well-formed psktool line, "username:hexkey": true with the lengths of
 * the name and of the key's hex digits. */
static bool psk_line(const char *line, size_t *ulen, size_t *hexlen)
{
	const char *colon = strchr(line, ':');
	size_t hex;

	if (!colon || colon == line)
		return false;
	hex = strspn(colon + 1, "0123456789abcdefABCDEF");
	if (hex == 0 || hex % 2 || (colon[1 + hex] != '\n' && colon[1 + hex] != '\0'))
		return false;
	*ulen = (size_t)(colon - line);
	*hexlen = hex;
	return true;
}

/* A PSK file GnuTLS reads at every handshake: check now that it is there
 * and holds at least one well-formed "username:hexkey" line, so a typo
 * fails at start-up instead of at each client. */
static int check_psk_file(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int good = 0, e;
	size_t ulen, hex;

	if (!f) {
		e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	while (fgets(line, sizeof(line), f))
		if (psk_line(line, &ulen, &hex))
			good++;
	fclose(f);
	if (!good) {
		snprintf(err, errlen, "%s: no \"username:hexkey\" line (psktool -u NAME -p %s)",
			 path, path);
		return -EINVAL;
	}
	return 0;
}

static int load_x509(struct ioc__nbd_tls_creds *cr, const char *dir,
		     char *err, size_t errlen)
{
	char cert[4096], key[4096], ca[4096], crl[4096];
	int r;

	snprintf(cert, sizeof(cert), "%s/server-cert.pem", dir);
	snprintf(key, sizeof(key), "%s/server-key.pem", dir);
	snprintf(ca, sizeof(ca), "%s/ca-cert.pem", dir);
	snprintf(crl, sizeof(crl), "%s/ca-crl.pem", dir);
	if ((r = need_file(cert, err, errlen)) < 0 || (r = need_file(key, err, errlen)) < 0 ||
	    (cr->verify_peer && (r = need_file(ca, err, errlen)) < 0))
		return r;
	if ((r = x509_new(&cr->x509, err, errlen)) < 0 ||
	    (r = x509_add_key(cr->x509, cert, key, err, errlen)) < 0 ||
	    (readable(ca) && (r = x509_add_ca(cr->x509, ca, err, errlen)) < 0))
		return r;
	if (readable(crl)) {
		r = gnutls_certificate_set_x509_crl_file(cr->x509, crl, GNUTLS_X509_FMT_PEM);
		if (r < 0)
			return tls_fail(r, err, errlen, "%s", crl);
	}
	return 0;
}

void ioc__nbd_tls_creds_free(struct ioc__nbd_tls_creds *cr)
{
	if (!cr)
		return;
	if (cr->x509)
		gnutls_certificate_free_credentials(cr->x509);
	if (cr->psk)
		gnutls_psk_free_server_credentials(cr->psk);
	if (cr->prio)
		gnutls_priority_deinit(cr->prio);
	free(cr->dir);
	free(cr->psk_file);
	free(cr);
}

int ioc__nbd_tls_creds_new(struct ioc__nbd_tls_creds **out,
			   const struct ioc_nbd_tls_opts *o, char *err, size_t errlen)
{
	struct ioc__nbd_tls_creds *cr;
	const char *errpos = NULL;
	int r;

	if (!o->certificates && !o->psk_file) {
		snprintf(err, errlen, "TLS needs certificates or a PSK file");
		return -EINVAL;
	}
	if (o->verify_peer && !o->certificates) {
		snprintf(err, errlen, "verifying client certificates needs certificates");
		return -EINVAL;
	}
	cr = calloc(1, sizeof(*cr));
	if (!cr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cr->verify_peer = o->verify_peer;
	if ((o->certificates && !(cr->dir = strdup(o->certificates))) ||
	    (o->psk_file && !(cr->psk_file = strdup(o->psk_file)))) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	if (o->certificates && (r = load_x509(cr, o->certificates, err, errlen)) < 0)
		goto fail;
	if (o->psk_file) {
		if ((r = check_psk_file(o->psk_file, err, errlen)) < 0)
			goto fail;
		r = gnutls_psk_allocate_server_credentials(&cr->psk);
		if (r >= 0)
			r = gnutls_psk_set_server_credentials_file(cr->psk, o->psk_file);
		if (r < 0) {
			r = tls_fail(r, err, errlen, "%s", o->psk_file);
			goto fail;
		}
	}
	/* The system's default priorities, plus the PSK key exchanges. */
	if (o->psk_file)
		r = gnutls_priority_init2(&cr->prio, "+ECDHE-PSK:+DHE-PSK:+PSK", &errpos,
					  GNUTLS_PRIORITY_INIT_DEF_APPEND);
	else
		r = gnutls_priority_init(&cr->prio, NULL, &errpos);
	if (r < 0) {
		r = tls_fail(r, err, errlen, "TLS priorities");
		goto fail;
	}
	*out = cr;
	return 0;
fail:
	ioc__nbd_tls_creds_free(cr);
	return r;
}

static int server_session(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			  int fd, unsigned flags, const char **msg)
{
	struct ioc__nbd_tls *t = calloc(1, sizeof(*t));
	int r;

	if (!t) {
		*msg = "out of memory";
		return -ENOMEM;
	}
	r = gnutls_init(&t->s, GNUTLS_SERVER | GNUTLS_NO_SIGNAL | flags);
	if (r < 0) {
		free(t);
		*msg = gnutls_strerror(r);
		return gnutls_errno(r);
	}
	r = gnutls_priority_set(t->s, cr->prio);
	if (r >= 0 && cr->x509)
		r = gnutls_credentials_set(t->s, GNUTLS_CRD_CERTIFICATE, cr->x509);
	if (r >= 0 && cr->psk) {
		r = gnutls_credentials_set(t->s, GNUTLS_CRD_PSK, cr->psk);
		t->psk = true;
	}
	if (r < 0) {
		*msg = gnutls_strerror(r);
		ioc__nbd_tls_free(t);
		return gnutls_errno(r);
	}
	if (cr->verify_peer) {
		gnutls_certificate_server_set_request(t->s, GNUTLS_CERT_REQUIRE);
		/* No hostname to match: any client with a certificate the CA
		 * signed (and the CRL does not revoke) is let in. */
		gnutls_session_set_verify_cert(t->s, NULL, 0);
	}
	/* Non-blocking: the connection's handshake timer bounds the
	 * handshake; blocking: GnuTLS's default timeout. */
	gnutls_handshake_set_timeout(t->s, (flags & GNUTLS_NONBLOCK) ? 0 :
				     GNUTLS_DEFAULT_HANDSHAKE_TIMEOUT);
	gnutls_transport_set_int(t->s, fd);
	*out = t;
	return 0;
}

int ioc__nbd_tls_new(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
		     int fd, const char **msg)
{
	return server_session(out, cr, fd, GNUTLS_NONBLOCK, msg);
}

/* ---- sessions for the migration stream -------------------------------- */

/* A failed handshake's reason in err (with the certificate verification
 * status when that is what failed). */
static int handshake_error(struct ioc__nbd_tls *t, int r, char *err, size_t errlen)
{
	if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
		gnutls_datum_t d = { NULL, 0 };
		unsigned st = gnutls_session_get_verify_cert_status(t->s);

		if (gnutls_certificate_verification_status_print(
			    st, gnutls_certificate_type_get(t->s), &d, 0) == 0) {
			snprintf(err, errlen, "%s: %s", gnutls_strerror(r), (char *)d.data);
			gnutls_free(d.data);
			return -EPROTO;
		}
	}
	if (r == GNUTLS_E_FATAL_ALERT_RECEIVED) {
		const char *a = gnutls_alert_get_name(gnutls_alert_get(t->s));

		snprintf(err, errlen, "%s: %s", gnutls_strerror(r), a ? a : "?");
		return -EPROTO;
	}
	snprintf(err, errlen, "%s%s", gnutls_strerror(r),
		 r == GNUTLS_E_PREMATURE_TERMINATION ?
		 " (the peer hung up: a wrong key or certificate, or no TLS there)" : "");
	return -EPROTO;
}

/* gnutls_handshake() on a non-blocking session until it is done
 * (GNUTLS_E_SUCCESS), would block (GNUTLS_E_AGAIN, *want_write saying for
 * what) or fails (that fatal error); interruptions and warning alerts go
 * on. */
static int handshake_step(struct ioc__nbd_tls *t, bool *want_write)
{
	for (;;) {
		int r = gnutls_handshake(t->s);

		if (r == GNUTLS_E_AGAIN) {
			*want_write = gnutls_record_get_direction(t->s) == 1;
			return r;
		}
		if (r == GNUTLS_E_SUCCESS || gnutls_error_is_fatal(r))
			return r;
	}
}

/* A blocking handshake. */
static int handshake_blocking(struct ioc__nbd_tls *t, char *err, size_t errlen)
{
	int r;

	do
		r = gnutls_handshake(t->s);
	while (r < 0 && !gnutls_error_is_fatal(r));
	return r == GNUTLS_E_SUCCESS ? 0 : handshake_error(t, r, err, errlen);
}

int ioc__nbd_tls_mig_handshake(void *opaque, bool *want_write, char *err, size_t errlen)
{
	struct ioc__nbd_tls *t = opaque;
	int r = handshake_step(t, want_write);

	if (r == GNUTLS_E_SUCCESS)
		return 0;
	return r == GNUTLS_E_AGAIN ? -EAGAIN : handshake_error(t, r, err, errlen);
}

int ioc__nbd_tls_mig_accept(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			    int fd, char *err, size_t errlen)
{
	const char *msg = NULL;
	int r = server_session(out, cr, fd, 0, &msg);

	if (r < 0) {
		snprintf(err, errlen, "%s", msg);
		return r;
	}
	r = handshake_blocking(*out, err, errlen);
	if (r < 0) {
		ioc__nbd_tls_free(*out);
		*out = NULL;
	}
	return r;
}

/* The first "username:hexkey" line of path into user and key. */
static int first_psk(const char *path, char *user, size_t ul, char *key, size_t kl,
		     char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int e;

	if (!f) {
		e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	while (fgets(line, sizeof(line), f)) {
		size_t ulen, hex;

		if (!psk_line(line, &ulen, &hex) || ulen >= ul || hex >= kl)
			continue;
		memcpy(user, line, ulen);
		user[ulen] = '\0';
		memcpy(key, line + ulen + 1, hex);
		key[hex] = '\0';
		fclose(f);
		return 0;
	}
	fclose(f);
	snprintf(err, errlen, "%s: no \"username:hexkey\" line", path);
	return -EINVAL;
}

static int client_creds(struct ioc__nbd_tls *t, const struct ioc__nbd_tls_creds *cr,
			const char *hostname, char *err, size_t errlen)
{
	char ca[4096], cert[4096], key[4096];
	int r;

	if (cr->dir) {
		snprintf(ca, sizeof(ca), "%s/ca-cert.pem", cr->dir);
		snprintf(cert, sizeof(cert), "%s/client-cert.pem", cr->dir);
		snprintf(key, sizeof(key), "%s/client-key.pem", cr->dir);
		if ((r = need_file(ca, err, errlen)) < 0)
			return r;
		if ((r = x509_new(&t->cx509, err, errlen)) < 0 ||
		    (r = x509_add_ca(t->cx509, ca, err, errlen)) < 0 ||
		    (readable(cert) && readable(key) &&
		     (r = x509_add_key(t->cx509, cert, key, err, errlen)) < 0))
			return r;
		r = gnutls_credentials_set(t->s, GNUTLS_CRD_CERTIFICATE, t->cx509);
		if (r < 0)
			return tls_fail(r, err, errlen, "X.509 credentials");
		/* Verify the chain to ca-cert.pem and the name (a DNS name or
		 * an IP address in the certificate). */
		gnutls_session_set_verify_cert(t->s, hostname, 0);
		if (hostname[0] && strspn(hostname, "0123456789.:abcdefABCDEF") != strlen(hostname))
			(void)gnutls_server_name_set(t->s, GNUTLS_NAME_DNS, hostname,
						     strlen(hostname));
	}
	if (cr->psk_file) {
		char user[256], hex[1024];
		gnutls_datum_t k;

		if ((r = first_psk(cr->psk_file, user, sizeof(user), hex, sizeof(hex),
				   err, errlen)) < 0)
			return r;
		k.data = (unsigned char *)hex;
		k.size = (unsigned)strlen(hex);
		r = gnutls_psk_allocate_client_credentials(&t->cpsk);
		if (r >= 0)
			r = gnutls_psk_set_client_credentials(t->cpsk, user, &k, GNUTLS_PSK_KEY_HEX);
		if (r >= 0)
			r = gnutls_credentials_set(t->s, GNUTLS_CRD_PSK, t->cpsk);
		explicit_bzero(hex, sizeof(hex));
		if (r < 0)
			return tls_fail(r, err, errlen, "%s", cr->psk_file);
		t->psk = true;
	}
	return 0;
}

int ioc__nbd_tls_mig_connect(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			     int fd, const char *hostname, bool step, char *err,
			     size_t errlen)
{
	struct ioc__nbd_tls *t = calloc(1, sizeof(*t));
	int r;

	*out = NULL;
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = gnutls_init(&t->s, GNUTLS_CLIENT | GNUTLS_NO_SIGNAL);
	if (r < 0) {
		t->s = NULL;
		snprintf(err, errlen, "%s", gnutls_strerror(r));
		r = gnutls_errno(r);
		goto fail;
	}
	r = gnutls_priority_set(t->s, cr->prio);
	if (r < 0) {
		snprintf(err, errlen, "%s", gnutls_strerror(r));
		r = gnutls_errno(r);
		goto fail;
	}
	if ((r = client_creds(t, cr, hostname, err, errlen)) < 0)
		goto fail;
	gnutls_transport_set_int(t->s, fd);
	/* GnuTLS keeps the timeout by waiting in poll() for the peer even on
	 * a non-blocking fd: a stepped handshake's caller keeps its own. */
	if (!step) {
		gnutls_handshake_set_timeout(t->s, GNUTLS_DEFAULT_HANDSHAKE_TIMEOUT);
		if ((r = handshake_blocking(t, err, errlen)) < 0)
			goto fail;
	}
	*out = t;
	return 0;
fail:
	ioc__nbd_tls_free(t);
	return r;
}

static int io_errno(ssize_t r)
{
	if (r == GNUTLS_E_PUSH_ERROR || r == GNUTLS_E_PULL_ERROR)
		return -ECONNRESET;
	return r == GNUTLS_E_MEMORY_ERROR ? -ENOMEM : -EPROTO;
}

#define RECORD_AGAIN (-SSIZE_MAX - 1)

/* What a record call's result r means for the migration's sessions: the
 * bytes, -EAGAIN (only on a non-blocking socket, the source's engine: the
 * caller waits for readability, or calls send again with the same buf
 * and len once writable, as migrate.h says), -errno, or RECORD_AGAIN to
 * call again now. */
static ssize_t record_result(ssize_t r, bool receiving)
{
	if (r >= 0)
		return r;
	if (r == GNUTLS_E_INTERRUPTED)
		return RECORD_AGAIN;
	if (r == GNUTLS_E_AGAIN)
		return -EAGAIN;
	/* The stream's framing says whether anything was cut short. */
	if (receiving && r == GNUTLS_E_PREMATURE_TERMINATION)
		return 0;
	if (receiving && r != GNUTLS_E_REHANDSHAKE && !gnutls_error_is_fatal((int)r))
		return RECORD_AGAIN;
	return io_errno(r);
}

ssize_t ioc__nbd_tls_mig_recv(void *opaque, void *buf, size_t len)
{
	struct ioc__nbd_tls *t = opaque;
	ssize_t r;

	do
		r = record_result(gnutls_record_recv(t->s, buf, len), true);
	while (r == RECORD_AGAIN);
	return r;
}

ssize_t ioc__nbd_tls_mig_send(void *opaque, const void *buf, size_t len)
{
	struct ioc__nbd_tls *t = opaque;
	ssize_t r;

	do
		r = record_result(gnutls_record_send(t->s, buf, len), false);
	while (r == RECORD_AGAIN);
	return r;
}

void ioc__nbd_tls_free(struct ioc__nbd_tls *t)
{
	if (!t)
		return;
	if (t->s)
		gnutls_deinit(t->s);
	if (t->cx509)
		gnutls_certificate_free_credentials(t->cx509);
	if (t->cpsk)
		gnutls_psk_free_client_credentials(t->cpsk);
	free(t);
}

int ioc__nbd_tls_handshake(struct ioc__nbd_tls *t, bool *want_write, const char **msg)
{
	int r = handshake_step(t, want_write);

	if (r == GNUTLS_E_SUCCESS)
		return 0;
	if (r == GNUTLS_E_AGAIN)
		return -EAGAIN;
	*msg = gnutls_strerror(r);
	return -EPROTO;
}

ssize_t ioc__nbd_tls_recv(struct ioc__nbd_tls *t, void *buf, size_t len,
			  bool *want_write, const char **msg)
{
	for (;;) {
		ssize_t r = gnutls_record_recv(t->s, buf, len);

		if (r >= 0)
			return r;
		if (r == GNUTLS_E_INTERRUPTED)
			continue;
		if (r == GNUTLS_E_AGAIN) {
			/* A TLS 1.3 key update may have a reply to send. */
			*want_write = gnutls_record_get_direction(t->s) == 1;
			return -EAGAIN;
		}
		/* Closed without close_notify: for NBD the stream framing
		 * says whether anything was cut short, so this is EOF. */
		if (r == GNUTLS_E_PREMATURE_TERMINATION)
			return 0;
		if (r != GNUTLS_E_REHANDSHAKE && !gnutls_error_is_fatal((int)r))
			continue;
		*msg = r == GNUTLS_E_REHANDSHAKE ? "renegotiation refused"
						 : gnutls_strerror((int)r);
		return -EPROTO;
	}
}

ssize_t ioc__nbd_tls_send(struct ioc__nbd_tls *t, const void *buf, size_t len,
			  const char **msg)
{
	for (;;) {
		ssize_t r = gnutls_record_send(t->s, buf, len);

		if (r >= 0)
			return r;
		if (r == GNUTLS_E_INTERRUPTED)
			continue;
		if (r == GNUTLS_E_AGAIN)
			return -EAGAIN;
		*msg = gnutls_strerror((int)r);
		return -EPIPE;
	}
}

size_t ioc__nbd_tls_pending(struct ioc__nbd_tls *t)
{
	return gnutls_record_check_pending(t->s);
}

void ioc__nbd_tls_bye(struct ioc__nbd_tls *t)
{
	/* Best effort close_notify; a full socket just loses it. */
	(void)gnutls_bye(t->s, GNUTLS_SHUT_WR);
}

void ioc__nbd_tls_describe(struct ioc__nbd_tls *t, char *buf, size_t len)
{
	char *desc = gnutls_session_get_desc(t->s);
	const char *user = t->psk ? gnutls_psk_server_get_username(t->s) : NULL;

	snprintf(buf, len, "%s%s%s", desc ? desc : "TLS", user ? ", PSK user " : "",
		 user ? user : "");
	gnutls_free(desc);
}

#else /* !IOC_HAVE_GNUTLS */

int ioc__nbd_tls_creds_new(struct ioc__nbd_tls_creds **out,
			   const struct ioc_nbd_tls_opts *o, char *err, size_t errlen)
{
	(void)out;
	(void)o;
	snprintf(err, errlen, "built without GnuTLS");
	return -ENOTSUP;
}

void ioc__nbd_tls_creds_free(struct ioc__nbd_tls_creds *cr)
{
	(void)cr;
}

int ioc__nbd_tls_new(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
		     int fd, const char **msg)
{
	(void)out;
	(void)cr;
	(void)fd;
	*msg = "built without GnuTLS";
	return -ENOTSUP;
}

void ioc__nbd_tls_free(struct ioc__nbd_tls *t)
{
	(void)t;
}

int ioc__nbd_tls_handshake(struct ioc__nbd_tls *t, bool *want_write, const char **msg)
{
	(void)t;
	(void)want_write;
	*msg = "built without GnuTLS";
	return -ENOTSUP;
}

ssize_t ioc__nbd_tls_recv(struct ioc__nbd_tls *t, void *buf, size_t len,
			  bool *want_write, const char **msg)
{
	(void)t;
	(void)buf;
	(void)len;
	(void)want_write;
	*msg = "built without GnuTLS";
	return -ENOTSUP;
}

ssize_t ioc__nbd_tls_send(struct ioc__nbd_tls *t, const void *buf, size_t len,
			  const char **msg)
{
	(void)t;
	(void)buf;
	(void)len;
	*msg = "built without GnuTLS";
	return -ENOTSUP;
}

size_t ioc__nbd_tls_pending(struct ioc__nbd_tls *t)
{
	(void)t;
	return 0;
}

void ioc__nbd_tls_bye(struct ioc__nbd_tls *t)
{
	(void)t;
}

void ioc__nbd_tls_describe(struct ioc__nbd_tls *t, char *buf, size_t len)
{
	(void)t;
	snprintf(buf, len, "TLS");
}

int ioc__nbd_tls_mig_accept(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			    int fd, char *err, size_t errlen)
{
	(void)out;
	(void)cr;
	(void)fd;
	snprintf(err, errlen, "built without GnuTLS");
	return -ENOTSUP;
}

int ioc__nbd_tls_mig_connect(struct ioc__nbd_tls **out, const struct ioc__nbd_tls_creds *cr,
			     int fd, const char *hostname, bool step, char *err,
			     size_t errlen)
{
	(void)out;
	(void)cr;
	(void)fd;
	(void)hostname;
	(void)step;
	snprintf(err, errlen, "built without GnuTLS");
	return -ENOTSUP;
}

int ioc__nbd_tls_mig_handshake(void *opaque, bool *want_write, char *err, size_t errlen)
{
	(void)opaque;
	(void)want_write;
	snprintf(err, errlen, "built without GnuTLS");
	return -ENOTSUP;
}

ssize_t ioc__nbd_tls_mig_recv(void *opaque, void *buf, size_t len)
{
	(void)opaque;
	(void)buf;
	(void)len;
	return -ENOTSUP;
}

ssize_t ioc__nbd_tls_mig_send(void *opaque, const void *buf, size_t len)
{
	(void)opaque;
	(void)buf;
	(void)len;
	return -ENOTSUP;
}

#endif /* IOC_HAVE_GNUTLS */
