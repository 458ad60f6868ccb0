//go:build race

package caddymodule

// raceEnabled: the race detector's instrumentation allocates on its own, so
// allocation counts say nothing under it.
const raceEnabled = true
