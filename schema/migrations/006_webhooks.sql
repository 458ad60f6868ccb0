-- 006_webhooks: an organisation's webhook endpoints, the events written for them in
-- the same transaction as the change that causes them (the outbox), and each
-- delivery's attempts (docs/webhooks.md).

-- webhook_endpoints are at most 10 per org (checked by the store under the org's
-- lock). secret is the whsec_ text the org signs with; previous_secret keeps signing
-- beside it until previous_expires_at, after a rotation. events empty means every
-- type. failing_since is the first failed attempt since the last delivered one; an
-- endpoint failing for 3 days is disabled with disabled_reason 'failing'.
CREATE TABLE webhook_endpoints (
	id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	org_id              uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	url                 text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
	description         text NOT NULL DEFAULT '' CHECK (length(description) <= 500),
	events              text[] NOT NULL DEFAULT '{}' CHECK (array_position(events, NULL) IS NULL),
	secret              text NOT NULL CHECK (secret LIKE 'whsec\_%'),
	previous_secret     text CHECK (previous_secret LIKE 'whsec\_%'),
	previous_expires_at timestamptz,
	enabled             boolean NOT NULL DEFAULT true,
	disabled_reason     text CHECK (disabled_reason IN ('user', 'failing')),
	failing_since       timestamptz,
	created_at          timestamptz NOT NULL DEFAULT now(),
	updated_at          timestamptz NOT NULL DEFAULT now(),
	CHECK (enabled = (disabled_reason IS NULL))
);
CREATE INDEX webhook_endpoints_org_idx ON webhook_endpoints (org_id, created_at, id);

-- webhook_events is the outbox: one row per event, with the exact body every attempt
-- sends and signs. id is the webhook-id header, the same on every retry.
CREATE TABLE webhook_events (
	id         text PRIMARY KEY CHECK (id ~ '^msg_[0-9a-f]{32}$'),
	org_id     uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	type       text NOT NULL,
	body       text NOT NULL,
	created_at timestamptz NOT NULL
);

-- webhook_deliveries is one event for one endpoint. A dispatcher claims a pending row
-- whose next_attempt_at has come by moving next_attempt_at past its lease and setting
-- lease; only the holder of that lease records the attempt.
CREATE TABLE webhook_deliveries (
	id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id        text NOT NULL REFERENCES webhook_events (id) ON DELETE CASCADE,
	endpoint_id     uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
	state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
	attempts        integer NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL,
	lease           uuid,
	created_at      timestamptz NOT NULL,
	finished_at     timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, id DESC);

-- webhook_attempts is one POST of a delivery: the status it got, or why none.
CREATE TABLE webhook_attempts (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	delivery_id bigint NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
	at          timestamptz NOT NULL,
	status_code integer,
	error       text,
	duration_ms integer NOT NULL CHECK (duration_ms >= 0),
	CHECK ((status_code IS NULL) <> (error IS NULL))
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, id);

-- webhook_notices records the events that fire once: a key's expiring (7d, 1d) and
-- expired, and an org's quota thresholds per month. subject is the key id or the
-- org's month ('2026-11'); the primary key makes a second firing a no-op.
CREATE TABLE webhook_notices (
	org_id  uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	kind    text NOT NULL,
	subject text NOT NULL,
	at      timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (org_id, kind, subject)
);

-- api_keys_expiry_idx serves the dispatcher's look, once a minute, for the live keys
-- that expire within a week or expired within a day.
CREATE INDEX api_keys_expiry_idx ON api_keys (expires_at) WHERE revoked_at IS NULL AND expires_at IS NOT NULL;

-- webhook_enqueue writes an event of org for every enabled endpoint of it that takes
-- the type (only, when given, for that one endpoint whatever its types) and returns
-- its id; NULL when no endpoint takes it, and then nothing is written. It runs in the
-- caller's transaction: the event exists exactly when the change does.
CREATE FUNCTION webhook_enqueue(org uuid, event_type text, data jsonb, at timestamptz, only_endpoint uuid DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	eid text := 'msg_' || replace(gen_random_uuid()::text, '-', '');
	n   integer;
BEGIN
	SELECT count(*) INTO n FROM webhook_endpoints e
	WHERE e.org_id = org AND e.enabled
	  AND (only_endpoint IS NULL OR e.id = only_endpoint)
	  AND (only_endpoint IS NOT NULL OR cardinality(e.events) = 0 OR event_type = ANY (e.events));
	IF n = 0 THEN
		RETURN NULL;
	END IF;
	INSERT INTO webhook_events (id, org_id, type, body, created_at)
	VALUES (eid, org, event_type, jsonb_build_object(
		'type', event_type,
		'timestamp', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
		'data', data)::text, at);
	INSERT INTO webhook_deliveries (event_id, endpoint_id, next_attempt_at, created_at)
	SELECT eid, e.id, at, at FROM webhook_endpoints e
	WHERE e.org_id = org AND e.enabled
	  AND (only_endpoint IS NULL OR e.id = only_endpoint)
	  AND (only_endpoint IS NOT NULL OR cardinality(e.events) = 0 OR event_type = ANY (e.events));
	RETURN eid;
END $$;

-- webhook_key_event turns each key change of the audit trail into its event, in the
-- same transaction: key.created, key.rolled, key.revoked and key.leaked. The data
-- holds ids, names and times, never a secret or its hash.
CREATE FUNCTION webhook_key_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	k    api_keys%ROWTYPE;
	data jsonb;
BEGIN
	IF NEW.action NOT IN ('key.created', 'key.rolled', 'key.revoked', 'key.leaked') THEN
		RETURN NULL;
	END IF;
	SELECT * INTO k FROM api_keys WHERE key_id = NEW.key_id;
	data := jsonb_build_object('org_id', NEW.org_id, 'key_id', NEW.key_id, 'name', k.name, 'role', k.role,
		'expires_at', to_char(k.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
	IF NEW.action = 'key.rolled' THEN
		data := data || jsonb_build_object('new_key_id', NEW.new_key_id);
	ELSIF NEW.action = 'key.leaked' THEN
		data := data || jsonb_build_object('url', NEW.url);
	END IF;
	PERFORM webhook_enqueue(NEW.org_id, NEW.action, data, NEW.at);
	RETURN NULL;
END $$;

CREATE TRIGGER audit_events_webhook AFTER INSERT ON audit_events
	FOR EACH ROW EXECUTE FUNCTION webhook_key_event();

-- The webhook changes join the audit trail. Their rows name the endpoint in
-- webhook_id and no key.
ALTER TABLE audit_events
	DROP CONSTRAINT audit_events_action_check,
	ADD CONSTRAINT audit_events_action_check CHECK (action IN (
		'key.created','key.rolled','key.revoked','key.leaked','key.updated',
		'webhook.created','webhook.updated','webhook.deleted','webhook.secret_rotated','webhook.disabled')),
	ALTER COLUMN key_id DROP NOT NULL,
	ADD COLUMN webhook_id uuid,
	ADD CONSTRAINT audit_events_subject_check CHECK (
		CASE WHEN action LIKE 'webhook.%' THEN webhook_id IS NOT NULL AND key_id IS NULL
		     ELSE key_id IS NOT NULL AND webhook_id IS NULL END);
