package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCheckTarget(t *testing.T) {
	for _, tc := range []struct {
		typ, target string
		ok          bool
	}{
		{"http", "https://example.com", true},
		{"http", "HTTP://EXAMPLE.COM/", true},
		{"http", "http://192.0.2.1:8080/x?y#z", true},
		{"http", "http://[::1]/", true},
		{"http", "http://[fe80::1%25eth0]/", false},
		{"http", "http://user:pass@example.com/", true},
		{"http", "mailto:a@example.com", false},
		{"http", "//example.com/", false},
		{"http", "http://example.com:0/", false},
		{"http", "http://example.com:/", true},
		{"http", "http://.example.com/", false},
		{"tcp", "example.com:1", true},
		{"tcp", "example.com:65535", true},
		{"tcp", "example.com:+80", false},
		{"tcp", "example.com:080", true},
		{"tcp", ":80", false},
		{"tcp", "[2001:db8::1]:80", true},
		{"dns", "localhost", true},
		{"dns", "a-b.example", true},
		{"dns", "a..example", false},
		{"dns", "example.123", false},
		{"dns", "ex ample.com", false},
		{"dns", "bücher.example", false},
		{"icmp", "192.0.2.1", true},
		{"icmp", "::1", true},
		{"icmp", "256.1.1.1", false},
		{"icmp", "example.com.", true},
	} {
		err := checkTarget(tc.typ, tc.target)
		if (err == nil) != tc.ok {
			t.Errorf("checkTarget(%q, %q) = %v, want ok %v", tc.typ, tc.target, err, tc.ok)
		}
	}
}

// FuzzDecodeMonitorWrite checks that no body makes the decoder panic, that every
// refusal is an EINVALID error naming a field, and that whatever it accepts as config
// or assertions is JSON of the right kind that jsonb can store.
func FuzzDecodeMonitorWrite(f *testing.F) {
	for _, seed := range []string{
		`{"name":"n","type":"http","target":"https://example.com","interval_seconds":60,"locations":["us-east"],"paused":false,"config":{"a":[1,2.5,"x",null,true]},"assertions":[{}]}`,
		`{"config":{"\u0000":1}}`, `{"assertions":["\ud800"]}`, `{"config":{"a":1e400}}`, `{"name":null}`,
		`{"locations":["us-east","us-east"]}`, `{} {}`, `[`, `{"id":1,"created_at":{},"updated_at":[]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w, err := decodeMonitorWrite(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != EINVALID || !strings.Contains(e.Message, ": ") {
				t.Fatalf("refusal %v is not EINVALID naming a field", err)
			}
			return
		}
		for _, v := range []struct {
			raw  []byte
			kind byte
		}{{w.config, '{'}, {w.assertions, '['}} {
			if v.raw == nil {
				continue
			}
			if !json.Valid(v.raw) || v.raw[0] != v.kind || !utf8.Valid(v.raw) || bytes.Contains(v.raw, []byte(`\u0000`)) {
				t.Fatalf("accepted %q", v.raw)
			}
		}
		if w.name != nil && (*w.name == "" || !utf8.ValidString(*w.name)) {
			t.Fatalf("accepted name %q", *w.name)
		}
	})
}
