//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgfailover

import "net"

// peek cannot look at a socket on this platform: a connection counts as live, and
// its next query finds out.
func peek(net.Conn) peekResult { return peekIdle }
