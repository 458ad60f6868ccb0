package upstreamtest

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// Client makes requests to the test server with fixed headers.
type Client struct {
	Env    *Env
	Header http.Header
}

// With returns a copy of c with more headers, in "Name", "value" pairs.
func (c *Client) With(kv ...string) *Client {
	h := c.Header.Clone()
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &Client{Env: c.Env, Header: h}
}

// Response is what a request answered.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Cookies returns the cookies the response sets.
func (r Response) Cookies() []*http.Cookie {
	return (&http.Response{Header: r.Header}).Cookies()
}

// Decode parses the body as JSON into v.
func (r Response) Decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.Body), v); err != nil {
		t.Fatalf("decoding %q: %v", r.Body, err)
	}
}

// Do makes a request; body "" sends none.
func (c *Client) Do(method, path, body string) Response {
	c.Env.T.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.Env.TS.URL+path, rd)
	if err != nil {
		c.Env.T.Fatal(err)
	}
	for k, vs := range c.Header {
		req.Header[k] = slices.Clone(vs)
	}
	res, b := testenv.Exchange(c.Env.T, c.Env.TS.Client(), req)
	return Response{Status: res.StatusCode, Header: res.Header, Body: string(b)}
}

// JSONBody marshals v.
func JSONBody(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Want checks a response's status and exact body, its final newline aside. A body must
// be declared as JSON.
func Want(t *testing.T, r Response, status int, body string) {
	t.Helper()
	got := strings.TrimSuffix(r.Body, "\n")
	if r.Status != status || got != body {
		t.Errorf("got %d %s\nwant %d %s", r.Status, got, status, body)
	}
	if body != "" && r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", r.Header.Get("Content-Type"))
	}
}

// WantStatus checks only a response's status.
func WantStatus(t *testing.T, r Response, status int) {
	t.Helper()
	if r.Status != status {
		t.Errorf("got %d %s, want %d", r.Status, r.Body, status)
	}
}
