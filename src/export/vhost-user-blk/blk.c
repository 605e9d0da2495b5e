/*
 * virtio-blk requests: what one descriptor chain asks of the node.
 *
 * Problem: a request is a 16-byte header (type, sector) in the readable
 * part of the chain, data buffers, and a one-byte status at the very end
 * of the writable part; the guest may split any of these across
 * descriptors as it likes (VERSION_1 means any layout).  Reads and writes
 * should reach the node with iovecs into guest memory, no copy.  Every
 * bad request must get a status, and none may reach past the disk.
 *
 * Design: each request runs in its own coroutine (pool-allocated, created
 * on the queue's loop, which is its home) that brackets the node call
 * with ioc_node_co_enter()/ioc_node_leave(), so drains see it.  The
 * header is gathered with a copy (16 bytes); the data iovecs are the
 * chain's own, trimmed of the header and the status byte.  Checks, in
 * order: layout (header and status present; else the chain is answered
 * with nothing written, and logged), type (unknown: UNSUPP), read-only,
 * range and alignment to the logical block size (IOERR), then the node
 * call (its -errno: IOERR).  DISCARD and WRITE_ZEROES carry up to
 * DZ_SEG_MAX 16-byte segments, each checked before any is applied.  With
 * the write cache off (the guest cleared WCE) writes are FUA.  While the
 * front end logs dirty pages, each request logs what it wrote into guest
 * memory (read data, GET_ID's bytes, the status byte) after writing it
 * and before the completion goes on the used ring.
 *
 * Rejected: bouncing data through a buffer (a copy per request for
 * nothing: the regions stay mapped until the queue is stopped and
 * drained); one long-lived coroutine per queue slot (the pool already
 * recycles stacks, and a slot that waits holds nothing then).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "vub-export.h"

#define DZ_SEG_MAX      16
#define DZ_MAX_SECTORS  (1u << 22)       /* 2 GiB per segment */

struct dz_seg {                          /* virtio_blk_discard_write_zeroes */
	uint64_t sector;
	uint32_t num_sectors;
	uint32_t flags;
};

void ioc__vub_blk_config(struct ioc__vub_export *e, struct virtio_blk_config *c)
{
	uint32_t align = e->lbs / 512;

	memset(c, 0, sizeof(*c));
	c->capacity = e->node->size / 512;
	c->seg_max = VUB_SEG_MAX;
	c->blk_size = e->lbs;
	c->wce = atomic_load_explicit(&e->wce, memory_order_relaxed);
	c->num_queues = (uint16_t)e->num_queues;
	c->max_discard_sectors = DZ_MAX_SECTORS;
	c->max_discard_seg = DZ_SEG_MAX;
	c->discard_sector_alignment = align;
	c->max_write_zeroes_sectors = DZ_MAX_SECTORS;
	c->max_write_zeroes_seg = DZ_SEG_MAX;
	c->write_zeroes_may_unmap = 1;
}

static size_t iov_bytes(const struct iovec *iov, unsigned n)
{
	size_t s = 0;

	for (unsigned i = 0; i < n; i++)
		s += iov[i].iov_len;
	return s;
}

/* Copy len bytes from the iovecs, skipping off first; returns the count. */
static size_t iov_read(const struct iovec *iov, unsigned n, size_t off, void *buf,
		       size_t len)
{
	size_t done = 0;

	for (unsigned i = 0; i < n && done < len; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		size_t c = l - off < len - done ? l - off : len - done;

		memcpy((uint8_t *)buf + done, (uint8_t *)iov[i].iov_base + off, c);
		done += c;
		off = 0;
	}
	return done;
}

/* data = iov without its first skip bytes and its last cut bytes. */
static unsigned iov_trim(struct iovec *data, const struct iovec *iov, unsigned n,
			 size_t skip, size_t cut)
{
	size_t total = iov_bytes(iov, n), keep, o = 0;
	unsigned k = 0;

	if (skip + cut >= total)
		return 0;
	keep = total - skip - cut;
	for (unsigned i = 0; i < n && keep; i++) {
		size_t l = iov[i].iov_len, start = 0;

		if (o + l <= skip) {
			o += l;
			continue;
		}
		if (o < skip)
			start = skip - o;
		o += l;
		size_t c = l - start < keep ? l - start : keep;

		if (!c)
			continue;
		data[k++] = (struct iovec){ (uint8_t *)iov[i].iov_base + start, c };
		keep -= c;
	}
	return k;
}

static bool range_ok(struct ioc__vub_export *e, uint64_t sector, uint64_t bytes)
{
	uint64_t off;

	if (sector > UINT64_MAX / 512)
		return false;
	off = sector * 512;
	if (off % e->lbs || bytes % e->lbs)
		return false;
	return off <= e->node->size && bytes <= e->node->size - off;
}

static uint8_t ioc_coroutine_fn discard_zeroes(struct ioc__vub_export *e, uint32_t type,
					       struct ioc__vub_req *r, unsigned nd)
{
	size_t len = iov_bytes(r->data, nd);
	struct dz_seg seg[DZ_SEG_MAX];
	unsigned n = (unsigned)(len / sizeof(struct dz_seg));
	bool zero = type == VIRTIO_BLK_T_WRITE_ZEROES;
	bool fua = !atomic_load_explicit(&e->wce, memory_order_relaxed);

	if (e->read_only)
		return VIRTIO_BLK_S_IOERR;
	if (!len || len % sizeof(struct dz_seg))
		return VIRTIO_BLK_S_IOERR;
	if (n > DZ_SEG_MAX)
		return VIRTIO_BLK_S_UNSUPP;
	iov_read(r->data, nd, 0, seg, len);
	for (unsigned i = 0; i < n; i++) {
		uint32_t allowed = zero ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0;

		if (seg[i].flags & ~allowed)
			return VIRTIO_BLK_S_UNSUPP;
		if (seg[i].num_sectors > DZ_MAX_SECTORS ||
		    !range_ok(e, seg[i].sector, (uint64_t)seg[i].num_sectors * 512))
			return VIRTIO_BLK_S_IOERR;
	}
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = seg[i].sector * 512, bytes = (uint64_t)seg[i].num_sectors * 512;
		int ret;

		if (!bytes)
			continue;
		if (zero)
			ret = ioc_node_co_write_zeroes(e->node, off, bytes,
				((seg[i].flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP) ?
				 IOC_NODE_MAY_UNMAP : 0) | (fua ? IOC_NODE_FUA : 0));
		else
			ret = ioc_node_co_discard(e->node, off, bytes, 0);
		if (ret < 0)
			return VIRTIO_BLK_S_IOERR;
	}
	return VIRTIO_BLK_S_OK;
}

static void log_status(struct ioc__vub_req *r, uint8_t *status_p)
{
	struct iovec v = { status_p, 1 };

	ioc__vub_vring_log_write(&r->q->vr, &v, 1, 1);
}

static void ioc_coroutine_fn blk_co(void *opaque)
{
	struct ioc__vub_req *r = opaque;
	struct ioc__vub_export *e = r->q->exp;
	struct ioc__vub_elem *el = &r->e;
	const struct iovec *out = el->iov, *in = el->iov + el->n_out;
	struct virtio_blk_outhdr hdr;
	uint8_t status = VIRTIO_BLK_S_OK, *status_p = NULL;
	uint32_t used = 1;
	unsigned nd = 0;
	int ret;

	/* The status byte: the last byte of the writable part. */
	for (unsigned i = el->n_in; i-- > 0;)
		if (in[i].iov_len) {
			status_p = (uint8_t *)in[i].iov_base + in[i].iov_len - 1;
			break;
		}
	if (!status_p || iov_read(out, el->n_out, 0, &hdr, sizeof(hdr)) < sizeof(hdr)) {
		ioc__vub_log(e, "queue %u: request without %s", r->q->index,
			     status_p ? "a header" : "a status byte");
		ioc__vub_queue_complete(r, 0);
		return;
	}
	if (ioc_node_co_enter(e->node) < 0) {
		*status_p = VIRTIO_BLK_S_IOERR;
		log_status(r, status_p);
		ioc__vub_queue_complete(r, 1);
		return;
	}
	switch (hdr.type) {
	case VIRTIO_BLK_T_IN: {
		nd = iov_trim(r->data, in, el->n_in, 0, 1);
		size_t len = iov_bytes(r->data, nd);

		if (!range_ok(e, hdr.sector, len)) {
			status = VIRTIO_BLK_S_IOERR;
			break;
		}
		ret = len ? ioc_node_co_preadv(e->node, hdr.sector * 512, r->data,
					       (int)nd, 0) : 0;
		/* Even a failed read may have written some of the buffers. */
		ioc__vub_vring_log_write(&r->q->vr, r->data, nd, len);
		if (ret < 0)
			status = VIRTIO_BLK_S_IOERR;
		else
			used = (uint32_t)len + 1;
		break;
	}
	case VIRTIO_BLK_T_OUT: {
		nd = iov_trim(r->data, out, el->n_out, sizeof(hdr), 0);
		size_t len = iov_bytes(r->data, nd);
		uint32_t fl = atomic_load_explicit(&e->wce, memory_order_relaxed) ?
			      0 : IOC_NODE_FUA;

		if (e->read_only || !range_ok(e, hdr.sector, len)) {
			status = VIRTIO_BLK_S_IOERR;
			break;
		}
		ret = len ? ioc_node_co_pwritev(e->node, hdr.sector * 512, r->data,
						(int)nd, fl) : 0;
		if (ret < 0)
			status = VIRTIO_BLK_S_IOERR;
		break;
	}
	case VIRTIO_BLK_T_FLUSH:
		if (ioc_node_co_flush(e->node, 0) < 0)
			status = VIRTIO_BLK_S_IOERR;
		break;
	case VIRTIO_BLK_T_GET_ID: {
		size_t done = 0;

		nd = iov_trim(r->data, in, el->n_in, 0, 1);
		for (unsigned i = 0; i < nd && done < IOC_VUB_SERIAL_MAX; i++) {
			size_t c = r->data[i].iov_len < IOC_VUB_SERIAL_MAX - done ?
				   r->data[i].iov_len : IOC_VUB_SERIAL_MAX - done;

			memcpy(r->data[i].iov_base, e->serial + done, c);
			done += c;
		}
		ioc__vub_vring_log_write(&r->q->vr, r->data, nd, done);
		used = (uint32_t)done + 1;
		break;
	}
	case VIRTIO_BLK_T_DISCARD:
	case VIRTIO_BLK_T_WRITE_ZEROES:
		nd = iov_trim(r->data, out, el->n_out, sizeof(hdr), 0);
		status = discard_zeroes(e, hdr.type, r, nd);
		break;
	default:
		status = VIRTIO_BLK_S_UNSUPP;
	}
	ioc_node_leave(e->node);
	*status_p = status;
	log_status(r, status_p);
	ioc__vub_queue_complete(r, used);
}

void ioc__vub_blk_start(struct ioc__vub_req *r)
{
	struct ioc_co *co = ioc_co_create(blk_co, r);

	if (!co) {
		/* No memory for a stack: answer IOERR without running. */
		const struct iovec *in = r->e.iov + r->e.n_out;

		for (unsigned i = r->e.n_in; i-- > 0;)
			if (in[i].iov_len) {
				uint8_t *st = (uint8_t *)in[i].iov_base + in[i].iov_len - 1;

				*st = VIRTIO_BLK_S_IOERR;
				log_status(r, st);
				ioc__vub_queue_complete(r, 1);
				return;
			}
		ioc__vub_queue_complete(r, 0);
		return;
	}
	ioc_co_enter(co);
}
