// Command capacity is for benchmarks only: it measures how many key lookups PostgreSQL
// and how many counts Redis serve per CPU-second, driving them through the gateway's
// own batching code, for `make bench`'s capacity sections (scripts/bench/capacity.sh,
// docs/scaling.md):
//
//	capacity seed     -database-url URL [-keys 1000000] [-orgs 10000]
//	capacity keys     [-count 2000] [-every 500]
//	capacity lookups  -database-url URL [-probe-url URL] [-pgbouncer-pid PID] [-procs 4] [-waiters 1,4,16,64,256]
//	capacity counts   -redis-url URL [-cluster] [-procs 4] [-waiters 1,4,16,64,256]
//	capacity lastused -database-url URL [-sizes 1000,10000,100000]
//
// lookups and counts start -procs copies of this program as workers, each one
// gateway process's worth of clients, and print a table of CPU per operation.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keygate/keygate/integration/capacity"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := capacity.Main(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		os.Exit(1)
	}
}
