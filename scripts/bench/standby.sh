# shellcheck shell=bash
# bench/standby.sh: (sb), key lookups on a standby: the bench key on two gateway sites
# of one Caddy (bench_pair, pair.sh), one with database_read_urls on the bench stack's
# fast streaming standby (stack.sh up-standbys) and one with every lookup on the
# primary: the throughput ratio (target 0.97: within 0.03) and the primary's CPU per
# request. The standby runs on the same machine, so its CPU competes with the gateway's;
# PostgreSQL CPU counts the primary's processes only, so PostgreSQL CPU A - B shows what
# leaves the primary. BENCH_STANDBY=0 skips it, BENCH_ONLY=standby runs it alone and
# replaces it in OUT.
paragraph[standby]="(sb) lookups on a standby"

bench_standby() {
	local standby
	# The bench's own stack, never a standby the caller's environment names: it must
	# stream from this PostgreSQL.
	scripts/stack.sh up-standbys "$stack" >/dev/null
	standby=$(stack_env DATABASE_STANDBY_FAST_URL)
	# A standby just made still replays what the setup wrote: the rounds start once it
	# has caught up, after a longer warm-up (STANDBY_WARMUP, 10s) than the other pairs'.
	wait_replayed "$standby"
	# Its rounds spread from 0.75 to 1.20 on this kind of machine, against a target of
	# 0.97: it runs STANDBY_ROUNDS (10) of them.
	WARMUP=${STANDBY_WARMUP:-10s} PAIR_ROUNDS=${STANDBY_ROUNDS:-10} bench_pair standby_report "(sb) lookups on a standby" "A: gateway, database_read_urls" \
		"database_read_urls $standby" "B: gateway, lookups on the primary" "" 0.97
	# Running, the standbys would replay every later write of the bench on the same two
	# cores: the usage record's, (mk)'s million keys. Stopped, their replication slots
	# would make the primary keep all that WAL. So it removes them; the capacity
	# section's (pr) makes new ones.
	scripts/stack.sh down-standbys "$stack"
}
