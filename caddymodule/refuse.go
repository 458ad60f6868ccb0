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
// dead one (docs/security.md, Timing). The status is o's, as answer's is.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, o keystore.Outcome, key *keystore.Key) {
	writeUnauthenticated(w, o.Status())
	flush(w)
	h.record(r, o, key)
}

// refuseLookedUp is refuse for a key its lookup refused: unknown, dead, a wrong
// secret, or used from outside its allowed networks, which the lookup filters out as
// it does a dead key. After the 401 is out, a second look (lookups.denied) tells the
// last apart, to record it as ip_denied against its key; anything else is recorded
// as unauthenticated. The second look delays no answer: only the request's own
// return, and so the next request on its connection (docs/security.md, Timing).
func (h *Handler) refuseLookedUp(w http.ResponseWriter, r *http.Request, keyID, secret string) {
	writeUnauthenticated(w, keystore.OutcomeUnauthenticated.Status())
	flush(w)
	if key, ok := h.lookups.denied(r.Context(), keyID, secret); ok {
		h.record(r, keystore.OutcomeIPDenied, &key)
		return
	}
	h.record(r, keystore.OutcomeUnauthenticated, nil)
}

// flush sends what w holds to the client, as http.ResponseController does, through
// the Unwrap of Caddy's writers, which implement no Flush of their own. Unlike a
// ResponseController it allocates nothing.
func flush(w http.ResponseWriter) {
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }:
			_ = t.FlushError()
			return
		case http.Flusher:
			t.Flush()
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return
		}
	}
}
