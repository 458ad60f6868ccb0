// Package grafana holds keygate's Grafana dashboard (keygate.json) and reads the names
// of the series its queries use, so that the tests of the packages exporting them can
// check that every one exists: a renamed metric breaks a test, not a dashboard.
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Dashboard is deploy/grafana/keygate.json, to import into Grafana.
//
//go:embed keygate.json
var Dashboard []byte

// Series returns the metric names queried by the dashboard's panels, sorted, once each.
func Series() ([]string, error) {
	var doc any
	if err := json.Unmarshal(Dashboard, &doc); err != nil {
		return nil, fmt.Errorf("reading keygate.json: %v", err)
	}
	var exprs []string
	collectExprs(doc, &exprs)
	if len(exprs) == 0 {
		return nil, fmt.Errorf("keygate.json has no queries")
	}
	var names []string
	for _, e := range exprs {
		names = append(names, SeriesOf(e)...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// collectExprs appends every string named "expr" in v, at any depth.
func collectExprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				*out = append(*out, s)
				continue
			}
			collectExprs(x, out)
		}
	case []any:
		for _, x := range v {
			collectExprs(x, out)
		}
	}
}

var (
	// What in a PromQL expression is not a metric name: strings, label matchers and
	// grouping lists (in braces or after by/without/on/ignoring), ranges, variables.
	quoted    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	braces    = regexp.MustCompile(`\{[^{}]*\}`)
	grouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	brackets  = regexp.MustCompile(`\[[^\]]*\]`)
	variables = regexp.MustCompile(`\$\{?\w+\}?`)
	numbers   = regexp.MustCompile(`\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b`)
	ident     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	keywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// SeriesOf returns the metric names in one PromQL expression: the identifiers that are
// neither functions, aggregations, keywords, label names nor numbers.
func SeriesOf(expr string) []string {
	s := quoted.ReplaceAllString(expr, `""`)
	s = braces.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	s = brackets.ReplaceAllString(s, " ")
	s = variables.ReplaceAllString(s, " ")
	s = numbers.ReplaceAllString(s, " ")
	var names []string
	for _, m := range ident.FindAllStringSubmatch(s, -1) {
		name := strings.TrimSpace(m[0])
		if m[1] != "" || keywords[strings.ToLower(name)] { // a call, or a keyword
			continue
		}
		names = append(names, name)
	}
	return names
}
