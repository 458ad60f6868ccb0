package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
)

// TestTheKeysTableFitsWithSixLongKeys fills every column of the keys table with six
// keys of long names, one a word of 100 characters: each with an expiry, a limit of
// its own, four networks (one a full IPv6 address), every scope, a last use, one of
// them rolled (which makes a seventh). At 1,280, 1,400 and 1,920 px the page does not
// scroll sideways, the table fits its container, every key's Revoke button is whole
// and inside it, nothing in a cell reaches out of it, and no two actions of a row
// overlap.
func TestTheKeysTableFitsWithSixLongKeys(t *testing.T) {
	s := newStack(t)
	base := s.URL(0)
	o := s.newOrg("pro")
	owner := s.loginOwner(o)
	names := []string{
		"deployment pipeline of the payments platform, production cluster in eu-central-1",
		"nightly reconciliation of invoices, credit notes and refunds for every merchant",
		strings.Repeat("integration-test-runner-", 4) + "solo", // 100 characters, one word
		"Grafana data source of the operations team's shared observability stack (read-only)",
		"status page updater of the customer-facing site, rolled every quarter by security",
		"backup monitor creation script that runs from the disaster-recovery site us-west-2",
	}
	expires := time.Now().Add(30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	var ids []string
	for i, name := range names {
		r := owner.do("POST", "/orgs/"+o.ID+"/api-keys", map[string]any{
			"name": name, "role": []string{"Admin", "Editor", "Viewer"}[i%3], "expires_at": expires, "rate_limit": 40 + i,
			"allowed_cidrs": []string{"192.0.2.0/24", "198.51.100.128/25", "2001:db8:abcd:ef01:2345:6789:abcd:ef01/128", "2001:db8::/32"},
			"scopes":        []string{"monitors:read", "monitors:write", "monitors:delete"},
		}, nil)
		if r.Status != http.StatusCreated {
			t.Fatalf("creating key %q: %d %s", name, r.Status, r.Body)
		}
		v := r.JSON(t)
		ids = append(ids, v["id"].(string))
		s.neverLog(v["key"].(string))
	}
	r := owner.do("POST", "/orgs/"+o.ID+"/api-keys/"+ids[4]+"/roll", map[string]any{"grace_seconds": 3600}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("rolling: %d %s", r.Status, r.Body)
	}
	s.neverLog(r.JSON(t)["key"].(string))
	// Every key used a minute ago: the gateways write last_used_at once a minute.
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE api_keys SET last_used_at = now() - interval '1 minute' WHERE org_id = $1`, o.ID); err != nil {
		t.Fatal(err)
	}

	tb := newTab(t, browser(t), base)
	tb.logIn(o.Email, o.Password)
	tb.do("the keys page", chromedp.WaitVisible(tid("key-row")))
	if n := len(get(tb, "key rows", chromedp.Nodes(all(tid("key-row"))))); n != 7 {
		t.Fatalf("the keys page shows %d keys, want 7", n)
	}
	if state := get(tb, "the rolled key's state", chromedp.Evaluate[string](`document.querySelector('tr[data-key-id="`+ids[4]+`"] [data-testid="key-state"]')?.textContent ?? ""`)); state != "rolled" {
		t.Errorf("the rolled key says %q, want rolled", state)
	}
	// fit measures the page at the viewport's width: how far it and the table's
	// container scroll sideways; each Revoke button that is cut, clipped or outside
	// the container; each element shown in a cell whose box reaches out of its cell
	// (a closed Roll or Settings form is not shown); and each pair of a row's actions
	// whose boxes overlap.
	const fit = `(() => {
		const box = document.querySelector('table.keys').parentElement.getBoundingClientRect();
		const page = document.documentElement.scrollWidth - window.innerWidth;
		const table = (s => s.scrollWidth - s.clientWidth)(document.querySelector('table.keys').parentElement);
		const buttons = [...document.querySelectorAll('[data-testid="revoke"]')];
		const bad = buttons.filter(b => { const r = b.getBoundingClientRect();
			return b.scrollWidth > b.clientWidth || r.left < box.left || r.right > box.right || r.right > window.innerWidth || b.textContent !== 'Revoke'; })
			.map(b => b.closest('tr').dataset.keyId);
		const name = e => (e.closest('tr').dataset.keyId || 'the head') + ' ' + (e.closest('td, th').dataset.label || e.closest('td, th').textContent.trim()) +
			': ' + e.tagName.toLowerCase() + ' "' + e.textContent.trim().slice(0, 24) + '"';
		const spill = [];
		for (const c of document.querySelectorAll('table.keys td, table.keys th')) {
			const b = c.getBoundingClientRect();
			const out = [...c.querySelectorAll('*')].filter(e => e.checkVisibility() && e.getBoundingClientRect().width > 0).find(e => { const r = e.getBoundingClientRect();
				return r.left < b.left - 0.5 || r.right > b.right + 0.5; });
			if (out) spill.push(name(out));
		}
		const overlap = [];
		for (const row of document.querySelectorAll('[data-testid="key-row"]')) {
			const acts = [...row.querySelectorAll('summary, button')].filter(e => e.checkVisibility());
			acts.forEach((a, i) => acts.slice(i + 1).forEach(b => { const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
				if (p.left < q.right - 0.5 && q.left < p.right - 0.5 && p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5)
					overlap.push(name(a) + ' and ' + b.textContent.trim()); }));
		}
		return {page, table, buttons: buttons.length, bad, spill, overlap};
	})()`
	type measure struct {
		Page, Table, Buttons int
		Bad, Spill, Overlap  []string
	}
	for _, width := range []int64{1280, 1400, 1920} {
		tb.do(fmt.Sprintf("at %d px", width), chromedp.EmulateViewport(width, 900), chromedp.Reload(), chromedp.WaitVisible(tid("key-row")))
		m := get(tb, "the fit", chromedp.Evaluate[measure](fit))
		if m.Page > 0 || m.Table > 0 || m.Buttons != 7 || len(m.Bad) > 0 {
			t.Errorf("at %d px: the page scrolls %d px sideways, the table %d px; %d Revoke buttons, these cut or outside: %v",
				width, m.Page, m.Table, m.Buttons, m.Bad)
		}
		if len(m.Spill) > 0 || len(m.Overlap) > 0 {
			t.Errorf("at %d px: these reach out of their cells: %q; these actions overlap: %q", width, m.Spill, m.Overlap)
		}
		if width == 1400 {
			tb.screenshot("keys-many")
		}
	}
	tb.do("at 390 px", chromedp.EmulateViewport(390, 900), chromedp.Reload(), chromedp.WaitVisible(tid("key-row")))
	if w := get(tb, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		t.Errorf("at 390 px the keys page is %d px wide", w)
	}
	tb.screenshot("keys-many-390px")
}
