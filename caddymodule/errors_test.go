package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/keygate/keygate/limiter"
)

func TestStatusBody(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   string
	}{
		{502, `{"error":"bad_gateway"}`},
		{504, `{"error":"gateway_timeout"}`},
		{503, `{"error":"service_unavailable"}`},
		{500, `{"error":"internal_server_error"}`},
		{404, `{"error":"not_found"}`},
		{413, `{"error":"request_entity_too_large"}`},
		{418, `{"error":"i_m_a_teapot"}`},
		{499, `{"error":"client_closed_request"}`},
		{599, `{"error":"error"}`},
	} {
		got := statusBody(tc.status)
		if string(got) != tc.want {
			t.Errorf("statusBody(%d) = %s, want %s", tc.status, got, tc.want)
		}
		if !json.Valid(got) {
			t.Errorf("statusBody(%d) is not JSON", tc.status)
		}
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "ctl\x01\n", "<&>", "é日本", "bad\xffutf8"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("appendJSONString(%q) = %s: %v", s, b, err)
			continue
		}
		want := s
		if s == "bad\xffutf8" {
			want = "bad\ufffdutf8"
		}
		if back != want {
			t.Errorf("appendJSONString(%q) decodes to %q", s, back)
		}
	}
}

func TestIsJSONType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"application/json; charset=utf-8": true,
		"Application/JSON":                true,
		"application/problem+json":        true,
		"application/x-ndjson":            true,
		"application/vnd.api+json":        true,
		"text/json":                       true,
		"text/plain":                      false,
		"text/html; charset=json":         false,
		"":                                false,
		"application/octet-stream":        false,
	} {
		if got := isJSONType(ct); got != want {
			t.Errorf("isJSONType(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestRateLimitHeaders(t *testing.T) {
	hdr := http.Header{}
	setRateLimitHeaders(hdr, limiter.Result{Allowed: true, Limit: 600, Remaining: 17, ResetAfter: 42})
	if got := hdr.Get("RateLimit-Policy"); got != `"default";q=600;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := hdr.Get("RateLimit"); got != `"default";r=17;t=42` {
		t.Errorf("RateLimit %q", got)
	}
	rec := httptest.NewRecorder()
	writeRateLimited(rec, limiter.Result{Limit: 600, ResetAfter: 9})
	if rec.Code != 429 || rec.Body.String() != `{"error":"rate_limited","retryAfter":9}` || rec.Header().Get("Retry-After") != "9" {
		t.Errorf("429 = %d %q %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestWriteUnauthenticated(t *testing.T) {
	rec := httptest.NewRecorder()
	writeUnauthenticated(rec)
	want := http.Header{
		"Content-Type":     {"application/json"},
		"Content-Length":   {"35"},
		"Cache-Control":    {"no-store"},
		"Www-Authenticate": {"Bearer"},
	}
	if rec.Code != 401 || rec.Body.String() != `{"error":"api key unauthenticated"}` || len(rec.Header()) != len(want) {
		t.Fatalf("401 = %d %q %s", rec.Code, rec.Header(), rec.Body)
	}
	for k, v := range want {
		if rec.Header().Get(k) != v[0] {
			t.Errorf("%s %q, want %q", k, rec.Header().Get(k), v[0])
		}
	}
}
