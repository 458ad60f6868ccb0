package fieldstrip

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testNames are the names v1_gateway strips by default.
var testNames = []string{"config", "assertions", "config_version", "paused_reason", "org_id", "deleted_at"}

var testFields = NewFields(testNames)

// filterAll runs in through a filter in chunks of chunk bytes (all at once for 0).
func filterAll(t testing.TB, in []byte, fields *Fields, chunk int) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	f := NewFilter(&out, fields, false)
	defer f.Release()
	if chunk <= 0 {
		chunk = len(in) + 1
	}
	for len(in) > 0 {
		n := min(chunk, len(in))
		if _, err := f.Write(in[:n]); err != nil {
			return out.Bytes(), err
		}
		in = in[n:]
	}
	return out.Bytes(), f.Close()
}

func TestJSONFilterRemovesFieldsAtAnyDepth(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"flat object", `{"id":1,"config":{"a":1},"name":"x"}`, `{"id":1,"name":"x"}`},
		{"first member", `{"config":1,"id":2}`, `{"id":2}`},
		{"last member", `{"id":2,"config":1}`, `{"id":2}`},
		{"only member", `{"config":1}`, `{}`},
		{"every member", `{"config":1,"assertions":[],"org_id":"o"}`, `{}`},
		{"consecutive members", `{"a":1,"config":1,"assertions":2,"b":3}`, `{"a":1,"b":3}`},
		{"objects in an array in an object",
			`{"data":[{"id":"m1","config":{"x":[1,{"config":2}]},"assertions":[{"a":1}],"name":"n"},{"org_id":"o","id":"m2"}],"next_cursor":null}`,
			`{"data":[{"id":"m1","name":"n"},{"id":"m2"}],"next_cursor":null}`},
		{"top-level array", `[{"config":1},{"deleted_at":null,"paused":false}]`, `[{},{"paused":false}]`},
		{"deeply nested", `{"a":{"b":{"c":[[{"d":{"config":true,"e":1}}]]}}}`, `{"a":{"b":{"c":[[{"d":{"e":1}}]]}}}`},
		{"name as a value is kept", `{"name":"config","tags":["config","org_id"]}`, `{"name":"config","tags":["config","org_id"]}`},
		{"escaped name", `{"\u0063onfig":1,"id":2}`, `{"id":2}`},
		{"escaped name, escaped slash", `{"org\u005fid":"o","a\/b":1}`, `{"a\/b":1}`},
		{"name differing in case is removed, as a Go client would read it", `{"Config":1,"ORG_ID":2,"Deleted_At":3,"a":{"CONFIG":4}}`, `{"a":{}}`},
		{"name differing by a Unicode fold is removed", `{"aſſertions":1,"id":2}`, `{"id":2}`},
		{"a leading UTF-8 BOM is kept", "\ufeff{\"config\":1}", "\ufeff{}"},
		{"prefix of a name is kept", `{"conf":1,"configs":2}`, `{"conf":1,"configs":2}`},
		{"string values with escapes and braces", `{"a":"}\"{,","config":"\"}]","b":"\\"}`, `{"a":"}\"{,","b":"\\"}`},
		{"whitespace kept around kept members",
			"{\n  \"id\": 1,\n  \"config\": {\n    \"x\": 1\n  },\n  \"name\": \"n\"\n}",
			"{\n  \"id\": 1,\n  \"name\": \"n\"\n}"},
		{"whitespace before a removed first member", "{ \"config\" : 1 , \"a\" : 2 }", "{ \"a\" : 2 }"},
		{"whitespace around a removed last member", "{ \"a\" : 2 , \"config\" : 1 }", "{ \"a\" : 2 }"},
		{"numbers and literals", `{"a":-1.5e+10,"config":0,"b":[true,false,null,0,12,3.25,1E3]}`, `{"a":-1.5e+10,"b":[true,false,null,0,12,3.25,1E3]}`},
		{"scalar document", `"config"`, `"config"`},
		{"empty body", ``, ``},
		{"several documents (NDJSON)", "{\"config\":1,\"a\":1}\n{\"b\":2,\"org_id\":3}\n", "{\"a\":1}\n{\"b\":2}\n"},
		{"long names are streamed", `{"` + strings.Repeat("k", 500) + `":1,"config":2}`, `{"` + strings.Repeat("k", 500) + `":1}`},
		{"non-ASCII names", `{"é":1,"config":2,"日本":3}`, `{"é":1,"日本":3}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{0, 1, 2, 3, 7} {
				got, err := filterAll(t, []byte(tc.in), testFields, chunk)
				if err != nil {
					t.Fatalf("chunk %d: error %v", chunk, err)
				}
				if string(got) != tc.want {
					t.Fatalf("chunk %d:\n got %s\nwant %s", chunk, got, tc.want)
				}
			}
		})
	}
}

func TestJSONFilterRefusesInvalidJSON(t *testing.T) {
	for _, in := range []string{
		`{"a":1`, `{"a":1,}`, `[1,]`, `{"a" 1}`, `{a:1}`, `{"a":tru}`, `{"a":01}`, `{"a":1.}`,
		`{"a":-}`, `{"a":1e}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\n\"}", `]`, `{"a":1]`,
		`[1}`, `{"config":[1,2}`, `{"config":{"a":1]}`, `"abc`, `nul`, `{} x`, "\xef\xbb{}", "\xef", " \ufeff{}", "{}\ufeff",
		`{"config"}`, `{"config":}`, `{,"a":1}`, `{"a":1,,"b":2}`,
	} {
		if out, err := filterAll(t, []byte(in), testFields, 0); err == nil {
			t.Errorf("filter(%q) = %q, nil; want an error", in, out)
		}
		if _, err := filterAll(t, []byte(in), testFields, 1); err == nil {
			t.Errorf("filter(%q) byte by byte: no error", in)
		}
	}
}

func TestJSONFilterDepthLimitIsEncodingJSONs(t *testing.T) {
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, err := filterAll(t, []byte(ok), testFields, 4096); err != nil {
		t.Errorf("depth %d: %v", MaxDepth, err)
	}
	if json.Unmarshal([]byte(ok), new(any)) != nil {
		t.Errorf("encoding/json refuses depth %d", MaxDepth)
	}
	deep := "[" + ok + "]"
	if _, err := filterAll(t, []byte(deep), testFields, 4096); !errors.Is(err, ErrDepth) {
		t.Errorf("depth %d: %v, want ErrDepth", MaxDepth+1, err)
	}
}

// monitorStream writes a JSON list of n monitors carrying every stripped field.
type monitorStream struct {
	n, i int
	buf  []byte
	pos  int
	done bool
}

func (s *monitorStream) Read(p []byte) (int, error) {
	for s.pos == len(s.buf) {
		if s.done {
			return 0, io.EOF
		}
		s.buf, s.pos = s.buf[:0], 0
		switch {
		case s.i == s.n:
			s.buf = append(s.buf, `],"next_cursor":null}`...)
			s.done = true
			continue
		case s.i == 0:
			s.buf = append(s.buf, `{"data":[`...)
		default:
			s.buf = append(s.buf, ',')
		}
		s.i++
		s.buf = append(s.buf, `{"id":"`...)
		s.buf = strconv.AppendInt(s.buf, int64(s.i), 10)
		s.buf = append(s.buf, `","name":"monitor","type":"http","target":"https://example.com/health","interval_seconds":60,"locations":["us-east","eu-west"],"paused":false,"config":{"headers":{"X":"y"},"method":"GET","body":"{\"config\":1}"},"assertions":[{"type":"status","value":200}],"config_version":3,"paused_reason":null,"org_id":"2c1b9d6e-0d0b-4a8e-9f5e-3c3c3c3c3c3c","deleted_at":null,"created_at":"2024-01-01T00:00:00Z","updated_at":"2024-01-01T00:00:00Z"}`...)
	}
	n := copy(p, s.buf[s.pos:])
	s.pos += n
	return n, nil
}

// countingWriter counts bytes and looks for stripped names across chunk boundaries.
type countingWriter struct {
	n     int64
	tail  []byte
	found bool
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	window := append(c.tail, p[:min(len(p), 32)]...)
	if bytes.Contains(window, []byte(`"config"`)) || bytes.Contains(p, []byte(`"config"`)) ||
		bytes.Contains(p, []byte(`"org_id"`)) || bytes.Contains(p, []byte(`"assertions"`)) {
		c.found = true
	}
	c.tail = append(c.tail[:0], p[max(0, len(p)-32):]...)
	return len(p), nil
}

func TestJSONFilterStreamsFiftyMegabytesInBoundedMemory(t *testing.T) {
	src := &monitorStream{n: 120_000} // about 54 MB
	out := &countingWriter{tail: make([]byte, 0, 64)}
	f := NewFilter(out, testFields, false)
	defer f.Release()
	buf := make([]byte, 32<<10) // the reverse proxy's copy buffer size

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	in, err := io.CopyBuffer(f, src, buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)

	if in < 50<<20 {
		t.Fatalf("streamed only %d bytes", in)
	}
	if out.found {
		t.Error("a stripped field came through")
	}
	if out.n >= in*6/10 || out.n == 0 {
		t.Errorf("wrote %d of %d bytes; the stripped fields are about half of each monitor", out.n, in)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("filtering %d MB allocated %d bytes; want it bounded by the chunk size", in>>20, alloc)
	}
	t.Logf("%d bytes in, %d out, %d bytes allocated", in, out.n, after.TotalAlloc-before.TotalAlloc)
}

func BenchmarkJSONFilter(b *testing.B) {
	var doc bytes.Buffer
	if _, err := io.Copy(&doc, &monitorStream{n: 2000}); err != nil {
		b.Fatal(err)
	}
	in := doc.Bytes()
	f := NewFilter(io.Discard, testFields, false)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		*f = Filter{dst: io.Discard, fields: testFields, out: f.out[:0], stack: f.stack[:0], key: f.key[:0], pendingSpace: f.pendingSpace[:0]}
		for p := in; len(p) > 0; {
			n := min(len(p), 32<<10)
			if _, err := f.Write(p[:n]); err != nil {
				b.Fatal(err)
			}
			p = p[n:]
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// decodeStream decodes a stream of JSON values as encoding/json's Decoder does.
func decodeStream(in []byte) ([]any, error) {
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	var vals []any
	for {
		var v any
		err := d.Decode(&v)
		if err == io.EOF {
			return vals, nil
		}
		if err != nil {
			return nil, err
		}
		vals = append(vals, v)
	}
}

// stripReference deletes the members named in names, matched as encoding/json
// matches names to fields (bytes.EqualFold).
func stripReference(v any, names []string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, k) }) {
				delete(v, k)
				continue
			}
			v[k] = stripReference(x, names)
		}
	case []any:
		for i, x := range v {
			v[i] = stripReference(x, names)
		}
	}
	return v
}

// FuzzJSONFilter checks the filter against encoding/json. It accepts exactly the
// streams encoding/json's Decoder accepts. Its output decodes to the input with the
// stripped names deleted, whatever the chunking.
func FuzzJSONFilter(f *testing.F) {
	for _, seed := range []string{
		`{"id":1,"config":{"a":1},"name":"x"}`,
		`{"data":[{"id":"m1","config":{"x":[1,{"config":2}]},"assertions":[{"a":1}]},{"org_id":"o"}],"next_cursor":null}`,
		`[{"\u0063onfig":1},{"deleted_at":null}]`,
		"{\"a\":1}\n{\"org_id\":2}",
		`{"a":"\ud83d\ude00","config":"\"}"}`,
		`1"a"[]{}`,
		`{"a":-0.5e-3,"b":[true,false,null]}`,
		`{"config":{"config":{"config":1}},"x":{"assertions":[{"y":1}]}}`,
		"\xff\xfe",
		`{"` + "\xff" + `config":1}`,
	} {
		f.Add([]byte(seed), uint8(0))
	}
	names := append(slices.Clone(testNames), "x\xffy", "é")
	fields := NewFields(names)
	bom := []byte("\ufeff")
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		// A leading BOM is the filter's to accept; encoding/json does not.
		want, decErr := decodeStream(bytes.TrimPrefix(in, bom))
		out, err := filterAll(t, in, fields, int(chunk))
		if (decErr == nil) != (err == nil) {
			t.Fatalf("filter(%q) error %v, encoding/json error %v", in, err, decErr)
		}
		if err != nil {
			return
		}
		got, err := decodeStream(bytes.TrimPrefix(out, bom))
		if err != nil {
			t.Fatalf("filter(%q) = %q, which does not decode: %v", in, out, err)
		}
		for i := range want {
			want[i] = stripReference(want[i], names)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("filter(%q) = %q\n decodes to %#v\n want %#v", in, out, got, want)
		}
	})
}
