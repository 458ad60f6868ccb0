package fieldstrip

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
		f := NewFilter(&out, testFields, true)
		for i := range len(tc.in) {
			if _, err := f.Write([]byte(tc.in[i : i+1])); err != nil {
				t.Fatalf("%q: %v", tc.in, err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatalf("%q: Close: %v", tc.in, err)
		}
		f.Release()
		if out.String() != tc.want {
			t.Errorf("sniffing %q = %q, want %q", tc.in, out.String(), tc.want)
		}
	}
}

func TestIsJSONType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"application/json; charset=utf-8": true,
		"Application/JSON":                true,
		"application/problem+json":        true,
		"application/x-ndjson":            true,
		"application/vnd.api+json":        true,
		"text/json":                       true,
		"text/plain":                      false,
		"text/html; charset=json":         false,
		"":                                false,
		"application/octet-stream":        false,
	} {
		if got := IsJSONType(ct); got != want {
			t.Errorf("IsJSONType(%q) = %v, want %v", ct, got, want)
		}
	}
}
