package conns

import (
	"testing"
	"time"
)

// TestInflightGivesBackWhenTheLastRequestLeaves: Close with no request in runs at
// once; with requests in, after the last leaves.
func TestInflightGivesBackWhenTheLastRequestLeaves(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   int
	}{{"none in", 0}, {"one in", 1}, {"three in", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			f := new(Inflight)
			for range tc.in {
				f.Enter()
			}
			ran := make(chan bool, 2)
			f.Close(func(later bool) { ran <- later })
			for i := range tc.in {
				select {
				case <-ran:
					t.Fatalf("ran with %d of %d requests still in", tc.in-i, tc.in)
				default:
				}
				f.Leave()
			}
			select {
			case later := <-ran:
				if later != (tc.in > 0) {
					t.Errorf("later = %v with %d requests in at Close", later, tc.in)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("never ran")
			}
		})
	}
	var none *Inflight
	none.Enter()
	none.Leave()
	ran := false
	none.Close(func(later bool) { ran = !later })
	if !ran {
		t.Error("a nil Inflight did not run Close's function at once")
	}
}
