/*
 * The dirty-bitmap commands (block-dirty-bitmap-add, -remove, -clear,
 * -enable, -disable, -merge) and the "dirty-bitmaps" member of a node's
 * query-named-block-nodes entry, in QEMU's names and words, over the
 * bitmaps the block layer keeps for an image.  Shared by every control
 * socket: each finds a node by its name its own way (c->find).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dirty-cmd.h"
#include "node.h"


const struct ioc__qmp_arg ioc_node_dirty_args_add[] = {
	{ "node", IOC_QMP_STR, false }, { "name", IOC_QMP_STR, false },
	{ "granularity", IOC_QMP_UINT, true }, { "persistent", IOC_QMP_BOOL, true },
	{ "disabled", IOC_QMP_BOOL, true }, { NULL },
};
const struct ioc__qmp_arg ioc_node_dirty_args_bitmap[] = {
	{ "node", IOC_QMP_STR, false }, { "name", IOC_QMP_STR, false }, { NULL },
};
const struct ioc__qmp_arg ioc_node_dirty_args_merge[] = {
	{ "node", IOC_QMP_STR, false }, { "target", IOC_QMP_STR, false },
	{ "bitmaps", IOC_QMP_ARRAY, false, .elem = IOC_QMP_ANY }, { NULL },
};

/* The bitmaps' image of the node named node, or NULL with err set. */
static struct ioc_blk *find_blk(const struct ioc_node_dirty_ctx *c, const char *node,
				struct ioc__qmp_err *err)
{
	struct ioc_node *n = c->find(c->ctx, node);
	struct ioc_blk *blk;

	if (!n) {
		ioc__qmp_errf(err, "Cannot find device='%s' nor node-name='%s'", node, node);
		return NULL;
	}
	/* Its bitmaps are being written back or loaded (a hand-over, which
	 * the main loop goes on beside). */
	if (ioc_node_is_changing(n)) {
		ioc__qmp_errf(err, "Node '%s' is being handed over", node);
		return NULL;
	}
	/* A qcow2 node keeps its own set (its persistent bitmaps); a
	 * compressed image's changes are not tracked. */
	blk = ioc_node_dirty_blk(n);
	if (!blk)
		ioc__qmp_errf(err, "Node '%s' (driver %s) does not support dirty bitmaps",
			      node, n->drv->name);
	return blk;
}

static struct ioc_blk_dirty *find_bitmap(const struct ioc_node_dirty_ctx *c, json_t *args,
					 const char *key, struct ioc_blk **pblk,
					 struct ioc__qmp_err *err)
{
	const char *node = json_string_value(json_object_get(args, "node"));
	const char *name = json_string_value(json_object_get(args, key));
	struct ioc_blk *blk = find_blk(c, node, err);
	struct ioc_blk_dirty *bm;

	if (!blk)
		return NULL;
	/* A migration's own bitmap is not the user's to touch. */
	bm = strcmp(name, IOC_NODE_MIG_BITMAP) == 0 ? NULL : ioc_blk_dirty_find(blk, name);
	if (!bm)
		ioc__qmp_errf(err, "Dirty bitmap '%s' not found", name);
	if (pblk)
		*pblk = blk;
	return bm;
}

/* The block layer's errors in QEMU's words. */
static json_t *bitmap_result(int r, const char *name, struct ioc__qmp_err *err)
{
	if (r == 0)
		return json_object();
	if (r == -EUCLEAN)
		ioc__qmp_errf(err, "Bitmap '%s' is inconsistent and cannot be used", name);
	else
		ioc__qmp_errf(err, "Bitmap '%s': %s", name, strerror(-r));
	return NULL;
}

json_t *ioc_node_dirty_cmd_add(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	const struct ioc_node_dirty_ctx *c = ctx;
	const char *node = json_string_value(json_object_get(args, "node"));
	const char *name = json_string_value(json_object_get(args, "name"));
	json_t *g = json_object_get(args, "granularity");
	struct ioc_blk_dirty_opts o = {
		.name = name,
		.granularity = g ? (uint64_t)json_integer_value(g) : 0,
		.persistent = json_is_true(json_object_get(args, "persistent")),
		.disabled = json_is_true(json_object_get(args, "disabled")),
	};
	struct ioc_blk *blk = find_blk(c, node, err);
	int r;

	if (!blk)
		return NULL;
	/* QEMU's checks and words, in its order: the type (a uint32 in its
	 * schema), the value (so 2 GiB is the largest), then the name. */
	if (g && o.granularity > UINT32_MAX) {
		ioc__qmp_errf(err, "Parameter 'granularity' expects uint32_t");
		return NULL;
	}
	if (g && (o.granularity < IOC_BLK_DIRTY_GRAN_MIN ||
		  (o.granularity & (o.granularity - 1)))) {
		ioc__qmp_errf(err, "Granularity must be power of 2 and at least %u",
		     IOC_BLK_DIRTY_GRAN_MIN);
		return NULL;
	}
	if (!name[0]) {
		ioc__qmp_errf(err, "Bitmap name cannot be empty");
		return NULL;
	}
	if (strlen(name) >= IOC_BLK_DIRTY_NAME_MAX) {
		if (o.persistent)
			ioc__qmp_errf(err, "Can't make bitmap '%s' persistent in '%s': Name "
			     "length exceeds maximum (%d characters)", name, node,
			     IOC_BLK_DIRTY_NAME_MAX - 1);
		else
			ioc__qmp_errf(err, "Bitmap name too long: %s", name);
		return NULL;
	}
	r = ioc_blk_dirty_add(blk, &o, NULL);
	switch (r) {
	case 0:
		return json_object();
	case -EEXIST:
		ioc__qmp_errf(err, "Bitmap already exists: %s", name);
		return NULL;
	case -EINVAL:
		/* The lengths were checked above: only a sidecar's name is
		 * narrower (it is part of a file name). */
		ioc__qmp_errf(err, o.persistent ? "Bitmap name '%s' is not valid for a persistent "
		     "bitmap beside a raw image (1 to %d of A-Z a-z 0-9 _ - ., not starting "
		     "with '.')" : "Bitmap name '%s' is not valid", name,
		     IOC_BLK_DIRTY_SIDECAR_NAME_MAX - 1);
		return NULL;
	case -ENOSPC:
		ioc__qmp_errf(err, "Too many bitmaps on node '%s' (at most %d)", node,
		     IOC_BLK_DIRTY_MAX);
		return NULL;
	case -ENOTSUP:
		ioc__qmp_errf(err, "Can't store persistent bitmaps to disk: %s", strerror(-r));
		return NULL;
	default:
		ioc__qmp_errf(err, "Cannot add bitmap '%s': %s", name, strerror(-r));
		return NULL;
	}
}

json_t *ioc_node_dirty_cmd_remove(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	const struct ioc_node_dirty_ctx *c = ctx;
	struct ioc_blk *blk;
	struct ioc_blk_dirty *bm = find_bitmap(c, args, "name", &blk, err);

	if (!bm)
		return NULL;
	return bitmap_result(ioc_blk_dirty_remove(blk,
			json_string_value(json_object_get(args, "name"))),
			json_string_value(json_object_get(args, "name")), err);
}

json_t *ioc_node_dirty_cmd_clear(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	const struct ioc_node_dirty_ctx *c = ctx;
	struct ioc_blk_dirty *bm = find_bitmap(c, args, "name", NULL, err);

	return bm ? bitmap_result(ioc_blk_dirty_clear(bm),
				  json_string_value(json_object_get(args, "name")), err)
		  : NULL;
}

static json_t *record(const struct ioc_node_dirty_ctx *c, json_t *args, bool on,
		      struct ioc__qmp_err *err)
{
	struct ioc_blk_dirty *bm = find_bitmap(c, args, "name", NULL, err);

	return bm ? bitmap_result(ioc_blk_dirty_set_recording(bm, on),
				  json_string_value(json_object_get(args, "name")), err)
		  : NULL;
}

/* bitmaps: ["name", {"node": N, "name": B}, ...] (QEMU's BlockDirtyBitmapOrStr).
 * Every source is found before anything is merged. */
json_t *ioc_node_dirty_cmd_enable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return record(ctx, args, true, err);
}

json_t *ioc_node_dirty_cmd_disable(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	return record(ctx, args, false, err);
}

json_t *ioc_node_dirty_cmd_merge(void *ctx, json_t *args, struct ioc__qmp_err *err)
{
	const struct ioc_node_dirty_ctx *c = ctx;
	struct ioc_blk *blk;
	struct ioc_blk_dirty *dst = find_bitmap(c, args, "target", &blk, err);
	struct ioc_blk_dirty *src[64];
	json_t *list = json_object_get(args, "bitmaps"), *v;
	size_t i, n = json_array_size(list);

	if (!dst)
		return NULL;
	if (n > IOC_ARRAY_SIZE(src)) {
		ioc__qmp_errf(err, "Parameter 'bitmaps' has more than %zu elements",
		     IOC_ARRAY_SIZE(src));
		return NULL;
	}
	json_array_foreach(list, i, v) {
		struct ioc_blk *sblk = blk;
		const char *name;

		if (json_is_string(v)) {
			name = json_string_value(v);
		} else if (json_is_object(v) &&
			   json_is_string(json_object_get(v, "node")) &&
			   json_is_string(json_object_get(v, "name")) &&
			   json_object_size(v) == 2) {
			sblk = find_blk(c, json_string_value(json_object_get(v, "node")), err);
			if (!sblk)
				return NULL;
			name = json_string_value(json_object_get(v, "name"));
		} else {
			ioc__qmp_errf(err, "Parameter 'bitmaps[%zu]' expects a bitmap name or "
			     "{\"node\", \"name\"}", i);
			return NULL;
		}
		src[i] = ioc_blk_dirty_find(sblk, name);
		if (!src[i]) {
			ioc__qmp_errf(err, "Dirty bitmap '%s' not found", name);
			return NULL;
		}
	}
	for (i = 0; i < n; i++) {
		int r = ioc_blk_dirty_merge(dst, src[i]);
		struct ioc_blk_dirty_info di, si;

		if (r == -EINVAL) {
			ioc__qmp_errf(err, "Bitmaps are incompatible and can't be merged");
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

json_t *ioc_node_dirty_list_json(struct ioc_blk *blk)
{
	int n = ioc_blk_dirty_handles(blk, NULL, 0);
	struct ioc_blk_dirty **v = n > 0 ? malloc((size_t)n * sizeof(*v)) : NULL;
	struct ioc_blk_dirty_info *info = malloc(sizeof(*info));
	json_t *a = json_array();

	if (n > 0 && (!v || !info)) {
		json_decref(a);
		a = NULL;
	}
	if (v)
		n = ioc_blk_dirty_handles(blk, v, n);
	/* Newest first, as QEMU lists them. */
	for (int i = n - 1; i >= 0 && a; i--) {
		ioc_blk_dirty_get_info(v[i], info);
		if (strcmp(info->name, IOC_NODE_MIG_BITMAP) == 0)
			continue; /* a migration's, hidden */
		/* QEMU counts whole granules, the last one too where the
		 * image ends inside it (a 2 GiB granule of a 16 MiB disk
		 * counts 2 GiB); the block layer clips it: round back up. */
		uint64_t count = (info->count + info->granularity - 1) / info->granularity *
				 info->granularity;
		json_t *b = json_pack("{s:s,s:b,s:b,s:b,s:I,s:I}", "name", info->name,
				      "recording", info->recording,
				      "persistent", info->persistent, "busy", 0,
				      "granularity", (json_int_t)info->granularity,
				      "count", (json_int_t)count);

		if (b && info->inconsistent)
			json_object_set_new(b, "inconsistent", json_true());
		json_array_append_new(a, b);
	}
	free(v);
	free(info);
	return a;
}
