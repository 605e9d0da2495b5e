/*
 * A tiny raw NBD client for tests: every helper does exactly one protocol
 * step so a test can send precisely the (bad) bytes it wants.  All reads
 * time out (CL_TIMEOUT_MS) so a server that stalls fails the test instead
 * of hanging it.  Header-only; uses the wire constants of src/nbd.
 */
#ifndef IOC_TEST_NBD_CLIENT_H
#define IOC_TEST_NBD_CLIENT_H

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "nbd-proto.h"

#define CL_TIMEOUT_MS 10000

/* Send all n bytes (the blocking transport sends its handshake with it
 * too).  0 or -errno. */
static inline int cl_write(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p = (const uint8_t *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

/* 0 on success, -EPIPE on EOF, -ETIMEDOUT, or -errno. */
static inline int cl_read(int fd, void *p, size_t n)
{
	while (n) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int pr = poll(&pfd, 1, CL_TIMEOUT_MS);
		if (pr == 0)
			return -ETIMEDOUT;
		if (pr < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		ssize_t r = recv(fd, p, n, 0);
		if (r == 0)
			return -EPIPE;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p = (uint8_t *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

/* True when the server closed the connection (EOF or reset) without
 * sending anything more. */
static inline bool cl_closed(int fd)
{
	uint8_t b;
	int r = cl_read(fd, &b, 1);

	return r == -EPIPE || r == -ECONNRESET;
}

static inline int cl_connect_unix(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (strlen(path) >= sizeof(a.sun_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	memcpy(a.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

/* Read the greeting; returns the handshake flags or -errno. */
static inline int cl_greeting(int fd)
{
	uint8_t g[18];
	int r = cl_read(fd, g, sizeof(g));

	if (r < 0)
		return r;
	if (ioc_nbd_ld64(g) != NBD_MAGIC_INIT || ioc_nbd_ld64(g + 8) != NBD_MAGIC_OPTS)
		return -EPROTO;
	return ioc_nbd_ld16(g + 16);
}

static inline int cl_flags(int fd, uint32_t flags)
{
	uint8_t b[4];

	ioc_nbd_st32(b, flags);
	return cl_write(fd, b, 4);
}

static inline int cl_opt(int fd, uint32_t opt, const void *data, uint32_t len)
{
	uint8_t h[16], *p = h;

	p = ioc_nbd_st64(p, NBD_MAGIC_OPTS);
	p = ioc_nbd_st32(p, opt);
	ioc_nbd_st32(p, len);
	int r = cl_write(fd, h, 16);
	return r < 0 ? r : cl_write(fd, data, len);
}

/* Read one option reply; data (up to cap bytes, rest dropped) and its
 * length.  Returns the reply type or -errno. */
static inline long cl_opt_reply(int fd, uint32_t want_opt, void *data,
				size_t cap, uint32_t *len)
{
	uint8_t h[20];
	int r = cl_read(fd, h, 20);

	if (r < 0)
		return r;
	if (ioc_nbd_ld64(h) != NBD_MAGIC_OPT_REPLY || ioc_nbd_ld32(h + 8) != want_opt)
		return -EPROTO;
	uint32_t l = ioc_nbd_ld32(h + 16);
	if (len)
		*len = l;
	uint8_t *tmp = malloc(l ? l : 1);
	r = cl_read(fd, tmp, l);
	if (r == 0 && data)
		memcpy(data, tmp, l < cap ? l : cap);
	free(tmp);
	return r < 0 ? r : (long)ioc_nbd_ld32(h + 12);
}

static inline long cl_opt_simple(int fd, uint32_t opt)
{
	int r = cl_opt(fd, opt, NULL, 0);
	return r < 0 ? r : cl_opt_reply(fd, opt, NULL, 0, NULL);
}

struct cl_conn {
	int fd;
	bool structured, extended, meta;
	uint64_t size;
	uint16_t tflags;
	uint32_t min_block, pref_block, max_block;
};

/* Negotiate to transmission with NBD_OPT_GO.  Returns 0, the NBD_REP_ERR_*
 * of GO as a positive number, or -errno. */
static inline long cl_go(struct cl_conn *c, const char *name)
{
	int fd = c->fd;
	long r = cl_greeting(fd);

	if (r < 0)
		return r;
	if ((r = cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) < 0)
		return r;
	if (c->extended) {
		r = cl_opt_simple(fd, NBD_OPT_EXTENDED_HEADERS);
		if (r != NBD_REP_ACK)
			return r < 0 ? r : -EPROTO;
		c->structured = true;
	} else if (c->structured) {
		r = cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY);
		if (r != NBD_REP_ACK)
			return r < 0 ? r : -EPROTO;
	}
	size_t nl = strlen(name);
	uint8_t buf[64 + 4096], *p = buf;
	if (c->meta) {
		p = ioc_nbd_st32(p, (uint32_t)nl);
		memcpy(p, name, nl);
		p += nl;
		p = ioc_nbd_st32(p, 1);
		p = ioc_nbd_st32(p, 15);
		memcpy(p, NBD_META_BASE_ALLOCATION, 15);
		p += 15;
		r = cl_opt(fd, NBD_OPT_SET_META_CONTEXT, buf, (uint32_t)(p - buf));
		if (r < 0)
			return r;
		for (;;) {
			r = cl_opt_reply(fd, NBD_OPT_SET_META_CONTEXT, NULL, 0, NULL);
			if (r == NBD_REP_ACK)
				break;
			if (r != NBD_REP_META_CONTEXT)
				return r < 0 ? r : -EPROTO;
		}
	}
	p = buf;
	p = ioc_nbd_st32(p, (uint32_t)nl);
	memcpy(p, name, nl);
	p += nl;
	p = ioc_nbd_st16(p, 1);
	p = ioc_nbd_st16(p, NBD_INFO_BLOCK_SIZE);
	if ((r = cl_opt(fd, NBD_OPT_GO, buf, (uint32_t)(p - buf))) < 0)
		return r;
	for (;;) {
		uint8_t d[64];
		uint32_t l;
		r = cl_opt_reply(fd, NBD_OPT_GO, d, sizeof(d), &l);
		if (r < 0)
			return r;
		if (r == NBD_REP_ACK)
			return 0;
		if (r & NBD_REP_ERR_BIT)
			return r;
		if (r == NBD_REP_INFO && ioc_nbd_ld16(d) == NBD_INFO_EXPORT) {
			c->size = ioc_nbd_ld64(d + 2);
			c->tflags = ioc_nbd_ld16(d + 10);
		}
		if (r == NBD_REP_INFO && ioc_nbd_ld16(d) == NBD_INFO_BLOCK_SIZE) {
			c->min_block = ioc_nbd_ld32(d + 2);
			c->pref_block = ioc_nbd_ld32(d + 6);
			c->max_block = ioc_nbd_ld32(d + 10);
		}
	}
}

static inline int cl_req(const struct cl_conn *c, uint16_t flags, uint16_t type,
			 uint64_t cookie, uint64_t off, uint64_t len,
			 const void *data)
{
	uint8_t h[32], *p = h;

	p = ioc_nbd_st32(p, c->extended ? NBD_MAGIC_EXT_REQUEST : NBD_MAGIC_REQUEST);
	p = ioc_nbd_st16(p, flags);
	p = ioc_nbd_st16(p, type);
	p = ioc_nbd_st64(p, cookie);
	p = ioc_nbd_st64(p, off);
	if (c->extended)
		p = ioc_nbd_st64(p, len);
	else
		p = ioc_nbd_st32(p, (uint32_t)len);
	int r = cl_write(c->fd, h, (size_t)(p - h));
	if (r == 0 && data && type == NBD_CMD_WRITE)
		r = cl_write(c->fd, data, len);
	return r;
}

/* One reply message: simple (type = 0xffff) or one structured chunk.
 * The payload goes to payload (cap bytes, rest dropped); *plen its length.
 * Returns 0 or -errno. */
struct cl_reply {
	bool simple;
	uint32_t error;       /* simple: the error field */
	uint16_t flags, type; /* structured */
	uint64_t cookie;
	uint64_t plen;
};

static inline int cl_reply(const struct cl_conn *c, struct cl_reply *rep,
			   void *payload, size_t cap, size_t simple_data)
{
	uint8_t h[32];
	int r = cl_read(c->fd, h, 4);

	if (r < 0)
		return r;
	memset(rep, 0, sizeof(*rep));
	uint32_t magic = ioc_nbd_ld32(h);
	if (magic == NBD_MAGIC_SIMPLE_REPLY) {
		if ((r = cl_read(c->fd, h + 4, 12)) < 0)
			return r;
		rep->simple = true;
		rep->error = ioc_nbd_ld32(h + 4);
		rep->cookie = ioc_nbd_ld64(h + 8);
		rep->plen = rep->error ? 0 : simple_data;
	} else if (magic == NBD_MAGIC_STRUCT_REPLY) {
		if ((r = cl_read(c->fd, h + 4, 16)) < 0)
			return r;
		rep->flags = ioc_nbd_ld16(h + 4);
		rep->type = ioc_nbd_ld16(h + 6);
		rep->cookie = ioc_nbd_ld64(h + 8);
		rep->plen = ioc_nbd_ld32(h + 16);
	} else if (magic == NBD_MAGIC_EXT_REPLY) {
		if ((r = cl_read(c->fd, h + 4, 28)) < 0)
			return r;
		rep->flags = ioc_nbd_ld16(h + 4);
		rep->type = ioc_nbd_ld16(h + 6);
		rep->cookie = ioc_nbd_ld64(h + 8);
		rep->plen = ioc_nbd_ld64(h + 24);
	} else {
		return -EPROTO;
	}
	if (rep->plen > (64u << 20))
		return -EPROTO;
	uint8_t *tmp = malloc(rep->plen ? rep->plen : 1);
	r = cl_read(c->fd, tmp, rep->plen);
	if (r == 0 && payload)
		memcpy(payload, tmp, rep->plen < cap ? rep->plen : cap);
	free(tmp);
	return r;
}

/* The NBD error of a finished request: simple error or an ERROR chunk's. */
static inline uint32_t cl_reply_error(const struct cl_reply *rep, const uint8_t *payload)
{
	if (rep->simple)
		return rep->error;
	if (rep->type & (1u << 15))
		return ioc_nbd_ld32(payload);
	return 0;
}

/* Run a command that takes no data back and return its NBD error. */
static inline long cl_cmd(const struct cl_conn *c, uint16_t flags, uint16_t type,
			  uint64_t off, uint64_t len, const void *data)
{
	static uint64_t cookie = 1000;
	uint8_t pl[512];
	struct cl_reply rep;
	uint32_t err = 0;
	uint64_t ck = ++cookie;
	int r = cl_req(c, flags, type, ck, off, len, data);

	if (r < 0)
		return r;
	for (;;) {
		if ((r = cl_reply(c, &rep, pl, sizeof(pl), 0)) < 0)
			return r;
		if (rep.cookie != ck)
			return -EPROTO;
		if (!err)
			err = cl_reply_error(&rep, pl);
		if (rep.simple || (rep.flags & NBD_REPLY_FLAG_DONE))
			return err;
	}
}

/* Read into buf; returns the NBD error or -errno.  Assembles structured
 * OFFSET_DATA / OFFSET_HOLE chunks; *nchunks counts content chunks. */
static inline long cl_pread(const struct cl_conn *c, uint16_t flags, void *buf,
			    uint64_t off, uint64_t len, int *nchunks, int *nholes)
{
	static uint64_t cookie = 1u << 30;
	uint64_t ck = ++cookie;
	struct cl_reply rep;
	uint32_t err = 0;
	size_t cap = len + 64;
	uint8_t *pl = malloc(cap);
	int r = cl_req(c, flags, NBD_CMD_READ, ck, off, len, NULL);

	if (nchunks)
		*nchunks = 0;
	if (nholes)
		*nholes = 0;
	while (r == 0) {
		if ((r = cl_reply(c, &rep, pl, cap, len)) < 0)
			break;
		if (rep.cookie != ck) {
			r = -EPROTO;
			break;
		}
		if (rep.simple) {
			err = rep.error;
			if (!err)
				memcpy(buf, pl, len);
			break;
		}
		if (rep.type == NBD_REPLY_TYPE_OFFSET_DATA) {
			uint64_t o = ioc_nbd_ld64(pl);
			if (o < off || o + rep.plen - 8 > off + len) {
				r = -EPROTO;
				break;
			}
			memcpy((uint8_t *)buf + (o - off), pl + 8, rep.plen - 8);
			if (nchunks)
				(*nchunks)++;
		} else if (rep.type == NBD_REPLY_TYPE_OFFSET_HOLE) {
			uint64_t o = ioc_nbd_ld64(pl);
			uint32_t n = ioc_nbd_ld32(pl + 8);
			if (o < off || o + n > off + len) {
				r = -EPROTO;
				break;
			}
			memset((uint8_t *)buf + (o - off), 0, n);
			if (nchunks)
				(*nchunks)++;
			if (nholes)
				(*nholes)++;
		} else if (!err) {
			err = cl_reply_error(&rep, pl);
		}
		if (rep.flags & NBD_REPLY_FLAG_DONE)
			break;
	}
	free(pl);
	return r < 0 ? r : (long)err;
}

#endif /* IOC_TEST_NBD_CLIENT_H */
