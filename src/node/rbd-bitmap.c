/*
 * Persistent dirty bitmaps of an rbd node, kept in the cluster beside the
 * image, so an incremental backup can go on from another host after the
 * export moved there (QEMU's rbd driver refuses persistent bitmaps).
 *
 * Design.  The bits live where every bitmap lives, in the block layer: a
 * set of the null driver sized like the image (n->dirty_set), marked by
 * the node's write notifier, reached by QMP and NBD unchanged; this file
 * is its store (add, remove) plus open and close, in qcow2-bitmap.c's
 * shape.  The cluster holds one RADOS object per image,
 * "__org.iocore_bitmaps.<image id>" in the image's pool and namespace
 * (the id survives a rename), laid out as rbd-bitmap-format.h says.  Every
 * change rewrites it whole with one write_full op, which RADOS applies
 * atomically: a crash leaves a state this node wrote, so no commit order
 * is needed.  The rules are the sidecars' (src/blk/dirty-bitmap.c): a
 * writable open marks every bitmap in use before the node serves a write,
 * a clean close writes the bits and clears it, one found in use loads
 * inconsistent.
 *
 * Writers.  Each write asserts the object version this node last saw (or
 * creates it exclusively): two nodes never overwrite each other's
 * directory unseen (the loser gets -EBUSY).  With the exclusive lock (the
 * default) the node checks it still holds the lock before each write; an
 * image without that feature keeps the object whole, not each writer's
 * writes in the other's bitmaps.  With lock=auto another client may write
 * at any time: stored bitmaps load inconsistent, new persistent ones are
 * refused.  Read-only nodes and snapshots load and never write.  From a
 * coroutine (a QMP command, a hand-over) the cluster calls run on the
 * loop's thread pool: a stopped OSD holds that caller, not the loop.  Two
 * such writers overlapping: the version check fails the second (-EBUSY).
 *
 * Rejected: one object per bitmap (directory and bits could disagree
 * after a crash), rbd_metadata_set for the directory (a second place to
 * keep in step), writing bits as they change (in use is the contract).
 * Limit: every bit array at once must fit osd_max_object_size and
 * osd_max_write_size (the client's view): else the add gets -EFBIG.  No
 * resize while a bitmap exists.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/co.h"
#include "iocore/pool.h"
#include "node/node-int.h"
#include "node/rbd-bitmap.h"
#include "node/rbd-bitmap-format.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)
#define RBM_PREFIX "__org.iocore_bitmaps."

struct rbd_bitmaps {
	struct ioc_node *n;
	rados_t cluster;
	rados_ioctx_t io;               /* ours: its last version is ours */
	rbd_image_t image;
	enum rbd_bm_mode mode;
	bool has_lock_feature;
	char oid[160];
	struct ioc_blk *set;
	struct ioc_node_notifier nt;
	bool notifying;
	bool loading;                   /* adds are the object's own: no write */
	bool inactive;                  /* handed over: written back, no change */
	bool exists;                    /* the object, as of ver */
	uint64_t ver;
	uint64_t size;                  /* what the set covers */
	uint64_t max_obj;               /* bytes one object may hold */
};

/* The client's view of an OSD setting, as a number (0: unknown). */
static uint64_t conf_u64(rados_t cluster, const char *key)
{
	char v[64];

	if (rados_conf_get(cluster, key, v, sizeof(v)) < 0)
		return 0;
	return strtoull(v, NULL, 10);
}

/* ---- writing the object ---------------------------------------------- */

/* What the object would hold: the set's persistent bitmaps except skip,
 * plus add.  final: the bits of the consistent ones, in use cleared;
 * else every one in use, without bits.  *need gets the length the object
 * would have written final (what must fit). */
struct plan {
	struct ioc_blk_dirty_info *v;
	int n;
};

static int plan_make(struct rbd_bitmaps *b, const struct ioc_blk_dirty_info *add,
		     const char *skip, struct plan *p)
{
	int total = ioc_blk_dirty_list(b->set, NULL, 0), got, k = 0;

	p->v = calloc((size_t)total + 1, sizeof(*p->v));
	if (!p->v)
		return -ENOMEM;
	got = ioc_blk_dirty_list(b->set, p->v, total);
	for (int i = 0; i < got && i < total; i++) {
		if (!p->v[i].persistent || (skip && !strcmp(p->v[i].name, skip)))
			continue;
		p->v[k++] = p->v[i];
	}
	if (add)
		p->v[k++] = *add;
	p->n = k;
	return 0;
}

static uint64_t plan_len(const struct rbd_bitmaps *b, const struct plan *p, bool final)
{
	uint64_t len = RBM_HDR_LEN + RBM_CRC_LEN;

	for (int i = 0; i < p->n; i++) {
		bool bits = final && !p->v[i].inconsistent;

		len += ioc__rbm_entry_len((uint32_t)strlen(p->v[i].name),
					  bits ? ioc__rbm_bits_len(b->size, p->v[i].granularity)
					       : 0);
	}
	return len;
}

int ioc__rbd_blocking(ioc_pool_fn *fn, void *arg)
{
	return (int)(ioc_co_self() ? ioc_pool_co_run(NULL, fn, arg) : fn(arg));
}

struct put_job {
	struct rbd_bitmaps *b;
	rados_write_op_t op;            /* NULL: only the lock check */
	uint64_t ver;                   /* out; b->ver is the caller's */
};

static int64_t put_fn(void *arg)
{
	struct put_job *j = arg;
	struct rbd_bitmaps *b = j->b;
	int ret;

	if (b->has_lock_feature && b->mode == RBD_BM_OWNER) {
		int owner = 0;

		if (rbd_is_exclusive_lock_owner(b->image, &owner) < 0 || !owner)
			return -EBUSY;  /* the lock moved: not ours to write */
	}
	if (!j->op)
		return 0;
	ret = rados_write_op_operate(j->op, b->io, b->oid, NULL, 0);
	/* The version of this ioctx's last op: read on the same thread. */
	if (ret == 0)
		j->ver = rados_get_last_version(b->io);
	return ret;
}

/* Write (or remove, when empty) the object for p, asserting the version
 * this node knows. */
static int put_object(struct rbd_bitmaps *b, const struct plan *p, bool final)
{
	uint64_t len = plan_len(b, p, final);
	struct put_job j = { b, NULL, 0 };
	rados_write_op_t op;
	uint8_t *buf = NULL;
	size_t pos;
	int ret;

	if (p->n && len > b->max_obj)
		return -EFBIG;
	if (!p->n && !b->exists)
		return ioc__rbd_blocking(put_fn, &j);
	op = rados_create_write_op();
	if (!op)
		return -ENOMEM;
	if (b->exists)
		rados_write_op_assert_version(op, b->ver);
	else
		rados_write_op_create(op, LIBRADOS_CREATE_EXCLUSIVE, NULL);
	if (p->n) {
		buf = malloc((size_t)len);
		ret = -ENOMEM;
		if (!buf)
			goto out;
		ioc__rbm_begin(buf, b->size, &pos);
		for (int i = 0; i < p->n; i++) {
			const struct ioc_blk_dirty_info *x = &p->v[i];
			bool bits = final && !x->inconsistent;
			uint64_t nb = bits ? ioc__rbm_bits_len(b->size, x->granularity) : 0;
			uint32_t fl = (bits ? 0 : RBM_IN_USE) | (x->recording ? RBM_AUTO : 0);
			uint8_t *dst = ioc__rbm_put(buf, &pos, x->name, fl, x->granularity, nb);

			if (nb) {
				struct ioc_blk_dirty *bm = ioc_blk_dirty_find(b->set, x->name);

				ret = bm ? ioc_blk_dirty_export(bm, 0, dst, (size_t)nb) : -ENOENT;
				if (ret < 0)
					goto out;
			}
		}
		len = ioc__rbm_finish(buf, pos, (uint32_t)p->n);
		rados_write_op_write_full(op, (const char *)buf, (size_t)len);
	} else {
		rados_write_op_remove(op);
	}
	j.op = op;
	ret = ioc__rbd_blocking(put_fn, &j);
	if (ret == 0) {
		b->exists = p->n > 0;
		b->ver = b->exists ? j.ver : 0;
	} else if (ret == -ERANGE || ret == -EOVERFLOW || ret == -EEXIST) {
		ret = -EBUSY;           /* another client changed the object */
	}
out:
	rados_release_write_op(op);
	free(buf);
	return ret;
}

static int write_plan(struct rbd_bitmaps *b, const struct ioc_blk_dirty_info *add,
		      const char *skip, bool final)
{
	struct plan p;
	int ret = plan_make(b, add, skip, &p);

	if (ret == 0) {
		/* What the close will write must fit, or the add is refused
		 * now rather than the bitmap lost then. */
		if (add && plan_len(b, &p, true) > b->max_obj)
			ret = -EFBIG;
		else
			ret = put_object(b, &p, final);
	}
	free(p.v);
	return ret;
}

/* ---- the store -------------------------------------------------------- */

static int store_add(void *opaque, const struct ioc_blk_dirty_info *info)
{
	struct rbd_bitmaps *b = opaque;
	struct ioc_blk_dirty_info in_use = *info;

	if (b->loading)
		return 0;
	if (b->mode == RBD_BM_READ || b->inactive)
		return -EROFS;
	if (b->mode == RBD_BM_SHARED)
		return -EBUSY;          /* without the lock it could not be whole */
	in_use.inconsistent = false;
	return write_plan(b, &in_use, NULL, false);
}

static int store_remove(void *opaque, const char *name)
{
	struct rbd_bitmaps *b = opaque;

	if (b->mode == RBD_BM_READ || b->inactive)
		return -EROFS;
	return write_plan(b, NULL, name, false);
}

static const struct ioc_blk_dirty_store store = {
	.add = store_add,
	.remove = store_remove,
};

/* ---- open -------------------------------------------------------------- */

struct read_job {
	struct rbd_bitmaps *b;
	uint8_t **out;
	size_t *len;
	char *err;
	size_t errlen;
};

static int read_object(struct rbd_bitmaps *b, uint8_t **out, size_t *len, char *err,
		       size_t errlen);

static int64_t read_fn(void *arg)
{
	struct read_job *j = arg;

	return read_object(j->b, j->out, j->len, j->err, j->errlen);
}

static int read_object(struct rbd_bitmaps *b, uint8_t **out, size_t *len, char *err,
		       size_t errlen)
{
	uint64_t psize = 0;
	time_t mtime;
	uint8_t *buf;
	int ret = rados_stat(b->io, b->oid, &psize, &mtime);

	*out = NULL;
	*len = 0;
	if (ret == -ENOENT)
		return 0;
	if (ret < 0) {
		ERR("Could not read bitmap object %s: %s", b->oid, strerror(-ret));
		return ret;
	}
	if (psize > (uint64_t)INT32_MAX) {
		ERR("Bitmap object %s: %" PRIu64 " bytes is too large to read", b->oid, psize);
		return -EFBIG;
	}
	buf = malloc(psize ? (size_t)psize : 1);
	if (!buf)
		return -ENOMEM;
	ret = psize ? rados_read(b->io, b->oid, (char *)buf, (size_t)psize, 0) : 0;
	if (ret == -ENOENT) {           /* removed in between: none */
		free(buf);
		return 0;
	}
	if (ret < 0) {
		free(buf);
		ERR("Could not read bitmap object %s: %s", b->oid, strerror(-ret));
		return ret;
	}
	b->exists = true;
	b->ver = rados_get_last_version(b->io);
	*out = buf;
	*len = (size_t)ret;             /* shorter: the crc check says torn */
	return 0;
}

static int load(struct rbd_bitmaps *b, bool *any_clean, char *err, size_t errlen)
{
	struct rbm_entry *e = NULL;
	uint32_t count = 0;
	uint64_t covers = 0;
	uint8_t *buf;
	size_t len;
	char why[256];
	struct read_job rj = { b, &buf, &len, err, errlen };
	int ret = ioc__rbd_blocking(read_fn, &rj);

	if (ret < 0 || !buf)
		return ret;
	ret = ioc__rbm_parse(buf, len, &e, &count, &covers, why, sizeof(why));
	if (ret < 0) {
		ERR("Bitmap object %s is invalid: %s (rados rm removes it, with its bitmaps)",
		    b->oid, why);
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		struct ioc_blk_dirty *bm = NULL;
		char *name = strndup(e[i].name, e[i].name_len);
		/* Bits of another size (rbd resize from outside) describe
		 * nothing here; lock=auto: another writer may have written. */
		bool inconsistent = (e[i].flags & RBM_IN_USE) || covers != b->size ||
				    b->mode == RBD_BM_SHARED;

		if (!name) {
			ret = -ENOMEM;
			goto out;
		}
		/* Stored clean: a writable open must mark it in use. */
		if (!(e[i].flags & RBM_IN_USE))
			*any_clean = true;
		b->loading = true;
		ret = ioc_blk_dirty_add(b->set, &(struct ioc_blk_dirty_opts){
			.name = name, .granularity = e[i].granularity, .persistent = true,
			.disabled = !(e[i].flags & RBM_AUTO), .inconsistent = inconsistent }, &bm);
		b->loading = false;
		if (ret < 0) {
			ERR("Could not load bitmap '%.64s' of %s: %s", name, b->oid,
			    ioc_strerror(ret));
			free(name);
			goto out;
		}
		free(name);
		if (!inconsistent) {
			ret = ioc_blk_dirty_import(bm, 0, e[i].bits, (size_t)e[i].nbytes);
			if (ret < 0) {
				ERR("Could not load the bits of bitmap %" PRIu32 " of %s: %s", i,
				    b->oid, ioc_strerror(ret));
				goto out;
			}
		}
	}
	/* A writable open of an object that covers another size rewrites it
	 * at the current size (every entry in use, so no bits to convert). */
	if (covers != b->size)
		*any_clean = true;
out:
	free(e);
	free(buf);
	return ret;
}

int ioc__rbd_bitmaps_open(struct ioc_node *n, rados_t cluster, rados_ioctx_t io,
			  rbd_image_t image, enum rbd_bm_mode mode, struct rbd_bitmaps **out,
			  char *err, size_t errlen)
{
	struct rbd_bitmaps *b = calloc(1, sizeof(*b));
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = n->size };
	uint64_t features = 0, wmax;
	char id[96];
	bool dirty = false;
	int ret;

	*out = NULL;
	if (!b) {
		rados_ioctx_destroy(io);
		ERR("%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	b->n = n;
	b->cluster = cluster;
	b->io = io;
	b->image = image;
	b->mode = mode;
	b->size = n->size;
	b->nt.fn = ioc__node_mark_dirty_set;
	*out = b;
	b->has_lock_feature = rbd_get_features(image, &features) == 0 &&
			      (features & RBD_FEATURE_EXCLUSIVE_LOCK);
	b->max_obj = conf_u64(cluster, "osd_max_object_size");
	wmax = conf_u64(cluster, "osd_max_write_size") << 20;   /* in MiB */
	if (!b->max_obj || (wmax && wmax < b->max_obj))
		b->max_obj = wmax ? wmax : (90u << 20);
	ret = rbd_get_id(image, id, sizeof(id));
	if (ret < 0) {
		ERR("Could not get the image id: %s", strerror(-ret));
		return ret;
	}
	snprintf(b->oid, sizeof(b->oid), RBM_PREFIX "%s", id);
	ret = ioc_blk_open(&b->set, NULL, &o);
	if (ret < 0) {
		b->set = NULL;
		ERR("Could not make the node's bitmap set: %s", ioc_strerror(ret));
		return ret;
	}
	ioc_blk_dirty_set_store(b->set, &store, b);
	ret = load(b, &dirty, err, errlen);
	if (ret < 0)
		return ret;
	if (mode != RBD_BM_READ && dirty) {
		/* In use before the first write. */
		ret = write_plan(b, NULL, NULL, false);
		if (ret < 0) {
			ERR("Could not mark the bitmaps of %s in use: %s", b->oid,
			    ioc_strerror(ret));
			return ret;
		}
	}
	n->dirty_set = b->set;
	ioc_node_add_notifier(n, &b->nt);
	b->notifying = true;
	return 0;
}

/* ---- close --------------------------------------------------------------- */

int ioc__rbd_bitmaps_close(struct rbd_bitmaps *b)
{
	if (!b || b->mode != RBD_BM_OWNER || b->inactive)
		return 0;
	/* Failed: the bitmaps stay in use (inconsistent at the next open). */
	return write_plan(b, NULL, NULL, true);
}

int ioc__rbd_bitmaps_inactivate(struct rbd_bitmaps *b)
{
	int ret;

	if (!b || b->inactive)
		return 0;
	ret = ioc__rbd_bitmaps_close(b);
	if (ret == 0)
		b->inactive = true;
	return ret;
}

/* Whether the object is as this node last wrote or read it: a read that
 * asserts its version, or its absence when there was none. */
static int64_t unchanged_fn(void *arg)
{
	struct rbd_bitmaps *b = arg;
	rados_read_op_t op;
	uint64_t psize;
	time_t mtime;
	int ret;

	if (!b->exists) {
		ret = rados_stat(b->io, b->oid, &psize, &mtime);
		return ret == -ENOENT ? 0 : ret < 0 ? ret : -ESTALE;
	}
	op = rados_create_read_op();
	if (!op)
		return -ENOMEM;
	rados_read_op_assert_version(op, b->ver);
	ret = rados_read_op_operate(op, b->io, b->oid, 0);
	rados_release_read_op(op);
	if (ret == -ERANGE || ret == -EOVERFLOW || ret == -ENOENT)
		return -ESTALE;
	return ret;
}

int ioc__rbd_bitmaps_activate(struct rbd_bitmaps *b, char *err, size_t errlen)
{
	int ret;

	if (!b || !b->inactive)
		return 0;
	if (b->mode != RBD_BM_OWNER) {
		b->inactive = false;
		return 0;
	}
	ret = ioc__rbd_blocking(unchanged_fn, b);
	if (ret < 0) {
		ERR("The bitmaps of %s changed while this node was inactive: %s", b->oid,
		    ioc_strerror(ret));
		return ret;
	}
	b->inactive = false;
	/* In use again before the first write. */
	ret = write_plan(b, NULL, NULL, false);
	if (ret < 0) {
		b->inactive = true;
		ERR("Could not mark the bitmaps of %s in use: %s", b->oid, ioc_strerror(ret));
	}
	return ret;
}

void ioc__rbd_bitmaps_free(struct rbd_bitmaps *b)
{
	if (!b)
		return;
	/* Close and failed opens: no request runs, and the node goes right
	 * after, so the notifier is unlinked without a drain. */
	if (b->notifying)
		(void)ioc__node_unlink_notifier(b->n, &b->nt);
	if (b->n->dirty_set == b->set)
		b->n->dirty_set = NULL;
	if (b->set)
		ioc_blk_close(b->set);
	if (b->io)
		rados_ioctx_destroy(b->io);
	free(b);
}

int ioc_coroutine_fn ioc__rbd_bitmaps_resize(struct rbd_bitmaps *b, uint64_t size)
{
	if (!b)
		return 0;
	if (ioc_blk_dirty_list(b->set, NULL, 0) > 0)
		return -EBUSY;
	b->size = size;
	return ioc_blk_co_truncate(b->set, size, 0);
}
