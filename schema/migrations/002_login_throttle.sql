-- 002_login_throttle: the login attempts that throttle password guessing, shared by
-- every upstream instance, and an index for purging expired sessions.

CREATE TABLE login_attempts (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	-- client is the client's IP address, as the upstream determined it: behind a
	-- trusted proxy, from X-Forwarded-For (docs/configuration.md, --trusted-proxies).
	client     text NOT NULL CHECK (length(client) <= 64),
	-- email_hash is SHA-256 of the lower-cased email tried: attempts name accounts
	-- that may not exist, and need not be readable.
	email_hash bytea NOT NULL CHECK (octet_length(email_hash) = 32),
	at         timestamptz NOT NULL
);
CREATE INDEX login_attempts_client_idx ON login_attempts (client, at);
CREATE INDEX login_attempts_at_idx ON login_attempts (at);

CREATE INDEX sessions_expires_idx ON sessions (expires_at);
