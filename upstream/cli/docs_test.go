package cli

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

// flagLine matches the lines of a --help that list a flag, the flag's name in its
// group.
var flagLine = regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`)

// TestEveryCommandFlagAndVariableIsDocumented fails on a command, a flag or an
// environment variable that docs/configuration.md does not name. It names them as
// `upstream NAME`, `--flag` and `VARIABLE`. So the reference cannot fall behind the
// code. The flags are those each command's --help prints.
func TestEveryCommandFlagAndVariableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := func(s string) bool { return bytes.Contains(doc, []byte("`"+s+"`")) }
	seen := 0
	for _, cmd := range commands {
		if !bytes.Contains(doc, []byte("`upstream "+cmd.name)) {
			t.Errorf("docs/configuration.md does not document the command `upstream %s`", cmd.name)
		}
		var stdout, stderr bytes.Buffer
		args := append(strings.Fields(cmd.name), "--help")
		if code := Main(context.Background(), args, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" }); code != exitOK {
			t.Fatalf("upstream %s --help: exit %d, %s", cmd.name, code, stderr.String())
		}
		for _, m := range flagLine.FindAllStringSubmatch(stdout.String(), -1) {
			seen++
			if !documented("--" + m[1]) {
				t.Errorf("docs/configuration.md does not document `--%s` of `upstream %s`", m[1], cmd.name)
			}
		}
	}
	if seen < len(commands) {
		t.Fatalf("found %d flags in the --help of %d commands: the pattern no longer reads them", seen, len(commands))
	}
	var usage bytes.Buffer
	(&cli{}).printUsage(&usage, "")
	_, env, _ := strings.Cut(usage.String(), "environment:")
	for _, name := range append(regexp.MustCompile(`[A-Z][A-Z_]+`).FindAllString(env, -1), "LEAK_REPORT_TOKEN", "USAGE_EXPORT_SECRET", "USAGE_EXPORT_TOKEN") {
		if !documented(name) {
			t.Errorf("docs/configuration.md does not document the variable `%s`", name)
		}
	}
}
