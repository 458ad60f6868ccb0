package keystore

import "testing"

// TestFenceTargetSkipsThePageHeader: an insert position just past a page's header
// asks only for the page's boundary, where a standby that replayed everything stops.
// Any other position is the target as it is.
func TestFenceTargetSkipsThePageHeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		insert LSN
		want   LSN
	}{
		{"past a short page header", 0x4002000 + 24, 0x4002000},
		{"past a segment's long page header", 0x5000000 + 40, 0x5000000},
		{"on a boundary", 0x4002000, 0x4002000},
		{"a record's end on the page", 0x4002000 + 48, 0x4002000 + 48},
		{"mid page", 0x4001100, 0x4001100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fenceTarget(tc.insert); got != tc.want {
				t.Errorf("fenceTarget(%#x) = %#x, want %#x", tc.insert, got, tc.want)
			}
		})
	}
}
