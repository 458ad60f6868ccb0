package keystore

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// The shape of a full key, <prefix>_live_<keyId>.<secret> (README.md, Keys).
const (
	// KeyIDLen is the length of generated key ids; Parse accepts MinKeyIDLen..MaxKeyIDLen.
	KeyIDLen    = 22
	MinKeyIDLen = 16
	MaxKeyIDLen = 64

	// SecretBytes is the number of random bytes of a generated secret. They are
	// written in unpadded base64url (43 characters), followed by a
	// ChecksumLen-character checksum. So a generated secret has SecretLen characters.
	// Parse also accepts legacy secrets, without a checksum: MinSecretLen..MaxSecretLen
	// characters of unpadded base64url, that is at least 32 bytes.
	SecretBytes  = 32
	ChecksumLen  = 6
	SecretLen    = 43 + ChecksumLen
	MinSecretLen = 43
	MaxSecretLen = 128

	// DefaultPrefix is the key prefix when none is configured.
	DefaultPrefix = "mon"

	live = "_live_"
)

// ErrBadPrefix is returned for a key prefix that is not [a-z][a-z0-9]{0,15}.
var ErrBadPrefix = errors.New("key prefix must match [a-z][a-z0-9]{0,15}")

// ValidPrefix reports whether prefix is a valid key prefix: [a-z][a-z0-9]{0,15}.
func ValidPrefix(prefix string) bool {
	if len(prefix) < 1 || len(prefix) > 16 || !isLower(prefix[0]) {
		return false
	}
	for i := 1; i < len(prefix); i++ {
		if !isLower(prefix[i]) && !isDigit(prefix[i]) {
			return false
		}
	}
	return true
}

// Format knows the keys of one prefix: it generates, parses and masks them. The zero
// Format is not usable: build one with NewFormat.
type Format struct {
	prefix       string
	head         string // prefix + "_live_", built once so that Parse does not allocate
	rejectLegacy bool
}

// NewFormat returns the Format of keys starting with prefix.
func NewFormat(prefix string) (Format, error) {
	if !ValidPrefix(prefix) {
		return Format{}, fmt.Errorf("%w: %q", ErrBadPrefix, prefix)
	}
	return Format{prefix: prefix, head: prefix + live}, nil
}

// Prefix returns the key prefix of f.
func (f Format) Prefix() string { return f.prefix }

// RejectingLegacy returns f refusing legacy keys, made before secrets carried a
// checksum. Parse then accepts checksummed keys only.
func (f Format) RejectingLegacy() Format {
	f.rejectLegacy = true
	return f
}

// Parse splits a presented key into its key id and secret, which share presented's
// memory. It reports ok == false for anything but <prefix>_live_<keyId>.<secret>,
// exactly. keyId is [A-Za-z0-9]{16,64}. The secret is one of:
//
//   - checksummed: SecretLen (49) characters. 43 are canonical unpadded base64url (32
//     bytes). The ChecksumLen (6) that follow are the checksum of everything before
//     them in the key (see Checksum), which must match.
//   - legacy, unless f rejects legacy keys: 43..128 characters of canonical unpadded
//     base64url. No such string has 49 characters, so the two never overlap.
//
// A key that fails here costs no database query. Parse does not allocate.
func (f Format) Parse(presented string) (keyID, secret string, ok bool) {
	if f.head == "" || !strings.HasPrefix(presented, f.head) {
		return "", "", false
	}
	rest := presented[len(f.head):]
	dot := strings.IndexByte(rest, '.')
	if dot < 0 {
		return "", "", false
	}
	keyID, secret = rest[:dot], rest[dot+1:]
	if !ValidKeyID(keyID) {
		return "", "", false
	}
	if len(secret) == SecretLen {
		body := presented[:len(presented)-ChecksumLen]
		if !validSecret(secret[:SecretLen-ChecksumLen]) || !checksumMatches(body, secret[SecretLen-ChecksumLen:]) {
			return "", "", false
		}
		return keyID, secret, true
	}
	if f.rejectLegacy || !validSecret(secret) {
		return "", "", false
	}
	return keyID, secret, true
}

// Mask returns the key of keyID as the dashboard lists it, with eight asterisks for
// its secret.
func (f Format) Mask(keyID string) string {
	return f.head + keyID + ".********"
}

// Generate returns a new full key, its key id and its secret, all from crypto/rand.
func (f Format) Generate() (full, keyID, secret string, err error) {
	if f.head == "" {
		return "", "", "", ErrBadPrefix
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	id := make([]byte, 0, KeyIDLen)
	var buf [64]byte
	for len(id) < KeyIDLen {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", "", "", fmt.Errorf("reading random bytes: %w", err)
		}
		for _, b := range buf {
			// Rejection sampling keeps every character equally likely:
			// 248 is the largest multiple of 62 not above 256.
			if b < 248 && len(id) < KeyIDLen {
				id = append(id, alphabet[b%62])
			}
		}
	}
	var raw [SecretBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", "", "", fmt.Errorf("reading random bytes: %w", err)
	}
	keyID = string(id)
	body := f.head + keyID + "." + base64.RawURLEncoding.EncodeToString(raw[:])
	full = body + Checksum(body)
	return full, keyID, full[len(f.head)+len(keyID)+1:], nil
}

// HashSecret returns the SHA-256 digest of a key's secret. A secret is stored in no
// other form.
func HashSecret(secret string) [sha256.Size]byte {
	return sha256.Sum256([]byte(secret))
}

// ValidKeyID reports whether id has the shape of a key id: [A-Za-z0-9]{16,64}.
func ValidKeyID(id string) bool {
	if len(id) < MinKeyIDLen || len(id) > MaxKeyIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !isLower(c) && !isUpper(c) && !isDigit(c) {
			return false
		}
	}
	return true
}

// validSecret reports whether s is a canonical unpadded base64url string of
// MinSecretLen..MaxSecretLen characters.
func validSecret(s string) bool {
	if len(s) < MinSecretLen || len(s) > MaxSecretLen || len(s)%4 == 1 {
		return false
	}
	var last byte
	for i := 0; i < len(s); i++ {
		v, ok := base64URLValue(s[i])
		if !ok {
			return false
		}
		last = v
	}
	// The bits of the last character beyond the final whole byte must be zero, as
	// strict base64 decoding requires. Otherwise two strings encode one secret.
	spare := (len(s) * 6) % 8
	return last&(1<<spare-1) == 0
}

func base64URLValue(c byte) (byte, bool) {
	switch {
	case isUpper(c):
		return c - 'A', true
	case isLower(c):
		return c - 'a' + 26, true
	case isDigit(c):
		return c - '0' + 52, true
	case c == '-':
		return 62, true
	case c == '_':
		return 63, true
	}
	return 0, false
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isUpper(c byte) bool { return c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
