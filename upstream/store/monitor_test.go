package store

import "testing"

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
		err := CheckTarget(tc.typ, tc.target)
		if (err == nil) != tc.ok {
			t.Errorf("CheckTarget(%q, %q) = %v, want ok %v", tc.typ, tc.target, err, tc.ok)
		}
	}
}
