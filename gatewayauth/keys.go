package gatewayauth

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// ReadPrivateKey reads an Ed25519 private key from a PKCS#8 PEM file, as
// `openssl genpkey -algorithm ed25519` writes it.
func ReadPrivateKey(file string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%s: no PRIVATE KEY block", file)
		}
		if block.Type != "PRIVATE KEY" {
			continue
		}
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		priv, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s: a %T, not an Ed25519 key", file, k)
		}
		return priv, nil
	}
}

// ReadPublicKeys reads the Ed25519 public keys of a PEM file: the public half of a
// PRIVATE KEY block, or a PUBLIC KEY block, as many as the file holds.
func ReadPublicKeys(file string) ([]ed25519.PublicKey, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PublicKey
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		var k any
		switch block.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "PUBLIC KEY":
			k, err = x509.ParsePKIXPublicKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		switch k := k.(type) {
		case ed25519.PrivateKey:
			keys = append(keys, k.Public().(ed25519.PublicKey))
		case ed25519.PublicKey:
			keys = append(keys, k)
		default:
			return nil, fmt.Errorf("%s: a %T, not an Ed25519 key", file, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no Ed25519 PRIVATE KEY or PUBLIC KEY block", file)
	}
	return keys, nil
}

// KeyID is the kid of a public key: its RFC 7638 thumbprint, the SHA-256 of the
// key's required members in lexicographic order (RFC 8037 §2), base64url.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + b64(pub) + `"}`))
	return b64(sum[:])
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwk is a JSON Web Key (RFC 7517) of an Ed25519 public key (RFC 8037): the members
// the gateway publishes and a Verifier reads.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	D   string `json:"d,omitempty"` // a private part: never published, never used
	Kid string `json:"kid,omitempty"`
	Alg string `json:"alg,omitempty"`
	Use string `json:"use,omitempty"`
}

// jwks is a JSON Web Key Set.
type jwks struct {
	Keys []jwk `json:"keys"`
}

// publicKey returns the key k holds if it is an Ed25519 public key meant for EdDSA
// signatures. A key with a private part, another curve or type, or another use or
// algorithm is none.
func (k jwk) publicKey() (ed25519.PublicKey, bool) {
	if k.Kty != "OKP" || k.Crv != "Ed25519" || k.D != "" ||
		(k.Alg != "" && k.Alg != "EdDSA") || (k.Use != "" && k.Use != "sig") {
		return nil, false
	}
	x, err := base64.RawURLEncoding.Strict().DecodeString(k.X)
	if err != nil || len(x) != ed25519.PublicKeySize {
		return nil, false
	}
	return ed25519.PublicKey(x), true
}

// parseJWKS returns the Ed25519 public keys of a JWKS by their thumbprint, whatever kid
// the set states; it skips the keys it cannot use (RFC 7517 §5).
func parseJWKS(b []byte) (map[string]ed25519.PublicKey, error) {
	var set jwks
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, err
	}
	keys := map[string]ed25519.PublicKey{}
	for _, k := range set.Keys {
		if pub, ok := k.publicKey(); ok {
			keys[KeyID(pub)] = pub
		}
	}
	return keys, nil
}

// JWKS returns the JSON Web Key Set (RFC 7517) of the public halves of the keys in
// files (private or public PEM): what a gateway publishes for its upstreams to verify
// with. It never holds a private part. During a rotation it lists the old key beside
// the new one.
func JWKS(files ...string) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("no key file")
	}
	set := jwks{Keys: []jwk{}}
	seen := map[string]bool{}
	for _, f := range files {
		keys, err := ReadPublicKeys(f)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			kid := KeyID(k)
			if !seen[kid] {
				seen[kid] = true
				set.Keys = append(set.Keys, jwk{Kty: "OKP", Crv: "Ed25519", X: b64(k), Kid: kid, Alg: "EdDSA", Use: "sig"})
			}
		}
	}
	return json.Marshal(set)
}
