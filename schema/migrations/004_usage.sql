-- 004_usage: the usage record. The gateways count every /v1 request of an identified
-- key per key, UTC minute, outcome and status, and add their counts to usage_minutes
-- (docs/operations.md, Usage). The upstream rolls minutes up into hours and days.
--
-- None of these tables has a foreign key. A gateway's write must never fail for a key
-- or an org that went away since the request, or it would hold every other count back.
-- A key's usage outlives the key.

CREATE TABLE usage_minutes (
	org_id  uuid        NOT NULL,
	key_id  text        NOT NULL,
	-- start is the whole UTC minute the requests fell in.
	start   timestamptz NOT NULL CHECK (start = date_trunc('minute', start)),
	-- outcome is the gateway's decision, as in the keygate_requests_total metric.
	outcome text        NOT NULL CHECK (outcome IN ('me','proxied','rate_limited','quota_exceeded',
	                    'forbidden','feature_gated','limiter_unavailable','ip_denied')),
	-- status is the HTTP status the client got.
	status  smallint    NOT NULL CHECK (status BETWEEN 100 AND 599),
	count   bigint      NOT NULL CHECK (count > 0),
	-- rolled is how much of count the roll-up has added to usage_hours and usage_days.
	-- A gateway's late write raises count again, and the next roll-up adds the rest.
	rolled  bigint      NOT NULL DEFAULT 0 CHECK (rolled BETWEEN 0 AND count),
	PRIMARY KEY (org_id, start, key_id, outcome, status)
);
-- The roll-up reads only the rows it has not rolled up in full.
CREATE INDEX usage_minutes_unrolled_idx ON usage_minutes (start) WHERE count > rolled;
-- The retention deletes the oldest rows of every org without reading the others.
CREATE INDEX usage_minutes_start_idx ON usage_minutes (start);

-- usage_flushes holds the id of every write of a gateway to usage_minutes, for a few
-- days (docs/operations.md, Usage). A gateway that cannot tell whether its write was
-- made (a timeout, a lost connection) sends it again with the same id, and
-- PostgreSQL skips it if the first one was made: no request counts twice.
CREATE TABLE usage_flushes (
	id uuid        PRIMARY KEY,
	at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX usage_flushes_at_idx ON usage_flushes (at);

-- usage_hours and usage_days hold what the roll-up took from usage_minutes, by whole
-- UTC hour and UTC day.
CREATE TABLE usage_hours (
	org_id  uuid        NOT NULL,
	key_id  text        NOT NULL,
	start   timestamptz NOT NULL,
	outcome text        NOT NULL,
	status  smallint    NOT NULL,
	count   bigint      NOT NULL CHECK (count > 0),
	PRIMARY KEY (org_id, start, key_id, outcome, status)
);
CREATE INDEX usage_hours_start_idx ON usage_hours (start);

CREATE TABLE usage_days (
	org_id  uuid        NOT NULL,
	key_id  text        NOT NULL,
	start   timestamptz NOT NULL,
	outcome text        NOT NULL,
	status  smallint    NOT NULL,
	count   bigint      NOT NULL CHECK (count > 0),
	PRIMARY KEY (org_id, start, key_id, outcome, status)
);
