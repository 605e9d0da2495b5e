/*
 * Listening sockets, for every server of the tree (the NBD server, the
 * vhost-user-blk export, the storage daemon's monitors, a migration's
 * destination), and the outgoing TCP connection of a migration's source.
 * Internal.
 */
#ifndef IOC_UTIL_SOCKET_H
#define IOC_UTIL_SOCKET_H

#include <stdbool.h>
#include <stdint.h>

/* A non-blocking, close-on-exec socket listening at path (a stale socket
 * there is replaced, any other file is not), or -errno. */
int ioc__listen_unix(const char *path, int backlog);
/* A non-blocking, close-on-exec TCP socket listening on host (NULL: any
 * address) and a numeric port, with SO_REUSEADDR, or -errno. */
int ioc__listen_tcp(const char *host, const char *port, int backlog);

/* How ioc__connect_tcp() waits while a connect is in progress on fd:
 * until it may be writable or left_ms (>= 0) has passed, then 0 to look
 * again, or -errno to give up that address (-ECANCELED: give up all). */
typedef int ioc__connect_wait_fn(void *opaque, int fd, int64_t left_ms);

/* A non-blocking, close-on-exec TCP socket connected to host and a
 * numeric port, trying each address the name resolves to, timeout_ms for
 * each; -errno otherwise (-EHOSTUNREACH with *unresolved set when the
 * name does not resolve; the last address's error, or -ECANCELED). */
int ioc__connect_tcp(const char *host, const char *port, int64_t timeout_ms,
		     ioc__connect_wait_fn *wait, void *opaque, bool *unresolved);

/* The same in two halves, for a caller that resolves off its loop (the
 * lookup may block for seconds): the addresses in *res (freeaddrinfo()
 * them), or -EHOSTUNREACH; then the connection, as above. */
struct addrinfo;
int ioc__resolve_tcp(const char *host, const char *port, struct addrinfo **res);
int ioc__connect_addrs(const struct addrinfo *res, int64_t timeout_ms,
		       ioc__connect_wait_fn *wait, void *opaque);

#endif /* IOC_UTIL_SOCKET_H */
