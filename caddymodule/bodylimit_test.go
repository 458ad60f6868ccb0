package caddymodule

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// TestABodyOverMaxRequestBodyIs413EveryTime sends bodies over max_request_body, with
// a Content-Length and chunked, ten times each: every answer is the 413
// request_too_large, none is a 502, and none is logged as the upstream's failure. A
// body of exactly the limit still goes through.
func TestABodyOverMaxRequestBodyIs413EveryTime(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: up.addr(), accessLog: true})
	send := func(body io.Reader, length int64) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, gw.base+"/v1/upload", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length // -1: chunked
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		return testenv.Exchange(t, gw.client, req)
	}
	big := strings.Repeat("a", 30<<20)
	before := up.requests()
	for i := 0; i < 10; i++ {
		res, body := send(strings.NewReader(big), int64(len(big)))
		wantJSONError(t, res, body, http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
		if res.Header.Get("RateLimit") == "" {
			t.Errorf("a 413 without RateLimit fields:\n%s", headerDump(res, body))
		}
	}
	if n := up.requests() - before; n != 0 {
		t.Errorf("the upstream saw %d requests whose Content-Length was over the limit, want none", n)
	}
	chunked := strings.Repeat("a", 3<<20)
	for i := 0; i < 10; i++ {
		res, body := send(io.MultiReader(strings.NewReader(chunked)), -1)
		wantJSONError(t, res, body, http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
	}
	for _, length := range []int64{1 << 20, -1} {
		res, body := send(strings.NewReader(strings.Repeat("a", 1<<20)), length)
		if res.StatusCode != http.StatusOK || string(body) != `{"read":1048576}` {
			t.Errorf("a body of exactly max_request_body (length %d): %d %s", length, res.StatusCode, body)
		}
	}
	log := gw.logText(t)
	if strings.Contains(log, "upstream failed") || strings.Contains(log, `"status":502`) || strings.Contains(log, `"level":"error"`) {
		t.Errorf("an oversized body was logged as a failure:\n%s", log)
	}
}

// TestMaxRequestBodyIsTheOption: a smaller max_request_body applies.
func TestMaxRequestBodyIsTheOption(t *testing.T) {
	d := newDB(t)
	key, _ := d.key(d.org("pro"), keystore.RoleEditor)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, map[string]any{"max_request_body": 10}), upstream: up.addr()})
	res, body := gw.do(t, http.MethodPost, "/v1/upload", "Bearer "+key, nil, `{"name":"eleven"}`)
	wantJSONError(t, res, body, http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
	res, body = gw.do(t, http.MethodPost, "/v1/upload", "Bearer "+key, nil, `{"a":"b"}`)
	if res.StatusCode != http.StatusOK || string(body) != `{"read":9}` {
		t.Errorf("a body under the limit: %d %s", res.StatusCode, body)
	}
}

// TestADeclaredEmptyBodyIsNotRead: a request whose length is 0 and that has no
// Transfer-Encoding goes on with an empty body and without Expect, and its body is not
// read (the reader here fails if it is). A chunked one is read.
func TestADeclaredEmptyBodyIsNotRead(t *testing.T) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/monitors", nil)
	r.Body = io.NopCloser(iotest.ErrReader(errors.New("read")))
	r.ContentLength = 0
	r.Header.Set("Expect", "100-continue")
	if err := readBody(rec, r, 1<<20); err != nil {
		t.Fatalf("readBody of a declared empty body: %v", err)
	}
	if r.Body != http.NoBody || r.ContentLength != 0 || r.Header.Get("Expect") != "" {
		t.Errorf("after readBody: body %T, length %d, Expect %q; want http.NoBody, 0, none", r.Body, r.ContentLength, r.Header.Get("Expect"))
	}

	r = httptest.NewRequest(http.MethodPost, "/v1/monitors", nil)
	r.Body = io.NopCloser(iotest.ErrReader(errors.New("read")))
	r.ContentLength, r.TransferEncoding = 0, []string{"chunked"}
	if err := readBody(rec, r, 1<<20); err == nil || err.Error() != "read" {
		t.Errorf("readBody of a chunked body: %v, want the reader's error", err)
	}
}
