// Package timingpair is a bench tool, used by make bench only
// (scripts/bench/timing.sh): it measures whether two requests that must look alike
// also take alike. It sends them in interleaved pairs, each pair in a random order,
// and compares their times: the medians, and the share of pairs in which each was the
// slower. make bench uses it on a refused restricted key against a revoked key, whose
// 401s are byte for byte the same (docs/security.md, Timing).
package timingpair

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
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
// over one keep-alive connection, and compares the times of A and B.
func Run(client *http.Client, a, b Request, warmup, pairs int) (Result, error) {
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
		t1, ans1, err := timed(client, first)
		if err != nil {
			return res, err
		}
		t2, ans2, err := timed(client, second)
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
