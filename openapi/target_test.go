package openapi_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/keygate/keygate/upstream/store"
)

// targets returns the targets of TestTheTargetPatternsAcceptEveryTargetTheServerAccepts:
// every combination of a scheme, a host, a port and a rest, each part in the forms the
// server accepts for some type and in near misses.
func targets() []string {
	schemes := []string{"", "http://", "HTTPS://", "http://user:p@ss@", "ftp://", "http:", "http:///"}
	hosts := []string{
		"example.com", "Example.COM.", "a", "1a", "1-2", "a--b", "123", "192.0.2.1", "01.2.3.4",
		"256.1.1.1", "::1", "::ffff:192.0.2.1", "[::1]", "[2001:db8::1]", "[fe80::1%25eth0]",
		"fe80::1%eth0", "[example.com]", "exa_mple.com", "-a.com", "a-.com", "a..b", ".",
		"xn--bcher-kva.example", "bücher.example", "ex%61mple.com", "",
		strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 130) + "com",
	}
	ports := []string{"", ":", ":0", ":1", ":80", ":0080", ":65535", ":65536", ":+80", ":x"}
	rests := []string{"", "/", "/a?b#c", "?q", "#f", "/ü", "/a b", "/\u00a0", "/\u3000", "\t"}
	var all []string
	for _, scheme := range schemes {
		for _, host := range hosts {
			for _, port := range ports {
				for _, rest := range rests {
					all = append(all, scheme+host+port+rest)
				}
			}
		}
	}
	return all
}

// createBody returns a create body of typ and target.
func createBody(typ, target string) map[string]any {
	return map[string]any{"name": "m", "type": typ, "target": target}
}

// serverAccepts reports whether the upstream takes target for typ: its length and
// characters (decodeText in upstream/httpapi), then store.CheckTarget.
func serverAccepts(typ, target string) bool {
	if n := len([]rune(target)); n < 1 || n > store.MaxTargetLen {
		return false
	}
	if strings.IndexFunc(target, func(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }) >= 0 {
		return false
	}
	return store.CheckTarget(typ, target) == nil
}

func TestTheTargetPatternsAcceptEveryTargetTheServerAccepts(t *testing.T) {
	create := schema(t, "MonitorCreate")
	accepted := 0
	for _, target := range targets() {
		for _, typ := range store.MonitorTypes {
			if !serverAccepts(typ, target) {
				continue
			}
			accepted++
			if err := create.VisitJSON(createBody(typ, target), openapi3.EnableJSONSchema2020()); err != nil {
				t.Errorf("type %s, target %q: the server accepts it, the document does not: %v", typ, target, err)
			}
		}
	}
	if accepted < 1000 {
		t.Errorf("the server accepts only %d of the targets; the test checks too little", accepted)
	}
}

func TestCreateAndUpdateSayTheSameOfTargets(t *testing.T) {
	// The form of target for each type is written out in both bodies (where no
	// generator makes a type of it); the two copies must not drift apart.
	create, update := schema(t, "MonitorCreate"), schema(t, "MonitorUpdate")
	if !reflect.DeepEqual(create.DependentSchemas, update.DependentSchemas) || len(create.DependentSchemas) == 0 {
		t.Error("MonitorCreate and MonitorUpdate differ in their dependentSchemas")
	}
	for _, name := range []string{"name", "type", "target", "interval_seconds", "locations", "paused", "config", "assertions"} {
		c, u := create.Properties[name], update.Properties[name]
		if c == nil || u == nil || c.Ref != u.Ref {
			t.Errorf("MonitorCreate and MonitorUpdate differ in %s", name)
		}
	}
}

func TestTheDocumentRefusesTheTargetsTheServerRefusesForTheirForm(t *testing.T) {
	// What a pattern can say: each of these is refused by the server and the document.
	for _, tc := range []struct{ typ, target string }{
		{"http", "example.com"}, {"http", "ftp://example.com"}, {"http", "http:example.com"},
		{"http", "http://:80"}, {"http", "http://example.com:65536"}, {"http", "http://exa_mple.com"},
		{"http", "http://example.com/a b"}, {"http", "http://example.com/\u00a0"},
		{"tcp", "example.com"}, {"tcp", "https://example.com:443"}, {"tcp", "::1:80"}, {"tcp", "example.com:0"},
		{"dns", "1.2.3.4"}, {"dns", "example.com:53"}, {"dns", "https://example.com"}, {"dns", "a..b"},
		{"icmp", "https://example.com"}, {"icmp", "fe80::1%eth0"}, {"icmp", "[::1]"},
		{"http", ""}, {"http", "https://example.com/" + strings.Repeat("a", store.MaxTargetLen)},
		{"dns", "tab\there"},
	} {
		if serverAccepts(tc.typ, tc.target) {
			t.Fatalf("type %s, target %q: the server accepts it; the table is wrong", tc.typ, tc.target)
		}
		for _, name := range []string{"MonitorCreate", "MonitorUpdate"} {
			if err := schema(t, name).VisitJSON(createBody(tc.typ, tc.target), openapi3.EnableJSONSchema2020()); err == nil {
				t.Errorf("%s of type %s, target %q: the server refuses it, the document allows it", name, tc.typ, tc.target)
			}
		}
	}
}

// schema returns the schema name of v1.yaml.
func schema(t testing.TB, name string) *openapi3.Schema {
	t.Helper()
	ref := load(t, "v1.yaml").Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("v1.yaml has no schema %s", name)
	}
	return ref.Value
}
