// Package pgpair is for tests only: a PostgreSQL primary with a synchronous standby, of
// one test's own, on loopback, for the failover tests. scripts/stack.sh up-failover
// starts them in a folder of their own, so that a test may stop, kill and promote
// them without touching the servers the other tests share. Nothing shipped imports
// it.
package pgpair

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// Pair is a primary and its synchronous standby, standby 1 of scripts/stack.sh. The
// URLs name their keygate database.
type Pair struct {
	t   testing.TB
	dir string
	// PrimaryURL is the primary alone.
	PrimaryURL string
	// StandbyURL is the standby alone.
	StandbyURL string
	// FailoverURL names both, primary first, with target_session_attrs=read-write: it
	// reaches whichever of them takes writes.
	FailoverURL string
}

// Start starts a pair, stopped and removed when the test ends. It takes a few
// seconds.
func Start(t testing.TB) *Pair {
	t.Helper()
	// Not t.TempDir: its parent folder is the test's alone, and PostgreSQL runs as
	// another user when the tests run as root.
	dir, err := os.MkdirTemp("", "keygate-pair-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Pair{t: t, dir: dir}
	t.Cleanup(func() {
		if out, err := p.command("down"); err != nil {
			t.Logf("stack.sh down %s: %v\n%s", dir, err, out)
		}
	})
	if out, err := p.command("up-failover"); err != nil {
		t.Fatalf("stack.sh up-failover: %v\n%s", err, out)
	}
	env := testenv.StackEnv(t, filepath.Join(dir, "env"))
	p.PrimaryURL, p.StandbyURL, p.FailoverURL = env["DATABASE_URL"], env["DATABASE_STANDBY_URL"], env["DATABASE_FAILOVER_URL"]
	return p
}

// StopStandby stops the standby (pg_ctl stop -m fast): its WAL receiver confirms
// nothing more, and a commit that waits for it waits until StartStandby.
func (p *Pair) StopStandby() { p.run("stop-standby", "1") }

// StartStandby starts the standby again; it streams from where it stopped.
func (p *Pair) StartStandby() { p.run("start-standby", "1") }

// KillPrimary stops the primary at once, as a crash does (pg_ctl stop -m immediate).
func (p *Pair) KillPrimary() { p.run("kill-pg") }

// Promote promotes the standby and returns once it takes writes.
func (p *Pair) Promote() { p.run("promote-standby", "1") }

// AddStandby makes standby n (2 or more) of the primary, streaming asynchronously,
// and returns its URL.
func (p *Pair) AddStandby(n int) string {
	p.t.Helper()
	p.run("add-standby", strconv.Itoa(n))
	port, err := os.ReadFile(filepath.Join(p.dir, "standby"+strconv.Itoa(n)+".port"))
	if err != nil {
		p.t.Fatal(err)
	}
	u, err := url.Parse(p.StandbyURL)
	if err != nil {
		p.t.Fatal(err)
	}
	u.Host = "127.0.0.1:" + strings.TrimSpace(string(port))
	return u.String()
}

// Follow points standby n at the promoted standby, as a failover tool does: it
// streams from it on its new timeline.
func (p *Pair) Follow(n int) { p.run("follow-standby", strconv.Itoa(n), "1") }

func (p *Pair) run(command string, args ...string) {
	p.t.Helper()
	if out, err := p.command(command, args...); err != nil {
		p.t.Fatalf("stack.sh %s %s: %v\n%s", command, strings.Join(args, " "), err, out)
	}
}

func (p *Pair) command(command string, args ...string) ([]byte, error) {
	script, err := stackScript()
	if err != nil {
		return nil, err
	}
	return exec.Command(script, append([]string{command, p.dir}, args...)...).CombinedOutput()
}

// stackScript finds scripts/stack.sh in the folder of a test or above it.
func stackScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		s := filepath.Join(dir, "scripts", "stack.sh")
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", os.ErrNotExist
		}
		dir = up
	}
}
