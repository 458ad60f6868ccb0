package httpapi

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The dashboard's session pages (home, login, logout) and the checks every page of an
// organisation starts with.

// pageHome answers GET /dashboard. Without a session it shows the login form. With
// one, it goes to the organisation's keys when the user has one organisation. It shows
// the chooser otherwise, or when asked with ?choose=1.
func (s *Server) pageHome(w http.ResponseWriter, r *http.Request) error {
	userID, err := s.authenticate(r)
	if errors.Is(err, apperr.ErrUnauthenticated) {
		s.render(w, http.StatusOK, "login", &pageData{Title: "Log in"})
		return nil
	}
	if err != nil {
		return err
	}
	orgs, err := s.store.UserOrgs(r.Context(), userID)
	if err != nil {
		return err
	}
	if len(orgs) == 1 && r.URL.Query().Get("choose") == "" {
		seeOther(w, "/dashboard/orgs/"+orgs[0].ID)
		return nil
	}
	s.render(w, http.StatusOK, "orgs", &pageData{
		Title: "Organisations", User: true, MultiOrg: len(orgs) > 1, Orgs: orgs,
	})
	return nil
}

// pageLogin answers the login form as POST /auth/login does, then goes back to
// /dashboard. A failure shows the form again with the error.
func (s *Server) pageLogin(w http.ResponseWriter, r *http.Request) error {
	data := &pageData{Title: "Log in"}
	if err := s.logInFromForm(w, r, data); err != nil {
		return showOn("login", data, err)
	}
	seeOther(w, "/dashboard")
	return nil
}

// logInFromForm reads the login form into a loginInput and logs in with it. It keeps
// the email typed in data.
func (s *Server) logInFromForm(w http.ResponseWriter, r *http.Request, data *pageData) error {
	form, err := readForm(w, r)
	if err != nil {
		return err
	}
	in := loginInput{Email: form.Get("email"), Password: form.Get("password")}
	data.Email = in.Email
	if err := in.check(); err != nil {
		return err
	}
	return s.logIn(w, r, in)
}

// pageLogout answers the log out button as POST /auth/logout does.
func (s *Server) pageLogout(w http.ResponseWriter, r *http.Request) error {
	if err := s.logOut(w, r); err != nil {
		return err
	}
	seeOther(w, "/dashboard")
	return nil
}

// keyRoles are the roles a key may have, in the create form's order.
var keyRoles = []string{string(keystore.RoleAdmin), string(keystore.RoleEditor), string(keystore.RoleViewer)}

// orgPage checks a page of the path's organisation as member does for the JSON API.
// It returns what every organisation page shows.
func (s *Server) orgPage(r *http.Request, title string) (principal, *pageData, error) {
	p, err := s.member(r)
	if err != nil {
		return principal{}, nil, err
	}
	orgs, err := s.store.UserOrgs(r.Context(), p.userID)
	if err != nil {
		return principal{}, nil, err
	}
	data := &pageData{
		Title: title, User: true, MultiOrg: len(orgs) > 1, CanManage: p.canManageKeys(),
		Org: &store.OrgMembership{ID: p.orgID, Role: p.role}, Roles: keyRoles,
		Form: keyForm{Role: string(keystore.RoleViewer)},
	}
	for i := range orgs {
		if orgs[i].ID == p.orgID {
			data.Org = &orgs[i]
		}
	}
	return p, data, nil
}

// managerPage is orgPage for a page that needs api_key:manage (403 otherwise).
func (s *Server) managerPage(r *http.Request, title string) (principal, *pageData, error) {
	p, data, err := s.orgPage(r, title)
	if err == nil && !p.canManageKeys() {
		return principal{}, nil, apperr.ErrForbidden
	}
	return p, data, err
}

// managerForm is managerPage for a form sent from the keys page. It reads the form.
func (s *Server) managerForm(w http.ResponseWriter, r *http.Request) (principal, *pageData, url.Values, error) {
	p, data, err := s.managerPage(r, "API keys")
	if err != nil {
		return principal{}, nil, nil, err
	}
	form, err := readForm(w, r)
	if err != nil {
		return principal{}, nil, nil, err
	}
	return p, data, form, nil
}
