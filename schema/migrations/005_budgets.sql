-- 005_budgets: the budgets a plan may set beyond each key's minute, and what a key may
-- narrow for itself (docs/configuration.md, Budgets and restricted keys).

-- org_rate_limit is the requests a minute of all an org's keys together;
-- api_requests_per_month the requests of all its keys in a UTC calendar month. -1 (the
-- default, and what every existing plan gets) means none.
ALTER TABLE plans
	ADD COLUMN org_rate_limit integer NOT NULL DEFAULT -1
		CHECK (org_rate_limit = -1 OR org_rate_limit > 0),
	ADD COLUMN api_requests_per_month bigint NOT NULL DEFAULT -1
		CHECK (api_requests_per_month = -1 OR api_requests_per_month > 0);

-- rate_limit is the key's own requests a minute; NULL means the plan's api_rate_limit.
-- The gateway applies the smaller of the two, so a plan lowered later still binds.
-- allowed_cidrs are the networks the key may be used from; empty means anywhere. A
-- cidr never has bits set after its prefix length.
ALTER TABLE api_keys
	ADD COLUMN rate_limit integer CHECK (rate_limit > 0),
	ADD COLUMN allowed_cidrs cidr[] NOT NULL DEFAULT '{}'
		CHECK (cardinality(allowed_cidrs) <= 32 AND array_position(allowed_cidrs, NULL) IS NULL);

-- key.updated is a change of a key's rate_limit or allowed_cidrs. changes says what
-- changed, each setting before and after:
-- {"rate_limit":{"from":null,"to":100},"allowed_cidrs":{"from":[],"to":["10.0.0.0/8"]}}.
-- Only key.updated has it.
ALTER TABLE audit_events
	DROP CONSTRAINT audit_events_action_check,
	ADD CONSTRAINT audit_events_action_check
		CHECK (action IN ('key.created','key.rolled','key.revoked','key.leaked','key.updated')),
	ADD COLUMN changes jsonb,
	ADD CONSTRAINT audit_events_changes_check
		CHECK ((action = 'key.updated') = (changes IS NOT NULL AND jsonb_typeof(changes) = 'object'));
