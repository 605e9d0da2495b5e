/*
 * The split-ring walker against a hand-built memory table: two adjacent
 * guest regions backed by malloc'd buffers, the rings in the first, and a
 * test "driver" that writes descriptors and avail entries the way a guest
 * would.  Every fault the walker must catch is here, each on a fresh
 * ring, and none may be a crash or a read outside the two buffers (run it
 * under ASan to see that part).
 */
#include <stdlib.h>
#include <sys/eventfd.h>

#include "tap.h"
#include "vub-int.h"

#define R0_GPA  0x100000ull
#define R1_GPA  0x200000ull
#define R_SIZE  0x100000ull
#define UVA_OFF 0x7f0000000000ull
#define QSZ     8

/* Ring layout inside region 0 (guest addresses). */
#define DESC_GPA  (R0_GPA + 0x0)
#define AVAIL_GPA (R0_GPA + 0x1000)
#define USED_GPA  (R0_GPA + 0x2000)
#define IND_GPA   (R0_GPA + 0x3000)
#define DATA_GPA  (R0_GPA + 0x10000)

static struct ioc__vub_mem mem;
static uint8_t *buf0, *buf1;
static struct ioc__vub_vring vr;
static uint16_t drv_avail;   /* the driver's avail idx */

static void *host(uint64_t gpa)
{
	return ioc__vub_gpa(&mem, gpa, 1, NULL);
}

static void setup(bool indirect, bool event_idx)
{
	if (!buf0) {
		buf0 = aligned_alloc(4096, R_SIZE);
		buf1 = aligned_alloc(4096, R_SIZE);
		ASSERT_NOT_NULL(buf0);
		ASSERT_NOT_NULL(buf1);
	}
	memset(buf0, 0, R_SIZE);
	memset(buf1, 0, R_SIZE);
	mem.n = 2;
	mem.r[0] = (struct ioc__vub_region){ R0_GPA, R_SIZE, R0_GPA + UVA_OFF, buf0, NULL, 0 };
	mem.r[1] = (struct ioc__vub_region){ R1_GPA, R_SIZE, R1_GPA + UVA_OFF, buf1, NULL, 0 };
	memset(&vr, 0, sizeof(vr));
	vr.num = QSZ;
	vr.desc_uva = DESC_GPA + UVA_OFF;
	vr.avail_uva = AVAIL_GPA + UVA_OFF;
	vr.used_uva = USED_GPA + UVA_OFF;
	vr.indirect = indirect;
	vr.event_idx = event_idx;
	vr.call_fd = -1;
	drv_avail = 0;
	ASSERT_OK(ioc__vub_vring_map(&vr, &mem));
}

static void set_desc(uint64_t table_gpa, unsigned i, uint64_t addr, uint32_t len,
		     uint16_t flags, uint16_t next)
{
	struct vring_desc *d = (struct vring_desc *)host(table_gpa) + i;

	d->addr = addr;
	d->len = len;
	d->flags = flags;
	d->next = next;
}

static void make_avail(uint16_t head)
{
	struct vring_avail *a = host(AVAIL_GPA);

	a->ring[drv_avail % QSZ] = head;
	drv_avail++;
	__atomic_store_n(&a->idx, drv_avail, __ATOMIC_RELEASE);
}

static void expect_fault(const char *why_part)
{
	struct ioc__vub_elem e;

	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), -EPROTO);
	ASSERT_TRUE(vr.broken);
	ASSERT_NOT_NULL(vr.why);
	if (!strstr(vr.why, why_part))
		ioc_test_fail(__FILE__, __LINE__, "fault \"%s\", expected \"%s\"", vr.why, why_part);
	/* A broken ring gives nothing more, even with a good entry. */
	set_desc(DESC_GPA, 0, DATA_GPA, 16, 0, 0);
	make_avail(0);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), -EPROTO);
	ASSERT_FALSE(ioc__vub_vring_avail(&vr));
}

static void test_map(void)
{
	setup(false, false);
	ASSERT_PTR_EQ(vr.desc, buf0);
	vr.num = 3;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	vr.num = 0;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	vr.num = 65536;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	vr.num = QSZ;
	vr.desc_uva += 8;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	ASSERT_NULL(vr.desc);
	vr.desc_uva = 0x1000;      /* nowhere */
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	/* The used ring running off the end of the last region. */
	vr.desc_uva = DESC_GPA + UVA_OFF;
	vr.used_uva = R1_GPA + R_SIZE - 8 + UVA_OFF;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	ASSERT_EQ(ioc__vub_vring_map(&vr, NULL), -EINVAL);
	/* Aligned guest addresses, but the region's host mapping is not
	 * (an odd mmap offset): refused, not accessed misaligned. */
	vr.used_uva = USED_GPA + UVA_OFF;
	mem.r[0].host = buf0 + 1;
	ASSERT_EQ(ioc__vub_vring_map(&vr, &mem), -EINVAL);
	ASSERT_NOT_NULL(strstr(vr.why, "misaligned"));
	mem.r[0].host = buf0;
	ASSERT_OK(ioc__vub_vring_map(&vr, &mem));
}

static void test_translate(void)
{
	uint64_t c;

	setup(false, false);
	ASSERT_PTR_EQ(ioc__vub_gpa(&mem, R0_GPA, 16, NULL), buf0);
	ASSERT_PTR_EQ(ioc__vub_gpa(&mem, R1_GPA - 1, 1, &c), buf0 + R_SIZE - 1);
	ASSERT_UEQ(c, 1);
	ASSERT_NULL(ioc__vub_gpa(&mem, R1_GPA - 1, 2, NULL));
	ASSERT_NULL(ioc__vub_gpa(&mem, R1_GPA + R_SIZE, 1, &c));
	ASSERT_NULL(ioc__vub_gpa(&mem, 0, 1, &c));
	ASSERT_NULL(ioc__vub_gpa(&mem, UINT64_MAX, 1, &c));
	ASSERT_NULL(ioc__vub_uva(&mem, R0_GPA + UVA_OFF, R_SIZE + 1));
	ASSERT_NULL(ioc__vub_uva(&mem, UINT64_MAX, 2));
}

static void test_simple_chain(void)
{
	struct ioc__vub_elem e;

	setup(false, false);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 0);
	ASSERT_FALSE(ioc__vub_vring_avail(&vr));
	set_desc(DESC_GPA, 2, DATA_GPA, 16, VRING_DESC_F_NEXT, 5);
	set_desc(DESC_GPA, 5, DATA_GPA + 512, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
	set_desc(DESC_GPA, 1, DATA_GPA + 8192, 1, VRING_DESC_F_WRITE, 0);
	make_avail(2);
	ASSERT_TRUE(ioc__vub_vring_avail(&vr));
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.head, 2);
	ASSERT_UEQ(e.n_out, 1);
	ASSERT_UEQ(e.n_in, 2);
	ASSERT_PTR_EQ(e.iov[0].iov_base, buf0 + 0x10000);
	ASSERT_UEQ(e.iov[0].iov_len, 16);
	ASSERT_PTR_EQ(e.iov[1].iov_base, buf0 + 0x10000 + 512);
	ASSERT_UEQ(e.iov[1].iov_len, 4096);
	ASSERT_UEQ(e.iov[2].iov_len, 1);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 0);
	ASSERT_UEQ(vr.last_avail, 1);
}

static void test_split_across_regions(void)
{
	struct ioc__vub_elem e;

	setup(false, false);
	/* 4 KiB starting 1 KiB before the boundary between the regions. */
	set_desc(DESC_GPA, 0, R1_GPA - 1024, 4096, VRING_DESC_F_WRITE, 0);
	make_avail(0);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.n_in, 2);
	ASSERT_PTR_EQ(e.iov[0].iov_base, buf0 + R_SIZE - 1024);
	ASSERT_UEQ(e.iov[0].iov_len, 1024);
	ASSERT_PTR_EQ(e.iov[1].iov_base, buf1);
	ASSERT_UEQ(e.iov[1].iov_len, 3072);
	/* Zero-length descriptors add nothing. */
	set_desc(DESC_GPA, 1, 0, 0, VRING_DESC_F_NEXT, 2);
	set_desc(DESC_GPA, 2, DATA_GPA, 8, 0, 0);
	make_avail(1);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.n_out, 1);
}

static void test_outside_memory(void)
{
	setup(false, false);
	set_desc(DESC_GPA, 0, 0x1000, 16, 0, 0);
	make_avail(0);
	expect_fault("outside guest memory");

	/* Starts inside, runs past the end of the last region. */
	setup(false, false);
	set_desc(DESC_GPA, 0, R1_GPA + R_SIZE - 16, 32, 0, 0);
	make_avail(0);
	expect_fault("outside guest memory");

	/* Wraps the address space. */
	setup(false, false);
	set_desc(DESC_GPA, 0, UINT64_MAX - 4, 16, 0, 0);
	make_avail(0);
	expect_fault("outside guest memory");
}

static void test_loop(void)
{
	setup(false, false);
	set_desc(DESC_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT, 1);
	set_desc(DESC_GPA, 1, DATA_GPA, 16, VRING_DESC_F_NEXT, 0);
	make_avail(0);
	expect_fault("loops");

	/* Self-loop on one descriptor. */
	setup(false, false);
	set_desc(DESC_GPA, 3, DATA_GPA, 16, VRING_DESC_F_NEXT, 3);
	make_avail(3);
	expect_fault("loops");

	/* A chain of every descriptor that points back to the second. */
	setup(false, false);
	for (unsigned i = 0; i < QSZ; i++)
		set_desc(DESC_GPA, i, DATA_GPA, 16, VRING_DESC_F_NEXT,
			 (uint16_t)(i + 1 < QSZ ? i + 1 : 1));
	make_avail(0);
	expect_fault("loops");
}

static void test_bad_indices(void)
{
	struct vring_avail *a;

	setup(false, false);
	set_desc(DESC_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT, QSZ);
	make_avail(0);
	expect_fault("next descriptor out of range");

	setup(false, false);
	make_avail(QSZ);
	expect_fault("avail entry out of range");

	setup(false, false);
	a = host(AVAIL_GPA);
	a->idx = QSZ + 1;
	expect_fault("ran ahead");
}

static void test_order(void)
{
	setup(false, false);
	set_desc(DESC_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
	set_desc(DESC_GPA, 1, DATA_GPA, 16, 0, 0);
	make_avail(0);
	expect_fault("readable descriptor after a writable");
}

static void test_too_many_segments(void)
{
	struct ioc__vub_elem e;

	/* An indirect table of VUB_REQ_IOV + 1 one-byte buffers. */
	setup(true, false);
	for (unsigned i = 0; i <= VUB_REQ_IOV; i++)
		set_desc(IND_GPA, i, DATA_GPA + i, 1, VRING_DESC_F_NEXT, (uint16_t)(i + 1));
	set_desc(IND_GPA, VUB_REQ_IOV, DATA_GPA, 1, 0, 0);
	set_desc(DESC_GPA, 0, IND_GPA, (VUB_REQ_IOV + 1) * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("too many segments");

	/* VUB_REQ_IOV exactly is fine. */
	setup(true, false);
	for (unsigned i = 0; i < VUB_REQ_IOV; i++)
		set_desc(IND_GPA, i, DATA_GPA + i, 1, VRING_DESC_F_NEXT, (uint16_t)(i + 1));
	set_desc(IND_GPA, VUB_REQ_IOV - 1, DATA_GPA, 1, 0, 0);
	set_desc(DESC_GPA, 0, IND_GPA, VUB_REQ_IOV * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.n_out, VUB_REQ_IOV);
}

static void test_indirect(void)
{
	struct ioc__vub_elem e;

	setup(true, false);
	set_desc(IND_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT, 1);
	set_desc(IND_GPA, 1, DATA_GPA + 4096, 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
	set_desc(IND_GPA, 2, DATA_GPA + 8192, 1, VRING_DESC_F_WRITE, 0);
	set_desc(DESC_GPA, 4, IND_GPA, 3 * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(4);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.head, 4);
	ASSERT_UEQ(e.n_out, 1);
	ASSERT_UEQ(e.n_in, 2);
	ASSERT_UEQ(e.iov[1].iov_len, 512);

	/* An unaligned indirect table is read correctly too. */
	memmove((uint8_t *)host(IND_GPA) + 4, host(IND_GPA), 3 * 16);
	set_desc(DESC_GPA, 4, IND_GPA + 4, 3 * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(4);
	ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	ASSERT_UEQ(e.n_in, 2);
}

static void test_indirect_faults(void)
{
	setup(false, false);
	set_desc(DESC_GPA, 0, IND_GPA, 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("not negotiated");

	setup(true, false);
	set_desc(IND_GPA, 0, IND_GPA, 16, VRING_DESC_F_INDIRECT, 0);
	set_desc(DESC_GPA, 0, IND_GPA, 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("inside an indirect table");

	setup(true, false);
	set_desc(DESC_GPA, 0, IND_GPA, 16, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
	make_avail(0);
	expect_fault("indirect descriptor with NEXT");

	static const uint32_t bad_len[] = { 0, 17, 8, (VUB_INDIRECT_MAX + 1) * 16 };
	for (size_t i = 0; i < IOC_ARRAY_SIZE(bad_len); i++) {
		setup(true, false);
		set_desc(DESC_GPA, 0, IND_GPA, bad_len[i], VRING_DESC_F_INDIRECT, 0);
		make_avail(0);
		expect_fault("indirect table of bad size");
	}

	setup(true, false);
	set_desc(DESC_GPA, 0, 0x1000, 64, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("indirect table outside guest memory");

	/* Crossing regions: one table must be in one region. */
	setup(true, false);
	set_desc(DESC_GPA, 0, R1_GPA - 32, 64, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("indirect table outside guest memory");

	/* A loop inside the indirect table. */
	setup(true, false);
	set_desc(IND_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT, 1);
	set_desc(IND_GPA, 1, DATA_GPA, 16, VRING_DESC_F_NEXT, 0);
	set_desc(DESC_GPA, 0, IND_GPA, 2 * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("loops");

	/* next past the indirect table's end. */
	setup(true, false);
	set_desc(IND_GPA, 0, DATA_GPA, 16, VRING_DESC_F_NEXT, 2);
	set_desc(DESC_GPA, 0, IND_GPA, 2 * 16, VRING_DESC_F_INDIRECT, 0);
	make_avail(0);
	expect_fault("next descriptor out of range");
}

static uint64_t drain_efd(int fd)
{
	uint64_t v = 0;

	if (read(fd, &v, sizeof(v)) != sizeof(v))
		return 0;
	return v;
}

static void test_used_and_signal(void)
{
	struct vring_used *u;
	struct vring_avail *a;
	int efd = eventfd(0, EFD_NONBLOCK);

	ASSERT_GE(efd, 0);
	setup(false, false);
	vr.call_fd = efd;
	u = host(USED_GPA);
	a = host(AVAIL_GPA);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));   /* nothing pushed */
	ioc__vub_vring_push(&vr, 3, 17);
	ioc__vub_vring_push(&vr, 5, 1);
	ASSERT_UEQ(u->idx, 0);                      /* not yet visible */
	ASSERT_TRUE(ioc__vub_vring_flush(&vr));
	ASSERT_UEQ(u->idx, 2);
	ASSERT_UEQ(u->ring[0].id, 3);
	ASSERT_UEQ(u->ring[0].len, 17);
	ASSERT_UEQ(u->ring[1].id, 5);
	ASSERT_UEQ(drain_efd(efd), 1);              /* one signal per batch */
	/* NO_INTERRUPT: published, no signal. */
	a->flags = VRING_AVAIL_F_NO_INTERRUPT;
	ioc__vub_vring_push(&vr, 1, 1);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));
	ASSERT_UEQ(u->idx, 3);
	ASSERT_UEQ(drain_efd(efd), 0);
	/* No call fd: never signals. */
	a->flags = 0;
	vr.call_fd = -1;
	ioc__vub_vring_push(&vr, 1, 1);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));
	close(efd);
}

static void test_event_idx(void)
{
	struct vring_avail *a;
	struct vring_used *u;
	int efd = eventfd(0, EFD_NONBLOCK);

	ASSERT_GE(efd, 0);
	setup(false, true);
	vr.call_fd = efd;
	a = host(AVAIL_GPA);
	u = host(USED_GPA);
	/* The first batch after a start signals whatever used_event says:
	 * entries a dead back end published may never have been signalled. */
	a->ring[QSZ] = 0x8000;
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_TRUE(ioc__vub_vring_flush(&vr));     /* idx 1 */
	ASSERT_UEQ(drain_efd(efd), 1);
	/* used_event = 2: signal when used->idx passes entry 2. */
	a->ring[QSZ] = 2;
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));    /* idx 2: entry 2 not used yet */
	ioc__vub_vring_push(&vr, 0, 1);
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_TRUE(ioc__vub_vring_flush(&vr));     /* idx 4: passed 2 */
	ASSERT_UEQ(drain_efd(efd), 1);
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));    /* used_event still 2 */
	ASSERT_UEQ(u->idx, 5);
	/* Wrap-around of the 16-bit indices. */
	vr.used_idx = vr.published = 0xfffe;
	a->ring[QSZ] = 0xffff;
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_FALSE(ioc__vub_vring_flush(&vr));    /* idx 0xffff */
	ioc__vub_vring_push(&vr, 0, 1);
	ASSERT_TRUE(ioc__vub_vring_flush(&vr));     /* idx 0: passed 0xffff */
	ASSERT_UEQ(u->idx, 0);
	close(efd);

	/* arm: avail_event follows last_avail; reports a racing request. */
	setup(false, true);
	ASSERT_FALSE(ioc__vub_vring_arm(&vr));
	set_desc(DESC_GPA, 0, DATA_GPA, 16, 0, 0);
	make_avail(0);
	ASSERT_TRUE(ioc__vub_vring_arm(&vr));
	{
		struct ioc__vub_elem e;

		ASSERT_EQ(ioc__vub_vring_pop(&vr, &e), 1);
	}
	ASSERT_FALSE(ioc__vub_vring_arm(&vr));
	u = host(USED_GPA);
	ASSERT_UEQ(*(uint16_t *)&u->ring[QSZ], 1);
}

/* Random garbage in the descriptor table: never a crash, and every iovec
 * handed out lies inside one of the two buffers. */
static void test_garbage(void)
{
	uint64_t x = 88172645463325252ull;

	for (int round = 0; round < 2000; round++) {
		struct ioc__vub_elem e;
		int r;

		setup(round & 1, round & 2);
		for (unsigned i = 0; i < QSZ; i++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			uint64_t addr = (x & 1) ? R0_GPA + (x >> 8) % (2 * R_SIZE)
						: x;
			set_desc(DESC_GPA, i, (x & 2) ? IND_GPA : addr,
				 (uint32_t)(x >> 20) % 8192, (uint16_t)(x >> 40) & 7,
				 (uint16_t)((x >> 48) % (QSZ + 2)));
			set_desc(IND_GPA, i, addr, (uint32_t)(x >> 24) % 4096,
				 (uint16_t)(x >> 44) & 7, (uint16_t)((x >> 52) % (QSZ + 2)));
		}
		for (int k = 0; k < 4; k++)
			make_avail((uint16_t)((x >> (k * 4)) % (QSZ + 1)));
		while ((r = ioc__vub_vring_pop(&vr, &e)) == 1) {
			for (unsigned i = 0; i < e.n_out + e.n_in; i++) {
				uint8_t *p = e.iov[i].iov_base;
				size_t l = e.iov[i].iov_len;
				bool in0 = p >= buf0 && p + l <= buf0 + R_SIZE;
				bool in1 = p >= buf1 && p + l <= buf1 + R_SIZE;

				ASSERT_TRUE(in0 || in1);
			}
		}
		ASSERT_TRUE(r == 0 || r == -EPROTO);
	}
}

/* The dirty log alone: page bits, the byte-wide path, the log's end, an
 * iovec crossing into the second region. */
static void test_dirty_log(void)
{
	uint64_t words[3] = { 0 };
	uint8_t bytes[9] = { 0 };
	struct ioc__vub_log w = { .bits = (uint8_t *)words, .size = 24, .words = true };
	struct ioc__vub_log b = { .bits = bytes + 1, .size = 8, .words = false };

	ioc__vub_log_gpa(&w, 0x1000, 1);
	ASSERT_UEQ(words[0], 2);
	ioc__vub_log_gpa(&w, 0x3fff, 2);                  /* pages 3 and 4 */
	ASSERT_UEQ(words[0], 0x1a);
	ioc__vub_log_gpa(&w, 64 * 4096 - 1, 4097 + 4096); /* pages 63..65 */
	ASSERT_UEQ(words[0], 0x800000000000001aull);
	ASSERT_UEQ(words[1], 3);
	ioc__vub_log_gpa(&w, 0x1000, 0);                  /* nothing */
	ioc__vub_log_gpa(&w, 191 * 4096, UINT64_MAX);     /* to the log's end */
	ASSERT_UEQ(words[2], 1ull << 63);
	ioc__vub_log_gpa(&w, UINT64_MAX - 10, 100);       /* far past it */
	ASSERT_UEQ(words[2], 1ull << 63);
	ioc__vub_log_gpa(&b, 9 * 4096, 4096);
	ASSERT_UEQ(bytes[2], 2);
	ioc__vub_log_gpa(&b, 63 * 4096, 8192);            /* page 64: past */
	ASSERT_UEQ(bytes[8], 0x80);
	ASSERT_UEQ(bytes[0], 0);
	ioc__vub_log_gpa(NULL, 0, 4096);                  /* no log */

	/* Host addresses back to guest pages, through each region. */
	{
		static uint64_t big[(R1_GPA + R_SIZE) / 4096 / 64];
		struct ioc__vub_log l = { .bits = (uint8_t *)big, .size = sizeof(big),
					  .words = true };
		struct iovec iov[2];

		setup(false, false);
		iov[0] = (struct iovec){ host(R1_GPA - 4096), 4096 };
		iov[1] = (struct iovec){ host(R1_GPA), 8192 };
		ioc__vub_log_iov(&l, &mem, iov, 2, 4096 + 4097);   /* 1 byte into page 3 */
		for (uint64_t p = 0; p < sizeof(big) * 8; p++) {
			uint64_t r1 = R1_GPA / 4096;
			bool want = p == r1 - 1 || p == r1 || p == r1 + 1;

			ASSERT_UEQ(!!(big[p / 64] & (1ull << (p % 64))), want);
		}
	}
}

IOC_TEST_MAIN(
	IOC_TEST(test_dirty_log),
	IOC_TEST(test_map),
	IOC_TEST(test_translate),
	IOC_TEST(test_simple_chain),
	IOC_TEST(test_split_across_regions),
	IOC_TEST(test_outside_memory),
	IOC_TEST(test_loop),
	IOC_TEST(test_bad_indices),
	IOC_TEST(test_order),
	IOC_TEST(test_too_many_segments),
	IOC_TEST(test_indirect),
	IOC_TEST(test_indirect_faults),
	IOC_TEST(test_used_and_signal),
	IOC_TEST(test_event_idx),
	IOC_TEST(test_garbage),
)
