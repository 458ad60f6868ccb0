-- 007_key_scopes: reserved for the keys' scopes, which come with their own file.
-- The migration runner needs a statement.
SELECT 1;
