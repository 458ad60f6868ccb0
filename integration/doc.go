// Package integration proves keygate end to end as a user runs it: the bin/caddy built
// by xcaddy.sh and bin/upstream as separate processes, PostgreSQL and Redis started by
// scripts/stack.sh, everything talking HTTP on loopback and set up only through the
// operator CLI and the dashboard routes. Run it with `make test`.
//
// # Parallel tests
//
// The tests run one at a time: many measure time or count what a shared server saw,
// and some stop and restart the shared PostgreSQL and Redis. A few spend most of
// their time waiting on a clock, a lease or PostgreSQL's statistics, and call
// t.Parallel. Go runs those once every other test has ended, beside one another
// (-parallel, the number of cores), so their waits overlap and nothing else runs
// beside them. Such a test works in a database, an upstream and gateways of its own,
// and stops no shared server.
package integration
