package gatewayauth

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// fetchTimeout bounds a fetch of the JWKS, whatever Config.Client's own timeout is:
// while it lasts, assertions of unknown kids wait for it.
const fetchTimeout = 5 * time.Second

// maxJWKSSize bounds the JWKS a fetch reads.
const maxJWKSSize = 1 << 20

// defaultMaxAge is how long the keys of a JWKS served without a Cache-Control max-age
// are used before it is fetched again. v1_gateway_jwks sends max-age=300.
const defaultMaxAge = 5 * time.Minute

// minMaxAge and maxMaxAge bound the max-age a JWKS states: a minute at least, so that
// a verifier does not hammer its gateway, an hour at most, so that a key removed from
// the JWKS stops being accepted within the hour whatever the JWKS says. They are
// variables for the tests.
var (
	minMaxAge = time.Minute
	maxMaxAge = time.Hour
)

// kidFetchInterval is how often at most an assertion of an unknown kid makes the
// Verifier fetch the JWKS.
const kidFetchInterval = time.Second

// Refresh fetches the JWKS now and returns the fetch's error, which wraps
// ErrKeysUnavailable: at a service's start, to learn early that the URL is wrong or
// the gateway is not up yet. It does nothing with a KeyFile.
func (v *Verifier) Refresh(ctx context.Context) error {
	if v.cfg.JWKSURL == "" {
		return nil
	}
	v.fetching.Lock()
	defer v.fetching.Unlock()
	if err := v.fetch(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrKeysUnavailable, err)
	}
	return nil
}

// known returns the public key of kid if v has it.
func (v *Verifier) known(kid string) (ed25519.PublicKey, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	k, ok := v.keys[kid]
	return k, ok
}

// key returns the public key of kid. A kid v lacks is looked for in a fetch of the
// JWKS that began after the assertion arrived: one already under way then, or one made
// for it, at most one a second. So a key the gateway publishes before it signs with
// it is never refused, and a flood of made-up kids costs one fetch a second.
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok := v.known(kid); ok {
		return k, nil
	}
	if v.cfg.JWKSURL == "" {
		return nil, fmt.Errorf("%w: unknown kid %q", ErrUnauthenticated, kid)
	}
	arrived := v.now()
	v.fetching.Lock()
	defer v.fetching.Unlock()
	if k, ok := v.known(kid); ok { // the fetch this call waited on brought it
		return k, nil
	}
	if v.fetchedAt.Before(arrived) {
		if wait := v.fetchedAt.Add(kidFetchInterval).Sub(v.now()); wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrKeysUnavailable, err)
			}
		}
		v.fetchFor(ctx)
	}
	if v.fetchErr != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeysUnavailable, v.fetchErr)
	}
	if k, ok := v.known(kid); ok {
		return k, nil
	}
	return nil, fmt.Errorf("%w: unknown kid %q", ErrUnauthenticated, kid)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// fetchFor fetches the JWKS on behalf of a request: the fetch serves every assertion
// that waits on it, so it goes on when the request that began it is cancelled (a
// client that hung up would otherwise fail it for all), bounded by fetchTimeout rather
// than by that request. It must be called with fetching held.
func (v *Verifier) fetchFor(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
	defer cancel()
	v.fetch(ctx)
}

// refreshLoop fetches the JWKS at once, and again whenever its keys are due (their
// max-age has run out) or, after a failure, with a backoff. It runs until Close.
func (v *Verifier) refreshLoop() {
	defer close(v.done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-v.life.Done():
			return
		case <-t.C:
		}
		t.Reset(v.refreshIfDue())
	}
}

// refreshIfDue fetches the JWKS if it is due, and returns how long until it is due
// again. A fetch for an unknown kid in the meantime moves that time.
func (v *Verifier) refreshIfDue() time.Duration {
	v.fetching.Lock()
	defer v.fetching.Unlock()
	if !v.fetchedAt.IsZero() {
		if left := v.due().Sub(v.now()); left > 0 {
			return left
		}
	}
	ctx, cancel := context.WithTimeout(v.life, fetchTimeout) // Close cuts it short
	defer cancel()
	v.fetch(ctx)
	return v.due().Sub(v.now())
}

// due is when the JWKS is to be fetched next: when the keys of the last fetch run out
// of their max-age, or, after failures, a second after the last, doubling with each
// failure in a row up to a minute. While fetches fail, the keys of the last successful
// one stay in use: only a JWKS that answers without a key removes it. It must be called
// with fetching held.
func (v *Verifier) due() time.Time {
	if v.fetchErr == nil {
		return v.staleAt
	}
	backoff := time.Second << min(v.failures-1, 6)
	return v.fetchedAt.Add(min(backoff, minMaxAge))
}

// fetch replaces the keys with those of the JWKS. It must be called with fetching
// held.
func (v *Verifier) fetch(ctx context.Context) error {
	v.fetchedAt = v.now()
	keys, maxAge, err := v.get(ctx)
	v.fetchErr = err
	if err != nil {
		v.failures++
		return err
	}
	v.failures = 0
	v.staleAt = v.fetchedAt.Add(maxAge)
	v.mu.Lock()
	v.keys = keys
	v.mu.Unlock()
	return nil
}

// get fetches the JWKS and returns its keys and its max-age.
func (v *Verifier) get(ctx context.Context) (map[string]ed25519.PublicKey, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	res, err := v.cfg.Client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("fetching the JWKS: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("fetching the JWKS: %s answered %s", v.cfg.JWKSURL, res.Status)
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, maxJWKSSize+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the JWKS: %w", err)
	}
	if len(b) > maxJWKSSize {
		return nil, 0, fmt.Errorf("reading the JWKS: larger than %d bytes", maxJWKSSize)
	}
	keys, err := parseJWKS(b)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the JWKS: %w", err)
	}
	return keys, maxAge(res.Header), nil
}

// maxAge is how long the keys of a JWKS answered with h may be used: its Cache-Control
// max-age (RFC 9111 §5.2.2.1), the least with no-cache or no-store, defaultMaxAge
// without either, bounded to minMaxAge..maxMaxAge.
func maxAge(h http.Header) time.Duration {
	age := defaultMaxAge
	for _, field := range h.Values("Cache-Control") {
		for _, d := range strings.Split(field, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(d), "=")
			switch strings.ToLower(name) {
			case "max-age":
				if n, err := strconv.ParseUint(strings.Trim(val, `"`), 10, 64); err == nil {
					age = time.Duration(min(n, uint64(maxMaxAge/time.Second))) * time.Second
				}
			case "no-cache", "no-store":
				return minMaxAge
			}
		}
	}
	return min(max(age, minMaxAge), maxMaxAge)
}
