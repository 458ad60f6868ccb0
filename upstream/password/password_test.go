package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestPasswordHashIsPHCArgon2idAndVerifies(t *testing.T) {
	h := newPasswordHasher()
	ctx := context.Background()
	encoded, err := h.hash(ctx, "correct horse")
	if err != nil {
		t.Fatal(err)
	}
	phc := regexp.MustCompile(`^\$argon2id\$v=19\$m=19456,t=2,p=1\$[A-Za-z0-9+/]{22}\$[A-Za-z0-9+/]{43}$`)
	if !phc.MatchString(encoded) {
		t.Fatalf("hash %q is not a PHC argon2id string with the default parameters", encoded)
	}
	again, _ := h.hash(ctx, "correct horse")
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
		ok, err := h.verify(ctx, encoded, tc.password)
		if err != nil || ok != tc.ok {
			t.Errorf("verify(%q) = %v, %v; want %v", tc.password, ok, err, tc.ok)
		}
	}
}

func TestMalformedPasswordHashesAreErrors(t *testing.T) {
	h := newPasswordHasher()
	good, err := h.hash(context.Background(), "pw")
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
			if _, err := h.verify(context.Background(), tc.encoded, "pw"); !errors.Is(err, errBadHash) {
				t.Errorf("verify = %v, want errBadHash", err)
			}
		})
	}
}

func TestFullHashingQueueAnswers503AtOnceAndCountsNoFailure(t *testing.T) {
	e := newTestEnv(t)
	email, password := e.user()
	// Every running and waiting place of the queue is taken.
	h := e.srv.passwords
	for range cap(h.queue) {
		h.queue <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", e.ts.URL+"/auth/login",
		strings.NewReader(jsonBody(map[string]string{"email": email, "password": password})))
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatalf("login with a full queue did not answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	want(t, response{status: res.StatusCode, header: res.Header, body: string(body)}, 503, `{"error":"service_unavailable"}`)
	if n := scalar[int](e, `SELECT count(*) FROM login_attempts`); n != 0 {
		t.Errorf("%d login attempts kept after a 503, want 0", n)
	}

	for range cap(h.queue) {
		<-h.queue
	}
	e.login(email, password)
}

func TestHashingQueueLetsAFewWaitAndRefusesTheRest(t *testing.T) {
	h := newPasswordHasher()
	// All workers busy: hashQueueLen more may wait, the next is refused at once.
	for range hashWorkers {
		h.queue <- struct{}{}
		h.slots <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, hashQueueLen)
	for range hashQueueLen {
		go func() { _, err := h.hash(ctx, "waiting password"); errs <- err }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.queue) < cap(h.queue) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := h.hash(context.Background(), "one too many"); err != errHashQueueFull {
		t.Errorf("hash with a full queue: %v, want errHashQueueFull", err)
	}
	// The waiting ones give up with their context.
	cancel()
	for range hashQueueLen {
		if err := <-errs; err != context.Canceled {
			t.Errorf("waiting hash: %v, want context.Canceled", err)
		}
	}
}

func TestNewPasswordsHaveAtLeastTenCharacters(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		name, password string
		ok             bool
	}{
		{"9 characters", "123456789", false},
		{"9 characters in 27 bytes", "日本語日本語日本語", false},
		{"10 characters", "1234567890", true},
		{"10 characters in 20 bytes", "éééééééééé", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Users are created by the command line, which checks the password once.
			code, _, stderr := run(t, map[string]string{"DATABASE_URL": e.dbURL}, tc.password+"\n",
				"user", "create", "--email", fmt.Sprintf("u%d@example.com", e.seq.Add(1)), "--password-stdin")
			if tc.ok {
				if code != 0 {
					t.Fatalf("user create: exit %d, stderr %q", code, stderr)
				}
				return
			}
			if code != 2 || stderr != "upstream user create: password: must be at least 10 characters\n" {
				t.Errorf("user create: exit %d, stderr %q; want 2 and the password rule", code, stderr)
			}
			// Set over HTTP, the refusal is a 400 naming the field.
			rec := httptest.NewRecorder()
			e.srv.writeError(rec, httptest.NewRequest("POST", "/", nil), checkNewPassword(tc.password))
			want(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()}, 400,
				`{"error":"invalid_request","message":"password: must be at least 10 characters"}`)
		})
	}
	if n := scalar[int](e, `SELECT count(*) FROM users`); n != 2 {
		t.Errorf("%d users created, want 2", n)
	}
}
