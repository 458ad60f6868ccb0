package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/keygate/keygate/upstream/apperr"
)

// FuzzDecodeMonitorWrite checks that no body makes the decoder panic. Every refusal is
// an EINVALID error naming a field. Whatever it accepts as config or assertions is
// JSON of the right kind, which jsonb can store.
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
			var e *apperr.Error
			if !errors.As(err, &e) || e.Code != apperr.EINVALID || !strings.Contains(e.Message, ": ") {
				t.Fatalf("refusal %v is not EINVALID naming a field", err)
			}
			return
		}
		for _, v := range []struct {
			raw  []byte
			kind byte
		}{{w.Config, '{'}, {w.Assertions, '['}} {
			if v.raw == nil {
				continue
			}
			if !json.Valid(v.raw) || v.raw[0] != v.kind || !utf8.Valid(v.raw) || bytes.Contains(v.raw, []byte(`\u0000`)) {
				t.Fatalf("accepted %q", v.raw)
			}
		}
		if w.Name != nil && (*w.Name == "" || !utf8.ValidString(*w.Name)) {
			t.Fatalf("accepted name %q", *w.Name)
		}
	})
}
