/*
 * The iocore migration stream: how one iocore-nbd sends the image it
 * serves to another while clients keep writing (source.c, dest.c):
 * encoding, decoding and checks, with no I/O, so the fuzzer and the unit
 * tests drive it on byte buffers.
 *
 * Problem: the receiver must never serve an image that is not exactly
 * the sender's: a lost, repeated, reordered, truncated or corrupted record
 * must be detected, and a hostile stream must not make it write outside
 * the image or allocate without bound.
 *
 * Design: a fixed header, then records, all integers big-endian (as NBD).
 *  - Header (IOC_MIG_HDR_SIZE bytes): magic, version, flags (0 or
 *    HANDOVER), the image size, the block size (the granularity of the
 *    checksum and of dirty tracking, a power of two), its CRC-32.
 *  - Record header (IOC_MIG_REC_SIZE bytes): type, flags, offset, length
 *    (decoded bytes), payload length (bytes on the wire that follow),
 *    CRC-32 of the decoded data, CRC-32 of the record header itself.
 *    DATA records carry raw or zstd-compressed data; ZERO records carry
 *    none; every data record covers whole blocks (the last block of the
 *    image may be short).  PASS starts a pass over the dirty set: records
 *    of one pass never overlap, so a receiver may apply a pass's records
 *    in any order, but must finish a pass before applying the next one.
 *    END carries the image checksum; the receiver answers with ACK.
 *    MIRROR (version 2), a client write the source waits for: raw data
 *    that may overlap any record, applied after every earlier one on its
 *    blocks and before any later one; MACK answers with the count of
 *    MIRROR records applied so far.
 *  - A hand-over stream (flag IOC_MIG_F_HANDOVER: both ends open one image
 *    on shared storage) has one record, HANDOVER, naming the image (its
 *    shared id); the receiver takes it over and answers READY.
 *  - The image checksum: CRC-32 over the big-endian array of every
 *    block's CRC-32, in block order, which each side knows from the data
 *    it last sent or wrote: the final check costs no I/O.
 *
 * Rejected: a checksum of the reread image at the end (seconds of reads
 * while clients wait); one record per block (a 32-byte header per 4 KiB
 * and no room to compress); QEMU's RAM migration format (page-oriented,
 * no per-record checksums, tied to QEMU's device state).
 */
#ifndef IOCORE_MIGRATE_STREAM_H
#define IOCORE_MIGRATE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IOC_MIG_MAGIC      UINT64_C(0x494f434d49470d0a) /* "IOCMIG\r\n" */
#define IOC_MIG_VERSION    2u
#define IOC_MIG_HDR_SIZE   32u   /* magic 8, version 4, flags 4, size 8,
				  * block_size 4, crc 4 */
#define IOC_MIG_REC_SIZE   32u   /* type 4, flags 4, offset 8, length 4,
				  * payload_len 4, data_crc 4, hdr_crc 4 */
#define IOC_MIG_MIN_BLOCK  4096u
#define IOC_MIG_MAX_BLOCK  (64u << 20)
#define IOC_MIG_MAX_CHUNK  (64u << 20) /* largest decoded DATA record */
/* Most blocks in an image (so the per-block CRC array is bounded: 1 GiB at
 * most): a sender picks a block size of at least image_size / 2^28 (4 KiB
 * blocks up to 1 TiB, 64 KiB up to 16 TiB). */
#define IOC_MIG_MAX_BLOCKS (UINT64_C(1) << 28)
/* Header flags. */
#define IOC_MIG_F_HANDOVER 1u
/* Longest shared id a HANDOVER carries. */
#define IOC_MIG_MAX_SHARED_ID 1024u

enum ioc_mig_type {
	IOC_MIG_DATA_RAW = 1,   /* payload: length bytes */
	IOC_MIG_DATA_ZSTD = 2,  /* payload: one zstd frame of length bytes */
	IOC_MIG_ZERO = 3,       /* no payload: length bytes of zeros (not
				 * limited by MAX_CHUNK); data_crc ignored */
	IOC_MIG_PASS = 4,       /* offset: pass number (1, 2, ...: the
				 * receiver wants them consecutive); length 0;
				 * data_crc ignored */
	IOC_MIG_END = 5,        /* offset: image size; data_crc: image checksum */
	IOC_MIG_ACK = 6,        /* receiver to sender; offset: 0 or an errno;
				 * data_crc: the receiver's image checksum */
	IOC_MIG_MIRROR = 7,     /* payload: length raw bytes, as DATA_RAW, but
				 * ordered against every other record */
	IOC_MIG_MACK = 8,       /* receiver to sender; offset: MIRROR records
				 * applied so far; length 0 */
	IOC_MIG_HANDOVER = 9,   /* hand-over streams only; payload: length
				 * bytes of shared id (1..MAX_SHARED_ID, no
				 * NUL); offset: image size; data_crc: CRC-32
				 * of the payload */
	IOC_MIG_READY = 10,     /* receiver to sender, hand-over streams; offset:
				 * 0 (serving) or an errno; length 0 */
};

struct ioc_mig_hdr {
	uint32_t version;
	uint32_t flags;
	uint64_t image_size;
	uint32_t block_size;
};

struct ioc_mig_rec {
	uint32_t type;          /* enum ioc_mig_type */
	uint32_t flags;         /* 0 */
	uint64_t offset;
	uint32_t length;
	uint32_t payload_len;
	uint32_t data_crc;      /* CRC-32 of the decoded data (DATA), else
				 * as the type says */
};

/* Encode into buf (IOC_MIG_HDR_SIZE / IOC_MIG_REC_SIZE bytes). */
void ioc_mig_hdr_encode(const struct ioc_mig_hdr *h, uint8_t *buf);
void ioc_mig_rec_encode(const struct ioc_mig_rec *r, uint8_t *buf);

/*
 * Decode and check.  Header: magic, version, flags, header CRC, block size
 * a power of two in [MIN_BLOCK, MAX_BLOCK], image size > 0 and at most
 * MAX_BLOCKS blocks.  Record: header CRC, a known type and flags 0, and
 * against the stream's header: DATA and ZERO records non-empty, inside the
 * image, block-aligned offset, a length that is a multiple of the block
 * size (or ends at the image end), DATA at most MAX_CHUNK, payload_len ==
 * length for RAW, in [1, zstd's bound] for ZSTD, 0 for the others; PASS,
 * END and ACK of length 0, PASS numbered from 1, END's offset equal to the
 * image size; MIRROR as DATA_RAW; MACK of length 0 and no payload.  A
 * hand-over stream (flags IOC_MIG_F_HANDOVER) has HANDOVER, READY and ACK
 * only, any other stream none of the first two; HANDOVER's offset is the
 * image size, its length equal to payload_len, in [1, MAX_SHARED_ID];
 * READY of length 0 and no payload.  Returns 0 or
 * -EPROTO (malformed), -EPROTONOSUPPORT (magic or version), with a
 * human-readable reason in why (may be NULL) naming the field.
 */
int ioc_mig_hdr_decode(const uint8_t *buf, struct ioc_mig_hdr *h,
		       const char **why);
int ioc_mig_rec_decode(const uint8_t *buf, const struct ioc_mig_hdr *h,
		       struct ioc_mig_rec *r, const char **why);

/* A HANDOVER record's payload into id (idlen >= MAX_SHARED_ID + 1, NUL
 * terminated): its CRC checked, no NUL inside.  0, -EBADMSG or -EPROTO. */
int ioc_mig_handover_decode(const struct ioc_mig_rec *r, const void *payload, char *id,
			    size_t idlen, const char **why);

/* Decode a DATA record's payload into out (r->length bytes) and check its
 * CRC.  Returns 0, -EBADMSG (bad CRC or zstd error) or -EPROTO. */
int ioc_mig_payload_decode(const struct ioc_mig_rec *r, const void *payload,
			   void *out, const char **why);

/* CRC-32 (zlib's value, by ISA-L or libdeflate when built with one) of len
 * bytes, and of len zero bytes (cached per length). */
uint32_t ioc_mig_crc(const void *buf, size_t len);
uint32_t ioc_mig_crc_zero(size_t len);

/*
 * Per-block CRCs of one side and the image checksum over them.  Blocks
 * start as never written; ioc_mig_crcs_set() records a block's CRC (a
 * block's CRC is of its bytes; the last block may be short).  The checksum
 * is defined only when every block has been set; otherwise it returns
 * -ENODATA and the first unset block in *missing.
 */
struct ioc_mig_crcs;
int ioc_mig_crcs_new(struct ioc_mig_crcs **out, uint64_t image_size,
		     uint32_t block_size);
void ioc_mig_crcs_free(struct ioc_mig_crcs *c);
/* Record the CRCs of the blocks of [offset, offset + len), whose data is
 * buf (NULL: zeros), and return the CRC-32 of the whole range (combined
 * from the block CRCs, so the data is read once).  offset block-aligned;
 * len whole blocks or to the end.  Threads may set distinct blocks at the
 * same time; the checksum's reader synchronises with them by whatever
 * handed their work back (a workqueue's completion, a join). */
uint32_t ioc_mig_crcs_set(struct ioc_mig_crcs *c, uint64_t offset,
			  uint64_t len, const void *buf);
int ioc_mig_crcs_checksum(const struct ioc_mig_crcs *c, uint32_t *sum,
			  uint64_t *missing);
/* The CRCs of the blocks of buf (len bytes from a block-aligned offset;
 * the last block may be short) into out[], one per block, and the CRC of
 * the whole range; nothing is recorded.  ioc_mig_crcs_put() records them
 * later, so a sender whose workers finish out of order can record CRCs in
 * the order its records leave. */
uint32_t ioc_mig_block_crcs(uint32_t block_size, const void *buf, uint64_t len,
			    uint32_t *out);
void ioc_mig_crcs_put(struct ioc_mig_crcs *c, uint64_t offset, uint64_t len,
		      const uint32_t *crcs);

#endif
