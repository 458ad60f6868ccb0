package gatewayauth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"
)

// FuzzVerify feeds Verify any header value: it never panics, every error wraps
// ErrUnauthenticated (a key file leaves nothing to fetch), and only the one assertion
// the key signed verifies.
func FuzzVerify(f *testing.F) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	s, _ := NewSigner(priv, DefaultAudience)
	s.now = func() time.Time { return now }
	good, _ := s.Assertion("AAAAAAAAAAAAAAAAAAAAAA", "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", "Editor")
	v := &Verifier{cfg: Config{Audience: DefaultAudience, Leeway: MaxLeeway}, now: func() time.Time { return now },
		keys: map[string]ed25519.PublicKey{KeyID(pub): pub}}
	for _, seed := range []string{good, good[:len(good)-1], good + ".x", "a.b.c", "..", "", "eyJhbGciOiJub25lIn0.e30."} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		id, err := v.Verify(context.Background(), token)
		switch {
		case err == nil && token != good:
			t.Errorf("%q verified as %+v", token, id)
		case err != nil && !errors.Is(err, ErrUnauthenticated):
			t.Errorf("%q: %v, not ErrUnauthenticated", token, err)
		}
	})
}
