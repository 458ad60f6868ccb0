package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// chromiumPath is Debian's chromium, which scripts/test.sh installs.
const chromiumPath = "/usr/bin/chromium"

// dashboardCSP is the Content-Security-Policy the dashboard must send.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// browser is one headless Chromium for a test, with a fresh profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s: %v (scripts/test.sh installs the chromium package)", chromiumPath, err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900), // the docs' screenshots are 1,400 px wide
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// tab is a page of its own browser context (its own cookies), whose requests,
// script exceptions and console errors are recorded.
type tab struct {
	t        *testing.T
	ctx      context.Context
	origin   string
	mu       sync.Mutex
	requests []string
	problems []string
}

// newTab opens a tab on browserCtx in a fresh browser context.
func newTab(t *testing.T, browserCtx context.Context, origin string) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	tb := &tab{t: t, ctx: ctx, origin: origin}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Listen(ctx, tb.record); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.check)
	return tb
}

// record keeps the events the checks need; it runs in the tab's reading loop.
func (tb *tab) record(ev any) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		tb.requests = append(tb.requests, e.Request.URL)
	case *runtime.EventExceptionThrown:
		tb.problems = append(tb.problems, "exception: "+e.ExceptionDetails.Text)
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			tb.problems = append(tb.problems, "console.error")
		}
	case *log.EventEntryAdded:
		// A page answered with an error status (a wrong password's 401) is logged as a
		// network error; the statuses are the test's own checks. An asset that fails
		// to load is a problem.
		page := e.Entry.Source == log.EntrySourceNetwork && !strings.Contains(e.Entry.URL, "/dashboard/static/")
		if e.Entry.Level == log.EntryLevelError && !page {
			tb.problems = append(tb.problems, fmt.Sprintf("log %s: %s %s", e.Entry.Source, e.Entry.Text, e.Entry.URL))
		}
	}
}

// check fails the test for a request that left the origin, a script exception, a
// console error or a browser log error (a CSP violation among them).
func (tb *tab) check() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, u := range tb.requests {
		// A data: URL (Chromium's own icon of a date input) is no request to anyone.
		if !strings.HasPrefix(u, tb.origin+"/") && !strings.HasPrefix(u, "data:") {
			tb.t.Errorf("a request left the origin %s: %s", tb.origin, u)
		}
	}
	for _, p := range tb.problems {
		tb.t.Errorf("in the page: %s", p)
	}
}

// do runs steps, failing the test with what the page showed when they fail.
func (tb *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		html, _ := chromedp.Run(tb.ctx, chromedp.OuterHTML(chromedp.CSS("html")))
		tb.t.Fatalf("%s: %v\npage:\n%s", what, err, html)
	}
}

// get runs one action that returns a value.
func get[T any](tb *tab, what string, a chromedp.Action[T]) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		tb.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// html returns the page's whole markup.
func (tb *tab) html() string {
	tb.t.Helper()
	return get(tb, "reading the page", chromedp.OuterHTML(chromedp.CSS("html")))
}

// screenshot writes the page as docs' NAME.png when KEYGATE_SCREENSHOTS names a
// folder (relative to the repository), and does nothing otherwise.
func (tb *tab) screenshot(name string) {
	tb.t.Helper()
	dir := os.Getenv("KEYGATE_SCREENSHOTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root(tb.t), dir)
	}
	png := get(tb, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
}

// tid is the CSS selector of a data-testid.
func tid(id string) chromedp.CSS { return chromedp.CSS(`[data-testid="` + id + `"]`) }

// clickThrough clicks link, which loads a page, and waits for sel on that page. The
// page shown is marked first, so a sel it shows already does not count: a form that
// answers with the page it was sent from would otherwise be read before its answer.
func clickThrough(link, sel chromedp.CSS) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](`document.documentElement.dataset.left = "1"`),
		chromedp.Click(link),
		chromedp.WaitVisible(`html:not([data-left]) `+sel),
	)
}

// all is the selector of every element sel matches.
func all(sel chromedp.CSS) chromedp.CSSAll { return chromedp.CSSAll(sel) }

// logIn fills and sends the login form.
func (tb *tab) logIn(email, password string) {
	tb.t.Helper()
	tb.do("log in",
		chromedp.Navigate(tb.origin+"/dashboard"),
		chromedp.WaitVisible(tid("login-email")),
		chromedp.SendKeys(tid("login-email"), email),
		chromedp.SendKeys(tid("login-password"), password),
		chromedp.Click(tid("login-submit")),
		chromedp.WaitVisible(chromedp.CSS("h1")),
	)
}

// bearer calls path through the gateway with key and returns the status.
func bearer(t *testing.T, base, path, key string) int {
	t.Helper()
	r := doRequest(t, http.DefaultClient, "GET", base+path, nil, http.Header{"Authorization": {"Bearer " + key}})
	return r.Status
}

// TestDashboardInABrowser drives the dashboard in headless Chromium through the
// gateway: a key created in the page works on /v1 and is never shown again, rolled and
// revoked in the page it stops working on the next request; errors are words on the
// page; a Viewer sees no controls; nothing leaves the origin and no script fails.
func TestDashboardInABrowser(t *testing.T) {
	s := newStack(t)
	base := s.URL(0)
	o := s.newOrg("pro")
	b := browser(t)

	// The headers every dashboard answer carries, through the gateway.
	r := doRequest(t, http.DefaultClient, "GET", base+"/dashboard", nil, nil)
	if r.Status != 200 || r.Header.Get("Content-Security-Policy") != dashboardCSP ||
		r.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("GET /dashboard: %d, CSP %q, X-Frame-Options %q", r.Status,
			r.Header.Get("Content-Security-Policy"), r.Header.Get("X-Frame-Options"))
	}

	owner := newTab(t, b, base)
	owner.do("open the login page", chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(tid("login-email")))
	owner.screenshot("login")
	// The footer names the version the upstream runs, as `upstream version` prints it.
	out, err := exec.Command(filepath.Join(binaries(t), "upstream"), "version").Output()
	if err != nil {
		t.Fatalf("upstream version: %v", err)
	}
	var v struct{ Version string }
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" {
		t.Fatalf("upstream version printed %q", out)
	}
	if foot := get(owner, "the footer", chromedp.Text(tid("version"))); foot != "keygate "+v.Version {
		t.Errorf("the footer says %q, want %q", foot, "keygate "+v.Version)
	}
	owner.logIn(o.Email, o.Password)
	owner.do("the keys page", chromedp.WaitVisible(tid("create-key-name")))

	// Create a key through the form, with its own limits (a minute's, a second's and a
	// day's), networks (the loopback ones, from which this test calls /v1) and scopes
	// (/v1/me needs none), and read it once.
	owner.do("create a key",
		chromedp.SendKeys(tid("create-key-name"), "deploy bot"),
		chromedp.SetValue(tid("create-key-role"), "Editor"),
		chromedp.SendKeys(tid("create-key-rate-limit"), "50"),
		chromedp.SendKeys(tid("create-key-rate-limit-per-second"), "5"),
		chromedp.SendKeys(tid("create-key-rate-limit-per-day"), "10000"),
		chromedp.SendKeys(tid("create-key-cidrs"), "127.0.0.0/8,\n::1\n192.0.2.0/24"),
		chromedp.Click(scopeBox(tid("create-key-scopes"), "monitors:read")),
		chromedp.Click(scopeBox(tid("create-key-scopes"), "monitors:write")),
		chromedp.Click(tid("create-key-submit")),
		chromedp.WaitVisible(tid("new-key")),
	)
	key := get(owner, "read the new key", chromedp.Text(tid("new-key")))
	s.neverLog(key)
	owner.do("copy it", chromedp.Click(tid("copy-key")),
		chromedp.WaitVisible(chromedp.CSS(`[data-copied]:not(:empty)`)))
	owner.screenshot("new-key")
	if got := bearer(t, base, "/v1/me", key); got != 200 {
		t.Fatalf("/v1/me with the new key: %d", got)
	}
	oldID := strings.TrimPrefix(strings.SplitN(key, ".", 2)[0], "mon_live_")
	secret := strings.SplitN(key, ".", 2)[1]

	// Reload: the secret is nowhere on the page.
	owner.do("reload", chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(tid("key-row")))
	if html := owner.html(); strings.Contains(html, secret) || strings.Contains(html, `data-testid="new-key"`) {
		t.Fatalf("the secret is on the page after a reload:\n%s", html)
	}
	row := chromedp.CSS(`tr[data-key-id="` + oldID + `"] `)
	s.wantSettings(owner, row, "50", "5 a second, 10000 a day", "127.0.0.0/8 ::1/128 192.0.2.0/24")
	wantScopes(owner, row, "monitors:read monitors:write")
	wantCompactRow(owner, oldID)
	owner.screenshot("keys")

	// Change the key's limit and networks in its settings form.
	owner.do("edit the settings",
		chromedp.Click(row+tid("edit-settings")),
		chromedp.WaitVisible(row+tid("save-settings")),
		chromedp.SetValue(row+tid("edit-rate-limit"), "40"),
		chromedp.SetValue(row+tid("edit-rate-limit-per-second"), "3"),
		chromedp.SetValue(row+tid("edit-rate-limit-per-day"), ""),
		chromedp.SetValue(row+tid("edit-cidrs"), "127.0.0.1, ::1/128"),
	)
	owner.screenshot("key-settings")
	owner.do("save the settings", clickThrough(row+tid("save-settings"), tid("create-key-name")))
	s.wantSettings(owner, row, "40", "3 a second", "127.0.0.1/32 ::1/128")
	if got := bearer(t, base, "/v1/me", key); got != 200 {
		t.Fatalf("/v1/me with the key after its settings changed: %d", got)
	}

	// Roll it with a grace period: both keys work.
	owner.do("roll",
		chromedp.Click(row+tid("roll-open")),
		chromedp.WaitVisible(row+tid("roll-grace")),
		chromedp.SetValue(row+tid("roll-grace"), "600"),
		chromedp.Click(row+tid("roll")),
		chromedp.WaitVisible(tid("new-key")),
	)
	rolled := get(owner, "read the rolled key", chromedp.Text(tid("new-key")))
	s.neverLog(rolled)
	rolledRow := chromedp.CSS(`tr[data-key-id="` + strings.TrimPrefix(strings.SplitN(rolled, ".", 2)[0], "mon_live_") + `"] `)
	s.wantSettings(owner, rolledRow, "40", "3 a second", "127.0.0.1/32 ::1/128")
	owner.screenshot("rolled")
	if state := get(owner, "the old key's state", chromedp.Text(row+tid("key-state"))); state != "rolled" {
		t.Errorf("the rolled key's row says %q, want rolled", state)
	}
	if ends := strings.Join(strings.Fields(get(owner, "the old key's end", chromedp.Text(row+tid("key-ends")))), " "); !regexp.MustCompile(`^rolled expires \d{4}-\d\d-\d\d \d\d:\d\d$`).MatchString(ends) {
		t.Errorf("the rolled key's row ends %q, want rolled expires <day> <minute>", ends)
	}
	if rolled == key || bearer(t, base, "/v1/me", rolled) != 200 || bearer(t, base, "/v1/me", key) != 200 {
		t.Fatalf("after the roll with grace: new %d, old %d", bearer(t, base, "/v1/me", rolled), bearer(t, base, "/v1/me", key))
	}

	// Revoke the old key through the page, with its confirmation.
	owner.do("revoke",
		chromedp.Navigate(base+"/dashboard"),
		chromedp.Click(row+tid("revoke")),
		chromedp.WaitVisible(tid("confirm-revoke")),
	)
	owner.screenshot("revoke")
	owner.do("confirm", chromedp.Click(tid("confirm-revoke")),
		chromedp.WaitVisible(tid("create-key-name")))
	if got := bearer(t, base, "/v1/me", key); got != 401 {
		t.Fatalf("the old key after its revocation: %d, want 401", got)
	}
	if got := bearer(t, base, "/v1/me", rolled); got != 200 {
		t.Fatalf("the rolled key after the old one's revocation: %d", got)
	}
	if n := len(get(owner, "revoke buttons", chromedp.Nodes(all(row+tid("revoke")), chromedp.AtLeast(0)))); n != 0 {
		t.Errorf("the revoked key still has a revoke button")
	}

	// The usage page: a chart and each key's totals, the numbers of the JSON API.
	// The keys answered 200 to /v1/me three times (the old one) and twice (the rolled one).
	s.checkUsagePage(owner, o, oldID, strings.TrimPrefix(strings.SplitN(rolled, ".", 2)[0], "mon_live_"), 3, 2)

	// The audit trail, and the keys page at 320 px: nothing wider than the screen.
	owner.do("audit", chromedp.Navigate(base+"/dashboard/orgs/"+o.ID+"/audit"), chromedp.WaitVisible(tid("audit-row")))
	if n := len(get(owner, "audit rows", chromedp.Nodes(all(tid("audit-row"))))); n != 5 {
		t.Errorf("audit trail: %d events, want 5 (created, updated, rolled, revoked, and the operator's plan change)", n)
	}
	changes := get(owner, "the changes", chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid="audit-changes"]')].map(e => e.textContent)`))
	if want := []string{"plan: pro → metered", "rate limit: 50 a minute → 40 a minute; rate limit a second: 5 a second → 3 a second; " +
		"rate limit a day: 10000 a day → plan's; allowed networks: 127.0.0.0/8, ::1/128, 192.0.2.0/24 → 127.0.0.1/32, ::1/128"}; !slices.Equal(changes, want) {
		t.Errorf("the audit trail says %q, want %q", changes, want)
	}
	// People by email, keys by name: the owner did all four key events, on the key
	// "deploy bot" and the key its roll made, which keeps the name; the newest, the
	// plan change of checkUsagePage, was the operator's.
	for i, actor := range get(owner, "the actors", chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid="audit-actor"]')].map(e => e.textContent)`)) {
		if want := map[bool]string{true: "an operator", false: o.Email}[i == 0]; actor != want {
			t.Errorf("the audit trail names %q, want %q", actor, want)
		}
	}
	for _, k := range get(owner, "the keys", chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid="audit-key"]')].map(e => e.textContent)`)) {
		if !strings.HasPrefix(k, "deploy bot mon_live_") || !strings.HasSuffix(k, ".********") {
			t.Errorf("the audit trail names a key %q, want its name and masked id", k)
		}
	}
	owner.screenshot("audit")
	// Its filter: only the revocation.
	owner.do("filter the audit trail", chromedp.SetValue(tid("audit-filter-action"), "key.revoked"),
		clickThrough(tid("audit-filter-submit"), tid("audit-row")))
	if n := len(get(owner, "audit rows", chromedp.Nodes(all(tid("audit-row"))))); n != 1 {
		t.Errorf("the audit trail of key.revoked: %d events, want 1", n)
	}
	if href := get(owner, "the export", chromedp.Evaluate[string](`document.querySelector('[data-testid="audit-export-json"]').getAttribute('href')`)); href != "/dashboard/orgs/"+o.ID+"/audit/export?action=key.revoked&format=json" {
		t.Errorf("the filtered trail's JSON export is %q", href)
	}
	owner.screenshot("audit-filtered")
	owner.do("the whole trail", chromedp.Navigate(base+"/dashboard/orgs/"+o.ID+"/audit"), chromedp.WaitVisible(tid("audit-row")))
	owner.do("audit at 390 px", chromedp.EmulateViewport(390, 800), chromedp.Reload(), chromedp.WaitVisible(tid("audit-row")))
	if w := get(owner, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		t.Errorf("at 390 px the audit page is %d px wide", w)
	}
	owner.screenshot("audit-390px")
	owner.do("keys at 390 px", chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(tid("key-row")))
	if w := get(owner, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		t.Errorf("at 390 px the keys page is %d px wide", w)
	}
	if n := get(owner, "the masked key's lines", chromedp.Evaluate[int](`document.querySelector('[data-testid="key-masked"]').getClientRects().length`)); n != 1 {
		t.Errorf("at 390 px the masked key takes %d lines, want 1", n)
	}
	owner.screenshot("keys-390px")
	owner.do("narrow", chromedp.EmulateViewport(320, 640), chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(tid("key-row")),
		chromedp.Click(rolledRow+tid("edit-settings")), chromedp.WaitVisible(rolledRow+tid("save-settings")))
	if w := get(owner, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 320 {
		t.Errorf("at 320 px the page, a settings form open, is %d px wide", w)
	}
	owner.screenshot("keys-320px")
	owner.do("wide again", chromedp.EmulateViewport(1400, 900))

	// A member of two organisations chooses one.
	second := s.cli("", "org", "create", "--name", "Second org", "--plan", "pro")["id"].(string)
	s.cli("", "member", "add", "--org", second, "--email", o.Email, "--role", "Admin")
	owner.do("chooser", chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(tid("org-link")))
	if n := len(get(owner, "org links", chromedp.Nodes(all(tid("org-link"))))); n != 2 {
		t.Errorf("chooser: %d organisations, want 2", n)
	}
	owner.screenshot("orgs")
	owner.do("log out", chromedp.Click(tid("logout")), chromedp.WaitVisible(tid("login-email")))

	// A wrong password is an error in words.
	stranger := newTab(t, b, base)
	stranger.logIn(o.Email, "not the password at all")
	msg := get(stranger, "the error", chromedp.Text(tid("error")))
	if msg != "Wrong email or password." {
		t.Errorf("wrong password: %q", msg)
	}
	stranger.screenshot("login-error")

	// A Viewer sees the keys without the controls.
	email, pw := fmt.Sprintf("viewer-%d@example.com", time.Now().UnixNano()), "viewer password 0123"
	s.cli(pw+"\n", "user", "create", "--email", email, "--password-stdin")
	s.cli("", "member", "add", "--org", o.ID, "--email", email, "--role", "Viewer")
	s.neverLog(pw)
	viewer := newTab(t, b, base)
	viewer.logIn(email, pw)
	viewer.do("the viewer's keys", chromedp.WaitVisible(tid("key-row")))
	for _, control := range []string{"revoke", "roll", "create-key-submit", "create-key-name", "edit-settings", "create-key-rate-limit"} {
		if n := len(get(viewer, control, chromedp.Nodes(all(tid(control)), chromedp.AtLeast(0)))); n != 0 {
			t.Errorf("a Viewer sees %d %s", n, control)
		}
	}
	viewer.screenshot("viewer")

	// A form posted from another site changes nothing.
	cross := doRequest(t, http.DefaultClient, "POST", base+"/dashboard/login",
		url.Values{"email": {o.Email}, "password": {o.Password}}.Encode(),
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Sec-Fetch-Site": {"cross-site"}})
	if cross.Status != http.StatusForbidden {
		t.Errorf("cross-site login form through the gateway: %d, want 403", cross.Status)
	}
}

// wantCompactRow checks the keys page's row of keyID at the wide viewport: its masked
// key on one line, its actions side by side on one line, the table no wider than the
// page.
func wantCompactRow(tb *tab, keyID string) {
	tb.t.Helper()
	row := `document.querySelector('tr[data-key-id="` + keyID + `"]')`
	if n := get(tb, "the masked key's lines", chromedp.Evaluate[int](row+`.querySelector('[data-testid="key-masked"]').getClientRects().length`)); n != 1 {
		tb.t.Errorf("the masked key takes %d lines, want 1", n)
	}
	tops := get(tb, "the actions' tops", chromedp.Evaluate[[]float64](`['roll-open', 'edit-settings', 'revoke'].map(id => `+
		row+`.querySelector('[data-testid="' + id + '"]').getBoundingClientRect().top)`))
	if len(tops) != 3 || tops[0] != tops[1] || tops[1] != tops[2] {
		tb.t.Errorf("the actions' tops are %v, want them side by side", tops)
	}
	if over := get(tb, "the table's overflow", chromedp.Evaluate[int](`(s => s.scrollWidth - s.clientWidth)(document.querySelector('table.keys').parentElement)`)); over > 0 {
		tb.t.Errorf("the keys table is %d px wider than the page", over)
	}
	if h := get(tb, "the row's height", chromedp.Evaluate[float64](row+`.getBoundingClientRect().height`)); h > 120 {
		tb.t.Errorf("the key's row is %.0f px high, want at most 120 (a few lines)", h)
	}
}

// wantSettings checks the keys page's limits and networks of the row: its minute's,
// its other windows' (comma-separated), and its networks.
func (s *Stack) wantSettings(tb *tab, row chromedp.CSS, limit, windows, cidrs string) {
	s.t.Helper()
	if got := get(tb, "the key's limit", chromedp.Text(row+tid("key-rate-limit"))); got != limit {
		s.t.Errorf("the key's limit shows %q, want %q", got, limit)
	}
	shown := get(tb, "the key's windows", chromedp.Evaluate[[]string](`[...document.querySelectorAll('`+string(row)+
		`[data-testid="key-window-limit"]')].map(e => e.textContent)`))
	if got := strings.Join(shown, ", "); got != windows {
		s.t.Errorf("the key's windows show %q, want %q", got, windows)
	}
	if got := strings.Join(strings.Fields(get(tb, "the key's networks", chromedp.Text(row+tid("key-cidrs")))), " "); got != cidrs {
		s.t.Errorf("the key's networks show %q, want %q", got, cidrs)
	}
}

// checkUsagePage adds usage of the keys oldID (revoked) and rolledID to o's record,
// then reads it on the usage page in tb: the chart has a bar per hour, and each key's
// total is the API's for the same range, with at least what was added. The gateway
// may have counted requests of its own: the API says how many.
func (s *Stack) checkUsagePage(tb *tab, o Org, oldID, rolledID string, oldServed, rolledServed int64) {
	s.t.Helper()
	now := time.Now()
	// The gateway records its answers a moment later: the page and the API are read
	// once the record has every answer the keys got, so that both read the same.
	since := now.Add(-time.Hour)
	reader := s.loginOwner(o)
	testenv.Eventually(s.t, 30*time.Second, "the gateway's record of the keys' /v1/me answers", func() bool {
		got := reader.usageTotals(o.ID, since)
		return got[oldID+" me 200"] >= oldServed && got[rolledID+" me 200"] >= rolledServed
	})
	s.recordUsage(o.ID,
		usageRow{oldID, now.Add(-3 * time.Hour), keystore.OutcomeProxied, 200, 40},
		usageRow{oldID, now.Add(-3 * time.Hour), keystore.OutcomeRateLimited, 429, 6},
		usageRow{rolledID, now.Add(-20 * time.Hour), keystore.OutcomeMe, 200, 12},
		usageRow{rolledID, now.Add(-time.Hour), keystore.OutcomeProxied, 200, 25},
		usageRow{rolledID, now, keystore.OutcomeProxied, 404, 3},
		usageRow{rolledID, now, keystore.OutcomeProxied, 502, 1},
		usageRow{rolledID, now, keystore.OutcomeIPDenied, 401, 4},
	)
	recorded := map[string]int64{oldID: 46, rolledID: 45}
	// A plan with a monthly quota: the page shows the month's use against it.
	s.cli("", "plan", "put", "--name", "metered", "--api-rate-limit", "600", "--max-monitors", "100", "--min-interval", "60",
		"--locations", "us-east", "--check-types", "http", "--api-requests-per-month", "100000")
	s.cli("", "org", "set-plan", "--org", o.ID, "--plan", "metered")

	tb.do("the usage page", chromedp.Navigate(tb.origin+"/dashboard"), chromedp.Click(tid("usage-link")),
		chromedp.WaitVisible(tid("usage-chart")))
	checkUsage := func(granularity string, bars int) {
		s.t.Helper()
		if n := len(get(tb, "bars", chromedp.Nodes(all(chromedp.CSS(`[data-testid="usage-chart"] g.bar`))))); n != bars {
			s.t.Errorf("%s: the chart has %d bars, want %d", granularity, n, bars)
		}
		r := s.login(o.Email, o.Password).do("GET", "/orgs/"+o.ID+"/usage?granularity="+granularity, nil, nil)
		var body struct {
			Data []struct {
				KeyID string `json:"key_id"`
				Count int64  `json:"count"`
				Units int64  `json:"units"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || r.Status != 200 {
			s.t.Fatalf("GET usage: %d %s", r.Status, r.Body)
		}
		api, apiUnits := map[string]int64{}, map[string]int64{}
		var total int64
		for _, d := range body.Data {
			api[d.KeyID] += d.Count
			apiUnits[d.KeyID] += d.Units
			total += d.Count
		}
		rows := get(tb, "key rows", chromedp.Nodes(all(tid("usage-key-row")), chromedp.AtLeast(0)))
		if len(rows) != 2 {
			s.t.Errorf("%s: %d key rows, want 2 (the live key, the revoked one with requests)", granularity, len(rows))
		}
		for id, least := range recorded {
			text := get(tb, "a key's total", chromedp.Text(chromedp.CSS(`tr[data-key-id="`+id+`"] [data-testid="usage-key-total"]`)))
			if text != strconv.FormatInt(api[id], 10) || api[id] < least {
				s.t.Errorf("%s: key %s's total on the page %q, in the API %d, recorded %d", granularity, id, text, api[id], least)
			}
			units := get(tb, "a key's units", chromedp.Text(chromedp.CSS(`tr[data-key-id="`+id+`"] [data-testid="usage-key-units"]`)))
			if units != strconv.FormatInt(apiUnits[id], 10) || apiUnits[id] < api[id] {
				s.t.Errorf("%s: key %s's units on the page %q, in the API %d", granularity, id, units, apiUnits[id])
			}
		}
		desc := get(tb, "the chart's text", chromedp.Evaluate[string](`document.querySelector('[data-testid="usage-chart"] desc').textContent`))
		if !strings.HasPrefix(desc, strconv.FormatInt(total, 10)+" requests in all: ") {
			s.t.Errorf("%s: the chart says %q, the API %d requests", granularity, desc, total)
		}
	}
	checkUsage("hour", 24)
	// Refused by address is a class of its own: in the chart, the legend and the text.
	if n := len(get(tb, "the address class's bars", chromedp.Nodes(all(chromedp.CSS(`[data-testid="usage-chart"] rect.address`))))); n != 1 {
		s.t.Errorf("the chart has %d bars of refused by address, want 1", n)
	}
	legend := get(tb, "the legend", chromedp.Text(chromedp.CSS(`ul.legend`)))
	if !strings.Contains(legend, "Refused by address (401, outside the key's allowed networks): 4") {
		s.t.Errorf("the legend says %q", legend)
	}
	if desc := get(tb, "the chart's text", chromedp.Evaluate[string](`document.querySelector('[data-testid="usage-chart"] desc').textContent`)); !strings.Contains(desc, ", 4 refused by address, ") {
		s.t.Errorf("the chart's text says %q", desc)
	}
	month := get(tb, "the month", chromedp.Text(tid("usage-month")))
	if !regexp.MustCompile(`^\d+ of 100000 requests in \d{4}-\d{2} \(UTC\), \d+ %\. It starts afresh on `).MatchString(month) {
		s.t.Errorf("the usage page says of the month: %q", month)
	}
	wantMaskedOnOneLine := func(width string) {
		s.t.Helper()
		if n := get(tb, "the masked keys' lines", chromedp.Evaluate[[]int](`[...document.querySelectorAll('table.usage-keys code')].map(c => c.getClientRects().length)`)); len(n) != 2 || n[0] != 1 || n[1] != 1 {
			s.t.Errorf("at %s the usage page's masked keys take %v lines, want 1 each", width, n)
		}
	}
	wantMaskedOnOneLine("1,400 px")
	tb.screenshot("usage")
	tb.do("at 390 px", chromedp.EmulateViewport(390, 800), chromedp.Reload(), chromedp.WaitVisible(tid("usage-chart")))
	if w := get(tb, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		s.t.Errorf("at 390 px the usage page is %d px wide", w)
	}
	wantMaskedOnOneLine("390 px")
	tb.screenshot("usage-390px")
	tb.do("narrow", chromedp.EmulateViewport(320, 640), chromedp.Reload(), chromedp.WaitVisible(tid("usage-chart")))
	if w := get(tb, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 320 {
		s.t.Errorf("at 320 px the usage page is %d px wide", w)
	}
	tb.screenshot("usage-320px")
	tb.do("wide again", chromedp.EmulateViewport(1400, 900))
	tb.do("30 days", clickThrough(tid("usage-range-30d"), tid("usage-chart")))
	checkUsage("day", 30)
}
