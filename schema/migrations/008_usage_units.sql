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

ALTER TABLE usage_hours ADD COLUMN extra bigint NOT NULL DEFAULT 0 CHECK (extra >= 0);
ALTER TABLE usage_days  ADD COLUMN extra bigint NOT NULL DEFAULT 0 CHECK (extra >= 0);
