//go:build race

package gather_test

// raceEnabled: the race detector's instrumentation allocates on its own, so
// allocation counts say nothing under it.
const raceEnabled = true
