/*
 * Unit tests of the migration stream's codec (src/migrate/stream.c):
 * round trips of the header and of every record type (a hand-over
 * stream's too), every rejection
 * the decoders promise (each with its reason), payload decoding of raw
 * and zstd data with its failure modes, the CRC of data (whichever
 * library the build uses) and of zeros against zlib's crc32(), and the
 * per-block CRCs with the image checksum against one computed here.
 */
#include <errno.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "tap.h"
#include "iocore/common.h"
#include "mig-test-util.h"

static const struct ioc_mig_hdr hdr16k = {
	.version = IOC_MIG_VERSION, .image_size = 4 * 4096 + 100, .block_size = 4096,
};

static void test_hdr_round_trip(void)
{
	struct ioc_mig_hdr in = { .version = IOC_MIG_VERSION,
				  .image_size = UINT64_C(1) << 40, .block_size = 65536 };
	struct ioc_mig_hdr out;
	uint8_t b[IOC_MIG_HDR_SIZE];
	const char *why = "unset";

	ioc_mig_hdr_encode(&in, b);
	/* Big-endian on the wire. */
	ASSERT_MEM_EQ(b, "IOCMIG\r\n", 8);
	ASSERT_UEQ(b[11], IOC_MIG_VERSION);
	ASSERT_UEQ(b[19], 0);
	ASSERT_UEQ(b[18], 1);
	ASSERT_UEQ(b[17], 0);
	ASSERT_OK(ioc_mig_hdr_decode(b, &out, &why));
	ASSERT_UEQ(out.version, IOC_MIG_VERSION);
	ASSERT_UEQ(out.flags, 0);
	ASSERT_UEQ(out.image_size, in.image_size);
	ASSERT_UEQ(out.block_size, in.block_size);
}

/* Encode h, let mutate change the bytes, decode: returns the error and
 * checks that the reason mentions want. */
static void hdr_rejects(const struct ioc_mig_hdr *h, int flip, int err, const char *want)
{
	struct ioc_mig_hdr out;
	uint8_t b[IOC_MIG_HDR_SIZE];
	const char *why = NULL;

	ioc_mig_hdr_encode(h, b);
	if (flip >= 0)
		b[flip] ^= 0x01;
	ASSERT_EQ(ioc_mig_hdr_decode(b, &out, &why), err);
	ASSERT_NOT_NULL(why);
	if (!strstr(why, want))
		ioc_test_fail(__FILE__, __LINE__, "reason \"%s\" lacks \"%s\"", why, want);
	/* why may be NULL */
	ASSERT_EQ(ioc_mig_hdr_decode(b, &out, NULL), err);
}

static void test_hdr_rejects(void)
{
	struct ioc_mig_hdr h = hdr16k;

	hdr_rejects(&h, 0, -EPROTONOSUPPORT, "magic");
	hdr_rejects(&h, 7, -EPROTONOSUPPORT, "magic");
	hdr_rejects(&h, 20, -EPROTO, "header CRC");
	hdr_rejects(&h, 29, -EPROTO, "header CRC");
	h.version = IOC_MIG_VERSION + 1;
	hdr_rejects(&h, -1, -EPROTONOSUPPORT, "version");
	h = hdr16k;
	h.flags = 2;
	hdr_rejects(&h, -1, -EPROTO, "flags");
	h.flags = IOC_MIG_F_HANDOVER | 0x80000000u;
	hdr_rejects(&h, -1, -EPROTO, "flags");
	h = hdr16k;
	h.block_size = 4096 + 512;
	hdr_rejects(&h, -1, -EPROTO, "block size");
	h.block_size = 2048;
	hdr_rejects(&h, -1, -EPROTO, "block size");
	h.block_size = IOC_MIG_MAX_BLOCK * 2;
	hdr_rejects(&h, -1, -EPROTO, "block size");
	h.block_size = 0;
	hdr_rejects(&h, -1, -EPROTO, "block size");
	h = hdr16k;
	h.image_size = 0;
	hdr_rejects(&h, -1, -EPROTO, "image size");
	h.image_size = IOC_MIG_MAX_BLOCKS * 4096 + 1;
	hdr_rejects(&h, -1, -EPROTO, "image size");
	h.image_size = UINT64_MAX;
	h.block_size = IOC_MIG_MAX_BLOCK;
	hdr_rejects(&h, -1, -EPROTO, "image size");
	/* The limits themselves are accepted. */
	{
		struct ioc_mig_hdr out;
		uint8_t b[IOC_MIG_HDR_SIZE];

		h.image_size = IOC_MIG_MAX_BLOCKS * 4096;
		h.block_size = 4096;
		ioc_mig_hdr_encode(&h, b);
		ASSERT_OK(ioc_mig_hdr_decode(b, &out, NULL));
		h.image_size = 1;
		h.block_size = IOC_MIG_MAX_BLOCK;
		ioc_mig_hdr_encode(&h, b);
		ASSERT_OK(ioc_mig_hdr_decode(b, &out, NULL));
	}
}

static void rec_ok(const struct ioc_mig_hdr *h, struct ioc_mig_rec r)
{
	struct ioc_mig_rec out;
	uint8_t b[IOC_MIG_REC_SIZE];
	const char *why = NULL;

	ioc_mig_rec_encode(&r, b);
	if (ioc_mig_rec_decode(b, h, &out, &why) != 0)
		ioc_test_fail(__FILE__, __LINE__, "type %u rejected: %s", r.type, why);
	ASSERT_UEQ(out.type, r.type);
	ASSERT_UEQ(out.flags, r.flags);
	ASSERT_UEQ(out.offset, r.offset);
	ASSERT_UEQ(out.length, r.length);
	ASSERT_UEQ(out.payload_len, r.payload_len);
	ASSERT_UEQ(out.data_crc, r.data_crc);
}

static void test_rec_round_trip(void)
{
	const struct ioc_mig_hdr *h = &hdr16k;
	uint8_t b[IOC_MIG_REC_SIZE];
	struct ioc_mig_rec r = { .type = IOC_MIG_DATA_RAW, .offset = 0x0102030405060708ull,
				 .length = 0x11223344, .payload_len = 0x55667788,
				 .data_crc = 0x99aabbcc };

	/* Byte layout, big-endian. */
	ioc_mig_rec_encode(&r, b);
	ASSERT_MEM_EQ(b, "\0\0\0\1\0\0\0\0\1\2\3\4\5\6\7\x08\x11\x22\x33\x44"
			 "\x55\x66\x77\x88\x99\xaa\xbb\xcc", 28);
	ASSERT_UEQ(((uint32_t)b[28] << 24 | (uint32_t)b[29] << 16 |
		    (uint32_t)b[30] << 8 | b[31]), (uint32_t)crc32(0, b, 28));

	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 4096, 8192, 8192, 0xdeadbeef });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 8192, 8292, 8292, 1 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 16384, 100, 100, 1 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0, 4096, 17, 2 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0, 4096,
					(uint32_t)ZSTD_compressBound(4096), 2 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 4096, 12388, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_PASS, 0, 1, 0, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_PASS, 0, 77, 0, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_END, 0, h->image_size, 0, 0, 0x12345678 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_ACK, 0, 0, 0, 0, 0x12345678 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_ACK, 0, EIO, 0, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_MIRROR, 0, 4096, 4096, 4096, 3 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_MACK, 0, 12345, 0, 0, 0 });
	/* ZERO records are not limited to MAX_CHUNK, DATA records are. */
	{
		struct ioc_mig_hdr big = { IOC_MIG_VERSION, 0, UINT64_C(1) << 40, 65536 };

		rec_ok(&big, (struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 65536,
						   UINT32_MAX - 65535, 0, 0 });
		rec_ok(&big, (struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 65536,
						   IOC_MIG_MAX_CHUNK, IOC_MIG_MAX_CHUNK, 0 });
	}
}

static void rec_rejects(const struct ioc_mig_hdr *h, struct ioc_mig_rec r, int flip,
			int err, const char *want, int line)
{
	struct ioc_mig_rec out;
	uint8_t b[IOC_MIG_REC_SIZE];
	const char *why = NULL;
	int ret;

	ioc_mig_rec_encode(&r, b);
	if (flip >= 0)
		b[flip] ^= 0x80;
	ret = ioc_mig_rec_decode(b, h, &out, &why);
	if (ret != err)
		ioc_test_fail(__FILE__, line, "expected %d, got %d (%s)", err, ret,
			      why ? why : "no reason");
	if (!why || !strstr(why, want))
		ioc_test_fail(__FILE__, line, "reason \"%s\" lacks \"%s\"",
			      why ? why : "(null)", want);
	ASSERT_EQ(ioc_mig_rec_decode(b, h, &out, NULL), err);
}

#define REJECT(r, flip, want) rec_rejects(h, r, flip, -EPROTO, want, __LINE__)

static void test_rec_rejects(void)
{
	const struct ioc_mig_hdr *h = &hdr16k;
	uint64_t end = h->image_size;

	/* Record CRC: any byte of the record, including the CRC itself. */
	for (int i = 0; i < 32; i++)
		REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 4096, 4096, 4096, 9 }),
		       i, "header CRC");
	REJECT(((struct ioc_mig_rec){ 0, 0, 0, 0, 0, 0 }), -1, "type");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_READY + 1, 0, 0, 0, 0, 0 }), -1, "type");
	REJECT(((struct ioc_mig_rec){ 0x80000001u, 0, 0, 4096, 4096, 0 }), -1, "type");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 1, 0, 4096, 4096, 0 }), -1, "flags");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0x100, end, 0, 0, 0 }), -1, "flags");
	/* Offset outside the image, or running past its end. */
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, end, 4096, 4096, 0 }), -1,
	       "offset outside");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ZERO, 0, UINT64_MAX - 4095, 4096, 0, 0 }), -1,
	       "offset outside");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 16384, 4096, 4096, 0 }), -1,
	       "beyond the image end");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 0, UINT32_MAX, 0, 0 }), -1,
	       "beyond the image end");
	/* Alignment. */
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 512, 4096, 4096, 0 }), -1,
	       "not block-aligned");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 4095, 4096, 0, 0 }), -1,
	       "not block-aligned");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 0, 4000, 4000, 0 }), -1,
	       "whole blocks");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 16384, 99, 99, 0 }), -1,
	       "whole blocks");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 0, 0, 0, 0 }), -1, "length 0");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0, 0, 1, 0 }), -1, "length 0");
	/* Oversized DATA. */
	{
		struct ioc_mig_hdr big = { IOC_MIG_VERSION, 0, UINT64_C(1) << 40, 65536 };

		rec_rejects(&big, (struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 0,
			    IOC_MIG_MAX_CHUNK + 65536, IOC_MIG_MAX_CHUNK + 65536, 0 }, -1,
			    -EPROTO, "chunk limit", __LINE__);
		rec_rejects(&big, (struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0,
			    IOC_MIG_MAX_CHUNK + 65536, 100, 0 }, -1,
			    -EPROTO, "chunk limit", __LINE__);
	}
	/* payload_len against the type. */
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 0, 4096, 4095, 0 }), -1,
	       "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 0, 4096, 4097, 0 }), -1,
	       "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0, 4096, 0, 0 }), -1,
	       "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_ZSTD, 0, 0, 4096,
					(uint32_t)ZSTD_compressBound(4096) + 1, 0 }), -1,
	       "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ZERO, 0, 0, 4096, 1, 0 }), -1, "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_MIRROR, 0, 0, 4096, 4095, 0 }), -1,
	       "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_MIRROR, 0, 512, 4096, 4096, 0 }), -1,
	       "not block-aligned");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_MACK, 0, 1, 0, 4, 0 }), -1, "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_MACK, 0, 1, 4096, 0, 0 }), -1, "length");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_PASS, 0, 1, 0, 8, 0 }), -1, "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0, end, 0, 1, 0 }), -1, "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_PASS, 0, 1, 4096, 0, 0 }), -1, "length");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_ACK, 0, 0, 1, 0, 0 }), -1, "length");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_PASS, 0, 0, 0, 0, 0 }), -1, "PASS number");
	/* END's offset is the image size. */
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0, end - 1, 0, 0, 0 }), -1, "END offset");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0, 0, 0, 0, 0 }), -1, "END offset");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0, end + 4096, 0, 0, 0 }), -1, "END offset");
}

/* A hand-over stream: its header flag, HANDOVER and READY, and that
 * neither kind of stream takes the other's records. */
static void test_handover(void)
{
	const struct ioc_mig_hdr ho = { .version = IOC_MIG_VERSION, .flags = IOC_MIG_F_HANDOVER,
					.image_size = 1 << 30, .block_size = 4096 };
	const struct ioc_mig_hdr *h = &ho;
	const char *id = "rbd:rbd//img;cluster=5e2b";
	uint32_t len = (uint32_t)strlen(id), crc = ioc_mig_crc(id, len);
	struct ioc_mig_hdr out;
	struct ioc_mig_rec r = { IOC_MIG_HANDOVER, 0, ho.image_size, len, len, crc };
	uint8_t b[IOC_MIG_HDR_SIZE];
	char got[IOC_MIG_MAX_SHARED_ID + 1], bad[64];
	const char *why = NULL;

	ioc_mig_hdr_encode(h, b);
	ASSERT_UEQ(b[15], IOC_MIG_F_HANDOVER);
	ASSERT_OK(ioc_mig_hdr_decode(b, &out, NULL));
	ASSERT_UEQ(out.flags, IOC_MIG_F_HANDOVER);
	rec_ok(h, r);
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, ho.image_size,
					IOC_MIG_MAX_SHARED_ID, IOC_MIG_MAX_SHARED_ID, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_READY, 0, 0, 0, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_READY, 0, EXDEV, 0, 0, 0 });
	rec_ok(h, (struct ioc_mig_rec){ IOC_MIG_ACK, 0, EPROTO, 0, 0, 0 });
	REJECT(((struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, ho.image_size - 1, len, len, 0 }),
	       -1, "HANDOVER offset");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, ho.image_size, 0, 0, 0 }), -1,
	       "HANDOVER length");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, ho.image_size,
				     IOC_MIG_MAX_SHARED_ID + 1, IOC_MIG_MAX_SHARED_ID + 1, 0 }),
	       -1, "HANDOVER length");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, ho.image_size, len, len + 1, 0 }),
	       -1, "payload_len");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_READY, 0, 0, 1, 0, 0 }), -1, "READY");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_READY, 0, 0, 0, 4, 0 }), -1, "READY");
	/* A copy stream's records in a hand-over stream, and the reverse. */
	REJECT(((struct ioc_mig_rec){ IOC_MIG_DATA_RAW, 0, 0, 4096, 4096, 0 }), -1,
	       "hand-over stream");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_END, 0, ho.image_size, 0, 0, 0 }), -1,
	       "hand-over stream");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_MIRROR, 0, 0, 4096, 4096, 0 }), -1,
	       "hand-over stream");
	h = &hdr16k;
	REJECT(((struct ioc_mig_rec){ IOC_MIG_HANDOVER, 0, h->image_size, len, len, crc }), -1,
	       "copy stream");
	REJECT(((struct ioc_mig_rec){ IOC_MIG_READY, 0, 0, 0, 0, 0 }), -1, "copy stream");
	/* The payload: the id back, its CRC, no NUL, room for it. */
	ASSERT_OK(ioc_mig_handover_decode(&r, id, got, sizeof(got), &why));
	ASSERT_STR_EQ(got, id);
	r.data_crc ^= 1;
	ASSERT_EQ(ioc_mig_handover_decode(&r, id, got, sizeof(got), &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "CRC"));
	memcpy(bad, id, len);
	bad[3] = '\0';
	r.data_crc = ioc_mig_crc(bad, len);
	ASSERT_EQ(ioc_mig_handover_decode(&r, bad, got, sizeof(got), &why), -EPROTO);
	ASSERT_NOT_NULL(strstr(why, "NUL"));
	r.data_crc = crc;
	ASSERT_EQ(ioc_mig_handover_decode(&r, id, got, len, &why), -EPROTO);
	r.type = IOC_MIG_DATA_RAW;
	ASSERT_EQ(ioc_mig_handover_decode(&r, id, got, sizeof(got), &why), -EPROTO);
}

static void test_payload(void)
{
	uint8_t data[3 * 4096], out[3 * 4096], z[ZSTD_COMPRESSBOUND(3 * 4096) + 64];
	struct ioc_mig_rec r = { .type = IOC_MIG_DATA_RAW, .length = sizeof(data),
				 .payload_len = sizeof(data) };
	const char *why = NULL;
	size_t zn;

	mt_fill(data, sizeof(data), 3, 1);
	r.data_crc = (uint32_t)crc32(0, data, sizeof(data));
	ASSERT_OK(ioc_mig_payload_decode(&r, data, out, &why));
	ASSERT_MEM_EQ(out, data, sizeof(data));
	/* A flipped byte of the data: CRC mismatch. */
	data[5000] ^= 4;
	ASSERT_EQ(ioc_mig_payload_decode(&r, data, out, &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "CRC"));
	data[5000] ^= 4;

	zn = ZSTD_compress(z, sizeof(z), data, sizeof(data), 3);
	ASSERT_FALSE(ZSTD_isError(zn));
	r.type = IOC_MIG_DATA_ZSTD;
	r.payload_len = (uint32_t)zn;
	memset(out, 0, sizeof(out));
	ASSERT_OK(ioc_mig_payload_decode(&r, z, out, &why));
	ASSERT_MEM_EQ(out, data, sizeof(data));
	/* Wrong CRC in the record. */
	r.data_crc ^= 1;
	ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "CRC"));
	r.data_crc ^= 1;
	/* Content size other than the record's length. */
	r.length = 2 * 4096;
	ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "content size"));
	r.length = sizeof(data);
	/* Trailing bytes after the frame. */
	r.payload_len = (uint32_t)zn + 3;
	z[zn] = z[zn + 1] = z[zn + 2] = 0;
	ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "frame size"));
	/* Cut short. */
	r.payload_len = (uint32_t)zn - 5;
	ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EBADMSG);
	r.payload_len = (uint32_t)zn;
	/* A corrupted block inside the frame (past its header). */
	z[zn / 2] ^= 0x55;
	{
		int ret = ioc_mig_payload_decode(&r, z, out, &why);

		ASSERT_EQ(ret, -EBADMSG);
	}
	z[zn / 2] ^= 0x55;
	/* Not zstd at all. */
	ASSERT_EQ(ioc_mig_payload_decode(&r, data, out, &why), -EBADMSG);
	ASSERT_NOT_NULL(strstr(why, "zstd"));
	/* A frame without a content size (streaming compression). */
	{
		ZSTD_CCtx *cc = ZSTD_createCCtx();
		ZSTD_inBuffer ib = { data, sizeof(data), 0 };
		ZSTD_outBuffer ob = { z, sizeof(z), 0 };

		ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_continue)));
		ib.size = ib.pos;
		while (ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_end) != 0)
			;
		ZSTD_freeCCtx(cc);
		r.payload_len = (uint32_t)ob.pos;
		ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EBADMSG);
		ASSERT_NOT_NULL(strstr(why, "content size"));
	}
	/* Not a DATA record. */
	r.type = IOC_MIG_ZERO;
	ASSERT_EQ(ioc_mig_payload_decode(&r, z, out, &why), -EPROTO);
}

/* ioc_mig_crc() may run on ISA-L or libdeflate: every length and
 * alignment around their folding widths, and the block CRCs and the
 * combined CRC of a range, must equal zlib's crc32(). */
static void test_crc_data(void)
{
	size_t size = (1u << 20) + 4096 + 64;
	uint8_t *d = malloc(size);
	uint32_t out[(1u << 20) / 4096 + 2];
	static const uint32_t bss[] = { 4096, 8192, 65536 };

	ASSERT_NOT_NULL(d);
	mt_fill(d, size, 11, 0);
	for (size_t off = 0; off < 16; off++)
		for (size_t len = 0; len < 600; len++)
			ASSERT_UEQ(ioc_mig_crc(d + off, len),
				   (uint32_t)crc32(0, d + off, (uInt)len));
	ASSERT_UEQ(ioc_mig_crc(d + 3, size - 3), (uint32_t)crc32(0, d + 3, (uInt)(size - 3)));
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bss); i++) {
		uint32_t bs = bss[i];
		/* Whole blocks, and a short last block. */
		uint64_t lens[] = { bs, 7 * (uint64_t)bs, (1u << 20), (1u << 20) + 100 };

		for (size_t k = 0; k < IOC_ARRAY_SIZE(lens); k++) {
			uint64_t len = lens[k], nb = (len + bs - 1) / bs;
			struct ioc_mig_crcs *c;

			ASSERT_UEQ(ioc_mig_block_crcs(bs, d, len, out),
				   (uint32_t)crc32(0, d, (uInt)len));
			for (uint64_t b = 0; b < nb; b++) {
				uint64_t n = len - b * bs < bs ? len - b * bs : bs;

				ASSERT_UEQ(out[b], (uint32_t)crc32(0, d + b * bs, (uInt)n));
			}
			ASSERT_OK(ioc_mig_crcs_new(&c, len, bs));
			ASSERT_UEQ(ioc_mig_crcs_set(c, 0, len, d), (uint32_t)crc32(0, d, (uInt)len));
			ioc_mig_crcs_free(c);
		}
	}
	free(d);
}

static void test_crc_zero(void)
{
	static const size_t lens[] = { 0, 1, 2, 3, 511, 4096, 4097, 65536, 100000,
				       (1u << 20) + 3, 64u << 20 };
	uint8_t *zeros = calloc(1, 64u << 20);

	ASSERT_NOT_NULL(zeros);
	for (int round = 0; round < 2; round++) /* the second round is cached */
		for (size_t i = 0; i < IOC_ARRAY_SIZE(lens); i++) {
			uint32_t want = (uint32_t)crc32(0, zeros, (uInt)lens[i]);

			ASSERT_UEQ(ioc_mig_crc_zero(lens[i]), want);
			ASSERT_UEQ(ioc_mig_crc(zeros, lens[i]), want);
		}
	/* Beyond the cache's 32-bit lengths: 2^32 + 5 zeros, built from 64
	 * MiB of zeros by doubling with zlib's crc32_combine64(). */
	{
		uLong c = crc32(0, zeros, 64u << 20);
		z_off64_t have = 64 << 20;

		while (have < ((z_off64_t)1 << 32)) {
			c = crc32_combine64(c, c, have);
			have *= 2;
		}
		c = crc32(c, zeros, 5);
		ASSERT_UEQ(ioc_mig_crc_zero(((size_t)1 << 32) + 5), (uint32_t)c);
	}
	free(zeros);
}

static void test_crcs(void)
{
	struct mt_stream s;
	struct ioc_mig_crcs *c;
	uint64_t missing = 99;
	uint32_t sum = 1;
	uint8_t *img;

	/* 5 blocks of 4096, the last one 100 bytes. */
	mt_begin(&s, 4 * 4096 + 100, 4096);
	img = s.model;
	mt_fill(img, (size_t)s.image_size, 9, 0);
	memset(img + 4096, 0, 4096);

	ASSERT_EQ(ioc_mig_crcs_new(&c, 0, 4096), -EINVAL);
	ASSERT_EQ(ioc_mig_crcs_new(&c, 4096, 3000), -EINVAL);
	ASSERT_EQ(ioc_mig_crcs_new(&c, (IOC_MIG_MAX_BLOCKS + 1) * 4096, 4096), -EFBIG);
	ASSERT_OK(ioc_mig_crcs_new(&c, s.image_size, 4096));
	ASSERT_EQ(ioc_mig_crcs_checksum(c, &sum, &missing), -ENODATA);
	ASSERT_UEQ(missing, 0);
	ioc_mig_crcs_set(c, 0, 4096, img);
	ioc_mig_crcs_set(c, 4096, 4096, NULL);         /* zeros */
	ioc_mig_crcs_set(c, 3 * 4096, 4096 + 100, img + 3 * 4096); /* to the end */
	ASSERT_EQ(ioc_mig_crcs_checksum(c, &sum, &missing), -ENODATA);
	ASSERT_UEQ(missing, 2);
	/* A wrong block first, then rewritten (a later pass). */
	ioc_mig_crcs_set(c, 2 * 4096, 4096, img);
	ASSERT_OK(ioc_mig_crcs_checksum(c, &sum, &missing));
	ASSERT_TRUE(sum != mt_checksum(&s));
	ioc_mig_crcs_set(c, 2 * 4096, 4096, img + 2 * 4096);
	ASSERT_OK(ioc_mig_crcs_checksum(c, &sum, &missing));
	ASSERT_UEQ(sum, mt_checksum(&s));
	ioc_mig_crcs_free(c);
	ioc_mig_crcs_free(NULL);

	/* Many blocks, set out of order, across bitmap words; one missing at
	 * the very end, then in a middle word. */
	{
		uint64_t nb = 200, size = nb * 4096;
		struct mt_stream m;

		mt_begin(&m, size, 4096);
		mt_fill(m.model, (size_t)size, 5, 1);
		ASSERT_OK(ioc_mig_crcs_new(&c, size, 4096));
		for (uint64_t b = 0; b < nb - 1; b++) {
			uint64_t k = (b * 37) % (nb - 1);

			ioc_mig_crcs_set(c, k * 4096, 4096, m.model + k * 4096);
		}
		ASSERT_EQ(ioc_mig_crcs_checksum(c, &sum, &missing), -ENODATA);
		ASSERT_UEQ(missing, nb - 1);
		ioc_mig_crcs_set(c, (nb - 1) * 4096, 4096, m.model + (nb - 1) * 4096);
		ASSERT_OK(ioc_mig_crcs_checksum(c, &sum, &missing));
		ASSERT_UEQ(sum, mt_checksum(&m));
		/* One call over many blocks gives the same per-block CRCs. */
		ioc_mig_crcs_free(c);
		ASSERT_OK(ioc_mig_crcs_new(&c, size, 4096));
		ioc_mig_crcs_set(c, 0, 100 * 4096, m.model);
		ASSERT_EQ(ioc_mig_crcs_checksum(c, &sum, &missing), -ENODATA);
		ASSERT_UEQ(missing, 100);
		ioc_mig_crcs_set(c, 100 * 4096, size - 100 * 4096, m.model + 100 * 4096);
		ASSERT_OK(ioc_mig_crcs_checksum(c, &sum, &missing));
		ASSERT_UEQ(sum, mt_checksum(&m));
		ioc_mig_crcs_free(c);
		mt_free(&m);
	}
	mt_free(&s);
}

IOC_TEST_MAIN(
	IOC_TEST(test_hdr_round_trip),
	IOC_TEST(test_hdr_rejects),
	IOC_TEST(test_rec_round_trip),
	IOC_TEST(test_rec_rejects),
	IOC_TEST(test_handover),
	IOC_TEST(test_payload),
	IOC_TEST(test_crc_data),
	IOC_TEST(test_crc_zero),
	IOC_TEST(test_crcs),
)
