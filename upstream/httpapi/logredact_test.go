package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
)

func TestTheRequestLogRedactsKeysInPathsAndMethods(t *testing.T) {
	// A key in a path (a client that put it there, or followed a link that did) or
	// sent as the method reaches the log redacted, however it is encoded.
	e, orgID, owner := upstreamtest.NewOrgEnv(t, "pro", "Owner")
	const key = "mon_live_AbCdEfGhIjKlMnOpQrStUv.dGhpcyBpcyBhIDMyIGJ5dGUgc2VjcmV0IGZvciB0ZXN0"
	secret := key[strings.IndexByte(key, '.')+1:]
	for _, path := range []string{
		"/v1/monitors/" + key,
		"/orgs/" + key + "/api-keys",
		"/orgs/" + orgID + "/api-keys/" + strings.NewReplacer("_", "%5F", ".", "%2E").Replace(key),
		"/dashboard/" + key,
	} {
		owner.Do("GET", path, "")
	}
	owner.Do(key, "/orgs/"+orgID+"/api-keys", "")
	if e.Logs.FilterMessage("request").Len() < 5 {
		t.Fatalf("%d request lines logged, want 5", e.Logs.FilterMessage("request").Len())
	}
	for _, entry := range e.Logs.All() {
		if line := fmt.Sprint(entry.Message, entry.ContextMap()); strings.Contains(line, secret[:12]) {
			t.Errorf("a log line shows the secret: %s", line)
		}
	}
}
