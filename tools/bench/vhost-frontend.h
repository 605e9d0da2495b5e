/*
 * A vhost-user-blk front-end without a guest: the connection, the
 * handshake, a memfd standing in for guest memory, split virtqueues in it,
 * and virtio-blk requests on them.  Used by iocore-bench vhost-blk and by
 * tests that drive a back-end directly.  Not part of libiocore.
 *
 * Threads: one struct ioc_vhf_dev is set up and torn down by one thread; after
 * ioc_vhf_start() each struct ioc_vhf_vq may be driven by a thread of its own (a
 * queue touches only its own ring, eventfds and slots).  Errors are
 * -errno; the functions that talk to the back-end also print what failed
 * to stderr, prefixed with the socket path.  Names are ioc_vhf_* (vhost
 * front-end), as the tools' other helpers are ioc_tool_*.
 */
#ifndef IOC_TOOLS_VHOST_FRONTEND_H
#define IOC_TOOLS_VHOST_FRONTEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <linux/virtio_blk.h>
#include <linux/virtio_ring.h>

/* vhost-user's own feature bit and protocol features (vhost-user.rst). */
#define IOC_VHF_F_PROTOCOL_FEATURES 30
#define IOC_VHF_PF_MQ              0
#define IOC_VHF_PF_REPLY_ACK       3
#define IOC_VHF_PF_CONFIG          9
#define IOC_VHF_PF_INFLIGHT_SHMFD  12

#define IOC_VHF_MAX_QUEUES 64

/* Where "guest memory" starts in guest-physical addresses: not 0, so that
 * a descriptor with address 0 is outside the memory table. */
#define IOC_VHF_GUEST_BASE 0x40000000ull

/* The part of struct virtio_blk_config read with GET_CONFIG: up to the
 * write-zeroes fields (later fields are newer than most back-ends). */
#define IOC_VHF_BLK_CONFIG_SIZE 60

struct ioc_vhf_opts {
	const char *socket;      /* Unix socket path */
	unsigned queues;         /* rings to start; 0 means 1 */
	unsigned queue_size;     /* descriptors per ring, power of two <= 32768;
	                          * 0 means 256 */
	uint64_t features_off;   /* virtio feature bits not to accept */
	bool no_inflight;        /* do not accept INFLIGHT_SHMFD */
	bool no_reply_ack;       /* do not accept REPLY_ACK */
	int timeout_ms;          /* for each reply; 0 means 10000 */
	bool verbose;            /* log every message to stderr */
};

struct ioc_vhf_vq {
	unsigned index, num;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	uint16_t *used_event;    /* avail->ring[num] (EVENT_IDX) */
	uint16_t *avail_event;   /* used->ring[num] (EVENT_IDX) */
	uint16_t avail_idx;      /* our copy of avail->idx */
	uint16_t kick_idx;       /* avail_idx when we last decided on a kick */
	uint16_t last_used;      /* used entries consumed */
	bool event_idx;
	int kick_fd, call_fd;
	int sock_fd;             /* the connection, watched for hang-up */
	const uint8_t *mem;      /* guest memory, at IOC_VHF_GUEST_BASE */
	uint64_t kicks, calls;   /* eventfd writes, wake-ups by a call */
};

struct ioc_vhf_dev {
	const char *socket;
	int sock;
	int timeout_ms;
	bool verbose;
	uint64_t features;       /* offered by the back-end */
	uint64_t acked;          /* accepted (sent with SET_FEATURES) */
	uint64_t pfeatures;      /* protocol features offered */
	uint64_t packed;         /* protocol features accepted */
	unsigned max_queues;     /* GET_QUEUE_NUM, or 1 without MQ */
	bool have_config;
	struct virtio_blk_config cfg; /* little-endian, as received */
	/* Guest memory: one memfd region. */
	int mem_fd;
	uint8_t *mem;
	uint64_t mem_size, mem_used;
	int inflight_fd;
	void *inflight;
	uint64_t inflight_size;
	unsigned nvqs;
	unsigned queue_size;     /* may be changed between connect and start */
	bool no_inflight;
	struct ioc_vhf_vq vq[IOC_VHF_MAX_QUEUES];
};

static inline bool ioc_vhf_has(const struct ioc_vhf_dev *d, unsigned bit)
{
	return d->acked & (1ull << bit);
}

/* Connect and negotiate: SET_OWNER, GET_FEATURES, the protocol features,
 * GET_QUEUE_NUM, GET_CONFIG, SET_FEATURES.  On failure the device is
 * closed. */
int ioc_vhf_connect(struct ioc_vhf_dev *d, const struct ioc_vhf_opts *o);

/* Create guest memory for the rings plus data_bytes for the caller, send
 * it with SET_MEM_TABLE, the inflight area if negotiated, and start and
 * enable every ring. */
int ioc_vhf_start(struct ioc_vhf_dev *d, uint64_t data_bytes);

/* Guest memory for the caller, zeroed, aligned to align (a power of two):
 * NULL when the area given to ioc_vhf_start() is used up. */
void *ioc_vhf_alloc(struct ioc_vhf_dev *d, uint64_t size, uint64_t align);
uint64_t ioc_vhf_gpa(const struct ioc_vhf_dev *d, const void *p);

/* Stop every ring (GET_VRING_BASE) and report each ring's base in
 * bases[] (may be NULL).  Returns 0 or the first error. */
int ioc_vhf_stop(struct ioc_vhf_dev *d, uint16_t *bases);
/* Close the connection and free the memory; safe on a failed device. */
void ioc_vhf_close(struct ioc_vhf_dev *d);

/* One request: a message with an optional payload and fds; with reply
 * non-NULL the reply's payload is read into it (at most *reply_size
 * bytes, the size received is stored back) and a received fd into
 * *reply_fd.  Messages that have no reply of their own wait for the
 * REPLY_ACK when it was negotiated; a non-zero ack is -EPROTO. */
int ioc_vhf_request(struct ioc_vhf_dev *d, uint32_t req, const void *payload,
		uint32_t size, const int *fds, unsigned nfds, void *reply,
		uint32_t *reply_size, int *reply_fd);

/* The virtqueue, from the driver's side.  Publish makes one chain
 * (head) available; kick notifies the back-end if it asked for it and
 * returns 1 when it did.  pop_used returns 1 with the next used element,
 * 0 when there is none.  wait returns 0 once a used element is there,
 * -ETIMEDOUT after timeout_ms, -EPIPE if the back-end hung up; with poll
 * it spins on the used ring instead of sleeping on the call eventfd. */
void ioc_vhf_vq_publish(struct ioc_vhf_vq *vq, uint16_t head);
int ioc_vhf_vq_kick(struct ioc_vhf_vq *vq);
int ioc_vhf_vq_pop_used(struct ioc_vhf_vq *vq, uint32_t *id, uint32_t *len);
int ioc_vhf_vq_wait(struct ioc_vhf_vq *vq, bool poll, int timeout_ms);
/* For poll mode: ask the back-end not to signal the call eventfd. */
void ioc_vhf_vq_no_interrupts(struct ioc_vhf_vq *vq);

/* virtio-blk requests.  A slot is one request's guest memory: header,
 * a 16-byte discard/write-zeroes segment, the GET_ID buffer, the status
 * byte, data_cap bytes of data, an indirect table; its head descriptor
 * is fixed.  It owns ndesc descriptors: header, status and the data in
 * segments of at most the device's size_max (one segment when it sets
 * none), or with an indirect table just the head. */
struct ioc_vhf_blk_slot {
	struct virtio_blk_outhdr *hdr;
	struct virtio_blk_discard_write_zeroes *seg;
	char *id;                /* VIRTIO_BLK_ID_BYTES */
	uint8_t *status;
	uint8_t *data;
	struct vring_desc *itab; /* ndesc entries */
	uint64_t data_cap, seg_size;
	uint16_t head, ndesc;
	bool indirect;
	uint32_t type;           /* of the request in flight */
	int64_t t_submit;        /* for the caller */
};

/* The guest-physical address of p, which points into vq's device's
 * guest memory. */
static inline uint64_t ioc_vhf_vq_gpa(const struct ioc_vhf_vq *vq, const void *p)
{
	return IOC_VHF_GUEST_BASE + (uint64_t)((const uint8_t *)p - vq->mem);
}

/* Carve n slots for vq out of guest memory: -ENOSPC when the ring has too
 * few descriptors or memory is short, -EINVAL when data_cap needs more
 * segments than the device's seg_max. */
int ioc_vhf_blk_slots(struct ioc_vhf_dev *d, struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *slots,
		  unsigned n, uint64_t data_cap, bool indirect);
/* Guest memory each slot needs (for ioc_vhf_start()'s data_bytes; d is
 * connected, so its size_max is known). */
uint64_t ioc_vhf_blk_slot_bytes(const struct ioc_vhf_dev *d, uint64_t data_cap);
/* Ring descriptors one slot takes. */
unsigned ioc_vhf_blk_slot_descs(const struct ioc_vhf_dev *d, uint64_t data_cap, bool indirect);
/* The index of the slot whose head is id, or -1 when none is. */
int ioc_vhf_blk_slot_of(const struct ioc_vhf_blk_slot *slots, unsigned n, uint32_t id);

/* Build a request in s and publish it (not kicked): type, sector (512
 * bytes), len bytes of data (IN/OUT), or for DISCARD/WRITE_ZEROES the
 * segment (num_sectors, seg_flags); GET_ID reads into s->id.  The status
 * byte is set to 0xff first so that an untouched one shows. */
void ioc_vhf_blk_submit(struct ioc_vhf_vq *vq, struct ioc_vhf_blk_slot *s, uint32_t type,
		    uint64_t sector, uint64_t len, uint32_t num_sectors,
		    uint32_t seg_flags);

/* The device's capacity in bytes, logical block size, and the config
 * fields in host order (0 when not offered). */
uint64_t ioc_vhf_blk_capacity(const struct ioc_vhf_dev *d);
uint32_t ioc_vhf_blk_size(const struct ioc_vhf_dev *d);
uint32_t ioc_vhf_blk_cfg32(const struct ioc_vhf_dev *d, const void *field);
uint16_t ioc_vhf_blk_cfg16(const struct ioc_vhf_dev *d, const void *field);

/* The name of a request (for messages), of a virtio-blk status. */
const char *ioc_vhf_request_name(uint32_t req);
const char *ioc_vhf_blk_status_name(int status);

#endif
