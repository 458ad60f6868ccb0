-- 010_webhook_fairness: what the dispatcher needs to share its attempts fairly
-- between organisations and endpoints, the test events' limit, an endpoint disabled
-- because its receiver answered 410 Gone, and leak reports' URLs without the keys in
-- them (docs/webhooks.md).
--
-- It only adds, and narrows nothing the release before it writes: that release's
-- dispatcher claims without the limits, its test route without the count, and it
-- writes leak URLs as reported until it is replaced. It locks webhook_deliveries
-- while it builds the two indexes, a pause of the dispatchers' claims only.

-- The attempts in flight are the pending deliveries whose lease is set; a claim
-- counts them per endpoint.
CREATE INDEX webhook_deliveries_leased_idx ON webhook_deliveries (endpoint_id) WHERE lease IS NOT NULL;

-- A claim takes each endpoint's due deliveries, oldest first, a few at a time.
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at, id)
	WHERE state = 'pending';

-- tests_since starts the minute in which tests_sent test events were written for the
-- endpoint (POST …/webhooks/{id}/test), a fixed window per endpoint.
ALTER TABLE webhook_endpoints
	ADD COLUMN tests_since timestamptz,
	ADD COLUMN tests_sent  integer NOT NULL DEFAULT 0 CHECK (tests_sent >= 0);

-- disabled_reason 'gone': the receiver answered 410 Gone.
ALTER TABLE webhook_endpoints
	DROP CONSTRAINT webhook_endpoints_disabled_reason_check,
	ADD CONSTRAINT webhook_endpoints_disabled_reason_check CHECK (disabled_reason IN ('user', 'failing', 'gone'));

-- A leak report's URL is stored with the secret of any key in it replaced by REDACTED,
-- as keystore.Redact does; so are the URLs stored before, in the audit trail and in
-- the key.leaked events' bodies.
UPDATE audit_events SET url = regexp_replace(url, '(_live_[a-z0-9]{16,64})\.[a-z0-9_-]+', '\1.REDACTED', 'gi')
WHERE action = 'key.leaked' AND url ~* '_live_[a-z0-9]{16,64}\.';
UPDATE webhook_events SET body = regexp_replace(body, '(_live_[a-z0-9]{16,64})\.[a-z0-9_-]+', '\1.REDACTED', 'gi')
WHERE type = 'key.leaked' AND body ~* '_live_[a-z0-9]{16,64}\.';
