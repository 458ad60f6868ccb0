-- 001_init: plans, organisations, people, sessions, API keys and monitors.
--
-- The database enforces what must never be wrong whatever program writes to it:
-- roles and types are CHECKed, references are foreign keys, key ids are unique,
-- and only 32-byte SHA-256 digests of secrets and session tokens are stored.

CREATE TABLE plans (
	name                 text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,62}$'),
	-- api_rate_limit: 0 no API access, N requests per key per minute, -1 unlimited.
	api_rate_limit       integer NOT NULL CHECK (api_rate_limit >= -1),
	-- max_monitors: -1 means no cap.
	max_monitors         integer NOT NULL CHECK (max_monitors >= -1),
	min_interval_seconds integer NOT NULL CHECK (min_interval_seconds BETWEEN 10 AND 86400),
	locations            text[]  NOT NULL CHECK (
		locations <@ ARRAY['us-east','us-west','eu-west','eu-central','ap-southeast']::text[]),
	check_types          text[]  NOT NULL CHECK (check_types <@ ARRAY['http','tcp','dns','icmp']::text[]),
	created_at           timestamptz NOT NULL DEFAULT now(),
	updated_at           timestamptz NOT NULL DEFAULT now()
);

INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types) VALUES
	('free',       0,   5, 300, ARRAY['us-east'], ARRAY['http']),
	('pro',        600, 100, 60, ARRAY['us-east','eu-west','ap-southeast'], ARRAY['http','tcp','dns']),
	('enterprise', -1,  -1, 10, ARRAY['us-east','us-west','eu-west','eu-central','ap-southeast'],
	                            ARRAY['http','tcp','dns','icmp'])
ON CONFLICT (name) DO NOTHING;

CREATE TABLE orgs (
	id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
	plan       text NOT NULL REFERENCES plans (name) ON UPDATE CASCADE,
	created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
	id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	email         text NOT NULL CHECK (length(email) BETWEEN 3 AND 254 AND position('@' in email) > 1),
	-- password_hash is a PHC-format argon2id string.
	password_hash text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
	created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_email_key ON users (lower(email));

CREATE TABLE memberships (
	org_id     uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
	role       text NOT NULL CHECK (role IN ('Owner','Admin','Editor','Viewer')),
	created_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (org_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id);

CREATE TABLE sessions (
	-- token_hash is SHA-256 of the session cookie's value; the token itself is never stored.
	token_hash bytea PRIMARY KEY CHECK (octet_length(token_hash) = 32),
	user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
	created_at timestamptz NOT NULL DEFAULT now(),
	expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_user_idx ON sessions (user_id);

CREATE TABLE api_keys (
	-- key_id is the public part of the key and the record's id in the dashboard paths.
	key_id      text PRIMARY KEY CHECK (key_id ~ '^[A-Za-z0-9]{16,64}$'),
	org_id      uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
	role        text NOT NULL CHECK (role IN ('Admin','Editor','Viewer')),
	-- secret_hash is SHA-256 of the secret; the secret itself is never stored.
	secret_hash bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
	created_by  uuid REFERENCES users (id) ON DELETE SET NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	expires_at  timestamptz,
	revoked_at  timestamptz
);
CREATE INDEX api_keys_org_idx ON api_keys (org_id, created_at, key_id);

CREATE TABLE monitors (
	id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	org_id           uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
	type             text NOT NULL CHECK (type IN ('http','tcp','dns','icmp')),
	target           text NOT NULL CHECK (length(target) BETWEEN 1 AND 2048),
	interval_seconds integer NOT NULL DEFAULT 300 CHECK (interval_seconds BETWEEN 10 AND 86400),
	locations        text[] NOT NULL DEFAULT ARRAY['us-east'] CHECK (
		cardinality(locations) > 0 AND
		locations <@ ARRAY['us-east','us-west','eu-west','eu-central','ap-southeast']::text[]),
	paused           boolean NOT NULL DEFAULT false,
	-- config and assertions are write-only on every API: stored, never returned.
	config           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(config) = 'object'),
	assertions       jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(assertions) = 'array'),
	config_version   integer NOT NULL DEFAULT 1 CHECK (config_version >= 1),
	paused_reason    text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	updated_at       timestamptz NOT NULL DEFAULT now(),
	deleted_at       timestamptz
);
-- monitors_org_live_idx serves the cursor-paginated list and the plan's monitor count.
CREATE INDEX monitors_org_live_idx ON monitors (org_id, created_at, id) WHERE deleted_at IS NULL;

---- create above / drop below ----

DROP TABLE monitors;
DROP TABLE api_keys;
DROP TABLE sessions;
DROP TABLE memberships;
DROP TABLE users;
DROP TABLE orgs;
DROP TABLE plans;
