-- 006_webhooks: reserved for the webhooks' tables, which come with their own file.
-- The migration runner needs a statement.
SELECT 1;
