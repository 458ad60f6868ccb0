package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The operators' audit: what an operator's command changed that no one organisation
// owns, a plan or a scope (operator_events). A change to an organisation, its plan
// or its keys, goes in that organisation's audit trail instead, with the actor
// ActorOperator.

// ActorOperator is the audit actor of a change made by an operator's command.
const ActorOperator = "operator"

// The actions of the operators' audit.
const (
	ActionPlanCreated  = "plan.created"
	ActionPlanUpdated  = "plan.updated"
	ActionScopeCreated = "scope.created"
	ActionScopeUpdated = "scope.updated"
	ActionScopeDeleted = "scope.deleted"
	// ActionOrgPlanChanged is an organisation moved to another plan, in its own audit
	// trail, with its plans before and after.
	ActionOrgPlanChanged = "org.plan_changed"
)

// OperatorEvent is one change of the operators' audit: its action, the name of the
// plan or scope it changed, who changed it, and what it was before (null when
// created) and after (null when deleted).
type OperatorEvent struct {
	ID      int64           `json:"id"`
	Action  string          `json:"action"`
	Subject string          `json:"subject"`
	Actor   string          `json:"actor"`
	Changes OperatorChanges `json:"changes"`
	At      time.Time       `json:"at"`
}

// OperatorChanges is a plan or scope before and after a change, as JSON.
type OperatorChanges struct {
	From json.RawMessage `json:"from"`
	To   json.RawMessage `json:"to"`
}

// auditOperator appends a change of subject, from before to after (nil: none), to the
// operators' audit within tx, as ActorOperator. The changes travel as JSON text cast
// in SQL, as keystore's audit does, for PgBouncer's modes without described types.
func auditOperator(ctx context.Context, tx pgx.Tx, action, subject string, before, after any) error {
	ch := OperatorChanges{From: json.RawMessage("null"), To: json.RawMessage("null")}
	var err error
	if before != nil {
		if ch.From, err = json.Marshal(before); err != nil {
			return fmt.Errorf("auditing %s: %w", action, err)
		}
	}
	if after != nil {
		if ch.To, err = json.Marshal(after); err != nil {
			return fmt.Errorf("auditing %s: %w", action, err)
		}
	}
	b, err := json.Marshal(ch)
	if err != nil {
		return fmt.Errorf("auditing %s: %w", action, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO operator_events (action, subject, actor, changes) VALUES ($1, $2, $3, $4::text::json)`,
		action, subject, ActorOperator, string(b))
	if err != nil {
		return fmt.Errorf("auditing %s: %w", action, err)
	}
	return nil
}

// OperatorEvents returns up to limit events of the operators' audit, newest first.
// When before > 0, it returns those with an id below before.
func (s *Store) OperatorEvents(ctx context.Context, before int64, limit int) ([]OperatorEvent, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, action, subject, actor, changes::text, at FROM operator_events
WHERE $1 = 0 OR id < $1 ORDER BY id DESC LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("listing the operators' audit: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OperatorEvent, error) {
		var e OperatorEvent
		var changes string
		if err := row.Scan(&e.ID, &e.Action, &e.Subject, &e.Actor, &changes, &e.At); err != nil {
			return e, err
		}
		e.At = e.At.UTC()
		return e, json.Unmarshal([]byte(changes), &e.Changes)
	})
	if err != nil {
		return nil, fmt.Errorf("listing the operators' audit: %w", err)
	}
	return events, nil
}
