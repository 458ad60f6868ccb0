package keystore_test

import (
	"hash/crc32"
	"math/big"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
)

// referenceChecksum is the checksum as docs/security.md defines it, written the obvious
// way. It is the IEEE CRC-32 of body in base62 (0-9A-Za-z) by math/big, left-padded
// with '0' to six characters.
func referenceChecksum(body string) string {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	n := new(big.Int).SetUint64(uint64(crc32.ChecksumIEEE([]byte(body))))
	var out []byte
	base, rem := big.NewInt(62), new(big.Int)
	for n.Sign() > 0 {
		n.QuoRem(n, base, rem)
		out = append([]byte{digits[rem.Int64()]}, out...)
	}
	s := string(out)
	return strings.Repeat("0", 6-len(s)) + s
}

func generate(t testing.TB, f keystore.Format) (full, id, secret string) {
	t.Helper()
	full, id, secret, err := f.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return full, id, secret
}

func TestGeneratedSecretsEndInTheirChecksum(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	for range 200 {
		full, _, secret := generate(t, f)
		body := full[:len(full)-keystore.ChecksumLen]
		if got, want := secret[43:], referenceChecksum(body); got != want {
			t.Fatalf("key %q ends in %q, want the checksum %q", full, got, want)
		}
		if got := keystore.Checksum(body); got != secret[43:] {
			t.Fatalf("Checksum(%q) = %q, want %q", body, got, secret[43:])
		}
	}
}

// TestEveryOneCharacterTypoIsRefused changes each character of generated keys to every
// other character that could stand there: in the key id, the secret and the checksum.
// Parse must refuse every result, whether it accepts legacy keys or not.
func TestEveryOneCharacterTypoIsRefused(t *testing.T) {
	const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
	for _, f := range []keystore.Format{keystoretest.Format(t, "mon"), keystoretest.Format(t, "mon").RejectingLegacy()} {
		for range 20 {
			full, id, _ := generate(t, f)
			if _, _, ok := f.Parse(full); !ok {
				t.Fatalf("Parse refused the generated key %q", full)
			}
			start := len("mon_live_") // from the key id's first character to the checksum's last
			tried := 0
			for i := start; i < len(full); i++ {
				for j := 0; j < len(chars); j++ {
					if chars[j] == full[i] {
						continue
					}
					typo := full[:i] + chars[j:j+1] + full[i+1:]
					tried++
					if gotID, _, ok := f.Parse(typo); ok {
						t.Fatalf("Parse accepted %q (key %q with position %d changed), key id %q", typo, full, i, gotID)
					}
				}
			}
			if want := (len(id) + 1 + keystore.SecretLen) * (len(chars) - 1); tried != want {
				t.Fatalf("tried %d typos, want %d", tried, want)
			}
		}
	}
}

func TestLegacyKeysAreAcceptedUnlessRefused(t *testing.T) {
	legacy := "mon_live_" + goodID + "." + goodSecret
	accept := keystoretest.Format(t, "mon")
	reject := accept.RejectingLegacy()
	if id, secret, ok := accept.Parse(legacy); !ok || id != goodID || secret != goodSecret {
		t.Errorf("accepting legacy keys: Parse(%q) = %q, %q, %v", legacy, id, secret, ok)
	}
	if _, _, ok := reject.Parse(legacy); ok {
		t.Errorf("rejecting legacy keys: Parse(%q) accepted it", legacy)
	}
	full, id, secret := generate(t, reject)
	if gotID, gotSecret, ok := reject.Parse(full); !ok || gotID != id || gotSecret != secret {
		t.Errorf("rejecting legacy keys: Parse(%q) = %q, %q, %v", full, gotID, gotSecret, ok)
	}
}

func TestChecksummedKeyWithBadBase64IsRefused(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	for _, tc := range []struct{ name, secret43 string }{
		{"non-canonical last character", strings.Repeat("A", 42) + "B"},
		{"std base64 character", strings.Repeat("A", 41) + "+A"},
		{"padding", strings.Repeat("A", 42) + "="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := "mon_live_" + goodID + "." + tc.secret43
			key := body + referenceChecksum(body) // the checksum matches: the shape does not
			if _, _, ok := f.Parse(key); ok {
				t.Errorf("Parse(%q) accepted it", key)
			}
		})
	}
}

func TestParseOfAChecksummedKeyDoesNotAllocate(t *testing.T) {
	f := keystoretest.Format(t, "mon").RejectingLegacy()
	full, _, _ := generate(t, f)
	bad := full[:len(full)-1] + "!"
	allocs := testing.AllocsPerRun(1000, func() {
		if _, _, ok := f.Parse(full); !ok {
			t.Fatal("refused")
		}
		if _, _, ok := f.Parse(bad); ok {
			t.Fatal("accepted")
		}
	})
	if allocs != 0 {
		t.Errorf("Parse allocates %v times per call, want 0", allocs)
	}
}

// scannerRegexp is the README's regular expression for secret scanners, for the
// default prefix.
var scannerRegexp = regexp.MustCompile(`\bmon_live_[A-Za-z0-9]{16,64}\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048][0-4][0-9A-Za-z]{5}\b`)

func TestTheREADMEGivesTheTestedRegexp(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(readme), "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, `\bmon_live_`) {
			if line != scannerRegexp.String() {
				t.Errorf("the README gives %s, the tests test %s", line, scannerRegexp)
			}
			return
		}
	}
	t.Error("the README gives no regular expression for secret scanners")
}

func TestScannerRegexpFindsGeneratedKeys(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	for range 500 {
		full, _, _ := generate(t, f)
		for _, text := range []string{full, "token=" + full + "&x=1", `"` + full + `"`, "Bearer " + full + "\n"} {
			if got := scannerRegexp.FindString(text); got != full {
				t.Fatalf("in %q the regexp found %q, want %q", text, got, full)
			}
		}
	}
}

func TestScannerRegexpSkipsNearMisses(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	full, id, secret := generate(t, f)
	head := "mon_live_" + id + "."
	for _, tc := range []struct{ name, text string }{
		{"legacy key", "mon_live_" + goodID + "." + goodSecret},
		{"other prefix", "abc_live_" + id + "." + secret},
		{"longer prefix", "xmon_live_" + id + "." + secret},
		{"test instead of live", "mon_test_" + id + "." + secret},
		{"key id too short", "mon_live_" + id[:15] + "." + secret},
		{"secret one short", head + secret[:48]},
		{"secret one long", head + secret + "A"},
		{"non-canonical 43rd character", head + secret[:42] + "B" + secret[43:]},
		{"checksum over 2^32", head + secret[:43] + "5" + secret[44:]},
		{"dash in checksum", head + secret[:44] + "-" + secret[45:]},
		{"no dot", "mon_live_" + id + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.text == full {
				t.Fatal("the near miss is the key itself")
			}
			if got := scannerRegexp.FindString(tc.text); got != "" {
				t.Errorf("the regexp found %q in %q", got, tc.text)
			}
		})
	}
}

func FuzzChecksum(f *testing.F) {
	f.Add("mon_live_AbCdEfGhIjKlMnOpQrStUv." + strings.Repeat("A", 43))
	f.Add("")
	f.Add("\xff\x00")
	f.Fuzz(func(t *testing.T, body string) {
		if got, want := keystore.Checksum(body), referenceChecksum(body); got != want {
			t.Fatalf("Checksum(%q) = %q, reference %q", body, got, want)
		}
	})
}

// FuzzParseChecksummed builds keys from fuzzed ids and secrets, with the reference
// checksum. Parse accepts exactly those whose parts have the right shape.
func FuzzParseChecksummed(f *testing.F) {
	format := keystoretest.Format(f, "mon").RejectingLegacy()
	f.Add(goodID, goodSecret[:43])
	f.Add(goodID, strings.Repeat("_", 42)+"w")
	f.Add("short", goodSecret[:43])
	f.Fuzz(func(t *testing.T, id, secret43 string) {
		body := "mon_live_" + id + "." + secret43
		key := body + referenceChecksum(body)
		gotID, gotSecret, ok := format.Parse(key)
		wantOK := keystore.ValidKeyID(id) && len(secret43) == 43 && canonicalBase64URL(secret43)
		if ok != wantOK {
			t.Fatalf("Parse(%q) ok = %v, want %v", key, ok, wantOK)
		}
		if ok && (gotID != id || gotSecret != key[len(key)-keystore.SecretLen:]) {
			t.Fatalf("Parse(%q) = %q, %q", key, gotID, gotSecret)
		}
	})
}

func canonicalBase64URL(s string) bool {
	return regexp.MustCompile(`^[A-Za-z0-9_-]*$`).MatchString(s) && len(s) == 43 &&
		strings.ContainsRune("AEIMQUYcgkosw048", rune(s[42]))
}
