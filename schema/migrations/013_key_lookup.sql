-- 013_key_lookup: a key's lookup reads two small indexes and nothing of the tables,
-- and the gateways' last_used_at writes leave the rows it reads alone
-- (docs/scaling.md, What a lookup reads).
--
-- It only adds, so it migrates forward under the gateways and upstreams of the last
-- release. Their lookup reads the same columns as this release's and uses the new
-- indexes too. Their last_used_at writes still go to api_keys.last_used_at, and this
-- release's key list shows the later of that and api_key_last_used's.
--
-- It locks api_keys and orgs against writes while it builds their indexes, a few
-- seconds per million keys: creating, revoking and changing keys waits meanwhile, as
-- do the last release's last_used_at writes, off the request path. Lookups go on.

-- api_keys_lookup_idx holds, for every key not revoked, every column the gateway's
-- lookup reads of it. The lookup is then an index-only scan: one descent of the index,
-- and no read of the key's row where vacuum has marked its page all-visible. A page
-- that a write has changed since (a new key, a revocation, a key's settings) is read
-- as before, so the lookup sees every committed change. Its key ids are ordered byte
-- by byte (COLLATE "C", which a key id's letters and digits allow): the lookup asks
-- for that order, so that no other index of api_keys can serve it, and compares
-- without the database's locale.
CREATE INDEX api_keys_lookup_idx ON api_keys (key_id COLLATE "C")
	INCLUDE (org_id, role, secret_hash, expires_at, rate_limit, rate_limit_per_second, rate_limit_per_hour,
		rate_limit_per_day, allowed_cidrs, scopes)
	WHERE revoked_at IS NULL;

-- orgs_plan_idx does the same for the plan of the key's organisation.
CREATE INDEX orgs_plan_idx ON orgs (id) INCLUDE (plan);

-- Vacuum marks the pages of both tables all-visible again once 1 % of their rows
-- changed or were added, rather than PostgreSQL's 20 %. It reads only the pages
-- changed since the last vacuum, so a vacuum costs little.
ALTER TABLE api_keys SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01);
ALTER TABLE orgs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01);

-- api_key_last_used holds when the gateways last saw each key, written by every
-- gateway process once per last_used_interval (docs/operations.md, last_used_at). In a
-- table of its own, those writes change no page of api_keys: the pages of the keys in
-- use stay all-visible for their lookups. Half of each page is left free, so that a
-- write finds room for the row's new version on the row's own page (a HOT update).
CREATE TABLE api_key_last_used (
	key_id       text PRIMARY KEY REFERENCES api_keys (key_id) ON DELETE CASCADE,
	last_used_at timestamptz NOT NULL
) WITH (fillfactor = 50);
