// Package keystoretest holds the helpers that the tests of keystore and of the
// programs built on it share.
package keystoretest

import (
	"testing"

	"github.com/keygate/keygate/keystore"
)

// Format returns the key format of prefix, failing the test when prefix is not a
// valid one.
func Format(tb testing.TB, prefix string) keystore.Format {
	tb.Helper()
	f, err := keystore.NewFormat(prefix)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}
