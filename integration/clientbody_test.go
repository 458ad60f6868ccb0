package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// startExample runs bin/caddy with Caddyfile.example as it is, in front of this
// stack's upstream, and returns its address.
func (s *Stack) startExample() (addr string, p *proc) {
	s.t.Helper()
	_, identityKey := gatewayauthtest.NewKey(s.t)
	addr = fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	dir := s.t.TempDir()
	env := append(os.Environ(), "DATABASE_URL="+s.dbURL, "REDIS_URL="+s.redisURL,
		"GATEWAY_SECRET="+gatewaySecret, "IDENTITY_KEY="+identityKey,
		"GATEWAY_ADDR=http://"+addr, "UPSTREAM_ADDR="+s.upAddr,
		fmt.Sprintf("METRICS_PORT=%d", freePort(s.t)), "CADDY_ADMIN_SOCKET="+filepath.Join(dir, "admin.sock"),
		"HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	p = s.start("Caddyfile.example", env, filepath.Join(s.bin, "caddy"), "run",
		"--config", filepath.Join(root(s.t), "Caddyfile.example"), "--adapter", "caddyfile")
	s.t.Cleanup(p.stop)
	waitListening(s.t, addr, p)
	return addr, p
}

// TestBrokenAndOversizedBodiesThroughTheExample sends, through bin/caddy running
// Caddyfile.example in front of bin/upstream, malformed chunked bodies and bodies over
// 1 MiB, with a Content-Length and chunked, ten times each, to the dashboard's login
// and to /v1/monitors. Every answer is the client's JSON error (400 bad_request, 413
// request_too_large), never a 502 or an empty body, and the gateway logs none of them
// as an upstream failure.
func TestBrokenAndOversizedBodiesThroughTheExample(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("pro", "Admin")
	addr, example := s.startExample()
	client := &http.Client{Timeout: 30 * time.Second}
	for _, tc := range []struct{ name, path, auth string }{
		{"the dashboard's login", "/auth/login", ""},
		{"/v1/monitors", "/v1/monitors", "Bearer " + key},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := "POST " + tc.path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n"
			if tc.auth != "" {
				head += "Authorization: " + tc.auth + "\r\n"
			}
			send := func(body io.Reader, length int64) Resp {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, "http://"+addr+tc.path, body)
				if err != nil {
					t.Fatal(err)
				}
				req.ContentLength = length // -1: chunked
				req.Header.Set("Content-Type", "application/json")
				if tc.auth != "" {
					req.Header.Set("Authorization", tc.auth)
				}
				res, err := client.Do(req)
				if err != nil {
					t.Fatalf("POST %s: %v", tc.path, err)
				}
				defer res.Body.Close()
				b, err := io.ReadAll(res.Body)
				if err != nil {
					t.Fatal(err)
				}
				return Resp{Status: res.StatusCode, Header: res.Header, Body: b}
			}
			for i := 0; i < 10; i++ {
				wantError(t, rawPost(t, addr, head+"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nzz\r\n1}\r\n0\r\n\r\n"),
					http.StatusBadRequest, `{"error":"bad_request"}`)
				wantError(t, send(strings.NewReader(strings.Repeat(" ", 30<<20)), 30<<20),
					http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
				wantError(t, send(io.MultiReader(strings.NewReader(strings.Repeat(" ", 3<<20))), -1),
					http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
			}
		})
	}
	logs := example.logs()
	for _, bad := range []string{"upstream failed", `"status":502`, `"level":"error"`} {
		if strings.Contains(logs, bad) {
			t.Errorf("the example's log has %s:\n%s", bad, tail(logs, 4000))
		}
	}
}

// rawPost writes request to addr as it is, closes the connection's write side, and
// reads the answer.
func rawPost(t *testing.T, addr, request string) Resp {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Resp{Status: res.StatusCode, Header: res.Header, Body: b}
}
