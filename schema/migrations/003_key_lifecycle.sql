-- 003_key_lifecycle: what is kept about keys beyond their existence. It records when
-- the gateway last saw each key, and who created, rolled or revoked which key.

-- last_used_at is written by the gateways in batches, at most once per key per minute.
-- It may lag the last request by that much, and a crash may lose it
-- (docs/operations.md, last_used_at).
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;

-- audit_events is append-only: one row per change to a key, written in the same
-- transaction as the change. key_id has no foreign key, so the trail names the key
-- whatever becomes of it. The org's deletion takes its trail along.
CREATE TABLE audit_events (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	org_id     uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	action     text NOT NULL CHECK (action IN ('key.created','key.rolled','key.revoked','key.leaked')),
	key_id     text NOT NULL,
	-- actor is the acting user's id, or 'leak-report' for a revocation by leak report.
	actor      text NOT NULL CHECK (length(actor) BETWEEN 1 AND 64),
	-- new_key_id is the key a roll created (key.rolled only).
	new_key_id text,
	-- url is where a leaked key was found, as the report gave it (key.leaked only).
	url        text CHECK (length(url) <= 2048),
	at         timestamptz NOT NULL DEFAULT now()
);
-- Newest first within an org: id grows with every insert.
CREATE INDEX audit_events_org_idx ON audit_events (org_id, id DESC);
