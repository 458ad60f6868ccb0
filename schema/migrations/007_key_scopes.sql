-- 007_key_scopes: the scopes a key may carry, which narrow what its role allows
-- (docs/security.md, Scopes).

-- scopes lists what the key may do; NULL means everything its role allows. A list is
-- never empty and holds no NULL. Which scopes exist is keystore.Scopes's to say, so
-- that a new scope needs no migration. The column is nullable without a default: adding
-- it rewrites no row, and a release that does not know it inserts unscoped keys.
ALTER TABLE api_keys
	ADD COLUMN scopes text[]
		CHECK (cardinality(scopes) > 0 AND array_position(scopes, NULL) IS NULL);

-- key.updated's changes may now hold scopes too:
-- {"scopes":{"from":null,"to":["monitors:read"]}}.
