// Command otlpsink is a benchmark helper: an OpenTelemetry collector that takes
// OTLP/HTTP traces and counts their spans, for `make bench`'s tracing pair.
//
//	otlpsink -listen-file FILE
//
// It writes the address it listens on to FILE, then takes spans until killed, when it
// prints how many it took.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/keygate/keygate/internal/testkit/otlptest"
)

func main() {
	listenFile := flag.String("listen-file", "", "file to write the listening address to")
	flag.Parse()
	if *listenFile == "" {
		flag.Usage()
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	r := &otlptest.Receiver{Discard: true}
	stop := r.Serve(nil, ln)
	if err := os.WriteFile(*listenFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stop()
	fmt.Printf("%d spans\n", r.Count())
}
