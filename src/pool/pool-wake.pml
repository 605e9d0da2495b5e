/*
 * A Promela model of the worker sleep/wake handshake in pool.c, for spin:
 *     spin -a pool-wake.pml && cc -O2 -o pan pan.c && ./pan -m100000
 * (tests/pool/test-pool-model.sh runs it when spin is installed).
 *
 * What it checks: with submitters that batch jobs and decide whom to wake
 * under the lock (want_wake), workers that spin outside the lock for a
 * nondeterministic time and then sleep on the condition variable, and a
 * wake chain run by workers that take a job, no job is ever stranded: the
 * submitter waits until every job was taken, so a state where jobs wait and
 * every worker sleeps without a pending signal is a deadlock spin reports.
 * Timed waits never expire here, so progress cannot rest on the idle
 * timeout (nor on spurious wakeups, which the model leaves out).  Shutdown (stopping + broadcast)
 * must join every worker, including one that was spinning when the
 * broadcast went out.
 *
 * Sanity of the check itself: making a spinner go to sleep after its spin
 * without returning to the top of the loop (so it misses a stop broadcast,
 * the bug an early version had), or without re-checking the queue under
 * the lock at all, both yield "invalid end state" (a deadlock).
 *
 * Names follow pool.c: q (q_len), nspin (nspinning), nsleep (nsleeping),
 * nwoken.  The mutex is `lock`; the condvar is a count of waiters plus
 * wakeup tokens.
 */
#define NWORKERS 2
#define NJOBS    3

bit lock;
byte q, taken;
byte nspin, nsleep, nwoken;
bit stopping;
byte cv_waiters, cv_tokens;
byte exited;

inline acquire() { atomic { lock == 0 -> lock = 1 } }
inline release() { lock = 0 }

/* pthread_cond_signal: wakes one waiter if there is one. */
inline cv_signal() {
	atomic { if :: cv_waiters > 0 -> cv_waiters--; cv_tokens++ :: else -> skip fi }
}
inline cv_broadcast() {
	atomic { cv_tokens = cv_tokens + cv_waiters; cv_waiters = 0 }
}
/* pthread_cond_wait: releases the lock and waits atomically.  No
 * spurious wakeups: an always-enabled spurious return would hide a lost
 * wakeup from the deadlock check (the code re-checks the queue after any
 * return, so spurious ones are harmless). */
inline cv_wait() {
	atomic { release(); cv_waiters++ };
	atomic { cv_tokens > 0 -> cv_tokens-- };
	acquire()
}

/* want_wake() under the lock; sets sig when a signal is owed. */
inline want_wake(sig) {
	if
	:: (!stopping && q > nspin + nwoken && nsleep > nwoken) ->
		nwoken++; sig = 1
	:: else -> sig = 0
	fi
}

proctype worker()
{
	bit spun = 0, sig = 0;

	acquire();
top:
	if
	:: stopping -> goto out
	:: else -> skip
	fi;
	if
	:: q > 0 ->
		q--; taken++; spun = 0;
		want_wake(sig);
		release();
		if :: sig -> cv_signal() :: else -> skip fi;
		/* run the job, push the completion */
		acquire();
		goto top
	:: else -> skip
	fi;
	if
	:: !spun ->
		nspin++;
		release();
		/* spin: stop when the queue looks non-empty, or give up */
		if
		:: q > 0 -> skip
		:: true -> skip
		fi;
		acquire();
		nspin--;
		spun = 1;
		goto top
	:: else -> skip
	fi;
	spun = 0;
	nsleep++;
	cv_wait();
	nsleep--;
	if :: nwoken > 0 -> nwoken-- :: else -> skip fi;
	goto top;
out:
	exited++;
	release()
}

proctype submitter()
{
	byte sent = 0;
	bit sig = 0;

	do
	:: sent < NJOBS ->
		acquire();
		/* a batch of one or two jobs */
		if
		:: sent + 2 <= NJOBS -> q = q + 2; sent = sent + 2
		:: true -> q++; sent++
		fi;
		want_wake(sig);
		release();
		if :: sig -> cv_signal() :: else -> skip fi
	:: else -> break
	od;
	/* Every job gets taken without the idle timeout... */
	taken == NJOBS;
	/* ...and shutdown joins every worker. */
	acquire();
	stopping = 1;
	cv_broadcast();
	release();
	exited == NWORKERS;
	assert(q == 0)
}

init
{
	atomic {
		run worker();
		run worker();
		run submitter()
	}
}
