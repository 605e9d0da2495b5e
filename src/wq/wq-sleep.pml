/*
 * Promela model of the two sleep/wake handshakes in src/wq/wq.c.
 * Check: spin -a wq-sleep.pml && cc -O2 -o pan pan.c && ./pan -E
 * (tests/wq/test-wq-model.sh does this when spin is installed).
 *
 * The seq_cst fences in wq.c make the accesses modelled here behave
 * sequentially consistently, which is Promela's own model, so each
 * statement below is one atomic step of the real code:
 *
 *   submitter: push a job; fence; if the worker's state is SLEEPING,
 *              exchange it to RUNNING and, if it was SLEEPING, futex_wake.
 *              wait_done: poll the done ring; if empty: waiting = 1; fence;
 *              poll again; if still empty, futex_wait(waiting, 1).
 *   worker:    pop and run a job, push it to the done ring; if at most LOW
 *              jobs remain queued and either none or no more than a third
 *              of the done ring's count: fence; if waiting, exchange it to
 *              0 and, if it was 1, futex_wake.  When the ring is empty: state =
 *              SLEEPING; fence; if the ring is non-empty: state = RUNNING,
 *              else futex_wait(state, SLEEPING) while state == SLEEPING.
 *
 * futex_wait compares and blocks atomically (the kernel holds the bucket
 * lock); futex_wake releases a blocked waiter.  The spin phases are left
 * out: spinning only delays the step that follows it.
 *
 * Property: whenever nothing can move (timeout), every job was collected
 * and the submitter finished: no wakeup is lost in either direction.
 * (-E: the worker legitimately ends asleep.)  -DBUG_NO_WORKER_RECHECK and
 * -DBUG_NO_SUBMITTER_RECHECK drop one side's re-check after it announced
 * its sleep; the check must then fail (the test runs both).
 */
#ifndef NJOBS
#define NJOBS 4
#endif
#define CAP 3      /* ring size: jobs in flight per worker */
#define LOW 1      /* low_water (ring_size / 4 in wq.c) */

byte req = 0;      /* jobs in the request ring */
byte dq = 0;       /* jobs in the done ring */
bit wstate = 0;    /* worker state word: 1 = SLEEPING */
bit wkernel = 0;   /* worker blocked in futex_wait */
bit waiting = 0;   /* submitter's sleep word */
bit skernel = 0;   /* submitter blocked in futex_wait */
byte submitted = 0;
byte collected = 0;
bit finished = 0;

inline futex_wait(word, val, kern) {
	atomic { if :: word == val -> kern = 1 :: else -> skip fi };
	(kern == 0)
}

active proctype submitter()
{
	bit old;

	do
	:: collected == NJOBS -> break
	:: else ->
		do
		:: submitted < NJOBS && submitted - collected < CAP ->
			req++;
			submitted++;
			/* kick() */
			if
			:: wstate == 1 ->
				atomic { old = wstate; wstate = 0 };
				if
				:: old -> wkernel = 0    /* futex_wake */
				:: else -> skip
				fi
			:: else -> skip
			fi
		:: else -> break
		od;
		/* ioc_wq_wait_done() */
		if
		:: dq > 0 -> skip
		:: else ->
			waiting = 1;
			if
#ifndef BUG_NO_SUBMITTER_RECHECK
			:: dq > 0 -> skip
#endif
			:: else -> futex_wait(waiting, 1, skernel)
			fi;
			waiting = 0
		fi;
		/* ioc_wq_poll_done() */
		do
		:: dq > 0 -> dq--; collected++
		:: else -> break
		od
	od;
	finished = 1
}

active proctype worker()
{
	bit old;

	do
	:: req > 0 ->
		req--;
		dq++;
		/* notify_completion() */
		if
		:: req > LOW || (req > 0 && req * 3 > dq) -> skip
		:: else ->
			if
			:: waiting == 1 ->
				atomic { old = waiting; waiting = 0 };
				if
				:: old -> skernel = 0    /* futex_wake */
				:: else -> skip
				fi
			:: else -> skip
			fi
		fi
	:: req == 0 ->
		wstate = 1;
		if
#ifndef BUG_NO_WORKER_RECHECK
		:: req > 0 -> wstate = 0
#endif
		:: else ->
			do
			:: wstate == 1 -> futex_wait(wstate, 1, wkernel)
			:: else -> break
			od
		fi
	od
}

active proctype monitor()
{
	timeout;
	assert(finished && collected == NJOBS && req == 0 && dq == 0)
}
