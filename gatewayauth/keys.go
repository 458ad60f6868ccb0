package gatewayauth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/go-jose/go-jose/v4"
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

// KeyID is the kid of a public key: its RFC 7638 thumbprint (SHA-256), base64url.
func KeyID(pub ed25519.PublicKey) string {
	t, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		panic(err) // an Ed25519 public key always has one
	}
	return base64.RawURLEncoding.EncodeToString(t)
}

// publicJWK is pub as a JSON Web Key: public, EdDSA, for signatures, with its kid.
func publicJWK(pub ed25519.PublicKey) jose.JSONWebKey {
	return jose.JSONWebKey{Key: pub, KeyID: KeyID(pub), Algorithm: string(jose.EdDSA), Use: "sig"}
}

// JWKS returns the JSON Web Key Set (RFC 7517) of the public halves of the keys in
// files (private or public PEM): what a gateway publishes for its upstreams to verify
// with. It never holds a private part. During a rotation it lists the old key beside
// the new one.
func JWKS(files ...string) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("no key file")
	}
	set := jose.JSONWebKeySet{}
	seen := map[string]bool{}
	for _, f := range files {
		keys, err := ReadPublicKeys(f)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			jwk := publicJWK(k)
			if !seen[jwk.KeyID] {
				seen[jwk.KeyID] = true
				set.Keys = append(set.Keys, jwk)
			}
		}
	}
	return json.Marshal(set)
}
