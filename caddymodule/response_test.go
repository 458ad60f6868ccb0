package caddymodule

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
)

func TestJSONResponsesLoseTheStrippedFieldsAtAnyDepth(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)

	res, body := f.gw.get(t, "/v1/monitors", key)
	want := `{"data":[` + monitorFiltered + `,` + monitorFiltered + `],"next_cursor":null}`
	if res.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("GET /v1/monitors = %d\n%s\nwant\n%s", res.StatusCode, body, want)
	}
	// The upstream's Content-Length is gone; net/http may set the filtered one for a
	// body that fits its buffer.
	if res.ContentLength != -1 && res.ContentLength != int64(len(body)) {
		t.Errorf("Content-Length %d, body %d bytes", res.ContentLength, len(body))
	}
	if etag := res.Header.Get("Etag"); etag != `W/"v1-list"` {
		t.Errorf("ETag %q, want the upstream's made weak", etag)
	}
	checkRateLimitHeaders(t, res, 600, 599)

	res, body = f.gw.get(t, "/v1/monitors/m1", key)
	if res.StatusCode != http.StatusOK || string(body) != monitorFiltered {
		t.Errorf("GET /v1/monitors/m1 = %d %s", res.StatusCode, body)
	}
	// The weak ETag revalidates.
	res, body = f.gw.do(t, http.MethodGet, "/v1/monitors/m1", "Bearer "+key, http.Header{"If-None-Match": {`W/"m1-v2"`}}, "")
	if res.StatusCode != http.StatusNotModified || len(body) != 0 || res.Header.Get("Etag") != `W/"m1-v2"` {
		t.Errorf("revalidation = %d %q %s", res.StatusCode, res.Header, body)
	}
	// HEAD carries no length of the unfiltered body.
	res, _ = f.gw.do(t, http.MethodHead, "/v1/monitors", "Bearer "+key, nil, "")
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Length") != "" {
		t.Errorf("HEAD = %d, Content-Length %q", res.StatusCode, res.Header.Get("Content-Length"))
	}
	// JSON error bodies are filtered too, and kept otherwise.
	res, body = f.gw.get(t, "/v1/json-error", key)
	if res.StatusCode != http.StatusConflict || string(body) != `{"error":"conflict"}` {
		t.Errorf("JSON error = %d %s", res.StatusCode, body)
	}
}

func TestCompressedJSONFromTheUpstreamIsDecodedAndFiltered(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	for _, coding := range []string{"gzip", "deflate"} {
		res, body := f.gw.get(t, "/v1/compressed/"+coding, key)
		if res.StatusCode != http.StatusOK || string(body) != monitorFiltered || res.Header.Get("Content-Encoding") != "" {
			t.Errorf("%s: %d %q %s", coding, res.StatusCode, res.Header, body)
		}
	}
	// A coding the gateway cannot decode is never passed on unfiltered.
	res, body := f.gw.get(t, "/v1/compressed/br", key)
	wantJSONError(t, res, body, http.StatusBadGateway, `{"error":"bad_gateway"}`)
	if res.Header.Get("Content-Encoding") != "" {
		t.Errorf("Content-Encoding %q on the gateway's own body", res.Header.Get("Content-Encoding"))
	}
}

func TestNonJSONBodiesPassUnchanged(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	res, body := f.gw.get(t, "/v1/text", key)
	if res.StatusCode != http.StatusOK || string(body) != `{"config":"not json, ok"`[:24] || res.ContentLength != 24 {
		t.Errorf("text/plain = %d (length %d) %s", res.StatusCode, res.ContentLength, body)
	}
	// No Content-Type, but JSON: filtered all the same.
	res, body = f.gw.get(t, "/v1/untyped", key)
	if res.StatusCode != http.StatusOK || string(body) != monitorFiltered {
		t.Errorf("untyped = %d %s", res.StatusCode, body)
	}
}

func TestUpstreamErrorsAreJSON(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	for i, tc := range []struct {
		path   string
		status int
		body   string
	}{
		{"/v1/text-error", 500, `{"error":"internal_server_error"}`},
		{"/v1/no-such-route", 404, `{"error":"not_found"}`}, // Go's text/plain 404
	} {
		res, body := f.gw.get(t, tc.path, key)
		wantJSONError(t, res, body, tc.status, tc.body)
		checkRateLimitHeaders(t, res, 600, 599-i)
		if strings.Contains(string(body), "stack trace") {
			t.Errorf("%s: the upstream's body came through", tc.path)
		}
	}
}

func TestUpstreamFailuresAnswerJSON(t *testing.T) {
	db := newDB(t)
	org := db.org("pro")
	key, _ := db.key(org, keystore.RoleEditor)

	t.Run("upstream down", func(t *testing.T) {
		gw := startGateway(t, gatewayConfig{handler: gatewayOptions(db.url, nil), upstream: freeAddr(t)})
		res, body := gw.get(t, "/v1/monitors", key)
		wantJSONError(t, res, body, http.StatusBadGateway, `{"error":"bad_gateway"}`)
		if res.Header.Get("Ratelimit") == "" {
			t.Error("no RateLimit header on the 502 of a limited key")
		}
	})
	t.Run("upstream too slow", func(t *testing.T) {
		up := newUpstream(t)
		gw := startGateway(t, gatewayConfig{handler: gatewayOptions(db.url, nil), upstream: up.addr(), proxyTimeout: "300ms"})
		start := time.Now()
		res, body := gw.get(t, "/v1/slow", key)
		wantJSONError(t, res, body, http.StatusGatewayTimeout, `{"error":"gateway_timeout"}`)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("answered after %v", d)
		}
	})
}

func TestABodyTheClientBreaksIsTheClientsFailure(t *testing.T) {
	// An authenticated write whose body the client breaks is answered as the client's
	// failure, in JSON, and logged as the client's. It is never a 502 bad_gateway with an
	// "upstream failed" error line. Nor is it held against the upstream: with passive
	// health checks that take it out after one failure, it still serves.
	db := newDB(t)
	key, _ := db.key(db.org("pro"), keystore.RoleEditor)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler: gatewayOptions(db.url, nil), upstream: up.addr(),
		maxBody: 1024, passiveHealth: true, accessLog: true,
	})
	head := "POST /v1/upload HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + key + "\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name    string
		request string
		status  int
		body    string
	}{
		{
			"malformed chunking",
			head + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nzz\r\n1}\r\n0\r\n\r\n",
			http.StatusBadRequest, `{"error":"bad_request"}`,
		},
		{
			"a hang-up mid-upload",
			head + "Content-Length: 100\r\n\r\n{\"name\":",
			statusClientClosed, `{"error":"client_closed_request"}`,
		},
		{
			"chunks past request_body's max_size",
			head + "Transfer-Encoding: chunked\r\n\r\n400\r\n" + strings.Repeat("a", 1024) + "\r\n400\r\n" + strings.Repeat("a", 1024) + "\r\n0\r\n\r\n",
			http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The client stops sending (a hang-up, seen from the server) but reads on.
			res, body := rawExchange(t, strings.TrimPrefix(gw.base, "http://"), tc.request)
			wantJSONError(t, res, body, tc.status, tc.body)
		})
	}
	// A body that arrives whole still goes through.
	if res, body := gw.do(t, "POST", "/v1/upload", "Bearer "+key, nil, `{"name":"m"}`); res.StatusCode != http.StatusOK || string(body) != `{"read":12}` {
		t.Errorf("a whole body: %d %s", res.StatusCode, body)
	}
	log := gw.logText(t)
	if strings.Contains(log, "upstream failed") || strings.Contains(log, `"status":502`) {
		t.Errorf("a client's broken body was logged as the upstream's failure:\n%s", log)
	}
	if !strings.Contains(log, "the client's request body could not be read") {
		t.Errorf("no line says the client's body could not be read:\n%s", log)
	}
}

// rawExchange writes request to addr as it is, and closes the connection's write
// side: the client sends nothing more. Then it reads the answer.
func rawExchange(t *testing.T, addr, request string) (*http.Response, []byte) {
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
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return res, body
}

func TestInvalidJSONFromTheUpstreamIsCutShort(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	for _, path := range []string{"/v1/invalid-json", "/v1/truncated-json", "/v1/compressed/gzip-corrupt"} {
		req, _ := http.NewRequest(http.MethodGet, f.gw.base+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := f.gw.client.Do(req)
		if err != nil {
			continue // cut short before the header was even sent
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil {
			t.Errorf("%s: the body ended cleanly: %s", path, body)
		}
		if strings.Contains(string(body), "config") || strings.Contains(string(body), "secret") {
			t.Errorf("%s: %s", path, body)
		}
	}
}

func TestLargeResponsesAreStreamed(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	req, _ := http.NewRequest(http.MethodGet, f.gw.base+"/v1/stream", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := f.gw.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	// The upstream holds the end of the body back until we have read the start. A
	// gateway that buffered the whole response would deadlock here.
	br := bufio.NewReader(res.Body)
	start := make([]byte, 64<<10)
	read := make(chan error, 1)
	go func() { _, err := io.ReadFull(br, start); read <- err }()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no body before the upstream finished: the response is buffered")
	}
	close(f.up.release)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Data []map[string]any `json:"data"`
	}
	all := append(start, rest...)
	if err := json.Unmarshal(all, &doc); err != nil {
		t.Fatalf("%v", err)
	}
	if len(doc.Data) != 2001 {
		t.Errorf("%d monitors, want 2001", len(doc.Data))
	}
	for _, m := range doc.Data {
		for _, name := range defaultStripFields {
			if _, ok := m[name]; ok {
				t.Fatalf("a monitor carries %s", name)
			}
		}
	}
}

func TestUpstreamCannotSetRateLimitHeaders(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	res, _ := f.gw.get(t, "/v1/ratelimit-spoof", key)
	checkRateLimitHeaders(t, res, 600, 599)
}

func TestJSONIsFilteredWhateverItsLabel(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.pro, keystore.RoleEditor)
	for _, tc := range []struct{ path, want string }{
		{"text", monitorFiltered},
		{"octet-stream", monitorFiltered},
		{"untyped-bom", "\xef\xbb\xbf \n" + monitorFiltered},
		{"two-types", monitorFiltered},
		{"two-types-reversed", monitorFiltered},
		{"upper-case", monitorFiltered}, // Config, ORG_ID, aſſertions: what a Go client would decode
		{"not-json", `{"config": this is not JSON}`},
		{"not-json-bom", "\xef\xbb\xbfplain text"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, body := f.gw.get(t, "/v1/mislabelled/"+tc.path, key)
			if res.StatusCode != http.StatusOK || string(body) != tc.want {
				t.Errorf("%d %q, want 200 %q", res.StatusCode, body, tc.want)
			}
		})
	}
}
