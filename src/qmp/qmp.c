/*
 * QMP, the protocol of QEMU's monitor, spoken as qemu-storage-daemon 7.2
 * speaks it, so QMP tooling works unchanged against the control socket.
 *
 * Framing.  The input is a stream of JSON values with no delimiter: two
 * commands may come in one read, one command across several.  A small
 * scanner finds where each top-level value ends (brace and bracket depth
 * outside strings, with escapes), and jansson parses exactly that span.
 * Rejected: handing jansson the whole buffer with JSON_DISABLE_EOF_CHECK
 * and reading where it stopped from the error position: an incomplete
 * value and an invalid one are then told apart by the text of the error,
 * and after an invalid one there is no telling where the next begins.
 * The scanner resynchronises where QEMU's streamer does, at the end of the
 * bad value.  Output is one value per line, ending in CRLF.
 *
 * Dispatch is one path: the request's members are checked (QEMU's
 * messages: "QMP input member 'x' is unexpected"), negotiation is
 * enforced, the command is looked up in the caller's const table, and its
 * arguments are checked against the command's spec ("Parameter 'x' is
 * missing", "... expects uint64", "... is unexpected") before the handler
 * runs, so handlers never see a wrong type.  The reply echoes the id.
 * A command marked co (one that waits on a cluster) runs in a coroutine,
 * as QEMU's coroutine commands do: the loop serves I/O and events
 * meanwhile, while no client's input is read or parsed until it ends, so
 * commands never interleave; a client that hangs up meanwhile is freed at
 * the end (call_co()).  Rejected: a thread per command (every handler
 * would need locks), letting other clients' queries run beside it (one
 * mutating command among them would).
 *
 * Hostile clients.  A message larger than max_msg gets a GenericError
 * and the connection is closed (there is no way to find the next message
 * inside it).  A client that does not read its replies and events is
 * closed once max_out bytes wait for it; nothing else waits for it, since
 * every write is non-blocking.  The NBD clients live on other threads.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "iocore/co.h"
#include "qmp.h"
#include "util/buf.h"

struct ioc__qmp_client {
	struct ioc__qmp *q;
	struct ioc__qmp_client *next;
	int fd;
	bool negotiated;
	bool dead;                 /* close now */
	bool draining;             /* told to go: input is dropped, output
				    * shut down once sent, closed at EOF */
	uint64_t drained;
	bool reg_write;
	bool reg_read;
	bool closed;               /* gone while its command ran: freed at its end */
	unsigned resume_gen;       /* see resume_bh() */
	char *in;                  /* unparsed input */
	size_t in_len, in_cap;
	char *out;                 /* unsent output */
	size_t out_off, out_len, out_cap;
};

struct ioc__qmp {
	struct ioc_loop *loop;
	int listen_fd;
	struct ioc__qmp_opts o;
	struct ioc__qmp_client *clients;
	unsigned nclients;
	/* The client whose command runs in a coroutine (the essay); every
	 * client's input waits meanwhile. */
	struct ioc__qmp_client *running;
	struct ioc_bh *resume;     /* after it: the input that waited */
	unsigned resume_gen;
};

static void client_close(struct ioc__qmp_client *c);

/* ---- output ------------------------------------------------------------- */

static void on_writable(void *opaque);
static void on_readable(void *opaque);

/* Read while no command runs in a coroutine; write while output waits. */
static void update_fd(struct ioc__qmp_client *c)
{
	bool w = c->out_len > c->out_off, r = !c->q->running;

	if (c->fd < 0 || (w == c->reg_write && r == c->reg_read))
		return;
	c->reg_write = w;
	c->reg_read = r;
	ioc_loop_set_fd(c->q->loop, c->fd, r ? on_readable : NULL, w ? on_writable : NULL,
			NULL, NULL, c);
}

static void flush_out(struct ioc__qmp_client *c)
{
	while (c->fd >= 0 && c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			c->dead = true;
			return;
		}
		c->out_off += (size_t)n;
	}
	if (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->draining)
			shutdown(c->fd, SHUT_WR);
	}
	update_fd(c);
}

/* Queue one value and CRLF.  Steals v. */
static void send_json(struct ioc__qmp_client *c, json_t *v)
{
	char *s = json_dumps(v, JSON_PRESERVE_ORDER);
	size_t n;

	json_decref(v);
	if (!s) {
		c->dead = true;
		return;
	}
	n = strlen(s);
	if (c->out_len - c->out_off + n + 2 > c->q->o.max_out) {
		/* A client that does not read: let it go. */
		free(s);
		c->dead = true;
		return;
	}
	if (c->out_len + n + 2 > c->out_cap) {
		char *p;

		if (c->out_off) {
			memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
			c->out_len -= c->out_off;
			c->out_off = 0;
		}
		p = ioc__buf_grow(c->out, &c->out_cap, c->out_len + n + 2, 4096);
		if (!p) {
			free(s);
			c->dead = true;
			return;
		}
		c->out = p;
	}
	memcpy(c->out + c->out_len, s, n);
	memcpy(c->out + c->out_len + n, "\r\n", 2);
	c->out_len += n + 2;
	free(s);
	flush_out(c);
}

static void send_error(struct ioc__qmp_client *c, json_t *id, const char *cls,
		       const char *desc)
{
	json_t *r = json_pack("{s:{s:s,s:s}}", "error", "class", cls, "desc", desc);

	if (r && id)
		json_object_set(r, "id", id);
	send_json(c, r);
}

static void send_errorf(struct ioc__qmp_client *c, json_t *id, const char *cls,
			const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void send_errorf(struct ioc__qmp_client *c, json_t *id, const char *cls,
			const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	send_error(c, id, cls, buf);
}

void ioc__qmp_errf(struct ioc__qmp_err *err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err->desc, sizeof(err->desc), fmt, ap);
	va_end(ap);
}

/* ---- dispatch ------------------------------------------------------------- */

static void reply(struct ioc__qmp_client *c, json_t *id, json_t *ret,
		  const struct ioc__qmp_err *err)
{
	json_t *v;

	if (!ret) {
		send_error(c, id, err->cls ? err->cls : "GenericError",
			   err->desc[0] ? err->desc : "failed");
		return;
	}
	v = json_pack("{s:o}", "return", ret);
	if (v && id)
		json_object_set(v, "id", id);
	send_json(c, v);
}

static void hold_all(struct ioc__qmp *q)
{
	for (struct ioc__qmp_client *c = q->clients; c; c = c->next)
		update_fd(c);
}

struct co_call {
	struct ioc__qmp_client *c;
	const struct ioc__qmp_cmd *cmd;
	json_t *id, *args;
};

static void client_free(struct ioc__qmp_client *c);

static void ioc_coroutine_fn call_co(void *opaque)
{
	struct co_call *k = opaque;
	struct ioc__qmp_client *c = k->c;
	struct ioc__qmp *q = c->q;
	struct ioc__qmp_err err = { .cls = "GenericError" };
	json_t *ret = k->cmd->fn(q->o.ctx, k->args, &err);

	if (c->closed)
		json_decref(ret);
	else
		reply(c, k->id, ret, &err);
	json_decref(k->id);
	json_decref(k->args);
	free(k);
	q->running = NULL;
	if (c->closed)
		client_free(c);
	else if (c->dead)
		client_close(c);
	hold_all(q);
	/* The input that came with or before the command's, and what the
	 * sockets hold now, from the loop rather than this coroutine. */
	ioc_bh_schedule(q->resume);
}

/* A command that may yield: its own coroutine, the monitors held until
 * it ends (the essay).  Steals nothing; takes references. */
static void dispatch_co(struct ioc__qmp_client *c, const struct ioc__qmp_cmd *cmd,
			json_t *id, json_t *args)
{
	struct co_call *k = calloc(1, sizeof(*k));
	struct ioc_co *co = k ? ioc_co_create(call_co, k) : NULL;

	if (!co) {
		free(k);
		send_error(c, id, "GenericError", "out of memory");
		return;
	}
	k->c = c;
	k->cmd = cmd;
	k->id = json_incref(id);
	k->args = json_incref(args);
	c->q->running = c;
	hold_all(c->q);
	ioc_co_enter(co);
}

static void dispatch(struct ioc__qmp_client *c, json_t *req)
{
	struct ioc__qmp *q = c->q;
	json_t *id = NULL, *args = NULL, *exec = NULL, *v, *ret;
	const struct ioc__qmp_cmd *cmd = NULL;
	struct ioc__qmp_err err = { .cls = "GenericError" };
	const char *key, *name;
	json_t *empty = NULL;

	if (!json_is_object(req)) {
		send_error(c, NULL, "GenericError", "QMP input must be a JSON object");
		return;
	}
	id = json_object_get(req, "id");
	json_object_foreach(req, key, v) {
		if (strcmp(key, "execute") == 0) {
			if (!json_is_string(v)) {
				send_error(c, id, "GenericError",
					   "QMP input member 'execute' must be a string");
				return;
			}
			exec = v;
		} else if (strcmp(key, "arguments") == 0) {
			if (!json_is_object(v)) {
				send_error(c, id, "GenericError",
					   "QMP input member 'arguments' must be an object");
				return;
			}
			args = v;
		} else if (strcmp(key, "id") != 0) {
			send_errorf(c, id, "GenericError",
				    "QMP input member '%s' is unexpected", key);
			return;
		}
	}
	if (!exec) {
		send_error(c, id, "GenericError", "QMP input lacks member 'execute'");
		return;
	}
	name = json_string_value(exec);
	if (!c->negotiated && strcmp(name, "qmp_capabilities") != 0) {
		send_error(c, id, "CommandNotFound",
			   "Expecting capabilities negotiation with 'qmp_capabilities'");
		return;
	}
	if (c->negotiated && strcmp(name, "qmp_capabilities") == 0) {
		send_error(c, id, "CommandNotFound",
			   "Capabilities negotiation is already complete, command ignored");
		return;
	}
	for (size_t i = 0; i < q->o.ncmds; i++)
		if (strcmp(q->o.cmds[i].name, name) == 0)
			cmd = &q->o.cmds[i];
	if (!cmd) {
		send_errorf(c, id, "CommandNotFound", "The command %s has not been found",
			    name);
		return;
	}
	if (!args)
		args = empty = json_object();
	if (!args || !(cmd->spec ? ioc__qmp_check_value(cmd->spec(), args, 0, err.desc,
							     sizeof(err.desc))
				 : ioc__qmp_check(cmd->args, args, 0, err.desc,
						  sizeof(err.desc)))) {
		send_error(c, id, "GenericError", args ? err.desc : "out of memory");
		json_decref(empty);
		return;
	}
	if (cmd->co && q->resume) {
		dispatch_co(c, cmd, id, args);
		json_decref(empty);
		return;
	}
	if (strcmp(name, "qmp_capabilities") == 0) {
		c->negotiated = true;
		ret = json_object();
	} else {
		ret = cmd->fn(q->o.ctx, args, &err);
	}
	json_decref(empty);
	reply(c, id, ret, &err);
}

/* ---- input ------------------------------------------------------------------- */

/*
 * Where the top-level value starting at in[0] (not whitespace) ends:
 * its length, or 0 when it is not complete yet.  A '{' or '[' value ends
 * at its matching bracket (outside strings); anything else is a scalar
 * or junk, which ends before the next whitespace or bracket.
 */
static size_t value_end(const char *in, size_t len)
{
	size_t depth = 0, i;
	bool str = false, esc = false;

	if (in[0] != '{' && in[0] != '[') {
		if (in[0] == '}' || in[0] == ']')
			return 1;
		for (i = 0; i < len; i++)
			if (strchr(" \t\r\n{}[]", in[i]))
				return i;
		return 0;
	}
	for (i = 0; i < len; i++) {
		char ch = in[i];

		if (str) {
			if (esc)
				esc = false;
			else if (ch == '\\')
				esc = true;
			else if (ch == '"')
				str = false;
			continue;
		}
		if (ch == '"')
			str = true;
		else if (ch == '{' || ch == '[')
			depth++;
		else if ((ch == '}' || ch == ']') && --depth == 0)
			return i + 1;
	}
	return 0;
}

static void process(struct ioc__qmp_client *c)
{
	size_t pos = 0;

	while (!c->dead && !c->q->running && pos < c->in_len) {
		char *p = c->in + pos;
		size_t left = c->in_len - pos, n;
		json_error_t jerr;
		json_t *v;

		if (strchr(" \t\r\n", *p) && *p) {
			pos++;
			continue;
		}
		n = value_end(p, left);
		if (!n) {
			if (left > c->q->o.max_msg) {
				/* Closing at once would reset the connection
				 * (unread input) and lose the error: drop the
				 * input, send the error, shut down writing and
				 * close when the client has gone. */
				c->draining = true;
				pos = c->in_len;
				send_error(c, NULL, "GenericError",
					   "JSON message too large; closing the connection");
			}
			break;
		}
		v = json_loadb(p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
		pos += n;
		if (!v) {
			send_errorf(c, NULL, "GenericError", "JSON parse error, %s", jerr.text);
			continue;
		}
		dispatch(c, v);
		json_decref(v);
	}
	memmove(c->in, c->in + pos, c->in_len - pos);
	c->in_len -= pos;
}

static int append_input(struct ioc__qmp_client *c, const void *buf, size_t len)
{
	if (c->in_len + len > c->in_cap) {
		char *p = ioc__buf_grow(c->in, &c->in_cap, c->in_len + len, 4096);

		if (!p)
			return -ENOMEM;
		c->in = p;
	}
	memcpy(c->in + c->in_len, buf, len);
	c->in_len += len;
	return 0;
}

int ioc__qmp_input(struct ioc__qmp_client *c, const void *buf, size_t len)
{
	if (c->draining) {
		/* A client that keeps sending after being told to go. */
		c->drained += len;
		if (c->drained > 4 * c->q->o.max_msg)
			c->dead = true;
		len = 0;
	}
	if (!c->dead && len && append_input(c, buf, len) < 0)
		c->dead = true;
	if (!c->dead && !c->draining && !c->q->running)
		process(c);
	if (c->dead) {
		client_close(c);
		return -EPIPE;
	}
	return 0;
}

static void on_readable(void *opaque)
{
	struct ioc__qmp_client *c = opaque;
	char buf[16384];

	for (int rounds = 0; rounds < 16; rounds++) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			client_close(c);
			return;
		}
		if (ioc__qmp_input(c, buf, (size_t)n) < 0)
			return;
	}
}

static void on_writable(void *opaque)
{
	struct ioc__qmp_client *c = opaque;

	flush_out(c);
	if (c->dead)
		client_close(c);
}

/* ---- clients ----------------------------------------------------------------- */

static void client_free(struct ioc__qmp_client *c)
{
	free(c->in);
	free(c->out);
	free(c);
}

/* Unlink and close; the struct goes with it, or, while its command runs,
 * at that command's end (call_co()). */
static void client_close(struct ioc__qmp_client *c)
{
	struct ioc__qmp *q = c->q;

	if (c->closed)
		return;

	for (struct ioc__qmp_client **pp = &q->clients; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	q->nclients--;
	if (c->fd >= 0) {
		ioc_loop_set_fd(q->loop, c->fd, NULL, NULL, NULL, NULL, NULL);
		close(c->fd);
		c->fd = -1;
	}
	if (q->running == c) {
		c->closed = true;
		c->dead = true;
		return;
	}
	client_free(c);
}

int ioc__qmp_attach(struct ioc__qmp *q, int fd, struct ioc__qmp_client **out)
{
	struct ioc__qmp_client *c = calloc(1, sizeof(*c));
	json_t *greeting;
	int r;

	if (out)
		*out = NULL;
	if (!c)
		return -ENOMEM;
	c->q = q;
	c->fd = fd;
	c->reg_read = !q->running;
	r = c->reg_read ? ioc_loop_set_fd(q->loop, fd, on_readable, NULL, NULL, NULL, c) : 0;
	if (r < 0) {
		free(c);
		return r;
	}
	c->next = q->clients;
	q->clients = c;
	q->nclients++;
	greeting = json_pack("{s:{s:{s:{s:i,s:i,s:i},s:s},s:[]}}", "QMP", "version", "qemu",
			     "major", q->o.major, "minor", q->o.minor, "micro", q->o.micro,
			     "package", q->o.package, "capabilities");
	send_json(c, greeting);
	if (c->dead) {
		client_close(c);
		return -EPIPE;
	}
	if (out)
		*out = c;
	return 0;
}

/*
 * After a coroutine's command: each client's input that waited, once, in
 * list order, until another such command starts.  A pass may close any
 * client (an event to a dead one), so it rescans from the head, skipping
 * those marked with this run's generation.
 */
static void resume_bh(void *opaque)
{
	struct ioc__qmp *q = opaque;
	unsigned gen = ++q->resume_gen;
	struct ioc__qmp_client *c;

	while (!q->running) {
		for (c = q->clients; c && c->resume_gen == gen; c = c->next)
			;
		if (!c)
			return;
		c->resume_gen = gen;
		if (c->in_len && !c->dead && !c->draining) {
			process(c);
			if (c->dead)
				client_close(c);
		}
	}
}

static void on_accept(void *opaque)
{
	struct ioc__qmp *q = opaque;

	for (;;) {
		int fd = accept4(q->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		if (q->nclients >= q->o.max_clients) {
			static const char msg[] = "{\"error\": {\"class\": \"GenericError\", "
				"\"desc\": \"too many control clients\"}}\r\n";
			ssize_t n = send(fd, msg, sizeof(msg) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);

			(void)n;
			close(fd);
			continue;
		}
		int r = ioc__qmp_attach(q, fd, NULL);

		if (r < 0 && r != -EPIPE)
			close(fd); /* -EPIPE: attach closed it */
	}
}

int ioc__qmp_new(struct ioc__qmp **out, struct ioc_loop *loop, int listen_fd,
		 const struct ioc__qmp_opts *opts)
{
	struct ioc__qmp *q = calloc(1, sizeof(*q));
	int r;

	*out = NULL;
	if (!q)
		return -ENOMEM;
	q->loop = loop;
	q->listen_fd = listen_fd;
	q->o = *opts;
	q->resume = ioc_bh_new(loop, resume_bh, q);
	if (!q->resume) {
		free(q);
		return -ENOMEM;
	}
	if (!q->o.max_msg)
		q->o.max_msg = 1u << 20;
	if (!q->o.max_out)
		q->o.max_out = 4u << 20;
	if (!q->o.max_clients)
		q->o.max_clients = 16;
	if (listen_fd >= 0) {
		r = ioc_loop_set_fd(loop, listen_fd, on_accept, NULL, NULL, NULL, q);
		if (r < 0) {
			ioc_bh_delete(q->resume);
			free(q);
			return r;
		}
	}
	*out = q;
	return 0;
}

void ioc__qmp_free(struct ioc__qmp *q)
{
	if (!q)
		return;
	/* A command in a coroutine holds its client (and may hold what it
	 * works on, a cluster call on the pool): the stop waits for it, as it
	 * waits for a node's requests in flight. */
	while (q->running)
		ioc_loop_poll(q->loop, true);
	ioc_bh_delete(q->resume);
	while (q->clients)
		client_close(q->clients);
	if (q->listen_fd >= 0) {
		ioc_loop_set_fd(q->loop, q->listen_fd, NULL, NULL, NULL, NULL, NULL);
		close(q->listen_fd);
	}
	free(q);
}

void ioc__qmp_event(struct ioc__qmp *q, const char *name, json_t *data)
{
	struct timeval tv;
	struct ioc__qmp_client *c, *next;

	gettimeofday(&tv, NULL);
	if (!data)
		data = json_object();
	for (c = q->clients; c; c = next) {
		json_t *ev;

		next = c->next;
		if (!c->negotiated)
			continue;
		ev = json_pack("{s:s,s:O,s:{s:I,s:I}}", "event", name, "data", data,
			       "timestamp",
			       "seconds", (json_int_t)tv.tv_sec,
			       "microseconds", (json_int_t)tv.tv_usec);
		send_json(c, ev);
		if (c->dead)
			client_close(c);
	}
	json_decref(data);
}

void ioc__qmp_flush(struct ioc__qmp *q)
{
	for (struct ioc__qmp_client *c = q->clients; c; c = c->next)
		flush_out(c);
}
