package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/schema/schematest"
)

// TestBuiltCaddyHasTheModuleAndAdaptsTheExample is the smoke test of bin/caddy as
// xcaddy.sh builds it: the module is in, and the operator's example config adapts to
// JSON holding the handler.
func TestBuiltCaddyHasTheModuleAndAdaptsTheExample(t *testing.T) {
	bin := binaries(t)
	out, err := exec.Command(filepath.Join(bin, "caddy"), "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "http.handlers.v1_gateway") {
		t.Errorf("bin/caddy does not list http.handlers.v1_gateway:\n%s", out)
	}

	cmd := exec.Command(filepath.Join(bin, "caddy"), "adapt", "--config", filepath.Join(root(t), "Caddyfile.example"), "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://x@127.0.0.1:1/x", "REDIS_URL=redis://127.0.0.1:1", "GATEWAY_SECRET=s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("caddy adapt Caddyfile.example: %v\n%s", err, stderr.String())
	}
	var cfg map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &cfg); err != nil {
		t.Fatalf("adapt printed no JSON: %v\n%s", err, stdout.String())
	}
	if !strings.Contains(stdout.String(), `"handler":"v1_gateway"`) {
		t.Errorf("the adapted example has no v1_gateway handler:\n%s", stdout.String())
	}
	// Every reverse_proxy of the example, the dashboard's included, bounds its wait on
	// the upstream.
	proxies := 0
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "reverse_proxy" {
				proxies++
				tr, _ := v["transport"].(map[string]any)
				if tr["dial_timeout"] == nil || tr["response_header_timeout"] == nil {
					t.Errorf("a reverse_proxy of the example has no dial_timeout or response_header_timeout: %v", v)
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(cfg)
	if proxies < 2 {
		t.Errorf("the example has %d reverse_proxy handlers, want the /v1 one and the dashboard's", proxies)
	}
}

// TestTheBinariesReportTheCheckoutsVersion checks the version make build gives both
// binaries: scripts/version.sh's, as `caddy list-modules --versions` shows the module
// and as `upstream version` prints it.
func TestTheBinariesReportTheCheckoutsVersion(t *testing.T) {
	bin := binaries(t)
	cmd := exec.Command(filepath.Join(root(t), "scripts", "version.sh"))
	cmd.Env = append(os.Environ(), "VERSION=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/version.sh: %v", err)
	}
	want := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(want) || want == "v0.0.0-00010101000000-000000000000" {
		t.Fatalf("scripts/version.sh printed %q, want a tag or a pseudo-version of HEAD", want)
	}

	out, err = exec.Command(filepath.Join(bin, "caddy"), "list-modules", "--versions").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules --versions: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`(?m)^http\.handlers\.v1_gateway .*$`).Find(out)
	if fields := strings.Fields(string(line)); len(fields) < 2 || fields[1] != want {
		t.Errorf("caddy list-modules --versions shows %q, want http.handlers.v1_gateway %s (rebuild with make build?)", line, want)
	}

	out, err = exec.Command(filepath.Join(bin, "upstream"), "version").Output()
	if err != nil || string(out) != `{"version":"`+want+`"}`+"\n" {
		t.Errorf("upstream version: %v, %q; want {\"version\":%q} (rebuild with make build?)", err, out, want)
	}
}

// TestStageSaysWhatRunsAndHowLong runs scripts/lib.sh's stage, which make test runs
// each of its steps through: it names the stage, its time and the time in all, and
// returns the command's status.
func TestStageSaysWhatRunsAndHowLong(t *testing.T) {
	cmd := exec.Command("bash", "-c", `set -euo pipefail; source scripts/lib.sh; SECONDS=125
stage "a stage" echo working
stage "a failing stage" sh -c 'exit 3' || echo "status $?"
stage "never reached" false`)
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("the script ended with %v, want exit 1 from its last stage", err)
	}
	// A loaded machine may cross a second's edge: the times are read as patterns.
	got := regexp.MustCompile(`in \ds \(2m0\ds in all\)|after \ds \(2m0\ds in all\)`).ReplaceAllStringFunc(string(out), func(s string) string {
		return regexp.MustCompile(`\d+s`).ReplaceAllString(s, "Ns")
	})
	want := `==> a stage
working
==> a stage: done in Ns (2mNs in all)
==> a failing stage
==> a failing stage: FAILED (exit 3) after Ns (2mNs in all)
status 3
==> never reached
==> never reached: FAILED (exit 1) after Ns (2mNs in all)
`
	if got != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

// TestTheOpenAPICheckPrintsNoNodeNotice runs scripts/openapi-check.sh as make test
// does: the documents pass, and Redocly CLI's notice that Node.js 20 reached its end
// of life, which it prints under Node.js 20, is not in the output.
func TestTheOpenAPICheckPrintsNoNodeNotice(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("no npm on this machine")
	}
	cmd := exec.Command(filepath.Join(root(t), "scripts", "openapi-check.sh"))
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("openapi-check.sh: %v\n%s", err, out)
	}
	for _, notice := range []string{"end-of-life", "Node.js 22", "╔"} {
		if bytes.Contains(out, []byte(notice)) {
			t.Errorf("openapi-check.sh printed %q:\n%s", notice, out)
		}
	}
	if !bytes.Contains(out, []byte("openapi-check: both documents lint clean")) {
		t.Errorf("openapi-check.sh did not say the documents passed:\n%s", out)
	}
}

// TestMakeRunPrintsWorkingCurl runs scripts/run.sh (what `make run` runs) in its
// checking mode: it must bring the stack up from Caddyfile.example, create the demo
// org and key, and the curl commands it prints must work; `make reload` must keep the
// demo's data and counters. With UPSTREAM_FLAGS allowing http and loopback, the
// upstream takes a webhook endpoint on loopback, and delivers its test event there.
func TestMakeRunPrintsWorkingCurl(t *testing.T) {
	binaries(t)
	top := root(t)
	var hooks atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("webhook-id") != "" && r.Header.Get("webhook-signature") != "" {
			hooks.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	cmd := exec.Command(filepath.Join(top, "scripts", "run.sh"))
	cmd.Dir = top
	cmd.Env = append(os.Environ(),
		"RUN_CHECK=1",
		"UPSTREAM_FLAGS=--webhook-allow-http --webhook-allow-private",
		"RUN_CHECK_WEBHOOK_URL="+receiver.URL+"/hook",
		"DATABASE_URL="+schematest.NewDatabase(t),
		fmt.Sprintf("GATEWAY_PORT=%d", freePort(t)),
		fmt.Sprintf("UPSTREAM_PORT=%d", freePort(t)),
		fmt.Sprintf("METRICS_PORT=%d", freePort(t)),
		fmt.Sprintf("UPSTREAM_ADMIN_PORT=%d", freePort(t)),
	)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("run.sh did not finish in 5 minutes:\n%s", out)
	}
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"export KEY='mon_live_", "curl -s http://127.0.0.1:", "/v1/me", "Ctrl-C", "run check passed",
		"source " + filepath.Join(top, ".stack", "run", "env") + "\n", "bin/upstream plan list\n", "make run: built in ",
		"<the password: printed only to a terminal; set DEMO_PASSWORD to choose it>", "GATEWAY_CONFIG=my.Caddyfile make reload",
		"(serve --webhook-allow-http --webhook-allow-private)", "make reload: the gateway runs " + filepath.Join(top, "Caddyfile.example")} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("run.sh output lacks %q:\n%s", want, out)
		}
	}
	// Its output is not a terminal: the password is nowhere in it (run.sh checks that
	// no file it wrote has it, and that it listens on loopback only).
	if bytes.Contains(out, []byte("demo-password-")) {
		t.Errorf("run.sh printed the demo password into output that is no terminal:\n%s", out)
	}
	if hooks.Load() == 0 {
		t.Errorf("the receiver on loopback got no signed webhook delivery")
	}
}

// TestMakeRunShowsThePasswordOnlyToATerminal holds lib.sh's shown_password, which
// make run prints the demo owner's password through: the password on a terminal;
// elsewhere the DEMO_PASSWORD that was set, or how to set one, never the password.
func TestMakeRunShowsThePasswordOnlyToATerminal(t *testing.T) {
	for _, tc := range []struct {
		demoPassword, terminal, want string
	}{
		{"", "1", "a-password-of-14"},
		{"a-password-of-14", "1", "a-password-of-14"},
		{"", "0", "<the password: printed only to a terminal; set DEMO_PASSWORD to choose it>"},
		{"a-password-of-14", "0", "<the DEMO_PASSWORD you set>"},
	} {
		cmd := exec.Command("bash", "-c", `set -euo pipefail; source scripts/lib.sh; shown_password a-password-of-14 "$1"`, "bash", tc.terminal)
		cmd.Dir = root(t)
		cmd.Env = append(os.Environ(), "DEMO_PASSWORD="+tc.demoPassword)
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("DEMO_PASSWORD=%q, terminal %s: %v %q, want %q", tc.demoPassword, tc.terminal, err, out, tc.want)
		}
	}
}

// TestMakeRunRefusesAPortInUseBeforeBuilding: make run checks its ports before the
// build of minutes, so a port in use fails at once and names the variables that move it.
func TestMakeRunRefusesAPortInUseBeforeBuilding(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	// Were the check gone, run.sh would build and start a demo: the deadline ends its
	// process group, which run.sh stops its demo on.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root(t), "scripts", "run.sh"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Dir = root(t)
	cmd.Env = append(os.Environ(), fmt.Sprintf("GATEWAY_PORT=%d", freePort(t)), fmt.Sprintf("UPSTREAM_PORT=%d", port),
		fmt.Sprintf("METRICS_PORT=%d", freePort(t)), fmt.Sprintf("UPSTREAM_ADMIN_PORT=%d", freePort(t)))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	want := fmt.Sprintf("port %d is in use: set GATEWAY_PORT / UPSTREAM_PORT / METRICS_PORT / UPSTREAM_ADMIN_PORT to free ones\n", port)
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || string(out) != want {
		t.Errorf("make run with UPSTREAM_PORT in use: %v, output %q, want exit 1 and %q alone", err, out, want)
	}
}

// TestAptGetWaitsForThePackageManagersLocks runs scripts/lib.sh's apt_get, which every
// script installs packages through, against the locks another apt-get or dpkg (an
// unattended upgrade at boot) holds: the lock of the package lists, which apt-get
// update does not wait for, and dpkg's frontend lock, which apt-get install waits for
// through DPkg::Lock::Timeout. This process holds them as apt does (fcntl locks), on
// the lock files of a package manager of its own: apt-get is pointed at empty lists, an
// empty dpkg status and a cache in a temporary folder by its Dir:: options, so the
// system's package manager is neither locked nor changed. It shows that apt_get waits
// while a lock is held and goes on once it is let go; not that an unattended upgrade
// at boot is such a holder (it is: it runs apt-get and dpkg).
func TestAptGetWaitsForThePackageManagersLocks(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get on this machine: the scripts install nothing here")
	}
	if os.Getuid() != 0 {
		t.Skip("apt_get runs apt-get through sudo when not root, which may ask for a password")
	}
	dir := t.TempDir()
	for _, d := range []string{"lists/partial", "cache/archives/partial", "parts", "dpkg/updates", "dpkg/info"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"sources.list", "dpkg/status"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	options := "-o Dir::State::Lists=" + dir + "/lists -o Dir::Etc::SourceList=" + dir + "/sources.list" +
		" -o Dir::Etc::SourceParts=" + dir + "/parts -o Dir::Cache=" + dir + "/cache -o Dir::State::status=" + dir + "/dpkg/status"
	for _, tc := range []struct {
		name, lock, command, says string
	}{
		{"the package lists (apt-get update)", "lists/lock", "update", "the package manager is busy"},
		{"dpkg's frontend lock (as apt-get install)", "dpkg/lock-frontend", "check", "Waiting for cache lock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.OpenFile(filepath.Join(dir, tc.lock), os.O_RDWR|os.O_CREATE, 0o640)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_WRLCK}); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", "-c", `set -euo pipefail; source scripts/lib.sh; APT_LOCK_WAIT=60 APT_LOCK_RETRY=1 apt_get `+options+" "+tc.command)
			cmd.Dir = root(t)
			var out testenv.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			// It waits while the lock is held, saying so, rather than fail at once.
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(out.String(), tc.says) {
				select {
				case err := <-done:
					t.Fatalf("apt_get %s ended while the lock was held (%v):\n%s", tc.command, err, out.String())
				case <-time.After(100 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("apt_get %s did not say it waits:\n%s", tc.command, out.String())
				}
			}
			// And goes on once the lock is let go.
			if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_UNLCK}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("apt_get %s after the lock was let go: %v\n%s", tc.command, err, out.String())
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("apt_get %s still waits after the lock was let go:\n%s", tc.command, out.String())
			}
		})
	}
}
