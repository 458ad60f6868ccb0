-- 012_scopes_and_operators: the vocabulary of scopes as the operator's data, an
-- organisation's plan changes in its audit trail, and the operators' own audit
-- (docs/configuration.md, Scopes and route costs; the upstream's commands).

-- scopes is the vocabulary a key's scopes are drawn from. `upstream scope put` adds
-- to it and `scope delete` removes a scope no live key holds. position orders it:
-- a key lists its scopes, and the dashboard its checkboxes, in that order. The three
-- scopes of the built-in route table are there from the start. A release that does
-- not know the table checks keys' scopes against its own list of these three.
CREATE TABLE scopes (
	name        text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_.:-]*$' AND length(name) <= 64),
	description text NOT NULL DEFAULT '' CHECK (length(description) <= 200),
	position    bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
	created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO scopes (name, description) VALUES
	('monitors:read', 'List and read monitors'),
	('monitors:write', 'Create and change monitors'),
	('monitors:delete', 'Delete monitors');

-- An operator's move of an organisation to another plan joins its audit trail, with
-- no key or endpoint, and the plans before and after in changes:
-- {"plan":{"from":"free","to":"pro"}}.
ALTER TABLE audit_events
	DROP CONSTRAINT audit_events_action_check,
	ADD CONSTRAINT audit_events_action_check CHECK (action IN (
		'key.created','key.rolled','key.revoked','key.leaked','key.updated',
		'webhook.created','webhook.updated','webhook.deleted','webhook.secret_rotated','webhook.disabled',
		'org.plan_changed')),
	DROP CONSTRAINT audit_events_subject_check,
	ADD CONSTRAINT audit_events_subject_check CHECK (
		CASE WHEN action LIKE 'webhook.%' THEN webhook_id IS NOT NULL AND key_id IS NULL
		     WHEN action LIKE 'org.%' THEN webhook_id IS NULL AND key_id IS NULL
		     ELSE key_id IS NOT NULL AND webhook_id IS NULL END),
	DROP CONSTRAINT audit_events_changes_check,
	ADD CONSTRAINT audit_events_changes_check
		CHECK ((action IN ('key.updated', 'org.plan_changed')) = (changes IS NOT NULL AND jsonb_typeof(changes) = 'object'));

-- operator_events is the operators' audit: each change an operator's command makes
-- to what no one organisation owns, a plan or a scope. subject is the plan's or the
-- scope's name; changes holds it before (null: created) and after (null: deleted),
-- as json rather than jsonb, so that a plan's limits keep the order the commands print.
-- `upstream audit list` reads it, newest first.
CREATE TABLE operator_events (
	id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	action  text NOT NULL CHECK (action IN ('plan.created','plan.updated','scope.created','scope.updated','scope.deleted')),
	subject text NOT NULL,
	actor   text NOT NULL CHECK (length(actor) BETWEEN 1 AND 64),
	changes json NOT NULL CHECK (json_typeof(changes) = 'object'),
	at      timestamptz NOT NULL DEFAULT now()
);
