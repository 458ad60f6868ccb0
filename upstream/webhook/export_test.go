package webhook

import "net"

// Control is the dialer's check of an address, for the tests of package webhook_test.
var Control = control

// SetResolver makes CheckURL resolve with r until the returned func restores the
// resolver it replaced.
func SetResolver(r *net.Resolver) (restore func()) {
	old := resolver
	resolver = r
	return func() { resolver = old }
}
