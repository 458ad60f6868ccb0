// Package timingpair is a test and bench tool, used by make bench
// (scripts/bench/timing.sh) and the integration suite: it measures whether two
// requests that must look alike also take alike. It sends them in interleaved pairs,
// each pair in a random order, and compares their times: the medians, and the share
// of pairs in which each was the slower. make bench uses it on a refused restricted
// key against a revoked key, whose 401s are byte for byte the same (docs/security.md,
// Timing).
package timingpair

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// Request is one of the two requests of a pair: a GET of URL with Authorization
// Bearer Key.
type Request struct {
	Name string
	URL  string
	Key  string
}

// Result is what Run measured.
type Result struct {
	Pairs          int
	MedianA        time.Duration
	MedianB        time.Duration
	ASlower        float64 // share of pairs in which A took longer
	BSlower        float64 // share of pairs in which B took longer
	Status         int     // the status both answered
	IdenticalBytes bool    // whether every answer of both had one status and body
}

// Run sends warmup pairs it does not count, then pairs pairs, one request at a time
// over one keep-alive connection, and compares the times of A and B: each from its
// request to the end of its answer.
func Run(client *http.Client, a, b Request, warmup, pairs int) (Result, error) {
	return run(func(r Request) (time.Duration, answer, error) { return timed(client, r) }, a, b, warmup, pairs)
}

// RunClosing is Run with each request on a connection of its own, asking the server
// to close it (Connection: close), and timed from its request to the server's close
// of the connection: what a client can time of a refusal, all the work the server
// does before it lets the connection go included.
func RunClosing(a, b Request, warmup, pairs int) (Result, error) {
	return run(timedToClose, a, b, warmup, pairs)
}

// run is Run and RunClosing, with timed the one's way of timing a request.
func run(timed func(Request) (time.Duration, answer, error), a, b Request, warmup, pairs int) (Result, error) {
	var ref answer
	var res Result
	res.IdenticalBytes = true
	timesA := make([]time.Duration, 0, pairs)
	timesB := make([]time.Duration, 0, pairs)
	slowerA, slowerB := 0, 0
	for i := 0; i < warmup+pairs; i++ {
		first, second := a, b
		aFirst := rand.IntN(2) == 0
		if !aFirst {
			first, second = b, a
		}
		t1, ans1, err := timed(first)
		if err != nil {
			return res, err
		}
		t2, ans2, err := timed(second)
		if err != nil {
			return res, err
		}
		if i == 0 {
			ref = ans1
		}
		if !ans1.equal(ref) || !ans2.equal(ref) {
			res.IdenticalBytes = false
		}
		if i < warmup {
			continue
		}
		ta, tb := t1, t2
		if !aFirst {
			ta, tb = t2, t1
		}
		timesA, timesB = append(timesA, ta), append(timesB, tb)
		switch {
		case ta > tb:
			slowerA++
		case tb > ta:
			slowerB++
		}
	}
	res.Pairs = pairs
	res.MedianA, res.MedianB = median(timesA), median(timesB)
	res.ASlower = float64(slowerA) / float64(pairs)
	res.BSlower = float64(slowerB) / float64(pairs)
	res.Status = ref.status
	return res, nil
}

// answer is what a request got: its status and body.
type answer struct {
	status int
	body   []byte
}

func (x answer) equal(y answer) bool { return x.status == y.status && bytes.Equal(x.body, y.body) }

// timed sends r and reads the whole answer, and returns how long that took.
func timed(client *http.Client, r Request) (time.Duration, answer, error) {
	req, err := http.NewRequest(http.MethodGet, r.URL, nil)
	if err != nil {
		return 0, answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+r.Key)
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: reading the answer: %w", r.Name, err)
	}
	return took, answer{res.StatusCode, body}, nil
}

// timedToClose sends r on a new connection with Connection: close, reads the answer
// and then until the server closes the connection, and returns how long that took
// from the request's first byte.
func timedToClose(r Request) (time.Duration, answer, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return 0, answer{}, err
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, answer{}, err
	}
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + r.Key + "\r\nConnection: close\r\n\r\n"
	start := time.Now()
	if _, err := io.WriteString(conn, req); err != nil {
		return 0, answer{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	raw, err := io.ReadAll(conn) // to the server's close
	took := time.Since(start)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: reading to the close: %w", r.Name, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, answer{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	return took, answer{res.StatusCode, body}, nil
}

// median returns the median of d, which it sorts.
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	if len(d)%2 == 1 {
		return d[len(d)/2]
	}
	return (d[len(d)/2-1] + d[len(d)/2]) / 2
}
