package httpapi_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// stallingProxy forwards TCP connections to PostgreSQL until stall is called. From then
// on it forwards nothing in either direction and connects nothing new. It keeps every
// connection open: a hung database, as its clients see one.
type stallingProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

// newStallingProxy starts a proxy to the PostgreSQL of dbURL. It returns the proxy and
// dbURL rewritten to go through it. The proxy is closed when the test ends.
func newStallingProxy(t *testing.T, dbURL string) (*stallingProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{ln: ln, target: u.Host}
	t.Cleanup(p.close)
	go p.serve()
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *stallingProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if p.stalled.Load() {
			continue // accepted, never answered
		}
		go p.forward(c)
	}
}

func (p *stallingProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

func (p *stallingProxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.track(server)
	go p.copy(server, client)
	p.copy(client, server)
}

// copy forwards src to dst until the proxy stalls, then reads and drops.
func (p *stallingProxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.stalled.Load() {
			_, _ = io.Copy(io.Discard, src)
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *stallingProxy) stall() { p.stalled.Store(true) }

func (p *stallingProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func TestHungDatabaseAnswers503WithinTheDatabaseTimeout(t *testing.T) {
	const timeout = time.Second
	direct := upstreamtest.NewEnv(t)
	proxy, proxiedURL := newStallingProxy(t, direct.DBURL)
	serverPool := upstreamtest.NewPool(t, proxiedURL, timeout)
	t.Cleanup(proxy.close) // before the pool closes, so that it need not wait for the stalled connections
	e := upstreamtest.NewEnvWith(t, direct.Pool, serverPool, direct.DBURL)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org) // logs in through the proxy while it forwards
	email, password := e.User()

	proxy.stall()
	for _, tc := range []struct {
		name, method, path, body string
		c                        *upstreamtest.Client
	}{
		{"login", "POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}), e.Anon()},
		{"dashboard list", "GET", "/orgs/" + org + "/monitors", "", owner},
		{"dashboard create", "POST", "/orgs/" + org + "/monitors", `{"name":"n","type":"http","target":"https://example.com"}`, owner},
		{"gateway door", "GET", "/v1/monitors", "", e.Gateway(org, store.RoleAdmin)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every database wait of a request is bounded. A request waits at most an
			// acquire and a statement, 2 s here. 10 s is the margin of a loaded machine.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, e.TS.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			for k, vs := range tc.c.Header {
				req.Header[k] = vs
			}
			start := time.Now()
			res, err := e.TS.Client().Do(req)
			if err != nil {
				t.Fatalf("no answer while the database hangs: %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			elapsed := time.Since(start)
			upstreamtest.Want(t, upstreamtest.Response{Status: res.StatusCode, Header: res.Header, Body: string(b)}, 503, `{"error":"service_unavailable"}`)
			if elapsed > 2*timeout+10*time.Second {
				t.Errorf("answered after %v, want within about %v", elapsed, 2*timeout)
			}
			t.Logf("503 after %v", elapsed.Round(time.Millisecond))
		})
	}
}
