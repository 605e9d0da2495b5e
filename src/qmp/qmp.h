/*
 * The QMP wire protocol (QEMU's docs/interop/qmp-spec.rst) on a loop:
 * greeting, capabilities negotiation, a stream of JSON objects in, one
 * reply or event per line out, and one command table.  What the commands
 * do is the caller's (src/daemon's tables).  Loop thread only.
 */
#ifndef IOC_QMP_QMP_H
#define IOC_QMP_QMP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "iocore/loop.h"

#include "schema.h"

/* A handler's failure: QEMU's error class and a message. */
struct ioc__qmp_err {
	const char *cls;         /* "GenericError" unless set otherwise */
	char desc[2560];         /* room for two 1023-byte bitmap names */
};

/* Fill err's text (printf); the class stays as set. */
void ioc__qmp_errf(struct ioc__qmp_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Returns the "return" value (a new reference), or NULL with err filled
 * in.  args is an object whose members passed the argument spec. */
typedef json_t *ioc__qmp_fn(void *ctx, json_t *args, struct ioc__qmp_err *err);

struct ioc__qmp_cmd {
	const char *name;
	ioc__qmp_fn *fn;
	const struct ioc__qmp_arg *args;   /* NULL-name terminated; NULL = none */
	/* Or the arguments as one object of this spec (a union, such as
	 * blockdev-add's BlockdevOptions); checked instead of args. */
	const struct ioc__qmp_arg *(*spec)(void);
	/* May yield (waits on a cluster, a coroutine lock): runs in a
	 * coroutine of its own on the loop, every client's input held until
	 * it ends, so commands still run one at a time. */
	bool co;
};

struct ioc__qmp_opts {
	const struct ioc__qmp_cmd *cmds;   /* the table, in query-commands order */
	size_t ncmds;
	void *ctx;                         /* for the handlers */
	const char *package;               /* greeting and query-version */
	int major, minor, micro;
	size_t max_msg;                    /* 0 = 1 MiB: one JSON message */
	size_t max_out;                    /* 0 = 4 MiB: replies and events a
					    * client has not read */
	unsigned max_clients;              /* 0 = 16 */
};

struct ioc__qmp;
struct ioc__qmp_client;

/* Serve listen_fd (owned from here on; -1 for none) on loop. */
int ioc__qmp_new(struct ioc__qmp **out, struct ioc_loop *loop, int listen_fd,
		 const struct ioc__qmp_opts *opts);
/* Close every client and the listener. */
void ioc__qmp_free(struct ioc__qmp *q);
/* Serve an already connected socket (tests, the fuzzer).  NULL client
 * pointer on failure (-errno returned). */
int ioc__qmp_attach(struct ioc__qmp *q, int fd, struct ioc__qmp_client **out);
/* Feed bytes as if read from the client's socket.  Returns 0, or -EPIPE
 * when the client was closed (and freed) as a result. */
int ioc__qmp_input(struct ioc__qmp_client *c, const void *buf, size_t len);
/* Send an event ({"event", "data", "timestamp"}) to every client that
 * negotiated.  Steals data (may be NULL). */
void ioc__qmp_event(struct ioc__qmp *q, const char *name, json_t *data);
/* Write out what every client has queued, as far as its socket takes it
 * now (before the process goes away). */
void ioc__qmp_flush(struct ioc__qmp *q);

#endif /* IOC_QMP_QMP_H */
