-- 010_usage_export: the usage export's ledger and outbox. `upstream serve
-- --usage-export-url` sends the usage record, one event per key and settled minute,
-- to the operator's metering or billing system, and what a minute gains after its
-- event as a further event of the difference (docs/operations.md, Usage export).
--
-- It only adds. The release before it neither reads nor writes what it adds: its
-- gateways' writes (INSERT … ON CONFLICT DO UPDATE SET count = count + …) leave the
-- new columns alone, which is exactly what makes a late write show as count above
-- exported. It locks usage_minutes while it checks and indexes the rows there (at most
-- 49 hours of them): the gateways' flushes wait meanwhile, off the request path.

-- exported and extra_exported are how much of count and extra the export has written
-- into events, as rolled and extra_rolled are of the roll-up. A minute row holds
-- exactly what its events add up to when count = exported and extra = extra_exported.
ALTER TABLE usage_minutes
	ADD COLUMN exported       bigint NOT NULL DEFAULT 0 CHECK (exported BETWEEN 0 AND count),
	ADD COLUMN extra_exported bigint NOT NULL DEFAULT 0 CHECK (extra_exported BETWEEN 0 AND extra);

-- The export reads the rows with a part not written into an event yet, oldest minute
-- first. Every new row enters this index and leaves it once exported; without an
-- export the index covers the table's 49 hours, as usage_minutes_start_idx does.
CREATE INDEX usage_minutes_unexported_idx ON usage_minutes (start)
	WHERE count > exported OR extra > extra_exported;

-- usage_export is the export's position, one row, made by the first upstream that
-- exports. since is the first minute it exports: the minute it was first started in,
-- moved on only when the export resumes after a long stop. cut_at is when an export
-- last looked for settled minutes. While cut_at is recent the purge keeps every minute
-- row from since on that is not exported in full.
CREATE TABLE usage_export (
	one    boolean     PRIMARY KEY DEFAULT true CHECK (one),
	since  timestamptz NOT NULL CHECK (since = date_trunc('minute', since)),
	cut_at timestamptz NOT NULL
);

-- usage_export_events is the outbox: each event not yet delivered, with the exact
-- CloudEvents JSON object every attempt sends. id is the event's id, the same on every
-- retry. An exporter claims due rows by moving next_attempt_at past its lease and
-- setting lease; only the holder of that lease records the attempt. A delivered event
-- is deleted.
CREATE TABLE usage_export_events (
	id              text        PRIMARY KEY,
	minute          timestamptz NOT NULL,
	body            text        NOT NULL,
	attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
	next_attempt_at timestamptz NOT NULL,
	lease           uuid,
	last_error      text,
	created_at      timestamptz NOT NULL
);
CREATE INDEX usage_export_events_due_idx ON usage_export_events (next_attempt_at, minute);
CREATE INDEX usage_export_events_minute_idx ON usage_export_events (minute);
