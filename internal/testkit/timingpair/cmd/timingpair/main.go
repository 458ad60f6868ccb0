// Command timingpair is a bench tool, used by make bench only
// (scripts/bench/timing.sh): it runs internal/testkit/timingpair against a gateway and
// prints the medians of two requests, the share of pairs in which each was the slower,
// and whether the targets hold.
//
//	timingpair -url http://127.0.0.1:8080/v1/me -a KEY -b KEY [-pairs 2000]
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/keygate/keygate/internal/testkit/timingpair"
)

func main() {
	url := flag.String("url", "", "the URL both requests GET")
	a := flag.String("a", "", "request A's bearer key")
	b := flag.String("b", "", "request B's bearer key")
	aName := flag.String("a-name", "A", "request A's name in the report")
	bName := flag.String("b-name", "B", "request B's name in the report")
	pairs := flag.Int("pairs", 2000, "pairs counted")
	warmup := flag.Int("warmup", 200, "pairs sent first and not counted")
	maxDiff := flag.Duration("max-diff", 5*time.Microsecond, "target: the medians differ by at most this")
	maxShare := flag.Float64("max-share", 0.55, "target: neither is the slower in more than this share of pairs")
	flag.Parse()
	if *url == "" || *a == "" || *b == "" {
		flag.Usage()
		os.Exit(2)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true},
	}
	res, err := timingpair.Run(client,
		timingpair.Request{Name: *aName, URL: *url, Key: *a},
		timingpair.Request{Name: *bName, URL: *url, Key: *b}, *warmup, *pairs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "timingpair:", err)
		os.Exit(1)
	}
	diff := res.MedianA - res.MedianB
	if diff < 0 {
		diff = -diff
	}
	met := diff <= *maxDiff && res.ASlower <= *maxShare && res.BSlower <= *maxShare && res.IdenticalBytes
	fmt.Printf("    %d interleaved pairs, each answered %d, every answer byte-identical: %t\n", res.Pairs, res.Status, res.IdenticalBytes)
	fmt.Printf("    %-36s median %8.1f µs, the slower in %5.1f %% of pairs\n", *aName, us(res.MedianA), 100*res.ASlower)
	fmt.Printf("    %-36s median %8.1f µs, the slower in %5.1f %% of pairs\n", *bName, us(res.MedianB), 100*res.BSlower)
	verdict := "met"
	if !met {
		verdict = "MISSED"
	}
	fmt.Printf("    medians %.1f µs apart (target ≤ %.0f µs), neither the slower in more than %.0f %% of pairs: %s\n",
		us(diff), us(*maxDiff), 100**maxShare, verdict)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
