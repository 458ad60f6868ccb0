package caddymodule

import (
	"strconv"
	"unicode/utf8"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// meBody is the answer to GET /v1/me: {"org_id":"…","role":"…","scopes":[…]|null,"limits":{…}},
// the scopes a scoped key's (null: unscoped), the limits the key's budgets (null:
// none) and its organisation's use of the month so far, this request included (null
// without a monthly quota).
func meBody(key keystore.Key, count limiter.Result) []byte {
	b := make([]byte, 0, 256)
	b = append(b, `{"org_id":`...)
	b = appendJSONString(b, key.OrgID)
	b = append(b, `,"role":`...)
	b = appendJSONString(b, string(key.Role))
	b = append(b, `,"scopes":`...)
	if key.Scopes == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, s := range key.Scopes {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		b = append(b, ']')
	}
	b = append(b, `,"limits":{"per_minute":`...)
	b = appendBudget(b, int64(key.RateLimit))
	b = append(b, `,"per_second":`...)
	b = appendBudget(b, int64(key.Windows[keystore.PerSecond]))
	b = append(b, `,"per_hour":`...)
	b = appendBudget(b, int64(key.Windows[keystore.PerHour]))
	b = append(b, `,"per_day":`...)
	b = appendBudget(b, int64(key.Windows[keystore.PerDay]))
	b = append(b, `,"org_per_minute":`...)
	b = appendBudget(b, int64(key.OrgRateLimit))
	b = append(b, `,"per_month":`...)
	b = appendBudget(b, key.MonthlyQuota)
	b = append(b, `,"used_this_month":`...)
	if key.MonthlyQuota > 0 && count.Month.Limit > 0 {
		b = strconv.AppendInt(b, count.Month.Used, 10)
	} else {
		b = append(b, "null"...) // no quota, or a month Redis could not count
	}
	return append(b, "}}"...)
}

// appendBudget appends a budget's limit, or null for none (0 or less).
func appendBudget(b []byte, limit int64) []byte {
	if limit <= 0 {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, limit, 10)
}

// appendJSONString appends s as a JSON string. It escapes what JSON requires, and
// the characters HTML-sensitive decoders care about. The values it writes, UUIDs
// and roles, never need it. But the output stays valid whatever the database holds.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
