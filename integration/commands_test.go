package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestMakeRunPrintsWorkingCurl runs scripts/run.sh (what `make run` runs after building)
// in its checking mode: it must bring the stack up from Caddyfile.example, create the
// demo org and key, and the curl commands it prints must work.
func TestMakeRunPrintsWorkingCurl(t *testing.T) {
	binaries(t)
	top := root(t)
	cmd := exec.Command(filepath.Join(top, "scripts", "run.sh"))
	cmd.Dir = top
	cmd.Env = append(os.Environ(),
		"RUN_CHECK=1",
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
	for _, want := range []string{"export KEY='mon_live_", "curl -s http://127.0.0.1:", "/v1/me", "Ctrl-C", "run check passed"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("run.sh output lacks %q:\n%s", want, out)
		}
	}
}
