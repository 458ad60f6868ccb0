//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pgfailover

import (
	"errors"
	"net"
	"syscall"
)

// peek looks at conn's socket without reading from it or waiting: a non-blocking
// recv with MSG_PEEK of one byte. It goes through Control, not Read: pgconn may have
// a goroutine of its own blocked in the connection's Read, which holds the read lock
// until bytes come, and an idle connection gets none. Peeking beside that read
// leaves its bytes to it.
func peek(conn net.Conn) peekResult {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return peekIdle
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peekClosed
	}
	res := peekIdle
	var b [1]byte
	err = raw.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		case err != nil, n == 0:
			res = peekClosed
		default:
			res = peekData
		}
	})
	if err != nil {
		return peekClosed // the connection is closed on this side
	}
	return res
}
