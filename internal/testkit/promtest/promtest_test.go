package promtest_test

import (
	"testing"

	"github.com/keygate/keygate/internal/testkit/promtest"
)

func TestSamplesReadsSeriesAndSkipsComments(t *testing.T) {
	got, err := promtest.Samples("# HELP x y\n# TYPE x counter\nx{a=\"b c\"} 2\n\ny 1.5e+00\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[`x{a="b c"}`] != 2 || got["y"] != 1.5 {
		t.Fatalf("Samples = %v", got)
	}
	if _, err := promtest.Samples("x notanumber\n"); err == nil {
		t.Fatal("a sample without a number was accepted")
	}
}
