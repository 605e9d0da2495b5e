/*
 * NBD wire protocol (NetworkBlockDevice/nbd doc/proto.md) and the
 * transport-independent protocol core of iocore-nbd.
 *
 * The core never touches a socket.  A transport (the coroutine server in
 * conn.c, the tests' blocking driver in tests/nbd/support/serve-sync.c)
 * appends received bytes to conn->in, calls ioc__nbd_hs_step() during the
 * handshake and ioc__nbd_parse_request() during transmission, runs
 * ioc__nbd_execute() for each request, and sends what the core queued.
 * Private to src/nbd (tests include it to speak the protocol).
 */
#ifndef IOC_NBD_PROTO_H
#define IOC_NBD_PROTO_H

#include <endian.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "iocore/common.h"

/* ---- magics ---------------------------------------------------------- */
#define NBD_MAGIC_INIT            UINT64_C(0x4e42444d41474943) /* NBDMAGIC */
#define NBD_MAGIC_OPTS            UINT64_C(0x49484156454F5054) /* IHAVEOPT */
#define NBD_MAGIC_OPT_REPLY       UINT64_C(0x0003e889045565a9)
#define NBD_MAGIC_REQUEST         UINT32_C(0x25609513)
#define NBD_MAGIC_EXT_REQUEST     UINT32_C(0x21e41c71)
#define NBD_MAGIC_SIMPLE_REPLY    UINT32_C(0x67446698)
#define NBD_MAGIC_STRUCT_REPLY    UINT32_C(0x668e33ef)
#define NBD_MAGIC_EXT_REPLY       UINT32_C(0x6e8a278c)

/* ---- handshake flags ------------------------------------------------- */
#define NBD_FLAG_FIXED_NEWSTYLE   (1u << 0)
#define NBD_FLAG_NO_ZEROES        (1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_C_NO_ZEROES      (1u << 1)

/* ---- transmission flags ---------------------------------------------- */
#define NBD_FLAG_HAS_FLAGS        (1u << 0)
#define NBD_FLAG_READ_ONLY        (1u << 1)
#define NBD_FLAG_SEND_FLUSH       (1u << 2)
#define NBD_FLAG_SEND_FUA         (1u << 3)
#define NBD_FLAG_ROTATIONAL       (1u << 4)
#define NBD_FLAG_SEND_TRIM        (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF          (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN   (1u << 8)
#define NBD_FLAG_SEND_RESIZE      (1u << 9)
#define NBD_FLAG_SEND_CACHE       (1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO   (1u << 11)

/* ---- options ---------------------------------------------------------- */
#define NBD_OPT_EXPORT_NAME       1
#define NBD_OPT_ABORT             2
#define NBD_OPT_LIST              3
#define NBD_OPT_STARTTLS          5
#define NBD_OPT_INFO              6
#define NBD_OPT_GO                7
#define NBD_OPT_STRUCTURED_REPLY  8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT  10
#define NBD_OPT_EXTENDED_HEADERS  11

#define NBD_REP_ACK               1u
#define NBD_REP_SERVER            2u
#define NBD_REP_INFO              3u
#define NBD_REP_META_CONTEXT      4u
#define NBD_REP_ERR_BIT           (1u << 31)
#define NBD_REP_ERR_UNSUP         (NBD_REP_ERR_BIT + 1)
#define NBD_REP_ERR_POLICY        (NBD_REP_ERR_BIT + 2)
#define NBD_REP_ERR_INVALID       (NBD_REP_ERR_BIT + 3)
#define NBD_REP_ERR_PLATFORM      (NBD_REP_ERR_BIT + 4)
#define NBD_REP_ERR_TLS_REQD      (NBD_REP_ERR_BIT + 5)
#define NBD_REP_ERR_UNKNOWN       (NBD_REP_ERR_BIT + 6)
#define NBD_REP_ERR_SHUTDOWN      (NBD_REP_ERR_BIT + 7)
#define NBD_REP_ERR_BLOCK_SIZE_REQD (NBD_REP_ERR_BIT + 8)
#define NBD_REP_ERR_TOO_BIG       (NBD_REP_ERR_BIT + 9)
#define NBD_REP_ERR_EXT_HEADER_REQD (NBD_REP_ERR_BIT + 10)

#define NBD_INFO_EXPORT           0
#define NBD_INFO_NAME             1
#define NBD_INFO_DESCRIPTION      2
#define NBD_INFO_BLOCK_SIZE       3

/* ---- commands ---------------------------------------------------------- */
#define NBD_CMD_READ              0
#define NBD_CMD_WRITE             1
#define NBD_CMD_DISC              2
#define NBD_CMD_FLUSH             3
#define NBD_CMD_TRIM              4
#define NBD_CMD_CACHE             5
#define NBD_CMD_WRITE_ZEROES      6
#define NBD_CMD_BLOCK_STATUS      7

#define NBD_CMD_FLAG_FUA          (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE      (1u << 1)
#define NBD_CMD_FLAG_DF           (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE      (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO    (1u << 4)
#define NBD_CMD_FLAG_PAYLOAD_LEN  (1u << 5)

#define NBD_REPLY_FLAG_DONE       (1u << 0)
#define NBD_REPLY_TYPE_NONE       0
#define NBD_REPLY_TYPE_OFFSET_DATA 1
#define NBD_REPLY_TYPE_OFFSET_HOLE 2
#define NBD_REPLY_TYPE_BLOCK_STATUS 5
#define NBD_REPLY_TYPE_BLOCK_STATUS_EXT 6
#define NBD_REPLY_TYPE_ERROR      ((1u << 15) + 1)
#define NBD_REPLY_TYPE_ERROR_OFFSET ((1u << 15) + 2)

#define NBD_STATE_HOLE            (1u << 0)
#define NBD_STATE_ZERO            (1u << 1)

/* Error values on the wire (proto.md "Error values"). */
#define NBD_EPERM                 1
#define NBD_EIO                   5
#define NBD_ENOMEM                12
#define NBD_EINVAL                22
#define NBD_ENOSPC                28
#define NBD_EOVERFLOW             75
#define NBD_ENOTSUP               95
#define NBD_ESHUTDOWN             108

#define NBD_META_BASE_ALLOCATION  "base:allocation"
#define NBD_META_ID_BASE_ALLOC    1u
/* QEMU's contexts (QEMU's docs/interop/nbd.rst). */
#define NBD_META_QEMU_DEPTH       "qemu:allocation-depth"
#define NBD_META_QEMU_BITMAP      "qemu:dirty-bitmap:"
#define NBD_META_ID_QEMU_DEPTH    2u
#define NBD_META_ID_QEMU_BITMAP   3u          /* and up, one per bitmap */
#define IOC_NBD_META_BITMAPS      8u          /* bitmaps one connection selects */
#define NBD_STATE_DIRTY           (1u << 0)   /* qemu:dirty-bitmap:NAME */
#define IOC_NBD_BITMAP_NAME_MAX   1024        /* = IOC_BLK_DIRTY_NAME_MAX: QEMU's
						 * 1023 bytes and a NUL; with the
						 * prefix, well inside a 4096-byte
						 * context name */

/* Sizes of the fixed headers. */
#define NBD_REQUEST_SIZE          28
#define NBD_EXT_REQUEST_SIZE      32
#define NBD_SIMPLE_REPLY_SIZE     16
#define NBD_STRUCT_REPLY_SIZE     20
#define NBD_EXT_REPLY_SIZE        32

/* ---- limits: what keeps a hostile client bounded --------------------- */
#define IOC_NBD_MAX_STRING        4096            /* proto.md: names, messages */
#define IOC_NBD_MAX_OPT_LEN       (64u << 10)     /* larger: skipped, ERR_TOO_BIG */
#define IOC_NBD_MAX_OPT_SKIP      (1u << 20)      /* larger than this: disconnect */
#define IOC_NBD_MAX_OPTIONS       4096            /* options per handshake */
#define IOC_NBD_MAX_PAYLOAD       (32u << 20)     /* NBD_INFO_BLOCK_SIZE maximum */
#define IOC_NBD_MAX_EXTENTS       (1u << 17)      /* block status descriptors per chunk */
#define IOC_NBD_SPARSE_READ_MIN   (64u << 10)     /* reads this large look for holes */
#define IOC_NBD_TLS_SPARSE_READ_MIN 4096u         /* the same over TLS (transmission.c) */
#define IOC_NBD_ZC_WRITE_MIN      (64u << 10)     /* writes this large are spliced (conn.c) */
#define IOC_NBD_MAP_ALONE_MIN     (64u << 10)     /* lent alone on a thread (transmission.c) */
#define IOC_NBD_MAX_READ_CHUNKS   16

/* ---- big-endian access to unaligned bytes ------------------------------ */
static inline uint16_t ioc_nbd_ld16(const void *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return be16toh(v);
}
static inline uint32_t ioc_nbd_ld32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return be32toh(v);
}
static inline uint64_t ioc_nbd_ld64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return be64toh(v);
}
static inline uint8_t *ioc_nbd_st16(uint8_t *p, uint16_t v)
{
	v = htobe16(v);
	memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}
static inline uint8_t *ioc_nbd_st32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}
static inline uint8_t *ioc_nbd_st64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}

/* ---- exports and their backends --------------------------------------- */

/* Backend flags (mirroring the block layer's). */
enum {
	IOC_NBD_BE_FUA       = 1u << 0,
	IOC_NBD_BE_MAY_TRIM  = 1u << 1, /* write_zeroes: punching a hole is fine */
	IOC_NBD_BE_FAST_ONLY = 1u << 2, /* write_zeroes: -ENOTSUP unless fast */
};

/*
 * What an export is served from.  Called from the request's context: in
 * the coroutine server these are ioc_coroutine_fn and may yield; the
 * blocking driver calls them on its own thread.  All return 0 or -errno.
 * block_status returns NBD_STATE_* bits of the extent at offset and its
 * length (> 0, <= len) in *pnum.  Every operation takes IOC_NBD_BE_* flags
 * so one can grow without a new signature; pread, flush, block_status and
 * cache have none defined yet and are called with 0.
 */
struct ioc__nbd_backend_ops {
	int (*pread)(void *be, uint64_t offset, void *buf, size_t len, uint32_t flags);
	int (*pwrite)(void *be, uint64_t offset, const void *buf, size_t len,
		      uint32_t flags);
	int (*flush)(void *be, uint32_t flags);
	int (*trim)(void *be, uint64_t offset, uint64_t len, uint32_t flags);
	int (*zero)(void *be, uint64_t offset, uint64_t len, uint32_t flags);
	int (*block_status)(void *be, uint64_t offset, uint64_t len, uint64_t *pnum,
			    uint32_t flags);
	int (*cache)(void *be, uint64_t offset, uint64_t len, uint32_t flags);
	/* Dirty bitmaps (NULL: none).  dirty_names stores up to max usable
	 * names (pointers valid while the export exists; names may be NULL
	 * with max 0) and returns how many there are, or -errno;
	 * dirty_status returns 1
	 * (dirty) or 0 for the run at offset, its length (<= len) in *pnum,
	 * or -errno (-ENOENT: no such bitmap, -EUCLEAN: inconsistent).
	 * dirty_status has no flags defined yet and is called with 0. */
	int (*dirty_names)(void *be, const char **names, int max);
	int (*dirty_status)(void *be, const char *name, uint64_t offset, uint64_t len,
			    uint64_t *pnum, uint32_t flags);
	/* qemu:allocation-depth of the run at offset (0 unallocated, 1 this
	 * layer, 2 its backing layer...), its length (<= len) in *pnum, or
	 * -errno; flags 0.  NULL: the context is offered with depth 1
	 * everywhere when dirty_status is set, else not at all. */
	int (*depth_status)(void *be, uint64_t offset, uint64_t len, uint64_t *pnum,
			    uint32_t flags);
	/* Zero-copy reads (NULL: none): put up to len bytes at offset into
	 * the pipe pipe_fd without waiting for I/O; returns the bytes put
	 * there (short at the end of the data or when the pipe is full),
	 * or -errno (-EAGAIN: not now, -ENOTSUP: not on this export).  The
	 * caller then reads the ordinary way.  Flags 0. */
	ssize_t (*splice_read)(void *be, uint64_t offset, size_t len, int pipe_fd,
			       uint32_t flags);
	/* Zero-copy writes (NULL: none): write len bytes taken from the pipe
	 * pipe_fd at offset; 0, -ENOTSUP with the pipe untouched (write the
	 * ordinary way), or -errno.  IOC_NBD_BE_FUA allowed.  len 0 asks
	 * whether it would be done: 0 or -ENOTSUP, from anywhere; else from
	 * the request's coroutine, which may yield. */
	int (*splice_write)(void *be, uint64_t offset, size_t len, int pipe_fd,
			    uint32_t flags);
	/* Reads without a copy to a buffer (NULL: none): a pointer to the
	 * len bytes at offset, valid while the export lives and meant only
	 * for the kernel to copy (ioc_blk_map_read()), or NULL: read the
	 * ordinary way. */
	const void *(*map_read)(void *be, uint64_t offset, size_t len);
	/* The kernel failed to copy from what map_read lent (EFAULT: the
	 * image was cut short underneath): stop lending, and read len bytes
	 * at offset into buf the ordinary way, zeroes past the end of the
	 * file.  0 or -errno.  Not a coroutine: it never waits. */
	int (*map_fault)(void *be, uint64_t offset, void *buf, size_t len);
	/* Writes without a write(2) (NULL: none): where the transport's
	 * kernel may copy a WRITE's len bytes at offset (ioc_blk_map_write()),
	 * or NULL: write the ordinary way.  Flags as for pwrite.  Once bytes
	 * are in (or the transport gives up part way), map_written() with
	 * the range stored: 0 or -errno.  Neither waits. */
	void *(*map_write)(void *be, uint64_t offset, size_t len, uint32_t flags);
	int (*map_written)(void *be, uint64_t offset, size_t len);
	/* Between the two: put len bytes of buf at offset, inside the range
	 * map_write gave (a kernel copy, never waiting).  0 or -errno. */
	int (*map_store)(void *be, uint64_t offset, const void *buf, size_t len);
};

struct ioc__nbd_export {
	char *name;
	char *description;              /* may be NULL */
	uint64_t size;
	bool read_only, can_trim, can_zero, can_fast_zero, can_fua, can_cache;
	bool can_block_status, multi_conn;
	uint32_t min_block, pref_block, max_block;
	const struct ioc__nbd_backend_ops *ops;
	void *be;
	struct ioc_blk *blk;            /* block-layer exports: the image
					 * (dirty bitmaps), else NULL */
	/* Compressed exports: the image and its overlay (or NULL), for
	 * the control socket's reports; the backend is be. */
	struct ioc_zip_image *zip;
	struct ioc_zip_overlay *zip_overlay;
	struct ioc_node *node;          /* node exports (export-node.c), else NULL */
	void (*be_free)(void *be);      /* frees be with the export, or NULL */
	unsigned index;                 /* in the server's exports[] */
	/* Deletion while serving (server.c, "Exports while serving"):
	 * connections that chose this export, counted by conn.c on their
	 * I/O thread; gone once deletion began; reaped by whoever finishes
	 * it (an exchange: the deleter or the last connection). */
	_Atomic unsigned conns;
	atomic_bool gone, reaped;
	void *srv;                      /* the server (struct ioc_nbd_server) */
	/* Where its connections move after the handshake (a struct
	 * nbd_thread of server.c), or NULL: they stay where they are. */
	void *place;
	void (*deleted)(void *opaque, const char *name);
	void *deleted_opaque;
};

/* The server's TLS mode (proto.md "TLS support"). */
enum ioc__nbd_tls_mode {
	IOC__NBD_TLS_OFF = 0,           /* NOTLS: STARTTLS refused (POLICY) */
	IOC__NBD_TLS_ON,                /* SELECTIVETLS, no TLS-only export */
	IOC__NBD_TLS_REQUIRE,           /* FORCEDTLS: nothing but STARTTLS and
					 * ABORT before TLS */
};

/* What every connection of a server shares (read-only while serving). */
struct ioc__nbd_cfg {
	struct ioc__nbd_export **exports;
	unsigned nexports;
	atomic_int shutting_down;       /* set by the server's shutdown */
	enum ioc__nbd_tls_mode tls;
};

/* Slot i of the exports, or NULL (deleted): an acquire load, pairing with
 * the release stores in ioc_nbd_server_add_export() and _del_export(). */
static inline struct ioc__nbd_export *ioc__nbd_cfg_export(const struct ioc__nbd_cfg *cfg,
							  unsigned i)
{
	return __atomic_load_n(&cfg->exports[i], __ATOMIC_ACQUIRE);
}

/* Slots in use, high-water (acquire: pairs with the release store that
 * publishes a new slot in ioc_nbd_server_add_export()). */
static inline unsigned ioc__nbd_cfg_nexports(const struct ioc__nbd_cfg *cfg)
{
	return __atomic_load_n(&cfg->nexports, __ATOMIC_ACQUIRE);
}

/* ---- per-request state -------------------------------------------------- */

/* A pipe holding a READ's data on its way to the socket (conn.c). */
struct ioc__nbd_pipe {
	int rfd, wfd;
	size_t cap;                     /* bytes it holds at most */
	size_t fill;                    /* bytes in it (SIZE_MAX: unknown) */
	struct ioc__nbd_pipe *next;     /* the transport's free list */
};

struct ioc__nbd_req {
	struct ioc__nbd_req *next;      /* in the send queue / free list */
	uint16_t flags, type;
	uint64_t cookie, offset, len;
	int error;                      /* NBD error decided at parse time */

	/* Payload: WRITE data in, READ data out.  buf_cap bytes, page aligned. */
	uint8_t *buf;
	size_t buf_cap;

	/* The reply: iov[0..iovcnt) point into hdr[], buf or ext[]. */
	struct iovec iov[2 * IOC_NBD_MAX_READ_CHUNKS + 2];
	int iovcnt;
	int iov_done;                   /* iovecs fully sent */
	size_t iov_off;                 /* bytes sent of iov[iov_done] */
	uint8_t hdr[(NBD_EXT_REPLY_SIZE + 16) * (IOC_NBD_MAX_READ_CHUNKS + 1) + 64];
	uint8_t *ext;                   /* block status payload (malloc) */
	bool no_reply;                  /* DISC */
	bool failed;                    /* the reply is an error */
	bool mapped;                    /* READ data iovec lent by map_read */
	/* WRITE: the transport received the payload's first wmap_len bytes
	 * into the image's mapping (map_write), the rest, if any, into buf;
	 * wmap_ret is map_written()'s answer. */
	uint64_t wmap_len;
	int wmap_ret;
	bool wmap_tried;                /* the transport asked map_write */

	void *transport;                /* the transport's per-request object */
	/* READ data spliced into a pipe instead of buf: the reply iovec
	 * with a NULL base stands for the pipe's contents.  WRITE: the
	 * payload, spliced in from the socket by the transport. */
	struct ioc__nbd_pipe *pipe;
};

/* ---- per-connection protocol state ------------------------------------- */

enum ioc__nbd_phase {
	IOC_NBD_PHASE_GREETING = 0,     /* greeting not yet queued */
	IOC_NBD_PHASE_CLIENT_FLAGS,
	IOC_NBD_PHASE_OPTIONS,
	IOC_NBD_PHASE_TRANSMISSION,
	IOC_NBD_PHASE_CLOSED,
};

struct ioc__nbd_conn {
	const struct ioc__nbd_cfg *cfg;
	enum ioc__nbd_phase phase;

	/* Input: bytes received and not yet consumed are in[start, end). */
	uint8_t *in;
	size_t in_start, in_end, in_cap;

	/* Handshake output, sent before anything else (bounded by the option
	 * replies to one option). */
	uint8_t *out;
	size_t out_len, out_cap;

	/* Negotiated. */
	bool fixed, no_zeroes, structured, extended;
	bool meta_base_alloc;           /* base:allocation selected */
	bool meta_depth;                /* qemu:allocation-depth selected */
	/* qemu:dirty-bitmap:NAME contexts selected, in creation order of the
	 * bitmaps; bitmap k has context id NBD_META_ID_QEMU_BITMAP + k. */
	char meta_bitmap[IOC_NBD_META_BITMAPS][IOC_NBD_BITMAP_NAME_MAX];
	unsigned meta_nbitmaps;
	const struct ioc__nbd_export *meta_export; /* SET_META_CONTEXT's export */
	bool enforce_block_size;        /* client asked for NBD_INFO_BLOCK_SIZE */
	const struct ioc__nbd_export *exp;
	uint16_t tflags;
	unsigned nopts;
	uint64_t opt_skip;              /* bytes of an oversized option to drop */
	uint32_t opt_skip_opt;
	bool abort_after_out;           /* ABORT: close once out[] is sent */
	bool tls;                       /* the transport finished STARTTLS */

	/* Transmission parsing: a WRITE whose payload is still arriving. */
	struct ioc__nbd_req *partial;
	uint64_t partial_got;
	uint64_t discard;               /* payload bytes to drop (refused WRITE) */
	bool disc;                      /* NBD_CMD_DISC seen */

	char peer[64];                  /* for logs */

	/* Zero-copy READs, set by a transport that can send from a pipe
	 * (0 / NULL: never).  A READ of at least zc_read_min bytes in the clear
	 * asks zc_get() for a pipe able to hold its data (NULL: none free),
	 * splices the data into it, and gives it back with zc_put() when
	 * that fell short.  A WRITE whose payload the transport spliced into
	 * a pipe (the transport's choice, from zc_write_min up) gives it
	 * back once written. */
	size_t zc_read_min, zc_write_min;
	/* Set by a transport whose replies reach the socket by sendmsg, the
	 * kernel copying from the iovecs: a READ in the clear may then point
	 * its data iovec at the backend's map_read() instead of r->buf. */
	bool map_reads;
	/* Lend reads below IOC_NBD_MAP_ALONE_MIN too: set by the transport
	 * while its thread serves other connections (transmission.c says
	 * why one connection alone copies them). */
	bool map_small;
	struct ioc__nbd_pipe *(*zc_get)(struct ioc__nbd_req *r);
	void (*zc_put)(struct ioc__nbd_req *r, struct ioc__nbd_pipe *p);
};

/* sendmsg failed with EFAULT: move the data of every READ from r on whose
 * iovec points into the backend's mapping into its buffer (map_fault).
 * Returns how many moved, or -errno. */
int ioc__nbd_unmap_reads(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r);

/* Input bytes received and not yet consumed. */
static inline size_t ioc__nbd_in_avail(const struct ioc__nbd_conn *c)
{
	return c->in_end - c->in_start;
}

/* Step results. */
enum {
	IOC_NBD_MORE = 0,       /* need more input */
	IOC_NBD_READY = 1,      /* handshake done / a request is ready */
	IOC_NBD_CLOSE = 2,      /* send out[] then close (ABORT, DISC) */
	IOC_NBD_STARTTLS = 3,   /* send out[] (the ACK), run the TLS handshake,
				 * then ioc__nbd_tls_started() and step on */
};

int ioc__nbd_conn_init(struct ioc__nbd_conn *c, const struct ioc__nbd_cfg *cfg,
		       size_t in_cap);
void ioc__nbd_conn_destroy(struct ioc__nbd_conn *c);
/* Make room for at least want bytes at in[in_end] (compacts). */
void ioc__nbd_conn_compact(struct ioc__nbd_conn *c);

/* Queue the greeting (call once, first). */
void ioc__nbd_hs_start(struct ioc__nbd_conn *c);
/* Consume handshake input; may queue output in out[].  Returns IOC_NBD_MORE,
 * IOC_NBD_READY (transmission phase entered: remaining input belongs to it),
 * IOC_NBD_CLOSE (send out[] and close), IOC_NBD_STARTTLS (only when
 * cfg->tls allows it: out[] holds the ACK and no input is left over) or
 * -EPROTO for a hard disconnect. */
int ioc__nbd_hs_step(struct ioc__nbd_conn *c);
/* The transport finished the TLS handshake that IOC_NBD_STARTTLS asked
 * for: option haggling goes on, over TLS. */
void ioc__nbd_tls_started(struct ioc__nbd_conn *c);

/*
 * Transmission: take the next request out of the input.  Returns
 * IOC_NBD_READY with *out set to a request whose payload (if any) is
 * complete, IOC_NBD_MORE when more input is needed (a WRITE's payload
 * may be partly copied into c->partial: the transport may then read the
 * rest straight into partial->buf + partial_got and call
 * ioc__nbd_payload_arrived()), or -EPROTO for a hard disconnect.
 * alloc gives a request with buf_cap >= len (or NULL: -ENOMEM).
 */
typedef struct ioc__nbd_req *ioc__nbd_req_alloc(void *opaque, size_t len);
int ioc__nbd_parse_request(struct ioc__nbd_conn *c, ioc__nbd_req_alloc *alloc,
			   void *opaque, struct ioc__nbd_req **out);
/* n bytes were written directly into partial->buf + partial_got.  Returns
 * the finished request or NULL if more is needed. */
struct ioc__nbd_req *ioc__nbd_payload_arrived(struct ioc__nbd_conn *c, size_t n);

/* Run a request against the export and build its reply in req->iov.  May
 * yield when the backend does.  After it returns the reply is ready to send
 * (req->no_reply for DISC). */
void ioc_coroutine_fn ioc__nbd_execute(const struct ioc__nbd_conn *c,
				       struct ioc__nbd_req *req);
/* Build the error reply for a request refused at parse time. */
void ioc__nbd_reply_error(const struct ioc__nbd_conn *c, struct ioc__nbd_req *req,
			  int nbd_err, const char *msg);

/* Map -errno to an NBD error. */
int ioc__nbd_errno_to_nbd(int err);

/* Sending: gather up to max iovecs from a chain of requests starting at
 * req; returns the number of iovecs written to iov.  ioc__nbd_sent()
 * advances the chain by n bytes and returns how many requests were fully
 * sent (the caller pops that many). */
int ioc__nbd_gather(struct ioc__nbd_req *req, struct iovec *iov, int max);
/* The same, stopping before an iovec whose data is in a pipe (req->pipe)
 * and saying so in *at_pipe. */
int ioc__nbd_gather_upto_pipe(struct ioc__nbd_req *req, struct iovec *iov, int max,
			      bool *at_pipe);
/* The next unsent bytes of req come from its pipe. */
static inline bool ioc__nbd_at_pipe(const struct ioc__nbd_req *r)
{
	return r->pipe && r->iov_done < r->iovcnt && !r->iov[r->iov_done].iov_base;
}
unsigned ioc__nbd_sent(struct ioc__nbd_req *req, size_t n);

#endif /* IOC_NBD_PROTO_H */
