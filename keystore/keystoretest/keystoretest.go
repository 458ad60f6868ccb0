// Package keystoretest is a test helper for keystore. The tests of keystore and of
// the programs built on it share it.
package keystoretest

import (
	"testing"

	"github.com/keygate/keygate/keystore"
)

// Format returns the key format of prefix. It fails the test when prefix is not a
// valid one.
func Format(tb testing.TB, prefix string) keystore.Format {
	tb.Helper()
	f, err := keystore.NewFormat(prefix)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}
