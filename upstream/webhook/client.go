package webhook

import (
	"net"
	"net/http"
	"time"
)

// Client returns an HTTP client whose connections follow p: unless p.AllowPrivate, an
// address that is not Public is refused before the connection is made, whatever name
// led to it (docs/webhooks.md, URLs and addresses). It uses no proxy, which would
// connect where the check cannot see, and follows no redirect: a redirect is the
// receiver's answer, not a new destination. timeout bounds the dial, the TLS handshake
// and the wait for the answer's header. The webhook dispatcher and the usage export
// both send through one.
func (p Policy) Client(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !p.AllowPrivate {
		dialer.Control = control
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
