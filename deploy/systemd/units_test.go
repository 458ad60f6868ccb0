package systemd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var units = []string{"keygate-gateway.service", "keygate-upstream.service"}

// installed copies the units into a folder of the test's own, with their programs
// (/usr/local/bin/caddy, /usr/local/bin/upstream) replaced by executables there:
// systemd-analyze verify checks that a unit's programs exist.
func installed(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze is not installed: `apt-get install systemd` (make test does)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, prog := range []string{"caddy", "upstream"} {
		if err := os.WriteFile(filepath.Join(bin, prog), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/"), []byte(bin+"/"))
		if err := os.WriteFile(filepath.Join(dir, u), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// analyze runs systemd-analyze with args in dir, and returns what it printed. A unit
// systemd would refuse or half-ignore (an unknown key, a value it cannot parse) makes
// verify print a line but still exit 0: so any output is a failure.
func analyze(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("systemd-analyze", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTheUnitsVerify is `systemd-analyze verify` on both units: every key known, every
// value parsed, every program there.
func TestTheUnitsVerify(t *testing.T) {
	dir := installed(t)
	for _, u := range units {
		out, err := analyze(t, dir, "verify", filepath.Join(dir, u))
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
}

// TestTheUnitsAreHardened: each runs as its own user, with its environment from a
// file, a read-only file system (ProtectSystem=strict) and no new privileges, and
// systemd-analyze security rates its exposure at most 2.0 of 10 ("OK").
func TestTheUnitsAreHardened(t *testing.T) {
	dir := installed(t)
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		user := strings.TrimSuffix(u, ".service")
		for _, line := range []string{"User=" + user, "Group=" + user, "EnvironmentFile=/etc/keygate/", "ProtectSystem=strict",
			"NoNewPrivileges=true", "ProtectHome=true", "PrivateTmp=true", "SystemCallFilter=@system-service"} {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(line)).Match(b) {
				t.Errorf("%s has no line %s", u, line)
			}
		}
		out, err := analyze(t, dir, "security", "--offline=true", "--threshold=20", u)
		if err != nil {
			t.Errorf("systemd-analyze security %s: exposure over 2.0: %v\n%s", u, err, out)
		}
	}
	sysusers, err := os.ReadFile("keygate.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if !regexp.MustCompile(`(?m)^u ` + strings.TrimSuffix(u, ".service") + ` `).Match(sysusers) {
			t.Errorf("keygate.sysusers does not create the user of %s", u)
		}
	}
}
