// Package latencyproxy is a test helper: a TCP proxy that makes a real PostgreSQL or
// Redis slow or hung. The fault tests use it, and so does `make bench`'s fault run
// (through cmd/latencyproxy).
//
// A slow proxy holds every reply back by a delay. A hung proxy forwards nothing in
// either direction, as if the server were stopped with SIGSTOP. On resume, what was
// sent meanwhile is delivered, in order.
//
// Hanging the proxy rather than the server leaves alone every other test that shares
// the server. SIGSTOP would not.
package latencyproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections to one target address. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // time.Duration added to every reply chunk
	held   atomic.Int64 // chunks waiting for the proxy to stop hanging

	mu    sync.Mutex
	open  chan struct{} // closed while not hung; guarded by mu
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, open: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the host:port it forwards to.
func (p *Proxy) Target() string { return p.target }

// SetDelay holds every reply chunk back by d from when it arrived from the target.
// Chunks keep their order. Delays do not add up along a connection.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Hang stops forwarding in both directions until Resume.
func (p *Proxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

// Held reports how many chunks wait at the proxy now. While it hangs, that is every
// chunk sent through it since: a test waits on Held to know a request is in flight.
func (p *Proxy) Held() int { return int(p.held.Load()) }

// Resume forwards again whatever was held.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// gate returns a channel that is closed while the proxy is not hung.
func (p *Proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Drop closes every connection open now, as a restarting server does. New
// connections are forwarded as before.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Resume()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client)
		p.track(server)
		var pair sync.WaitGroup
		pair.Add(2)
		p.wg.Add(3)
		go func() { defer pair.Done(); p.pipe(server, client, false) }()
		go func() { defer pair.Done(); p.pipe(client, server, true) }()
		go func() {
			defer p.wg.Done()
			pair.Wait()
			client.Close()
			server.Close()
			p.mu.Lock()
			delete(p.conns, client)
			delete(p.conns, server)
			p.mu.Unlock()
		}()
	}
}

// chunk is what one read returned, and when it may go on.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through a queue, so that reading never waits for the delay
// or the hang. When src ends and the queue is through, it closes dst's write side.
func (p *Proxy) pipe(dst, src net.Conn, reply bool) {
	defer p.wg.Done()
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				at := time.Now()
				if reply {
					at = at.Add(time.Duration(p.delay.Load()))
				}
				q <- chunk{buf[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range q {
		if failed {
			continue
		}
		time.Sleep(time.Until(c.at))
		p.held.Add(1)
		<-p.gate()
		p.held.Add(-1)
		if _, err := dst.Write(c.b); err != nil {
			failed = true
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}
