package webhook_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/webhook"
)

// docBlock returns the first fenced block of lang in docs/webhooks.md.
func docBlock(t *testing.T, lang string) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindStringSubmatch(string(doc))
	if m == nil {
		t.Fatalf("docs/webhooks.md has no %s block", lang)
	}
	return m[1]
}

// signed is a message signed by two secrets, as during a rotation.
func signed(t *testing.T) (secret, id, ts, sigs string, body []byte) {
	t.Helper()
	old, secret := webhook.NewSecret(), webhook.NewSecret()
	id, now := "msg_0123456789abcdef0123456789abcdef", time.Now().Unix()
	body = []byte(`{"type":"webhook.test","timestamp":"2026-11-27T17:00:00.000000Z","data":{"org_id":"x"}}`)
	sigs, err := webhook.Sign([]string{old, secret}, id, now, body)
	if err != nil {
		t.Fatal(err)
	}
	return secret, id, strconv.FormatInt(now, 10), sigs, body
}

func TestTheDocsShellVerifierAcceptsOnlyTheSignedBody(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed")
	}
	secret, id, ts, sigs, body := signed(t)
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"the body signed", body, "valid\n"},
		{"a body changed", append(append([]byte{}, body[:len(body)-1]...), ' ', '}'), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "body.json"), tc.body, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", docBlock(t, "sh"))
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "secret="+secret, "id="+id, "ts="+ts, "sigs="+sigs)
			out, err := cmd.Output()
			if string(out) != tc.want {
				t.Errorf("printed %q (%v), want %q", out, err, tc.want)
			}
		})
	}
}

func TestTheDocsGoVerifierAcceptsOnlyTheSignedBody(t *testing.T) {
	secret, id, ts, sigs, body := signed(t)
	dir := t.TempDir()
	prog := `package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

` + docBlock(t, "go") + `
func main() {
	body, _ := io.ReadAll(os.Stdin)
	h := http.Header{}
	h.Set("webhook-id", os.Args[2])
	h.Set("webhook-timestamp", os.Args[3])
	h.Set("webhook-signature", os.Args[4])
	fmt.Println(Verify(os.Args[1], h, body, time.Now()))
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body, ts, want string
	}{
		{"the body signed", string(body), ts, "true"},
		{"a body changed", strings.Replace(string(body), "x", "y", 1), ts, "false"},
		{"a stale timestamp", string(body), strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10), "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("go", "run", "main.go", secret, id, tc.ts, sigs)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GO111MODULE=off")
			cmd.Stdin = strings.NewReader(tc.body)
			out, err := cmd.CombinedOutput()
			if strings.TrimSpace(string(out)) != tc.want {
				t.Errorf("printed %q (%v), want %s", out, err, tc.want)
			}
		})
	}
}
