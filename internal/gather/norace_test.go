//go:build !race

package gather_test

const raceEnabled = false
