/*
 * Fuzz target: qcow2's parsers (src/node/qcow2-format.c).  The input is
 * an image's first bytes: parsed as a header (read-only and read-write,
 * the file as long as the input); when that passes, the rest of the input
 * is taken as tables under that header's geometry: every 8-byte word as
 * an L1 entry, every word pair as an L2 entry and bitmap (each subcluster),
 * compressed descriptors followed into the input and decoded, every
 * 40-byte window as a snapshot entry, refcount blocks of every width; the
 * bitmap directory the header names, the input's end as a directory, its
 * words as bitmap table entries.
 */
#include <stdlib.h>
#include <string.h>

#include "src/node/qcow2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t word(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct q2_header h;
	char err[256];
	struct q2_geom g;
	uint64_t host, off, len;
	enum q2_kind k;

	if (ioc__qcow2_parse_header(data, size, size, true, &h, err, sizeof(err)) < 0 &&
	    ioc__qcow2_parse_header(data, size, size, false, &h, err, sizeof(err)) < 0)
		return 0;
	g = (struct q2_geom){ h.cluster_bits, (h.incompat & Q2_INCOMPAT_EXT_L2) != 0,
			      h.version >= 3, size };
	/* At most 4096 words: the tables' decoders, not the loop, are under test. */
	for (size_t o = 0; o + 16 <= size && o < 8 * 4096; o += 8) {
		uint64_t e = word(data + o), bm = word(data + o + 8);

		(void)ioc__qcow2_check_l1e(&g, e, err, sizeof(err));
		for (unsigned sc = 0; sc < (g.ext_l2 ? 32u : 1u); sc++)
			if (ioc__qcow2_decode_l2e(&g, e, bm, sc, &k, &host, err, sizeof(err)) < 0)
				break;
		if ((e & Q2_OFLAG_COMPRESSED) && o % 512 == 0 &&
		    ioc__qcow2_compressed_extent(&g, e, &off, &len, err, sizeof(err)) == 0 &&
		    h.cluster_bits <= 16) {
			uint8_t *out = malloc((size_t)1 << h.cluster_bits);

			if (out) {
				(void)ioc__qcow2_decompress(h.compression, data + off, len, out,
							    (size_t)1 << h.cluster_bits);
				free(out);
			}
		}
	}
	/* The bitmap directory where the header says it is (when it is in
	 * the input), and the input's last bytes as a directory of 1..3. */
	if (h.has_bitmaps && h.bitmap_dir_off < size &&
	    h.bitmap_dir_size <= size - h.bitmap_dir_off) {
		struct q2_bitmap_entry *ent = calloc(h.nb_bitmaps ? h.nb_bitmaps : 1,
						     sizeof(*ent));

		if (ent) {
			(void)ioc__qcow2_parse_bitmap_dir(data + h.bitmap_dir_off,
							  (size_t)h.bitmap_dir_size, h.nb_bitmaps,
							  h.size, h.cluster_bits, size, ent, err,
							  sizeof(err));
			free(ent);
		}
	}
	for (uint32_t nb = 1; nb <= 3 && size >= 256; nb++) {
		struct q2_bitmap_entry ent[3];

		(void)ioc__qcow2_parse_bitmap_dir(data + size - 256, 256, nb, h.size,
						  h.cluster_bits, size, ent, err, sizeof(err));
	}
	for (size_t o = 0; o + 8 <= size && o < 8 * 512; o += 8)
		(void)ioc__qcow2_check_bitmap_te(word(data + o), h.cluster_bits, size, err,
						 sizeof(err));
	(void)ioc__qcow2_bitmap_table_size(h.size, 9 + (unsigned)(size % 23), h.cluster_bits);
	for (size_t o = 0; o + Q2_SNAPSHOT_HDR_LEN <= size && o < 4096; o += 8)
		(void)ioc__qcow2_parse_snapshot(data + o, &h, size, (unsigned)o, err, sizeof(err));
	if (size >= 512) {
		uint8_t blk[512];

		memcpy(blk, data, 512);
		for (unsigned order = 0; order <= 6; order++) {
			uint64_t n = 512 * 8 >> order;

			for (uint64_t i = 0; i < n; i += 7) {
				uint64_t v = ioc__qcow2_rc_get(blk, order, i);

				ioc__qcow2_rc_set(blk, order, i, v + 1);
				if (order < 6 && ioc__qcow2_rc_get(blk, order, i) !=
				    ((v + 1) & ((1ull << (1u << order)) - 1)))
					abort();
				if (order == 6 && ioc__qcow2_rc_get(blk, order, i) != v + 1)
					abort();
			}
		}
	}
	return 0;
}
