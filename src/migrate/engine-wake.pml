/*
 * Promela model of the source engine's sleep/wake handshake (source.c,
 * engine_kick() and engine_wait()).  Check: spin -a engine-wake.pml &&
 * cc -O2 -DSAFETY -o pan pan.c && ./pan (tests/migrate/
 * test-mig-engine-model.sh does this when spin is installed).
 *
 * eng_state is only ever changed by read-modify-writes (the kicks' and
 * the engine's compare-and-swap, the engine's exchange), so the order of
 * those steps is one total order; each atomic block below is one of them:
 *   kicker:  publish its news; CAS: SLEEPING -> RUNNING (then post
 *            eng_wake, a second step), else -> KICKED.
 *   engine:  look at the news; CAS RUNNING -> SLEEPING and yield, or on
 *            KICKED, exchange to RUNNING and look again.
 *   loop:    runs a posted eng_wake, which resumes the engine.
 *
 * Properties: every kicker's news is seen (the engine ends; an engine
 * asleep for good is an invalid end state); eng_wake is never posted
 * while it is still queued, and resumes only a sleeping engine.  The
 * mutants (tests/migrate/test-mig-engine-model.sh): a kick that finds
 * the engine running and leaves no mark, and an engine that sleeps
 * without looking at KICKED, must each deadlock.
 */
#define NKICK 2         /* kickers */
#define ROUNDS 2        /* kicks each */
#define NEWS (NKICK * ROUNDS)
#define RUNNING 0
#define KICKED 1
#define SLEEPING 2

byte state = RUNNING;
byte pending = 0;       /* news published, not yet looked at */
byte seen = 0;          /* news the engine looked at */
bit posted = 0;         /* eng_wake queued on the loop */
bit asleep = 0;         /* the engine yielded in engine_wait() */

active proctype engine()
{
	bit kicked;

	do
	:: seen == NEWS -> break
	:: else ->
		atomic { seen = seen + pending; pending = 0 }   /* the look */
		if
		:: seen == NEWS -> break
		:: else -> skip
		fi;
		kicked = 0;
		atomic {
			if
			:: state == RUNNING -> state = SLEEPING; asleep = 1
			:: state == KICKED -> kicked = 1 /* KICKED: no sleep */
			fi
		};
		if
		:: kicked -> state = RUNNING    /* the exchange */
		:: else -> (asleep == 0)        /* yielded until resumed */
		fi
	od
}

active [NKICK] proctype kicker()
{
	byte n = 0;
	bit mine;

	do
	:: n == ROUNDS -> break
	:: else ->
		n++;
		mine = 0;
		pending++;                      /* the news */
		atomic {
			if
			:: state == SLEEPING -> state = RUNNING; mine = 1
			:: else -> state = KICKED  /* a mark for the engine */
			fi
		};
		if
		:: mine -> atomic { assert(!posted); posted = 1 }
		:: else -> skip
		fi
	od
}

active proctype loop()
{
end:	do
	:: atomic { posted -> posted = 0; assert(asleep); asleep = 0 }
	od
}
