package cli

import (
	"flag"
	"net/url"
	"strings"

	"github.com/keygate/keygate/upstream/usageexport"
	"github.com/keygate/keygate/upstream/webhook"
)

// exportFlags adds serve's --usage-export-* flags to fs, parsed into cfg.
func (c *cli) exportFlags(fs *flag.FlagSet, cfg *usageexport.Config) {
	fs.StringVar(&cfg.URL, "usage-export-url", "", "send the usage record to this `URL` as CloudEvents, one event per key and settled minute; https, or http with --webhook-allow-http, and a public address unless --webhook-allow-private (default: no export)")
	fs.StringVar(&cfg.Secret, "usage-export-secret", c.getenv("USAGE_EXPORT_SECRET"), "whsec_ `secret` that signs each batch as webhooks are signed (env USAGE_EXPORT_SECRET; default: unsigned)")
	fs.StringVar(&cfg.Token, "usage-export-token", c.getenv("USAGE_EXPORT_TOKEN"), "`token` sent as Authorization: Bearer with each batch (env USAGE_EXPORT_TOKEN; default: none)")
	fs.DurationVar(&cfg.Delay, "usage-export-delay", usageexport.DefaultDelay, "how long after its end a minute is settled and exported; later counts go as a further event")
	fs.DurationVar(&cfg.Interval, "usage-export-interval", usageexport.DefaultInterval, "how often the export looks for settled minutes and events that are due")
	fs.IntVar(&cfg.BatchSize, "usage-export-batch-size", usageexport.DefaultBatchSize, "most events in one POST, at most 1000")
	fs.DurationVar(&cfg.Timeout, "usage-export-timeout", usageexport.DefaultTimeout, "bound on one POST, from the connection to the answer")
	fs.DurationVar(&cfg.Backoff, "usage-export-backoff", usageexport.DefaultBackoff, "wait after an event's first failed attempt; doubled after each further one")
	fs.DurationVar(&cfg.BackoffMax, "usage-export-backoff-max", usageexport.DefaultBackoffMax, "longest wait between an event's attempts")
}

// checkExportBounds checks the numbers of the export's flags.
func checkExportBounds(cfg usageexport.Config) error {
	switch {
	case cfg.Delay < 0:
		return usageErrorf("--usage-export-delay must not be negative")
	case cfg.Interval <= 0:
		return usageErrorf("--usage-export-interval must be positive")
	case cfg.BatchSize < 1 || cfg.BatchSize > usageexport.MaxBatchSize:
		return usageErrorf("--usage-export-batch-size must be from 1 to %d", usageexport.MaxBatchSize)
	case cfg.Timeout <= 0:
		return usageErrorf("--usage-export-timeout must be positive")
	case cfg.Backoff <= 0:
		return usageErrorf("--usage-export-backoff must be positive")
	case cfg.BackoffMax < cfg.Backoff:
		return usageErrorf("--usage-export-backoff-max must be at least --usage-export-backoff")
	}
	return nil
}

// checkExport checks the export's URL and secret, when there is a URL. The URL follows
// the rules of webhook URLs under policy, the webhooks' own: its host is resolved
// now, and every connection is checked again.
func (c *cli) checkExport(cfg *usageexport.Config, policy webhook.Policy) error {
	cfg.Policy = policy
	if cfg.URL == "" {
		return nil
	}
	if err := policy.CheckURL(c.ctx, cfg.URL); err != nil {
		return usageErrorf("--usage-export-url: %v", err)
	}
	if s := cfg.Secret; s != "" {
		// 24 bytes are 32 characters of base64.
		if _, err := webhook.Sign([]string{s}, "", 0, nil); err != nil || len(strings.TrimPrefix(s, webhook.SecretPrefix)) < 32 {
			return usageErrorf("--usage-export-secret must be %s and the base64 of at least 24 bytes", webhook.SecretPrefix)
		}
	}
	return nil
}

// exportHost returns the host of an export URL, for the log: the rest may carry a
// credential.
func exportHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}
