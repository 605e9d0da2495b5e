/*
 * iocore-bench blk end to end: the null driver and a file, reads and
 * writes (with flushes), --json output, qemu-img-style errors.
 */
#include "blk-test.h"

static const char *tool(void)
{
	static char path[512];
	const char *root = getenv("IOC_BUILD_ROOT");

	if (!root)
		IOC_SKIP("IOC_BUILD_ROOT not set (run through meson test)");
	snprintf(path, sizeof(path), "%s/tools/bench/iocore-bench", root);
	if (access(path, X_OK) != 0)
		IOC_SKIP("iocore-bench not built");
	return path;
}

/* Run the tool; returns its exit status and its stdout in out. */
static int run(const char *args, char *out, size_t outlen)
{
	char *cmd = NULL;
	size_t n = 0;
	FILE *f;
	int st;

	ASSERT_GE(asprintf(&cmd, "%s %s blk %s 2>/dev/null", ioc_test_exe_wrapper(),
			   tool(), args), 0);
	f = popen(cmd, "r");
	ASSERT_NOT_NULL(f);
	while (n + 1 < outlen && fgets(out + n, (int)(outlen - n), f))
		n += strlen(out + n);
	out[n] = 0;
	st = pclose(f);
	free(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double json_rate(const char *out)
{
	const char *p = strstr(out, "\"requests_per_s\":");

	ASSERT_NOT_NULL(p);
	return atof(p + strlen("\"requests_per_s\":"));
}

static void test_null(void)
{
	char out[4096];

	ASSERT_EQ(run("--driver null -c 20000 -d 16 --json", out, sizeof(out)), 0);
	ASSERT_NOT_NULL(strstr(out, "\"driver\":\"null\""));
	ASSERT_NOT_NULL(strstr(out, "\"requests\":20000"));
	ASSERT_TRUE(json_rate(out) > 0);
	ASSERT_EQ(run("--driver null -c 1000 -w", out, sizeof(out)), 0);
	ASSERT_NOT_NULL(strstr(out, "Sending 1000 write requests, 4096 bytes each, 64 in parallel"));
	ASSERT_NOT_NULL(strstr(out, "requests/s"));
}

static void test_file(void)
{
	char *img = bt_make_image(NULL, "bench.img", 4 << 20, true);
	const char *aio[] = { "io_uring", "threads" };
	const char *fp[] = { "on", "off" };
	char args[1024], out[4096];

	for (int a = 0; a < 2; a++) {
		for (int f = 0; f < 2; f++) {
			snprintf(args, sizeof(args), "-c 5000 -d 32 -s 4k -i %s --fast-path %s -f raw --json %s",
				 aio[a], fp[f], img);
			ASSERT_EQ(run(args, out, sizeof(out)), 0);
			ASSERT_TRUE(json_rate(out) > 0);
			snprintf(args, sizeof(args), "-w -c 3000 -d 8 -s 8k -S 16k -o 8k -i %s --fast-path %s --flush-interval 500 --json %s",
				 aio[a], fp[f], img);
			ASSERT_EQ(run(args, out, sizeof(out)), 0);
			ASSERT_NOT_NULL(strstr(out, "\"write\":true"));
		}
	}
	/* Requests past the end fail like qemu-img's: exit status 1. */
	snprintf(args, sizeof(args), "-c 10 -s 8k -o %u %s", (4u << 20) - 4096, img);
	ASSERT_EQ(run(args, out, sizeof(out)), 1);
	/* Bad flags. */
	ASSERT_EQ(run("-f qcow2 x", out, sizeof(out)), 1);
	ASSERT_EQ(run("-i native x", out, sizeof(out)), 1);
	ASSERT_EQ(run("--fast-path maybe x", out, sizeof(out)), 1);
	ASSERT_EQ(run("-c 10 --flush-interval 5 x", out, sizeof(out)), 1);
	ASSERT_EQ(run("/nonexistent/image", out, sizeof(out)), 1);
	unlink(img);
	free(img);
	rmdir(ioc_test_tmpdir());
}

IOC_TEST_MAIN(
	IOC_TEST(test_null),
	IOC_TEST(test_file),
)
