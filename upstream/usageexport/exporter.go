// Package usageexport sends the usage record to the operator's metering or billing
// system as CloudEvents (docs/operations.md, Usage export). Once a minute has
// settled, each key's minute becomes one event; what a minute gains later (a gateway
// that flushed late) becomes a further event of the difference. Events wait in
// PostgreSQL's outbox (package store) until the receiver answers 2xx, and go out in
// batches, signed as webhooks are (package webhook) when a secret is set.
package usageexport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"

	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// The defaults and bounds of serve's --usage-export-* flags.
const (
	DefaultDelay      = 2 * time.Minute
	DefaultInterval   = 10 * time.Second
	DefaultBatchSize  = 100
	MaxBatchSize      = 1000
	DefaultTimeout    = 10 * time.Second
	DefaultBackoff    = 5 * time.Second
	DefaultBackoffMax = 10 * time.Minute
)

// The results of an attempt's events, as Observer counts them.
const (
	ResultDelivered = "delivered" // the receiver answered 2xx
	ResultRetrying  = "retrying"  // it did not; the events are tried again later
)

// Observer counts the events of attempts by result. httpapi.Metrics is one.
type Observer interface {
	UsageExportEvents(result string, n int)
}

// Config is where an Exporter sends, and how.
type Config struct {
	// URL is the receiver. It must pass Policy.CheckURL.
	URL string
	// Secret, a whsec_ secret, signs each batch as webhooks are signed; "" sends
	// them unsigned.
	Secret string
	// Token, when set, is sent as Authorization: Bearer.
	Token string
	// Delay is how long after its end a minute is settled, and exported.
	Delay time.Duration
	// Interval is how often the exporter cuts settled minutes and sends what is due.
	Interval time.Duration
	// BatchSize is the most events one POST carries.
	BatchSize int
	// Timeout bounds an attempt, from the dial to the answer's end.
	Timeout time.Duration
	// Backoff is the wait after an event's first failed attempt; each further failure
	// doubles it, up to BackoffMax.
	Backoff, BackoffMax time.Duration
	// Policy is what the receiver's addresses may be, as for webhooks.
	Policy webhook.Policy
}

// Exporter cuts settled minutes into events and delivers them. Several exporters, in
// one process or many, share one database: one cuts at a time, and each batch of
// events is claimed by one of them at a time. Build it with New.
type Exporter struct {
	store    *store.Store
	cfg      Config
	client   *http.Client
	logger   *zap.Logger
	observer Observer // may be nil
	// Now is the clock of settlement, claims and backoff; a seam for tests.
	Now func() time.Time
	// Tracer makes the span of each attempt, the root of a trace of its own
	// (docs/operations.md, Tracing). Default: one that records nothing.
	Tracer trace.Tracer
}

// TracerName is the instrumentation scope of the attempts' spans.
const TracerName = "github.com/keygate/keygate/upstream/usageexport"

// New returns an Exporter on st that sends as cfg says. observer may be nil.
func New(st *store.Store, cfg Config, logger *zap.Logger, observer Observer) *Exporter {
	return &Exporter{store: st, cfg: cfg, client: cfg.Policy.Client(cfg.Timeout), logger: logger, observer: observer,
		Now: time.Now, Tracer: noop.NewTracerProvider().Tracer(TracerName)}
}

// Run exports until ctx ends: every Interval it cuts what has settled, then sends
// what is due until nothing is or an attempt fails (the receiver is then left alone
// until the next interval). Claims it holds when ctx ends are given back.
func (e *Exporter) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	started := false
	for {
		if !started {
			err := e.Start(ctx)
			if err != nil && ctx.Err() == nil {
				e.logger.Error("starting the usage export", zap.Error(err))
			}
			started = err == nil
		}
		if started {
			e.RunOnce(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Start makes the export's position in the database, unless an exporter made it
// before: the first export begins with the current minute.
func (e *Exporter) Start(ctx context.Context) error {
	return e.store.StartUsageExport(ctx, e.Now())
}

// RunOnce cuts, then delivers batches until nothing is due or an attempt fails.
func (e *Exporter) RunOnce(ctx context.Context) {
	if _, err := e.Cut(ctx); err != nil && ctx.Err() == nil {
		e.logger.Error("cutting usage events", zap.Error(err))
	}
	for ctx.Err() == nil {
		n, delivered, err := e.Deliver(ctx)
		if err != nil && ctx.Err() == nil {
			e.logger.Error("exporting usage events", zap.Error(err))
		}
		if n == 0 || !delivered || err != nil {
			return
		}
	}
}

// settled returns the last minute settled at now: it ended Delay ago or earlier.
func (e *Exporter) settled(now time.Time) time.Time {
	return now.Add(-time.Minute - e.cfg.Delay)
}

// Cut writes the events of the settled minutes into the outbox (store.CutUsage) and
// returns how many.
func (e *Exporter) Cut(ctx context.Context) (int, error) {
	now := e.Now()
	res, err := e.store.CutUsage(ctx, store.UsageCut{Now: now, Settled: e.settled(now), Encode: encode})
	if !res.SkippedFrom.IsZero() {
		e.logger.Error("usage export resumed after a stop longer than the purge waits: earlier minutes are not exported",
			zap.Time("skipped_from", res.SkippedFrom), zap.Time("skipped_to", res.SkippedTo))
	}
	return res.Events, err
}

// Deliver claims up to BatchSize due events, sends them in one POST, and records
// what came of it. It returns how many it claimed and whether the receiver took them.
// When ctx ends mid-attempt, the events are given back, not counted. The attempt is a
// span of its own, with the queries that record it as its children; neither holds the
// URL, which may carry a credential.
func (e *Exporter) Deliver(ctx context.Context) (n int, delivered bool, err error) {
	lease, events, err := e.store.ClaimExportEvents(ctx, e.Now(), e.cfg.Timeout+20*time.Second, e.cfg.BatchSize)
	if err != nil || len(events) == 0 {
		return 0, false, err
	}
	ctx, span := e.Tracer.Start(ctx, "usage export", trace.WithNewRoot(), trace.WithAttributes(
		attribute.Int("keygate.usage_export.events", len(events)),
		attribute.Int("keygate.usage_export.attempt", events[0].Attempts+1)))
	defer span.End()
	status, why := e.post(ctx, events)
	if status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if ctx.Err() != nil {
		// Stopping: the attempt was cut short by us, not by the receiver.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return len(events), false, e.store.ReleaseExportEvents(bg, lease, e.Now())
	}
	if why == "" {
		span.SetAttributes(attribute.String("keygate.usage_export.result", ResultDelivered))
		_, err := e.store.ExportDelivered(ctx, lease)
		e.observe(ResultDelivered, len(events))
		return len(events), true, err
	}
	span.SetAttributes(attribute.String("keygate.usage_export.result", ResultRetrying))
	span.SetStatus(codes.Error, why)
	e.observe(ResultRetrying, len(events))
	e.logger.Warn("usage export attempt failed; its events are tried again later", zap.String("error", why),
		zap.Int("events", len(events)), zap.Int("attempts_before", events[0].Attempts))
	return len(events), false, e.store.ExportFailed(ctx, lease, e.Now(), e.cfg.Backoff, e.cfg.BackoffMax, why)
}

func (e *Exporter) observe(result string, n int) {
	if e.observer != nil {
		e.observer.UsageExportEvents(result, n)
	}
}

// post sends events as one batch and returns the receiver's status, 0 without an
// answer, and why the batch is not delivered: "" when it answered 2xx within Timeout.
func (e *Exporter) post(ctx context.Context, events []store.ExportEvent) (status int, why string) {
	body := batch(events)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, "the URL is malformed"
	}
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set("User-Agent", "keygate-usage-export/1")
	if e.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+e.cfg.Token)
	}
	if e.cfg.Secret != "" {
		id, ts := batchID(events), e.Now().Unix()
		sig, err := webhook.Sign([]string{e.cfg.Secret}, id, ts, body)
		if err != nil {
			return 0, "the secret is malformed"
		}
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("webhook-signature", sig)
	}
	res, err := e.client.Do(req)
	if err != nil {
		return 0, describe(err)
	}
	// The body is read, up to a bound, so that the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return res.StatusCode, "status " + strconv.Itoa(res.StatusCode)
	}
	return res.StatusCode, ""
}

// batch returns events as a JSON array, in their order.
func batch(events []store.ExportEvent) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, ev := range events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(ev.Body)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// batchID returns the webhook-id of a batch: "msg_" and a digest of its events' ids,
// so that a batch sent again as it was carries the same id.
func batchID(events []store.ExportEvent) string {
	h := sha256.New()
	for _, ev := range events {
		h.Write([]byte(ev.ID))
		h.Write([]byte{'\n'})
	}
	return "msg_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// describe says why an attempt got no answer. It leaves the URL out, which may carry
// a credential.
func describe(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, webhook.ErrRefusedAddress):
		return "refused: the destination address is not public (--webhook-allow-private allows it)"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout: no answer in time"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return strings.TrimSpace(fmt.Sprint(err))
}

// Lag returns the age of the oldest settled minute whose counts the receiver has not
// all taken, counted from when it settled; 0 when there is none.
func (e *Exporter) Lag(ctx context.Context) (time.Duration, error) {
	now := e.Now()
	m, ok, err := e.store.OldestUnexported(ctx, e.settled(now))
	if err != nil || !ok {
		return 0, err
	}
	return max(now.Sub(m.Add(time.Minute+e.cfg.Delay)), 0), nil
}
