package integration

// gatewayauth as the teams behind the gateway and the platform teams meet it: a
// service module of its own importing it, the README's commands run as written, the
// assertions checked against another JOSE implementation and against the shell script
// of docs/security.md. None of these needs the stack or the binaries but
// TestTheREADMEBuildsCaddyFromAPublishedVersion, which builds Caddy.

import (
	"archive/zip"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// testVersion is the version the file proxies of these tests publish the working
// tree as: the latest release, CHANGELOG.md's first versioned section, which the
// README's commands and go.mod's requirement of gatewayauth name
// (TestTheLatestReleaseIsNamedAlike).
var testVersion = latestRelease()

// latestRelease reads the latest release's version from CHANGELOG.md.
func latestRelease() string {
	b, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		panic(err)
	}
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - `).FindSubmatch(b)
	if m == nil {
		panic("CHANGELOG.md names no release")
	}
	return "v" + string(m[1])
}

// TestTheLatestReleaseIsNamedAlike: the README's commands for a published version and
// go.mod's requirement of gatewayauth name CHANGELOG.md's latest release, as
// scripts/release.sh leaves them.
func TestTheLatestReleaseIsNamedAlike(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	published := regexp.MustCompile(`github\.com/keygate/keygate/[a-z/]*@(v[0-9.]+)\b`).FindAllSubmatch(readme, -1)
	if len(published) != 2 {
		t.Errorf("the README names a published version in %d commands, want 2", len(published))
	}
	for _, m := range published {
		if string(m[1]) != testVersion {
			t.Errorf("the README names %s, CHANGELOG.md's latest release is %s", m[0], testVersion)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(root(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "\tgithub.com/keygate/keygate/gatewayauth "+testVersion+"\n") {
		t.Errorf("go.mod does not require gatewayauth at %s, CHANGELOG.md's latest release", testVersion)
	}
}

// serviceMain is the throwaway service: gatewayauth's Middleware in front of a handler.
const serviceMain = `package main

import (
	"log"
	"net/http"

	"github.com/keygate/keygate/gatewayauth"
)

func main() {
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: "http://127.0.0.1:8080/.well-known/jwks.json"})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/v1/", v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := gatewayauth.FromContext(r.Context())
		w.Write([]byte(id.OrgID))
	})))
	log.Fatal(http.ListenAndServe(":9000", nil))
}
`

// newService writes a module of its own, example.com/service at Go 1.22, in dir, and
// returns dir.
func newService(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.mod"), "module example.com/service\n\ngo 1.22\n")
	write(t, filepath.Join(dir, "main.go"), serviceMain)
	return dir
}

func write(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goEnv is the environment of the go commands these tests run: no toolchain
// switching, no network unless a test adds a GOPROXY, its own module cache.
func goEnv(t *testing.T, extra ...string) []string {
	env := append(os.Environ(), "GOTOOLCHAIN=local", "GOPROXY=off", "GOFLAGS=-mod=mod -modcacherw",
		"GOWORK=off", "GOMODCACHE="+filepath.Join(t.TempDir(), "gomod"))
	return append(env, extra...)
}

// run runs a shell command line in dir and returns its output.
func run(t *testing.T, dir string, env []string, line string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", dir, line, err, out)
	}
	return string(out)
}

// checkService builds the service in dir and checks what importing gatewayauth did to
// it: at most 5 modules in its graph, its go line still 1.22, no toolchain line.
func checkService(t *testing.T, dir string, env []string) {
	t.Helper()
	run(t, dir, env, "go build ./... && go vet ./...")
	mods := strings.Split(strings.TrimSpace(run(t, dir, env, "go list -m all")), "\n")
	if len(mods) > 5 {
		t.Errorf("the service's go list -m all has %d modules, want at most 5: %v", len(mods), mods)
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !regexp.MustCompile(`(?m)^go 1\.22$`).Match(gomod) || strings.Contains(string(gomod), "toolchain") {
		t.Errorf("importing gatewayauth changed the service's Go version:\n%s", gomod)
	}
	t.Logf("go list -m all: %v", mods)
}

func TestAServiceImportingGatewayauthHasAtMostFiveModules(t *testing.T) {
	dir := newService(t, t.TempDir())
	env := goEnv(t)
	run(t, dir, env, "go mod edit -require=github.com/keygate/keygate/gatewayauth@"+testVersion+
		" -replace=github.com/keygate/keygate/gatewayauth="+filepath.Join(root(t), "gatewayauth")+" && go mod tidy")
	checkService(t, dir, env)
}

// readmeBlocks returns the fenced code blocks of the README.
func readmeBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)\n```[a-z]*\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// readmeBlock returns the README's one code block holding all of words.
func readmeBlock(t *testing.T, words ...string) string {
	t.Helper()
	var found []string
	for _, b := range readmeBlocks(t) {
		all := true
		for _, w := range words {
			all = all && strings.Contains(b, w)
		}
		if all {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d code blocks of the README hold %q, want 1", len(found), words)
	}
	return found[0]
}

func TestTheREADMEsGatewayauthCommandsWorkAsWritten(t *testing.T) {
	t.Run("from a checkout", func(t *testing.T) {
		// The README's ../keygate is the working tree.
		top := t.TempDir()
		if err := os.Symlink(root(t), filepath.Join(top, "keygate")); err != nil {
			t.Fatal(err)
		}
		dir := newService(t, filepath.Join(top, "service"))
		env := goEnv(t) // GOPROXY=off: a checkout needs no network at all
		run(t, dir, env, readmeBlock(t, "go mod edit -replace github.com/keygate/keygate/gatewayauth"))
		checkService(t, dir, env)
	})
	t.Run("from a published version", func(t *testing.T) {
		block := readmeBlock(t, "go get github.com/keygate/keygate/gatewayauth@")
		if !strings.Contains(block, "@"+testVersion) {
			t.Fatalf("the README's go get names another version than %s:\n%s", testVersion, block)
		}
		proxy := fileProxy(t, map[string]string{"github.com/keygate/keygate/gatewayauth": filepath.Join(root(t), "gatewayauth")})
		dir := newService(t, t.TempDir())
		env := goEnv(t, "GOPROXY=file://"+proxy, "GONOSUMDB=github.com/keygate")
		run(t, dir, env, block)
		checkService(t, dir, env)
	})
}

// fileProxy writes a GOPROXY folder (file://) publishing each module (path → folder of
// the working tree) at testVersion, as a release would, and returns it.
func fileProxy(t *testing.T, mods map[string]string) string {
	t.Helper()
	proxy := t.TempDir()
	for path, dir := range mods {
		at := filepath.Join(proxy, path, "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			t.Fatal(err)
		}
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(at, "list"), testVersion+"\n")
		write(t, filepath.Join(at, testVersion+".info"), `{"Version":"`+testVersion+`","Time":"2026-01-01T00:00:00Z"}`)
		write(t, filepath.Join(at, testVersion+".mod"), string(gomod))
		writeModuleZip(t, filepath.Join(at, testVersion+".zip"), path+"@"+testVersion, dir)
	}
	return proxy
}

// writeModuleZip zips the files git would commit under dir (tracked or not ignored),
// leaving out folders holding a module of their own, as `go mod` publishes a module.
func writeModuleZip(t *testing.T, file, prefix, dir string) {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", dir, err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	for _, name := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if nested(dir, name) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue // deleted in the working tree
		}
		w, err := zw.Create(prefix + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

// nested reports whether the file name, relative to dir, is in a subfolder that holds
// a go.mod of its own.
func nested(dir, name string) bool {
	for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(dir, d, "go.mod")); err == nil {
			return true
		}
	}
	return false
}

// readmeXcaddy returns the arguments of the README's xcaddy build command that holds
// word, its backslash-continued lines joined.
func readmeXcaddy(t *testing.T, word string) []string {
	t.Helper()
	line := strings.ReplaceAll(readmeBlock(t, "xcaddy build", word), "\\\n", " ")
	i := strings.Index(line, "xcaddy build")
	return strings.Fields(line[i+len("xcaddy build"):])
}

func TestTheREADMEAndXcaddyShBuildCaddyAlike(t *testing.T) {
	// xcaddy.sh runs the README's command for a checkout, with the checkout there.
	want := readmeXcaddy(t, "--replace")
	sh, err := os.ReadFile(filepath.Join(root(t), "xcaddy.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := regexp.MustCompile(`(?s)go tool xcaddy build (.*?)--output`).FindSubmatch(sh)
	if cmd == nil {
		t.Fatal("no `go tool xcaddy build … --output` in xcaddy.sh")
	}
	got := strings.Fields(strings.NewReplacer("\\\n", " ", `"`, "", "$CADDY_VERSION", "v2.11.9", "$VERSION", "$v", "$PWD", "$HOME/keygate").Replace(string(cmd[1])))
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("xcaddy.sh builds with\n\t%s\nthe README says\n\t%s", strings.Join(got, " "), strings.Join(want, " "))
	}
	block := readmeBlock(t, "xcaddy build", "--replace")
	if !strings.Contains(block, "|off") {
		t.Error("the README's checkout build does not end its GOPROXY in |off, as xcaddy.sh does")
	}
	// Its $v is the checkout's version, as xcaddy.sh's $VERSION is.
	if !strings.Contains(block, "v=$($HOME/keygate/scripts/version.sh)") {
		t.Errorf("the README's checkout build does not set $v from scripts/version.sh:\n%s", block)
	}
}

func TestTheREADMEBuildsCaddyFromAPublishedVersion(t *testing.T) {
	// The README's command for a published version, against a file proxy publishing
	// the working tree as testVersion: both modules, as a release tags them.
	args := readmeXcaddy(t, "caddymodule@"+testVersion)
	if !strings.Contains(strings.Join(args, " "), "@"+testVersion) {
		t.Fatalf("the README's xcaddy build names another version than %s: %v", testVersion, args)
	}
	proxy := fileProxy(t, map[string]string{
		"github.com/keygate/keygate":             root(t),
		"github.com/keygate/keygate/gatewayauth": filepath.Join(root(t), "gatewayauth"),
	})
	out := filepath.Join(t.TempDir(), "caddy")
	// A module cache of its own, so that the working tree published as testVersion is
	// never one cached by an earlier run; the usual cache serves as a proxy for Caddy
	// and the rest, then the usual proxies. '|' and a final 'off', as xcaddy.sh does.
	cache, _ := exec.Command("go", "env", "GOMODCACHE").Output()
	proxies := []string{"file://" + proxy, "file://" + filepath.Join(strings.TrimSpace(string(cache)), "cache", "download")}
	goproxy, _ := exec.Command("go", "env", "GOPROXY").Output()
	for _, p := range strings.FieldsFunc(strings.TrimSpace(string(goproxy)), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			proxies = append(proxies, p)
		}
	}
	cmd := exec.Command("go", append([]string{"tool", "xcaddy", "build"}, append(args, "--output", out)...)...)
	cmd.Dir = root(t)
	cmd.Env = goEnv(t, "GOPROXY="+strings.Join(proxies, "|")+"|off", "GONOSUMDB=github.com/keygate", "XCADDY_SKIP_CLEANUP=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xcaddy build %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	list, err := exec.Command(out, "list-modules").Output()
	if err != nil || !strings.Contains(string(list), "http.handlers.v1_gateway\n") {
		t.Errorf("the built Caddy lacks http.handlers.v1_gateway (%v)", err)
	}
}

// jwksServing serves the JWKS of files.
func jwksServing(t *testing.T, files ...string) string {
	b, err := gatewayauth.JWKS(files...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestGatewayauthAndGoJOSEAgree(t *testing.T) {
	// gatewayauth's JWS is its own: go-jose, a JOSE implementation of its own, must
	// verify the Signer's assertions with the published JWKS, and gatewayauth must
	// verify go-jose's, and refuse what go-jose signs with another algorithm.
	priv, file := gatewayauthtest.NewKey(t)
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", Role: "Editor"}

	signer, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	tok, _ := signer.Assertion(id.KeyID, id.OrgID, id.Role)
	b, _ := gatewayauth.JWKS(file)
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil || len(set.Keys) != 1 || !set.Keys[0].Valid() {
		t.Fatalf("go-jose reads the JWKS as %+v (%v)", set, err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil || parsed.Headers[0].KeyID != set.Keys[0].KeyID {
		t.Fatalf("go-jose parses the assertion: %v, kid %v", err, parsed)
	}
	var claims struct {
		jwt.Claims
		OrgID string `json:"org_id"`
		Role  string `json:"role"`
	}
	if err := parsed.Claims(set.Keys[0].Key, &claims); err != nil {
		t.Fatalf("go-jose refuses the Signer's signature: %v", err)
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: "keygate", AnyAudience: jwt.Audience{gatewayauth.DefaultAudience}, Time: time.Now()}, 0); err != nil ||
		claims.Subject != id.KeyID || claims.OrgID != id.OrgID || claims.Role != id.Role {
		t.Errorf("go-jose reads the claims %+v: %v", claims, err)
	}

	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: jwksServing(t, file)})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	sign := func(alg jose.SignatureAlgorithm, key any) string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key},
			(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", gatewayauth.KeyID(priv.Public().(ed25519.PublicKey))))
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		tok, err := jwt.Signed(s).Claims(jwt.Claims{Issuer: "keygate", Audience: jwt.Audience{gatewayauth.DefaultAudience}, Subject: id.KeyID,
			IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute))}).
			Claims(map[string]any{"org_id": id.OrgID, "role": id.Role}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if got, err := v.Verify(context.Background(), sign(jose.EdDSA, priv)); err != nil || got != id {
		t.Errorf("gatewayauth verifies go-jose's EdDSA assertion as %+v, %v", got, err)
	}
	if _, err := v.Verify(context.Background(), sign(jose.HS256, []byte(priv.Public().(ed25519.PublicKey)))); err == nil {
		t.Error("gatewayauth accepts go-jose's HS256 assertion keyed with the public key")
	}
}

// securityScript returns the shell verifier of docs/security.md.
func securityScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```sh\n(#!/bin/sh\n# verify-identity.sh.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("no ```sh block starting #!/bin/sh # verify-identity.sh in docs/security.md")
	}
	file := filepath.Join(t.TempDir(), "verify-identity.sh")
	if err := os.WriteFile(file, m[1], 0o755); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestTheShellVerifierOfTheSecurityDocWorks(t *testing.T) {
	for _, tool := range []string{"curl", "jq", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: the script of docs/security.md needs it (apt-get install %s)", tool, tool)
		}
	}
	script := securityScript(t)
	priv, file := gatewayauthtest.NewKey(t)
	jwks := jwksServing(t, file) + "/.well-known/jwks.json"
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", Role: "Viewer"}
	signer, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	good, _ := signer.Assertion(id.KeyID, id.OrgID, id.Role)
	verify := func(token string, args ...string) (string, error) {
		out, err := exec.Command(script, append([]string{token, jwks}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := verify(good); err != nil || out != id.OrgID+" "+id.KeyID+" "+id.Role+"\n" {
		t.Errorf("a good assertion: %q, %v; want its org, key and role", out, err)
	}
	if _, err := verify(good, "billing"); err == nil {
		t.Error("a good assertion passes for another audience")
	}
	for i := range gatewayauthtest.Forgeries(t, priv, id) {
		// Made afresh for each run of the script, which takes a while: a forgery
		// issued 10 s in the future must still be that when the script sees it.
		f := gatewayauthtest.Forgeries(t, priv, id)[i]
		if len(f.Header) != 1 || f.Header[0] == "" {
			continue // absent, empty or two headers: nothing for the script to check
		}
		if out, err := verify(f.Header[0]); err == nil {
			t.Errorf("%s: the script accepts it: %q", f.Name, out)
		}
	}
}
