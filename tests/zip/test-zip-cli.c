/* iocore-zip against real tools: zstd, gzip, pigz, dd; file handling. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "ioc-config.h"
#include "tap.h"
#include "iocore/common.h"
#include "zip-test-util.h"

static char tool_path[512];
/* The command that runs tool_path (through the cross build's emulator). */
static char tool[1024];
static const char *dir;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	if (st == -1)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void need(const char *bin)
{
	if (sh("command -v %s >/dev/null 2>&1", bin) != 0)
		IOC_SKIP("tool not installed");
}

static void cleanup(void)
{
	if (dir)
		sh("rm -rf '%s'", dir);
}

static void setup(void)
{
	const char *root = getenv("IOC_BUILD_ROOT");

	if (!tool[0]) {
		snprintf(tool_path, sizeof(tool_path), "%s/tools/zip/iocore-zip",
			 root ? root : ".");
		snprintf(tool, sizeof(tool), "%s %s", ioc_test_exe_wrapper(), tool_path);
		dir = ioc_test_tmpdir();
		atexit(cleanup);
	}
	if (access(tool_path, X_OK) != 0)
		IOC_SKIP("iocore-zip not built");
	ASSERT_EQ(sh("rm -rf %s/* %s/.[!.]* 2>/dev/null; true", dir, dir), 0);
}

static void make_file(const char *name, size_t n, int kind)
{
	char path[1024];
	uint8_t *p = malloc(n ? n : 1);
	FILE *f;

	if (kind == 0)
		zt_fill(p, n, n);
	else
		memset(p, 0, n);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	ASSERT_NOT_NULL(f);
	ASSERT_UEQ(fwrite(p, 1, n, f), n);
	fclose(f);
	free(p);
}

/* Only the expected files exist in dir (no temporaries left behind). */
static int count_files(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	ASSERT_NOT_NULL(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void test_roundtrip_files(void)
{
	static const char *const flags[] = {
		"-1", "-3 --block-size=64K", "-12 --block-size 128K", "-T1 -9",
		"--format=gzip -1", "--format=gzip -6 --block-size=1M", "--format=gzip -9 -T3",
	};

	setup();
	make_file("in", 1500000, 0);
	for (size_t i = 0; i < IOC_ARRAY_SIZE(flags); i++) {
		ASSERT_EQ(sh("cd %s && %s -q -f %s in -o c && %s -q -d -f c -o out && cmp in out",
			     dir, tool, flags[i], tool), 0);
		ASSERT_EQ(sh("cd %s && %s -q -t c", dir, tool), 0);
	}
	/* Default names and --rm / -k. */
	ASSERT_EQ(sh("cd %s && cp in x && %s -q x && test -f x && test -f x.zst", dir, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q --rm -f x && test ! -f x && test -f x.zst", dir, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q -d x.zst && cmp in x", dir, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q --format=gzip x && test -f x.gz && rm x && %s -q -d x.gz"
		     " && cmp in x", dir, tool, tool), 0);
	/* An existing output is kept without -f. */
	ASSERT_NE(sh("cd %s && %s -q x 2>/dev/null", dir, tool), 0);
}

/* Frames of very different sizes (random data next to zeros), so the
 * CLI's output gathering sees small pieces followed by big ones: order
 * must survive. */
static void test_mixed_frame_sizes(void)
{
	setup();
	need("gzip");
	/* 512 KiB blocks: random ones make ~512 KiB frames (written past the
	 * gathering buffer), zero ones tiny frames (gathered). */
	ASSERT_EQ(sh("cd %s && for i in 1 2 3 4; do head -c 524288 /dev/urandom; "
		     "head -c 524288 /dev/zero; done > in", dir), 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip --block-size=512K in -o g && "
		     "gzip -dc g | cmp - in && %s -q -dc g | cmp - in", dir, tool, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --block-size=512K in -o z && %s -q -dc z | cmp - in && "
		     "%s -q -d -f z -o out && cmp in out", dir, tool, tool, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --block-size=64K in -o z && %s -q -dc z | cmp - in", dir,
		     tool, tool), 0);
}

static void test_empty_tiny_zero(void)
{
	static const size_t sizes[] = { 0, 1, 4096, 2000000 };

	setup();
	need("zstd");
	need("gzip");
	for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++)
		for (int kind = 0; kind < 2; kind++) {
			make_file("in", sizes[i], kind);
			ASSERT_EQ(sh("cd %s && %s -q -f in -o c && zstd -q -d -c c | cmp - in && "
				     "%s -q -dc c | cmp - in", dir, tool, tool), 0);
			ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip in -o g && gzip -dc g | cmp - in"
				     " && %s -q -dc g | cmp - in", dir, tool, tool), 0);
		}
	/* All-zero data compresses to almost nothing. */
	make_file("in", 5000000, 1);
	ASSERT_EQ(sh("cd %s && %s -q -f in -o c && test $(stat -c %%s c) -lt 2000", dir, tool), 0);
}

/* Zero pages of the output are left as holes when decompressing into a
 * fresh file: the file still reads back identical, trailing zeros
 * included (the final size comes from ftruncate), whether the zeros sit
 * in zero frames, inside data frames, at odd offsets or at the end; and
 * stdout to a pipe or to a shared file still gets every zero byte. */
static void test_sparse_zero_pages(void)
{
	setup();
	make_file("d", 300000, 0);
	ASSERT_EQ(sh("cd %s && { head -c 5000 d; head -c 3000000 /dev/zero; cat d;"
		     " head -c 12345 /dev/zero; head -c 77777 d; head -c 2000000 /dev/zero; } > in",
		     dir), 0);
	for (int i = 0; i < 3; i++) {
		static const char *const bs[] = { "64K", "1M", "4M" };

		ASSERT_EQ(sh("cd %s && %s -q -f --block-size=%s in -o c.zst && rm -f out &&"
			     " %s -q -d c.zst -o out && cmp in out && test $(stat -c %%s out) -eq"
			     " $(stat -c %%s in)", dir, tool, bs[i], tool), 0);
		ASSERT_EQ(sh("cd %s && %s -q -dc c.zst | cat > p && cmp in p", dir, tool), 0);
		ASSERT_EQ(sh("cd %s && %s -q -dc c.zst > s && cmp in s", dir, tool), 0);
		ASSERT_EQ(sh("cd %s && { echo x; %s -q -dc c.zst; echo y; } > s &&"
			     " { echo x; cat in; echo y; } | cmp - s", dir, tool), 0);
		ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip --block-size=%s in -o c.gz && rm -f out"
			     " && %s -q -d c.gz -o out && cmp in out", dir, tool, bs[i], tool), 0);
	}
	/* All zero, decoded streaming (a foreign single frame from a pipe). */
	ASSERT_EQ(sh("cd %s && head -c 3000000 /dev/zero > z && cat z | zstd -q -c > z.zst 2>/dev/null"
		     " || cp /dev/null z.zst; test ! -s z.zst || { rm -f out && %s -q -d z.zst -o out"
		     " && cmp z out; }", dir, tool), 0);
}

static void test_stdin_stdout(void)
{
	setup();
	make_file("in", 2000000, 0);
	ASSERT_EQ(sh("cd %s && cat in | %s -q | %s -q -d | cmp - in", dir, tool, tool), 0);
	ASSERT_EQ(sh("cd %s && cat in | %s -q --format=gzip - | %s -q -d - | cmp - in", dir, tool,
		     tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q -c in | %s -q -d -c | cmp - in", dir, tool, tool), 0);
	/* stdout a regular file, shared with other writers and in append
	 * mode: output lands where write(2) would put it. */
	ASSERT_EQ(sh("cd %s && %s -q --block-size=64K -c in > c.zst && { echo head; %s -q -dc c.zst; echo tail; } > f"
		     " && { echo head; cat in; echo tail; } | cmp - f", dir, tool, tool), 0);
	ASSERT_EQ(sh("cd %s && { %s -q -dc c.zst; echo tail; } > f && { cat in; echo tail; } |"
		     " cmp - f", dir, tool), 0);
	ASSERT_EQ(sh("cd %s && echo head > f && %s -q -dc c.zst >> f && %s -q -dc c.zst >> f &&"
		     " { echo head; cat in in; } | cmp - f", dir, tool, tool), 0);
	/* From a pipe to a named file: still atomic. */
	ASSERT_EQ(sh("cd %s && cat in | %s -q -o p.zst && %s -q -dc p.zst | cmp - in", dir, tool,
		     tool), 0);
}

static void test_interop_zstd(void)
{
	setup();
	need("zstd");
	make_file("in", 2500000, 0);
	/* Ours -> zstd. */
	ASSERT_EQ(sh("cd %s && %s -q -f in -o c && zstd -q -t c && zstd -q -dc c | cmp - in",
		     dir, tool), 0);
	/* zstd (multithreaded, one frame with size) -> ours. */
	ASSERT_EQ(sh("cd %s && zstd -q -T2 -f in -o z && %s -q -dc z | cmp - in", dir, tool), 0);
	/* zstd from a pipe (no content size: streaming path) -> ours. */
	ASSERT_EQ(sh("cd %s && cat in | zstd -q -c > zp && %s -q -dc zp | cmp - in", dir, tool),
		  0);
	/* Multi-frame foreign: two zstd frames concatenated, plus ours. */
	ASSERT_EQ(sh("cd %s && %s -q -f in -o c && cat z zp c > multi && %s -q -dc multi > out && "
		     "cat in in in | cmp - out", dir, tool, tool), 0);
	/* A foreign sized frame right before ours: our table still checks. */
	ASSERT_EQ(sh("cd %s && cat z c > zc && %s -q -dc zc > out2 && cat in in | cmp - out2", dir,
		     tool), 0);
	/* zstd reads our file inside a concatenation too. */
	ASSERT_EQ(sh("cd %s && zstd -q -dc multi | cmp - out", dir), 0);
	/* Small blocks of random bytes are stored, with page checks in a
	 * skippable frame of their own: zstd skips it, -l tells. */
	ASSERT_EQ(sh("cd %s && { head -c 100000 /dev/urandom; head -c 50000 in; } > r && "
		     "%s -q -f --block-size=12K r -o rc && zstd -q -t rc && "
		     "zstd -q -dc rc | cmp - r && %s -q -dc rc | cmp - r && "
		     "%s -l rc | grep -q '%s' && cat rc c > rcc && "
		     "zstd -q -dc rcc > out3 && %s -q -dc rcc | cmp - out3 && cat r in | cmp - out3",
		     dir, tool, tool, tool, IOC_HAVE_XXHASH ? "page checks" : "checksums",
		     tool), 0);
}

static void test_interop_gzip(void)
{
	setup();
	need("gzip");
	make_file("in", 2500000, 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip in -o g && gzip -t g && gzip -dc g | cmp - in",
		     dir, tool), 0);
	ASSERT_EQ(sh("cd %s && gzip -c in > gz && %s -q -dc gz | cmp - in", dir, tool), 0);
	ASSERT_EQ(sh("cd %s && cat gz g gz > gm && %s -q -dc gm > out && cat in in in | cmp - out",
		     dir, tool), 0);
	ASSERT_EQ(sh("cd %s && gzip -dc gm | cmp - out", dir), 0);
}

static void test_interop_pigz(void)
{
	setup();
	need("pigz");
	make_file("in", 2500000, 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip in -o g && pigz -t g && pigz -dc g | cmp - in",
		     dir, tool), 0);
	ASSERT_EQ(sh("cd %s && pigz -p2 -c in > pz && %s -q -dc pz | cmp - in", dir, tool), 0);
}

/* Every gzip level (each goes through the deflater the default picks for
 * it: igzip for 1-3 when built, libdeflate above), on data mixing text,
 * random bytes and zero pages, read back by gzip -d, pigz -d and our own
 * decoder; -l proves every member carries our size subfield (the index
 * and the parallel decoder split the file by it). */
static void test_interop_gzip_levels(void)
{
	setup();
	need("gzip");
	need("pigz");
	make_file("t", 700000, 0);
	ASSERT_EQ(sh("cd %s && { cat t; head -c 300000 /dev/urandom; head -c 409600 /dev/zero; "
		     "cat t; } > in", dir), 0);
	for (int level = 1; level <= 9; level++) {
		ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip -%d --block-size=256K in -o g && "
			     "gzip -t g && gzip -dc g | cmp - in && pigz -dc g | cmp - in", dir,
			     tool, level), 0);
		ASSERT_EQ(sh("cd %s && %s -q -d -f g -o out && cmp in out && "
			     "%s -l g | grep -q 'gzip, 9 members'", dir, tool, tool), 0);
	}
}

/* --deflate picks the gzip backend.  Each one's output is a gzip file that
 * gzip reads back; libdeflate's and zlib's repeat byte for byte from run to
 * run with several workers (what a deduplicating backup needs; igzip's
 * need not, see zip.h); an unknown name is refused before any output
 * exists. */
static void test_deflate_backends(void)
{
	static const struct {
		const char *name;
		bool built, repeats;
	} b[] = {
		{ "zlib", true, true },
		{ "libdeflate", IOC_HAVE_LIBDEFLATE, true },
		{ "isal", IOC_HAVE_ISAL, false },
	};

	setup();
	need("gzip");
	make_file("in", 2500000, 0);
	for (size_t i = 0; i < IOC_ARRAY_SIZE(b); i++) {
		int rc = sh("cd %s && %s -q -f -T2 --format=gzip -1 --block-size=16K "
			    "--deflate=%s in -o g1 2>err", dir, tool, b[i].name);

		if (!b[i].built) {
			ASSERT_NE(rc, 0);
			continue;
		}
		ASSERT_EQ(rc, 0);
		ASSERT_EQ(sh("cd %s && gzip -t g1 && gzip -dc g1 | cmp - in && cp g1 g1.%s", dir,
			     b[i].name), 0);
		if (!b[i].repeats)
			continue;
		for (int run = 0; run < 5; run++)
			ASSERT_EQ(sh("cd %s && %s -q -f -T2 --format=gzip -1 --block-size=16K "
				     "--deflate=%s in -o g2 && cmp g1 g2", dir, tool, b[i].name), 0);
	}
	/* The flag reaches the backend: zlib's and libdeflate's bytes differ. */
	if (IOC_HAVE_LIBDEFLATE)
		ASSERT_EQ(sh("cd %s && ! cmp -s g1.zlib g1.libdeflate", dir), 0);
	ASSERT_EQ(sh("cd %s && rm -f g3 && ! %s -q -f --format=gzip --deflate=bogus in -o g3 "
		     "2>err && grep -q 'unknown deflate backend' err && test ! -e g3", dir, tool), 0);
}

static void test_range_vs_dd(void)
{
	static const char *const ranges[][2] = {
		{ "0", "1" }, { "0", "3000000" }, { "65535", "2" }, { "1000000", "1234567" },
		{ "2999999", "100" }, { "131072", "65536" },
	};

	setup();
	make_file("in", 3000000, 0);
	for (int fmt = 0; fmt < 2; fmt++) {
		ASSERT_EQ(sh("cd %s && %s -q -f --block-size=64K %s in -o c", dir, tool,
			     fmt ? "--format=gzip" : ""), 0);
		for (size_t i = 0; i < IOC_ARRAY_SIZE(ranges); i++)
			ASSERT_EQ(sh("cd %s && %s -q --range=%s:%s c > r && "
				     "dd if=in of=d bs=1M iflag=skip_bytes,count_bytes skip=%s "
				     "count=%s status=none && cmp r d",
				     dir, tool, ranges[i][0], ranges[i][1], ranges[i][0],
				     ranges[i][1]), 0);
	}
}

static void test_list(void)
{
	setup();
	make_file("in", 1000000, 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --block-size=64K in -o c && "
		     "%s -l c | grep -q '16 frames, .* -> 1000000 bytes'", dir, tool, tool), 0);
	ASSERT_EQ(sh("cd %s && %s -q -f --format=gzip --block-size=64K in -o g && "
		     "%s -l g | grep -q '16 members'", dir, tool, tool), 0);
}

/* Bad input: non-zero exit, a message naming the offset, no output file
 * (and no temporary) left behind. */
static void test_hostile_no_partial_output(void)
{
	setup();
	make_file("in", 3000000, 0);
	ASSERT_EQ(sh("cd %s && %s -q -f in -o c.zst && %s -q -f --format=gzip in -o g.gz && "
		     "rm in", dir, tool, tool), 0);
	ASSERT_EQ(count_files(), 2);
	/* Truncated. */
	ASSERT_EQ(sh("cd %s && head -c $(( $(stat -c %%s c.zst) / 2 )) c.zst > t.zst", dir), 0);
	ASSERT_EQ(sh("cd %s && %s -q -d t.zst 2> err; test $? -ne 0 && grep -q offset err && "
		     "test ! -e t", dir, tool), 0);
	/* Corrupt in the middle. */
	ASSERT_EQ(sh("cd %s && cp g.gz b.gz && printf 'XXXX' | dd of=b.gz bs=1 seek=$(( $(stat -c %%s b.gz) / 2 )) "
		     "conv=notrunc status=none", dir), 0);
	ASSERT_EQ(sh("cd %s && %s -q -d b.gz 2> err; test $? -ne 0 && grep -q offset err && "
		     "test ! -e b", dir, tool), 0);
	/* Garbage. */
	ASSERT_EQ(sh("cd %s && head -c 100000 /dev/urandom > junk.zst && %s -q -d junk.zst 2>err;"
		     " test $? -ne 0 && grep -q 'offset 0' err && test ! -e junk", dir, tool), 0);
	/* -t fails on the same inputs. */
	ASSERT_NE(sh("cd %s && %s -q -t t.zst 2>/dev/null", dir, tool), 0);
	ASSERT_NE(sh("cd %s && %s -q -t b.gz 2>/dev/null", dir, tool), 0);
	/* Bad seek table: range extraction refuses with an offset. */
	ASSERT_EQ(sh("cd %s && cp c.zst s.zst && printf '\\377\\377\\377\\177' | dd of=s.zst bs=1 "
		     "seek=$(( $(stat -c %%s s.zst) - 9 )) conv=notrunc status=none", dir), 0);
	ASSERT_EQ(sh("cd %s && %s -q --range=0:10 s.zst > r 2> err; test $? -ne 0 && "
		     "grep -q offset err", dir, tool), 0);
	/* Only the inputs and the files the shell made remain: no temporaries. */
	ASSERT_EQ(sh("cd %s && ls -a | grep -c iocore-zip | grep -q '^0$'", dir), 0);
}

/* Interrupted mid-stream (SIGINT, SIGTERM): the temporary output is
 * removed and nothing that looks complete is left. */
static void test_interrupt_leaves_nothing(void)
{
	setup();
	need("timeout");
	ASSERT_EQ(sh("cd %s && timeout -s INT 0.3 %s -q -o out.zst < /dev/urandom; test $? -ne 0",
		     dir, tool), 0);
	ASSERT_EQ(sh("cd %s && timeout -s TERM 0.3 %s -q --format=gzip -o out.gz < /dev/urandom;"
		     " test $? -ne 0", dir, tool), 0);
	ASSERT_EQ(count_files(), 0);
}

/* -l on input without an index (a pipe, a foreign file) decodes to count. */
static void test_list_no_index(void)
{
	setup();
	need("zstd");
	make_file("in", 100000, 0);
	ASSERT_EQ(sh("cd %s && zstd -q -c in | %s -l | grep -q 'no index.*-> 100000 bytes'", dir,
		     tool), 0);
}

IOC_TEST_MAIN(
	IOC_TEST(test_roundtrip_files),
	IOC_TEST(test_empty_tiny_zero),
	IOC_TEST(test_mixed_frame_sizes),
	IOC_TEST(test_stdin_stdout),
	IOC_TEST(test_sparse_zero_pages),
	IOC_TEST(test_interop_zstd),
	IOC_TEST(test_interop_gzip),
	IOC_TEST(test_interop_pigz),
	IOC_TEST(test_interop_gzip_levels),
	IOC_TEST(test_deflate_backends),
	IOC_TEST(test_range_vs_dd),
	IOC_TEST(test_list),
	IOC_TEST(test_hostile_no_partial_output),
	IOC_TEST(test_interrupt_leaves_nothing),
	IOC_TEST(test_list_no_index),
)
