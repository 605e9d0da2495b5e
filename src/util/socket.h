/*
 * Listening sockets, for every server of the tree (the NBD server, the
 * vhost-user-blk export, the storage daemon's monitors, a migration's
 * destination).  Internal.
 */
#ifndef IOC_UTIL_SOCKET_H
#define IOC_UTIL_SOCKET_H

/* A non-blocking, close-on-exec socket listening at path (a stale socket
 * there is replaced, any other file is not), or -errno. */
int ioc__listen_unix(const char *path, int backlog);
/* A non-blocking, close-on-exec TCP socket listening on host (NULL: any
 * address) and a numeric port, with SO_REUSEADDR, or -errno. */
int ioc__listen_tcp(const char *host, const char *port, int backlog);

#endif /* IOC_UTIL_SOCKET_H */
