package password

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/upstream/apperr"
)

func TestPasswordHashIsPHCArgon2idAndVerifies(t *testing.T) {
	h := NewHasher()
	ctx := context.Background()
	encoded, err := h.Hash(ctx, "correct horse")
	if err != nil {
		t.Fatal(err)
	}
	phc := regexp.MustCompile(`^\$argon2id\$v=19\$m=19456,t=2,p=1\$[A-Za-z0-9+/]{22}\$[A-Za-z0-9+/]{43}$`)
	if !phc.MatchString(encoded) {
		t.Fatalf("hash %q is not a PHC argon2id string with the default parameters", encoded)
	}
	again, _ := h.Hash(ctx, "correct horse")
	if again == encoded {
		t.Error("two hashes of one password are equal: the salt is not random")
	}
	for _, tc := range []struct {
		password string
		ok       bool
	}{
		{"correct horse", true},
		{"correct horse ", false},
		{"Correct horse", false},
		{"", false},
	} {
		ok, err := h.Verify(ctx, encoded, tc.password)
		if err != nil || ok != tc.ok {
			t.Errorf("verify(%q) = %v, %v; want %v", tc.password, ok, err, tc.ok)
		}
	}
}

func TestMalformedPasswordHashesAreErrors(t *testing.T) {
	h := NewHasher()
	good, err := h.Hash(context.Background(), "pw")
	if err != nil {
		t.Fatal(err)
	}
	salt, key := good[len(good)-66:len(good)-44], good[len(good)-43:]
	for _, tc := range []struct{ name, encoded string }{
		{"empty", ""},
		{"argon2i", "$argon2i$v=19$m=19456,t=2,p=1$" + salt + "$" + key},
		{"old version", "$argon2id$v=16$m=19456,t=2,p=1$" + salt + "$" + key},
		{"missing parameter", "$argon2id$v=19$m=19456,t=2$" + salt + "$" + key},
		{"trailing junk in parameters", "$argon2id$v=19$m=19456,t=2,p=1x$" + salt + "$" + key},
		{"memory beyond 1 GiB", "$argon2id$v=19$m=2000000,t=2,p=1$" + salt + "$" + key},
		{"too many passes", "$argon2id$v=19$m=19456,t=100,p=1$" + salt + "$" + key},
		{"zero threads", "$argon2id$v=19$m=19456,t=2,p=0$" + salt + "$" + key},
		{"padded salt", "$argon2id$v=19$m=19456,t=2,p=1$" + salt + "==$" + key},
		{"short key", "$argon2id$v=19$m=19456,t=2,p=1$" + salt + "$AAAA"},
		{"extra field", "$argon2id$v=19$m=19456,t=2,p=1$" + salt + "$" + key + "$x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := h.Verify(context.Background(), tc.encoded, "pw"); !errors.Is(err, ErrBadHash) {
				t.Errorf("verify = %v, want ErrBadHash", err)
			}
		})
	}
}

func TestHashingQueueLetsAFewWaitAndRefusesTheRest(t *testing.T) {
	h := NewHasher()
	// All workers busy: hashQueueLen more may wait, the next is refused at once.
	for range hashWorkers {
		h.queue <- struct{}{}
		h.slots <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, hashQueueLen)
	for range hashQueueLen {
		go func() { _, err := h.Hash(ctx, "waiting password"); errs <- err }()
	}
	testenv.Eventually(t, 10*time.Second, "the queue full", func() bool { return len(h.queue) == cap(h.queue) })
	if _, err := h.Hash(context.Background(), "one too many"); err != apperr.ErrHashQueueFull {
		t.Errorf("hash with a full queue: %v, want apperr.ErrHashQueueFull", err)
	}
	// The waiting ones give up with their context.
	cancel()
	for range hashQueueLen {
		if err := <-errs; err != context.Canceled {
			t.Errorf("waiting hash: %v, want context.Canceled", err)
		}
	}
}
