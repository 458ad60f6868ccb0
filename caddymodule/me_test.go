package caddymodule

import (
	"encoding/json"
	"testing"
)

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "ctl\x01\n", "<&>", "é日本", "bad\xffutf8"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("appendJSONString(%q) = %s: %v", s, b, err)
			continue
		}
		want := s
		if s == "bad\xffutf8" {
			want = "bad\ufffdutf8"
		}
		if back != want {
			t.Errorf("appendJSONString(%q) decodes to %q", s, back)
		}
	}
}
