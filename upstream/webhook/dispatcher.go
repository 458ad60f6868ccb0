package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/store"
)

// Timeout is how long a receiver has to answer an attempt with a 2xx.
const Timeout = 10 * time.Second

// Schedule is the wait after each failed attempt before the next: after the first,
// 5 seconds; after the seventh, 10 hours. An eighth failure fails the delivery,
// about 27.6 hours after the event (docs/webhooks.md).
var Schedule = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour,
}

// MaxAttempts is how many attempts a delivery gets from the schedule.
var MaxAttempts = len(Schedule) + 1

// DisableAfter is how long an endpoint may fail every attempt before it is disabled.
const DisableAfter = 72 * time.Hour

// DefaultPoll is how often serve's dispatcher looks for deliveries that are due.
const DefaultPoll = time.Second

// lease is how long a claim is held: longer than an attempt can take.
const lease = Timeout + 20*time.Second

// The results of an attempt, as Observer counts them.
const (
	ResultDelivered = "delivered"
	ResultRetrying  = "retrying"
	ResultFailed    = "failed"
)

// Observer counts attempts by result. httpapi.Metrics is one.
type Observer interface {
	WebhookAttempt(result string)
}

// The default shares of the attempts (Dispatcher).
const (
	DefaultSlots       = 20
	DefaultPerOrg      = 4
	DefaultPerEndpoint = 2
)

// Dispatcher delivers the outbox's events. Several dispatchers, in one process or
// many, share one database: each delivery is claimed by one of them at a time
// (store.ClaimDeliveries). Build it with NewDispatcher.
type Dispatcher struct {
	store    *store.Store
	keys     *keystore.Store // the usage record, for the quota thresholds
	logger   *zap.Logger
	observer Observer // may be nil
	client   *http.Client
	// Now is the clock of the schedule, the leases and the notices; a seam for tests.
	Now func() time.Time
	// Tracer makes the span of each delivery attempt, the root of a trace of its own
	// (docs/operations.md, Tracing). Default: one that records nothing.
	Tracer trace.Tracer
	// Slots is the most attempts this dispatcher makes at once. Default: 20.
	Slots int
	// PerOrg is the most attempts in flight to one organisation's endpoints, and
	// PerEndpoint to one endpoint, counting every dispatcher's: a receiver that is
	// slow holds its share, never the others'. Default: 4 and 2.
	PerOrg, PerEndpoint int
}

// NewDispatcher returns a Dispatcher on st whose connections follow policy. keys reads
// the usage record for the quota thresholds; observer may be nil.
func NewDispatcher(st *store.Store, keys *keystore.Store, policy Policy, logger *zap.Logger, observer Observer) *Dispatcher {
	return &Dispatcher{
		store: st, keys: keys, logger: logger, observer: observer, Now: time.Now,
		Slots: DefaultSlots, PerOrg: DefaultPerOrg, PerEndpoint: DefaultPerEndpoint,
		Tracer: noop.NewTracerProvider().Tracer(TracerName),
		client: policy.Client(Timeout),
	}
}

// NoticeEvery is how often Run looks for the notices that are due and purges (Notices):
// they are days apart, and the look reads every key that expires within a week.
const NoticeEvery = time.Minute

// Run delivers until ctx ends: it attempts what is due as its slots free up, and
// looks again every poll when nothing was; every NoticeEvery it writes the notices
// that are due. Claims it holds when ctx ends are given back.
func (d *Dispatcher) Run(ctx context.Context, poll time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		t := time.NewTicker(NoticeEvery)
		defer t.Stop()
		for {
			if err := d.Notices(ctx); err != nil && ctx.Err() == nil {
				d.logger.Error("writing webhook notices", zap.Error(err))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	slots := Slots[store.Claim]{Size: d.Slots, Poll: poll, Claim: d.claim, Send: d.deliver,
		Failed: func(err error) { d.logger.Error("delivering webhooks", zap.Error(err)) }}
	slots.Run(ctx)
}

// Notices writes the events that fire once and are due now: the keys' expiry and the
// organisations' quota thresholds. It also deletes the events past their retention
// (store.PurgeWebhooks).
func (d *Dispatcher) Notices(ctx context.Context) error {
	now := d.Now()
	if _, err := d.store.PurgeWebhooks(ctx, now); err != nil {
		return err
	}
	if _, err := d.store.ExpiryNotices(ctx, now); err != nil {
		return err
	}
	orgs, err := d.store.QuotaOrgs(ctx, now)
	if err != nil {
		return err
	}
	for _, o := range orgs {
		used, err := d.keys.MonthUsed(ctx, o.ID, now)
		if err != nil {
			return err
		}
		if _, err := d.store.QuotaNotices(ctx, o, used, now); err != nil {
			return err
		}
	}
	return nil
}

// claim claims up to n deliveries due now, within the dispatcher's shares.
func (d *Dispatcher) claim(ctx context.Context, n int) ([]store.Claim, error) {
	return d.store.ClaimDeliveries(ctx, d.Now(), lease, store.Shares{Slots: n, PerOrg: d.PerOrg, PerEndpoint: d.PerEndpoint})
}

// RunOnce claims what is due now, within the shares and up to Slots, attempts it,
// and records each outcome when all are done. It returns how many it claimed. When
// ctx ends, the attempts in flight are given back, not counted. It is one round of
// Run, which does not wait for a round to end, for tests and tools.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	claims, err := d.claim(ctx, d.Slots)
	if err != nil || len(claims) == 0 {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() { d.deliver(ctx, c) })
	}
	wg.Wait()
	return len(claims), nil
}

// TracerName is the instrumentation scope of the deliveries' spans.
const TracerName = "github.com/keygate/keygate/upstream/webhook"

// deliver makes c's attempt and records it, in a span of its own: the receiver's
// answer and the recording's queries are its children. Its attributes name the
// endpoint, the event and the attempt, never the URL, which may hold a token of
// the receiver's. A failed attempt is tried again after the schedule's wait from
// the attempt's end, so that a slow failure does not eat the wait.
func (d *Dispatcher) deliver(ctx context.Context, c store.Claim) {
	ctx, span := d.Tracer.Start(ctx, "webhook delivery", trace.WithNewRoot(), trace.WithAttributes(
		attribute.String("keygate.org_id", c.OrgID), attribute.String("keygate.webhook.id", c.EndpointID),
		attribute.String("keygate.webhook.event_id", c.EventID), attribute.Int64("keygate.webhook.delivery_id", c.DeliveryID),
		attribute.Int("keygate.webhook.attempt", c.Attempts+1)))
	defer span.End()
	o := d.attempt(ctx, c)
	if ctx.Err() != nil {
		// Stopping: the attempt was cut short by us, not by the receiver.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := d.store.ReleaseClaim(bg, c, d.Now()); err != nil {
			d.logger.Warn("giving back a webhook delivery", zap.Int64("delivery_id", c.DeliveryID), zap.Error(err))
		}
		return
	}
	result := ResultDelivered
	if !o.Delivered {
		if c.Attempts+1 < MaxAttempts {
			o.RetryAt = d.Now().Add(Schedule[c.Attempts])
			result = ResultRetrying
		} else {
			result = ResultFailed
		}
	}
	span.SetAttributes(attribute.String("keygate.webhook.result", result))
	if o.StatusCode != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", o.StatusCode))
	}
	if !o.Delivered {
		span.SetStatus(codes.Error, cmp.Or(o.Error, "answered "+strconv.Itoa(o.StatusCode)))
	}
	o.DisableAfter = DisableAfter
	o.Gone = o.StatusCode == http.StatusGone
	disabled, err := d.store.RecordAttempt(ctx, c, o)
	if err != nil {
		d.logger.Error("recording a webhook attempt", zap.Int64("delivery_id", c.DeliveryID), zap.Error(err))
		return
	}
	if d.observer != nil {
		d.observer.WebhookAttempt(result)
	}
	switch {
	case disabled && o.Gone:
		d.logger.Warn("webhook endpoint disabled: its receiver answered 410 Gone",
			zap.String("org_id", c.OrgID), zap.String("webhook_id", c.EndpointID))
	case disabled:
		d.logger.Warn("webhook endpoint disabled: every attempt failed for 3 days",
			zap.String("org_id", c.OrgID), zap.String("webhook_id", c.EndpointID))
	}
}

// attempt POSTs c's body to its URL, signed, and returns what came of it.
func (d *Dispatcher) attempt(ctx context.Context, c store.Claim) store.Outcome {
	at := d.Now()
	o := store.Outcome{Attempt: store.Attempt{At: at}}
	sig, err := Sign(c.Secrets, c.EventID, at.Unix(), c.Body)
	if err != nil {
		o.Error = "the endpoint's secret is malformed"
		return o
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, nil)
	if err != nil {
		o.Error = "the endpoint's URL is malformed"
		return o
	}
	req.Body = io.NopCloser(bytes.NewReader(c.Body))
	req.ContentLength = int64(len(c.Body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(c.Body)), nil }
	req.Header = http.Header{
		"Content-Type":      {"application/json"},
		"User-Agent":        {"keygate-webhooks/1"},
		"Webhook-Id":        {c.EventID},
		"Webhook-Timestamp": {strconv.FormatInt(at.Unix(), 10)},
		"Webhook-Signature": {sig},
	}
	start := time.Now()
	res, err := d.client.Do(req)
	if err != nil {
		o.Duration = time.Since(start)
		o.Error = describe(err)
		return o
	}
	// The body is read, up to a bound, so that the connection can be reused; it is
	// not kept.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	o.Duration = time.Since(start)
	o.StatusCode = res.StatusCode
	o.Delivered = res.StatusCode >= 200 && res.StatusCode < 300
	return o
}

// describe says why an attempt got no answer, in words safe to show the org.
func describe(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, ErrRefusedAddress):
		return "refused: the destination address is not public"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout: no answer within 10s"
	case strings.Contains(err.Error(), "response headers exceeded"):
		return "the answer's header is over 16 KiB"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "the host name does not resolve"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return "connection failed"
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return "the TLS certificate is not trusted"
	}
	return "the request failed"
}
