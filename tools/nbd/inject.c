/*
 * Fault injection for iocore-nbd: tests and the soak need a real server
 * whose I/O fails in ways they can predict, so a checker can tell an
 * expected error from a bug.  Each --inject-faults rule is
 *
 *     OPS=ERR[@OFF+LEN][/N][#COUNT]
 *
 * OPS is a comma-separated list of read, write, flush, trim, zero (or
 * all); ERR an errno name (EIO, ENOSPC, ...) or number.  A rule fails the
 * block layer's attempts at those operations that overlap [OFF, OFF+LEN)
 * (any offset without @; a flush has no range, so only a rule without @
 * fails it), only every Nth matching attempt with /N, and at most COUNT
 * times with #COUNT.  The first matching rule that fires wins.
 *
 * Design.  Rules are deterministic (a counter, not a random draw) so a
 * test's expectations hold run after run, and ranged so a checker knows
 * exactly which requests may fail: everything outside the ranges must
 * succeed.  The hook runs on whichever thread makes the attempt (a pool
 * worker with --aio threads), so the counters are atomics; they order
 * nothing else (relaxed).  The option is always built, like QEMU's
 * blkdebug driver: a separate fault-injection build would leave the NBD
 * fault tests skipped in every ordinary `make test`.  With no rule the
 * block layer pays one predictable branch per attempt, as it always does;
 * with one, requests skip its inline fast path.
 *
 * Rejected: an environment variable (a tool's behaviour belongs on its
 * command line); random failures at a rate (a checker could only guess
 * which request failed for which reason).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/blk/blk-int.h"
#include "inject.h"

#define MAX_RULES 16

struct rule {
	unsigned ops;            /* 1u << enum blk_op */
	int err;                 /* positive errno */
	bool ranged;
	uint64_t off, len;
	uint64_t every;          /* 1: every match */
	int64_t count;           /* -1: unbounded */
	_Atomic uint64_t seen;   /* matching attempts */
	_Atomic int64_t fired;   /* injections */
};

static struct rule rules[MAX_RULES];
static unsigned nrules;

static const struct { const char *name; int err; } errnames[] = {
	{ "EIO", EIO }, { "ENOSPC", ENOSPC }, { "EDQUOT", EDQUOT },
	{ "EFBIG", EFBIG }, { "EPERM", EPERM }, { "EROFS", EROFS },
	{ "EACCES", EACCES }, { "EINVAL", EINVAL }, { "ENOMEM", ENOMEM },
	{ "ENOTSUP", ENOTSUP }, { "EOVERFLOW", EOVERFLOW },
	{ "ESHUTDOWN", ESHUTDOWN }, { "EAGAIN", EAGAIN },
};

static int parse_ops(const char *s, size_t n, unsigned *ops)
{
	static const struct { const char *name; unsigned bits; } names[] = {
		{ "read", 1u << BLK_OP_READ }, { "write", 1u << BLK_OP_WRITE },
		{ "flush", 1u << BLK_OP_FLUSH }, { "trim", 1u << BLK_OP_DISCARD },
		{ "zero", 1u << BLK_OP_ZEROES }, { "all", ~0u },
	};

	*ops = 0;
	while (n) {
		size_t w = 0;
		bool found = false;

		while (w < n && s[w] != ',')
			w++;
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			if (strlen(names[i].name) == w && !strncmp(names[i].name, s, w)) {
				*ops |= names[i].bits;
				found = true;
			}
		}
		if (!found)
			return -EINVAL;
		s += w;
		n -= w;
		if (n) {
			s++;
			n--;
		}
	}
	return *ops ? 0 : -EINVAL;
}

static int parse_u64(const char **p, uint64_t *out)
{
	char *end;

	if (**p < '0' || **p > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(*p, &end, 0);
	if (errno)
		return -EINVAL;
	*p = end;
	return 0;
}

int nbd_inject_add(const char *spec, char *err, size_t errlen)
{
	const char *eq = strchr(spec, '='), *p;
	struct rule *r;
	size_t n;

	if (nrules == MAX_RULES) {
		snprintf(err, errlen, "at most %d --inject-faults rules", MAX_RULES);
		return -EINVAL;
	}
	r = &rules[nrules];
	memset(r, 0, sizeof(*r));
	r->every = 1;
	r->count = -1;
	if (!eq || parse_ops(spec, (size_t)(eq - spec), &r->ops) < 0)
		goto bad;
	p = eq + 1;
	n = strcspn(p, "@/#");
	for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
		if (strlen(errnames[i].name) == n && !strncmp(errnames[i].name, p, n))
			r->err = errnames[i].err;
	if (!r->err) {
		uint64_t v;
		const char *q = p;

		if (parse_u64(&q, &v) < 0 || q != p + n || v == 0 || v > 4095)
			goto bad;
		r->err = (int)v;
	}
	p += n;
	if (*p == '@') {
		p++;
		if (parse_u64(&p, &r->off) < 0 || *p++ != '+' ||
		    parse_u64(&p, &r->len) < 0 || r->len == 0)
			goto bad;
		r->ranged = true;
	}
	if (*p == '/') {
		p++;
		if (parse_u64(&p, &r->every) < 0 || r->every == 0)
			goto bad;
	}
	if (*p == '#') {
		uint64_t c;

		p++;
		if (parse_u64(&p, &c) < 0 || c > INT64_MAX)
			goto bad;
		r->count = (int64_t)c;
	}
	if (*p)
		goto bad;
	nrules++;
	return 0;
bad:
	snprintf(err, errlen, "bad --inject-faults rule '%s' (want "
		 "OPS=ERR[@OFF+LEN][/N][#COUNT], e.g. read,write=EIO@1048576+65536/10)",
		 spec);
	return -EINVAL;
}

static int64_t inject_fn(void *opaque, enum blk_op op, uint64_t offset, uint64_t len)
{
	for (unsigned i = 0; i < nrules; i++) {
		struct rule *r = &rules[i];

		if (!(r->ops & (1u << op)))
			continue;
		if (r->ranged && (offset >= r->off + r->len || offset + len <= r->off ||
				  op == BLK_OP_FLUSH))
			continue;
		/* Relaxed: counters that order nothing but themselves. */
		uint64_t k = atomic_fetch_add_explicit(&r->seen, 1, memory_order_relaxed);
		if ((k + 1) % r->every)
			continue;
		if (r->count >= 0 &&
		    atomic_fetch_add_explicit(&r->fired, 1, memory_order_relaxed) >= r->count)
			continue;
		return -r->err;
	}
	return 0;
}

void nbd_inject_install(struct ioc_blk *blk)
{
	if (nrules)
		ioc__blk_set_fault(blk, inject_fn, NULL);
}
