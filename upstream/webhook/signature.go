package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// SecretPrefix starts every endpoint secret. The rest is the standard base64 of the
// key's bytes.
const SecretPrefix = "whsec_"

// secretBytes is the length of the secrets NewSecret makes.
const secretBytes = 32

// NewSecret returns a fresh endpoint secret: SecretPrefix and 32 random bytes in
// base64.
func NewSecret() string {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails (crypto/rand)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// decodeSecret returns the HMAC key of secret: its base64 after SecretPrefix.
func decodeSecret(secret string) ([]byte, error) {
	rest, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, errors.New("webhook: secret lacks the whsec_ prefix")
	}
	return base64.StdEncoding.DecodeString(rest)
}

// Sign returns the webhook-signature header of a message: for each secret,
// "v1," and the base64 HMAC-SHA256 of "id.timestamp.body" keyed by the secret's
// bytes, space-separated. Several secrets sign while a rotated one still counts.
func Sign(secrets []string, id string, timestamp int64, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := decodeSecret(s)
		if err != nil {
			return "", err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}

// Verify reports whether header, a webhook-signature, holds a v1 signature of the
// message by secret. It is what a receiver does (docs/webhooks.md); this package's
// tests use it.
func Verify(secret, header, id string, timestamp int64, body []byte) bool {
	want, err := Sign([]string{secret}, id, timestamp, body)
	if err != nil {
		return false
	}
	for _, sig := range strings.Fields(header) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}
