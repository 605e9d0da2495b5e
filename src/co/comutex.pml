/*
 * A model of ioc_co_mutex (src/co/lock.c) for spin.
 *
 * N coroutines, each on its own thread, lock and unlock ROUNDS times.
 * Atomic steps are the ones the C code makes atomic: the fast-path CAS,
 * the push onto from_push (a CAS loop: linearises at its successful CAS),
 * the fetch_add / fetch_sub on locked, and the exchange that takes
 * from_push.  Everything else (the reversal into to_pop, popping to_pop,
 * the grant) is a separate step, so interleavings inside them are
 * explored.  A grant is ioc_co_wake(): it sets granted[w]; the waiter
 * consumes it only after its yield (the home-thread rule).
 *
 * Checked: mutual exclusion (assert), only one pop-right holder at a time
 * (assert), a counted waiter is always found (assert), every process
 * finishes (no invalid end state = no lost wakeup), no grant left over.
 *
 *   spin -a comutex.pml && cc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan -m1000000
 *
 * Swapping the push and the fetch_add in the lock path (announce before
 * being findable) makes spin find a counted waiter that is not queued:
 * that window is what QEMU closes with its handoff protocol.  tests/co runs
 * this model when spin is installed.
 */
#define N 3
#define ROUNDS 2

byte locked;            /* holder + counted waiters */
byte stack[N];          /* from_push: LIFO of waiter ids */
byte nstack;
byte fifo[N];           /* to_pop: FIFO */
byte fhead, ftail;      /* fifo[fhead..ftail) */
bool granted[N];
byte in_cs;
byte popping;
byte grants_pending;

inline pop_oldest(w) {
	/* pop-right holder only */
	popping++;
	assert(popping == 1);
	if
	:: fhead == ftail ->
		/* exchange from_push with NULL, then reverse: oldest first */
		byte tmp[N]; byte k; byte cnt;
		atomic {
			cnt = nstack;
			k = 0;
			do
			:: k < cnt -> tmp[k] = stack[k]; k++
			:: else -> break
			od;
			nstack = 0
		}
		fhead = 0; ftail = 0;
		k = 0;
		do
		:: k < cnt -> fifo[ftail] = tmp[k]; ftail++; k++  /* stack[0] is oldest */
		:: else -> break
		od
	:: else -> skip
	fi;
	if
	:: fhead < ftail -> w = fifo[fhead]; fhead++
	:: else -> w = 255
	fi;
	popping--
}

inline grant(w) {
	atomic { granted[w] = 1; grants_pending++ }
}

inline wait_grant(me) {
	/* yield; resumed by the wake task */
	atomic { granted[me] == 1 -> granted[me] = 0; grants_pending-- }
}

proctype Co(byte me)
{
	byte r = 0, old, w;

	do
	:: r < ROUNDS ->
		/* ---- lock ---- */
		if
		:: atomic { locked == 0 -> locked = 1 }      /* fast path CAS */
		:: atomic { locked != 0 -> skip };           /* CAS failed */
			atomic { stack[nstack] = me; nstack++ };  /* push_arrival */
			atomic { old = locked; locked++ };        /* fetch_add */
			if
			:: old == 0 ->
				pop_oldest(w);
				assert(w != 255);
				if
				:: w == me -> skip
				:: else -> grant(w); wait_grant(me)
				fi
			:: else -> wait_grant(me)
			fi
		fi;
		/* ---- critical section ---- */
		in_cs++;
		assert(in_cs == 1);
		in_cs--;
		/* ---- unlock ---- */
		atomic { old = locked; locked-- };           /* fetch_sub */
		if
		:: old == 1 -> skip
		:: else ->
			pop_oldest(w);
			assert(w != 255);
			grant(w)
		fi;
		r++
	:: else -> break
	od
}

init {
	atomic {
		byte i = 0;
		do
		:: i < N -> run Co(i); i++
		:: else -> break
		od
	}
	(_nr_pr == 1);
	assert(locked == 0 && grants_pending == 0 && nstack == 0 && fhead == ftail)
}
