/* The harness itself: a failing assertion must fail, print both operands,
 * and do so with NDEBUG defined. */
#define NDEBUG 1
#include <sys/wait.h>

#include "iocore/common.h"
#include "tap.h"

/* Run fn in a child with stdout captured; return its exit status and output. */
static int run_child(void (*fn)(void), char *out, size_t outsz)
{
	int p[2];
	pid_t pid;
	size_t len = 0;
	ssize_t n;
	int status;

	ASSERT_OK(pipe(p));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		close(p[0]);
		ioc_test_index = 7;
		ioc_test_name = "child";
		fn();
		fflush(stdout);
		_exit(0);
	}
	close(p[1]);
	while (len + 1 < outsz && (n = read(p[0], out + len, outsz - 1 - len)) > 0)
		len += (size_t)n;
	out[len] = '\0';
	close(p[0]);
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void child_eq_fails(void)
{
	int a = 1;

	ASSERT_EQ(a, 2);
}

static void child_mem_fails(void)
{
	ASSERT_MEM_EQ("abcd", "abXd", 4);
}

static void child_passes(void)
{
	ASSERT_EQ(3, 3);
	ASSERT_STR_EQ("x", "x");
}

static void test_failure_prints_operands(void)
{
	char out[512];

	ASSERT_EQ(run_child(child_eq_fails, out, sizeof(out)), 1);
	ASSERT_TRUE(strstr(out, "not ok 7 - child") != NULL);
	ASSERT_TRUE(strstr(out, "a == 2: 1 == 2") != NULL);
}

static void test_mem_names_offset(void)
{
	char out[512];

	ASSERT_EQ(run_child(child_mem_fails, out, sizeof(out)), 1);
	ASSERT_TRUE(strstr(out, "differ at byte 2") != NULL);
}

static void test_pass_is_silent(void)
{
	char out[512];

	ASSERT_EQ(run_child(child_passes, out, sizeof(out)), 0);
	ASSERT_STR_EQ(out, "");
}

static void test_skip_case(void)
{
	IOC_SKIP("demonstrates a skipped case");
}

IOC_TEST_MAIN(
	IOC_TEST(test_failure_prints_operands),
	IOC_TEST(test_mem_names_offset),
	IOC_TEST(test_pass_is_silent),
	IOC_TEST(test_skip_case),
)
