-- 008_usage_units: the usage record's units. A /v1 request weighs its route's cost
-- (docs/configuration.md, the route table), 1 unless the table says more; the record
-- holds, beside the requests (count), their units: count + extra.
--
-- extra is the units beyond one a request, so that this migrates forward under the
-- gateways and upstreams of the last release, which know nothing of it. Their writes
-- (INSERT … ON CONFLICT DO UPDATE SET count = count + …) leave extra alone, which is
-- exactly right: every request they count costs 1. Their roll-up marks count rolled
-- and leaves extra_rolled, and this release's next roll-up adds the extra it finds
-- unrolled (docs/operations.md, Usage).
--
-- It locks usage_minutes while it checks and indexes the rows there (at most 49 hours
-- of them): the gateways' flushes wait meanwhile, off the request path, and a flush
-- that times out is sent again.

ALTER TABLE usage_minutes
	ADD COLUMN extra        bigint NOT NULL DEFAULT 0 CHECK (extra >= 0),
	-- extra_rolled is how much of extra the roll-up has added to usage_hours and
	-- usage_days, as rolled is of count.
	ADD COLUMN extra_rolled bigint NOT NULL DEFAULT 0 CHECK (extra_rolled BETWEEN 0 AND extra);

-- The roll-up reads the rows with either part not rolled up in full. The last
-- release's roll-up, which asks for count > rolled alone, can use this index too: its
-- condition implies this one's.
CREATE INDEX usage_minutes_unrolled_units_idx ON usage_minutes (start)
	WHERE count > rolled OR extra > extra_rolled;
DROP INDEX usage_minutes_unrolled_idx;

-- An hour or a day holds the extra its minutes had. The roll-up may add extra alone, 0
-- requests, to an hour or a day whose requests the last release's roll-up added: its
-- INSERT … ON CONFLICT proposes a row of count 0, which PostgreSQL checks before it
-- finds the row to add to. Such a row always exists (the requests are in it), so no
-- row of count 0 is ever kept; the check allows one to be proposed.
ALTER TABLE usage_hours
	ADD COLUMN extra bigint NOT NULL DEFAULT 0 CHECK (extra >= 0),
	DROP CONSTRAINT usage_hours_count_check,
	ADD CONSTRAINT usage_hours_count_check CHECK (count >= 0 AND (count > 0 OR extra > 0));
ALTER TABLE usage_days
	ADD COLUMN extra bigint NOT NULL DEFAULT 0 CHECK (extra >= 0),
	DROP CONSTRAINT usage_days_count_check,
	ADD CONSTRAINT usage_days_count_check CHECK (count >= 0 AND (count > 0 OR extra > 0));
