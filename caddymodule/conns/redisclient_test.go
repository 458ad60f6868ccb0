package conns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNewRedisClientModes checks that each redis_mode builds its kind of client from
// go-redis's own URL parser. A bad combination is an error naming the option.
// Nothing is dialed: go-redis connects on the first command.
func TestNewRedisClientModes(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mode, url, ca string
		wantType            string
		wantErr             string
	}{
		{"default is single", "", "redis://127.0.0.1:6379/0", "", "*redis.Client", ""},
		{"single", "single", "rediss://127.0.0.1:6379/0", "", "*redis.Client", ""},
		{"cluster", "cluster", "redis://127.0.0.1:7001?addr=127.0.0.1:7002", "", "*redis.ClusterClient", ""},
		{"sentinel", "sentinel", "redis://127.0.0.1:26379?master_name=mymaster&addr=127.0.0.1:26380", "", "*redis.Client", ""},
		{"sentinel without master_name", "sentinel", "redis://127.0.0.1:26379", "", "", "needs ?master_name="},
		{"unknown mode", "ring", "redis://127.0.0.1:6379", "", "", `redis_mode "ring"`},
		{"bad url", "cluster", "http://127.0.0.1:7001", "", "", "parsing redis_url (cluster)"},
		{"missing CA file", "single", "rediss://127.0.0.1:6379", filepath.Join(dir, "absent.pem"), "", "redis_tls_ca: open"},
		{"CA file without a certificate", "cluster", "rediss://127.0.0.1:7001", notPEM, "", "redis_tls_ca " + notPEM + ": no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := NewRedisClient(tc.mode, tc.url, tc.ca, time.Second, time.Second)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var typ string
			switch c.(type) {
			case *redis.Client:
				typ = "*redis.Client"
			case *redis.ClusterClient:
				typ = "*redis.ClusterClient"
			}
			if typ != tc.wantType {
				t.Errorf("client %T, want %s", c, tc.wantType)
			}
		})
	}
}
