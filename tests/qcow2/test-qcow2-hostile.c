/*
 * Hostile images: qemu-img's images with one field or table entry
 * damaged at a time.  Header faults are refused at open with the field
 * named (QEMU's words where it has them); read-only opens still take
 * what only forbids writing (corrupt).  Table faults (L1, L2,
 * compressed data, refcount table, subcluster bitmaps) open and then fail
 * the request that meets them with -EIO; with the dirty bit set, a
 * writable open counts the refcounts again and refuses them instead,
 * writing nothing.  Nothing may crash.
 */
#include "q2-test.h"

static char *good, *work;

static void put_be(const char *path, uint64_t off, uint64_t v, int bytes)
{
	uint8_t b[8];
	int fd = open(path, O_WRONLY);

	ASSERT_GE(fd, 0);
	for (int i = 0; i < bytes; i++)
		b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
	ASSERT_EQ(pwrite(fd, b, (size_t)bytes, (off_t)off), bytes);
	close(fd);
}

static uint64_t get_be(const char *path, uint64_t off, int bytes)
{
	uint8_t b[8];
	uint64_t v = 0;
	int fd = open(path, O_RDONLY);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, b, (size_t)bytes, (off_t)off), bytes);
	close(fd);
	for (int i = 0; i < bytes; i++)
		v = v << 8 | b[i];
	return v;
}

/* A fresh copy of the good image to damage. */
static const char *fresh(void)
{
	Q2T_SH_OK("cp '%s' '%s'", good, work);
	return work;
}

static void expect_refused(const char *path, bool rw, const char *want)
{
	char err[512];
	struct ioc_node *n;
	int ret = q2t_open("bad", path, !rw, "", &n, err, sizeof(err));

	if (ret == 0)
		ioc_test_fail(__FILE__, __LINE__, "opened; wanted \"%s\"", want);
	ioc_test_diag("refused (%s): %s", strerror(-ret), err);
	if (!strstr(err, want))
		ioc_test_fail(__FILE__, __LINE__, "\"%s\" does not say \"%s\"", err, want);
}

static void expect_opens(const char *path, bool rw)
{
	char err[512];
	struct ioc_node *n;

	if (q2t_open("ok", path, !rw, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	q2t_close(n);
}

struct io_arg {
	struct ioc_node *n;
	uint64_t off, len;
	bool write;
	int ret;
};

static void ioc_coroutine_fn io_co(void *opaque)
{
	struct io_arg *a = opaque;
	uint8_t *buf = calloc(1, a->len);

	a->ret = a->write ? ioc_node_co_pwrite(a->n, a->off, buf, a->len, 0)
			  : ioc_node_co_pread(a->n, a->off, buf, a->len, 0);
	if (a->ret == 0 && a->write)
		a->ret = ioc_node_co_flush(a->n, 0);
	free(buf);
}

/* Opens; then the request over [off, off+len) fails with -EIO. */
static void expect_eio(const char *path, bool write, uint64_t off, uint64_t len)
{
	char err[512];
	struct ioc_node *n;
	struct io_arg a = { NULL, off, len, write, 0 };

	if (q2t_open("t", path, !write, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	a.n = n;
	bt_run_co_fn(io_co, &a);
	ASSERT_EQ(a.ret, -EIO);
	q2t_close(n);
}

static void setup(void)
{
	if (good)
		return;
	good = q2t_path("good.qcow2");
	work = q2t_path("work.qcow2");
	/* 4 KiB clusters; data in the first clusters, a snapshot. */
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o cluster_size=4k '%s' 1M", good);
	Q2T_SH_OK("qemu-io -f qcow2 -c 'write -P 0x61 0 64k' '%s' >/dev/null", good);
	Q2T_SH_OK("qemu-img snapshot -c s1 '%s'", good);
	expect_opens(good, true);
	expect_opens(good, false);
}

static void test_header_fields(void)
{
	setup();
	put_be(fresh(), 0, 0x514649fa, 4);
	expect_refused(work, false, "Image is not in qcow2 format");
	put_be(fresh(), 4, 1, 4);
	expect_refused(work, false, "Unsupported qcow2 version 1");
	put_be(fresh(), 4, 4, 4);
	expect_refused(work, false, "Unsupported qcow2 version 4");
	put_be(fresh(), 20, 8, 4);
	expect_refused(work, false, "Unsupported cluster size: 2^8");
	put_be(fresh(), 20, 22, 4);
	expect_refused(work, false, "Unsupported cluster size: 2^22");
	put_be(fresh(), 100, 96, 4);
	expect_refused(work, false, "qcow2 header too short");
	put_be(fresh(), 100, 8192, 4);
	expect_refused(work, false, "qcow2 header exceeds cluster size");
	put_be(fresh(), 100, 108, 4);
	expect_refused(work, false, "not a multiple of 8");
	put_be(fresh(), 8, 5000, 8);
	expect_refused(work, false, "Invalid backing file offset");
	put_be(fresh(), 8, 40, 8);
	expect_refused(work, false, "Invalid backing file offset");
	put_be(fresh(), 8, 2048, 8);
	put_be(work, 16, 2049, 4);
	expect_refused(work, false, "Backing file name too long");
	put_be(fresh(), 32, 1, 4);
	expect_refused(work, false, "encrypted");
	put_be(fresh(), 96, 7, 4);
	expect_refused(work, false, "Reference count entry width too large");
}

static void test_features(void)
{
	setup();
	put_be(fresh(), 72, 1ull << 5, 8);
	expect_refused(work, false, "Unsupported qcow2 feature(s): Unknown incompatible "
		       "feature: 20");
	put_be(fresh(), 72, 1ull << 2, 8);
	expect_refused(work, false, "external data file");
	/* Dirty: repaired at a writable open (test_dirty); corrupt forbids
	 * writing only. */
	put_be(fresh(), 72, 1ull << 0, 8);
	expect_opens(work, false);
	ASSERT_UEQ(get_be(work, 72, 8), 1);
	expect_opens(work, true);
	ASSERT_UEQ(get_be(work, 72, 8), 0);
	put_be(fresh(), 72, 1ull << 1, 8);
	expect_refused(work, true, "qcow2: Image is corrupt; cannot be opened read/write");
	expect_opens(work, false);
	/* Compression type and its feature bit disagree, or are unknown. */
	put_be(fresh(), 104, 1, 1);
	expect_refused(work, false, "Compression type incompatible feature bit must be set");
	put_be(fresh(), 104, 7, 1);
	expect_refused(work, false, "unknown compression type: 7");
	put_be(fresh(), 72, 1ull << 3, 8);
	expect_refused(work, false, "Compression type incompatible feature bit must not be set");
	/* Extended L2 needs 16 KiB clusters. */
	put_be(fresh(), 72, 1ull << 4, 8);
	expect_refused(work, false, "Extended L2 entries are only supported");
	/* The raw-data autoclear bit needs a data file. */
	put_be(fresh(), 88, 2, 8);
	expect_refused(work, false, "data-file-raw requires a data file");
}

static void test_tables(void)
{
	uint64_t rt, l1, fsz;
	struct stat st;

	setup();
	ASSERT_OK(stat(good, &st));
	fsz = (uint64_t)st.st_size;
	rt = get_be(good, 48, 8);
	l1 = get_be(good, 40, 8);
	put_be(fresh(), 56, 0, 4);
	expect_refused(work, false, "Image does not contain a reference count table");
	put_be(fresh(), 56, 0x10000, 4);
	expect_refused(work, false, "Reference count table too large");
	put_be(fresh(), 48, rt + 8, 8);
	expect_refused(work, false, "Reference count table offset invalid");
	put_be(fresh(), 48, 0, 8);
	expect_refused(work, false, "Reference count table offset invalid");
	put_be(fresh(), 48, fsz + 4096, 8);
	expect_refused(work, false, "Reference count table offset invalid");
	put_be(fresh(), 36, 0x7fffffff, 4);
	expect_refused(work, false, "Active L1 table too large");
	put_be(fresh(), 36, 0, 4);
	expect_refused(work, false, "L1 table is too small");
	put_be(fresh(), 40, l1 + 512, 8);
	expect_refused(work, false, "Active L1 table offset invalid");
	put_be(fresh(), 40, rt, 8);
	expect_refused(work, false, "overlaps the reference count table");
	put_be(fresh(), 40, fsz + 4096, 8);
	expect_refused(work, false, "Active L1 table offset invalid");
	put_be(fresh(), 24, 1ull << 40, 8);
	expect_refused(work, false, "L1 table is too small");
	put_be(fresh(), 24, ~0ull, 8);
	expect_refused(work, false, "Image is too big");
	put_be(fresh(), 60, 70000, 4);
	expect_refused(work, false, "Snapshot table too large");
	put_be(fresh(), 64, get_be(good, 64, 8) + 8, 8);
	expect_refused(work, false, "Snapshot table offset invalid");
	put_be(fresh(), 60, 200, 4);
	expect_refused(work, false, "Snapshot table offset invalid");
	/* The snapshot's own entry. */
	{
		uint64_t so = get_be(good, 64, 8);

		put_be(fresh(), so + 36, 5000, 4);
		expect_refused(work, false, "Too much extra metadata in snapshot table entry 0");
		put_be(fresh(), so, get_be(good, so, 8) + 1, 8);
		expect_refused(work, false, "Snapshot L1 table offset invalid");
		put_be(fresh(), so + 8, 0x7fffffff, 4);
		expect_refused(work, false, "Snapshot L1 table too large");
	}
}

/* Extensions written after the header (qemu-img 7.2 writes none here). */
static void test_extensions(void)
{
	uint64_t hl;

	setup();
	hl = get_be(good, 100, 4);
	put_be(fresh(), hl + 4, 0xfffff, 4);
	expect_refused(work, false, "Header extension too large");
	/* A bitmaps extension with a wrong length, then a damaged one. */
	put_be(fresh(), hl, 0x23852875, 4);
	put_be(work, hl + 4, 16, 4);
	expect_refused(work, false, "bitmaps_ext: Invalid extension length");
	put_be(fresh(), hl, 0x23852875, 4);
	put_be(work, hl + 4, 24, 4);
	put_be(work, 88, 1, 8);
	put_be(work, hl + 8, 0, 4);
	expect_refused(work, false, "found bitmaps extension with zero bitmaps");
	put_be(fresh(), hl, 0x23852875, 4);
	put_be(work, hl + 4, 24, 4);
	put_be(work, 88, 1, 8);
	put_be(work, hl + 8, 1, 4);
	put_be(work, hl + 12, 1, 4);
	expect_refused(work, false, "bitmaps_ext: Reserved field is not zero");
	put_be(work, hl + 12, 0, 4);
	put_be(work, hl + 8, 70000, 4);
	expect_refused(work, false, "exceeding the QEMU supported maximum");
	/* An unknown bit the image's feature table names: named. */
	put_be(fresh(), hl, 0x6803f857, 4);
	put_be(work, hl + 4, 48, 4);
	put_be(work, hl + 8, 0x0005, 2);
	{
		int fd = open(work, O_WRONLY);

		ASSERT_EQ(pwrite(fd, "fancy\0", 6, (off_t)(hl + 10)), 6);
		close(fd);
	}
	put_be(work, 72, (1ull << 5) | (1ull << 9), 8);
	expect_refused(work, false, "Unsupported qcow2 feature(s): fancy, Unknown "
		       "incompatible feature: 200");
	/* Unknown extensions are skipped. */
	put_be(fresh(), hl, 0x12345678, 4);
	expect_opens(work, false);
}

/* Where the bitmaps extension of path says the directory is, and the
 * offset of the extension's data (0: none). */
static uint64_t bitmaps_ext(const char *path, uint64_t *dir_off)
{
	uint64_t off = get_be(path, 100, 4);

	for (int i = 0; i < 16; i++) {
		uint32_t type = (uint32_t)get_be(path, off, 4), len = (uint32_t)get_be(path, off + 4, 4);

		if (type == 0)
			break;
		if (type == 0x23852875) {
			*dir_off = get_be(path, off + 24, 8);
			return off + 8;
		}
		off += 8 + ((len + 7) & ~7u);
	}
	return 0;
}

/* A bitmap directory of qemu-img's, one field damaged at a time: refused
 * at open with the bitmap and the field named (read-only and
 * read-write); an in-use bitmap's table is not read, so it opens. */
static void test_bitmap_directory(void)
{
	char *bm = q2t_path("bm.qcow2");
	uint64_t ext, dir, table, fsz;
	struct stat st;

	Q2T_SH_OK("qemu-img create -q -f qcow2 -o cluster_size=4k '%s' 1M && "
		  "qemu-img bitmap --add '%s' b0 && "
		  "qemu-io -f qcow2 -c 'write -P 0x33 128k 4k' '%s' >/dev/null && "
		  "cp '%s' '%s'", bm, bm, bm, bm, work);
	expect_opens(work, false);
	expect_opens(work, true);      /* (a clean close moves the directory) */
	ext = bitmaps_ext(bm, &dir);
	ASSERT_NE(ext, 0);
	table = get_be(bm, dir, 8);
	ASSERT_NE(get_be(bm, table, 8), 0);  /* qemu-io's write: a data cluster */
	ASSERT_OK(stat(bm, &st));
	fsz = (uint64_t)st.st_size;
#define DAMAGE(off, v, bytes, want) do {                                  \
		Q2T_SH_OK("cp '%s' '%s'", bm, work);                              \
		put_be(work, (off), (v), (bytes));                                \
		expect_refused(work, false, (want));                              \
		expect_refused(work, true, (want));                               \
	} while (0)
	DAMAGE(dir + 16, 2, 1, "Bitmap 'b0' doesn't satisfy the constraints: type 2");
	DAMAGE(dir + 17, 40, 1, "granularity_bits 40 is not in 9..31");
	DAMAGE(dir + 12, 0x12, 4, "flags 0x12 has reserved bits");
	DAMAGE(dir + 20, 8, 4, "Broken bitmap directory");   /* past the end */
	Q2T_SH_OK("cp '%s' '%s' && truncate -s +4096 '%s'", bm, work, work);
	put_be(work, dir + 20, 8, 4);
	put_be(work, ext + 8, 40, 8);        /* zeroes after the entry */
	expect_refused(work, false, "Bitmap extra data is not supported");
	DAMAGE(dir + 18, 2000, 2, "Broken bitmap directory");
	DAMAGE(dir + 8, 0, 4, "bitmap_table_size is 0");
	DAMAGE(dir + 8, 0x8000001, 4, "bitmap_table_size 134217729 exceeds");
	DAMAGE(dir, table + 512, 8, "is not a cluster offset");
	DAMAGE(dir, 0, 8, "is not a cluster offset");
	DAMAGE(dir, (fsz + 4096) & ~4095ull, 8, "ends past the end of the file");
	DAMAGE(ext, 2, 4, "Less bitmaps found than specified in header extension");
	DAMAGE(ext + 8, 8, 8, "Broken bitmap directory");
	DAMAGE(ext + 16, (fsz + 4096) & ~4095ull, 8, "bitmap directory offset");
	DAMAGE(table, 0xff00000000000000ull, 8, "reserved bits set");
	DAMAGE(table, (fsz + 8192) & ~4095ull, 8, "past the end of the file");
	DAMAGE(table, 4097, 8, "has an offset and the all-ones bit");
	DAMAGE(dir + 8, 3, 4, "does not match the image size");
	/* 512 bytes is QEMU's smallest granule: the one table cluster still
	 * covers the image, so it opens (the bits mean other granules). */
	Q2T_SH_OK("cp '%s' '%s'", bm, work);
	put_be(work, dir + 17, 9, 1);
	expect_opens(work, false);
	expect_opens(work, true);
#undef DAMAGE
	/* In use: inconsistent, its table never read. */
	Q2T_SH_OK("cp '%s' '%s'", bm, work);
	put_be(work, dir + 12, 3, 4);
	put_be(work, table, 0xff00000000000000ull, 8);
	expect_opens(work, false);
	expect_opens(work, true);
	/* An all-ones entry is taken, and a clean close writes it back. */
	Q2T_SH_OK("cp '%s' '%s'", bm, work);
	put_be(work, table, 1, 8);
	/* (the data cluster it named is a leak now: repaired first) */
	Q2T_SH_OK("qemu-img check -q -r leaks '%s' >/dev/null 2>&1", work);
	expect_opens(work, true);
	Q2T_SH_OK("qemu-img check -q '%s' && qemu-img info '%s' | grep -q 'name: b0'", work,
		  work);
	unlink(bm);
	free(bm);
}

/* An overlay whose backing format extension is too long. */
static void test_backing_format(void)
{
	char *b = q2t_path("b.qcow2"), *t = q2t_path("t.qcow2");
	uint64_t hl;

	setup();
	Q2T_SH_OK("qemu-img create -q -f qcow2 '%s' 1M && qemu-img create -q -f qcow2 -b '%s' "
		  "-F qcow2 '%s'", b, b, t);
	expect_opens(t, false);
	hl = get_be(t, 100, 4);
	ASSERT_UEQ(get_be(t, hl, 4), 0xe2792aca);
	put_be(t, hl + 4, 20, 4);
	expect_refused(t, false, "ext_backing_format: len=20 too large");
	unlink(t);
	unlink(b);
	free(t);
	free(b);
}

static void test_l1_l2_entries(void)
{
	uint64_t l1, l2, e;
	char *z = q2t_path("z.qcow2");

	setup();
	l1 = get_be(good, 40, 8);
	l2 = get_be(good, l1, 8) & 0x00fffffffffffe00ull;
	ASSERT_UGT(l2, 0);
	/* L1: reserved bits, unaligned, past the end. */
	put_be(fresh(), l1, get_be(good, l1, 8) | 1, 8);
	expect_eio(work, false, 0, 4096);
	put_be(fresh(), l1, (get_be(good, l1, 8) & ~0x00fffffffffffe00ull) | (l2 + 512), 8);
	expect_eio(work, false, 0, 4096);
	put_be(fresh(), l1, 1ull << 40, 8);
	expect_eio(work, false, 0, 4096);
	expect_eio(work, true, 100, 4096);
	/* L2: unaligned, past the end, reserved bits, into the header. */
	e = get_be(good, l2, 8);
	put_be(fresh(), l2, e + 512, 8);
	expect_eio(work, false, 0, 512);
	put_be(fresh(), l2, (e & (1ull << 63)) | (1ull << 50), 8);
	expect_eio(work, false, 0, 512);
	put_be(fresh(), l2, e | (1ull << 57), 8);
	expect_eio(work, false, 0, 512);
	put_be(fresh(), l2, 1ull << 63 | 0, 8);
	put_be(work, l2 + 8, (1ull << 63) | 512, 8);
	expect_eio(work, false, 4096, 512);
	/* A compressed entry over garbage, and one past the end. */
	put_be(fresh(), l2, (1ull << 62) | 4096 * 3, 8);
	expect_eio(work, false, 0, 4096);
	put_be(fresh(), l2, (1ull << 62) | (1ull << 40), 8);
	expect_eio(work, false, 0, 4096);
	/* The refcount table names a block past the end: allocation fails. */
	put_be(fresh(), get_be(good, 48, 8), 1ull << 40, 8);
	expect_eio(work, true, 512 << 10, 4096);

	/* Extended L2: a subcluster both allocated and zero. */
	Q2T_SH_OK("qemu-img create -q -f qcow2 -o extended_l2=on '%s' 1M && qemu-io -f qcow2 "
		  "-c 'write -P 1 0 4k' '%s' >/dev/null", z, z);
	l1 = get_be(z, 40, 8);
	l2 = get_be(z, l1, 8) & 0x00fffffffffffe00ull;
	put_be(z, l2 + 8, 0x0000000100000001ull, 8);
	expect_eio(z, false, 0, 2048);
	put_be(z, l2 + 8, 1, 8);
	put_be(z, l2, 0, 8);
	expect_eio(z, false, 0, 2048);
	unlink(z);
	free(z);
}

static void set_dirty(const char *path)
{
	put_be(path, 72, get_be(path, 72, 8) | 1, 8);
}

/* The dirty image at work is refused writable, saying want, and left as
 * it was; read-only it still opens. */
static void expect_repair_refused(const char *want)
{
	size_t l0, l1;
	uint8_t *before = q2t_read_file(work, &l0), *after;

	expect_refused(work, true, want);
	after = q2t_read_file(work, &l1);
	ASSERT_UEQ(l0, l1);
	ASSERT_TRUE(memcmp(before, after, l0) == 0);
	free(before);
	free(after);
	expect_opens(work, false);
}

static void test_dirty(void)
{
	uint64_t rt, rb, l1, l2, e, so, x = 7;
	struct stat st;

	setup();
	ASSERT_OK(stat(good, &st));
	rt = get_be(good, 48, 8);
	rb = get_be(good, rt, 8);
	l1 = get_be(good, 40, 8);
	l2 = get_be(good, l1, 8) & 0x00fffffffffffe00ull;
	e = get_be(good, l2, 8) & 0x00fffffffffffe00ull;
	so = get_be(good, 64, 8);
	/* Wrong counts (16-bit): a data cluster at zero, the L2 table at 7,
	 * a free cluster at 1; repaired, clean, the data as it was. */
	set_dirty(fresh());
	put_be(work, rb + 2 * (e >> 12), 0, 2);
	put_be(work, rb + 2 * (l2 >> 12), 7, 2);
	put_be(work, rb + 2 * ((uint64_t)st.st_size >> 12) + 2, 1, 2);
	ASSERT_NE(q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", work), 0);
	expect_opens(work, true);
	ASSERT_UEQ(get_be(work, 72, 8), 0);
	Q2T_SH_OK("qemu-img check -q '%s'", work);
	Q2T_SH_OK("qemu-io -f qcow2 -r -c 'read -q -P 0x61 0 64k' '%s'", work);
	Q2T_SH_OK("qemu-img snapshot -a s1 '%s' && qemu-io -f qcow2 -r -c 'read -q -P 0x61 0 "
		  "64k' '%s'", work, work);

	/* A refcount table entry naming an L2 table. */
	set_dirty(fresh());
	put_be(work, rt, l2, 8);
	expect_repair_refused("is both metadata and an L2 table");
	/* An unaligned refcount block. */
	set_dirty(fresh());
	put_be(work, rt, rb + 512, 8);
	expect_repair_refused("refcount block 0");
	/* An L2 entry naming the refcount table, the active L1 table. */
	set_dirty(fresh());
	put_be(work, l2, rt, 8);
	expect_repair_refused("is both metadata and a data cluster");
	set_dirty(fresh());
	put_be(work, l2 + 8, l1, 8);
	expect_repair_refused("is both metadata and a data cluster");
	/* An L1 entry naming a refcount block. */
	set_dirty(fresh());
	put_be(work, l1, rb, 8);
	expect_repair_refused("is both metadata and an L2 table");
	/* A data cluster past the end of the file. */
	set_dirty(fresh());
	put_be(work, l2, ((uint64_t)st.st_size + (1 << 20)) & ~4095ull, 8);
	expect_repair_refused("past the end of the file");
	/* Two entries that each say they own a cluster alone. */
	set_dirty(fresh());
	put_be(work, l2, e | 1ull << 63, 8);
	put_be(work, l2 + 8, e | 1ull << 63, 8);
	expect_repair_refused("may have only one owner");
	/* The snapshot's L1 table over the active one. */
	set_dirty(fresh());
	put_be(work, so, l1, 8);
	expect_repair_refused("may have only one owner");
	/* A compressed entry over the refcount block. */
	set_dirty(fresh());
	put_be(work, l2, 1ull << 62 | rb, 8);
	expect_repair_refused("is both metadata and compressed data");

	/* Random damage with the dirty bit set: never a crash, a refusal
	 * says why. */
	for (int i = 0; i < (int)ioc_test_scaled(150); i++) {
		char err[512];
		struct ioc_node *n;
		uint64_t r = q2t_rand(&x);
		uint64_t off = (r >> 8) % (uint64_t)st.st_size;

		put_be(fresh(), off, q2t_rand(&x), 1 + (int)((r >> 4) % 8));
		set_dirty(work);
		if (q2t_open("r", work, false, "", &n, err, sizeof(err)) < 0) {
			ASSERT_TRUE(err[0] != 0);
			continue;
		}
		q2t_close(n);
	}
}

/* Random damage to the first cluster and the tables: whatever the
 * outcome, no crash, and a refusal says why. */
static void test_random_damage(void)
{
	uint64_t x = 99;
	struct stat st;

	setup();
	ASSERT_OK(stat(good, &st));
	for (int i = 0; i < (int)ioc_test_scaled(300); i++) {
		char err[512];
		struct ioc_node *n;
		uint64_t r = q2t_rand(&x);
		uint64_t off = (r & 1) ? r % 4096 % 200 : (r >> 8) % (uint64_t)st.st_size;

		put_be(fresh(), off, q2t_rand(&x), 1 + (int)((r >> 4) % 8));
		if (q2t_open("r", work, (r >> 3) & 1, "", &n, err, sizeof(err)) < 0) {
			ASSERT_TRUE(err[0] != 0);
			continue;
		}
		struct io_arg a = { n, (r >> 20) % (512 << 10), 64 << 10, !((r >> 3) & 1), 0 };

		bt_run_co_fn(io_co, &a);
		a.write = false;
		bt_run_co_fn(io_co, &a);
		q2t_close(n);
	}
}

static void test_cleanup(void)
{
	unlink(good);
	unlink(work);
	free(good);
	free(work);
}

Q2T_MAIN(
	IOC_TEST(test_header_fields),
	IOC_TEST(test_features),
	IOC_TEST(test_tables),
	IOC_TEST(test_extensions),
	IOC_TEST(test_backing_format),
	IOC_TEST(test_bitmap_directory),
	IOC_TEST(test_l1_l2_entries),
	IOC_TEST(test_dirty),
	IOC_TEST(test_random_damage),
	IOC_TEST(test_cleanup),
)
