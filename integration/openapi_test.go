package integration

// Every exchange of the suite goes through doRequest, which checks it against the
// OpenAPI documents of package openapi, so that they cannot drift from the code:
//
//   - an answer to a route of a document must have a status and a body the document
//     gives that route (kin-openapi's openapi3filter, with the status required);
//   - a request the code accepted (2xx) must be one the document allows;
//   - a request to a path or method no document has must be answered 404 or 405:
//     the code may have no route the documents lack.
//
// Requests the suite sends on purpose with bad input (4xx) are not themselves checked
// against the documents: the document describes the answers they get.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/keygate/keygate/openapi"
	"github.com/keygate/keygate/openapi/openapitest"
)

// document is one OpenAPI document and its router.
type document struct {
	name   string
	router routers.Router
}

var (
	documentsOnce sync.Once
	documents     map[string]*document // by name: "v1.yaml", "dashboard.yaml"
	documentsErr  error
)

// loadDocuments parses the documents in openapi.Files once.
func loadDocuments() (map[string]*document, error) {
	documentsOnce.Do(func() {
		documents = map[string]*document{}
		for _, name := range openapi.Names {
			doc, err := openapitest.Load(name)
			if err != nil {
				documentsErr = err
				return
			}
			// The servers entry "/" is relative; any host of the suite's is the server.
			doc.Servers = nil
			router, err := gorillamux.NewRouter(doc)
			if err != nil {
				documentsErr = err
				return
			}
			documents[name] = &document{name: name, router: router}
		}
	})
	return documents, documentsErr
}

// documentFor returns the document describing path: v1.yaml for /v1, dashboard.yaml
// for the upstream's session API, nil for the paths no document describes (the
// documents themselves, the dashboard's pages, the JWKS, admin endpoints).
func documentFor(path string) string {
	switch {
	case path == "/v1" || strings.HasPrefix(path, "/v1/"):
		return "v1.yaml"
	case strings.HasPrefix(path, "/auth/"), strings.HasPrefix(path, "/orgs/"), strings.HasPrefix(path, "/security/"):
		return "dashboard.yaml"
	}
	return ""
}

// decidedBeforeRouting are the answers the gateway gives on any path under /v1, before
// a route is looked up: the key, the plan, the budgets, the role, its database.
var decidedBeforeRouting = map[int]bool{
	http.StatusUnauthorized: true, http.StatusForbidden: true, http.StatusPaymentRequired: true,
	http.StatusTooManyRequests: true, http.StatusServiceUnavailable: true,
}

// exchangeError returns what is wrong with one exchange against the documents, or nil.
// With record, the exchange counts in the coverage (see writeCoverage).
func exchangeError(req *http.Request, reqBody []byte, status int, header http.Header, body []byte, record bool) error {
	name := documentFor(req.URL.Path)
	if name == "" {
		return nil
	}
	docs, err := loadDocuments()
	if err != nil {
		return err
	}
	// A HEAD is checked as the GET it stands for, without a body.
	probe := req.Clone(context.Background())
	if req.Method == http.MethodHead {
		probe.Method = http.MethodGet
	}
	probe.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, params, err := docs[name].router.FindRoute(probe)
	if err != nil {
		if (errors.Is(err, routers.ErrPathNotFound) && status == http.StatusNotFound) ||
			(errors.Is(err, routers.ErrMethodNotAllowed) && status == http.StatusMethodNotAllowed) {
			return nil // no such route in the document, nor in the code
		}
		if name == "v1.yaml" && decidedBeforeRouting[status] {
			return nil // the gateway's checks come before any route (v1.yaml's description)
		}
		return &docError{name, req, status, "the route is not in the document: " + err.Error()}
	}
	if record {
		covered.Store(route.Method+" "+route.Path+" "+strconv.Itoa(status), true)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}
	in := &openapi3filter.RequestValidationInput{Request: probe, PathParams: params, Route: route, Options: opts}
	ctx := context.Background()
	if status >= 200 && status < 300 {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			return &docError{name, req, status, "the code accepted a request the document does not allow: " + err.Error()}
		}
	}
	if req.Method == http.MethodHead {
		body = nil
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return &docError{name, req, status, err.Error()}
	}
	return nil
}

// docError is an exchange that breaks a document.
type docError struct {
	doc    string
	req    *http.Request
	status int
	what   string
}

func (e *docError) Error() string {
	return e.req.Method + " " + e.req.URL.Path + " → " + http.StatusText(e.status) + ": breaks openapi/" + e.doc + ": " + e.what
}

// covered holds "METHOD /route status" of every exchange checked against a route.
var covered sync.Map

// writeCoverage writes the sorted lines of covered to the file named by
// KEYGATE_OPENAPI_COVERAGE, if set: which routes and statuses the suite exercised.
func writeCoverage() error {
	path := os.Getenv("KEYGATE_OPENAPI_COVERAGE")
	if path == "" {
		return nil
	}
	var lines []string
	covered.Range(func(k, _ any) bool {
		lines = append(lines, k.(string))
		return true
	})
	sort.Strings(lines)
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// checkExchange fails t when an exchange breaks the documents.
func checkExchange(t testing.TB, req *http.Request, reqBody []byte, res *http.Response, body []byte) {
	t.Helper()
	if err := exchangeError(req, reqBody, res.StatusCode, res.Header, body, true); err != nil {
		t.Error(err)
	}
}

func TestTheDocumentCheckBites(t *testing.T) {
	// Exchanges made up here, each broken in one way, must each be caught; the unbroken
	// ones must pass. Without this, a check that lets everything through would look
	// like a suite that matches its documents.
	limits := `"limits":{"per_minute":600,"per_second":null,"per_hour":null,"per_day":null,"org_per_minute":null,"per_month":null,"used_this_month":null}`
	me := `{"org_id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11","role":"Editor",` + limits + `}`
	monitor := `{"id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11","name":"a","type":"http","target":"https://example.com",` +
		`"interval_seconds":60,"locations":["us-east"],"paused":false,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}`
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name         string
		method, path string
		reqBody      string
		status       int
		body         string
		wantErr      bool
	}{
		{"GET /v1/me as documented", "GET", "/v1/me", "", 200, me, false},
		{"GET /v1/me without role", "GET", "/v1/me", "", 200, `{"org_id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11",` + limits + `}`, true},
		{"GET /v1/me with a role the document lacks", "GET", "/v1/me", "", 200, `{"org_id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11","role":"Owner",` + limits + `}`, true},
		{"GET /v1/me with an undocumented status", "GET", "/v1/me", "", http.StatusTeapot, `{"error":"teapot"}`, true},
		{"a 429 without retryAfter", "GET", "/v1/me", "", 429, `{"error":"rate_limited"}`, true},
		{"a 429 of a window", "GET", "/v1/me", "", 429, `{"error":"rate_limited","retryAfter":3,"budget":"key","window":"second","cost":2}`, false},
		{"a 429 of a window the document lacks", "GET", "/v1/me", "", 429, `{"error":"rate_limited","retryAfter":3,"budget":"key","window":"week"}`, true},
		{"a 429 that never fits", "GET", "/v1/me", "", 429, `{"error":"rate_limited","budget":"key","window":"second","cost":6,"limit":5,"fits":false}`, false},
		{"a 429 that never fits, with retryAfter", "GET", "/v1/me", "", 429,
			`{"error":"rate_limited","retryAfter":1,"budget":"key","window":"second","cost":6,"limit":5,"fits":false}`, true},
		{"a 429 that never fits, without its limit", "GET", "/v1/me", "", 429, `{"error":"rate_limited","budget":"key","window":"day","cost":6,"fits":false}`, true},
		{"a route the document lacks, answered", "GET", "/v1/keys", "", 200, `{"data":[]}`, true},
		{"a route the document lacks, answered 404", "GET", "/v1/keys", "", 404, `{"error":"not found"}`, false},
		{"a monitor created as documented", "POST", "/v1/monitors", `{"name":"a","type":"http","target":"https://example.com"}`, 201, monitor, false},
		{"a create accepted without its name", "POST", "/v1/monitors", `{"type":"http","target":"https://example.com"}`, 201, monitor, true},
		{"a bad create refused", "POST", "/v1/monitors", `{"type":"http"}`, 400, `{"error":"invalid_request","message":"name: required"}`, false},
		{"an unknown field in an answer is fine", "GET", "/v1/me", "", 200, `{"org_id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11","role":"Admin",` + limits + `,"new":1}`, false},
		{"GET /v1/me without limits", "GET", "/v1/me", "", 200, `{"org_id":"0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11","role":"Admin"}`, true},
		{"usage as documented", "GET", "/orgs/0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11/usage", "", 200,
			`{"granularity":"hour","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","data":[{"key_id":"abcdefghijklmnop","start":"2026-01-01T00:00:00Z","outcome":"proxied","status":200,"count":1,"units":1}]}`, false},
		{"a usage row with an outcome the document lacks", "GET", "/orgs/0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11/usage", "", 200,
			`{"granularity":"hour","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","data":[{"key_id":"abcdefghijklmnop","start":"2026-01-01T00:00:00Z","outcome":"unauthenticated","status":401,"count":1}]}`, true},
		{"a dashboard key without masked_key", "GET", "/orgs/0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11/api-keys", "", 200,
			`{"data":[{"id":"abcdefghijklmnop","name":"k","role":"Admin","created_at":"2026-01-01T00:00:00Z","expires_at":null,"revoked_at":null}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://127.0.0.1:1"+tc.path, strings.NewReader(tc.reqBody))
			if err != nil {
				t.Fatal(err)
			}
			if tc.reqBody != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			header := jsonHeader.Clone()
			if tc.status == 429 {
				header.Set("Retry-After", "10")
			}
			err = exchangeError(req, []byte(tc.reqBody), tc.status, header, []byte(tc.body), false)
			if (err != nil) != tc.wantErr {
				t.Errorf("check answered %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}

// requestError returns what is wrong with a request against the documents, or nil:
// the check doRequest makes of the requests the code accepted.
func requestError(method, path string, body []byte) error {
	docs, err := loadDocuments()
	if err != nil {
		return err
	}
	req, err := http.NewRequest(method, "http://127.0.0.1:1"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	route, params, err := docs[documentFor(path)].router.FindRoute(req)
	if err != nil {
		return err
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	return openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route, Options: opts,
	})
}

func TestTheDocumentsRefuseTheBodiesTheServerRefuses(t *testing.T) {
	// A client that validates its requests against the documents learns of each of
	// these before sending it; the server answers each with 400. (doRequest checks the
	// other way: every request the server accepts, the documents allow.)
	s := newStack(t)
	s.serveLeakReports()
	org, owner := s.newOwner("enterprise") // every type and location, 10 s intervals: no plan gate answers first
	keyID, key := owner.createKey(org.ID, "k", "Admin", nil)
	a := s.api(key, 0)
	id := a.do("POST", "/v1/monitors", newMonitor("m")).JSON(t)["id"].(string)
	with := func(field string, value any) map[string]any {
		m := map[string]any{"name": "m", "type": "http", "target": "https://example.com"}
		m[field] = value
		return m
	}
	long := strings.Repeat("a", 2049)
	for _, tc := range []struct {
		name         string
		method, path string
		body         any
	}{
		{"duplicate locations", "POST", "/v1/monitors", with("locations", []string{"us-east", "us-east"})},
		{"no locations", "POST", "/v1/monitors", with("locations", []string{})},
		{"an unknown location", "POST", "/v1/monitors", with("locations", []string{"mars"})},
		{"an empty target", "POST", "/v1/monitors", with("target", "")},
		{"a target of 2049 characters", "POST", "/v1/monitors", with("target", "https://example.com/"+long[20:])},
		{"an http target without scheme", "POST", "/v1/monitors", with("target", "example.com")},
		{"a target with white space", "POST", "/v1/monitors", with("target", "https://example.com/a b")},
		{"a tcp target without port", "POST", "/v1/monitors", map[string]any{"name": "m", "type": "tcp", "target": "example.com"}},
		{"a tcp target with port 0", "POST", "/v1/monitors", map[string]any{"name": "m", "type": "tcp", "target": "example.com:0"}},
		{"a dns target that is an address", "POST", "/v1/monitors", map[string]any{"name": "m", "type": "dns", "target": "192.0.2.1"}},
		{"an icmp target that is a URL", "POST", "/v1/monitors", map[string]any{"name": "m", "type": "icmp", "target": "https://example.com"}},
		{"a control character in name", "POST", "/v1/monitors", with("name", "a\u0001b")},
		{"a C1 control character in name", "POST", "/v1/monitors", with("name", "a\u0085b")},
		{"an empty name", "POST", "/v1/monitors", with("name", "")},
		{"a name of 201 characters", "POST", "/v1/monitors", with("name", strings.Repeat("é", 201))},
		{"an unknown type", "POST", "/v1/monitors", with("type", "smtp")},
		{"an interval below 10", "POST", "/v1/monitors", with("interval_seconds", 5)},
		{"an interval as a string", "POST", "/v1/monitors", with("interval_seconds", "60")},
		{"paused as a string", "POST", "/v1/monitors", with("paused", "yes")},
		{"config as an array", "POST", "/v1/monitors", with("config", []any{1})},
		{"assertions as an object", "POST", "/v1/monitors", with("assertions", map[string]any{})},
		{"an unknown field", "POST", "/v1/monitors", with("colour", "red")},
		{"a create without name", "POST", "/v1/monitors", map[string]any{"type": "http", "target": "https://example.com"}},
		{"a null name", "POST", "/v1/monitors", with("name", nil)},
		{"a PATCH with duplicate locations", "PATCH", "/v1/monitors/" + id, map[string]any{"locations": []string{"eu-west", "eu-west"}}},
		{"a PATCH to a type its target does not suit", "PATCH", "/v1/monitors/" + id, map[string]any{"type": "tcp", "target": "https://example.com"}},
		{"a PATCH with a control character in name", "PATCH", "/v1/monitors/" + id, map[string]any{"name": "a\u007fb"}},
		{"a PATCH with an unknown field", "PATCH", "/v1/monitors/" + id, map[string]any{"colour": "red"}},
		{"a dashboard create with an empty target", "POST", "/orgs/" + org.ID + "/monitors", with("target", "")},
		{"a key name with a control character", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "a\u0000b", "role": "Admin"}},
		{"a key with an unknown field", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "colour": "red"}},
		{"a roll with an unknown field", "POST", "/orgs/" + org.ID + "/api-keys/" + keyID + "/roll", map[string]any{"grace_seconds": 1, "colour": "red"}},
		{"a key with a rate limit of 0", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "rate_limit": 0}},
		{"a key with a fractional rate limit", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "rate_limit": 1.5}},
		{"a key with networks as a string", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "allowed_cidrs": "10.0.0.0/8"}},
		{"a key with a network that is a word", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "allowed_cidrs": []string{"office"}}},
		{"a key with a network twice", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "allowed_cidrs": []string{"10.0.0.0/8", "10.0.0.0/8"}}},
		{"a key with 33 networks", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "allowed_cidrs": networks(33)}},
		{"a key with no scope", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "scopes": []string{}}},
		{"a key with an unknown scope", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "scopes": []string{"monitors:admin"}}},
		{"a key with a scope twice", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "scopes": []string{"monitors:read", "monitors:read"}}},
		{"a key update with scopes as a string", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{"scopes": "monitors:read"}},
		{"an empty key update", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{}},
		{"a key update with an unknown field", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{"rate_limit": 5, "name": "x"}},
		{"a key update with a negative rate limit", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{"rate_limit": -1}},
		{"a key update with a second of 0", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{"rate_limit_per_second": 0}},
		{"a key with a fractional day", "POST", "/orgs/" + org.ID + "/api-keys", map[string]any{"name": "k", "role": "Admin", "rate_limit_per_day": 1.5}},
		{"a key update with a network as a number", "PATCH", "/orgs/" + org.ID + "/api-keys/" + keyID, map[string]any{"allowed_cidrs": []any{10}}},
		{"a login with an empty email", "POST", "/auth/login", map[string]any{"email": "", "password": "x"}},
		{"a leak report without url", "POST", "/security/leaked-keys", []any{map[string]any{"token": "x"}}},
		{"a leak report with an empty token", "POST", "/security/leaked-keys", []any{map[string]any{"token": "", "url": "https://example.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if err := requestError(tc.method, tc.path, raw); err == nil {
				t.Errorf("the documents allow %.200s", raw)
			}
			var r Resp
			switch {
			case strings.HasPrefix(tc.path, "/v1/"):
				r = a.do(tc.method, tc.path, tc.body)
			case tc.path == "/security/leaked-keys":
				r = s.raw(tc.method, s.URL(0)+tc.path, tc.body, http.Header{"Authorization": {"Bearer " + leakToken}})
			default:
				r = owner.do(tc.method, tc.path, tc.body, nil)
			}
			if r.Status != http.StatusBadRequest || r.JSON(t)["error"] != "invalid_request" {
				t.Errorf("the server answered %d %s, want 400 invalid_request", r.Status, r.Body)
			}
		})
	}
	// Bodies at the edges of the rules are accepted, and doRequest checks that the
	// documents allow them too.
	for _, body := range []map[string]any{
		{"name": strings.Repeat("é", 200), "type": "http", "target": "HTTPS://user@Example.COM:0443/a?b#c"},
		{"name": "m", "type": "tcp", "target": "[2001:db8::1]:53", "locations": []string{"eu-west", "us-east"}},
		{"name": "m", "type": "dns", "target": "xn--bcher-kva.example."},
		{"name": "m", "type": "icmp", "target": "::ffff:192.0.2.1", "interval_seconds": 10, "paused": true},
	} {
		if r := a.do("POST", "/v1/monitors", body); r.Status != http.StatusCreated {
			t.Errorf("create %v: %d %s", body, r.Status, r.Body)
		}
	}
	if r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{"name": "k", "role": "Viewer", "expires_at": nil}, nil); r.Status != http.StatusCreated {
		t.Errorf("a key with expires_at null: %d %s", r.Status, r.Body)
	}
	for _, body := range []map[string]any{
		{"rate_limit": nil, "allowed_cidrs": networks(32)},
		{"rate_limit": 2147483647},
		{"allowed_cidrs": []string{"::", "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", "0.0.0.0/0", "2001:DB8::/32"}},
		{"allowed_cidrs": []string{}},
	} {
		if r := owner.do("PATCH", "/orgs/"+org.ID+"/api-keys/"+keyID, body, nil); r.Status != http.StatusOK {
			t.Errorf("update %v: %d %s", body, r.Status, r.Body)
		}
	}
}

// networks returns n distinct IPv4 CIDRs.
func networks(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	return out
}

func TestAGoClientGeneratedFromTheDocumentsWorks(t *testing.T) {
	// openapi/testdata/goclient, built on the clients oapi-codegen generates from the
	// documents, logs in, creates keys, narrows one's scopes and sends them as null
	// again, and uses the keys: a create with a config, a PATCH of one field, and the
	// typed bodies of 400, 402, 403 and 404.
	dir := openapitest.GoClient(t)
	bin := filepath.Join(t.TempDir(), "goclient")
	openapitest.Go(t, dir, "build", "-o", bin, ".")
	s := newStack(t)
	org := s.newOrg("pro")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-url", s.URL(0), "-email", org.Email, "-password", org.Password, "-org", org.ID).CombinedOutput()
	if err != nil {
		t.Fatalf("the generated client: %v\n%s", err, out)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := writeCoverage(); err != nil {
		println("writing the OpenAPI coverage:", err.Error())
		code = 1
	}
	os.Exit(code)
}
