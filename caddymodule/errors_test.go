package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
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
		{413, `{"error":"request_too_large"}`}, // the upstream's own name
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

func TestWriteUnauthenticated(t *testing.T) {
	rec := httptest.NewRecorder()
	writeUnauthenticated(rec)
	want := http.Header{
		"Content-Type":           {"application/json"},
		"Content-Length":         {"35"},
		"Cache-Control":          {"no-store"},
		"X-Content-Type-Options": {"nosniff"},
		"Www-Authenticate":       {"Bearer"},
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
