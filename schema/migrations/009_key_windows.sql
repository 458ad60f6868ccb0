-- 009_key_windows: a key's windows beside its minute, a second, an hour and a day
-- (docs/configuration.md, Budgets and restricted keys). It only adds columns, so it
-- migrates forward under the gateways and upstreams of the last release, which read
-- and write around them.

-- A plan's limit per key in each window. -1 (the default, and what every existing
-- plan gets) means none. 0 is not a value any of them takes: a plan without API access
-- says so with api_rate_limit 0.
ALTER TABLE plans
	ADD COLUMN api_rate_limit_per_second integer NOT NULL DEFAULT -1
		CHECK (api_rate_limit_per_second = -1 OR api_rate_limit_per_second > 0),
	ADD COLUMN api_rate_limit_per_hour integer NOT NULL DEFAULT -1
		CHECK (api_rate_limit_per_hour = -1 OR api_rate_limit_per_hour > 0),
	ADD COLUMN api_rate_limit_per_day integer NOT NULL DEFAULT -1
		CHECK (api_rate_limit_per_day = -1 OR api_rate_limit_per_day > 0);

-- A key's own limit in each window; NULL means its plan's. The gateway applies the
-- smaller of the two, so a plan lowered later still binds. The columns are nullable
-- without a default: adding them rewrites no row, and a release that does not know
-- them inserts keys with the plan's.
ALTER TABLE api_keys
	ADD COLUMN rate_limit_per_second integer CHECK (rate_limit_per_second > 0),
	ADD COLUMN rate_limit_per_hour integer CHECK (rate_limit_per_hour > 0),
	ADD COLUMN rate_limit_per_day integer CHECK (rate_limit_per_day > 0);

-- key.updated's changes may now hold these too:
-- {"rate_limit_per_second":{"from":null,"to":20}}.
