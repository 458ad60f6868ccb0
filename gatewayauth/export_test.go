package gatewayauth

import (
	"testing"
	"time"
)

// SetMaxAgeBounds bounds the max-age of a JWKS to lo..hi for the rest of a test, so
// that a test of the refresh need not wait a minute.
func SetMaxAgeBounds(t testing.TB, lo, hi time.Duration) {
	oldLo, oldHi := minMaxAge, maxMaxAge
	minMaxAge, maxMaxAge = lo, hi
	t.Cleanup(func() { minMaxAge, maxMaxAge = oldLo, oldHi })
}

// MaxAge is maxAge, for its table test.
var MaxAge = maxAge
