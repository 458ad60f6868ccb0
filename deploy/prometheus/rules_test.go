package prometheus_test

import (
	"os/exec"
	"slices"
	"testing"

	"github.com/keygate/keygate/deploy/prometheus"
)

// promtool runs Prometheus's promtool with args in this directory and fails the test
// with its output when it fails. make test installs it (Debian's prometheus package).
func promtool(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatal("promtool is not installed: `apt-get install prometheus` (make test does)")
	}
	out, err := exec.Command("promtool", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
}

// TestTheRulesAreValid is `promtool check rules`: the file parses, every expression is
// valid PromQL, every template renders.
func TestTheRulesAreValid(t *testing.T) {
	promtool(t, "check", "rules", "keygate.rules.yml")
}

// TestTheRulesFireOnWhatTheyAreAbout is `promtool test rules`: each alert fires on the
// series of keygate.rules.test.yml that should fire it, with its labels and words, and
// not on their neighbours.
func TestTheRulesFireOnWhatTheyAreAbout(t *testing.T) {
	promtool(t, "test", "rules", "keygate.rules.test.yml")
}

func TestSeriesNamesWhatTheRulesRead(t *testing.T) {
	names, err := prometheus.Series()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keygate_dependency_up", "keygate_key_lookup_duration_seconds_bucket", "keygate_standby_up",
		"keygate_upstream_webhook_outbox_oldest_age_seconds", "keygate_upstream_usage_export_oldest_age_seconds",
		"keygate_upstream_usage_export_events_total", "up"} {
		if !slices.Contains(names, want) {
			t.Errorf("the rules do not read %s; they read %q", want, names)
		}
	}
}
