package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/keygate/keygate/upstream/apperr"
)

// The dashboard is the JSON API's second door, for a person in a browser
// (docs/dashboard.md). Its pages live under /dashboard and are rendered on the server.
// Its forms decode into the JSON API's input types and call the same operations. Its
// routes stand in the API's route table, so its forms pass the same cross-origin
// protection. Its session is the API's cookie. This file holds the adapter of every
// page. The other dashboard*.go files hold the pages and their templates.

// dashboardCSP is the Content-Security-Policy of every dashboard answer. It allows
// nothing from another origin, no inline script or style, no eval and no framing.
// Forms may post only to this origin.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// pageFunc is a dashboard page. It writes its answer, a page or a redirect. Or it
// returns the error to show, and writes nothing.
type pageFunc func(w http.ResponseWriter, r *http.Request) error

// page adapts h to net/http. It sets the security headers on every answer, errors
// included. It is the one place where a page's error is shown (writePageError).
func (s *Server) page(h pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", dashboardCSP)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		if err := h(w, r); err != nil {
			s.writePageError(w, r, err)
		}
	}
}

// pageError is an error shown on a page other than the error page. data is what that
// page shows around the error.
type pageError struct {
	tmpl string
	data *pageData
	err  error
}

func (e *pageError) Error() string { return e.err.Error() }
func (e *pageError) Unwrap() error { return e.err }

// showOn returns err to be shown on the page tmpl, filled with data.
func showOn(tmpl string, data *pageData, err error) error {
	return &pageError{tmpl: tmpl, data: data, err: err}
}

// writePageError shows err to the person at the page. A page that needs a session and
// finds none sends the browser to the login form. Any other error is said in words. It
// appears on the page showOn named, or else on the error page. The status is the JSON
// API's for the same error. callerError logs internal causes, as for the API.
func (s *Server) writePageError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, apperr.ErrUnauthenticated) {
		seeOther(w, "/dashboard")
		return
	}
	tmpl, data := "error", &pageData{Title: "Error"}
	var pe *pageError
	if errors.As(err, &pe) {
		tmpl, data, err = pe.tmpl, pe.data, pe.err
	}
	e := s.callerError(r, err)
	if e.Code == apperr.ERATELIMITED {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	data.Error = pageMessage(e)
	s.render(w, errorResponses[e.Code].status, tmpl, data)
}

// pageMessage says e in words for the person at the page.
func pageMessage(e *apperr.Error) string {
	switch {
	case e == apperr.ErrBadCredentials:
		return "Wrong email or password."
	case e.Code == apperr.ERATELIMITED:
		return fmt.Sprintf("Too many failed logins. Try again in %d seconds.", e.RetryAfter)
	case e.Code == apperr.EFEATUREGATED && e.Detail == "api":
		return "Your organisation's plan has no API access, so it cannot create or roll API keys. Upgrade the plan to use the API."
	case e.Code == apperr.EINVALID:
		return "Please check the form: " + e.Message + "."
	case e.Code == apperr.EFORBIDDEN:
		return "Only Owners and Admins may manage this organisation's API keys."
	case e.Code == apperr.ENOTFOUND:
		return "There is no such page, or it is not yours to see."
	case e.Code == apperr.ECONFLICT:
		return strings.ToUpper(e.Message[:1]) + e.Message[1:] + "."
	case e.Code == apperr.EUNAUTHORIZED:
		return "Please log in."
	case e.Code == apperr.ETOOLARGE:
		return "The form sent was too large."
	case e.Code == apperr.EUNAVAILABLE:
		return "The service is unavailable right now. Please try again shortly."
	}
	return "Something went wrong on our side. Please try again."
}

// seeOther redirects the browser to path after a form. A 303 makes the next request a
// GET.
func seeOther(w http.ResponseWriter, path string) {
	w.Header().Set("Location", path)
	w.WriteHeader(http.StatusSeeOther)
}

// readForm reads a form body (application/x-www-form-urlencoded) within maxBodyBytes.
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	body, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	v, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, apperr.Invalid("form", "could not be read")
	}
	return v, nil
}
