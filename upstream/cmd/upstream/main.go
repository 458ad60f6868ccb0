// Command upstream is keygate's upstream service and its operator command line:
// `upstream serve`, `upstream migrate`, and the plan, org, user and member commands.
// Run `upstream --help` for the list. The commands live in package upstream
// (commands.go and serve.go; cli.go parses and dispatches them).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keygate/keygate/upstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := upstream.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
