package caddymodule

import (
	"net/http"

	"github.com/keygate/keygate/keystore"
)

// refuse answers the one 401 to a key refused after its lookup: unknown, revoked,
// expired, a wrong secret, or used from outside its allowed networks (outcome
// ip_denied, with the key). The 401 is written and flushed to the client first;
// what is recorded of the request comes after: the metrics, the access log fields,
// and for a known key the usage record. So the two refusals do the same work before
// the answer is out, and a thief timing it cannot tell a live restricted key from a
// dead one (docs/security.md, Timing).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, o outcome, key *keystore.Key) {
	writeUnauthenticated(w)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	h.record(r, o, key)
}
