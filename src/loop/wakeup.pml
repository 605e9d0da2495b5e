/*
 * Model of the loop's sleep/wake handshake and of freeing the loop
 * (cross-thread.c: ioc_loop_post(), deliver_wake(), the sleep markers,
 * ioc__loop_quiesce(); loop.c: loop_wait(), ioc_loop_free()).
 *
 * Producers push an item; the loop drains, sets its sleep marker when the
 * stack is empty and blocks until the eventfd has a count.  After the last
 * item the owner frees the loop.  Two failures are caught:
 *  - a lost wakeup: the loop blocked for good with items pending (an
 *    invalid end state);
 *  - a use after free: a producer touching the loop (reading its flag,
 *    writing its eventfd, counting its wake) after the free (an assertion).
 * One RMW on the stack word is one atomic step; the loop also runs rounds
 * woken by a stale eventfd count, which an earlier round may leave.
 *
 * With OLD_ORDER defined the model is the earlier design: a separate
 * sleeping flag that producers load after their push, and a free that
 * waits for nobody.  It must fail (tests/loop/test-loop-wakeup-model.sh).
 *
 *   spin -a wakeup.pml && cc -DSAFETY -o pan pan.c && ./pan
 */
#define NPROD 3

byte pending = 0;     /* items on the Treiber stack */
bool marked = false;  /* the stack holds the sleep marker (same word) */
bool sleeping = false;/* OLD_ORDER: the separate flag */
byte efd = 0;         /* eventfd counter */
byte processed = 0;
byte owed = 0;        /* loop-private: markers found replaced */
byte wakes_done = 0;  /* owed wakes delivered */
bool freed = false;

proctype producer()
{
	bool owe;

#ifdef OLD_ORDER
	pending++;                                  /* CAS push */
	assert(!freed);                             /* load(sleeping) */
	if
	:: sleeping ->
		atomic { owe = sleeping; sleeping = false };
		if
		:: owe -> assert(!freed); efd++     /* write(eventfd) */
		:: else -> skip
		fi
	:: else -> skip
	fi
#else
	atomic { owe = marked; marked = false; pending++ }  /* CAS push */
	if
	:: owe ->
		assert(!freed); efd++;              /* write(eventfd) */
		assert(!freed); wakes_done++        /* release increment */
	:: else -> skip                             /* touches nothing */
	fi
#endif
}

active proctype loop_thread()
{
	byte got;
	bool try;

	do
	:: atomic { got = pending; pending = 0 };   /* exchange: drain */
	   processed = processed + got;
	   if
	   :: processed == NPROD -> break
	   :: else -> skip
	   fi;
#ifdef OLD_ORDER
	   sleeping = true;
	   if
	   :: pending > 0 -> skip
	   :: else -> efd > 0; efd = 0
	   fi;
	   sleeping = false
#else
	   atomic {                                 /* CAS empty -> marker */
		if
		:: pending == 0 -> marked = true; try = true
		:: else -> try = false
		fi
	   };
	   if
	   :: try ->
		efd > 0; efd = 0;                   /* block; read eventfd */
		atomic {                            /* CAS marker -> empty */
			if
			:: marked -> marked = false
			:: else -> owed++
			fi
		}
	   :: else -> skip
	   fi
#endif
	od;
	assert(processed == NPROD);
	/* ioc_loop_free(): wait for the owed wakes, then free. */
#ifndef OLD_ORDER
	wakes_done == owed;
#endif
	freed = true
}

init
{
	atomic {
		byte i = 0;
		do
		:: i < NPROD -> run producer(); i++
		:: else -> break
		od
	}
}
