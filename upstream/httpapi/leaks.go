package httpapi

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// Bounds of a leak report (docs/security.md, "Keys").
const (
	// maxLeakReports is the most tokens one request may report. More is 413.
	maxLeakReports = 1000
	// maxLeakReportBytes bounds a leak report's body. 1000 reports with URLs of 2048
	// characters would not fit in maxBodyBytes.
	maxLeakReportBytes = 4 << 20
	// MinLeakReportToken is the shortest Config.LeakReportToken accepted.
	MinLeakReportToken = 32
	// maxLeakURL is the longest URL a report may give (audit_events.url).
	maxLeakURL = 2048
)

// leakOutcomeJSON is the answer for one reported token. It never holds the token, nor
// any part of it: a key in the URL is redacted, as it is where the URL is kept.
type leakOutcomeJSON struct {
	URL     string `json:"url"`
	Outcome string `json:"outcome"`
}

// handleLeakReport answers POST /security/leaked-keys, the route of secret scanners.
// The bearer token must be Config.LeakReportToken (401). The body is a JSON array of
// 1 to 1000 {"token","url"} (400, and 413 above 1000). The answer is 200
// {"data":[{"url","outcome"}…]}, in the order of the reports. Every live key among the
// tokens is revoked, and audited as key.leaked.
func (s *Server) handleLeakReport(w http.ResponseWriter, r *http.Request) error {
	if !s.leakReporter(r.Header) {
		w.Header().Set("WWW-Authenticate", "Bearer")
		return apperr.ErrUnauthenticated
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLeakReportBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return apperr.ErrRequestTooLarge
	case err != nil:
		return apperr.Invalid("body", "could not be read")
	}
	reports, err := decodeLeakReports(body)
	if err != nil {
		return err
	}
	outcomes, err := s.keys.RevokeLeaked(r.Context(), reports)
	if err != nil {
		return err
	}
	data := make([]leakOutcomeJSON, len(reports))
	for i, rep := range reports {
		data[i] = leakOutcomeJSON{URL: keystore.Redact(rep.URL), Outcome: outcomes[i]}
	}
	writeJSON(w, http.StatusOK, struct {
		Data []leakOutcomeJSON `json:"data"`
	}{data})
	return nil
}

// leakReporter reports whether h carries exactly one Authorization header "Bearer
// <token>" with Config.LeakReportToken. The tokens are compared as SHA-256 digests in
// constant time.
func (s *Server) leakReporter(h http.Header) bool {
	values := h.Values("Authorization")
	presented := ""
	if len(values) == 1 {
		if scheme, token, ok := strings.Cut(values[0], " "); ok && strings.EqualFold(scheme, "Bearer") {
			presented = token
		}
	}
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], s.leakTokenSum[:]) == 1 && presented != ""
}

// decodeLeakReports decodes a leak report's body: a JSON array of 1 to maxLeakReports
// objects. Each is {"token": non-empty string, "url": 1 to maxLeakURL characters}. More
// reports are apperr.ErrRequestTooLarge. Anything else wrong is an apperr.EINVALID
// error naming the report's index and field.
func decodeLeakReports(body []byte) ([]keystore.LeakReport, error) {
	notArray := apperr.Invalid("body", `must be a JSON array of {"token","url"} objects`)
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, notArray
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, notArray
	}
	var reports []keystore.LeakReport
	for dec.More() {
		if len(reports) == maxLeakReports {
			return nil, apperr.ErrRequestTooLarge
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, apperr.Invalid("body", "is not valid JSON")
		}
		rep, err := decodeLeakReport(len(reports), raw)
		if err != nil {
			return nil, err
		}
		reports = append(reports, rep)
	}
	if _, err := dec.Token(); err != nil {
		return nil, apperr.Invalid("body", "is not valid JSON")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, apperr.Invalid("body", "must hold a single JSON array and nothing after it")
	}
	if len(reports) == 0 {
		return nil, apperr.Invalid("body", "must list 1 to %d reports", maxLeakReports)
	}
	return reports, nil
}

// decodeLeakReport decodes the report at index i of the array.
func decodeLeakReport(i int, raw json.RawMessage) (keystore.LeakReport, error) {
	at := fmt.Sprintf("[%d]", i)
	if len(raw) == 0 || raw[0] != '{' {
		return keystore.LeakReport{}, apperr.Invalid(at, "must be an object, not %s", kindOf(raw))
	}
	return decodeObjectInto(raw, at+".", []string{"token", "url"}, func(rep *keystore.LeakReport, name string, raw json.RawMessage) error {
		var err error
		field := at + "." + name
		switch name {
		case "token":
			rep.Token, err = decodeString(field, raw)
			if err == nil && rep.Token == "" {
				err = apperr.Invalid(field, "must not be empty")
			}
		case "url":
			rep.URL, err = decodeText(field, raw, 1, maxLeakURL)
		default:
			err = apperr.Invalid(field, "unknown field")
		}
		return err
	})
}
