package caddymodule

import "time"

// now is the module's clock. The usage record's minutes, the in-process limiter's
// windows and the flushers' once-a-minute log lines read it, so that a test can pin
// a minute instead of waiting for a fresh one. Nothing but tests sets it.
var now = time.Now

// clock is now as a limiter.WithClock option takes it: read at each call, so that a
// limiter shared across config reloads follows the seam too.
func clock() time.Time { return now() }
