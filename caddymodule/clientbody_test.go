package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/keygate/keygate/internal/testenv"
)

// TestABrokenBodyOnAnyRouteOfTheExampleIsTheClients sends malformed chunked bodies and
// bodies over 1 MiB to the routes of Caddyfile.example, the dashboard's included:
// each answers the client's JSON error, never a 502 or an empty body, and nothing is
// logged as the upstream's failure.
func TestABrokenBodyOnAnyRouteOfTheExampleIsTheClients(t *testing.T) {
	gw, _, key := startExample(t)
	addr := strings.TrimPrefix(gw.base, "http://")
	for _, tc := range []struct {
		name, path, auth string
	}{
		{"the dashboard's login", "/auth/login", ""},
		{"/v1", "/v1/upload", "Authorization: Bearer " + key + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := "POST " + tc.path + " HTTP/1.1\r\nHost: gw\r\n" + tc.auth + "Content-Type: application/json\r\n"
			for i := 0; i < 5; i++ {
				res, body := rawExchange(t, addr, head+"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nzz\r\n1}\r\n0\r\n\r\n")
				wantJSONError(t, res, body, http.StatusBadRequest, `{"error":"bad_request"}`)
			}
			send := func(body io.Reader, length int64) (*http.Response, []byte) {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, gw.base+tc.path, body)
				if err != nil {
					t.Fatal(err)
				}
				req.ContentLength = length // -1: chunked
				if tc.auth != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				return testenv.Exchange(t, gw.client, req)
			}
			for i := 0; i < 5; i++ {
				res, body := send(strings.NewReader(strings.Repeat("a", 30<<20)), 30<<20)
				wantJSONError(t, res, body, http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
				res, body = send(io.MultiReader(strings.NewReader(strings.Repeat("a", 3<<20))), -1)
				wantJSONError(t, res, body, http.StatusRequestEntityTooLarge, `{"error":"request_too_large"}`)
			}
			// A whole body still goes through.
			res, body := send(strings.NewReader(`{"a":1}`), 7)
			if res.StatusCode != http.StatusOK || string(body) != `{"read":7}` {
				t.Errorf("a whole body: %d %s", res.StatusCode, body)
			}
		})
	}
	log := gw.logText(t)
	for _, bad := range []string{"upstream failed", `"status":502`, `"level":"error"`} {
		if strings.Contains(log, bad) {
			t.Errorf("a client's broken body was logged with %s:\n%s", bad, log)
		}
	}
	if !strings.Contains(log, "the client's request body could not be read") {
		t.Errorf("no line says the client's body could not be read:\n%s", log)
	}
}

func TestKeygateBodyCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  int64
		err   string
	}{
		{"keygate_body", 0, ""},
		{"keygate_body 2MiB", 2 << 20, ""},
		{"keygate_body 0", 0, `max_size must be a positive size such as 1MiB, not "0"`},
		{"keygate_body lots", 0, `max_size must be a positive size such as 1MiB, not "lots"`},
		{"keygate_body 1MiB 2MiB", 0, "wrong argument count"},
		{"keygate_body {\n\tmax_size 1MiB\n}", 0, "keygate_body takes no block"},
	} {
		t.Run(tc.input, func(t *testing.T) {
			var c ClientBody
			err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || c.MaxSize != tc.want {
				t.Errorf("max_size %d, %v; want %d", c.MaxSize, err, tc.want)
			}
		})
	}
}
