package capacity

import (
	"math"
	"time"
)

// A latency histogram has bucketsPerOctave buckets per doubling from 1µs up:
// bucket 0 holds 1µs and less, bucket b > 0 holds (2^((b-1)/8), 2^(b/8)] µs, and the
// last bucket everything above its lower bound (about 2 minutes). A quantile is the
// upper bound of its bucket: at most 9 % above the true value.
const (
	bucketsPerOctave = 8
	latencyBuckets   = 27*bucketsPerOctave + 1
)

// latency counts operations by how long they took.
type latency struct {
	buckets [latencyBuckets]uint64
}

// add counts one operation that took d.
func (l *latency) add(d time.Duration) {
	l.buckets[bucketOf(d)]++
}

// snapshot returns the counts so far.
func (l *latency) snapshot() []uint64 {
	return append([]uint64(nil), l.buckets[:]...)
}

func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	b := int(math.Ceil(math.Log2(us) * bucketsPerOctave))
	return min(max(b, 1), latencyBuckets-1)
}

// bucketUpper is the upper bound of bucket b.
func bucketUpper(b int) time.Duration {
	return time.Duration(math.Exp2(float64(b)/bucketsPerOctave) * float64(time.Microsecond))
}

// quantile returns the q-quantile (0 < q <= 1) of the counts of a histogram, as its
// bucket's upper bound; 0 when it is empty.
func quantile(counts []uint64, q float64) time.Duration {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for b, c := range counts {
		seen += c
		if seen >= rank {
			return bucketUpper(b)
		}
	}
	return bucketUpper(len(counts) - 1)
}

// sub returns a - b, bucket by bucket, and addTo adds a into sum.
func sub(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

func addTo(sum, a []uint64) {
	for i := range a {
		sum[i] += a[i]
	}
}
