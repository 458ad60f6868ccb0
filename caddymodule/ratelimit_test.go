package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/keygate/keygate/limiter"
)

func TestRateLimitHeaders(t *testing.T) {
	hdr := http.Header{}
	setRateLimit(hdr, rateCount{limiter.Result{Allowed: true, Limit: 600, Remaining: 17, ResetAfter: 42}, true})
	if got := hdr.Get("RateLimit-Policy"); got != `"default";q=600;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := hdr.Get("RateLimit"); got != `"default";r=17;t=42` {
		t.Errorf("RateLimit %q", got)
	}
	rec := httptest.NewRecorder()
	writeRateLimited(rec, rateCount{limiter.Result{Limit: 600, ResetAfter: 9}, true})
	if rec.Code != 429 || rec.Body.String() != `{"error":"rate_limited","retryAfter":9}` || rec.Header().Get("Retry-After") != "9" {
		t.Errorf("429 = %d %q %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestRateLimitHeadersWithoutACountRemoveAnyUpstreamSet(t *testing.T) {
	hdr := http.Header{"Ratelimit": {`"default";r=999;t=1`}, "Ratelimit-Policy": {`"default";q=999;w=60`}, "X-Other": {"kept"}}
	setRateLimit(hdr, rateCount{})
	if len(hdr) != 1 || hdr.Get("X-Other") != "kept" {
		t.Errorf("without a count: %q; want only X-Other", hdr)
	}
	setRateLimit(hdr, rateCount{limiter.Result{Allowed: true, Limit: 3, Remaining: -1, ResetAfter: 5}, true})
	if hdr.Get("Ratelimit") != `"default";r=0;t=5` || hdr.Get("Ratelimit-Policy") != `"default";q=3;w=60` {
		t.Errorf("with a count: %q", hdr)
	}
}
