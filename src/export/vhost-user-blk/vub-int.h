/*
 * vhost-user-blk export: the private interfaces between its layers.
 *
 *   msg.c    the wire: one message in (header, payload, fds), one out
 *   vring.c  guest memory and the split ring walker (no I/O, no loop)
 *   inflight.c  the split ring's inflight region (what a restart resumes)
 *   blk.c    virtio-blk requests: one coroutine each, on the queue's loop
 *   dev.c    the device state machine, one handler per front-end message
 *   export.c the export object, its socket, the connection's life
 *
 * Threads: the connection (messages, device state) lives on the control
 * loop; queue i lives on loops[i % nloops].  Everything a queue's data
 * path touches is touched only on the queue's loop: the control side
 * changes it from a coroutine that moves there (ioc_co_move_to()), so no
 * field below needs a lock or an atomic, except the few marked.
 */
#ifndef IOC_VUB_INT_H
#define IOC_VUB_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include <linux/vhost_types.h>
#include <linux/virtio_blk.h>
#include <linux/virtio_ring.h>

#include "iocore/co.h"
#include "iocore/loop.h"

/* ---- the wire (msg.c) ------------------------------------------------- */

enum {
	VUB_GET_FEATURES = 1,
	VUB_SET_FEATURES = 2,
	VUB_SET_OWNER = 3,
	VUB_RESET_OWNER = 4,
	VUB_SET_MEM_TABLE = 5,
	VUB_SET_LOG_BASE = 6,
	VUB_SET_LOG_FD = 7,
	VUB_SET_VRING_NUM = 8,
	VUB_SET_VRING_ADDR = 9,
	VUB_SET_VRING_BASE = 10,
	VUB_GET_VRING_BASE = 11,
	VUB_SET_VRING_KICK = 12,
	VUB_SET_VRING_CALL = 13,
	VUB_SET_VRING_ERR = 14,
	VUB_GET_PROTOCOL_FEATURES = 15,
	VUB_SET_PROTOCOL_FEATURES = 16,
	VUB_GET_QUEUE_NUM = 17,
	VUB_SET_VRING_ENABLE = 18,
	VUB_SET_BACKEND_REQ_FD = 21,
	VUB_GET_CONFIG = 24,
	VUB_SET_CONFIG = 25,
	VUB_GET_INFLIGHT_FD = 31,
	VUB_SET_INFLIGHT_FD = 32,
	VUB_GET_MAX_MEM_SLOTS = 36,
	VUB_ADD_MEM_REG = 37,
	VUB_REM_MEM_REG = 38,
	VUB_REQUEST_MAX = 41,
};
/* Back-end to front-end, on the back-end channel. */
enum { VUB_BACKEND_CONFIG_CHANGE_MSG = 2 };

enum {
	VUB_F_LOG_ALL = 26,             /* in the device feature bits */
	VUB_F_PROTOCOL_FEATURES = 30,
};
enum {
	VUB_PROTO_F_MQ = 0,
	VUB_PROTO_F_LOG_SHMFD = 1,
	VUB_PROTO_F_REPLY_ACK = 3,
	VUB_PROTO_F_BACKEND_REQ = 5,
	VUB_PROTO_F_CONFIG = 9,
	VUB_PROTO_F_INFLIGHT_SHMFD = 12,
	VUB_PROTO_F_CONFIGURE_MEM_SLOTS = 15,
};

#define VUB_VERSION        0x1u
#define VUB_FLAG_VERSION   0x3u
#define VUB_FLAG_REPLY     0x4u
#define VUB_FLAG_NEED_REPLY 0x8u
#define VUB_VRING_IDX_MASK 0xffu
#define VUB_VRING_NOFD     0x100u

#define VUB_HDR_SIZE       12
#define VUB_MAX_FDS        8      /* per message */
#define VUB_TABLE_REGIONS  8      /* in one SET_MEM_TABLE */
#define VUB_MAX_REGIONS    32     /* GET_MAX_MEM_SLOTS */
#define VUB_CONFIG_MAX     256    /* GET/SET_CONFIG payload bytes */
#define VUB_MAX_PAYLOAD    (12 + VUB_CONFIG_MAX)

struct vub_region_desc {          /* as on the wire */
	uint64_t gpa, size, uva, mmap_offset;
};
struct vub_mem_table_desc {
	uint32_t nregions, padding;
	struct vub_region_desc r[VUB_TABLE_REGIONS];
};
struct vub_mem_one_desc {
	uint64_t padding;
	struct vub_region_desc r;
};
struct vub_log_desc {             /* SET_LOG_BASE, with the log's fd */
	uint64_t size, offset;
};
struct vub_config_desc {
	uint32_t offset, size, flags;
	uint8_t data[VUB_CONFIG_MAX];
};
/* GET/SET_INFLIGHT_FD: natural alignment makes it 24 bytes on the wire,
 * as QEMU sends it. */
struct vub_inflight_desc {
	uint64_t mmap_size, mmap_offset;
	uint16_t num_queues, queue_size;
};
_Static_assert(sizeof(struct vub_inflight_desc) == 24, "the wire size QEMU uses");

struct ioc__vub_msg {
	uint32_t request, flags, size;
	union {
		uint64_t u64;
		struct vhost_vring_state state;
		struct vhost_vring_addr addr;
		struct vub_mem_table_desc mem;
		struct vub_inflight_desc inflight;
		struct vub_mem_one_desc one;
		struct vub_config_desc cfg;
		struct vub_log_desc log;
		uint8_t raw[VUB_MAX_PAYLOAD];
	} p;
	int fds[VUB_MAX_FDS];          /* owned; -1 once taken */
	int nfds;
};

/* Name of a request for log lines ("SET_MEM_TABLE", "request 99"). */
const char *ioc__vub_msg_name(uint32_t request, char *buf, size_t len);
/*
 * Check a received message: version and flags, the payload size the
 * request needs, the fds it carries (missing or extra is an error).
 * Returns 0, or -EPROTO with *why naming the fault.  Pure: the fuzz
 * target's entry.
 */
int ioc__vub_msg_check(const struct ioc__vub_msg *m, const char **why);
/*
 * Read one message from a non-blocking socket: waits for readability
 * (in a coroutine: ioc_co_wait_fd(); outside: poll(2)).  0 with *m
 * filled (checked with ioc__vub_msg_check()), -ECONNRESET on an orderly
 * end before a header, -EPROTO (with *why) for a malformed, oversized or
 * truncated message, another -errno from the socket.  On failure no fd
 * is left open.
 */
int ioc_coroutine_fn ioc__vub_msg_recv(int fd, struct ioc__vub_msg *m,
				       const char **why);
/* Close the fds the handler did not take. */
void ioc__vub_msg_close_fds(struct ioc__vub_msg *m);
/* Send a message (request, flags, payload); waits for writability like
 * recv.  0 or -errno. */
int ioc_coroutine_fn ioc__vub_msg_send(int fd, uint32_t request, uint32_t flags,
				       const void *payload, uint32_t size);
/* The same with one fd in SCM_RIGHTS (GET_INFLIGHT_FD's reply); fd < 0:
 * none.  The fd stays the caller's. */
int ioc_coroutine_fn ioc__vub_msg_send_fd(int fd, uint32_t request, uint32_t flags,
					  const void *payload, uint32_t size, int pass_fd);

/* ---- guest memory and the split ring (vring.c) ------------------------ */

struct ioc__vub_region {
	uint64_t gpa, size, uva;
	uint8_t *host;                 /* gpa maps here */
	void *map;                     /* what munmap() gets (NULL: not ours) */
	size_t map_len;
	int guard;                     /* guard.c's slot + 1; 0: none */
};
struct ioc__vub_mem {
	unsigned n;
	struct ioc__vub_region r[VUB_MAX_REGIONS];
};

/* Host address of [gpa, gpa + len) when it lies in one region, else
 * NULL.  *contig (may be NULL): bytes from gpa to the region's end. */
void *ioc__vub_gpa(const struct ioc__vub_mem *mem, uint64_t gpa, uint64_t len,
		   uint64_t *contig);
/* The same for a front-end user address (ring addresses). */
void *ioc__vub_uva(const struct ioc__vub_mem *mem, uint64_t uva, uint64_t len);

/*
 * The dirty log (VHOST_F_LOG_ALL, for live migration): a bitmap shared
 * with the front end, one bit per 4 KiB guest-physical page (bit p % 8 of
 * byte p / 8, which on a little-endian host is bit p % 64 of 64-bit word
 * p / 64, the front end's unit).  Set with atomic ORs after the write
 * they describe; the front end clears words with atomic exchanges.
 */
#define VUB_LOG_PAGE       4096u
struct ioc__vub_log {
	uint8_t *bits;                 /* the mapping plus the front end's offset */
	uint64_t size;                 /* bytes of bitmap */
	bool words;                    /* bits is 8-byte aligned: OR whole words */
	void *map;                     /* what munmap() gets */
	size_t map_len;
	int guard;                     /* guard.c's slot + 1; 0: none */
};
/* Mark the pages of [gpa, gpa + len) dirty; pages past the log are not
 * guest memory the front end knows and are skipped.  Each OR is a
 * release: the caller's writes to those pages come before it. */
void ioc__vub_log_gpa(const struct ioc__vub_log *log, uint64_t gpa, uint64_t len);
/* The same for the first len bytes of iovecs into guest memory (host
 * addresses, translated back through mem's regions). */
void ioc__vub_log_iov(const struct ioc__vub_log *log, const struct ioc__vub_mem *mem,
		      const struct iovec *iov, unsigned n, size_t len);

/* Descriptors per request this walker hands out (SEG_MAX + header +
 * status + room for buffers split across regions). */
#define VUB_SEG_MAX        126
#define VUB_REQ_IOV        (VUB_SEG_MAX + 6)
#define VUB_INDIRECT_MAX   1024   /* entries of an indirect table */

struct ioc__vub_elem {
	uint16_t head;                 /* for the used ring */
	unsigned n_out, n_in;          /* readable iovecs, then writable */
	struct iovec iov[VUB_REQ_IOV];
};

/*
 * The inflight region of one split ring (vhost-user.rst, "Inflight I/O
 * tracking"), shared with the front end, which keeps it across a back
 * end's death.  desc[] is indexed by head; fields the spec leaves unused
 * for a split ring are zero.  Every access is an __atomic one: the front
 * end maps it too.
 */
struct vub_inflight_state {
	uint8_t inflight;              /* 1: popped, used entry not published */
	uint8_t padding[5];
	uint16_t next;                 /* the last batch's list */
	uint64_t counter;              /* pop order */
};
struct vub_inflight_queue {
	uint64_t features;             /* 0 */
	uint16_t version;              /* VUB_INFLIGHT_VERSION; 0: not set up */
	uint16_t desc_num;             /* entries of desc[] */
	uint16_t last_batch_head;
	uint16_t used_idx;             /* used->idx once the batch is cleared */
	struct vub_inflight_state desc[];
};
_Static_assert(sizeof(struct vub_inflight_state) == 16, "the spec's DescStateSplit");
_Static_assert(sizeof(struct vub_inflight_queue) == 16, "the spec's QueueRegionSplit");
#define VUB_INFLIGHT_VERSION 1
#define VUB_INFLIGHT_ALIGN   64
/* Bytes of one queue's region for queue_size entries (a multiple of
 * VUB_INFLIGHT_ALIGN, so each queue's region starts aligned). */
uint64_t ioc__vub_inflight_queue_bytes(unsigned queue_size);

struct ioc__vub_vring {
	/* Set by the front end's messages. */
	unsigned num;                  /* entries, a power of two */
	uint64_t desc_uva, avail_uva, used_uva;
	uint16_t last_avail;           /* next avail entry to take */
	bool event_idx;                /* VIRTIO_RING_F_EVENT_IDX acked */
	bool indirect;                 /* VIRTIO_RING_F_INDIRECT_DESC acked */
	int call_fd;                   /* -1: the front end polls */
	bool log_used;                 /* VHOST_VRING_F_LOG: log used ring writes */
	uint64_t log_used_gpa;         /* ... at this guest-physical address */
	const struct ioc__vub_log *log;  /* NULL: not logging (no LOG_ALL) */

	/* Translated at start (ioc__vub_vring_map()). */
	const struct ioc__vub_mem *mem;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;

	uint16_t used_idx;             /* next used entry to fill */
	uint16_t published;            /* used->idx as last written */
	bool signalled_valid;          /* a flush since the start asked used_event */
	bool broken;                   /* a fault stopped the ring */
	const char *why;               /* the fault */

	/* Inflight tracking (NULL: off), set before the ring starts. */
	struct vub_inflight_queue *inflight;
	uint64_t counter;              /* the next pop's counter */
};

/* Check num and the ring addresses against mem and point desc, avail,
 * used into it.  0 or -EINVAL with vr->why. */
int ioc__vub_vring_map(struct ioc__vub_vring *vr, const struct ioc__vub_mem *mem);
/* Requests the driver made available and we did not take. */
bool ioc__vub_vring_avail(struct ioc__vub_vring *vr);
/*
 * Take the next request: 1 with *e filled (iovecs into guest memory,
 * readable ones first), 0 when there is none, -EPROTO when the ring or
 * the chain is faulty: then vr->broken and vr->why are set and the ring
 * gives nothing more.
 */
int ioc__vub_vring_pop(struct ioc__vub_vring *vr, struct ioc__vub_elem *e);
/* Log the writes of a request into guest memory (the first len bytes of
 * iov) when the ring is logging. */
void ioc__vub_vring_log_write(const struct ioc__vub_vring *vr, const struct iovec *iov,
			      unsigned n, size_t len);
/* Put a completion in the used ring (not yet visible: see flush). */
void ioc__vub_vring_push(struct ioc__vub_vring *vr, uint16_t head, uint32_t len);
/* Publish the pushed completions (used->idx) and, when the driver wants
 * it (EVENT_IDX used_event, or NO_INTERRUPT), signal call_fd once.
 * Returns true when it signalled. */
bool ioc__vub_vring_flush(struct ioc__vub_vring *vr);
/* Ask for a kick at the next request (EVENT_IDX avail_event) and return
 * whether one arrived meanwhile (then process before sleeping). */
bool ioc__vub_vring_arm(struct ioc__vub_vring *vr);

/*
 * Inflight tracking.  With vr->inflight set, pop marks the head in the
 * region, push links it into the batch, flush clears the batch; see
 * inflight.c for the order of the stores.  At start, after map:
 *
 * ioc__vub_vring_inflight_start() checks the region against the ring
 * (version, desc_num >= num; a region of version 0 is set up), resolves
 * a batch that was published but not cleared, and fills resubmit[]
 * (room for vr->num) with the heads still in flight, in the order they
 * were popped.  It sets last_avail to used->idx plus their count (every
 * entry taken is either in the used ring or in flight) and counter past
 * theirs.  Returns their count, or -EINVAL with vr->why.
 */
struct ioc__vub_resubmit {
	uint64_t counter;
	uint16_t head;
};
int ioc__vub_vring_inflight_start(struct ioc__vub_vring *vr,
				  struct ioc__vub_resubmit *resubmit);
/* Walk the chain at head (a request in flight before a restart) like
 * pop does, without taking an avail entry or marking it again.  1, or
 * -EPROTO (the ring is broken). */
int ioc__vub_vring_pop_head(struct ioc__vub_vring *vr, uint16_t head,
			    struct ioc__vub_elem *e);
/* inflight.c's hooks in pop, push and flush (vr->inflight set). */
void ioc__vub_inflight_pop(struct ioc__vub_vring *vr, uint16_t head);
void ioc__vub_inflight_push(struct ioc__vub_vring *vr, uint16_t head);
void ioc__vub_inflight_published(struct ioc__vub_vring *vr, uint16_t n);

/*
 * A store a restart depends on: used->idx and the inflight region.
 * Built with IOC_VUB_CRASH_POINTS (tests only), every such store after
 * the ioc__vub_crash_budget-th is dropped, as if the process died there,
 * and ioc__vub_crash_stores counts them.  (The used entries' stores are
 * not among them: past used->idx no one reads them.)
 */
#ifdef IOC_VUB_CRASH_POINTS
extern long ioc__vub_crash_budget;        /* -1: no crash */
extern unsigned long ioc__vub_crash_stores;
#define IOC_VUB_STORE(p, v, mo)                                                \
	do {                                                                   \
		ioc__vub_crash_stores++;                                       \
		if (ioc__vub_crash_budget != 0) {                              \
			if (ioc__vub_crash_budget > 0)                         \
				ioc__vub_crash_budget--;                       \
			__atomic_store_n(p, v, mo);                            \
		}                                                              \
	} while (0)
#else
#define IOC_VUB_STORE(p, v, mo) __atomic_store_n(p, v, mo)
#endif


#endif /* IOC_VUB_INT_H */
