-- 006_webhooks: reserved for the webhooks' migration, which replaces this file.
SELECT 1;
