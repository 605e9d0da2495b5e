/*
 * The control socket's commands: QEMU's names, arguments and result
 * fields for what iocore-nbd shares with qemu-storage-daemon (dirty
 * bitmaps, block nodes, exports, statistics), and names under the
 * __org.iocore_ prefix, QEMU's rule for vendor extensions, for the rest.
 *
 * Every export is a block node whose node name is the export name.  A
 * compressed export is a node of a vendor format, __org.iocore_zip (its
 * frame cache and decode counters in its image info), or its overlay over
 * it, shown as QEMU shows a backing chain; the bitmap commands refuse
 * it, since nothing tracks its changes.
 *
 * The table below is the only list of commands: qmp.c dispatches from
 * it, checks arguments against its specs, and query-commands prints it.
 *
 * Threads: everything here runs on the server's main loop.  Statistics
 * come from counters the I/O threads own (relaxed reads); the per-
 * connection snapshot runs on each I/O thread through ioc_loop_call(),
 * which blocks the main loop for one round trip per thread and nothing
 * else.  Bitmap changes are the block layer's management calls, which
 * the I/O threads never make.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ioc-config.h"
#include "iocore/zip.h"
#include "migrate-int.h"
#include "nbd-int.h"
#include "qmp/qmp.h"

struct ioc__nbd_control {
	struct ioc_nbd_server *srv;
	struct ioc__qmp *qmp;
	struct ioc_nbd_control_opts o;
	char package[64];
	int version[3];            /* major, minor, micro of IOC_VERSION */
};

/* ---- helpers ---------------------------------------------------------- */

static void errf(struct ioc__qmp_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void errf(struct ioc__qmp_err *err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err->desc, sizeof(err->desc), fmt, ap);
	va_end(ap);
}

/* The node of a bitmap command: an export of the block layer. */
static struct ioc__nbd_export *find_node(struct ioc__nbd_control *ctl, const char *node,
					 struct ioc__qmp_err *err)
{
	struct ioc_nbd_server *srv = ctl->srv;

	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		if (!srv->exports[i] || strcmp(srv->exports[i]->name, node) != 0)
			continue;
		if (srv->exports[i]->blk)
			return srv->exports[i];
		/* A compressed export is a node, but its changes are not
		 * tracked (an overlay could be, one day). */
		errf(err, "Node '%s' is a compressed image: dirty bitmaps are not "
		     "supported on it", node);
		return NULL;
	}
	errf(err, "Cannot find device='%s' nor node-name='%s'", node, node);
	return NULL;
}

static struct ioc_blk_dirty *find_bitmap(struct ioc__nbd_control *ctl, json_t *args,
					 const char *key, struct ioc__nbd_export **pe,
					 struct ioc__qmp_err *err)
{
	const char *node = json_string_value(json_object_get(args, "node"));
	const char *name = json_string_value(json_object_get(args, key));
	struct ioc__nbd_export *e = find_node(ctl, node, err);
	struct ioc_blk_dirty *bm;

	if (!e)
		return NULL;
	/* A migration's own bitmap is not the user's to touch. */
	bm = strcmp(name, IOC_MIG_BITMAP) == 0 ? NULL : ioc_blk_dirty_find(e->blk, name);
	if (!bm)
		errf(err, "Dirty bitmap '%s' not found", name);
	if (pe)
		*pe = e;
	return bm;
}

/* The block layer's errors in QEMU's words. */
static json_t *bitmap_result(int r, const char *name, struct ioc__qmp_err *err)
{
	if (r == 0)
		return json_object();
	if (r == -EUCLEAN)
		errf(err, "Bitmap '%s' is inconsistent and cannot be used", name);
	else
		errf(err, "Bitmap '%s': %s", name, strerror(-r));
	return NULL;
}

/* ---- commands --------------------------------------------------------- */

static json_t *cmd_query_version(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;

	return json_pack("{s:{s:i,s:i,s:i},s:s}", "qemu", "major", ctl->version[0],
			 "minor", ctl->version[1], "micro", ctl->version[2],
			 "package", ctl->package);
}

static json_t *cmd_query_commands(void *ctx, json_t *args, struct ioc__qmp_err *err);

static json_t *cmd_quit(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;

	if (ctl->o.quit)
		ctl->o.quit(ctl->o.opaque);
	return json_object();
}

static json_t *cmd_bitmap_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	const char *node = json_string_value(json_object_get(args, "node"));
	const char *name = json_string_value(json_object_get(args, "name"));
	json_t *g = json_object_get(args, "granularity");
	struct ioc_blk_dirty_opts o = {
		.name = name,
		.granularity = g ? (uint64_t)json_integer_value(g) : 0,
		.persistent = json_is_true(json_object_get(args, "persistent")),
		.disabled = json_is_true(json_object_get(args, "disabled")),
	};
	struct ioc__nbd_export *e = find_node(ctl, node, err);
	int r;

	if (!e)
		return NULL;
	if (g && (o.granularity < IOC_BLK_DIRTY_GRAN_MIN ||
		  o.granularity > IOC_BLK_DIRTY_GRAN_MAX ||
		  (o.granularity & (o.granularity - 1)))) {
		errf(err, "Granularity must be power of 2 between %u and %u",
		     IOC_BLK_DIRTY_GRAN_MIN, IOC_BLK_DIRTY_GRAN_MAX);
		return NULL;
	}
	r = ioc_blk_dirty_add(e->blk, &o, NULL);
	switch (r) {
	case 0:
		return json_object();
	case -EEXIST:
		errf(err, "Bitmap already exists: %s", name);
		return NULL;
	case -EINVAL:
		errf(err, o.persistent ? "Bitmap name '%s' is not valid for a persistent "
		     "bitmap (1 to 127 of A-Z a-z 0-9 _ - ., not starting with '.')" :
		     "Bitmap name '%s' is not valid (1 to 127 bytes)", name);
		return NULL;
	case -ENOSPC:
		errf(err, "Too many bitmaps on node '%s' (at most %d)", node,
		     IOC_BLK_DIRTY_MAX);
		return NULL;
	case -ENOTSUP:
		errf(err, "Can't store persistent bitmaps to disk: %s", strerror(-r));
		return NULL;
	default:
		errf(err, "Cannot add bitmap '%s': %s", name, strerror(-r));
		return NULL;
	}
}

static json_t *cmd_bitmap_remove(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_export *e;
	struct ioc_blk_dirty *bm = find_bitmap(ctx, args, "name", &e, err);

	if (!bm)
		return NULL;
	return bitmap_result(ioc_blk_dirty_remove(e->blk,
			json_string_value(json_object_get(args, "name"))),
			json_string_value(json_object_get(args, "name")), err);
}

static json_t *cmd_bitmap_clear(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc_blk_dirty *bm = find_bitmap(ctx, args, "name", NULL, err);

	return bm ? bitmap_result(ioc_blk_dirty_clear(bm),
				  json_string_value(json_object_get(args, "name")), err)
		  : NULL;
}

static json_t *set_recording(void *ctx, json_t *args, bool on, struct ioc__qmp_err *err)
{
	struct ioc_blk_dirty *bm = find_bitmap(ctx, args, "name", NULL, err);

	return bm ? bitmap_result(ioc_blk_dirty_set_recording(bm, on),
				  json_string_value(json_object_get(args, "name")), err)
		  : NULL;
}

static json_t *cmd_bitmap_enable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return set_recording(ctx, args, true, err);
}

static json_t *cmd_bitmap_disable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return set_recording(ctx, args, false, err);
}

/* bitmaps: ["name", {"node": N, "name": B}, ...] (QEMU's BlockDirtyBitmapOrStr).
 * Every source is found before anything is merged. */
static json_t *cmd_bitmap_merge(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc__nbd_export *e;
	struct ioc_blk_dirty *dst = find_bitmap(ctl, args, "target", &e, err);
	struct ioc_blk_dirty *src[64];
	json_t *list = json_object_get(args, "bitmaps"), *v;
	size_t i, n = json_array_size(list);

	if (!dst)
		return NULL;
	if (n > IOC_ARRAY_SIZE(src)) {
		errf(err, "Parameter 'bitmaps' has more than %zu elements",
		     IOC_ARRAY_SIZE(src));
		return NULL;
	}
	json_array_foreach(list, i, v) {
		struct ioc__nbd_export *se = e;
		const char *name;

		if (json_is_string(v)) {
			name = json_string_value(v);
		} else if (json_is_object(v) &&
			   json_is_string(json_object_get(v, "node")) &&
			   json_is_string(json_object_get(v, "name")) &&
			   json_object_size(v) == 2) {
			se = find_node(ctl, json_string_value(json_object_get(v, "node")), err);
			if (!se)
				return NULL;
			name = json_string_value(json_object_get(v, "name"));
		} else {
			errf(err, "Parameter 'bitmaps[%zu]' expects a bitmap name or "
			     "{\"node\", \"name\"}", i);
			return NULL;
		}
		src[i] = ioc_blk_dirty_find(se->blk, name);
		if (!src[i]) {
			errf(err, "Dirty bitmap '%s' not found", name);
			return NULL;
		}
	}
	for (i = 0; i < n; i++) {
		int r = ioc_blk_dirty_merge(dst, src[i]);
		struct ioc_blk_dirty_info di, si;

		if (r == -EINVAL) {
			errf(err, "Bitmaps are incompatible and can't be merged");
			return NULL;
		}
		if (r < 0) {
			ioc_blk_dirty_get_info(dst, &di);
			ioc_blk_dirty_get_info(src[i], &si);
			return bitmap_result(r, di.inconsistent ? di.name : si.name, err);
		}
	}
	return json_object();
}

static json_t *bitmaps_json(struct ioc_blk *blk)
{
	struct ioc_blk_dirty_info info[IOC_BLK_DIRTY_MAX];
	int n = ioc_blk_dirty_list(blk, info, IOC_BLK_DIRTY_MAX);
	json_t *a = json_array();

	/* Newest first, as QEMU lists them. */
	for (int i = n - 1; i >= 0 && a; i--) {
		if (strcmp(info[i].name, IOC_MIG_BITMAP) == 0)
			continue; /* a migration's, hidden */
		json_t *b = json_pack("{s:s,s:b,s:b,s:b,s:I,s:I}", "name", info[i].name,
				      "recording", info[i].recording,
				      "persistent", info[i].persistent, "busy", 0,
				      "granularity", (json_int_t)info[i].granularity,
				      "count", (json_int_t)info[i].count);

		if (b && info[i].inconsistent)
			json_object_set_new(b, "inconsistent", json_true());
		json_array_append_new(a, b);
	}
	return a;
}

/* QEMU's ImageInfo for one file: path, the format it is read as, the
 * size it serves and what it takes on disk. */
static json_t *image_json(const char *path, const char *format, uint64_t vsize)
{
	struct stat st;
	uint64_t actual = 0;

	if (path && stat(path, &st) == 0)
		actual = (uint64_t)st.st_blocks * 512;
	return json_pack("{s:I,s:s,s:s,s:I,s:b}", "virtual-size", (json_int_t)vsize,
			 "filename", path ? path : "", "format", format,
			 "actual-size", (json_int_t)actual, "dirty-flag", 0);
}

/* QEMU's BlockDeviceInfo around an image (steals it); no I/O limits. */
static json_t *node_json(const char *name, const char *drv, const char *file, bool ro,
			 const char *backing, json_t *image, bool direct)
{
	json_t *n = json_pack("{s:s,s:s,s:s,s:b,s:b,s:s,s:i,s:o,s:{s:b,s:b,s:b},"
			      "s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
		"node-name", name, "drv", drv, "file", file, "ro", ro, "encrypted", 0,
		"detect_zeroes", "off", "backing_file_depth", backing ? 1 : 0,
		"image", image, "cache", "no-flush", 0, "direct", direct, "writeback", 1,
		"bps", 0, "bps_rd", 0, "bps_wr", 0, "iops", 0, "iops_rd", 0,
		"iops_wr", 0, "write_threshold", 0);

	if (n && backing)
		json_object_set_new(n, "backing_file", json_string(backing));
	return n;
}

#define ZIP_FORMAT "__org.iocore_zip"
#define OVERLAY_FORMAT "__org.iocore_zip-overlay"

/* A compressed export: the image (format __org.iocore_zip, with its
 * frame cache and decode counters), or the overlay (__org.iocore_zip-
 * overlay) with the image as its backing, as QEMU shows a backing chain. */
static json_t *zip_node_json(struct ioc__nbd_export *e)
{
	struct ioc_zip_image_info zi;
	struct ioc_zip_overlay_info oi;
	json_t *base, *img;

	ioc_zip_image_get_info(e->zip, &zi);
	base = image_json(zi.path, ZIP_FORMAT, zi.size);
	if (!base)
		return NULL;
	json_object_set_new(base, "__org.iocore_zip", json_pack(
		"{s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
		"frames", (json_int_t)zi.frames, "zero-frames", (json_int_t)zi.zero_frames,
		"indexed-by", zi.indexed_by ? zi.indexed_by : "",
		"frame-cache-size", (json_int_t)zi.cache_budget,
		"frame-cache-bytes", (json_int_t)zi.cache_bytes,
		"cache-hits", (json_int_t)zi.cache_hits,
		"cache-misses", (json_int_t)zi.cache_misses,
		"cache-evictions", (json_int_t)zi.cache_evictions,
		"cache-admitted", (json_int_t)zi.cache_admitted,
		"decodes", (json_int_t)zi.decodes,
		"readahead-decodes", (json_int_t)zi.readaheads,
		"in-place-decodes", (json_int_t)zi.direct_decodes,
		"stored-reads", (json_int_t)zi.stored_reads,
		"stored-checks", (json_int_t)zi.stored_checks,
		"page-checks", (json_int_t)zi.page_checks,
		"streaming-reads", (json_int_t)zi.stream_reads,
		"errors", (json_int_t)zi.errors));
	if (!e->zip_overlay)
		return node_json(e->name, ZIP_FORMAT, zi.path, true, NULL, base, false);
	ioc_zip_overlay_get_info(e->zip_overlay, &oi);
	img = image_json(oi.path, OVERLAY_FORMAT, oi.size);
	if (!img) {
		json_decref(base);
		return NULL;
	}
	json_object_set_new(img, "cluster-size", json_integer((json_int_t)oi.cluster_size));
	json_object_set_new(img, "backing-filename", json_string(zi.path));
	json_object_set_new(img, "full-backing-filename", json_string(zi.path));
	json_object_set_new(img, "backing-filename-format", json_string(ZIP_FORMAT));
	json_object_set_new(img, "backing-image", base);
	json_object_set_new(img, "__org.iocore_zip-overlay", json_pack("{s:I,s:I}",
		"clusters-written", (json_int_t)oi.clusters_written,
		"clusters-zero", (json_int_t)oi.clusters_zero));
	return node_json(e->name, OVERLAY_FORMAT, oi.path, e->read_only, zi.path, img, false);
}

static json_t *cmd_query_named_block_nodes(void *ctx, json_t *args,
					   struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	for (unsigned i = 0; i < srv->cfg.nexports && list; i++) {
		struct ioc__nbd_export *e = srv->exports[i];
		struct ioc_blk_info bi;

		if (!e)
			continue;
		const char *drv;
		json_t *n;

		if (e->zip) {
			json_array_append_new(list, zip_node_json(e));
			continue;
		}
		if (!e->blk)
			continue;
		ioc_blk_get_info(e->blk, &bi);
		drv = bi.is_blockdev ? "host_device" : "file";
		n = node_json(e->name, drv, bi.path ? bi.path : "", e->read_only, NULL,
			      image_json(bi.path, drv, e->size), bi.direct);
		if (n)
			json_object_set_new(n, "dirty-bitmaps", bitmaps_json(e->blk));
		json_array_append_new(list, n);
	}
	return list;
}

static json_t *cmd_query_block_exports(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	bool down = atomic_load_explicit(&srv->stopping, memory_order_relaxed);
	json_t *list = json_array();

	for (unsigned i = 0; i < srv->cfg.nexports && list; i++)
		if (srv->exports[i])
			json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}",
			"id", srv->exports[i]->name, "type", "nbd",
			"node-name", srv->exports[i]->name, "shutting-down", down));
	return list;
}

static uint64_t rd(_Atomic uint64_t *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

/* Sum src into dst (plain snapshot). */
static void stats_add(struct ioc__nbd_stats *dst, struct ioc__nbd_stats *src)
{
	for (int k = 0; k < IOC__NBD_ST_N; k++) {
		atomic_init(&dst->op[k].ops, rd(&dst->op[k].ops) + rd(&src->op[k].ops));
		atomic_init(&dst->op[k].bytes, rd(&dst->op[k].bytes) + rd(&src->op[k].bytes));
		atomic_init(&dst->op[k].failed, rd(&dst->op[k].failed) + rd(&src->op[k].failed));
		atomic_init(&dst->op[k].ns, rd(&dst->op[k].ns) + rd(&src->op[k].ns));
	}
	if (rd(&src->wr_highest) > rd(&dst->wr_highest))
		atomic_init(&dst->wr_highest, rd(&src->wr_highest));
}

static json_t *cmd_query_blockstats(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	/* Without query-nodes QEMU lists devices, and a storage daemon has none. */
	if (!json_is_true(json_object_get(args, "query-nodes")))
		return list;
	for (unsigned i = 0; i < srv->cfg.nexports && list; i++) {
		struct ioc__nbd_stats s;

		if (!srv->exports[i])
			continue;
		struct ioc__nbd_opstat *o = s.op;
		uint64_t wr_ops, wr_bytes, wr_failed, wr_ns;

		memset(&s, 0, sizeof(s));
		for (unsigned t = 0; srv->threads && t < srv->opts.iothreads; t++)
			if (srv->threads[t].xstats)
				stats_add(&s, &srv->threads[t].xstats[i]);
		/* QEMU counts write-zeroes as writes. */
		wr_ops = rd(&o[IOC__NBD_ST_WRITE].ops) + rd(&o[IOC__NBD_ST_ZERO].ops);
		wr_bytes = rd(&o[IOC__NBD_ST_WRITE].bytes) + rd(&o[IOC__NBD_ST_ZERO].bytes);
		wr_failed = rd(&o[IOC__NBD_ST_WRITE].failed) + rd(&o[IOC__NBD_ST_ZERO].failed);
		wr_ns = rd(&o[IOC__NBD_ST_WRITE].ns) + rd(&o[IOC__NBD_ST_ZERO].ns);
		json_t *stats = json_pack(
			"{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
			"s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:b,s:b,s:[]}",
			"rd_bytes", (json_int_t)rd(&o[IOC__NBD_ST_READ].bytes),
			"wr_bytes", (json_int_t)wr_bytes,
			"unmap_bytes", (json_int_t)rd(&o[IOC__NBD_ST_TRIM].bytes),
			"rd_operations", (json_int_t)rd(&o[IOC__NBD_ST_READ].ops),
			"wr_operations", (json_int_t)wr_ops,
			"flush_operations", (json_int_t)rd(&o[IOC__NBD_ST_FLUSH].ops),
			"unmap_operations", (json_int_t)rd(&o[IOC__NBD_ST_TRIM].ops),
			"failed_rd_operations", (json_int_t)rd(&o[IOC__NBD_ST_READ].failed),
			"failed_wr_operations", (json_int_t)wr_failed,
			"failed_flush_operations", (json_int_t)rd(&o[IOC__NBD_ST_FLUSH].failed),
			"failed_unmap_operations", (json_int_t)rd(&o[IOC__NBD_ST_TRIM].failed),
			"rd_total_time_ns", (json_int_t)rd(&o[IOC__NBD_ST_READ].ns),
			"wr_total_time_ns", (json_int_t)wr_ns,
			"flush_total_time_ns", (json_int_t)rd(&o[IOC__NBD_ST_FLUSH].ns),
			"unmap_total_time_ns", (json_int_t)rd(&o[IOC__NBD_ST_TRIM].ns),
			"wr_highest_offset", (json_int_t)rd(&s.wr_highest),
			"rd_merged", (json_int_t)0, "wr_merged", (json_int_t)0,
			"unmap_merged", (json_int_t)0,
			"invalid_rd_operations", 0, "invalid_wr_operations", 0,
			"invalid_flush_operations", 0, "invalid_unmap_operations", 0,
			"account_invalid", 0, "account_failed", 1, "timed_stats");
		json_array_append_new(list, json_pack("{s:s,s:o}", "node-name",
						      srv->exports[i]->name, "stats", stats));
	}
	return list;
}

struct conn_query {
	struct nbd_thread *t;
	struct ioc__nbd_conn_info *out;
	unsigned max, n;
};

static int conn_query_fn(void *arg)
{
	struct conn_query *cq = arg;

	cq->n = ioc__nbd_thread_conn_info(cq->t, cq->out, cq->max);
	return 0;
}

static json_t *opstat_json(struct ioc__nbd_opstat *o)
{
	return json_pack("{s:I,s:I,s:I,s:I}", "operations", (json_int_t)rd(&o->ops),
			 "bytes", (json_int_t)rd(&o->bytes), "failed", (json_int_t)rd(&o->failed),
			 "total-time-ns", (json_int_t)rd(&o->ns));
}

static json_t *cmd_query_connections(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	static const char *const names[IOC__NBD_ST_N] = {
		"read", "write", "flush", "trim", "write-zeroes", "block-status", "cache",
	};
	enum { MAXC = 1024 };
	struct ioc__nbd_conn_info *ci = calloc(MAXC, sizeof(*ci));
	json_t *list = json_array();

	if (!ci || !list) {
		free(ci);
		json_decref(list);
		errf(err, "out of memory");
		return NULL;
	}
	for (unsigned t = 0; t < srv->nthreads; t++) {
		struct conn_query cq = { &srv->threads[t], ci, MAXC, 0 };

		ioc_loop_call(srv->threads[t].loop, conn_query_fn, &cq);
		for (unsigned i = 0; i < cq.n && i < MAXC; i++) {
			json_t *req = json_object(), *c;
			uint64_t errors = 0;

			for (int k = 0; k < IOC__NBD_ST_N; k++) {
				json_object_set_new(req, names[k], opstat_json(&ci[i].st.op[k]));
				errors += rd(&ci[i].st.op[k].failed);
			}
			c = json_pack("{s:s,s:s,s:i,s:b,s:b,s:I,s:I,s:o}",
				      "address", ci[i].peer, "export", ci[i].export_name,
				      "thread", (int)ci[i].thread, "transmission",
				      ci[i].transmission, "tls", ci[i].tls,
				      "in-flight", (json_int_t)ci[i].inflight,
				      "errors", (json_int_t)errors, "requests", req);
			json_array_append_new(list, c);
		}
	}
	free(ci);
	return list;
}

/* The I/O threads' adaptive polling counters (relaxed reads, any thread:
 * no round trip to the threads). */
static json_t *cmd_query_polling(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	struct ioc__nbd_control *ctl = ctx;
	struct ioc_nbd_server *srv = ctl->srv;
	json_t *list = json_array();

	if (!list) {
		errf(err, "out of memory");
		return NULL;
	}
	for (unsigned t = 0; t < srv->nthreads; t++) {
		struct ioc_loop_poll_stats ps;

		ioc_loop_get_poll_stats(srv->threads[t].loop, &ps);
		json_array_append_new(list, json_pack(
			"{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I,s:I}",
			"thread", (int)t,
			"poll-ns-total", (json_int_t)ps.poll_ns_total,
			"polls", (json_int_t)ps.polls,
			"polls-hit", (json_int_t)ps.polls_hit,
			"polls-empty", (json_int_t)ps.polls_empty,
			"backoffs", (json_int_t)ps.backoffs,
			"sleeps", (json_int_t)ps.sleeps,
			"poll-ns-current", (json_int_t)ps.poll_ns,
			"backing-off", ps.backing_off,
			/* relaxed: counters, written by that thread only. */
			"rests", (json_int_t)atomic_load_explicit(&srv->threads[t].rests,
								  memory_order_relaxed),
			"rests-late", (json_int_t)atomic_load_explicit(
				&srv->threads[t].rests_late, memory_order_relaxed)));
	}
	return list;
}

/* Migration (migrate-source.c, migrate-dest.c): the handlers take the
 * server. */
#define MIG_CMD(fn, impl) \
	static json_t *fn(void *ctx, json_t *args, struct ioc__qmp_err *err) \
	{ return impl(((struct ioc__nbd_control *)ctx)->srv, args, err); }
MIG_CMD(cmd_mig_set_caps, ioc__nbd_mig_set_caps)
MIG_CMD(cmd_mig_query_caps, ioc__nbd_mig_query_caps)
MIG_CMD(cmd_mig_set_params, ioc__nbd_mig_set_params)
MIG_CMD(cmd_mig_query_params, ioc__nbd_mig_query_params)
MIG_CMD(cmd_mig_migrate, ioc__nbd_mig_migrate)
MIG_CMD(cmd_mig_query, ioc__nbd_mig_query)
MIG_CMD(cmd_mig_continue, ioc__nbd_mig_continue)
MIG_CMD(cmd_mig_cancel, ioc__nbd_mig_cancel)
MIG_CMD(cmd_mig_incoming, ioc__nbd_mig_incoming)
#undef MIG_CMD

void ioc__nbd_control_event(struct ioc__nbd_control *ctl, const char *name,
			    json_t *data)
{
	if (!ctl) {
		json_decref(data);
		return;
	}
	ioc__qmp_event(ctl->qmp, name, data);
}

/* ---- the table --------------------------------------------------------- */

static const struct ioc__qmp_arg args_caps[] = {
	{ "enable", IOC_QMP_ARRAY, true, .elem = IOC_QMP_ANY }, { NULL },
};
static const struct ioc__qmp_arg args_add[] = {
	{ "node", IOC_QMP_STR, false }, { "name", IOC_QMP_STR, false },
	{ "granularity", IOC_QMP_UINT, true }, { "persistent", IOC_QMP_BOOL, true },
	{ "disabled", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_bitmap[] = {
	{ "node", IOC_QMP_STR, false }, { "name", IOC_QMP_STR, false }, { NULL },
};
static const struct ioc__qmp_arg args_merge[] = {
	{ "node", IOC_QMP_STR, false }, { "target", IOC_QMP_STR, false },
	{ "bitmaps", IOC_QMP_ARRAY, false, .elem = IOC_QMP_ANY }, { NULL },
};
static const struct ioc__qmp_arg args_nodes[] = {
	{ "flat", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_blockstats[] = {
	{ "query-nodes", IOC_QMP_BOOL, true }, { NULL },
};

static const struct ioc__qmp_arg args_mig_caps[] = {
	{ "capabilities", IOC_QMP_ARRAY, false, .elem = IOC_QMP_ANY }, { NULL },
};
static const struct ioc__qmp_arg args_mig_params[] = {
	{ "compress-level", IOC_QMP_UINT, true },
	{ "compress-threads", IOC_QMP_UINT, true },
	{ "compress-wait-thread", IOC_QMP_BOOL, true },
	{ "decompress-threads", IOC_QMP_UINT, true },
	{ "max-bandwidth", IOC_QMP_UINT, true },
	{ "downtime-limit", IOC_QMP_UINT, true },
	{ "__org.iocore_granularity", IOC_QMP_UINT, true },
	{ "__org.iocore_active-mirror", IOC_QMP_STR, true },
	{ "__org.iocore_write-admission", IOC_QMP_UINT, true },
	{ "tls-creds", IOC_QMP_STR, true },
	{ "tls-hostname", IOC_QMP_STR, true },
	{ "throttle-trigger-threshold", IOC_QMP_UINT, true },
	{ "cpu-throttle-initial", IOC_QMP_UINT, true },
	{ "cpu-throttle-increment", IOC_QMP_UINT, true },
	{ "cpu-throttle-tailslow", IOC_QMP_BOOL, true },
	{ "max-cpu-throttle", IOC_QMP_UINT, true },
	{ NULL },
};
static const struct ioc__qmp_arg args_migrate[] = {
	{ "uri", IOC_QMP_STR, false }, { "blk", IOC_QMP_BOOL, true },
	{ "inc", IOC_QMP_BOOL, true }, { "detach", IOC_QMP_BOOL, true },
	{ "resume", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg args_mig_continue[] = {
	{ "state", IOC_QMP_STR, false }, { NULL },
};
static const struct ioc__qmp_arg args_mig_incoming[] = {
	{ "uri", IOC_QMP_STR, false }, { NULL },
};

static const struct ioc__qmp_cmd commands[] = {
	{ "qmp_capabilities", NULL, args_caps },
	{ "query-version", cmd_query_version, NULL },
	{ "query-commands", cmd_query_commands, NULL },
	{ "quit", cmd_quit, NULL },
	{ "block-dirty-bitmap-add", cmd_bitmap_add, args_add },
	{ "block-dirty-bitmap-remove", cmd_bitmap_remove, args_bitmap },
	{ "block-dirty-bitmap-clear", cmd_bitmap_clear, args_bitmap },
	{ "block-dirty-bitmap-enable", cmd_bitmap_enable, args_bitmap },
	{ "block-dirty-bitmap-disable", cmd_bitmap_disable, args_bitmap },
	{ "block-dirty-bitmap-merge", cmd_bitmap_merge, args_merge },
	{ "query-named-block-nodes", cmd_query_named_block_nodes, args_nodes },
	{ "query-block-exports", cmd_query_block_exports, NULL },
	{ "query-blockstats", cmd_query_blockstats, args_blockstats },
	{ "__org.iocore_query-connections", cmd_query_connections, NULL },
	{ "__org.iocore_query-polling", cmd_query_polling, NULL },
	{ "migrate-set-capabilities", cmd_mig_set_caps, args_mig_caps },
	{ "query-migrate-capabilities", cmd_mig_query_caps, NULL },
	{ "migrate-set-parameters", cmd_mig_set_params, args_mig_params },
	{ "query-migrate-parameters", cmd_mig_query_params, NULL },
	{ "migrate", cmd_mig_migrate, args_migrate },
	{ "query-migrate", cmd_mig_query, NULL },
	{ "migrate-continue", cmd_mig_continue, args_mig_continue },
	{ "migrate_cancel", cmd_mig_cancel, NULL },
	{ "migrate-incoming", cmd_mig_incoming, args_mig_incoming },
};

static json_t *cmd_query_commands(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	json_t *list = json_array();

	for (size_t i = 0; i < IOC_ARRAY_SIZE(commands) && list; i++)
		json_array_append_new(list, json_pack("{s:s}", "name", commands[i].name));
	return list;
}

/* ---- life ---------------------------------------------------------------- */

int ioc_nbd_server_add_control(struct ioc_nbd_server *srv, int fd,
			       const struct ioc_nbd_control_opts *opts)
{
	struct ioc__nbd_control *ctl;
	struct ioc__qmp_opts qo = {
		.cmds = commands,
		.ncmds = IOC_ARRAY_SIZE(commands),
	};
	int r;

	if (!srv->started || srv->control)
		return -EBUSY;
	ctl = calloc(1, sizeof(*ctl));
	if (!ctl)
		return -ENOMEM;
	ctl->srv = srv;
	if (opts)
		ctl->o = *opts;
	snprintf(ctl->package, sizeof(ctl->package), "iocore-nbd %s", IOC_VERSION);
	/* The greeting's numbers are the package's ("X.Y.Z"). */
	if (sscanf(IOC_VERSION, "%d.%d.%d", &ctl->version[0], &ctl->version[1],
		   &ctl->version[2]) < 2) {
		ctl->version[0] = IOC_VERSION_MAJOR;
		ctl->version[1] = IOC_VERSION_MINOR;
	}
	qo.major = ctl->version[0];
	qo.minor = ctl->version[1];
	qo.micro = ctl->version[2];
	qo.ctx = ctl;
	qo.package = ctl->package;
	r = ioc__qmp_new(&ctl->qmp, srv->main_loop, fd, &qo);
	if (r < 0) {
		free(ctl);
		return r;
	}
	srv->control = ctl;
	return 0;
}

void ioc__nbd_control_stopping(struct ioc__nbd_control *ctl)
{
	struct ioc_nbd_server *srv = ctl->srv;

	for (unsigned i = 0; i < srv->cfg.nexports; i++)
		if (srv->exports[i])
			ioc__qmp_event(ctl->qmp, "BLOCK_EXPORT_DELETED",
			       json_pack("{s:s}", "id", srv->exports[i]->name));
	ioc__qmp_flush(ctl->qmp);
}

void ioc__nbd_control_free(struct ioc__nbd_control *ctl)
{
	if (!ctl)
		return;
	ioc__qmp_flush(ctl->qmp);
	ioc__qmp_free(ctl->qmp);
	free(ctl);
}
