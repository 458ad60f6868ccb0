// Package cli is the upstream's command line (docs/configuration.md). `upstream serve`
// serves package httpapi. `upstream migrate` applies the schema. The operator's plan,
// org, user and member commands write through package store. Main parses and
// dispatches them. cmd/upstream calls Main.
package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/tracing"
)

// Exit codes of Main.
const (
	exitOK      = 0
	exitFailure = 1 // the command could not be carried out
	exitUsage   = 2 // the command line or environment is wrong
)

// Main runs the upstream command line. args are the arguments after the program's
// name. getenv reads the environment. ctx ends `serve`; main cancels it on SIGINT and
// SIGTERM. On success, each operator command prints one JSON object on stdout. Any
// failure is one line on stderr. Main returns the exit code. It is 0 on success and for
// --help, 1 when the command failed, and 2 when the command line or environment is
// wrong.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	name, err := c.dispatch(args)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage) || apperr.Code(err) == apperr.EINVALID:
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(cliMessage(err)))
		return exitUsage
	default:
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(cliMessage(err)))
		return exitFailure
	}
}

// cliMessage is err as the operator reads it. It is the Message of an *Error, or else
// the full text: the operator may see internals.
func cliMessage(err error) string {
	var e *apperr.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// oneLine joins the lines of s, so every failure is one line on stderr.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// errUsage marks errors in the command line or environment (exit 2).
var errUsage = errors.New("usage")

// usageErrorf returns an errUsage with a formatted message.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// cli is one run of the command line.
type cli struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

// dispatch runs the command the first one or two words of args name. It returns the
// name to prefix messages with.
func (c *cli) dispatch(args []string) (string, error) {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"} // as `caddy version`, and the flag many programs take
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		c.printUsage(c.stdout, "")
		if len(args) == 0 {
			return "upstream", usageErrorf("a command is required")
		}
		return "upstream", nil
	}
	for _, cmd := range commands {
		words := strings.Fields(cmd.name)
		if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
			name := "upstream " + cmd.name
			return name, cmd.run(c, name, args[len(words):])
		}
	}
	// A group word alone ("plan") or with --help lists the group's commands.
	group := args[0]
	if c.hasGroup(group) {
		c.printUsage(c.stdout, group)
		if len(args) > 1 && (args[1] == "-h" || args[1] == "--help") {
			return "upstream " + group, nil
		}
		if len(args) == 1 {
			return "upstream " + group, usageErrorf("a subcommand is required")
		}
		return "upstream " + group, usageErrorf("unknown subcommand %q", args[1])
	}
	return "upstream", usageErrorf("unknown command %q (see upstream --help)", args[0])
}

// hasGroup reports whether group is the first word of a command, as "plan" is.
func (c *cli) hasGroup(group string) bool {
	for _, cmd := range commands {
		if first, _, ok := strings.Cut(cmd.name, " "); ok && first == group {
			return true
		}
	}
	return false
}

// printUsage lists the commands, or those of one group.
func (c *cli) printUsage(w io.Writer, group string) {
	fmt.Fprintln(w, "usage: upstream <command> [flags]   (upstream <command> --help for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	for _, cmd := range commands {
		if group == "" || strings.HasPrefix(cmd.name, group+" ") {
			fmt.Fprintf(w, "  %-14s %s\n", cmd.name, cmd.summary)
		}
	}
	if group == "" {
		fmt.Fprintln(w, "\nenvironment: DATABASE_URL (every command), GATEWAY_SECRET (serve), GATEWAY_JWKS (serve), KEY_PREFIX (serve),\n"+
			"OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_TRACES_EXPORTER (serve: traces, with the other OpenTelemetry variables)")
	}
}

// flags returns a FlagSet for command name. Its --help prints synopsis and
// description, then the flags.
func (c *cli) flags(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: %s %s\n\n%s\n", name, synopsis, description)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(out, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses args into fs. The flags named in required must be given, and no
// positional argument. --help prints the usage on stdout and returns flag.ErrHelp.
func (c *cli) parse(fs *flag.FlagSet, args []string, required ...string) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = c.stdout.Write(buf.Bytes())
		return err
	}
	fs.SetOutput(c.stderr)
	if err != nil {
		return usageErrorf("%v (see --help)", err)
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range required {
		if !set[name] {
			return usageErrorf("--%s is required (see --help)", name)
		}
	}
	return nil
}

// databaseURL returns DATABASE_URL, or a usage error when it is not set.
func (c *cli) databaseURL() (string, error) {
	u := c.getenv("DATABASE_URL")
	if u == "" {
		return "", usageErrorf("DATABASE_URL is not set: set it to the postgres:// URL of the database")
	}
	return u, nil
}

// connect opens a pool of maxConns connections on DATABASE_URL, and pings it. 0 means
// store.PoolConfig's default. timeout bounds each database wait. traces, if not nil,
// traces its queries.
func (c *cli) connect(maxConns int32, timeout time.Duration, traces *tracing.Traces) (*pgxpool.Pool, error) {
	u, err := c.databaseURL()
	if err != nil {
		return nil, err
	}
	cfg, err := store.PoolConfig(u, maxConns, timeout)
	if err != nil {
		return nil, errBadDatabaseURL
	}
	traces.Pool(cfg)
	return store.Open(c.ctx, cfg)
}

// errBadDatabaseURL is a DATABASE_URL that pgx cannot parse. Its text may hold a
// password, so the message leaves it out.
var errBadDatabaseURL = usageErrorf("DATABASE_URL is not a valid postgres URL")

// printJSON writes v as one line of JSON on stdout.
func (c *cli) printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

// splitList splits a comma-separated flag value, and trims white space around items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// readPasswordLine reads the first line of r without its line ending ("\n" or "\r\n").
func readPasswordLine(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading the password from standard input: %w", err)
	}
	line = strings.TrimSuffix(line, "\n")
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		return "", apperr.Invalid("password", "the first line of standard input is empty")
	}
	return line, nil
}
