package caddymodule

import (
	"context"
	"net/http"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
)

// refuse answers the one 401 to a key refused for its address from, once its lookup
// had found it (a batch partner's address found it): see refuseAfter.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, key keystore.Key, from netip.Addr) {
	h.refuseAfter(w, r, secondLook{key: key, found: true, from: from})
}

// refuseLookedUp answers the one 401 to a key its lookup refused: unknown, dead, a
// wrong secret, or used from outside its allowed networks, which the lookup filters
// out as it does a dead key. A second look (lookups.denied) tells the last apart:
// see refuseAfter.
func (h *Handler) refuseLookedUp(w http.ResponseWriter, r *http.Request, keyID, secret string, from netip.Addr) {
	h.refuseAfter(w, r, secondLook{keyID: keyID, secret: secret, from: from})
}

// refuseAfter answers the one 401 to a key refused after its lookup, and the access
// log records it as unauthenticated, the answer. Only once the handler has returned
// does l tell whether it was a key refused for its address (secondLooks): the metrics
// and the usage record then count it as ip_denied against its key, and a log entry
// names it; anything else as unauthenticated. So a refused restricted key and an
// unknown key do the same work while their connection is open, and a thief timing
// either, to the answer or to the connection's close, cannot tell a live key from a
// dead one (docs/security.md, Timing).
func (h *Handler) refuseAfter(w http.ResponseWriter, r *http.Request, l secondLook) {
	writeUnauthenticated(w, keystore.OutcomeUnauthenticated.Status())
	h.logOutcome(r, keystore.OutcomeUnauthenticated, nil, 1)
	l.h, l.done, l.path, l.at = h, r.Context().Done(), r.URL.Path, now()
	select {
	case h.secondLooks.queue <- l:
	default: // a flood: no look
		h.count(keystore.OutcomeUnauthenticated, nil, 1)
	}
}

// secondLook is a refused key waiting for its second look: its id and secret, or
// the key itself when its lookup found it.
type secondLook struct {
	h             *Handler
	keyID, secret string
	key           keystore.Key
	found         bool
	from          netip.Addr
	path          string
	at            time.Time       // of the answer
	done          <-chan struct{} // the request's: closed when its handler has returned
}

// run waits for l's handler to return, looks, and records what it found.
func (l *secondLook) run() {
	h := l.h
	if l.done != nil {
		<-l.done
	}
	if !l.found {
		l.key, l.found = h.lookups.denied(context.Background(), l.keyID, l.secret)
	}
	if !l.found {
		h.count(keystore.OutcomeUnauthenticated, nil, 1)
		return
	}
	h.count(keystore.OutcomeIPDenied, nil, 1)
	h.countUsageAt(&l.key, keystore.OutcomeIPDenied, keystore.OutcomeIPDenied.Status(), 1, l.at)
	if c := h.logger.Check(zap.InfoLevel, "api key used from outside its allowed networks"); c != nil {
		c.Write(zap.String("key_id", l.key.ID), zap.String("org_id", l.key.OrgID), zap.Stringer("client_ip", l.from),
			zap.String("path", keystore.Redact(l.path)))
	}
}

// secondLooks are the workers of the second looks, shared by every handler in pools.
// A look waits in a queue of maxSecondLooks; a flood of made-up keys beyond it is
// recorded as unknown keys without a look. The workers' number bounds how many
// looks wait on PostgreSQL at once, where keystore.Denials gathers them into one
// batch.
type secondLooks struct {
	queue chan secondLook
	stop  chan struct{}
}

const (
	maxSecondLooks    = 1024
	secondLookWorkers = 64
	secondLooksKey    = "second looks"
)

func (s secondLooks) Destruct() error {
	close(s.stop)
	return nil
}

// loadSecondLooks returns the shared workers, starting them if needed, and the key to
// give back to pools.
func loadSecondLooks() (secondLooks, string) {
	v, _, _ := pools.LoadOrNew(secondLooksKey, func() (caddy.Destructor, error) {
		s := secondLooks{queue: make(chan secondLook, maxSecondLooks), stop: make(chan struct{})}
		for range secondLookWorkers {
			go s.work()
		}
		return s, nil
	})
	return v.(secondLooks), secondLooksKey
}

func (s secondLooks) work() {
	for {
		select {
		case l := <-s.queue:
			l.run()
		case <-s.stop:
			return
		}
	}
}
