package httpapi

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/store"
)

// The usage page's chart: a stacked bar per hour or day, drawn by the server as SVG,
// so that the page needs no script and loads nothing. Its x coordinates are in
// percent of its width and its text in pixels, so the bars fill any width and the
// labels stay readable from 320 px up.

// A class of the chart, from the bottom of a bar up.
const (
	classServed  = iota // 1xx, 2xx, 3xx
	classBudget         // 429 and 402: refused by a budget
	classAddress        // refused by the key's allowed networks (a 401)
	classClient         // any other 4xx
	classServer         // 5xx
	numClasses
)

// usageClasses name the classes, for the legend (Name), the stylesheet (CSS), the
// tables' columns (Column) and a bar's tooltip (Short).
var usageClasses = [numClasses]struct{ Name, CSS, Column, Short string }{
	{"Served (1xx–3xx)", "served", "Served", "served"},
	{"Refused by a budget (429, 402)", "budget", "Refused by a budget", "refused by a budget"},
	{"Refused by address (401, outside the key's allowed networks)", "address", "Refused by address", "refused by address"},
	{"Other client errors (4xx)", "client", "Other client errors", "other client errors"},
	{"Server errors (5xx)", "server", "Server errors", "server errors"},
}

// usageClass returns the class of a request of the usage record. A key used from
// outside its allowed networks gets the same 401 as a bad key, so only its outcome
// tells it apart.
func usageClass(outcome string, status int) int {
	switch {
	case outcome == keystore.OutcomeIPDenied:
		return classAddress
	case status < 400:
		return classServed
	case status == 429 || status == 402:
		return classBudget
	case status < 500:
		return classClient
	}
	return classServer
}

// usageColumns are the headings of the classes' columns, in their order.
func usageColumns() []string {
	cols := make([]string, numClasses)
	for i, cl := range usageClasses {
		cols[i] = cl.Column
	}
	return cols
}

// classCounts are requests by class.
type classCounts [numClasses]int64

// Total returns the requests of every class.
func (c classCounts) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// classCell is a class's count in a table's row.
type classCell struct {
	Name string // the column's heading
	N    int64
}

// Cells returns c as the cells of a table's row, in the columns' order.
func (c classCounts) Cells() []classCell {
	cells := make([]classCell, numClasses)
	for i, v := range c {
		cells[i] = classCell{usageClasses[i].Column, v}
	}
	return cells
}

// say says c in words, class by class.
func (c classCounts) say() string {
	parts := make([]string, numClasses)
	for i, v := range c {
		parts[i] = strconv.FormatInt(v, 10) + " " + usageClasses[i].Short
	}
	return strings.Join(parts, ", ")
}

// The chart's geometry, in pixels.
const (
	chartTop    = 14  // above the plot: room for the top grid line's label
	chartPlot   = 180 // the plot's height
	chartHeight = chartTop + chartPlot + 24
	barSlot     = 10 // a bar's slot in the plot's own coordinates
	barWidth    = 8
)

// usageChart is what the template draws.
type usageChart struct {
	Title, Desc        string
	Height, Top, Plot  int
	ViewWidth          int // the plot's viewBox width: barSlot per bar
	AxisY              int // the x axis labels' baseline
	Bars               []usageBar
	Grid               []gridLine
	XLabels            []xLabel
	Legend             []legendItem
	Rows               []usageChartRow // the chart's numbers, as a table
	Empty              bool            // no request in the range
	UnitName, Interval string          // the table's first column; "hour" or "day"
}

// usageBar is one bucket's stack, in the plot's coordinates, with its tooltip.
type usageBar struct {
	Title    string
	X, Width int
	Segments []usageSegment
}

type usageSegment struct {
	Class string
	Y, H  string
}

// gridLine is a horizontal line of the plot at Y pixels, labelled with its value.
type gridLine struct {
	Y     int
	Label string
}

// xLabel is a bucket's label below the plot, centred on X percent.
type xLabel struct {
	X, Text string
}

type legendItem struct {
	Name, CSS string
	Count     int64
}

// usageChartRow is a bucket's row of the chart's table.
type usageChartRow struct {
	Label  string
	Counts classCounts
}

// buildUsageChart returns the chart of the requests in [from, to) by unit, from the
// sums per start, outcome and status. title says what and when.
func buildUsageChart(title string, from, to time.Time, g usageGrain, sums []store.UsageRow) usageChart {
	n := int(to.Sub(from) / g.unit)
	buckets := make([]classCounts, n)
	var all classCounts
	for _, u := range sums {
		i := int(u.Start.Sub(from) / g.unit)
		if i < 0 || i >= n {
			continue
		}
		c := usageClass(u.Outcome, u.Status)
		buckets[i][c] += u.Count
		all[c] += u.Count
	}
	label, span := bucketLabel(g)
	c := usageChart{
		Title: title, Height: chartHeight, Top: chartTop, Plot: chartPlot, ViewWidth: n * barSlot,
		AxisY: chartTop + chartPlot + 17, Empty: all.Total() == 0, UnitName: "Hour (UTC)", Interval: "hour",
	}
	if g.unit == usageDay {
		c.UnitName, c.Interval = "Day (UTC)", "day"
	}
	c.Desc = fmt.Sprintf("%d requests in all: %s. The table below the chart gives each %s's numbers.",
		all.Total(), all.say(), c.Interval)
	top, step := chartScale(buckets)
	for v := int64(0); v <= top; v += step {
		c.Grid = append(c.Grid, gridLine{Y: chartTop + chartPlot - int(v*chartPlot/top), Label: strconv.FormatInt(v, 10)})
	}
	labelEvery := max(n/4, 1)
	for i, b := range buckets {
		start := from.Add(time.Duration(i) * g.unit)
		bar := usageBar{X: i*barSlot + (barSlot-barWidth)/2, Width: barWidth,
			Title: fmt.Sprintf("%s: %d requests (%s)", span(start), b.Total(), b.say())}
		var stacked int64
		for cl, v := range b {
			if v == 0 {
				continue
			}
			y0 := float64(stacked) * chartPlot / float64(top)
			stacked += v
			y1 := float64(stacked) * chartPlot / float64(top)
			bar.Segments = append(bar.Segments, usageSegment{Class: usageClasses[cl].CSS,
				Y: strconv.FormatFloat(chartPlot-y1, 'f', 2, 64), H: strconv.FormatFloat(y1-y0, 'f', 2, 64)})
		}
		c.Bars = append(c.Bars, bar)
		c.Rows = append(c.Rows, usageChartRow{Label: span(start), Counts: b})
		if i%labelEvery == labelEvery/2 {
			c.XLabels = append(c.XLabels, xLabel{
				X:    strconv.FormatFloat((float64(i)+0.5)*100/float64(n), 'f', 2, 64) + "%",
				Text: start.Format(label),
			})
		}
	}
	for i, cl := range usageClasses {
		c.Legend = append(c.Legend, legendItem{Name: cl.Name, CSS: cl.CSS, Count: all[i]})
	}
	return c
}

// bucketLabel returns the layout of a bucket's label below the plot, and the words
// of its span in the tooltip and the table.
func bucketLabel(g usageGrain) (string, func(time.Time) string) {
	if g.unit == usageDay {
		return "Jan 2", func(t time.Time) string { return t.Format("Mon 2 Jan 2006") }
	}
	return "15:00", func(t time.Time) string {
		return t.Format("2 Jan 15:00") + "–" + t.Add(time.Hour).Format("15:00") + " UTC"
	}
}

// chartScale returns the top of the y axis and the step of its grid lines: a round
// step (1, 2 or 5 times a power of ten) that fits the highest stack in at most four.
func chartScale(buckets []classCounts) (top, step int64) {
	var highest int64
	for _, b := range buckets {
		highest = max(highest, b.Total())
	}
	step = 1
	for {
		for _, m := range []int64{1, 2, 5} {
			if highest <= 4*m*step {
				step *= m
				return max((highest+step-1)/step, 1) * step, step
			}
		}
		step *= 10
	}
}
