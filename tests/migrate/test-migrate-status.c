/*
 * The migration status machine (src/nbd/migrate-status.c): the paths the
 * source and the destination take are accepted, final statuses are never
 * left but by a new migration, a cancel is never reported as a failure,
 * and a refused move changes nothing and emits no event.
 */
#include "tap.h"
#include "migrate-int.h"

static int events;

/* The real one (migrate-source.c) queues a QMP event; counted here. */
void ioc__mig_event_locked(struct ioc__mig *m, const char *name, int64_t v)
{
	(void)m;
	(void)v;
	if (strcmp(name, "MIGRATION") == 0)
		events++;
}

enum { NST = IOC_MIG_ST_CANCELLED + 1 };

static bool path_ok(const int *p, int n)
{
	for (int i = 1; i < n; i++)
		if (!ioc__mig_move_ok(p[i - 1], p[i]))
			return false;
	return true;
}

static void test_paths(void)
{
	const int plain[] = { IOC_MIG_ST_NONE, IOC_MIG_ST_SETUP, IOC_MIG_ST_ACTIVE,
			      IOC_MIG_ST_DEVICE, IOC_MIG_ST_COMPLETED };
	const int paused[] = { IOC_MIG_ST_SETUP, IOC_MIG_ST_ACTIVE,
			       IOC_MIG_ST_PRE_SWITCHOVER, IOC_MIG_ST_DEVICE,
			       IOC_MIG_ST_COMPLETED };
	const int dest[] = { IOC_MIG_ST_NONE, IOC_MIG_ST_SETUP, IOC_MIG_ST_ACTIVE,
			     IOC_MIG_ST_COMPLETED };
	const int cancel[] = { IOC_MIG_ST_SETUP, IOC_MIG_ST_ACTIVE,
			       IOC_MIG_ST_PRE_SWITCHOVER, IOC_MIG_ST_CANCELLING,
			       IOC_MIG_ST_CANCELLED };

	ASSERT_TRUE(path_ok(plain, IOC_ARRAY_SIZE(plain)));
	ASSERT_TRUE(path_ok(paused, IOC_ARRAY_SIZE(paused)));
	ASSERT_TRUE(path_ok(dest, IOC_ARRAY_SIZE(dest)));
	ASSERT_TRUE(path_ok(cancel, IOC_ARRAY_SIZE(cancel)));
	/* Every running status can fail or be cancelled. */
	for (int s = IOC_MIG_ST_SETUP; s <= IOC_MIG_ST_DEVICE; s++) {
		ASSERT_TRUE(ioc__mig_move_ok(s, IOC_MIG_ST_FAILED));
		ASSERT_TRUE(ioc__mig_move_ok(s, IOC_MIG_ST_CANCELLING));
	}
}

static void test_final_and_backwards(void)
{
	for (int from = 0; from < NST; from++)
		for (int to = 0; to < NST; to++) {
			/* Final statuses are never left by a move. */
			if (ioc__mig_final(from))
				ASSERT_FALSE(ioc__mig_move_ok(from, to));
			/* Nothing moves back to none or setup, or stays put. */
			if (to <= IOC_MIG_ST_SETUP && from != IOC_MIG_ST_NONE)
				ASSERT_FALSE(ioc__mig_move_ok(from, to));
			if (from == to)
				ASSERT_FALSE(ioc__mig_move_ok(from, to));
		}
	/* A cancel ends cancelled, never completed or failed. */
	ASSERT_FALSE(ioc__mig_move_ok(IOC_MIG_ST_CANCELLING, IOC_MIG_ST_FAILED));
	ASSERT_FALSE(ioc__mig_move_ok(IOC_MIG_ST_CANCELLING, IOC_MIG_ST_COMPLETED));
	ASSERT_FALSE(ioc__mig_move_ok(-1, IOC_MIG_ST_SETUP));
	ASSERT_FALSE(ioc__mig_move_ok(IOC_MIG_ST_SETUP, NST));
}

static void test_end_status(void)
{
	ASSERT_EQ(ioc__mig_end_status(IOC_MIG_ST_DEVICE, 0), IOC_MIG_ST_COMPLETED);
	ASSERT_EQ(ioc__mig_end_status(IOC_MIG_ST_ACTIVE, -EPIPE), IOC_MIG_ST_FAILED);
	ASSERT_EQ(ioc__mig_end_status(IOC_MIG_ST_ACTIVE, -ECANCELED), IOC_MIG_ST_CANCELLED);
	/* The socket error that migrate_cancel's shutdown caused. */
	ASSERT_EQ(ioc__mig_end_status(IOC_MIG_ST_CANCELLING, -EPIPE), IOC_MIG_ST_CANCELLED);
}

static void test_moves_on_a_migration(void)
{
	struct ioc__mig m = { .status = IOC_MIG_ST_NONE };

	events = 0;
	ASSERT_TRUE(ioc__mig_begin_locked(&m));
	ASSERT_EQ(m.status, IOC_MIG_ST_SETUP);
	/* A second start while one runs changes nothing. */
	ASSERT_FALSE(ioc__mig_begin_locked(&m));
	ASSERT_TRUE(ioc__mig_set_status_locked(&m, IOC_MIG_ST_ACTIVE));
	ASSERT_TRUE(ioc__mig_set_status_locked(&m, IOC_MIG_ST_FAILED));
	ASSERT_EQ(events, 3);
	/* A late mover after the verdict: refused, no event. */
	ASSERT_FALSE(ioc__mig_set_status_locked(&m, IOC_MIG_ST_ACTIVE));
	ASSERT_FALSE(ioc__mig_set_status_locked(&m, IOC_MIG_ST_COMPLETED));
	ASSERT_EQ(m.status, IOC_MIG_ST_FAILED);
	ASSERT_EQ(events, 3);
	/* A new migration leaves a final status, for setup. */
	ASSERT_TRUE(ioc__mig_begin_locked(&m));
	ASSERT_EQ(m.status, IOC_MIG_ST_SETUP);
	ASSERT_EQ(events, 4);
}

IOC_TEST_MAIN(
	IOC_TEST(test_paths),
	IOC_TEST(test_final_and_backwards),
	IOC_TEST(test_end_status),
	IOC_TEST(test_moves_on_a_migration),
)
