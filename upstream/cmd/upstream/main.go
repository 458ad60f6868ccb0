// Command upstream is keygate's upstream service and its operator command line. Its
// commands are `upstream serve`, `upstream migrate`, `upstream version`, and the plan,
// org, user and member commands. Run `upstream --help` for the list. They live in package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keygate/keygate/upstream/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
