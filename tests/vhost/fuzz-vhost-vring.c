/*
 * Fuzz target: the split-ring walker.  The input is guest memory: two
 * regions of 32 KiB (the second starting where the first ends, so
 * buffers can straddle them) filled from the input, with the rings at
 * fixed places in the first; the first bytes choose the ring size, the
 * negotiated features and where the avail index starts.  Everything the
 * walker hands out must lie inside the two regions (checked here; ASan
 * checks the walker's own reads), pops end in 0 or a fault, and a
 * completion for each request goes through push and flush.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vub-int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RSZ  0x8000u
#define GPA0 0x40000u

static unsigned long popped, faults;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t *m;
	static struct ioc__vub_elem e;
	struct ioc__vub_mem mem;
	struct ioc__vub_vring vr = { .call_fd = -1 };
	int budget = 64;

	if (size < 4)
		return 0;
	if (!m && !(m = aligned_alloc(4096, 2 * RSZ)))
		abort();
	memset(m, 0, 2 * RSZ);
	memcpy(m, data + 4, size - 4 < 2 * RSZ ? size - 4 : 2 * RSZ);
	mem.n = 2;
	mem.r[0] = (struct ioc__vub_region){ GPA0, RSZ, GPA0, m, NULL, 0 };
	mem.r[1] = (struct ioc__vub_region){ GPA0 + RSZ, RSZ, GPA0 + RSZ, m + RSZ, NULL, 0 };
	vr.num = 1u << (data[0] % 9);            /* 1 .. 256 */
	vr.indirect = data[1] & 1;
	vr.event_idx = data[1] & 2;
	vr.desc_uva = GPA0;                       /* 4 KiB at most */
	vr.avail_uva = GPA0 + 0x1000;
	vr.used_uva = GPA0 + 0x2000;
	if (data[1] & 4)
		vr.used_uva = GPA0 + RSZ - 64;    /* straddles: refused */
	vr.last_avail = (uint16_t)(data[2] | data[3] << 8);
	if (ioc__vub_vring_map(&vr, &mem) < 0)
		return 0;
	vr.used_idx = vr.published = vr.last_avail;
	while (budget-- > 0) {
		int r = ioc__vub_vring_pop(&vr, &e);

		if (r == -EPROTO)
			faults++;
		if (r == 0 || r == -EPROTO)
			break;
		popped++;
		if (r != 1 || e.n_out + e.n_in > VUB_REQ_IOV)
			abort();
		for (unsigned i = 0; i < e.n_out + e.n_in; i++) {
			uint8_t *p = e.iov[i].iov_base;
			size_t l = e.iov[i].iov_len;

			if (p < m || p + l > m + 2 * RSZ || (p < m + RSZ && p + l > m + RSZ))
				abort();
		}
		ioc__vub_vring_push(&vr, e.head, 1);
		if (budget % 4 == 0)
			ioc__vub_vring_flush(&vr);
	}
	ioc__vub_vring_flush(&vr);
	ioc__vub_vring_arm(&vr);
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-runner.h"

static bool fuzz_report(void)
{
	printf("# %lu requests taken, %lu ring faults\n", popped, faults);
	return popped > 100 && faults > 100;
}

static void desc(struct input *in, unsigned i, uint64_t addr, uint32_t len, uint16_t flags,
		 uint16_t next)
{
	struct vring_desc d = { addr, len, flags, next };

	memcpy(in->b + 4 + i * 16, &d, 16);
}

static void avail(struct input *in, uint16_t idx, const uint16_t *heads, unsigned n)
{
	memcpy(in->b + 4 + 0x1000 + 2, &idx, 2);
	memcpy(in->b + 4 + 0x1000 + 4, heads, 2 * n);
}

static unsigned make_inputs(struct input *ins)
{
	static const uint16_t h[4] = { 0, 3, 5, 7 };
	unsigned n = 0;

	for (; n < 6; n++) {
		struct input *in = &ins[n];

		in->n = 4 + 2 * RSZ;
		in->b[0] = (uint8_t)(4 + (n % 3));   /* 16, 32, 64 entries */
		in->b[1] = (uint8_t)(n & 3);
		/* header, data across the region boundary, status */
		desc(in, 0, GPA0 + 0x3000, 16, VRING_DESC_F_NEXT, 1);
		desc(in, 1, GPA0 + RSZ - 512, 1024, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
		desc(in, 2, GPA0 + 0x3100, 1, VRING_DESC_F_WRITE, 0);
		/* an indirect table */
		desc(in, 3, GPA0 + 0x4000, 48, VRING_DESC_F_INDIRECT, 0);
		memcpy(in->b + 4 + 0x4000, in->b + 4, 48);
		/* a loop, and a chain running off the table */
		desc(in, 5, GPA0 + 0x3000, 16, VRING_DESC_F_NEXT, 6);
		desc(in, 6, GPA0 + 0x3000, 16, VRING_DESC_F_NEXT, (uint16_t)(n < 3 ? 5 : 200));
		desc(in, 7, GPA0 + 0x3000, 16, 0, 0);
		avail(in, (uint16_t)(1 + n % 4), h, 4);
	}
	return n;
}
#endif
