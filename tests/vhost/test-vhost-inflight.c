/*
 * Inflight tracking against a back end killed at every store it makes.
 *
 * The ring walker and inflight.c are built here with IOC_VUB_CRASH_POINTS:
 * every store to used->idx or the region after the budget-th is dropped,
 * which is what a kill between two instructions leaves (each store
 * before it is in the shared pages, none after; the used entries are
 * written either way, unread past used->idx).  A scripted back
 * end takes requests, completes them out of order in batches, and takes
 * a reused head; for each budget from 0 to the whole script, a second
 * back end starts on what is left (ioc__vub_vring_inflight_start()), and
 * is itself killed at each of its stores and restarted once more.  The
 * last one runs everything to the end.  Checked each time:
 *   - what the guest saw complete, what is resubmitted and what is still
 *     to take from the avail ring are, together, every request made
 *     available, each once;
 *   - the resubmitted heads come in the order they were first taken;
 *   - at the end every request completed exactly once, no flag is left,
 *     the region's used_idx is used->idx.
 * Plus: a region of an unknown version or smaller than the ring is
 * refused, a region the front end zeroed is set up, and a hostile batch
 * list (indices past the ring, a loop) is walked within bounds.
 */
#include <stdlib.h>

#include "tap.h"
#include "vub-int.h"

#define GPA0    0x100000ull
#define MSIZE   0x20000ull
#define UVA_OFF 0x7f0000000000ull
#define QSZ     8
#define NREQ    7      /* requests the driver makes available */

#define DESC_GPA  (GPA0 + 0x0)
#define AVAIL_GPA (GPA0 + 0x1000)
#define USED_GPA  (GPA0 + 0x2000)
#define DATA_GPA  (GPA0 + 0x10000)

static struct ioc__vub_mem mem;
static uint8_t *buf, *region;
static uint16_t avail_heads[NREQ];   /* head of each avail entry */
static uint16_t order[4 * NREQ];     /* heads in the order first taken */
static unsigned norder;

static void *host(uint64_t gpa)
{
	return ioc__vub_gpa(&mem, gpa, 1, NULL);
}

static struct vring_used *used(void)
{
	return host(USED_GPA);
}

static struct vub_inflight_queue *iq(void)
{
	return (struct vub_inflight_queue *)region;
}

static void ring_init(struct ioc__vub_vring *vr)
{
	memset(vr, 0, sizeof(*vr));
	vr->num = QSZ;
	vr->desc_uva = DESC_GPA + UVA_OFF;
	vr->avail_uva = AVAIL_GPA + UVA_OFF;
	vr->used_uva = USED_GPA + UVA_OFF;
	vr->call_fd = -1;
	ASSERT_OK(ioc__vub_vring_map(vr, &mem));
	/* As the queue starts (queue.c): on from the guest's used->idx. */
	vr->used_idx = vr->published = used()->idx;
	vr->inflight = iq();
}

/* A fresh guest: every head a one-descriptor request; the first six
 * heads available, the seventh entry (head 2 again) made available once
 * the guest saw head 2 complete. */
static void guest_init(void)
{
	struct vring_desc *d;
	struct vring_avail *a;

	if (!buf) {
		buf = aligned_alloc(4096, MSIZE);
		region = aligned_alloc(64, ioc__vub_inflight_queue_bytes(QSZ));
		ASSERT_NOT_NULL(buf);
		ASSERT_NOT_NULL(region);
	}
	memset(buf, 0, MSIZE);
	memset(region, 0, ioc__vub_inflight_queue_bytes(QSZ));
	iq()->version = VUB_INFLIGHT_VERSION;
	iq()->desc_num = QSZ;
	mem.n = 1;
	mem.r[0] = (struct ioc__vub_region){ GPA0, MSIZE, GPA0 + UVA_OFF, buf, NULL, 0 };
	d = host(DESC_GPA);
	for (unsigned i = 0; i < QSZ; i++)
		d[i] = (struct vring_desc){ DATA_GPA + 64 * i, 16, 0, 0 };
	a = host(AVAIL_GPA);
	for (unsigned i = 0; i < 6; i++)
		a->ring[i] = avail_heads[i] = (uint16_t)i;
	avail_heads[6] = 2;
	a->idx = 6;
}

/* The guest side of the reused head: once used->idx shows head 2 done,
 * post it again (entry 6).  Reads what the kill left, like a guest. */
static void guest_step(void)
{
	struct vring_avail *a = host(AVAIL_GPA);
	struct vring_used *u = used();

	if (a->idx != 6)
		return;
	for (uint16_t i = 0; i < u->idx && i < QSZ; i++)
		if (u->ring[i].id == 2) {
			a->ring[6] = 2;
			__atomic_store_n(&a->idx, 7, __ATOMIC_RELEASE);
			return;
		}
}

/* Take the next avail entry; 1, or 0 when there is none. */
static int take(struct ioc__vub_vring *vr, struct ioc__vub_elem *e)
{
	int r = ioc__vub_vring_pop(vr, e);

	ASSERT_GE(r, 0);
	if (r == 1)
		order[norder++] = e->head;
	return r;
}

/* The scripted back end: out-of-order completions in batches.  Past
 * its crash point its stores go nowhere, so the guest may not have
 * posted the reused head: then it is not taken. */
static void script(void)
{
	struct ioc__vub_resubmit rs[QSZ];
	struct ioc__vub_vring vr;
	struct ioc__vub_elem e;

	ring_init(&vr);
	ASSERT_EQ(ioc__vub_vring_inflight_start(&vr, rs), 0);
	for (int i = 0; i < 4; i++)
		ASSERT_EQ(take(&vr, &e), 1);        /* 0 1 2 3 */
	ioc__vub_vring_push(&vr, 2, 1);
	ioc__vub_vring_push(&vr, 0, 1);
	ioc__vub_vring_flush(&vr);
	guest_step();
	ASSERT_EQ(take(&vr, &e), 1);                /* 4 */
	ASSERT_EQ(take(&vr, &e), 1);                /* 5 */
	ioc__vub_vring_push(&vr, 3, 1);
	ioc__vub_vring_push(&vr, 5, 1);
	ioc__vub_vring_flush(&vr);
	if (take(&vr, &e))                          /* 2 again */
		ioc__vub_vring_push(&vr, 2, 1);
	ioc__vub_vring_push(&vr, 1, 1);
	ioc__vub_vring_flush(&vr);
	ioc__vub_vring_push(&vr, 4, 1);             /* never flushed */
}

/*
 * A back end starting on what is left: the three sets cover every
 * request once, resubmissions in first-taken order.  Then, with budget
 * stores before it dies (-1: none), it resubmits, takes the rest and
 * completes everything in reverse, one batch.  Returns whether it ran
 * to the end without dying.
 */
static bool restart(long budget)
{
	struct ioc__vub_resubmit rs[QSZ];
	struct ioc__vub_vring vr;
	struct vring_avail *a = host(AVAIL_GPA);
	unsigned count[QSZ] = { 0 }, want[QSZ] = { 0 }, pos = 0;
	uint16_t done[2 * QSZ], used_idx, avail_idx;
	unsigned ndone = 0, seen = norder;
	int n;

	ioc__vub_crash_budget = -1;
	ring_init(&vr);
	n = ioc__vub_vring_inflight_start(&vr, rs);
	ASSERT_GE(n, 0);
	used_idx = used()->idx;
	avail_idx = a->idx;
	ASSERT_UEQ(vr.last_avail, (uint16_t)(used_idx + n));
	ASSERT_UEQ(iq()->used_idx, used_idx);
	ASSERT_ULE((uint16_t)(avail_idx - vr.last_avail), avail_idx);
	for (uint16_t i = 0; i < used_idx; i++)
		count[used()->ring[i % QSZ].id]++;
	for (int i = 0; i < n; i++) {
		count[rs[i].head]++;
		/* In first-taken order: find it after the previous one. */
		while (pos < seen && order[pos] != rs[i].head)
			pos++;
		if (pos == seen)
			ioc_test_fail(__FILE__, __LINE__, "resubmitted head %u out of order",
				      rs[i].head);
		pos++;
	}
	for (uint16_t i = vr.last_avail; i != avail_idx; i++)
		count[a->ring[i % QSZ]]++;
	for (unsigned i = 0; i < avail_idx; i++)
		want[avail_heads[i]]++;
	for (unsigned h = 0; h < QSZ; h++)
		if (count[h] != want[h])
			ioc_test_fail(__FILE__, __LINE__, "head %u: %u seen, %u made available "
				      "(used %u, resubmitted %d, last_avail %u)", h, count[h], want[h],
				      used_idx, n, vr.last_avail);

	/* Finish the job, maybe dying on the way: the resubmissions, then
	 * what is available, all completed in reverse in one batch, until
	 * the guest posts nothing more. */
	ioc__vub_crash_budget = budget;
	for (int i = 0; i < n; i++) {
		struct ioc__vub_elem e;

		ASSERT_EQ(ioc__vub_vring_pop_head(&vr, rs[i].head, &e), 1);
		done[ndone++] = e.head;
	}
	for (;;) {
		struct ioc__vub_elem e;

		while (take(&vr, &e) == 1)
			done[ndone++] = e.head;
		if (!ndone)
			break;
		while (ndone)
			ioc__vub_vring_push(&vr, done[--ndone], 1);
		ioc__vub_vring_flush(&vr);
		guest_step();
	}
	{
		bool alive = ioc__vub_crash_budget != 0;

		ioc__vub_crash_budget = -1;
		return alive;
	}
}

/* Everything done exactly once, the region clean. */
static void check_end(void)
{
	struct vring_used *u = used();
	unsigned count[QSZ] = { 0 }, want[QSZ] = { 0 };
	struct vring_avail *a = host(AVAIL_GPA);

	ASSERT_UEQ(a->idx, NREQ);
	ASSERT_UEQ(u->idx, NREQ);
	for (unsigned i = 0; i < NREQ; i++) {
		count[u->ring[i % QSZ].id]++;
		want[avail_heads[i]]++;
	}
	/* The used ring wraps at QSZ: entry 7 would overwrite 0, and
	 * NREQ < QSZ keeps every entry readable. */
	_Static_assert(NREQ < QSZ, "every used entry stays in the ring");
	for (unsigned h = 0; h < QSZ; h++) {
		ASSERT_UEQ(count[h], want[h]);
		ASSERT_UEQ(iq()->desc[h].inflight, 0);
	}
	ASSERT_UEQ(iq()->used_idx, NREQ);
}

static void test_every_crash_point(void)
{
	unsigned runs = 0;
	unsigned long total;

	guest_init();
	norder = 0;
	ioc__vub_crash_budget = -1;
	ioc__vub_crash_stores = 0;
	script();
	total = ioc__vub_crash_stores;
	ASSERT_UEQ(norder, NREQ);
	ASSERT_UGT(total, 20);
	for (unsigned long b = 0; b <= total; b++) {
		for (long b2 = 0;; b2++) {
			bool alive;

			guest_init();
			norder = 0;
			ioc__vub_crash_budget = (long)b;
			script();
			alive = restart(b2);
			if (!alive)
				ASSERT_TRUE(restart(-1));
			check_end();
			runs++;
			if (alive)
				break;
		}
	}
	printf("# %lu stores in the script, %u crash and restart pairs\n", total, runs);
}

static void test_region_checks(void)
{
	struct ioc__vub_resubmit rs[QSZ];
	struct ioc__vub_vring vr;

	guest_init();
	ring_init(&vr);
	iq()->version = 2;
	ASSERT_EQ(ioc__vub_vring_inflight_start(&vr, rs), -EINVAL);
	ASSERT_NOT_NULL(strstr(vr.why, "version"));
	iq()->version = 1;
	iq()->desc_num = QSZ / 2;
	ASSERT_EQ(ioc__vub_vring_inflight_start(&vr, rs), -EINVAL);
	ASSERT_NOT_NULL(strstr(vr.why, "smaller"));

	/* Zeroed by the front end: set up, nothing in flight, the ring
	 * goes on from used->idx. */
	memset(region, 0xff, ioc__vub_inflight_queue_bytes(QSZ));
	memset(region, 0, sizeof(struct vub_inflight_queue));
	used()->idx = 3;
	ASSERT_EQ(ioc__vub_vring_inflight_start(&vr, rs), 0);
	ASSERT_UEQ(iq()->version, 1);
	ASSERT_UEQ(iq()->desc_num, QSZ);
	ASSERT_UEQ(iq()->used_idx, 3);
	ASSERT_UEQ(vr.last_avail, 3);
	for (unsigned h = 0; h < QSZ; h++)
		ASSERT_UEQ(iq()->desc[h].inflight, 0);

	/* A hostile batch: used->idx far ahead, the list leaving the ring
	 * and looping; flags that are neither 0 nor 1 are dropped. */
	for (unsigned h = 0; h < QSZ; h++) {
		iq()->desc[h].inflight = 1;
		iq()->desc[h].next = (uint16_t)(h == 5 ? 999 : (h + 3) % QSZ);
		iq()->desc[h].counter = 100 - h;
	}
	iq()->desc[7].inflight = 9;
	iq()->last_batch_head = 2;   /* 2 5 999: stops at 999 */
	iq()->used_idx = 3;
	used()->idx = 60000;
	ASSERT_EQ(ioc__vub_vring_inflight_start(&vr, rs), 5);
	ASSERT_UEQ(iq()->desc[2].inflight, 0);
	ASSERT_UEQ(iq()->desc[5].inflight, 0);
	ASSERT_UEQ(iq()->desc[7].inflight, 0);
	ASSERT_UEQ(iq()->used_idx, 60000);
	/* Sorted by counter: 100 - h, so the highest head first. */
	ASSERT_UEQ(rs[0].head, 6);
	ASSERT_UEQ(rs[4].head, 0);
	ASSERT_UEQ(vr.last_avail, (uint16_t)60005);
	ASSERT_UEQ(vr.counter, 101);
	/* Heads past the ring are not walked. */
	{
		struct ioc__vub_elem e;

		ASSERT_EQ(ioc__vub_vring_pop_head(&vr, QSZ, &e), -EPROTO);
		ASSERT_TRUE(vr.broken);
	}
}

IOC_TEST_MAIN(
	IOC_TEST(test_every_crash_point),
	IOC_TEST(test_region_checks),
)
