// Package prometheus holds keygate's Prometheus alerting rules (keygate.rules.yml)
// and their unit tests (keygate.rules.test.yml), and reads the names of the series
// the rules use, so that the tests of the packages exporting them can check that
// every one exists: a renamed metric breaks a test, not an alert.
package prometheus

import (
	_ "embed"
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/keygate/keygate/deploy/grafana"
)

// Rules is deploy/prometheus/keygate.rules.yml, to load with Prometheus's rule_files.
//
//go:embed keygate.rules.yml
var Rules []byte

// Series returns the metric names the rules' expressions use, sorted, once each.
func Series() ([]string, error) {
	var doc struct {
		Groups []struct {
			Rules []struct {
				Expr string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(Rules, &doc); err != nil {
		return nil, fmt.Errorf("reading keygate.rules.yml: %v", err)
	}
	var names []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			names = append(names, grafana.SeriesOf(r.Expr)...)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("keygate.rules.yml has no rules")
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
