package webhook

import (
	"net"
	"net/http"
	"time"
)

// MaxAnswerHeader bounds the header of a receiver's answer, in bytes. A larger one
// fails the attempt rather than be buffered.
const MaxAnswerHeader = 16 << 10

// Client returns an HTTP client whose connections follow p: unless p.AllowPrivate, an
// address that is not Public is refused before the connection is made, whatever name
// led to it (docs/webhooks.md, URLs and addresses). It uses no proxy, which would
// connect where the check cannot see, and follows no redirect: a redirect is the
// receiver's answer, not a new destination. timeout bounds the dial, the TLS handshake
// and the wait for the answer's header, which may be at most MaxAnswerHeader bytes.
// The webhook dispatcher and the usage export both send through one.
func (p Policy) Client(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !p.AllowPrivate {
		dialer.Control = control
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            dialer.DialContext,
			TLSHandshakeTimeout:    timeout,
			ResponseHeaderTimeout:  timeout,
			MaxResponseHeaderBytes: MaxAnswerHeader,
			MaxIdleConnsPerHost:    2,
			IdleConnTimeout:        90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
