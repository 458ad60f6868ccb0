// Command latencyproxy is a benchmark helper: it runs internal/testkit/latencyproxy for
// scripts, such as `make bench`'s fault run.
//
//	latencyproxy -target 127.0.0.1:6379 -listen-file FILE [-delay 0]
//
// It writes the address it listens on to FILE, then forwards until killed. SIGUSR1
// hangs it, as if the server were stopped. SIGUSR2 resumes it.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/keygate/keygate/internal/testkit/latencyproxy"
)

func main() {
	target := flag.String("target", "", "host:port to forward to")
	listenFile := flag.String("listen-file", "", "file to write the listening address to")
	delay := flag.Duration("delay", 0, "delay added to every reply")
	flag.Parse()
	if *target == "" || *listenFile == "" {
		flag.Usage()
		os.Exit(2)
	}
	p, err := latencyproxy.Start(*target)
	if err != nil {
		log.Fatal(err)
	}
	p.SetDelay(*delay)
	if err := os.WriteFile(*listenFile, []byte(p.Addr()+"\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	for s := range sig {
		switch s {
		case syscall.SIGUSR1:
			p.Hang()
		case syscall.SIGUSR2:
			p.Resume()
		default:
			p.Close()
			return
		}
	}
}
