// Package password hashes and verifies users' passwords with argon2id, in the PHC
// string format. It also bounds the work. A derivation takes 19 MiB and one core for
// some tens of milliseconds. The login throttle counts per address, but an attacker
// may have many addresses. So a flood of logins must neither take every core from the
// requests under /v1, nor pile up waiting.
package password

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"

	"github.com/keygate/keygate/upstream/apperr"
)

// argon2Params are the cost parameters of argon2id. The defaults are OWASP's minimum
// recommendation: 19 MiB, 2 passes, 1 lane. That is enough against offline guessing of
// a stolen users table. It is cheap enough for fast logins on a small machine.
type argon2Params struct {
	memory  uint32 // KiB
	time    uint32
	threads uint8
	saltLen int
	keyLen  int
}

var defaultArgon2 = argon2Params{memory: 19 * 1024, time: 2, threads: 1, saltLen: 16, keyLen: 32}

// Bounds on the parameters read back from a stored hash. A corrupt or hostile row
// cannot make one login allocate gigabytes or run for minutes.
const (
	maxArgon2Memory  = 1 << 20 // KiB, 1 GiB
	maxArgon2Time    = 16
	maxArgon2Threads = 16
)

// ErrBadHash is a stored password hash that this package cannot verify. It is not a
// PHC argon2id string.
var ErrBadHash = errors.New("password hash is not a valid argon2id PHC string")

// Bounds of the password-hashing queue, for the reason the package doc gives. At most
// hashWorkers derivations run at once, and at most hashQueueLen more wait. Any further
// one is refused at once with 503.
var (
	hashWorkers  = max(1, runtime.GOMAXPROCS(0)/2)
	hashQueueLen = 8
)

// MinLength is the fewest characters (Unicode code points) a new password may have.
const MinLength = 10

// CheckNew returns the EINVALID error of a password too short to be set.
func CheckNew(password string) error {
	if utf8.RuneCountInString(password) < MinLength {
		return apperr.Invalid("password", "must be at least %d characters", MinLength)
	}
	return nil
}

// Hasher hashes and verifies passwords with argon2id, in the PHC string format
// `$argon2id$v=19$m=…,t=…,p=…$<salt>$<hash>`, in unpadded standard base64. Past the
// queue's bounds, a derivation fails with apperr.ErrHashQueueFull without waiting. A
// Hasher is safe for concurrent use.
type Hasher struct {
	params argon2Params
	// queue holds a token per derivation running or waiting, slots one per derivation
	// running.
	queue chan struct{}
	slots chan struct{}

	dummyOnce sync.Once
	dummy     string

	// derivations counts the argon2id runs (Derivations).
	derivations atomic.Int64
}

// NewHasher returns a Hasher with the default cost parameters and queue bounds.
func NewHasher() *Hasher {
	return &Hasher{
		params: defaultArgon2,
		queue:  make(chan struct{}, hashWorkers+hashQueueLen),
		slots:  make(chan struct{}, hashWorkers),
	}
}

// derive runs argon2id once a slot is free. It fails at once with
// apperr.ErrHashQueueFull when the queue is full. It gives up when ctx ends while it
// waits.
func (h *Hasher) derive(ctx context.Context, password, salt []byte, p argon2Params) ([]byte, error) {
	select {
	case h.queue <- struct{}{}:
	default:
		return nil, apperr.ErrHashQueueFull
	}
	defer func() { <-h.queue }()
	select {
	case h.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-h.slots }()
	h.derivations.Add(1)
	return argon2.IDKey(password, salt, p.time, p.memory, p.threads, uint32(p.keyLen)), nil
}

// Hash returns the PHC string of password with a fresh random salt.
func (h *Hasher) Hash(ctx context.Context, password string) (string, error) {
	salt := make([]byte, h.params.saltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	key, err := h.derive(ctx, []byte(password), salt, h.params)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version,
		h.params.memory, h.params.time, h.params.threads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
}

// Verify reports whether password matches the PHC string encoded. It compares in
// constant time. A malformed encoded string is an error, not a mismatch.
func (h *Hasher) Verify(ctx context.Context, encoded, password string) (bool, error) {
	p, salt, want, err := parsePHC(encoded)
	if err != nil {
		return false, err
	}
	got, err := h.derive(ctx, []byte(password), salt, p)
	if err != nil {
		return false, err
	}
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// Burn does the work of verifying password against a hash that matches nothing. So a
// login for an unknown email takes as long as one with a wrong password.
func (h *Hasher) Burn(ctx context.Context, password string) error {
	h.PrepareDummy()
	if h.dummy == "" {
		return errors.New("computing the dummy password hash failed")
	}
	_, err := h.Verify(ctx, h.dummy, password)
	return err
}

// PrepareDummy computes, once, the hash Burn verifies against. A server calls it at
// start. Then not even the first login for an unknown email is slower than others.
func (h *Hasher) PrepareDummy() {
	h.dummyOnce.Do(func() {
		// The dummy's salt is random and its password unguessable; it never matches.
		h.dummy, _ = h.Hash(context.Background(), rand.Text())
	})
}

// Derivations returns the number of argon2id derivations h has run. With it, a test
// can check that a login for an unknown email does the work of one for a known email.
// It can check that a throttled login does none.
func (h *Hasher) Derivations() int64 { return h.derivations.Load() }

// Saturate takes every place of h's queue until release is called. Meanwhile every
// derivation fails at once with apperr.ErrHashQueueFull, as under a flood of logins.
// So a test can check the answer to a full queue without such a flood.
func (h *Hasher) Saturate() (release func()) {
	for range cap(h.queue) {
		h.queue <- struct{}{}
	}
	return func() {
		for range cap(h.queue) {
			<-h.queue
		}
	}
}

// parsePHC splits an argon2id PHC string into its parameters, salt and key.
func parsePHC(encoded string) (argon2Params, []byte, []byte, error) {
	var p argon2Params
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" {
		return p, nil, nil, ErrBadHash
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return p, nil, nil, ErrBadHash
	}
	var m, t, threads uint32
	n, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &threads)
	if err != nil || n != 3 || fmt.Sprintf("m=%d,t=%d,p=%d", m, t, threads) != parts[3] {
		return p, nil, nil, ErrBadHash
	}
	if m < 8 || m > maxArgon2Memory || t < 1 || t > maxArgon2Time || threads < 1 || threads > maxArgon2Threads {
		return p, nil, nil, ErrBadHash
	}
	salt, err := base64.RawStdEncoding.Strict().DecodeString(parts[4])
	if err != nil || len(salt) < 8 || len(salt) > 64 {
		return p, nil, nil, ErrBadHash
	}
	key, err := base64.RawStdEncoding.Strict().DecodeString(parts[5])
	if err != nil || len(key) < 16 || len(key) > 64 {
		return p, nil, nil, ErrBadHash
	}
	p = argon2Params{memory: m, time: t, threads: uint8(threads), saltLen: len(salt), keyLen: len(key)}
	return p, salt, key, nil
}
