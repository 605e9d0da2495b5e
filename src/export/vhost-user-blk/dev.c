/*
 * The vhost-user device state machine: one handler per front-end message.
 *
 * Problem: the front end drives the device through a long conversation
 * (features, memory, then per queue size, base, addresses, kick, call,
 * enable; GET_VRING_BASE to stop) in no fixed order: QEMU sends
 * SET_VRING_CALL before SET_FEATURES, SeaBIOS starts and stops queue 0
 * before Linux restarts them all on the same connection, the memory table
 * changes under running queues, each on its own I/O thread.  A message
 * that does not fit the state ends the connection, not the process.
 *
 * Design: a const table maps each request to a handler (one about a queue
 * is handed the queue the message names); dispatch runs it, closes the
 * fds it did not take, and answers (the reply, or REPLY_ACK's u64).
 * -EPROTO ends the connection with the reason logged; another -errno is
 * told to the front end.  A queue starts when it has a size,
 * addresses, memory and its kick fd, and stops on GET_VRING_BASE, as often
 * as the front end likes.  Whatever touches a running queue runs on its
 * loop (the connection's coroutine moves there and back); a stop or a new
 * memory table waits there for the queue's requests, so guest memory is
 * unmapped only when none points into it.  ADD/REM_MEM_REG share the old
 * table's mappings and unmap only the removed region's.
 *
 * Dirty logging: SET_LOG_BASE maps the bitmap; each queue points at it
 * while LOG_ALL is on (set on its loop, so a request logs into the log
 * current when it completes, and an old log is unmapped once no queue
 * points at it).  A log that cannot be mapped ends the connection: QEMU
 * reads the reply, not its payload, and would migrate without a log.
 * Inflight tracking: GET_INFLIGHT_FD makes a zeroed region for the front
 * end to keep; SET_INFLIGHT_FD maps the one handed back, only while every
 * queue is stopped, each field checked; a queue takes its part at start
 * (inflight.c tracks, queue.c resubmits).  The back-end channel carries
 * config-change notices.
 *
 * Rejected: a lock per queue on both sides (the data path would pay for
 * a control path that runs a few times per boot); failing unknown
 * requests and going on (their fds cannot be accounted for: msg.c ends
 * the connection).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vub-export.h"

struct reply {
	bool send;
	uint32_t size;
	union {
		uint64_t u64;
		struct vhost_vring_state state;
		struct vub_config_desc cfg;
		struct vub_inflight_desc inflight;
	} p;
	int fd;                          /* sent with it, then closed; -1: none */
};

typedef int ioc_coroutine_fn handler_fn(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					struct reply *rep);
/* A message about one queue: dispatch finds the queue it names. */
typedef int ioc_coroutine_fn vring_fn(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
				      struct ioc__vub_msg *m, struct reply *rep);

static void reply_u64(struct reply *rep, uint64_t v)
{
	rep->send = true;
	rep->size = 8;
	rep->p.u64 = v;
}

static int proto(struct ioc__vub_conn *c, const char *why)
{
	ioc__vub_log(c->exp, "closing the connection: %s", why);
	return -EPROTO;
}

void ioc_coroutine_fn ioc__vub_to_queue(struct ioc__vub_queue *q)
{
	ioc_co_move_to(q->loop);
}

void ioc_coroutine_fn ioc__vub_to_ctrl(struct ioc__vub_export *e)
{
	ioc_co_move_to(e->ctrl);
}

static struct ioc__vub_queue *queue_of(struct ioc__vub_conn *c, uint64_t index)
{
	if (index >= c->exp->num_queues)
		return NULL;
	return &c->exp->q[index];
}

/* The queue index a vring message carries: where it stands depends on the
 * request (msg.c has checked the payload's size). */
static uint64_t vring_index(const struct ioc__vub_msg *m)
{
	switch (m->request) {
	case VUB_SET_VRING_ADDR:
		return m->p.addr.index;
	case VUB_SET_VRING_KICK:
	case VUB_SET_VRING_CALL:
	case VUB_SET_VRING_ERR:
		return m->p.u64 & VUB_VRING_IDX_MASK;
	default:
		return m->p.state.index;
	}
}

/* The message's fd, taken from it (dispatch closes the ones left), or -1
 * when it carries none. */
static int take_fd(struct ioc__vub_msg *m)
{
	int fd = -1;

	if (m->nfds) {
		fd = m->fds[0];
		m->fds[0] = -1;
	}
	return fd;
}

static void ioc_coroutine_fn start_kicked(struct ioc__vub_conn *c);
static void ioc_coroutine_fn log_apply(struct ioc__vub_conn *c, bool say);

/* ---- guest memory -------------------------------------------------------- */

/* A mapping of a front end's file given back with its guard slot (the
 * slot first, as guard.c asks); *guard and *map are left empty. */
static void unmap_guarded(int *guard, void **map, size_t len)
{
	ioc__vub_guard_del(*guard);
	*guard = 0;
	if (*map)
		munmap(*map, len);
	*map = NULL;
}

static void region_unmap(struct ioc__vub_region *r)
{
	unmap_guarded(&r->guard, &r->map, r->map_len);
}

static void mem_free(struct ioc__vub_mem *mem, bool unmap)
{
	if (!mem)
		return;
	if (unmap)
		for (unsigned i = 0; i < mem->n; i++)
			region_unmap(&mem->r[i]);
	free(mem);
}

/* Map d from fd (taken on success) after checking it against the file
 * and against the table's other regions. */
static int region_map(struct ioc__vub_conn *c, const struct ioc__vub_mem *mem,
		      const struct vub_region_desc *d, int fd, struct ioc__vub_region *out)
{
	struct stat st;
	uint64_t end;
	void *p;

	if (!d->size || __builtin_add_overflow(d->gpa, d->size, &end) ||
	    __builtin_add_overflow(d->uva, d->size, &end) ||
	    __builtin_add_overflow(d->mmap_offset, d->size, &end) || end > SIZE_MAX)
		return proto(c, "memory region of bad size");
	for (unsigned i = 0; i < mem->n; i++) {
		const struct ioc__vub_region *o = &mem->r[i];

		if (d->gpa < o->gpa + o->size && o->gpa < d->gpa + d->size)
			return proto(c, "memory regions overlap");
	}
	/* A mapping past the end of the file would fault (SIGBUS) on access.
	 * A front end that shrinks the file afterwards still could: QEMU's
	 * memfd backend seals it against that (seal=on, its default); the
	 * guest's memory is not ours to seal, so the mapping is guarded
	 * (guard.c) instead. */
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < end)
		return proto(c, "memory region larger than its file");
	p = mmap(NULL, (size_t)end, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
		 fd, 0);
	if (p == MAP_FAILED) {
		int r = -errno;

		ioc__vub_log(c->exp, "mapping %llu bytes of guest memory: %s",
			     (unsigned long long)end, ioc_strerror(r));
		return r;
	}
	close(fd);
	*out = (struct ioc__vub_region){
		.gpa = d->gpa, .size = d->size, .uva = d->uva,
		.host = (uint8_t *)p + d->mmap_offset, .map = p, .map_len = (size_t)end,
		.guard = ioc__vub_guard_add(p, (size_t)end, &c->exp->mem_shrunk),
	};
	return 0;
}

/* Put mem in place on every queue, then drop the old table (unmapping
 * the regions not carried over). */
static void ioc_coroutine_fn mem_install(struct ioc__vub_conn *c, struct ioc__vub_mem *mem)
{
	struct ioc__vub_mem *old = c->mem;

	c->mem = mem;
	for (unsigned i = 0; i < c->exp->num_queues; i++) {
		struct ioc__vub_queue *q = &c->exp->q[i];

		if (!q->started)
			continue;
		ioc__vub_to_queue(q);
		ioc__vub_queue_remap(q, mem);
		ioc__vub_to_ctrl(c->exp);
	}
	if (!old)
		return;
	for (unsigned i = 0; i < old->n; i++) {
		bool kept = false;

		for (unsigned j = 0; j < mem->n && !kept; j++)
			kept = mem->r[j].map == old->r[i].map;
		if (!kept)
			region_unmap(&old->r[i]);
	}
	free(old);
}

static int ioc_coroutine_fn h_set_mem_table(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					    struct reply *rep)
{
	struct ioc__vub_mem *mem = calloc(1, sizeof(*mem));
	int r = 0;

	if (!mem)
		return -ENOMEM;
	for (unsigned i = 0; i < m->p.mem.nregions; i++) {
		r = region_map(c, mem, &m->p.mem.r[i], m->fds[i], &mem->r[mem->n]);
		if (r < 0)
			break;
		m->fds[i] = -1;
		mem->n++;
	}
	if (r < 0) {
		mem_free(mem, true);
		return r;
	}
	mem_install(c, mem);
	start_kicked(c);
	return 0;
}

static int ioc_coroutine_fn h_add_mem_reg(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					  struct reply *rep)
{
	struct ioc__vub_mem *mem = calloc(1, sizeof(*mem));
	int r;

	if (!mem)
		return -ENOMEM;
	if (c->mem)
		*mem = *c->mem;
	if (mem->n >= VUB_MAX_REGIONS) {
		free(mem);
		return proto(c, "more memory regions than GET_MAX_MEM_SLOTS");
	}
	r = region_map(c, mem, &m->p.one.r, m->fds[0], &mem->r[mem->n]);
	if (r < 0) {
		free(mem);
		return r;
	}
	m->fds[0] = -1;
	mem->n++;
	mem_install(c, mem);
	start_kicked(c);
	return 0;
}

static int ioc_coroutine_fn h_rem_mem_reg(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					  struct reply *rep)
{
	const struct vub_region_desc *d = &m->p.one.r;
	struct ioc__vub_mem *mem;
	unsigned k = 0;
	bool found = false;

	if (!c->mem)
		return -EINVAL;
	mem = calloc(1, sizeof(*mem));
	if (!mem)
		return -ENOMEM;
	for (unsigned i = 0; i < c->mem->n; i++) {
		const struct ioc__vub_region *o = &c->mem->r[i];

		if (!found && o->gpa == d->gpa && o->size == d->size && o->uva == d->uva)
			found = true;
		else
			mem->r[k++] = *o;
	}
	mem->n = k;
	if (!found) {
		free(mem);
		return -EINVAL;
	}
	mem_install(c, mem);
	return 0;
}

/* ---- features -------------------------------------------------------------- */

static int ioc_coroutine_fn h_get_features(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					   struct reply *rep)
{
	reply_u64(rep, c->exp->features);
	return 0;
}

static int ioc_coroutine_fn h_set_features(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					   struct reply *rep)
{
	bool was_logging = c->features & (1ull << VUB_F_LOG_ALL);

	if (m->p.u64 & ~c->exp->features)
		return proto(c, "front end acknowledged features not offered");
	c->features = m->p.u64;
	if (was_logging != !!(c->features & (1ull << VUB_F_LOG_ALL)))
		log_apply(c, true);
	/* Taken by each queue at its next start. */
	for (unsigned i = 0; i < c->exp->num_queues; i++) {
		struct ioc__vub_queue *q = &c->exp->q[i];

		if (q->started)
			continue;
		q->vr.event_idx = c->features & (1ull << VIRTIO_RING_F_EVENT_IDX);
		q->vr.indirect = c->features & (1ull << VIRTIO_RING_F_INDIRECT_DESC);
	}
	return 0;
}

static int ioc_coroutine_fn h_get_protocol_features(struct ioc__vub_conn *c,
						    struct ioc__vub_msg *m, struct reply *rep)
{
	reply_u64(rep, c->exp->protocol_features);
	return 0;
}

static int ioc_coroutine_fn h_set_protocol_features(struct ioc__vub_conn *c,
						    struct ioc__vub_msg *m, struct reply *rep)
{
	if (m->p.u64 & ~c->exp->protocol_features)
		return proto(c, "front end acknowledged protocol features not offered");
	c->protocol_features = m->p.u64;
	return 0;
}

static int ioc_coroutine_fn h_nop(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
				  struct reply *rep)
{
	return 0;
}

static int ioc_coroutine_fn h_get_queue_num(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					    struct reply *rep)
{
	reply_u64(rep, c->exp->num_queues);
	return 0;
}

static int ioc_coroutine_fn h_get_max_mem_slots(struct ioc__vub_conn *c,
						struct ioc__vub_msg *m, struct reply *rep)
{
	reply_u64(rep, VUB_MAX_REGIONS);
	return 0;
}

/* ---- queues ------------------------------------------------------------------ */

static void ioc_coroutine_fn queue_stop(struct ioc__vub_conn *c, struct ioc__vub_queue *q)
{
	if (!q->started)
		return;
	ioc__vub_to_queue(q);
	ioc__vub_queue_stop(q);
	ioc__vub_to_ctrl(c->exp);
	q->running = false;
}

/* Stop q and close its kick fd: GET_VRING_BASE, or a new kick fd. */
static void ioc_coroutine_fn queue_unkick(struct ioc__vub_conn *c, struct ioc__vub_queue *q)
{
	queue_stop(c, q);
	if (q->kick_fd >= 0)
		close(q->kick_fd);
	q->kick_fd = -1;
}

/* Start q if it has everything a start needs. */
static int ioc_coroutine_fn queue_try_start(struct ioc__vub_conn *c, struct ioc__vub_queue *q)
{
	int r;

	if (q->started || !q->kick_set || !c->mem || !q->vr.num || !q->vr.desc_uva)
		return 0;
	/* Without PROTOCOL_FEATURES a queue starts enabled. */
	if (!(c->features & (1ull << VUB_F_PROTOCOL_FEATURES)))
		q->want_enable = true;
	q->vr.inflight = NULL;
	if (c->inflight_base && q->index < c->inflight_nq) {
		if (q->vr.num > c->inflight_qsize) {
			ioc__vub_log(c->exp, "queue %u not started: ring of %u entries, inflight "
				     "region for %u", q->index, q->vr.num, c->inflight_qsize);
			return -EINVAL;
		}
		q->vr.inflight = (struct vub_inflight_queue *)(c->inflight_base +
							       q->index * c->inflight_qbytes);
	}
	ioc__vub_to_queue(q);
	r = ioc__vub_queue_start(q, c->mem);
	ioc__vub_to_ctrl(c->exp);
	q->running = r == 0;
	if (r < 0)
		ioc__vub_log(c->exp, "queue %u not started: %s", q->index,
			     r == -EINVAL && q->vr.why ? q->vr.why : ioc_strerror(r));
	return r;
}

/* Queues kicked before the memory table came. */
static void ioc_coroutine_fn start_kicked(struct ioc__vub_conn *c)
{
	for (unsigned i = 0; i < c->exp->num_queues; i++)
		queue_try_start(c, &c->exp->q[i]);
}

static int ioc_coroutine_fn h_set_vring_num(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					    struct ioc__vub_msg *m, struct reply *rep)
{
	unsigned n = m->p.state.num;

	if (q->started)
		return proto(c, "SET_VRING_NUM on a running queue");
	if (!n || n > 32768 || (n & (n - 1)))
		return proto(c, "vring size not a power of two up to 32768");
	q->vr.num = n;
	return 0;
}

static int ioc_coroutine_fn h_set_vring_addr(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					     struct ioc__vub_msg *m, struct reply *rep)
{
	const struct vhost_vring_addr *a = &m->p.addr;
	bool log = a->flags & (1u << VHOST_VRING_F_LOG);

	if (q->started) {
		if (a->desc_user_addr != q->vr.desc_uva || a->avail_user_addr != q->vr.avail_uva ||
		    a->used_user_addr != q->vr.used_uva)
			return proto(c, "SET_VRING_ADDR moves a running queue");
		/* The same ring with logging switched (a migration). */
		ioc__vub_to_queue(q);
		q->vr.log_used = log;
		q->vr.log_used_gpa = a->log_guest_addr;
		ioc__vub_to_ctrl(c->exp);
		return 0;
	}
	q->vr.log_used = log;
	q->vr.log_used_gpa = a->log_guest_addr;
	q->vr.desc_uva = a->desc_user_addr;
	q->vr.avail_uva = a->avail_user_addr;
	q->vr.used_uva = a->used_user_addr;
	return 0;
}

static int ioc_coroutine_fn h_set_vring_base(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					     struct ioc__vub_msg *m, struct reply *rep)
{
	if (q->started)
		return proto(c, "SET_VRING_BASE on a running queue");
	if (m->p.state.num > 0xffff)
		return proto(c, "vring base out of range");
	q->vr.last_avail = (uint16_t)m->p.state.num;
	return 0;
}

static int ioc_coroutine_fn h_get_vring_base(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					     struct ioc__vub_msg *m, struct reply *rep)
{
	queue_unkick(c, q);
	q->kick_set = false;
	rep->send = true;
	rep->size = sizeof(rep->p.state);
	rep->p.state.index = m->p.state.index;
	rep->p.state.num = q->vr.last_avail;
	return 0;
}

static int ioc_coroutine_fn h_set_vring_kick(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					     struct ioc__vub_msg *m, struct reply *rep)
{
	/* A new kick fd on a running queue: stop it (requests finish) and
	 * start it again on the new fd from where it was. */
	queue_unkick(c, q);
	q->kick_fd = take_fd(m);
	/* The kick handler reads only when the fd is readable, but a reader
	 * that can block the loop is one mistake away. */
	if (q->kick_fd >= 0)
		fcntl(q->kick_fd, F_SETFL, fcntl(q->kick_fd, F_GETFL) | O_NONBLOCK);
	q->kick_set = true;
	queue_try_start(c, q);
	return 0;
}

static int ioc_coroutine_fn h_set_vring_call(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					     struct ioc__vub_msg *m, struct reply *rep)
{
	/* Without an fd (-1) the front end polls the used ring. */
	int fd = take_fd(m), old = q->vr.call_fd;

	if (q->started) {
		ioc__vub_to_queue(q);
		ioc__vub_queue_set_call(q, fd);
		ioc__vub_to_ctrl(c->exp);
	} else {
		q->vr.call_fd = fd;
	}
	if (old >= 0)
		close(old);
	return 0;
}

static int ioc_coroutine_fn h_set_vring_err(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					    struct ioc__vub_msg *m, struct reply *rep)
{
	/* Without an fd (-1) the front end takes no error notices. */
	int fd = take_fd(m), old;

	/* err_fd is read on the queue's loop only after a fault: swap it
	 * there like the call fd. */
	ioc__vub_to_queue(q);
	old = q->err_fd;
	q->err_fd = fd;
	ioc__vub_to_ctrl(c->exp);
	if (old >= 0)
		close(old);
	return 0;
}

static int ioc_coroutine_fn h_set_vring_enable(struct ioc__vub_conn *c, struct ioc__vub_queue *q,
					       struct ioc__vub_msg *m, struct reply *rep)
{
	if (m->p.state.num > 1)
		return proto(c, "SET_VRING_ENABLE with a value other than 0 or 1");
	if (q->started) {
		ioc__vub_to_queue(q);
		ioc__vub_queue_set_enable(q, m->p.state.num);
		ioc__vub_to_ctrl(c->exp);
	} else {
		q->want_enable = m->p.state.num;
	}
	return 0;
}

static int ioc_coroutine_fn h_reset_owner(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					  struct reply *rep)
{
	/* Deprecated; the spec's advice: ignore it or disable the rings. */
	for (unsigned i = 0; i < c->exp->num_queues; i++)
		queue_stop(c, &c->exp->q[i]);
	return 0;
}

static int ioc_coroutine_fn h_set_backend_req_fd(struct ioc__vub_conn *c,
						 struct ioc__vub_msg *m, struct reply *rep)
{
	if (c->backend_fd >= 0)
		close(c->backend_fd);
	c->backend_fd = m->fds[0];
	m->fds[0] = -1;
	return 0;
}

/* ---- inflight tracking ---------------------------------------------------------- */

static void inflight_unmap(struct ioc__vub_conn *c)
{
	unmap_guarded(&c->inflight_guard, &c->inflight_map, c->inflight_map_len);
	c->inflight_base = NULL;
	c->inflight_nq = c->inflight_qsize = 0;
	c->inflight_qbytes = 0;
}

/* The queue count and size of a GET/SET_INFLIGHT_FD, checked. */
static int inflight_shape(struct ioc__vub_conn *c, const struct vub_inflight_desc *d)
{
	unsigned qs = d->queue_size;

	if (!(c->protocol_features & (1ull << VUB_PROTO_F_INFLIGHT_SHMFD)))
		return proto(c, "inflight region without INFLIGHT_SHMFD");
	if (d->num_queues < 1 || d->num_queues > c->exp->num_queues)
		return proto(c, "inflight region for more queues than the device has");
	if (!qs || qs > 32768 || (qs & (qs - 1)))
		return proto(c, "inflight queue size not a power of two up to 32768");
	return 0;
}

/* Set up the queues' regions a front end left zeroed (version 0). */
static void inflight_init(uint8_t *base, unsigned nq, unsigned qs, uint64_t qbytes)
{
	for (unsigned i = 0; i < nq; i++) {
		struct vub_inflight_queue *q = (struct vub_inflight_queue *)(base + i * qbytes);

		if (__atomic_load_n(&q->version, __ATOMIC_RELAXED))
			continue;
		q->desc_num = (uint16_t)qs;
		/* Release: the fields above before the version that says
		 * they are set; read by ioc__vub_vring_inflight_start(). */
		__atomic_store_n(&q->version, VUB_INFLIGHT_VERSION, __ATOMIC_RELEASE);
	}
}

static int ioc_coroutine_fn h_get_inflight_fd(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					      struct reply *rep)
{
	const struct vub_inflight_desc *d = &m->p.inflight;
	uint64_t qbytes, total;
	void *p;
	int r, fd;

	r = inflight_shape(c, d);
	if (r < 0)
		return r;
	qbytes = ioc__vub_inflight_queue_bytes(d->queue_size);
	total = qbytes * d->num_queues;   /* at most 64 x 513 KiB */
	/* The reply carries the region: without one the front end would
	 * wait for it, so a failure here ends the connection. */
	/* Sealed at its size: a front end holding it (and handing it back
	 * to the next back end) can neither shrink it under our mapping, a
	 * SIGBUS on the next access, nor grow it. */
	fd = memfd_create("iocore-vhost-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)total) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
	    (p = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
		    MAP_FAILED) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		ioc__vub_log(c->exp, "closing the connection: an inflight region of %llu bytes: %s",
			     (unsigned long long)total, ioc_strerror(r));
		return -EPROTO;
	}
	/* A new memfd reads as zeroes; only the headers need writing. */
	inflight_init(p, d->num_queues, d->queue_size, qbytes);
	munmap(p, (size_t)total);
	rep->send = true;
	rep->size = sizeof(rep->p.inflight);
	rep->p.inflight = (struct vub_inflight_desc){
		.mmap_size = total, .mmap_offset = 0,
		.num_queues = d->num_queues, .queue_size = d->queue_size,
	};
	rep->fd = fd;
	return 0;
}

static int ioc_coroutine_fn h_set_inflight_fd(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					      struct reply *rep)
{
	const struct vub_inflight_desc *d = &m->p.inflight;
	uint64_t qbytes, end;
	struct stat st;
	void *p;
	int r;

	r = inflight_shape(c, d);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < c->exp->num_queues; i++)
		if (c->exp->q[i].started)
			return proto(c, "SET_INFLIGHT_FD with a queue running");
	qbytes = ioc__vub_inflight_queue_bytes(d->queue_size);
	if (d->mmap_size < qbytes * d->num_queues)
		return proto(c, "inflight region smaller than its queues need");
	if (__builtin_add_overflow(d->mmap_offset, d->mmap_size, &end) || end > SIZE_MAX)
		return proto(c, "inflight region of bad size");
	if (fstat(m->fds[0], &st) < 0)
		return -errno;
	/* Past the file's end a mapping faults (SIGBUS) on access. */
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < end)
		return proto(c, "inflight region larger than its file");
	/* Ours (GET_INFLIGHT_FD) is sealed already; a foreign memfd that
	 * allows it is sealed against shrinking here.  Any other file is
	 * guarded, as guest memory is. */
	r = fcntl(m->fds[0], F_GET_SEALS);
	if (r >= 0 && !(r & F_SEAL_SHRINK))
		(void)fcntl(m->fds[0], F_ADD_SEALS, F_SEAL_SHRINK);
	p = mmap(NULL, (size_t)end, PROT_READ | PROT_WRITE, MAP_SHARED, m->fds[0], 0);
	if (p == MAP_FAILED) {
		r = -errno;
		ioc__vub_log(c->exp, "mapping the inflight region: %s", ioc_strerror(r));
		return r;
	}
	inflight_unmap(c);
	c->inflight_map = p;
	c->inflight_map_len = (size_t)end;
	c->inflight_guard = ioc__vub_guard_add(p, (size_t)end, &c->exp->mem_shrunk);
	c->inflight_base = (uint8_t *)p + d->mmap_offset;
	c->inflight_nq = d->num_queues;
	c->inflight_qsize = d->queue_size;
	c->inflight_qbytes = qbytes;
	inflight_init(c->inflight_base, c->inflight_nq, c->inflight_qsize, qbytes);
	return 0;
}

/* ---- config space ------------------------------------------------------------- */

static int ioc_coroutine_fn h_get_config(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					 struct reply *rep)
{
	const struct vub_config_desc *q = &m->p.cfg;
	uint8_t space[VUB_CONFIG_MAX] = { 0 };
	struct virtio_blk_config cfg;

	_Static_assert(sizeof(cfg) <= VUB_CONFIG_MAX, "config space fits the message");
	rep->send = true;
	if ((uint64_t)q->offset + q->size > VUB_CONFIG_MAX) {
		rep->size = 0;   /* the spec's error answer */
		return 0;
	}
	ioc__vub_blk_config(c->exp, &cfg);
	memcpy(space, &cfg, sizeof(cfg));
	rep->size = 12 + q->size;
	rep->p.cfg.offset = q->offset;
	rep->p.cfg.size = q->size;
	rep->p.cfg.flags = q->flags;
	memcpy(rep->p.cfg.data, space + q->offset, q->size);
	return 0;
}

static int ioc_coroutine_fn h_set_config(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					 struct reply *rep)
{
	const struct vub_config_desc *q = &m->p.cfg;

	/* The one writable field: the write cache enable byte. */
	if (q->offset != offsetof(struct virtio_blk_config, wce) || q->size != 1)
		return -EINVAL;
	/* Relaxed, read relaxed by each request (blk.c): a request racing
	 * the guest's switch may go either way, as on a real disk. */
	atomic_store_explicit(&c->exp->wce, q->data[0] != 0, memory_order_relaxed);
	return 0;
}

/* ---- the dirty log --------------------------------------------------------------- */

static void log_unmap(struct ioc__vub_log *l)
{
	if (!l)
		return;
	unmap_guarded(&l->guard, &l->map, l->map_len);
	free(l);
}

/* Point each queue at the log when logging is on (LOG_ALL acknowledged
 * and a log mapped), else at none; a running queue on its loop.  say:
 * log the change. */
static void ioc_coroutine_fn log_apply(struct ioc__vub_conn *c, bool say)
{
	const struct ioc__vub_log *l =
		(c->features & (1ull << VUB_F_LOG_ALL)) ? c->log : NULL;

	if (say)
		ioc__vub_log(c->exp, "dirty logging %s", !(c->features & (1ull << VUB_F_LOG_ALL)) ?
			     "off" : c->log ? "on" : "on, waiting for a log");
	for (unsigned i = 0; i < c->exp->num_queues; i++) {
		struct ioc__vub_queue *q = &c->exp->q[i];

		if (q->vr.log == l)
			continue;
		if (q->started) {
			ioc__vub_to_queue(q);
			q->vr.log = l;
			ioc__vub_to_ctrl(c->exp);
		} else {
			q->vr.log = l;
		}
	}
}

static int ioc_coroutine_fn h_set_log_base(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					   struct reply *rep)
{
	const struct vub_log_desc *d = &m->p.log;
	struct ioc__vub_log *l, *old;
	struct stat st;
	uint64_t end;
	void *p;

	if (!(c->protocol_features & (1ull << VUB_PROTO_F_LOG_SHMFD)))
		return proto(c, "SET_LOG_BASE without LOG_SHMFD");
	if (!d->size)
		return proto(c, "dirty log of zero bytes");
	if (d->offset > UINT64_MAX - d->size || d->offset + d->size > SIZE_MAX)
		return proto(c, "dirty log offset and size overflow");
	end = d->offset + d->size;
	if (fstat(m->fds[0], &st) < 0 || (uint64_t)st.st_size < end)
		return proto(c, "dirty log larger than its file");
	l = calloc(1, sizeof(*l));
	if (!l)
		return proto(c, "no memory for the dirty log");
	/* From offset 0: an offset need not be page-aligned. */
	p = mmap(NULL, (size_t)end, PROT_READ | PROT_WRITE, MAP_SHARED, m->fds[0], 0);
	if (p == MAP_FAILED) {
		ioc__vub_log(c->exp, "mapping a dirty log of %llu bytes: %s",
			     (unsigned long long)end, ioc_strerror(-errno));
		free(l);
		return proto(c, "dirty log not mapped");
	}
	l->map = p;
	l->map_len = (size_t)end;
	l->guard = ioc__vub_guard_add(p, (size_t)end, &c->exp->mem_shrunk);
	l->bits = (uint8_t *)p + d->offset;
	l->size = d->size;
	l->words = !((uintptr_t)l->bits & 7);
	old = c->log;
	c->log = l;
	log_apply(c, false);
	log_unmap(old);
	/* The reply QEMU waits for, with no payload. */
	rep->send = true;
	rep->size = 0;
	return 0;
}

static int ioc_coroutine_fn h_set_log_fd(struct ioc__vub_conn *c, struct ioc__vub_msg *m,
					 struct reply *rep)
{
	if (c->log_fd >= 0)
		close(c->log_fd);
	c->log_fd = m->fds[0];
	m->fds[0] = -1;
	return 0;
}

/* ---- dispatch ------------------------------------------------------------------- */

/* Each request has one handler: about the device (fn), or about the queue
 * the message names (vring). */
static const struct handler {
	handler_fn *fn;
	vring_fn *vring;
} handlers[VUB_REQUEST_MAX] = {
	[VUB_GET_FEATURES] = { .fn = h_get_features },
	[VUB_SET_FEATURES] = { .fn = h_set_features },
	[VUB_SET_OWNER] = { .fn = h_nop },
	[VUB_RESET_OWNER] = { .fn = h_reset_owner },
	[VUB_SET_MEM_TABLE] = { .fn = h_set_mem_table },
	[VUB_SET_LOG_BASE] = { .fn = h_set_log_base },
	[VUB_SET_LOG_FD] = { .fn = h_set_log_fd },
	[VUB_SET_VRING_NUM] = { .vring = h_set_vring_num },
	[VUB_SET_VRING_ADDR] = { .vring = h_set_vring_addr },
	[VUB_SET_VRING_BASE] = { .vring = h_set_vring_base },
	[VUB_GET_VRING_BASE] = { .vring = h_get_vring_base },
	[VUB_SET_VRING_KICK] = { .vring = h_set_vring_kick },
	[VUB_SET_VRING_CALL] = { .vring = h_set_vring_call },
	[VUB_SET_VRING_ERR] = { .vring = h_set_vring_err },
	[VUB_GET_PROTOCOL_FEATURES] = { .fn = h_get_protocol_features },
	[VUB_SET_PROTOCOL_FEATURES] = { .fn = h_set_protocol_features },
	[VUB_GET_QUEUE_NUM] = { .fn = h_get_queue_num },
	[VUB_SET_VRING_ENABLE] = { .vring = h_set_vring_enable },
	[VUB_SET_BACKEND_REQ_FD] = { .fn = h_set_backend_req_fd },
	[VUB_GET_CONFIG] = { .fn = h_get_config },
	[VUB_SET_CONFIG] = { .fn = h_set_config },
	[VUB_GET_INFLIGHT_FD] = { .fn = h_get_inflight_fd },
	[VUB_SET_INFLIGHT_FD] = { .fn = h_set_inflight_fd },
	[VUB_GET_MAX_MEM_SLOTS] = { .fn = h_get_max_mem_slots },
	[VUB_ADD_MEM_REG] = { .fn = h_add_mem_reg },
	[VUB_REM_MEM_REG] = { .fn = h_rem_mem_reg },
};

int ioc_coroutine_fn ioc__vub_dev_dispatch(struct ioc__vub_conn *c, struct ioc__vub_msg *m)
{
	const struct handler *h = m->request < VUB_REQUEST_MAX ? &handlers[m->request] : NULL;
	struct reply rep = { .send = false, .fd = -1 };
	struct ioc__vub_queue *q;
	char nb[32];
	int r, w = 0;

	if (!h || (!h->fn && !h->vring)) {
		ioc__vub_msg_close_fds(m);
		return proto(c, "unsupported request");
	}
	if (h->fn) {
		r = h->fn(c, m, &rep);
	} else {
		q = queue_of(c, vring_index(m));
		r = q ? h->vring(c, q, m, &rep) : proto(c, "vring index out of range");
	}
	ioc__vub_msg_close_fds(m);
	if (r == -EPROTO)
		return r;
	if (r < 0)
		ioc__vub_log(c->exp, "%s failed: %s",
			     ioc__vub_msg_name(m->request, nb, sizeof(nb)), ioc_strerror(r));
	if (!rep.send && (m->flags & VUB_FLAG_NEED_REPLY) &&
	    (c->protocol_features & (1ull << VUB_PROTO_F_REPLY_ACK)))
		reply_u64(&rep, r < 0 ? 1 : 0);
	if (rep.send)
		w = ioc__vub_msg_send_fd(c->fd, m->request, VUB_VERSION | VUB_FLAG_REPLY,
					 &rep.p, rep.size, rep.fd);
	if (rep.fd >= 0)
		close(rep.fd);
	if (w < 0) {
		ioc__vub_log(c->exp, "closing the connection: reply to %s: %s",
			     ioc__vub_msg_name(m->request, nb, sizeof(nb)), ioc_strerror(w));
		return w;
	}
	return 0;
}

void ioc_coroutine_fn ioc__vub_dev_reset(struct ioc__vub_conn *c)
{
	struct ioc__vub_export *e = c->exp;

	for (unsigned i = 0; i < e->num_queues; i++) {
		struct ioc__vub_queue *q = &e->q[i];

		queue_stop(c, q);
		if (q->kick_fd >= 0)
			close(q->kick_fd);
		if (q->vr.call_fd >= 0)
			close(q->vr.call_fd);
		if (q->err_fd >= 0)
			close(q->err_fd);
		q->kick_fd = q->err_fd = q->vr.call_fd = -1;
		q->kick_set = q->want_enable = false;
		q->vr.num = 0;
		q->vr.desc_uva = q->vr.avail_uva = q->vr.used_uva = 0;
		q->vr.last_avail = 0;
		q->vr.event_idx = q->vr.indirect = false;
		q->vr.mem = NULL;
		q->vr.desc = NULL;
		q->vr.avail = NULL;
		q->vr.inflight = NULL;
		q->vr.used = NULL;
		q->vr.broken = false;
		q->vr.log = NULL;
		q->vr.log_used = false;
	}
	log_unmap(c->log);
	c->log = NULL;
	if (c->log_fd >= 0)
		close(c->log_fd);
	c->log_fd = -1;
	mem_free(c->mem, true);
	c->mem = NULL;
	inflight_unmap(c);
	/* Relaxed: every mapping it spoke of is gone, and no queue runs. */
	atomic_store_explicit(&e->mem_shrunk, false, memory_order_relaxed);
	if (c->backend_fd >= 0)
		close(c->backend_fd);
	c->backend_fd = -1;
	c->features = c->protocol_features = 0;
}
