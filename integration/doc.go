// Package integration proves keygate end to end as a user runs it: the bin/caddy built
// by xcaddy.sh and bin/upstream as separate processes, PostgreSQL and Redis started by
// scripts/stack.sh, everything talking HTTP on loopback and set up only through the
// operator CLI and the dashboard routes. Run it with `make test`.
package integration
