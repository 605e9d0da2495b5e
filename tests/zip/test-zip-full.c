/*
 * iocore-zip writing to a full disk: compression and decompression into a
 * small tmpfs fail with a message naming the cause, exit non-zero, and
 * leave no output file and no temporary behind.  Writing to a full stdout
 * (the shell's file, which is not ours to remove) fails the same way.
 */
#include <dirent.h>
#include <stdbool.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tap.h"

static char path[512], tool[600], src[300], full[300];
static bool ready; /* setup mounted the tmpfs */

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

static int count_files(const char *d)
{
	DIR *dd = opendir(d);
	struct dirent *e;
	int n = 0;

	ASSERT_NOT_NULL(dd);
	while ((e = readdir(dd)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(dd);
	return n;
}

static void setup(void)
{
	const char *root = getenv("IOC_BUILD_ROOT");

	snprintf(path, sizeof(path), "%s/tools/zip/iocore-zip", root ? root : ".");
	/* Through the exe_wrapper in a cross build (sh splits it). */
	snprintf(tool, sizeof(tool), "%s %s", ioc_test_exe_wrapper(), path);
	if (access(path, X_OK) != 0)
		IOC_SKIP("iocore-zip not built");
	snprintf(src, sizeof(src), "%.200s/src", ioc_test_tmpdir());
	snprintf(full, sizeof(full), "%.200s/full", ioc_test_tmpdir());
	ASSERT_OK(mkdir(src, 0700));
	ASSERT_OK(mkdir(full, 0700));
	if (mount("ioc-zip-full", full, "tmpfs", 0, "size=256k") < 0) {
		rmdir(full);
		rmdir(src);
		rmdir(ioc_test_tmpdir());
		IOC_SKIP("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)");
	}
	/* 4 MiB that barely compresses, and its compressed forms. */
	ASSERT_EQ(sh("head -c 4194304 /dev/urandom > %s/in && cd %s && "
		     "%s -q -k in -o in.zst && %s -q -k --format=gzip in -o in.gz",
		     src, src, tool, tool), 0);
	ready = true;
}

static void need_setup(void)
{
	if (!ready)
		IOC_SKIP("no full file system to write to (see the first case)");
}

static void test_compress_into_full_disk(void)
{
	need_setup();
	for (int gz = 0; gz < 2; gz++) {
		ASSERT_NE(sh("%s -q %s %s/in -o %s/out 2> %s/err", tool,
			     gz ? "--format=gzip" : "", src, full, src), 0);
		ASSERT_EQ(sh("grep -q 'No space left on device' %s/err", src), 0);
		ASSERT_EQ(count_files(full), 0);
	}
}

static void test_decompress_into_full_disk(void)
{
	static const char *const inputs[] = { "in.zst", "in.gz" };

	need_setup();
	for (int i = 0; i < 2; i++) {
		ASSERT_NE(sh("%s -q -d %s/%s -o %s/out 2> %s/err", tool, src, inputs[i],
			     full, src), 0);
		ASSERT_EQ(sh("grep -q 'No space left on device' %s/err", src), 0);
		ASSERT_EQ(count_files(full), 0);
	}
}

static void test_stdout_full(void)
{
	need_setup();
	/* The redirection's file is the shell's: only the error is ours. */
	ASSERT_NE(sh("%s -q -c %s/in > %s/out 2> %s/err", tool, src, full, src), 0);
	ASSERT_EQ(sh("grep -q 'No space left on device' %s/err", src), 0);
	ASSERT_NE(sh("%s -q -d -c %s/in.zst > %s/out 2> %s/err", tool, src, full, src), 0);
	ASSERT_EQ(sh("grep -q 'No space left on device' %s/err", src), 0);
	ASSERT_EQ(sh("rm -f %s/out", full), 0);
	/* With the space back, the same commands work. */
	ASSERT_EQ(sh("%s -q -d %s/in.zst -o %s/../back && cmp %s/in %s/../back && "
		     "rm %s/../back", tool, src, full, src, full, full), 0);
}

static void test_cleanup(void)
{
	need_setup();
	ASSERT_OK(umount(full));
	ASSERT_OK(rmdir(full));
	ASSERT_EQ(sh("rm -rf %s", src), 0);
	ASSERT_OK(rmdir(ioc_test_tmpdir()));
}

IOC_TEST_MAIN(
	IOC_TEST(setup),
	IOC_TEST(test_compress_into_full_disk),
	IOC_TEST(test_decompress_into_full_disk),
	IOC_TEST(test_stdout_full),
	IOC_TEST(test_cleanup),
)
