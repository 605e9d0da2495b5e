/* Listening sockets and outgoing TCP connections (socket.h). */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "socket.h"

int ioc__listen_unix(const char *path, int backlog)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	/* A stale socket from an earlier run is replaced; anything else is not. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, backlog) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

int ioc__listen_tcp(const char *host, const char *port, int backlog)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
	};
	struct addrinfo *res, *ai;
	int fd = -EADDRNOTAVAIL;

	int r = getaddrinfo(host, port, &hints, &res);
	if (r != 0)
		return r == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		int one = 1;
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    ai->ai_protocol);
		if (fd < 0) {
			fd = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
			break;
		int e = -errno;
		close(fd);
		fd = e;
	}
	freeaddrinfo(res);
	return fd;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One address: connected, or -errno.  A look without waiting first,
 * then the caller's wait, until the deadline. */
static int connect_one(const struct addrinfo *ai, int64_t timeout_ms,
		       ioc__connect_wait_fn *wait, void *opaque)
{
	int64_t deadline = mono_ms() + timeout_ms;
	int fd, err = 0;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)
		err = -errno;
	while (err == 0) {
		struct pollfd pf = { fd, POLLOUT, 0 };
		int so = 0;
		socklen_t sl = sizeof(so);
		int64_t left;

		if (poll(&pf, 1, 0) == 1) {
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0)
				so = errno;
			if (so == 0)
				return fd;
			err = -so;
			break;
		}
		left = deadline - mono_ms();
		err = left < 0 ? -ETIMEDOUT : wait(opaque, fd, left);
	}
	close(fd);
	return err;
}

int ioc__resolve_tcp(const char *host, const char *port, struct addrinfo **res)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV,
	};

	return getaddrinfo(host, port, &hints, res) == 0 ? 0 : -EHOSTUNREACH;
}

int ioc__connect_addrs(const struct addrinfo *res, int64_t timeout_ms,
		       ioc__connect_wait_fn *wait, void *opaque)
{
	int ret = -EHOSTUNREACH;

	for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		ret = connect_one(ai, timeout_ms, wait, opaque);
		if (ret >= 0 || ret == -ECANCELED)
			break;
	}
	return ret;
}

int ioc__connect_tcp(const char *host, const char *port, int64_t timeout_ms,
		     ioc__connect_wait_fn *wait, void *opaque, bool *unresolved)
{
	struct addrinfo *res;
	int ret = ioc__resolve_tcp(host, port, &res);

	*unresolved = ret < 0;
	if (ret < 0)
		return ret;
	ret = ioc__connect_addrs(res, timeout_ms, wait, opaque);
	freeaddrinfo(res);
	return ret;
}
