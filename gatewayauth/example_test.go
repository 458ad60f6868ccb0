package gatewayauth_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/keygate/keygate/gatewayauth"
)

// A service behind the gateway verifies every /v1 request's assertion and reads the
// caller from its context. In production Config.JWKSURL names the gateway's
// /.well-known/jwks.json; here a key file stands in for it.
func ExampleVerifier_Middleware() {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	dir, _ := os.MkdirTemp("", "gatewayauth")
	defer os.RemoveAll(dir)
	keyFile := filepath.Join(dir, "identity.pem")
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)

	v, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		panic(err)
	}
	api := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := gatewayauth.FromContext(r.Context())
		fmt.Fprintf(w, "org %s, key %s, role %s", id.OrgID, id.KeyID, id.Role)
	}))

	// What the gateway adds to a request it passes on.
	signer, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	assertion, _ := signer.Assertion("Hx7Kq2mZpL9wVb3N", "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", "Editor")

	for _, header := range []string{assertion, "forged"} {
		req := httptest.NewRequest("GET", "/v1/monitors", nil)
		req.Header.Set(gatewayauth.Header, header)
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 org 0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11, key Hx7Kq2mZpL9wVb3N, role Editor
	// 401 {"error":"api key unauthenticated"}
}
