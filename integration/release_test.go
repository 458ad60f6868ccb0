package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// gitEnv is the environment of the git and make commands of these tests: an author of
// their own, no signing, and no VERSION, so that scripts/version.sh reads the tree.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VERSION=") && !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_AUTHOR_NAME=keygate test", "GIT_AUTHOR_EMAIL=test@keygate.invalid",
		"GIT_COMMITTER_NAME=keygate test", "GIT_COMMITTER_EMAIL=test@keygate.invalid",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
}

// inDir runs a shell command line in dir with gitEnv, and returns its output.
func inDir(t *testing.T, dir, line string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir, cmd.Env = dir, gitEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	return strings.TrimSpace(string(out))
}

// checkout copies the tracked files of this working tree, as they are now, into a new
// repository of one commit, and returns its folder: a clone that holds what is not
// committed yet too.
func checkout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := inDir(t, root(t), "git ls-files -z | tr '\\0' '\\n'")
	for _, f := range strings.Split(files, "\n") {
		src := filepath.Join(root(t), f)
		info, err := os.Lstat(src)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the working tree, or a link
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	inDir(t, dir, "git init -q -b main && git add -A && git commit -q -m 'a checkout'")
	return dir
}

// TestAReleaseBuildNamesItsTag cuts a release with scripts/release.sh in a copy of
// the tree, then builds bin/upstream at the tag as make build does: it prints the
// tag. The CHANGELOG has the release's section, the README's commands and go.mod
// name it, and both modules are tagged. A commit after it builds as Go's
// pseudo-version of the next patch. (The module's version in Caddy is the same
// scripts/version.sh's, which xcaddy.sh gives to the build:
// TestTheBinariesReportTheCheckoutsVersion checks that bin/caddy shows it.)
func TestAReleaseBuildNamesItsTag(t *testing.T) {
	dir := checkout(t)
	// The release needs a change to name: the copy's [Unreleased] gets one, whether the
	// tree's is empty (just after a release) or not.
	changelog, err := os.ReadFile(filepath.Join(dir, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	unreleased := strings.Replace(string(changelog), "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- A change to release.\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(unreleased), 0o644); err != nil {
		t.Fatal(err)
	}
	inDir(t, dir, "git commit -q -am 'a change to release'")
	before := inDir(t, dir, "scripts/version.sh")
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+-(0\.)?\d{14}-[0-9a-f]{12}$`).MatchString(before) {
		t.Errorf("before the release, version.sh prints %q, want a pseudo-version", before)
	}
	out := inDir(t, dir, "scripts/release.sh v0.98.7")
	if !strings.Contains(out, "which builds as v0.98.7") {
		t.Errorf("release.sh said:\n%s", out)
	}
	if tags := inDir(t, dir, "git tag --points-at HEAD | sort | tr '\\n' ' '"); tags != "gatewayauth/v0.98.7 v0.98.7" {
		t.Errorf("tags at the release's commit: %q", tags)
	}
	changelog, err = os.ReadFile(filepath.Join(dir, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := "## [Unreleased]\n\n## [0.98.7] - " + time.Now().UTC().Format(time.DateOnly) + "\n\n### "
	if !strings.Contains(string(changelog), section) || !strings.Contains(string(changelog), "\n[0.98.7]: https://github.com/keygate/keygate/compare/v") {
		t.Errorf("CHANGELOG.md lacks %q and the release's link", section)
	}
	if got := inDir(t, dir, "grep -c 'github.com/keygate/keygate/[a-z/]*@v0.98.7' README.md"); got != "2" {
		t.Errorf("the README names v0.98.7 in %s commands, want 2 (xcaddy build and go get)", got)
	}
	if got := inDir(t, dir, "grep -c '^\tgithub.com/keygate/keygate/gatewayauth v0.98.7$' go.mod"); got != "1" {
		t.Errorf("go.mod does not require gatewayauth at v0.98.7")
	}

	inDir(t, dir, "make -s bin/upstream")
	if got := inDir(t, dir, "bin/upstream version"); got != `{"version":"v0.98.7"}` {
		t.Errorf("upstream version built at the tag: %s", got)
	}
	inDir(t, dir, "echo >> README.md && git commit -q -am 'after the release'")
	if got := inDir(t, dir, "scripts/version.sh"); !regexp.MustCompile(`^v0\.98\.8-0\.\d{14}-[0-9a-f]{12}$`).MatchString(got) {
		t.Errorf("after the release, version.sh prints %q, want v0.98.8-0.<time>-<commit>", got)
	}
	// A second release of the same version is refused.
	cmd := exec.Command("scripts/release.sh", "v0.98.7")
	cmd.Dir, cmd.Env = dir, gitEnv()
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "the tag v0.98.7 exists") {
		t.Errorf("release.sh v0.98.7 again: %v\n%s", err, out)
	}
}
