// Package promtest is a test helper for Prometheus's text exposition format. Tests of
// the gateway and the upstream use it to scrape /metrics and read the samples.
package promtest

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// Samples returns every sample of text by its series, as the format prints it: for
// example `keygate_requests_total{outcome="me"}`. It skips comment and blank lines. A
// sample line without a number is an error.
func Samples(text string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample line %q", line)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// Scrape GETs url, a /metrics endpoint, and returns its Samples. It fails the test
// unless url answers 200 with samples that parse.
func Scrape(tb testing.TB, url string) map[string]float64 {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	res, body := testenv.Exchange(tb, scrapeClient, req)
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %d %s", url, res.StatusCode, body)
	}
	out, err := Samples(string(body))
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	return out
}

var scrapeClient = &http.Client{Timeout: 30 * time.Second}
