package caddymodule

import (
	"bytes"
	"testing"
)

func TestJSONFilterSniffsUntypedBodies(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`  {"config":1,"a":2}`, `  {"a":2}`},
		{`[{"org_id":1}]`, `[{}]`},
		{`hello {"config":1}`, `hello {"config":1}`},
		{`"config"`, `"config"`},
		{`<html>{"config":1}</html>`, `<html>{"config":1}</html>`},
	} {
		var out bytes.Buffer
		f := newJSONFilter(&out, testFields, true)
		for i := range len(tc.in) {
			if _, err := f.Write([]byte(tc.in[i : i+1])); err != nil {
				t.Fatalf("%q: %v", tc.in, err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatalf("%q: Close: %v", tc.in, err)
		}
		putJSONFilter(f)
		if out.String() != tc.want {
			t.Errorf("sniffing %q = %q, want %q", tc.in, out.String(), tc.want)
		}
	}
}
