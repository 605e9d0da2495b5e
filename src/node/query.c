/*
 * What the query commands say of a node, in QEMU's shapes: its entry of
 * query-named-block-nodes (BlockDeviceInfo around the ImageInfo of its
 * chain, with its image's dirty bitmaps) and of query-blockstats (the
 * counters the node layer keeps, with its file and backing children's).
 * Every control socket serialises nodes through here.
 */
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>

#include "dirty-cmd.h"
#include "node-int.h"

static json_t *image_json(struct ioc_node *n)
{
	struct stat st;
	uint64_t actual = 0;
	const char *path = n->filename ? n->filename : "";
	json_t *img;

	if (n->filename && stat(n->filename, &st) == 0)
		actual = (uint64_t)st.st_blocks * 512;
	img = json_pack("{s:I,s:s,s:s,s:I,s:b}", "virtual-size", (json_int_t)n->size,
			"filename", path, "format", n->drv->name,
			"actual-size", (json_int_t)actual, "dirty-flag", 0);
	if (img && n->backing) {
		json_t *b = image_json(n->backing);
		const char *bf = n->backing->filename ? n->backing->filename : "";

		json_object_set_new(img, "backing-filename", json_string(bf));
		json_object_set_new(img, "full-backing-filename", json_string(bf));
		json_object_set_new(img, "backing-filename-format",
				    json_string(n->backing->drv->name));
		if (b)
			json_object_set_new(img, "backing-image", b);
	}
	if (img && n->drv->info)
		n->drv->info(n, img);
	return img;
}

static unsigned chain_depth(struct ioc_node *n)
{
	unsigned d = 0;

	for (n = n->backing; n; n = n->backing)
		d++;
	return d;
}

json_t *ioc_node_info_json(struct ioc_node *n)
{
	const char *dz = !n->detect_zeroes ? "off" : n->detect_zeroes_unmap ? "unmap" : "on";
	json_t *j = json_pack("{s:s,s:s,s:s,s:b,s:b,s:s,s:i,s:o,s:{s:b,s:b,s:b},"
			      "s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
		"node-name", n->name, "drv", n->drv->name,
		"file", n->filename ? n->filename : "", "ro", n->read_only, "encrypted", 0,
		"detect_zeroes", dz, "backing_file_depth", (int)chain_depth(n),
		"image", image_json(n), "cache", "no-flush", n->no_flush, "direct", n->direct,
		"writeback", 1, "bps", 0, "bps_rd", 0, "bps_wr", 0, "iops", 0, "iops_rd", 0,
		"iops_wr", 0, "write_threshold", 0);

	if (j && n->backing && n->backing->filename)
		json_object_set_new(j, "backing_file", json_string(n->backing->filename));
	return j;
}

/* A node, then its implicit children (named ones are listed on their
 * own), as QEMU lists every node of the graph once. */
void ioc_node_query_json(json_t *list, struct ioc_node *n, bool children)
{
	json_t *j = ioc_node_info_json(n);
	struct ioc_blk *blk = ioc_node_dirty_blk(n);

	/* Bitmaps belong to the node whose image keeps them; QEMU leaves the
	 * member out when there are none. */
	if (j && blk && (n->dirty_set || (n->drv->blk && n->drv != ioc_node_drv_find("raw")))) {
		json_t *bm = ioc_node_dirty_list_json(blk);

		if (json_array_size(bm))
			json_object_set_new(j, "dirty-bitmaps", bm);
		else
			json_decref(bm);
	}
	json_array_append_new(list, j);
	if (children && n->file && !n->file->in_graph)
		ioc_node_query_json(list, n->file, true);
	if (children && n->backing && !n->backing->in_graph)
		ioc_node_query_json(list, n->backing, true);
}

static uint64_t rd(_Atomic uint64_t *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

static json_t *stats_json(struct ioc_node *n)
{
	struct ioc_node_stats s;
	struct ioc_node_opstat *o = s.op;

	ioc_node_get_stats(n, &s);
	/* QEMU counts write-zeroes as writes. */
	return json_pack(
		"{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
		"s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:b,s:b,s:[]}",
		"rd_bytes", (json_int_t)rd(&o[IOC_NODE_OP_READ].bytes),
		"wr_bytes", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].bytes) +
					 rd(&o[IOC_NODE_OP_ZERO].bytes)),
		"unmap_bytes", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].bytes),
		"rd_operations", (json_int_t)rd(&o[IOC_NODE_OP_READ].ops),
		"wr_operations", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].ops) +
					      rd(&o[IOC_NODE_OP_ZERO].ops)),
		"flush_operations", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].ops),
		"unmap_operations", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].ops),
		"failed_rd_operations", (json_int_t)rd(&o[IOC_NODE_OP_READ].failed),
		"failed_wr_operations", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].failed) +
						     rd(&o[IOC_NODE_OP_ZERO].failed)),
		"failed_flush_operations", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].failed),
		"failed_unmap_operations", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].failed),
		"rd_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_READ].ns),
		"wr_total_time_ns", (json_int_t)(rd(&o[IOC_NODE_OP_WRITE].ns) +
						 rd(&o[IOC_NODE_OP_ZERO].ns)),
		"flush_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_FLUSH].ns),
		"unmap_total_time_ns", (json_int_t)rd(&o[IOC_NODE_OP_DISCARD].ns),
		"wr_highest_offset", (json_int_t)rd(&s.wr_highest),
		"rd_merged", (json_int_t)0, "wr_merged", (json_int_t)0,
		"unmap_merged", (json_int_t)0,
		"invalid_rd_operations", 0, "invalid_wr_operations", 0,
		"invalid_flush_operations", 0, "invalid_unmap_operations", 0,
		"account_invalid", 0, "account_failed", 1, "timed_stats");
}

json_t *ioc_node_blockstats_json(struct ioc_node *n)
{
	json_t *e = json_pack("{s:s,s:o}", "node-name", n->name, "stats", stats_json(n));

	if (e && n->file)
		json_object_set_new(e, "parent", json_pack("{s:s,s:o}", "node-name",
							   n->file->name, "stats",
							   stats_json(n->file)));
	if (e && n->backing)
		json_object_set_new(e, "backing", json_pack("{s:s,s:o}", "node-name",
							    n->backing->name, "stats",
							    stats_json(n->backing)));
	return e;
}

