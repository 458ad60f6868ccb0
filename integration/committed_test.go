package integration

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// within polls cond every 20 ms for up to d, and reports whether it held. It is for
// an event that may rightly never come.
func within(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// brokenChunks sends head with a chunked body whose first chunk is valid, waits until
// changed reports the upstream's change or 2 s pass, then sends a malformed chunk and
// reads the answer. It returns the answer and whether the change was seen before it.
func brokenChunks(t *testing.T, addr, head string, changed func() bool) (Resp, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, head+"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"); err != nil {
		t.Fatal(err)
	}
	seen := within(2*time.Second, changed)
	io.WriteString(conn, "zz\r\nbroken\r\n0\r\n\r\n") // the gateway may have hung up already
	conn.(*net.TCPConn).CloseWrite()
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return Resp{Status: res.StatusCode, Header: res.Header, Body: b}, seen
}

// TestACommittedChangeIsNeverReportedAsFailed sends, through bin/caddy running
// Caddyfile.example, a DELETE of a monitor and a rotation of a webhook secret, each
// with a chunked body that breaks after its first chunk, on routes that read no body.
// Either the change is made and the client gets the upstream's 2xx, or the client
// gets its JSON error and nothing changed: never an error for a change made.
func TestACommittedChangeIsNeverReportedAsFailed(t *testing.T) {
	s := newStackWith(t, stackOptions{upstreamArgs: []string{"--webhook-allow-http", "--webhook-allow-private"}})
	o, owner := s.newOwner("pro")
	_, key := owner.createKey(o.ID, "k", "Admin", nil)
	addr, example := s.startExample()
	host := "Host: " + addr + "\r\n"

	t.Run("DELETE /v1/monitors/{id}", func(t *testing.T) {
		api := s.api(key, 0)
		for range 3 {
			r := api.do("POST", "/v1/monitors", newMonitor("doomed"))
			if r.Status != http.StatusCreated {
				t.Fatalf("creating a monitor: %d %s", r.Status, r.Body)
			}
			id := r.JSON(t)["id"].(string)
			gone := func() bool { return api.do("GET", "/v1/monitors/"+id, nil).Status == http.StatusNotFound }
			res, seen := brokenChunks(t, addr, "DELETE /v1/monitors/"+id+" HTTP/1.1\r\n"+host+"Authorization: Bearer "+key+"\r\n", gone)
			judge(t, res, seen, gone(), http.StatusNoContent)
		}
	})

	t.Run("POST /orgs/{orgId}/webhooks/{id}/rotate-secret", func(t *testing.T) {
		r := owner.do("POST", "/orgs/"+o.ID+"/webhooks", map[string]string{"url": "http://127.0.0.1:9/hook"}, nil)
		if r.Status != http.StatusCreated {
			t.Fatalf("creating a webhook: %d %s", r.Status, r.Body)
		}
		id := r.JSON(t)["id"].(string)
		cookie := ""
		base, _ := url.Parse(s.URL(0))
		for _, c := range owner.http.Jar.Cookies(base) {
			if c.Name == "session" {
				cookie = "Cookie: session=" + c.Value + "\r\n"
			}
		}
		masked := func() string {
			return owner.do("GET", "/orgs/"+o.ID+"/webhooks/"+id, nil, nil).JSON(t)["masked_secret"].(string)
		}
		for range 3 {
			before := masked()
			rotated := func() bool { return masked() != before }
			res, seen := brokenChunks(t, addr, "POST /orgs/"+o.ID+"/webhooks/"+id+"/rotate-secret HTTP/1.1\r\n"+host+cookie, rotated)
			judge(t, res, seen, rotated(), http.StatusOK)
			if res.Status == http.StatusOK {
				var v struct{ Secret string }
				if err := json.Unmarshal(res.Body, &v); err != nil || !strings.HasPrefix(v.Secret, "whsec_") {
					t.Errorf("the rotation's answer %s lacks the new secret", res.Body)
				}
			}
		}
	})

	if logs := example.logs(); strings.Contains(logs, "upstream failed") || strings.Contains(logs, `"status":502`) {
		t.Errorf("the example's log has an upstream failure:\n%s", tail(logs, 4000))
	}
}

// judge checks one answer: the upstream's want with the change made, or the client's
// 400 bad_request with nothing changed.
func judge(t *testing.T, res Resp, seenBefore, changed bool, want int) {
	t.Helper()
	switch {
	case res.Status == want && changed:
	case res.Status == http.StatusBadRequest && !changed && !seenBefore:
		wantError(t, res, http.StatusBadRequest, `{"error":"bad_request"}`)
	default:
		t.Errorf("answered %d %s with the change made: %v (seen before the body broke: %v); want %d with it, or 400 without",
			res.Status, res.Body, changed, seenBefore, want)
	}
}
