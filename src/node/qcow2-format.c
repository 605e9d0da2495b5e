/*
 * qcow2's parsers: the header and its extensions, snapshot entries, L1
 * and L2 entries, compressed descriptors and their payload.
 *
 * Problem: every field of an image is input from whoever made the file,
 * and a field that sizes an allocation or an offset that is followed
 * unchecked is a crash (or a read of the wrong bytes) waiting for an
 * image.  The checks must give QEMU's verdict, since images move between
 * the two, and QEMU's words, since users search for them.
 *
 * Design: pure functions over bytes already read, with no I/O and no
 * state, so the driver, the hostile-image test and the fuzz target run
 * the same code.  The header is parsed from the first cluster only: the
 * format keeps the header, its extensions and the backing file name
 * there, so one bounded read at open is all the parser ever sees.  Each
 * check is in the order QEMU makes it, so the first fault of a badly
 * damaged image gets the same message.  Table entries are checked when
 * they are followed (an L2 table offset when it is loaded, a data
 * cluster when it is read), because an image's tables are too large to
 * check at open and are rewritten while it is open.
 *
 * Rejected: a struct overlaid on the header bytes (packed, then swapped):
 * it hides which bytes exist in a short v3 header, and an extension's
 * length is easier to check against an explicit cursor than a pointer.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "qcow2.h"
#include "util/endian.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)



/* QEMU's qcow2_validate_table(), with the file's end and the header
 * cluster added: a table of entries * entry_len bytes at offset. */
static int check_table(const char *what, uint64_t offset, uint64_t entries,
		       uint64_t entry_len, uint64_t max_bytes, unsigned cluster_bits,
		       uint64_t file_size, char *err, size_t errlen)
{
	if (entries > max_bytes / entry_len) {
		ERR("%s too large", what);
		return -EFBIG;
	}
	if (INT64_MAX - entries * entry_len < offset ||
	    (offset & ((1ull << cluster_bits) - 1))) {
		ERR("%s offset invalid", what);
		return -EINVAL;
	}
	if (entries && offset < (1ull << cluster_bits)) {
		ERR("%s offset invalid (it overlaps the image header)", what);
		return -EINVAL;
	}
	if (entries && offset + entries * entry_len > file_size) {
		ERR("%s offset invalid (the table ends past the end of the file)", what);
		return -EINVAL;
	}
	return 0;
}

static const char *known_incompat_name(unsigned bit)
{
	static const char *const names[] = {
		"dirty bit", "corrupt bit", "external data file", "compression type",
		"extended L2 entries",
	};

	return bit < 5 ? names[bit] : NULL;
}

/* "Unsupported qcow2 feature(s): a, b, Unknown incompatible feature: 60"
 * with names from the image's own feature table when it has them. */
static void report_unsupported(const uint8_t *table, size_t tlen, uint64_t mask,
			       char *err, size_t errlen)
{
	char list[512] = "";
	size_t used = 0;

	for (size_t o = 0; table && o + 48 <= tlen; o += 48) {
		unsigned bit = table[o + 1];

		if (table[o] != 0 || bit > 63 || !(mask & (1ull << bit)))
			continue;
		used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%.46s",
					 used ? ", " : "", (const char *)table + o + 2);
		if (used >= sizeof(list))
			used = sizeof(list) - 1;
		mask &= ~(1ull << bit);
	}
	if (mask)
		snprintf(list + used, sizeof(list) - used, "%sUnknown incompatible feature: %" PRIx64,
			 used ? ", " : "", mask);
	ERR("Unsupported qcow2 feature(s): %s", list);
}

/* The header extensions between the header and ext_end.  The feature
 * table is returned (a pointer into buf) for the caller's messages. */
static int parse_extensions(const uint8_t *buf, uint64_t start, uint64_t ext_end,
			    struct q2_header *h, const uint8_t **ftable, size_t *ftlen,
			    bool quiet, char *err, size_t errlen)
{
	uint64_t off = start;
	bool seen_fmt = false, seen_bitmaps = false, seen_ftable = false;

	while (off < ext_end) {
		uint32_t type, len;

		if (ext_end - off < 8) {
			if (!quiet)
				ERR("qcow2_read_extension: ERROR: pread fail from offset %" PRIu64,
				    off);
			return -EINVAL;
		}
		type = ioc__get_be32(buf + off);
		len = ioc__get_be32(buf + off + 4);
		off += 8;
		if (len > ext_end - off) {
			if (!quiet)
				ERR("Header extension too large");
			return -EINVAL;
		}
		switch (type) {
		case Q2_EXT_END:
			return 0;
		case Q2_EXT_BACKING_FMT:
			if (len >= sizeof(h->backing_fmt)) {
				ERR("ERROR: ext_backing_format: len=%" PRIu32 " too large (>=%zu)",
				    len, sizeof(h->backing_fmt));
				return -EINVAL;
			}
			if (seen_fmt) {
				ERR("ERROR: ext_backing_format: extension repeated");
				return -EINVAL;
			}
			seen_fmt = true;
			memcpy(h->backing_fmt, buf + off, len);
			h->backing_fmt[len] = 0;
			if (memchr(h->backing_fmt, 0, len)) {
				ERR("ERROR: ext_backing_format: format name contains a NUL byte");
				return -EINVAL;
			}
			break;
		case Q2_EXT_FEATURES:
			if (!seen_ftable) {
				*ftable = buf + off;
				*ftlen = len;
			}
			seen_ftable = true;
			break;
		case Q2_EXT_BITMAPS:
			if (len != 24) {
				ERR("bitmaps_ext: Invalid extension length");
				return -EINVAL;
			}
			if (seen_bitmaps) {
				ERR("bitmaps_ext: extension repeated");
				return -EINVAL;
			}
			seen_bitmaps = true;
			/* Without the autoclear bit the bitmaps are known to be
			 * stale: ignored, as QEMU ignores them. */
			if (!(h->autoclear & Q2_AUTOCLEAR_BITMAPS))
				break;
			if (ioc__get_be32(buf + off + 4) != 0) {
				ERR("bitmaps_ext: Reserved field is not zero");
				return -EINVAL;
			}
			h->nb_bitmaps = ioc__get_be32(buf + off);
			h->bitmap_dir_size = ioc__get_be64(buf + off + 8);
			h->bitmap_dir_off = ioc__get_be64(buf + off + 16);
			if (h->nb_bitmaps > Q2_MAX_BITMAPS) {
				ERR("bitmaps_ext: Image has %" PRIu32 " bitmaps, exceeding the QEMU "
				    "supported maximum of %u", h->nb_bitmaps, Q2_MAX_BITMAPS);
				return -EINVAL;
			}
			if (h->nb_bitmaps == 0) {
				ERR("found bitmaps extension with zero bitmaps");
				return -EINVAL;
			}
			if (h->bitmap_dir_off & ((1ull << h->cluster_bits) - 1)) {
				ERR("bitmaps_ext: invalid bitmap directory offset");
				return -EINVAL;
			}
			if (h->bitmap_dir_size > Q2_MAX_BITMAP_DIR) {
				ERR("bitmaps_ext: bitmap directory size (%" PRIu64 ") exceeds the "
				    "maximum supported size (%u)", h->bitmap_dir_size,
				    Q2_MAX_BITMAP_DIR);
				return -EINVAL;
			}
			h->has_bitmaps = true;
			break;
		default:
			/* The crypto header and the data file name matter only
			 * with the features that need them, refused before;
			 * unknown extensions are skipped, as the format says. */
			break;
		}
		off += ((uint64_t)len + 7) & ~7ull;
	}
	return 0;
}

int ioc__qcow2_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
			    bool read_write, struct q2_header *h, char *err, size_t errlen)
{
	const uint8_t *ftable = NULL;
	size_t ftlen = 0;
	uint64_t cs, ext_end, l2_entries, need_l1;
	int ret;

	memset(h, 0, sizeof(*h));
	if (len < Q2_V2_HEADER_LEN || ioc__get_be32(buf) != Q2_MAGIC) {
		ERR("Image is not in qcow2 format");
		return -EINVAL;
	}
	h->version = ioc__get_be32(buf + 4);
	h->backing_off = ioc__get_be64(buf + 8);
	h->backing_len = ioc__get_be32(buf + 16);
	h->cluster_bits = ioc__get_be32(buf + 20);
	h->size = ioc__get_be64(buf + 24) & ~511ull;
	h->crypt_method = ioc__get_be32(buf + 32);
	h->l1_size = ioc__get_be32(buf + 36);
	h->l1_off = ioc__get_be64(buf + 40);
	h->rt_off = ioc__get_be64(buf + 48);
	h->rt_clusters = ioc__get_be32(buf + 56);
	h->nb_snapshots = ioc__get_be32(buf + 60);
	h->snapshots_off = ioc__get_be64(buf + 64);

	if (h->version < 2 || h->version > 3) {
		ERR("Unsupported qcow2 version %" PRIu32, h->version);
		return -ENOTSUP;
	}
	if (h->cluster_bits < Q2_MIN_CLUSTER_BITS || h->cluster_bits > Q2_MAX_CLUSTER_BITS) {
		ERR("Unsupported cluster size: 2^%" PRIu32, h->cluster_bits);
		return -EINVAL;
	}
	cs = 1ull << h->cluster_bits;
	if (h->version == 2) {
		h->refcount_order = 4;
		h->header_len = Q2_V2_HEADER_LEN;
	} else {
		if (len < Q2_V3_HEADER_LEN) {
			ERR("qcow2 header too short");
			return -EINVAL;
		}
		h->incompat = ioc__get_be64(buf + 72);
		h->compat = ioc__get_be64(buf + 80);
		h->autoclear = ioc__get_be64(buf + 88);
		h->refcount_order = ioc__get_be32(buf + 96);
		h->header_len = ioc__get_be32(buf + 100);
		if (h->header_len < Q2_V3_HEADER_LEN) {
			ERR("qcow2 header too short");
			return -EINVAL;
		}
	}
	if (h->header_len > cs) {
		ERR("qcow2 header exceeds cluster size");
		return -EINVAL;
	}
	if (h->header_len % 8) {
		ERR("qcow2 header length %" PRIu32 " is not a multiple of 8", h->header_len);
		return -EINVAL;
	}
	/* Everything the parser reads from here on is in the first cluster,
	 * which the caller gave us whole, or the file ends inside it. */
	if (len < cs && len < file_size) {
		ERR("Could not read qcow2 header: the first cluster was not read whole");
		return -EIO;
	}
	if (h->header_len > len) {
		ERR("Could not read unknown qcow2 header fields");
		return -EIO;
	}
	if (h->backing_off > cs) {
		ERR("Invalid backing file offset");
		return -EINVAL;
	}
	if (h->backing_off && h->backing_off < h->header_len) {
		ERR("Invalid backing file offset (it overlaps the header)");
		return -EINVAL;
	}
	ext_end = h->backing_off ? h->backing_off : cs;
	if (ext_end > len)
		ext_end = len;

	/* Compression type: present when the header reaches byte 104. */
	h->compression = h->header_len > 104 ? buf[104] : Q2_COMP_ZLIB;
	if (h->compression > Q2_COMP_ZSTD) {
		ERR("qcow2: unknown compression type: %u", h->compression);
		return -ENOTSUP;
	}
	if (h->compression == Q2_COMP_ZLIB && (h->incompat & Q2_INCOMPAT_COMPRESS)) {
		ERR("qcow2: Compression type incompatible feature bit must not be set");
		return -EINVAL;
	}
	if (h->compression != Q2_COMP_ZLIB && !(h->incompat & Q2_INCOMPAT_COMPRESS)) {
		ERR("qcow2: Compression type incompatible feature bit must be set");
		return -EINVAL;
	}

	if (h->incompat & ~Q2_INCOMPAT_KNOWN) {
		struct q2_header scratch = *h;

		/* The feature table, if it can be read, names the bits. */
		if (parse_extensions(buf, h->header_len, ext_end, &scratch, &ftable, &ftlen,
				     true, err, errlen) < 0 && !ftable)
			ftlen = 0;
		report_unsupported(ftable, ftlen, h->incompat & ~Q2_INCOMPAT_KNOWN, err, errlen);
		return -ENOTSUP;
	}
	if (h->incompat & Q2_INCOMPAT_DATA_FILE) {
		ERR("qcow2: images with an external data file (incompatible feature '%s') "
		    "are not supported", known_incompat_name(2));
		return -ENOTSUP;
	}
	if (h->autoclear & Q2_AUTOCLEAR_RAW_DATA) {
		ERR("data-file-raw requires a data file");
		return -EINVAL;
	}
	if ((h->incompat & Q2_INCOMPAT_CORRUPT) && read_write) {
		ERR("qcow2: Image is corrupt; cannot be opened read/write");
		return -EACCES;
	}
	/* The dirty bit: the driver repairs the refcounts at a writable
	 * open (qcow2-check.c), and reads need none. */
	if ((h->incompat & Q2_INCOMPAT_EXT_L2) && h->cluster_bits < 14) {
		ERR("Extended L2 entries are only supported with cluster sizes of at least "
		    "16384 bytes");
		return -EINVAL;
	}
	if (h->refcount_order > 6) {
		ERR("Reference count entry width too large; may not exceed 64 bits");
		return -EINVAL;
	}
	if (h->crypt_method) {
		ERR("qcow2: encrypted images (crypt_method %" PRIu32 ") are not supported",
		    h->crypt_method);
		return -ENOTSUP;
	}
	if (h->rt_clusters == 0) {
		ERR("Image does not contain a reference count table");
		return -EINVAL;
	}
	ret = check_table("Reference count table", h->rt_off, h->rt_clusters, cs,
			  Q2_MAX_REFTABLE_BYTES, h->cluster_bits, file_size, err, errlen);
	if (ret < 0)
		return ret;
	ret = check_table("Snapshot table", h->snapshots_off, h->nb_snapshots,
			  Q2_SNAPSHOT_HDR_LEN, Q2_SNAPSHOT_HDR_LEN * Q2_MAX_SNAPSHOTS,
			  h->cluster_bits, file_size, err, errlen);
	if (ret < 0)
		return ret;
	ret = check_table("Active L1 table", h->l1_off, h->l1_size, 8, Q2_MAX_L1_BYTES,
			  h->cluster_bits, file_size, err, errlen);
	if (ret < 0)
		return ret;
	/* Entries per L2 table: 8 bytes each, 16 with extended L2. */
	l2_entries = cs / ((h->incompat & Q2_INCOMPAT_EXT_L2) ? 16 : 8);
	need_l1 = (h->size + cs * l2_entries - 1) / (cs * l2_entries);
	if (h->size > INT64_MAX - cs * l2_entries || need_l1 > INT32_MAX) {
		ERR("Image is too big");
		return -EFBIG;
	}
	if (h->l1_size < need_l1) {
		ERR("L1 table is too small");
		return -EINVAL;
	}
	if (h->l1_size && h->l1_off < h->rt_off + (uint64_t)h->rt_clusters * cs &&
	    h->rt_off < h->l1_off + (uint64_t)h->l1_size * 8) {
		ERR("Active L1 table offset invalid (it overlaps the reference count table)");
		return -EINVAL;
	}

	ret = parse_extensions(buf, h->header_len, ext_end, h, &ftable, &ftlen, false, err,
			       errlen);
	if (ret < 0)
		return ret;

	if (h->backing_off) {
		if (h->backing_len > Q2_MAX_BACKING_NAME || h->backing_len > cs - h->backing_off) {
			ERR("Backing file name too long");
			return -EINVAL;
		}
		if (h->backing_off + h->backing_len > len) {
			ERR("Could not read backing file name");
			return -EIO;
		}
		memcpy(h->backing_file, buf + h->backing_off, h->backing_len);
		h->backing_file[h->backing_len] = 0;
		if (memchr(h->backing_file, 0, h->backing_len)) {
			ERR("Backing file name contains a NUL byte");
			return -EINVAL;
		}
	}
	return 0;
}

int64_t ioc__qcow2_parse_snapshot(const uint8_t *p, const struct q2_header *h,
				  uint64_t file_size, unsigned index, char *err,
				  size_t errlen)
{
	uint64_t l1_off = ioc__get_be64(p);
	uint32_t l1_size = ioc__get_be32(p + 8);
	uint16_t id_len = (uint16_t)(p[12] << 8 | p[13]);
	uint16_t name_len = (uint16_t)(p[14] << 8 | p[15]);
	uint32_t extra = ioc__get_be32(p + 36);
	char what[64];
	int ret;

	if (extra > Q2_MAX_SNAPSHOT_EXTRA) {
		ERR("Too much extra metadata in snapshot table entry %u", index);
		return -EFBIG;
	}
	snprintf(what, sizeof(what), "Snapshot L1 table");
	ret = check_table(what, l1_off, l1_size, 8, Q2_MAX_L1_BYTES, h->cluster_bits,
			  file_size, err, errlen);
	if (ret < 0)
		return ret;
	return (int64_t)(Q2_SNAPSHOT_HDR_LEN + extra + id_len + name_len);
}

int ioc__qcow2_check_l1e(const struct q2_geom *g, uint64_t l1e, char *err, size_t errlen)
{
	uint64_t off = l1e & Q2_L1E_OFFSET_MASK;

	if (!off)
		return 0;
	if (l1e & Q2_L1E_RESERVED) {
		ERR("L1 entry %#" PRIx64 " has reserved bits set", l1e);
		return -EIO;
	}
	if (off & ((1ull << g->cluster_bits) - 1)) {
		ERR("L2 table offset %#" PRIx64 " unaligned", off);
		return -EIO;
	}
	if (off < (1ull << g->cluster_bits) || off > g->file_size ||
	    g->file_size - off < (1ull << g->cluster_bits)) {
		ERR("L2 table offset %#" PRIx64 " is outside the image data", off);
		return -EIO;
	}
	return 0;
}

int ioc__qcow2_decode_l2e(const struct q2_geom *g, uint64_t l2e, uint64_t bitmap,
			  unsigned sc, enum q2_kind *kind, uint64_t *host, char *err,
			  size_t errlen)
{
	uint64_t off = l2e & Q2_L2E_OFFSET_MASK;
	uint64_t cmask = (1ull << g->cluster_bits) - 1;

	*host = 0;
	if (l2e & Q2_OFLAG_COMPRESSED) {
		if (g->ext_l2 && bitmap) {
			ERR("Compressed cluster entry with a non-zero subcluster bitmap");
			return -EIO;
		}
		*kind = Q2_COMPRESSED;
		return 0;
	}
	if (l2e & Q2_L2E_RESERVED) {
		ERR("L2 entry %#" PRIx64 " has reserved bits set", l2e);
		return -EIO;
	}
	if (off & cmask) {
		ERR("Cluster allocation offset %#" PRIx64 " unaligned", off);
		return -EIO;
	}
	if (off && (off < cmask + 1 || off >= g->file_size)) {
		ERR("Data cluster offset %#" PRIx64 " is outside the image data", off);
		return -EIO;
	}
	if (g->ext_l2) {
		uint32_t alloc = (uint32_t)bitmap, zero = (uint32_t)(bitmap >> 32);

		if (l2e & Q2_OFLAG_ZERO) {
			ERR("L2 entry %#" PRIx64 " has the zero flag with extended L2 entries",
			    l2e);
			return -EIO;
		}
		if (alloc & zero) {
			ERR("Subcluster bitmap %#" PRIx64 " marks subclusters both allocated "
			    "and zero", bitmap);
			return -EIO;
		}
		if (alloc && !off) {
			ERR("Subcluster bitmap %#" PRIx64 " marks subclusters allocated with no "
			    "cluster offset", bitmap);
			return -EIO;
		}
		if (alloc & (1u << sc)) {
			*kind = Q2_DATA;
			*host = off;
		} else {
			*kind = zero & (1u << sc) ? Q2_ZERO : Q2_UNALLOC;
		}
		return 0;
	}
	if (l2e & Q2_OFLAG_ZERO) {
		if (!g->v3) {
			ERR("L2 entry %#" PRIx64 " has the zero flag in a version 2 image", l2e);
			return -EIO;
		}
		*kind = Q2_ZERO;
		*host = off;            /* preallocated, or 0 */
		return 0;
	}
	*kind = off ? Q2_DATA : Q2_UNALLOC;
	*host = off;
	return 0;
}

int ioc__qcow2_compressed_extent(const struct q2_geom *g, uint64_t l2e, uint64_t *off,
				 uint64_t *len, char *err, size_t errlen)
{
	unsigned shift = 62 - (g->cluster_bits - 8);
	uint64_t o = l2e & ((1ull << shift) - 1);
	uint64_t sectors = ((l2e >> shift) & ((1ull << (g->cluster_bits - 8)) - 1)) + 1;
	uint64_t n = sectors * 512 - (o & 511);

	if (o >> 56) {
		ERR("Compressed cluster offset %#" PRIx64 " has reserved bits set", o);
		return -EIO;
	}
	if (o < (1ull << g->cluster_bits) || o >= g->file_size) {
		ERR("Compressed cluster offset %#" PRIx64 " is outside the image data", o);
		return -EIO;
	}
	/* The bytes may run into the next cluster, and the final sector
	 * need not exist in the file: clamp to its end. */
	if (n > g->file_size - o)
		n = g->file_size - o;
	*off = o;
	*len = n;
	return 0;
}

int ioc__qcow2_decompress(enum q2_compression type, const uint8_t *in, size_t inlen,
			  uint8_t *out, size_t outlen)
{
	if (type == Q2_COMP_ZLIB) {
		z_stream z;
		int zr;

		memset(&z, 0, sizeof(z));
		/* Raw deflate: QEMU writes it with a 4 KiB window (-12);
		 * the largest window reads any. */
		if (inflateInit2(&z, -15) != Z_OK)
			return -ENOMEM;
		z.next_in = (Bytef *)in;
		z.avail_in = (uInt)inlen;
		z.next_out = out;
		z.avail_out = (uInt)outlen;
		zr = inflate(&z, Z_FINISH);
		inflateEnd(&z);
		/* Done once the cluster is full; the input may go on into
		 * the next cluster's bytes. */
		if ((zr == Z_STREAM_END || zr == Z_BUF_ERROR || zr == Z_OK) && z.avail_out == 0)
			return 0;
		return -EIO;
	}
	if (type == Q2_COMP_ZSTD) {
		ZSTD_DCtx *d = ZSTD_createDCtx();
		ZSTD_inBuffer ib = { in, inlen, 0 };
		ZSTD_outBuffer ob = { out, outlen, 0 };
		int ret = -EIO;

		if (!d)
			return -ENOMEM;
		while (ob.pos < ob.size) {
			size_t r = ZSTD_decompressStream(d, &ob, &ib);

			if (ZSTD_isError(r))
				break;
			if (ob.pos == ob.size) {
				ret = 0;
				break;
			}
			/* A frame ended short of a cluster, or the input ran out. */
			if (r == 0 || ib.pos == ib.size)
				break;
		}
		ZSTD_freeDCtx(d);
		return ret;
	}
	return -EIO;
}

uint64_t ioc__qcow2_rc_get(const uint8_t *blk, unsigned order, uint64_t i)
{
	switch (order) {
	case 3: return blk[i];
	case 4: return (uint64_t)blk[2 * i] << 8 | blk[2 * i + 1];
	case 5: return ioc__get_be32(blk + 4 * i);
	case 6: return ioc__get_be64(blk + 8 * i);
	default: {
		unsigned bits = 1u << order;
		uint64_t bit = i * bits;

		return (blk[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
	}
	}
}

void ioc__qcow2_rc_set(uint8_t *blk, unsigned order, uint64_t i, uint64_t v)
{
	switch (order) {
	case 3: blk[i] = (uint8_t)v; break;
	case 4: blk[2 * i] = (uint8_t)(v >> 8); blk[2 * i + 1] = (uint8_t)v; break;
	case 5: { uint32_t b = htobe32((uint32_t)v); memcpy(blk + 4 * i, &b, 4); break; }
	case 6: { uint64_t b = htobe64(v); memcpy(blk + 8 * i, &b, 8); break; }
	default: {
		unsigned bits = 1u << order;
		uint64_t bit = i * bits;
		uint8_t mask = (uint8_t)(((1u << bits) - 1) << (bit % 8));

		blk[bit / 8] = (uint8_t)((blk[bit / 8] & ~mask) | ((v << (bit % 8)) & mask));
	}
	}
}

/* ---- the bitmaps extension's directory -------------------------------- */

uint64_t ioc__qcow2_bitmap_table_size(uint64_t size, unsigned gran_bits,
				      unsigned cluster_bits)
{
	uint64_t bits = (size >> gran_bits) + ((size & ((1ull << gran_bits) - 1)) != 0);
	uint64_t bytes = (bits + 7) / 8;

	return (bytes + (1ull << cluster_bits) - 1) >> cluster_bits;
}

int ioc__qcow2_check_bitmap_te(uint64_t e, unsigned cluster_bits, uint64_t file_size,
			       char *err, size_t errlen)
{
	uint64_t off = e & Q2_BTE_OFFSET_MASK;

	if (e & Q2_BTE_RESERVED) {
		ERR("bitmap table entry %#" PRIx64 " has reserved bits set", e);
		return -EINVAL;
	}
	if (!off)
		return 0;
	if (e & Q2_BTE_ALL_ONES) {
		ERR("bitmap table entry %#" PRIx64 " has an offset and the all-ones bit", e);
		return -EINVAL;
	}
	if (off & ((1ull << cluster_bits) - 1)) {
		ERR("bitmap table entry %#" PRIx64 " is not cluster aligned", e);
		return -EINVAL;
	}
	if (off < (1ull << cluster_bits) || off > file_size ||
	    file_size - off < (1ull << cluster_bits)) {
		ERR("bitmap table entry %#" PRIx64 " points %s", e,
		    off < (1ull << cluster_bits) ? "into the image header" :
		    "past the end of the file");
		return -EINVAL;
	}
	return 0;
}

int ioc__qcow2_parse_bitmap_dir(const uint8_t *dir, size_t len, uint32_t nb,
				uint64_t image_size, unsigned cluster_bits, uint64_t file_size,
				struct q2_bitmap_entry *out, char *err, size_t errlen)
{
	uint64_t cs = 1ull << cluster_bits;
	size_t off = 0;
	uint32_t i = 0;

	while (off < len) {
		struct q2_bitmap_entry *e = &out[i];
		uint32_t extra;
		size_t elen;

		if (len - off < Q2_BME_HDR_LEN) {
			ERR("Broken bitmap directory");
			return -EINVAL;
		}
		if (i == nb) {
			ERR("More bitmaps found than specified in header extension");
			return -EINVAL;
		}
		e->table_off = ioc__get_be64(dir + off);
		e->table_size = ioc__get_be32(dir + off + 8);
		e->flags = ioc__get_be32(dir + off + 12);
		e->gran_bits = dir[off + 17];
		e->name_len = (uint16_t)(dir[off + 18] << 8 | dir[off + 19]);
		extra = ioc__get_be32(dir + off + 20);
		elen = (size_t)(((uint64_t)Q2_BME_HDR_LEN + e->name_len + extra + 7) & ~7ull);
		if ((uint64_t)Q2_BME_HDR_LEN + e->name_len + extra > len - off ||
		    elen > len - off) {
			ERR("Broken bitmap directory");
			return -EINVAL;
		}
		e->name = (const char *)dir + off + Q2_BME_HDR_LEN + extra;
		if (extra) {
			ERR("Bitmap extra data is not supported");
			return -EINVAL;
		}
#define BAD(...) do {                                                              \
		char why_[160];                                                    \
		snprintf(why_, sizeof(why_), __VA_ARGS__);                         \
		ERR("Bitmap '%.*s' doesn't satisfy the constraints: %s",           \
		    (int)(e->name_len > 200 ? 200 : e->name_len), e->name, why_);  \
		return -EINVAL;                                                    \
	} while (0)
		if (e->table_size == 0)
			BAD("bitmap_table_size is 0");
		if (e->table_off == 0 || (e->table_off & (cs - 1)))
			BAD("bitmap_table_offset %#" PRIx64 " is not a cluster offset",
			    e->table_off);
		if (e->table_size > Q2_BME_MAX_TABLE)
			BAD("bitmap_table_size %" PRIu32 " exceeds %u", e->table_size,
			    Q2_BME_MAX_TABLE);
		if (e->gran_bits < Q2_BME_MIN_GRAN_BITS || e->gran_bits > Q2_BME_MAX_GRAN_BITS)
			BAD("granularity_bits %u is not in %u..%u", e->gran_bits,
			    Q2_BME_MIN_GRAN_BITS, Q2_BME_MAX_GRAN_BITS);
		if (e->flags & ~Q2_BME_KNOWN_FLAGS)
			BAD("flags %#" PRIx32 " has reserved bits", e->flags);
		if (e->name_len == 0 || e->name_len > Q2_BME_MAX_NAME)
			BAD("name_size %u is not in 1..%u", e->name_len, Q2_BME_MAX_NAME);
		if (dir[off + 16] != Q2_BME_TYPE_DIRTY)
			BAD("type %u is not a dirty tracking bitmap (1)", dir[off + 16]);
		if ((uint64_t)e->table_size * cs > Q2_BME_MAX_PHYS)
			BAD("bitmap_table_size %" PRIu32 " clusters exceed %u bytes",
			    e->table_size, Q2_BME_MAX_PHYS);
		if (!(e->flags & Q2_BME_IN_USE) &&
		    image_size > (((uint64_t)e->table_size * cs * 8) << e->gran_bits))
			BAD("bitmap_table_size %" PRIu32 " is too small for the image",
			    e->table_size);
		if (e->table_off < cs || e->table_off > file_size ||
		    file_size - e->table_off < (uint64_t)e->table_size * 8)
			BAD("bitmap_table_offset %#" PRIx64 " %s", e->table_off,
			    e->table_off < cs ? "overlaps the image header" :
			    "ends past the end of the file");
		if (memchr(e->name, 0, e->name_len))
			BAD("the name contains a NUL byte");
		for (uint32_t j = 0; j < i; j++)
			if (out[j].name_len == e->name_len &&
			    memcmp(out[j].name, e->name, e->name_len) == 0)
				BAD("the name is used twice");
#undef BAD
		off += elen;
		i++;
	}
	if (i != nb) {
		ERR("Less bitmaps found than specified in header extension");
		return -EINVAL;
	}
	return 0;
}
