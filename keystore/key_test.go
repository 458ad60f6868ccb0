package keystore_test

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
)

const (
	goodID     = "AbCdEfGhIjKlMnOpQrStUv"
	goodSecret = "dGhpcyBpcyBhIDMyIGJ5dGUgc2VjcmV0IGZvciB0ZXN0" // 44 chars, canonical
)

func TestValidPrefix(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   bool
	}{
		{"mon", true},
		{"a", true},
		{"a0123456789abcde", true}, // 16 characters
		{"a0123456789abcdef", false},
		{"", false},
		{"Mon", false},
		{"0mon", false},
		{"mon_x", false},
		{"mon-x", false},
		{"mön", false},
	} {
		if got := keystore.ValidPrefix(tc.prefix); got != tc.want {
			t.Errorf("ValidPrefix(%q) = %v, want %v", tc.prefix, got, tc.want)
		}
		if _, err := keystore.NewFormat(tc.prefix); (err == nil) != tc.want {
			t.Errorf("NewFormat(%q) error = %v, want ok=%v", tc.prefix, err, tc.want)
		}
	}
}

func TestGeneratedKeysParseBack(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	seen := map[string]bool{}
	for range 200 {
		full, id, secret, err := f.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if want := "mon_live_" + id + "." + secret; full != want {
			t.Fatalf("full key %q, want %q", full, want)
		}
		if len(id) != keystore.KeyIDLen || len(secret) != keystore.SecretLen {
			t.Fatalf("key id %q (%d chars), secret %d chars", id, len(id), len(secret))
		}
		gotID, gotSecret, ok := f.Parse(full)
		if !ok || gotID != id || gotSecret != secret {
			t.Fatalf("Parse(%q) = %q, %q, %v", full, gotID, gotSecret, ok)
		}
		if seen[id] || seen[secret] {
			t.Fatalf("generated a repeated id or secret: %q", full)
		}
		seen[id], seen[secret] = true, true
	}
}

func TestParseRefusesEveryMalformedShape(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	good := "mon_live_" + goodID + "." + goodSecret
	if _, _, ok := f.Parse(good); !ok {
		t.Fatalf("the well-formed key %q does not parse", good)
	}
	for _, tc := range []struct {
		name, key string
	}{
		{"empty", ""},
		{"prefix only", "mon_live_"},
		{"other prefix", "abc_live_" + goodID + "." + goodSecret},
		{"upper-case prefix", "MON_live_" + goodID + "." + goodSecret},
		{"test instead of live", "mon_test_" + goodID + "." + goodSecret},
		{"LIVE upper-case", "mon_LIVE_" + goodID + "." + goodSecret},
		{"no prefix", goodID + "." + goodSecret},
		{"missing dot", "mon_live_" + goodID + goodSecret},
		{"two dots", "mon_live_" + goodID + "." + goodSecret + ".x"},
		{"dot inside secret", "mon_live_" + goodID + "." + goodSecret[:20] + "." + goodSecret[21:]},
		{"empty key id", "mon_live_." + goodSecret},
		{"key id too short", "mon_live_" + goodID[:15] + "." + goodSecret},
		{"key id too long", "mon_live_" + strings.Repeat("a", 65) + "." + goodSecret},
		{"key id with underscore", "mon_live_" + goodID[:10] + "_" + goodID[11:] + "." + goodSecret},
		{"key id with dash", "mon_live_" + goodID[:10] + "-" + goodID[11:] + "." + goodSecret},
		{"key id non-ascii", "mon_live_" + goodID[:10] + "é" + goodID[12:] + "." + goodSecret},
		{"empty secret", "mon_live_" + goodID + "."},
		{"secret too short", "mon_live_" + goodID + "." + goodSecret[:42]},
		{"secret too long", "mon_live_" + goodID + "." + strings.Repeat("A", 129)},
		{"secret with plus (std base64)", "mon_live_" + goodID + "." + goodSecret[:43] + "+"},
		{"secret with slash (std base64)", "mon_live_" + goodID + "." + "/" + goodSecret[1:]},
		{"secret padded", "mon_live_" + goodID + "." + goodSecret[:43] + "="},
		{"secret impossible length", "mon_live_" + goodID + "." + goodSecret + "A"},            // 45 chars: 45 % 4 == 1
		{"secret non-canonical last char", "mon_live_" + goodID + "." + goodSecret[:42] + "B"}, // 43 chars, low bits set
		{"leading space", " mon_live_" + goodID + "." + goodSecret},
		{"trailing space", "mon_live_" + goodID + "." + goodSecret + " "},
		{"trailing newline", "mon_live_" + goodID + "." + goodSecret + "\n"},
		{"embedded NUL", "mon_live_" + goodID + "." + goodSecret[:20] + "\x00" + goodSecret[21:]},
		{"bearer word included", "Bearer mon_live_" + goodID + "." + goodSecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if id, secret, ok := f.Parse(tc.key); ok {
				t.Errorf("Parse(%q) = %q, %q, ok; want refused", tc.key, id, secret)
			}
		})
	}
}

func TestParseAcceptsTheWholeDocumentedRange(t *testing.T) {
	f := keystoretest.Format(t, "x")
	for _, key := range []string{
		"x_live_" + strings.Repeat("Z", 16) + "." + goodSecret,
		"x_live_" + strings.Repeat("9", 64) + "." + goodSecret,
		"x_live_" + goodID + "." + strings.Repeat("-", 42) + "A", // 43 chars: 'A' has no low bits
		"x_live_" + goodID + "." + strings.Repeat("_", 128),
	} {
		if _, _, ok := f.Parse(key); !ok {
			t.Errorf("Parse(%q) refused a well-formed key", key)
		}
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	key := "mon_live_" + goodID + "." + goodSecret
	allocs := testing.AllocsPerRun(1000, func() {
		if _, _, ok := f.Parse(key); !ok {
			t.Fatal("refused")
		}
	})
	if allocs != 0 {
		t.Errorf("Parse allocates %v times per call, want 0", allocs)
	}
}

func TestMaskShowsNoSecret(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	if got, want := f.Mask(goodID), "mon_live_"+goodID+".********"; got != want {
		t.Errorf("Mask = %q, want %q", got, want)
	}
}

func TestHashSecretIsSHA256OfTheSecretText(t *testing.T) {
	if got, want := keystore.HashSecret(goodSecret), sha256.Sum256([]byte(goodSecret)); got != want {
		t.Errorf("HashSecret = %x, want %x", got, want)
	}
}

func ExampleFormat_Parse() {
	f, err := keystore.NewFormat("mon")
	if err != nil {
		panic(err)
	}
	keyID, _, ok := f.Parse("mon_live_AbCdEfGhIjKlMnOpQrStUv.dGhpcyBpcyBhIDMyIGJ5dGUgc2VjcmV0IGZvciB0ZXN0")
	fmt.Println(keyID, ok)
	_, _, ok = f.Parse("mon_live_AbCdEfGhIjKlMnOpQrStUv")
	fmt.Println(ok)
	fmt.Println(f.Mask(keyID))
	// Output:
	// AbCdEfGhIjKlMnOpQrStUv true
	// false
	// mon_live_AbCdEfGhIjKlMnOpQrStUv.********
}

func FuzzParse(f *testing.F) {
	format := keystoretest.Format(f, "mon")
	f.Add("mon_live_" + goodID + "." + goodSecret)
	f.Add("mon_live_.")
	f.Add("mon_live_" + goodID + ".." + goodSecret)
	f.Fuzz(func(t *testing.T, key string) {
		id, secret, ok := format.Parse(key)
		if !ok {
			return
		}
		// Whatever parses is exactly prefix_live_id.secret with valid parts.
		if key != "mon_live_"+id+"."+secret || !keystore.ValidKeyID(id) || strings.ContainsAny(secret, ".+/= ") {
			t.Fatalf("Parse(%q) = %q, %q", key, id, secret)
		}
	})
}
