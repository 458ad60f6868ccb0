package keystore_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
)

// addrVerifier is what Store and Batcher both do for a request from an address.
type addrVerifier interface {
	VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (keystore.Key, bool, error)
}

// restrictedKeys creates, in a fresh database, a key for each set of networks, and
// returns the full keys in that order.
func restrictedKeys(t *testing.T, networks ...[]string) (*keystore.Store, []string) {
	t.Helper()
	store, _, org := newStore(t, "pro")
	full := make([]string, len(networks))
	for i, n := range networks {
		_, full[i] = create(t, store, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, AllowedCIDRs: prefixes(t, n...)})
	}
	return store, full
}

func TestALookupFromOutsideAKeysNetworksFindsNothing(t *testing.T) {
	// The address check is the lookup's own: a key asked from outside its networks is
	// filtered out inside PostgreSQL, as a revoked one is, and nothing comes back.
	store, keys := restrictedKeys(t,
		[]string{"10.9.0.0/16"},
		[]string{"2001:db8::/32"},
		[]string{"192.0.2.0/24", "198.51.100.0/24", "2001:db8:1::/48"},
		nil,
	)
	v4, v6, several, open := keys[0], keys[1], keys[2], keys[3]
	format := keystoretest.Format(t, "mon")
	for name, v := range map[string]addrVerifier{
		"store":   store,
		"batcher": keystore.NewBatcher(store, keystore.BatcherOptions{Lanes: 2}),
	} {
		for _, tc := range []struct {
			name string
			key  string
			from string
			ok   bool
		}{
			{"IPv4 inside", v4, "10.9.1.1", true},
			{"IPv4 outside", v4, "10.8.1.1", false},
			{"IPv4-mapped inside", v4, "::ffff:10.9.1.1", true},
			{"IPv4-mapped outside", v4, "::ffff:10.8.1.1", false},
			{"IPv6 against IPv4 networks", v4, "2001:db8::1", false},
			{"IPv6 inside", v6, "2001:db8:ffff::1", true},
			{"IPv6 outside", v6, "2001:db9::1", false},
			{"IPv4 against IPv6 networks", v6, "10.9.1.1", false},
			{"the second of several", several, "198.51.100.7", true},
			{"the IPv6 one of several", several, "2001:db8:1::5", true},
			{"outside all of several", several, "203.0.113.1", false},
			{"next to an IPv6 one of several", several, "2001:db8:2::1", false},
			{"no networks, IPv4", open, "203.0.113.1", true},
			{"no networks, IPv6", open, "2001:db8::1", true},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				id, secret, _ := format.Parse(tc.key)
				k, ok, err := v.VerifyParsed(context.Background(), id, secret, netip.MustParseAddr(tc.from))
				if err != nil || ok != tc.ok {
					t.Fatalf("VerifyParsed from %s = %v, %v; want %v, nil", tc.from, ok, err, tc.ok)
				}
				if ok && (k.ID != id || !k.AllowsAddr(netip.MustParseAddr(tc.from))) {
					t.Errorf("VerifyParsed from %s = %+v; want key %s, allowing the address", tc.from, k, id)
				}
			})
		}
		t.Run(name+"/no address", func(t *testing.T) {
			// The zero address skips the check: the caller checks, with AllowsAddr.
			id, secret, _ := format.Parse(v4)
			k, ok, err := v.VerifyParsed(context.Background(), id, secret, netip.Addr{})
			if err != nil || !ok || !slices.Equal(k.AllowedCIDRs, prefixes(t, "10.9.0.0/16")) {
				t.Fatalf("VerifyParsed without an address = %+v, %v, %v; want the key with its networks", k, ok, err)
			}
			if k.AllowsAddr(netip.MustParseAddr("10.8.1.1")) {
				t.Error("the key found without an address allows 10.8.1.1")
			}
		})
	}
}

func TestABatchChecksEachRequestsAddressAgainstItsOwnKey(t *testing.T) {
	// A batch pairs each digest with its request's address: a key asked from inside
	// and outside its networks in one batch is found (the caller refuses the request
	// from outside, with AllowsAddr), one asked only from outside is not, even when
	// another key of the batch is asked from inside its networks.
	store, keys := restrictedKeys(t, []string{"10.9.0.0/16"}, []string{"10.9.0.0/16"}, nil)
	format := keystoretest.Format(t, "mon")
	type request struct {
		key  string
		from string
	}
	inside, outside := "10.9.1.1", "203.0.113.1"
	idOf := func(full string) string { id, _, _ := format.Parse(full); return id }
	for _, tc := range []struct {
		name     string
		requests []request
		found    []string
	}{
		{"one key, inside and outside", []request{{keys[0], outside}, {keys[0], inside}}, []string{idOf(keys[0])}},
		{"one key, outside twice", []request{{keys[0], outside}, {keys[0], "10.8.0.1"}}, nil},
		{"another key inside", []request{{keys[0], outside}, {keys[1], inside}}, []string{idOf(keys[1])}},
		{"an open key from the restricted one's network", []request{{keys[0], outside}, {keys[2], inside}}, []string{idOf(keys[2])}},
		{"IPv4-mapped inside", []request{{keys[0], "::ffff:" + inside}, {keys[1], outside}}, []string{idOf(keys[0])}},
	} {
		// The same requests padded with unknown ids: an IN list, and beyond it `= ANY`.
		for _, size := range []int{len(tc.requests), 9, 70} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, size), func(t *testing.T) {
				var ids []string
				var sums [][]byte
				var addrs []netip.Addr
				for i := range size {
					id, secret := strings.Repeat("Q", 18)+fmt.Sprint(1000+i), "unknown"
					addr := netip.MustParseAddr(inside)
					if i < len(tc.requests) {
						id, secret, _ = format.Parse(tc.requests[i].key)
						addr = netip.MustParseAddr(tc.requests[i].from)
					}
					sum := keystore.HashSecret(secret)
					ids, sums, addrs = append(ids, id), append(sums, sum[:]), append(addrs, addr)
				}
				want := slices.Sorted(slices.Values(tc.found))
				for range 7 { // PostgreSQL plans the first five executions on their own
					got, err := store.LookupFrom(context.Background(), ids, sums, addrs)
					if err != nil || !slices.Equal(got, want) {
						t.Fatalf("LookupFrom = %v, %v; want %v", got, err, want)
					}
				}
			})
		}
	}
}

func TestConcurrentRequestsOfOneKeyFromTwoAddressesEachGetTheirOwnAnswer(t *testing.T) {
	// Whatever batches the Batcher makes of them, a request from inside the key's
	// networks is accepted, and one from outside is refused: by the lookup, or by
	// AllowsAddr on the key a batch partner's address found.
	store, keys := restrictedKeys(t, []string{"10.9.0.0/16"})
	b := keystore.NewBatcher(store, keystore.BatcherOptions{Lanes: 1})
	id, secret, _ := keystoretest.Format(t, "mon").Parse(keys[0])
	var wg sync.WaitGroup
	for i := range 200 {
		from := netip.MustParseAddr("10.9.1.1")
		if i%2 == 1 {
			from = netip.MustParseAddr("10.8.1.1")
		}
		wg.Go(func() {
			k, ok, err := b.VerifyParsed(context.Background(), id, secret, from)
			if err != nil {
				t.Errorf("VerifyParsed from %s: %v", from, err)
				return
			}
			if accepted, want := ok && k.AllowsAddr(from), i%2 == 0; accepted != want {
				t.Errorf("request %d from %s: accepted %v, want %v", i, from, accepted, want)
			}
		})
	}
	wg.Wait()
}

func TestDenialsFindOnlyLiveKeysWithNetworksAndTheirSecret(t *testing.T) {
	// The second look after a refusal: a live key with allowed networks and the right
	// secret was refused for its address; anything else was refused for itself.
	ctx := context.Background()
	store, pool, org := newStore(t, "pro")
	restricted := keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, AllowedCIDRs: prefixes(t, "10.9.0.0/16")}
	live, liveKey := create(t, store, restricted)
	revoked, revokedKey := create(t, store, restricted)
	if _, err := store.Revoke(ctx, org, revoked.ID, "test"); err != nil {
		t.Fatal(err)
	}
	expired, expiredKey := create(t, store, restricted)
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 ms' WHERE key_id = $1`, expired.ID); err != nil {
		t.Fatal(err)
	}
	_, openKey := create(t, store, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	format := keystoretest.Format(t, "mon")
	id, secret, _ := format.Parse(liveKey)
	wrong := keystore.HashSecret("x")
	d := keystore.NewDenials(store, 10*time.Second)
	for _, tc := range []struct {
		name       string
		id, secret string
		denied     bool
	}{
		{"a live key with networks", id, secret, true},
		{"its id with another secret", id, string(wrong[:4]) + secret[4:], false},
		{"a revoked key with networks", parsedID(format, revokedKey), parsedSecret(format, revokedKey), false},
		{"an expired key with networks", parsedID(format, expiredKey), parsedSecret(format, expiredKey), false},
		{"a live key without networks", parsedID(format, openKey), parsedSecret(format, openKey), false},
		{"an unknown key", strings.Repeat("Q", 22), secret, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, ok, err := d.Denied(ctx, tc.id, tc.secret)
			if err != nil || ok != tc.denied {
				t.Fatalf("Denied = %+v, %v, %v; want %v, nil", k, ok, err, tc.denied)
			}
			if ok && (k.ID != live.ID || k.OrgID != org) {
				t.Errorf("Denied = %+v; want key %s of org %s", k, live.ID, org)
			}
		})
	}
	t.Run("concurrently", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 100 {
			key, want := liveKey, true
			if i%2 == 1 {
				key, want = openKey, false
			}
			wg.Go(func() {
				if _, ok, err := d.Denied(ctx, parsedID(format, key), parsedSecret(format, key)); err != nil || ok != want {
					t.Errorf("Denied of request %d = %v, %v; want %v", i, ok, err, want)
				}
			})
		}
		wg.Wait()
	})
}

func parsedID(f keystore.Format, full string) string     { id, _, _ := f.Parse(full); return id }
func parsedSecret(f keystore.Format, full string) string { _, s, _ := f.Parse(full); return s }
