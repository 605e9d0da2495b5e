/*
 * A migration's status as a checked state machine.
 *
 * Problem: the status is moved by several parties at once: the migration
 * thread (setup, active, pre-switchover, device, its end), the control
 * socket (migrate_cancel) and the destination's receiver.  With plain
 * stores a late mover could undo an earlier verdict: a thread ending on
 * the socket error that migrate_cancel's shutdown caused would report a
 * cancelled migration failed, and nothing would stop a stray "active"
 * after "failed".
 *
 * Design: one table of the moves QEMU's MigrationStatus allows for the
 * states iocore uses; a move is made (under the migration's lock, by
 * ioc__mig_set_status_locked) only when the table allows it from the
 * current status, and says whether it was made.  Completed, failed and
 * cancelled are final: only a new migration (ioc__mig_begin_locked)
 * leaves them, for setup.  A cancelling migration ends cancelled whatever
 * the thread's last error was, as QEMU reports it.
 *
 * Rejected: QEMU's compare-and-swap on the old state at each call site
 * (migrate_set_state(state, old, new)): every caller would have to name
 * the state it believes current, and the lock already serialises them;
 * the table states the whole machine in one place instead.
 */
#include <errno.h>
#include <stdbool.h>

#include "migrate-int.h"

#define BIT(s) (1u << (s))

static const unsigned moves[] = {
	[IOC_MIG_ST_NONE] = BIT(IOC_MIG_ST_SETUP),
	[IOC_MIG_ST_SETUP] = BIT(IOC_MIG_ST_ACTIVE) | BIT(IOC_MIG_ST_FAILED) |
			     BIT(IOC_MIG_ST_CANCELLING),
	[IOC_MIG_ST_ACTIVE] = BIT(IOC_MIG_ST_PRE_SWITCHOVER) | BIT(IOC_MIG_ST_DEVICE) |
			      BIT(IOC_MIG_ST_COMPLETED) | BIT(IOC_MIG_ST_FAILED) |
			      BIT(IOC_MIG_ST_CANCELLING),
	[IOC_MIG_ST_PRE_SWITCHOVER] = BIT(IOC_MIG_ST_DEVICE) | BIT(IOC_MIG_ST_FAILED) |
				      BIT(IOC_MIG_ST_CANCELLING),
	[IOC_MIG_ST_DEVICE] = BIT(IOC_MIG_ST_COMPLETED) | BIT(IOC_MIG_ST_FAILED) |
			      BIT(IOC_MIG_ST_CANCELLING),
	[IOC_MIG_ST_CANCELLING] = BIT(IOC_MIG_ST_CANCELLED),
	[IOC_MIG_ST_COMPLETED] = 0,
	[IOC_MIG_ST_FAILED] = 0,
	[IOC_MIG_ST_CANCELLED] = 0,
};

bool ioc__mig_move_ok(int from, int to)
{
	if (from < 0 || from > IOC_MIG_ST_CANCELLED || to < 0 || to > IOC_MIG_ST_CANCELLED)
		return false;
	return (moves[from] & BIT(to)) != 0;
}

bool ioc__mig_final(int status)
{
	return status == IOC_MIG_ST_COMPLETED || status == IOC_MIG_ST_FAILED ||
	       status == IOC_MIG_ST_CANCELLED;
}

int ioc__mig_end_status(int current, int result)
{
	if (current == IOC_MIG_ST_CANCELLING || result == -ECANCELED)
		return IOC_MIG_ST_CANCELLED;
	return result == 0 ? IOC_MIG_ST_COMPLETED : IOC_MIG_ST_FAILED;
}

bool ioc__mig_set_status_locked(struct ioc__mig *m, int status)
{
	if (!ioc__mig_move_ok(m->status, status))
		return false;
	m->status = status;
	ioc__mig_event_locked(m, "MIGRATION", status);
	return true;
}

bool ioc__mig_begin_locked(struct ioc__mig *m)
{
	if (m->status != IOC_MIG_ST_NONE && !ioc__mig_final(m->status))
		return false;
	m->status = IOC_MIG_ST_NONE;
	return ioc__mig_set_status_locked(m, IOC_MIG_ST_SETUP);
}
